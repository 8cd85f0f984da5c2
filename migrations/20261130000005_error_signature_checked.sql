-- The existing jobs checked against the constraint added unchecked by the previous migration,
-- under a lock that lets claims, enqueues and results go on (migrations run one transaction
-- each, so this one is its own).
ALTER TABLE jobs VALIDATE CONSTRAINT jobs_error_signature;
