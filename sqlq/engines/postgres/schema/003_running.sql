-- sqlq PostgreSQL schema, version 3: what a running job carries (sqlq.common.running), as
-- whole fields of the job (sqlq.engines.rows.RUNNING_COLUMNS): a cancel asked for while it
-- ran, its latest progress, a checkpoint for its next attempt, its snoozes, and the errors
-- of its last attempts.
-- progress, checkpoint and errors are JSON as text, NULL for none, as args and result are
-- (jsonb would rewrite a checkpoint's numbers and refuse \u0000 in its strings).
-- snoozes is a bigint as every counter here is: the store keeps whatever integer the job
-- model holds.
-- In place and cheap on a big table: a column with no default, or a constant one, is a
-- catalog change (PostgreSQL 11 and later keep the default in the catalog and rewrite
-- nothing), so this takes the table's lock for a moment, under the migration's lock.
ALTER TABLE jobs
    ADD COLUMN cancel_requested_at double precision,
    ADD COLUMN progress            text,
    ADD COLUMN checkpoint          text,
    ADD COLUMN snoozes             bigint NOT NULL DEFAULT 0,
    ADD COLUMN errors              text;
