-- A stored policy's max_attempts as a job's column takes it, in one place for every enqueue:
-- 0 ..= 2147483647 (policies are refused beyond that now, but a row saved before, or by hand,
-- must not fail every enqueue of its type), or NULL when it is not a number at all, so that
-- the next layer (the default policy, then 3) applies.
CREATE FUNCTION rebound_policy_max_attempts(policy jsonb) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN jsonb_typeof(policy->'max_attempts') = 'number'
                THEN LEAST(GREATEST((policy->>'max_attempts')::numeric, 0), 2147483647)::int END
$$;
