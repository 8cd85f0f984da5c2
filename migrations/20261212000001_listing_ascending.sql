-- The listing indexes in ascending id order, and available jobs listed lane by lane.
--
-- Ids are UUIDv7, so a lane's newest entry is its largest id. In an index ordered by id DESC
-- that is the lane's first position: a full page there is split in half and its left half
-- fills again, so such an index runs at half its pages' room and splits twice as often.
-- Where a lane's entries arrive in ascending order at its end, Postgres splits the page so that
-- the full part stays full. 500 000 monotonic inserts into an unlogged table (batches of 1 000,
-- one lane): (id DESC) 27 MB and (id) 15 MB; a five-column lane key 98 MB and 3.0 s against
-- 55 MB and 1.7 s (the table alone: 1.05 s). Read newest first, an ascending index is walked
-- backwards at the same cost.
--
-- `available` jobs were listed from an index of their own by id alone, which had no queue or
-- type: three available jobs of a rare type among 270 000 others were found by walking all of
-- them (510 ms at 10M jobs). They are now lanes of `jobs_listed` like the other listed states
-- (a claim still writes no listing entry: `active` is not listed). The index by id stays,
-- ascending, for what reads available jobs by state alone: a bulk action over every available
-- job, and a listing with more lanes than are worth merging (an old backlog behind millions of
-- finished jobs would otherwise be found by walking the primary key: 10 s at 10M jobs). Its
-- entries arrive at its right edge, the cheapest place to insert.
--
-- Jobs a rate limit holds back (`rate_limited`) get an index by queue in the claim's order,
-- so listing a queue's available jobs by priority reads them in order however many are held
-- (a key admitting one at a time holds back nearly all of its jobs). Written only as a job is
-- held back (a keyed enqueue into a full key, a settle), never by a claim or a completion.
DROP INDEX jobs_listed;
DROP INDEX jobs_available_id;
DROP INDEX jobs_state_id;
CREATE INDEX jobs_listed ON jobs (queue, type, state, dead_letter, id)
    WHERE state IN ('available', 'scheduled', 'pending', 'retryable', 'completed', 'cancelled', 'discarded');
CREATE INDEX jobs_state_id ON jobs (state, id)
    WHERE state IN ('scheduled', 'pending', 'retryable', 'cancelled', 'discarded');
CREATE INDEX jobs_available_id ON jobs (id) WHERE state = 'available';
CREATE INDEX jobs_held_by_queue ON jobs (queue, priority DESC, scheduled_at, id)
    WHERE state = 'available' AND rate_limited;
