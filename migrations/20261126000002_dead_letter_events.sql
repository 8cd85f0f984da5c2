-- OJS dead-letter extension events (§11.1): `dead_letter.retried` (an operator re-drove a dead
-- letter), `dead_letter.deleted` (an operator deleted or purged one) and `dead_letter.pruned`
-- (the retention policy removed some: one event per pass and queue, with the count). A job
-- entering the queue is the core's `job.dead_lettered`, read from its attempt.
--
-- Written by the statements that do these things, one row per statement and queue, so an
-- event exists exactly when its change committed. The ids are kept because a deleted job's
-- row is gone. Aged out with the completed jobs, like the other event logs.
CREATE TABLE dead_letter_log (
    id        bigserial PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    action    text NOT NULL CHECK (action IN ('retried', 'deleted', 'pruned')),
    queue     text NOT NULL,
    job_ids   uuid[] NOT NULL,
    job_types text[] NOT NULL,
    actor     text
);
CREATE INDEX dead_letter_log_at ON dead_letter_log (at);

-- Emptying `jobs` empties its logs (as in …_job_progress.sql), this one too.
CREATE OR REPLACE FUNCTION job_counts_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_count_deltas;
    DELETE FROM job_counts;
    DELETE FROM job_transitions;
    DELETE FROM job_heartbeats;
    DELETE FROM job_progress;
    DELETE FROM dead_letter_log;
    RETURN NULL;
END $$;
