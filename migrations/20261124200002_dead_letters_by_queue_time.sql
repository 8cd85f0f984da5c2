-- The pruner's dead-letter passes ranked every dead letter on every pass to find those beyond
-- their queue's cap (a sort of all of them, whether any queue was over or not: a million in the
-- dashboard's seed), and walked them all for the ones past their retention. Read per queue by
-- time, a pass reads the queues over their cap from the counters and, of each, only the cap
-- of entries it skips and the rows it deletes. A partial index: only dead-lettering and
-- re-driving write it, never the hot path.
CREATE INDEX jobs_dead_letters_queue_at ON jobs (queue, dead_lettered_at DESC, id DESC) WHERE dead_letter;
