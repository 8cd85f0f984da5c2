-- Admin API: an operator can ask a worker to go quiet (stop fetching, finish what it runs) or
-- to terminate; the worker hears it in its next heartbeat's answer.
ALTER TABLE workers ADD COLUMN requested_state text CHECK (requested_state IN ('quiet', 'terminate'));
