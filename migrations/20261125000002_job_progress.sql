-- Progress a running job reports (OJS `POST /workers/progress`, the Rust handlers'
-- `JobContext::progress`): every report is kept, for `job.progress` events and for the job's
-- latest progress (`GET /jobs/{id}/progress`, the dashboard). A report never touches the job's
-- row, so it costs the hot path nothing and never contends with the job's own writes.
CREATE TABLE job_progress (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    job_id      uuid NOT NULL,
    queue       text NOT NULL,
    attempt     integer NOT NULL,
    worker_id   text,
    percentage  double precision NOT NULL CHECK (percentage >= 0 AND percentage <= 100),
    message     text,
    data        jsonb
);
-- A job's latest report; events by time over every queue, or by queue.
CREATE INDEX job_progress_job ON job_progress (job_id, id);
CREATE INDEX job_progress_at ON job_progress (at);
CREATE INDEX job_progress_queue_at ON job_progress (queue, at);

CREATE OR REPLACE FUNCTION job_counts_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_count_deltas;
    DELETE FROM job_counts;
    DELETE FROM job_transitions;
    DELETE FROM job_heartbeats;
    DELETE FROM job_progress;
    RETURN NULL;
END $$;
