-- Exact job counts without counting the jobs table. The overview, the queues and policies pages,
-- OJS queue stats and /metrics used to group all of `jobs` on every request: hundreds of
-- milliseconds at a million rows, seconds at ten million.
--
-- Every statement that writes `jobs` (enqueue, claim, complete, fail, prune, a hand edit in
-- psql) appends its net change per (queue, type, state, dead_letter) to `job_count_deltas`
-- from a statement-level trigger: one small insert per statement, not per row, and none at all
-- when nothing counted changed (heartbeats, lock extensions). Appending instead of updating a
-- counter row means concurrent writers never wait on each other. The maintenance leader folds
-- the deltas into `job_counts` every few seconds; readers add the deltas not yet folded, so a
-- count is exact as of the reader's snapshot.
CREATE TABLE job_counts (
    queue       text NOT NULL,
    type        text NOT NULL,
    state       job_state NOT NULL,
    dead_letter boolean NOT NULL,
    n           bigint NOT NULL,
    PRIMARY KEY (queue, type, state, dead_letter)
);

-- Append-only between folds; read whole, so no index.
CREATE TABLE job_count_deltas (
    queue       text NOT NULL,
    type        text NOT NULL,
    state       job_state NOT NULL,
    dead_letter boolean NOT NULL,
    n           bigint NOT NULL
);

CREATE FUNCTION job_counts_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_count_deltas (queue, type, state, dead_letter, n)
    SELECT queue, type, state, dead_letter, count(*) FROM counted_new GROUP BY 1, 2, 3, 4;
    RETURN NULL;
END $$;

CREATE FUNCTION job_counts_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_count_deltas (queue, type, state, dead_letter, n)
    SELECT queue, type, state, dead_letter, sum(n) FROM (
        SELECT queue, type, state, dead_letter, 1 AS n FROM counted_new
        UNION ALL
        SELECT queue, type, state, dead_letter, -1 AS n FROM counted_old
    ) d GROUP BY 1, 2, 3, 4 HAVING sum(n) <> 0;
    RETURN NULL;
END $$;

CREATE FUNCTION job_counts_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_count_deltas (queue, type, state, dead_letter, n)
    SELECT queue, type, state, dead_letter, -count(*) FROM counted_old GROUP BY 1, 2, 3, 4;
    RETURN NULL;
END $$;

-- TRUNCATE fires no row-set triggers: it empties the counts with the table.
CREATE FUNCTION job_counts_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_count_deltas;
    DELETE FROM job_counts;
    RETURN NULL;
END $$;

-- No writer may slip between the initial count and the triggers.
LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;

CREATE TRIGGER job_counts_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS counted_new FOR EACH STATEMENT EXECUTE FUNCTION job_counts_inserted();
CREATE TRIGGER job_counts_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS counted_old NEW TABLE AS counted_new FOR EACH STATEMENT EXECUTE FUNCTION job_counts_updated();
CREATE TRIGGER job_counts_delete AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS counted_old FOR EACH STATEMENT EXECUTE FUNCTION job_counts_deleted();
CREATE TRIGGER job_counts_truncate AFTER TRUNCATE ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION job_counts_truncated();

INSERT INTO job_counts (queue, type, state, dead_letter, n)
SELECT queue, type, state, dead_letter, count(*) FROM jobs GROUP BY 1, 2, 3, 4;

-- What readers use: the folded counts plus the deltas not folded yet.
CREATE VIEW job_count_totals AS
SELECT queue, type, state, dead_letter, sum(n)::bigint AS n
FROM (SELECT queue, type, state, dead_letter, n FROM job_counts
      UNION ALL
      SELECT queue, type, state, dead_letter, n FROM job_count_deltas) c
GROUP BY 1, 2, 3, 4
HAVING sum(n) <> 0;
