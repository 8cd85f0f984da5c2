-- A queue's own retention of its finished jobs (ojs-admin-api §6, `retention` in a queue's
-- config): completed jobs, and cancelled or plainly discarded ones, are pruned this long after
-- they finished instead of after the pruner's configured times. NULL follows the pruner's.
-- (`queues` holds a row per configured queue: the CHECKs scan a few rows.)
ALTER TABLE queues
    ADD COLUMN retain_completed_ms bigint CHECK (retain_completed_ms >= 0),
    ADD COLUMN retain_discarded_ms bigint CHECK (retain_discarded_ms >= 0);
