-- Failed dashboard sign-ins, counted per key ("account:<name>" and "address:<ip>") so every
-- server process behind a load balancer enforces the same growing delays.
CREATE TABLE login_failures (
    key            text PRIMARY KEY,
    failures       integer NOT NULL,
    last_failed_at timestamptz NOT NULL
);
