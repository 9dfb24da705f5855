-- The PostgreSQL engine's statements for schedules, by name (loaded in
-- sqlq.engines.postgres.queries, applied by sqlq.engines.postgres.schedules). Each one
-- is the rule of sqlq.common.schedule.fold, in SQL. {job_columns} and {table_columns} are
-- as in queries.sql.

-- name: advance
-- Ticks: for each row of u (one per call, numbered by caller), move the cursor of
-- schedule name from expect_cursor to cursor if it is at expect_version with that
-- cursor and its idle job (overlap skip) is not live, and insert that call's jobs
-- ($1..$28, write_batch's columns and casts, with their call's number in $36) only if
-- its cursor moved. One statement for every tick of a batch, so one round trip and one
-- WAL flush; the names are distinct (one target row per u row). Of two nodes that
-- evaluate the same tick, the second waits on the first's row lock, then finds the
-- cursor moved (PostgreSQL reads a locked row again before it updates it): it changes
-- nothing, inserts nothing, and hears StaleScheduleError. job becomes last_job (NULL
-- keeps it). With no job rows, an advance passes its tick over, or is one step of a
-- call's transaction (whose earlier changes it sees). A row per call names the
-- refusal: whether it moved, the version and cursor it found (none: no such schedule)
-- and whether its idle job is live; found values that match the expected ones mean
-- the row changed while the statement waited for it.
WITH u AS (
    SELECT * FROM unnest($29::text[], $30::int8[], $31::int8[], $32::int8[], $33::text[],
                         $34::text[], $35::int4[])
        AS u(name, expect_version, expect_cursor, cursor, idle, job, caller)
), idle AS (
    SELECT u.caller,
           EXISTS (SELECT 1 FROM jobs j
                    WHERE j.id = u.idle AND j.state IN ('scheduled', 'running')) AS live
      FROM u
), moved AS (
    UPDATE schedules s
       SET cursor = u.cursor, last_job = coalesce(u.job, s.last_job)
      FROM u JOIN idle i ON i.caller = u.caller
     WHERE s.name = u.name AND s.version = u.expect_version AND s.cursor = u.expect_cursor
       AND NOT i.live
    RETURNING u.caller
), ins AS (
    INSERT INTO jobs ({table_columns})
    SELECT {table_columns} FROM unnest(
        $1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::int8[], $7::float8[],
        $8::int8[], $9::int8[], $10::float8[], $11::float8[], $12::text[], $13::text[],
        $14::float8[], $15::text[], $16::text[], $17::text[], $18::int8[], $19::float8[],
        $20::text[], $21::text[], $22::int8[], $23::text[], $24::text[], $25::float8[],
        $26::bool[], $27::text[], $28::int4[], $36::int4[])
        AS r({table_columns}, caller)
     WHERE r.caller IN (SELECT m.caller FROM moved m)
    RETURNING 1
)
SELECT u.caller,
       EXISTS (SELECT 1 FROM moved m WHERE m.caller = u.caller) AS moved,
       s.version, s.cursor, i.live AS idle_live,
       (SELECT count(*) FROM (SELECT pg_notify('sqlq_jobs', '')
                               WHERE EXISTS (SELECT 1 FROM ins)) AS woken) AS woken
  FROM u JOIN idle i ON i.caller = u.caller
  LEFT JOIN schedules s ON s.name = u.name
 ORDER BY u.caller;

-- name: put_schedule
-- Create ($8 = 0: only if there is none) or replace (only at version $8) the whole
-- record, but never its cursor backwards (sqlq.common.schedule.fold: a put read before a
-- tick and committed after it keeps the tick's cursor and job; the SET list reads the old
-- row). Returns the rows written (0: refused) and the version found, for the error.
WITH replaced AS (
    UPDATE schedules
       SET spec = $2::text, version = $3::int8, cursor = greatest(cursor, $4::int8),
           last_job = CASE WHEN cursor < $4::int8 THEN $5::text ELSE last_job END,
           created_at = $6::float8, updated_at = $7::float8
     WHERE name = $1::text AND version = $8::int8 AND $8::int8 <> 0
    RETURNING 1
), created AS (
    INSERT INTO schedules (name, spec, version, cursor, last_job, created_at, updated_at)
    SELECT $1::text, $2::text, $3::int8, $4::int8, $5::text, $6::float8, $7::float8
     WHERE $8::int8 = 0
    ON CONFLICT (name) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM replaced) + (SELECT count(*) FROM created) AS written,
       (SELECT version FROM schedules WHERE name = $1::text) AS version;

-- name: drop_schedule
-- Never refused: a schedule that is not there is dropped already. Its jobs stay.
DELETE FROM schedules WHERE name = $1::text;

-- name: schedules
-- In name order: the primary key's ("C" collation: code points, as every engine lists).
SELECT name, spec, version, cursor, last_job, created_at, updated_at
  FROM schedules
 ORDER BY name;

-- name: schedule
SELECT name, spec, version, cursor, last_job, created_at, updated_at
  FROM schedules
 WHERE name = $1::text;

-- name: list_schedule
-- One page of a schedule's jobs (JobQuery.schedule), a statement per filter shape as
-- the other listings (sqlq.engines.listing builds them from this: {filters} are its
-- terms from $2, {low} and {high} the key range after them). The jobs are found by
-- their idempotency keys, [low, high) on jobs_key ("C" collation, so a range of keys is
-- a range of bytes); the rest of the filters and the cursor are applied to those rows.
-- MATERIALIZED, because with ORDER BY id LIMIT in the same query the planner may walk
-- jobs_pkey in id order and filter every retained job, hoping to stop early; on its
-- own the range is planned for what it is: a few of the retained jobs, on jobs_key.
WITH mine AS MATERIALIZED (
    SELECT {job_columns} FROM jobs
     WHERE idempotency_key >= {low} AND idempotency_key < {high} AND {filters}
)
SELECT * FROM mine
 ORDER BY id {order}
 LIMIT $1;
