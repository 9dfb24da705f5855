-- Version 4 -> 5: who holds a running job and until when (a remote worker's claim: its
-- name and lease; NULL for an in-process one). Run once, when the jobs table lacks these
-- columns. As in migrate_v4.sql, ADD COLUMN of NULL columns rewrites no row, and the two
-- columns and the version are one transaction: a crash leaves version 4 or version 5.
-- (The secrets table of version 5 is schema.sql's, made IF NOT EXISTS at every open.)
BEGIN IMMEDIATE;
ALTER TABLE jobs ADD COLUMN holder TEXT;
ALTER TABLE jobs ADD COLUMN lease_until REAL;
INSERT INTO meta (key, value) VALUES ('schema_version', '5')
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
COMMIT;
