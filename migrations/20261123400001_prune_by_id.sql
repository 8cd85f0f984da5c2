-- A completion wrote five index entries; `jobs_finished` (state, completed_at) was one of them,
-- read only by the pruner once a minute. The pruner now walks `jobs_state_id` (state, id)
-- instead: ids are UUIDv7, so a job finished before a cutoff was created before it too, and
-- `id < rebound_id_floor(cutoff)` bounds the walk to jobs that can be old enough.
DROP INDEX jobs_finished;

-- The smallest UUIDv7 of the millisecond `t` falls in (random bits and version zero): ids
-- below it were made before that millisecond.
CREATE FUNCTION rebound_id_floor(t timestamptz) RETURNS uuid
LANGUAGE sql STABLE STRICT PARALLEL SAFE
RETURN (lpad(to_hex(GREATEST(floor(extract(epoch FROM t) * 1000), 0)::bigint), 12, '0') || repeat('0', 20))::uuid;
