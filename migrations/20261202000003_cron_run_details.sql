-- The cron events' own fields (ojs-cron §9): `cron.triggered` says which run of its cron job it
-- was (`run_count`), `cron.skipped` which job was still running (`active_job_id`). Each is
-- written by the statement that decides the tick, so the event reads what was true then.
ALTER TABLE cron_runs ADD COLUMN run_number bigint, ADD COLUMN active_job_id uuid;
