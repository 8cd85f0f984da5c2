-- Every counted sign-in attempt forgets failures older than a day, inside the transaction that
-- holds its keys' rows. Without an index that was a scan of the whole table, which anyone can
-- grow by one row per username they try: the longer a guessing run went on, the longer every
-- sign-in, a real operator's included, held its locks.
CREATE INDEX login_failures_last_failed ON login_failures (last_failed_at);
