-- Version 7 -> 8: fair claims (sqlq.common.fair): a job's fairness key and weight (the
-- policies table is schema.sql's). Run once, when the jobs table lacks key. Constant
-- defaults rewrite no row (migrate_v4.sql): every job of an older file reads as keyless
-- with weight 1, as it was. One transaction with
-- the version: a crash leaves version 7 or version 8.
BEGIN IMMEDIATE;
ALTER TABLE jobs ADD COLUMN key TEXT;
ALTER TABLE jobs ADD COLUMN weight INTEGER NOT NULL DEFAULT 1;
INSERT INTO meta (key, value) VALUES ('schema_version', '8')
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
COMMIT;
