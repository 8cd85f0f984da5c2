-- A dead letter's error signature (its error type plus the message with ids and numbers
-- normalised, by which the dashboard groups dead letters) was a stored generated column.
-- Postgres computes those for every row inserted, and again for every update of `last_error`
-- (each completion clears it), re-forming the whole row each time: a tenth of a batch
-- enqueue's insert time. The writers that set `dead_letter` now write it, and a check keeps
-- it exactly what the expression gives (a writer or a hand edit that forgets it fails instead
-- of leaving a wrong group); evaluating the check costs next to nothing for a live job.
CREATE FUNCTION rebound_error_signature(error jsonb) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(error->>'type', '') || ': ' ||
           regexp_replace(coalesce(error->>'message', ''),
               '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9]+', '#', 'g')
$$;

-- Added unchecked, then checked in the next migration: adding it checked would scan every job
-- holding the lock that stops claims and enqueues. Changing `rebound_error_signature` later
-- means rewriting the stored signatures in the same migration, or updates of dead letters
-- fail the check.
ALTER TABLE jobs ALTER COLUMN error_signature DROP EXPRESSION;
ALTER TABLE jobs ADD CONSTRAINT jobs_error_signature
    CHECK (error_signature IS NOT DISTINCT FROM CASE WHEN dead_letter THEN rebound_error_signature(last_error) END) NOT VALID;
