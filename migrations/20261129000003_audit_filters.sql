-- The audit log is filtered by actor, action prefix and target (a job's id, a queue, a policy),
-- newest first. Only the actor had an index: asking what happened to one job walked the whole
-- log (a year of it is kept by default). Both are written once per operator action, never by
-- the job hot path.
CREATE INDEX audit_log_target ON audit_log (target, id DESC) WHERE target IS NOT NULL;
-- `action LIKE 'job.%'`: a prefix range, in C order whatever the database's collation.
CREATE INDEX audit_log_action ON audit_log (action text_pattern_ops, id DESC);
