-- An operator's temporary concurrency for a queue (OJS rate-limiting §10.2 on `queue:<name>`:
-- `{"concurrency": 0, "expires_at": …}` during an incident), in force over the queue's own
-- limit until it ends, which the limit set is kept under. The claim reads it only while it
-- lasts; the scheduler's sweep clears it once ended and wakes the queue's workers.
ALTER TABLE queues
    ADD COLUMN override_concurrency integer CHECK (override_concurrency >= 0),
    ADD COLUMN override_expires_at timestamptz,
    -- NULL end with a concurrency: until an operator removes it.
    ADD CONSTRAINT queues_override_end CHECK (override_concurrency IS NOT NULL OR override_expires_at IS NULL);
