-- Automatic replay of dead letters (ojs-dead-letter §7): a rule names which dead letters
-- (queue, type, error type: exact or `prefix.*`; each optional), how long after their death
-- they are re-driven, and how many replays a job gets. The replayer (a maintenance service of
-- the worker leader) walks each rule's dead letters in order of death from `cursor_at` /
-- `cursor_id`, the last one it looked at, so every pass reads only what died since the last
-- one. Changing a rule's filter or `max_replays` starts its walk over.
--
-- A job's replays are counted in its meta (`ojs.replay_count`, `ojs.last_replayed_at`,
-- `ojs.replay_rule`, §7.2), so the count travels with the job through re-drives.
CREATE TABLE dead_letter_replay_rules (
    name             text PRIMARY KEY,
    queue            text,
    job_type         text,
    error_type       text,
    delay_ms         bigint NOT NULL CHECK (delay_ms >= 0),
    max_replays      integer NOT NULL CHECK (max_replays BETWEEN 1 AND 100),
    enabled          boolean NOT NULL DEFAULT true,
    cursor_at        timestamptz,
    cursor_id        uuid,
    replayed_total   bigint NOT NULL DEFAULT 0,
    last_replayed_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- Dead letters in order of death, across queues: a rule without a queue walks this (a rule
-- with one walks jobs_dead_letters_queue_at). Only dead letters are in it, so the paths that
-- complete or retry jobs write nothing to it.
CREATE INDEX jobs_dead_letters_at ON jobs (dead_lettered_at, id) WHERE dead_letter;

-- `dead_letter.replayed` events, written by the replayer as `dead_letter.retried` ones are by
-- a re-drive.
ALTER TABLE dead_letter_log DROP CONSTRAINT dead_letter_log_action_check;
ALTER TABLE dead_letter_log ADD CONSTRAINT dead_letter_log_action_check CHECK (action IN ('retried', 'deleted', 'pruned', 'replayed'));
