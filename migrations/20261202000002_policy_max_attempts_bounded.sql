-- A policy's max_attempts ends up in jobs.max_attempts, an integer, but was accepted up to
-- 4294967295: a policy saved above 2147483647 made every enqueue of its type (and every batch
-- and workflow holding one) fail at the cast. Such values are refused now; the ones already
-- saved are capped at 2147483647, which no job reaches either way. Their saved versions too,
-- as a restore saves a version again. (Enqueues clamp as they read, so a row written by hand
-- later cannot fail them; a job's own `retry` reads capped, see PolicyPatch::from_stored_json.)
UPDATE retry_policies
SET policy = jsonb_set(policy, '{max_attempts}', '2147483647'::jsonb)
WHERE CASE WHEN jsonb_typeof(policy->'max_attempts') = 'number'
           THEN (policy->'max_attempts')::numeric > 2147483647 ELSE false END;

UPDATE retry_policy_versions
SET policy = jsonb_set(policy, '{max_attempts}', '2147483647'::jsonb)
WHERE policy IS NOT NULL
  AND CASE WHEN jsonb_typeof(policy->'max_attempts') = 'number'
           THEN (policy->'max_attempts')::numeric > 2147483647 ELSE false END;
