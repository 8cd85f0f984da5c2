-- Why a tick was skipped (ojs-cron §9.2): `overlap_skip` (an earlier run was still running) or
-- `dst_skip` (a daylight-saving jump swallowed its wall-clock time; the tick is the first
-- instant after the gap). Rows skipped before this column existed were all overlap skips.
ALTER TABLE cron_runs ADD COLUMN skip_reason text;
