-- Per-queue rate limits (OJS rate limiting, queue level), enforced in the claim statement so
-- they hold across every worker and every API fetch. All state lives in the queue's row, which
-- the claim locks only when the queue is paused or limited: unlimited queues claim as before.
--
-- Windows are fixed (OJS asks implementations to say which): a window opens with the first
-- claim after the previous one ended and admits `*_max` starts until it ends. A throttle of N
-- per period is a window of period/N admitting one start, so starts are at least that far apart.
ALTER TABLE queues
    ADD COLUMN rate_limit          jsonb,
    ADD COLUMN concurrency_limit   integer CHECK (concurrency_limit >= 0),
    ADD COLUMN rate_max            integer CHECK (rate_max >= 0),
    ADD COLUMN rate_period_ms      bigint CHECK (rate_period_ms > 0),
    ADD COLUMN rate_window_start   timestamptz,
    ADD COLUMN rate_window_used    integer NOT NULL DEFAULT 0,
    ADD COLUMN throttle_max        integer CHECK (throttle_max >= 0),
    ADD COLUMN throttle_period_ms  bigint CHECK (throttle_period_ms > 0),
    ADD COLUMN throttle_window_start timestamptz,
    ADD COLUMN throttle_window_used integer NOT NULL DEFAULT 0;

-- Active jobs of a queue, counted with a fresh snapshot: VOLATILE, so when the claim calls it
-- after locking the queue's row it sees the claims that committed while it waited for the lock
-- (the claim statement's own snapshot predates them).
CREATE FUNCTION rebound_active_jobs(q text) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT count(*) FROM jobs WHERE queue = q AND state = 'active');
END;
$$;
