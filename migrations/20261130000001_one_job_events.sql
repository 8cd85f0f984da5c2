-- `GET /ojs/v1/events?job_id=` asks for the cron run that enqueued a job: found by its job,
-- not by walking every run newest first (a month of a cron ticking every second is 2 500 000
-- runs). Runs that enqueued nothing (skipped ones) are left out.
CREATE INDEX cron_runs_job ON cron_runs (job_id) WHERE job_id IS NOT NULL;
