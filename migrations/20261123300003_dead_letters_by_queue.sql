-- Dead letters of one queue, newest first (the dead-letter page filtered by queue). Written
-- only when a job is dead-lettered, never on the hot path.
CREATE INDEX jobs_dead_letters_queue ON jobs (queue, id DESC) WHERE dead_letter;
