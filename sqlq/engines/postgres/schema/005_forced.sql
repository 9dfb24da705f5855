-- sqlq PostgreSQL schema, version 5: whether a forced cancel holds a remote worker's lease
-- where it put it (Job.cancel_forced). request_cancel sets it with the lease cut to the
-- grace's end; extend then leaves that lease as it is, so it runs out there on every node
-- and after any restart, and the rescue ends the attempt cancelled, counted as cut off.
-- Like node and lease_until it belongs to the row while it runs (no transition writes it)
-- and write_batch clears it when the row leaves running.
-- A constant default is a catalog change (003_running.sql): no row is rewritten, and every
-- row an older version wrote reads as not forced.
ALTER TABLE jobs
    ADD COLUMN cancel_forced boolean NOT NULL DEFAULT false;
