-- Maintenance mode (OJS admin API §12.1): a single row, present while it is on. While it is
-- on, claims hand out nothing (Rebound's workers and API fetches alike), due scheduled and
-- retryable jobs are not promoted and cron ticks do not fire; enqueues are accepted and wait.
-- The claim reads this table once per statement, not per job.
CREATE TABLE maintenance (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    reason         text,
    enabled_at     timestamptz NOT NULL DEFAULT now(),
    enabled_by     text NOT NULL,
    estimated_end  timestamptz
);
