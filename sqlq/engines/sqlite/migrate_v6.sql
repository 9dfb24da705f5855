-- Version 5 -> 6: whether a forced cancel holds a remote holder's lease where it put it
-- (Job.cancel_forced), stored so that a restart keeps it held (no heartbeat renews it) and
-- ends the attempt cancelled at the grace's end. Run once, when the jobs table lacks the
-- column. A constant default rewrites no row (migrate_v4.sql): every job of an older file
-- reads as not forced, which it was not, or (forced before this version) as the lease it
-- stored, the grace's end, that its heartbeats would renew. One transaction with the
-- version: a crash leaves version 5 or version 6.
BEGIN IMMEDIATE;
ALTER TABLE jobs ADD COLUMN cancel_forced INTEGER NOT NULL DEFAULT 0;
INSERT INTO meta (key, value) VALUES ('schema_version', '6')
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
COMMIT;
