-- A due retry is claimed straight from `retryable` by a claim of its queue,
-- instead of first being promoted to `available` by the scheduler and then claimed.
--
-- A job that failed once and then succeeded was written five times (claim, failure, promotion,
-- claim, completion) against a plain job's two; the promotion was a whole row version with its
-- entries in the primary key and three listing/claim indexes, about a sixth of the fail path's
-- Postgres time. The claim now takes due retries of its queue from this index (their priority
-- at least that of the queue's best available job, so a retry never jumps ahead of more urgent
-- work). When one falls due the scheduler notifies its queue without writing it, and
-- promotes it as before only if no claim took it within a short window
-- (`rebound_queue::store::RETRY_CLAIM_WINDOW`). Jobs under a rate-limit key are admitted by
-- their key, so they are promoted when due and have no entry here.
CREATE INDEX jobs_retry_due ON jobs (queue, scheduled_at, id)
    WHERE state = 'retryable' AND rate_limit_key IS NULL;
