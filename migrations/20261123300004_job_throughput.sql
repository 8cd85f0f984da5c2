-- Completions per minute for the overview's charts, kept as they happen instead of counted
-- from the jobs (the last 24 hours can be tens of millions of rows). Each count delta carries
-- the time of its statement; when the leader folds the deltas, the positive ones into
-- `completed` (jobs that became completed) are added to their minute here.
ALTER TABLE job_count_deltas ADD COLUMN at timestamptz NOT NULL DEFAULT now();

CREATE TABLE job_throughput (
    minute    timestamptz PRIMARY KEY,
    completed bigint NOT NULL
);

INSERT INTO job_throughput (minute, completed)
SELECT date_trunc('minute', completed_at), count(*) FROM jobs
WHERE state = 'completed' AND completed_at >= now() - interval '2 days'
GROUP BY 1;
