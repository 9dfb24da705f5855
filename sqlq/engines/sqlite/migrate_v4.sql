-- Version 3 -> 4: what a running job carries (a cancel asked for, progress, a checkpoint,
-- snoozes, the last errors). Run once, when the jobs table lacks these columns.
-- ADD COLUMN only rewrites the table's entry in sqlite_schema: no row is read or written
-- (every column is NULL or has a constant default, and none has a CHECK), so it takes the
-- same time on a million jobs as on one. One transaction with the version: a crash leaves
-- a version-3 database or a version-4 one, never some of the columns.
BEGIN IMMEDIATE;
ALTER TABLE jobs ADD COLUMN cancel_requested_at REAL;
ALTER TABLE jobs ADD COLUMN progress TEXT;
ALTER TABLE jobs ADD COLUMN checkpoint TEXT;
ALTER TABLE jobs ADD COLUMN snoozes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN errors TEXT;
INSERT INTO meta (key, value) VALUES ('schema_version', '4')
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
COMMIT;
