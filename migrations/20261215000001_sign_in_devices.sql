-- Browsers an operator has signed in from. Each holds a random token (a cookie; only its
-- SHA-256 is kept here) that lets its operator's later sign-ins skip the throttles and the
-- queue that guessers share: someone guessing passwords from many addresses can make a new
-- browser wait, never one the operator has used before. The token alone signs no one in.
CREATE TABLE sign_in_devices (
    token_hash    text PRIMARY KEY,
    operator_id   bigint NOT NULL REFERENCES operators (id) ON DELETE CASCADE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);
-- Sign-ins prune their operator's oldest devices and every expired one.
CREATE INDEX sign_in_devices_operator ON sign_in_devices (operator_id, last_used_at);
CREATE INDEX sign_in_devices_expires ON sign_in_devices (expires_at);
