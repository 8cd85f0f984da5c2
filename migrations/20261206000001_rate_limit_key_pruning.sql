-- Keyed rate limits' keys are pruned (the pruner): a key's row goes once no job names it any
-- more (its jobs finished and were pruned themselves), no operator's override or handler's
-- hold is in force, and nothing touched it for the completed jobs' retention. A job that
-- comes back (a dead letter re-driven, a finished job retried) still finds its key's limit,
-- since the row outlives every job that names it.
--
-- So the index by key covers every keyed job, in every state: the pruner asks whether any job
-- names a key, the slot counts ask how many hold one (key, state and flag are all in the key,
-- so both are reads of the index alone). Unkeyed jobs still have no entry, and a keyed job
-- writes one entry per row version as before.
DROP INDEX jobs_rate_holding;
CREATE INDEX jobs_rate_keyed ON jobs (rate_limit_key, state, rate_limited) WHERE rate_limit_key IS NOT NULL;

-- The pruner's candidates, stalest first.
CREATE INDEX rate_limit_keys_updated ON rate_limit_keys (updated_at);
-- Lists of keys page by byte order, as the API merges them with queue names sorted in Rust
-- (the database's collation may sort otherwise).
CREATE INDEX rate_limit_keys_bytes ON rate_limit_keys ((key COLLATE "C"));
