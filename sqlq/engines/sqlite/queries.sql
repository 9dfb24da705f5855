-- The SQLite engine's named statements: sqlq.engines.sqlite.batch loads them as Q
-- (sqlq.common.engine.sql.load_queries), for batch.py and store.py.

-- name: job_columns
-- A job's columns, in the order of sqlq.engines.rows (job_values, row_job).
-- Written once: every statement below that names them says {job_columns}.
id, kind, args, state, attempts, max_attempts, ready_at, priority, epoch, created_at,
updated_at, last_error, result, started_at, queue, idempotency_key, request_hash,
attempts_total

-- name: insert_jobs
-- Many rows in one statement: {rows} becomes one "(?, ...)" group per row (see
-- sqlq.common.engine.sql.batch_sql). One statement is one SQLite step, and the connection's
-- thread must retake the GIL after every step; with the event loop busy each
-- retake waits, so a batch costs one wait instead of one per row (executemany).
INSERT INTO jobs ({job_columns})
VALUES {rows};

-- name: apply_transitions
-- Rows of (id, expect_epoch, state, epoch, attempts, ready_at, updated_at,
-- last_error, result, started_at, attempts_total); a VALUES table names its
-- columns column1... A NULL attempts_total leaves the column as it is.
-- The epoch guard fences stale workers; the EXISTS guard enforces the transition
-- table. A row refused by a guard is not updated: the caller compares the count.
UPDATE jobs
   SET state = t.column3, epoch = t.column4, attempts = t.column5, ready_at = t.column6,
       updated_at = t.column7, last_error = t.column8, result = t.column9,
       started_at = t.column10, attempts_total = COALESCE(t.column11, jobs.attempts_total)
  FROM (VALUES {rows}) AS t
 WHERE jobs.id = t.column1
   AND jobs.epoch = t.column2
   AND EXISTS (SELECT 1 FROM legal_transitions
                WHERE from_state = jobs.state AND to_state = t.column3);

-- name: get_job
SELECT {job_columns}
  FROM jobs WHERE id = ?;

-- name: live_jobs
SELECT {job_columns}
  FROM jobs WHERE state IN ('scheduled', 'running');

-- name: find_key
SELECT {job_columns}
  FROM jobs WHERE idempotency_key = ?;

-- name: list_jobs
-- Keyset paging in id order, one statement per filter shape: {filters} is the AND of
-- the list_by_* terms the query sets (sqlq.engines.listing), so that each shape plans on an
-- index. The one statement with `? IS NULL OR state = ?` planned every filter as a walk
-- of the primary key, which reads every retained job when the filter matches few.
SELECT {job_columns}
  FROM jobs
 WHERE id > :after{filters}
 ORDER BY id
 LIMIT :limit;

-- name: list_by_live_state
-- The IN term, which the bound state implies, lets the planner use the partial jobs_live.
state IN ('scheduled', 'running') AND state = :state

-- name: list_by_retryable_state
-- The same for jobs_retryable.
state IN ('dead', 'cancelled') AND state = :state

-- name: list_by_state
-- Completed jobs have no index (indexes.sql says why): most retained jobs are
-- completed, so a page of them fills from the primary key.
state = :state

-- name: list_by_kind
kind = :kind

-- name: list_by_queue
queue = :queue

-- name: table_columns
SELECT name FROM pragma_table_info('jobs');

-- name: prune_terminal
DELETE FROM jobs
 WHERE state IN ('completed', 'dead', 'cancelled') AND updated_at < ?;

-- name: count_jobs
SELECT count(*) FROM jobs;

-- name: clear_transitions
DELETE FROM legal_transitions;

-- name: insert_transition
INSERT INTO legal_transitions (from_state, to_state) VALUES (?, ?);

-- name: set_meta
INSERT INTO meta (key, value) VALUES (?, ?)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: set_queue_paused
INSERT INTO queues (name, paused) VALUES (?, ?)
    ON CONFLICT (name) DO UPDATE SET paused = excluded.paused;

-- name: paused_queues
SELECT name FROM queues WHERE paused = 1 ORDER BY name;
