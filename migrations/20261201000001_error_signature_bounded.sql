-- A dead letter's signature is an index key (`jobs_dead_letters_signature`, and the counters'
-- primary key), and btree refuses keys over about 2.7 kB. It was the whole error type and
-- message, so a handler's (or an OJS client's) long error made dead-lettering its job fail for
-- good: the API answered 500, and a worker's result was refused until the rescuer charged the
-- attempt, with the real error lost. The signature is a grouping key, not the error (which
-- `last_error` and the job's history keep whole): its first 400 characters, at most 1.6 kB,
-- say what kind of failure it is.
CREATE OR REPLACE FUNCTION rebound_error_signature(error jsonb) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT left(coalesce(error->>'type', '') || ': ' ||
                regexp_replace(coalesce(error->>'message', ''),
                    '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9]+', '#', 'g'),
                400)
$$;

-- The stored signatures the new function shortens, rewritten so that `jobs_error_signature`
-- holds for them (the counters move with them, through the update trigger). Read from the
-- dead letters' own index.
UPDATE jobs SET error_signature = rebound_error_signature(last_error)
WHERE dead_letter AND length(error_signature) > 400;
