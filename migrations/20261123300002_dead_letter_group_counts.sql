-- The dead-letter page groups dead letters by error signature with exact counts; at a million
-- dead letters counting them per request takes hundreds of milliseconds. The counters gain the
-- signature as part of their key ('' for jobs that are not dead letters, whose signature is
-- NULL), so the groups are read from them like every other count.
LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;

DROP VIEW job_count_totals;
ALTER TABLE job_counts DROP CONSTRAINT job_counts_pkey;
ALTER TABLE job_counts ADD COLUMN signature text NOT NULL DEFAULT '';
ALTER TABLE job_counts ADD PRIMARY KEY (queue, type, state, dead_letter, signature);
ALTER TABLE job_count_deltas ADD COLUMN signature text NOT NULL DEFAULT '';

CREATE OR REPLACE FUNCTION job_counts_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_count_deltas (queue, type, state, dead_letter, signature, n)
    SELECT queue, type, state, dead_letter, COALESCE(error_signature, ''), count(*) FROM counted_new GROUP BY 1, 2, 3, 4, 5;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION job_counts_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_count_deltas (queue, type, state, dead_letter, signature, n)
    SELECT queue, type, state, dead_letter, signature, sum(n) FROM (
        SELECT queue, type, state, dead_letter, COALESCE(error_signature, '') AS signature, 1 AS n FROM counted_new
        UNION ALL
        SELECT queue, type, state, dead_letter, COALESCE(error_signature, '') AS signature, -1 AS n FROM counted_old
    ) d GROUP BY 1, 2, 3, 4, 5 HAVING sum(n) <> 0;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION job_counts_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_count_deltas (queue, type, state, dead_letter, signature, n)
    SELECT queue, type, state, dead_letter, COALESCE(error_signature, ''), -count(*) FROM counted_old GROUP BY 1, 2, 3, 4, 5;
    RETURN NULL;
END $$;

DELETE FROM job_count_deltas;
DELETE FROM job_counts;
INSERT INTO job_counts (queue, type, state, dead_letter, signature, n)
SELECT queue, type, state, dead_letter, COALESCE(error_signature, ''), count(*) FROM jobs GROUP BY 1, 2, 3, 4, 5;

CREATE VIEW job_count_totals AS
SELECT queue, type, state, dead_letter, sum(n)::bigint AS n
FROM (SELECT queue, type, state, dead_letter, n FROM job_counts
      UNION ALL
      SELECT queue, type, state, dead_letter, n FROM job_count_deltas) c
GROUP BY 1, 2, 3, 4
HAVING sum(n) <> 0;

-- Dead letters per queue, type and error signature.
CREATE VIEW dead_letter_group_totals AS
SELECT queue, type, signature, sum(n)::bigint AS n
FROM (SELECT queue, type, signature, n FROM job_counts WHERE dead_letter
      UNION ALL
      SELECT queue, type, signature, n FROM job_count_deltas WHERE dead_letter) c
GROUP BY 1, 2, 3
HAVING sum(n) <> 0;
