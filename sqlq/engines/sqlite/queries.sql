-- The SQLite engine's named statements: sqlq.engines.sqlite.queries loads them as Q
-- (sqlq.common.engine.sql.load_queries), for batch.py, schedules.py and store.py.

-- name: job_columns
-- A job's columns, in the order of sqlq.engines.rows (job_values, row_job).
-- Written once: every statement below that names them says {job_columns}.
id, kind, args, state, attempts, max_attempts, ready_at, priority, epoch, created_at,
updated_at, last_error, result, started_at, queue, idempotency_key, request_hash,
attempts_total, cancel_requested_at, progress, checkpoint, snoozes, errors, holder, lease_until,
cancel_forced, key, weight

-- name: changes_view
-- A batch's changes, in the callers' order, as rows of one view (created per connection
-- at open, TEMP, so the database file holds only data): op, then a job's columns, then
-- the epoch a move expects. Inserting into it stores nothing; the two triggers below
-- apply each row. So a whole batch is one INSERT statement, one hop to aiosqlite's
-- thread and one SQLite step, where a BEGIN, a statement per table and a COMMIT were
-- four. A statement is atomic: any error in it (a duplicate, a refused guard) undoes
-- every row of it.
CREATE TEMP VIEW IF NOT EXISTS batch_changes AS
SELECT NULL AS op, {job_columns}, NULL AS expect_epoch FROM jobs WHERE 0;

-- name: insert_change
CREATE TEMP TRIGGER IF NOT EXISTS insert_change INSTEAD OF INSERT ON batch_changes
WHEN NEW.op = 'insert'
BEGIN
  INSERT INTO jobs ({job_columns}) VALUES ({new_job_columns});
END;

-- name: move_change
-- The epoch guard fences stale workers; the EXISTS guard enforces the transition
-- table, and running -> running must keep the attempt's start (Job.check); a move a guard
-- refuses aborts the statement. A NULL attempts_total
-- leaves the column as it is; the running columns and the holder's lease are set whole, as
-- the move says (a NULL there is "none", not "unchanged": sqlq.engines.rows.running_values;
-- an in-process claim's holder and lease are NULL, a remote worker's are its name and time;
-- cancel_forced is the move's too: Job.force_cancel sets it, Job.renew keeps it).
CREATE TEMP TRIGGER IF NOT EXISTS move_change INSTEAD OF INSERT ON batch_changes
WHEN NEW.op = 'move'
BEGIN
  UPDATE jobs
     SET state = NEW.state, epoch = NEW.epoch, attempts = NEW.attempts,
         ready_at = NEW.ready_at, updated_at = NEW.updated_at, last_error = NEW.last_error,
         result = NEW.result, started_at = NEW.started_at,
         attempts_total = COALESCE(NEW.attempts_total, jobs.attempts_total),
         cancel_requested_at = NEW.cancel_requested_at, progress = NEW.progress,
         checkpoint = NEW.checkpoint, snoozes = NEW.snoozes, errors = NEW.errors,
         holder = NEW.holder, lease_until = NEW.lease_until, cancel_forced = NEW.cancel_forced
   WHERE id = NEW.id
     AND epoch = NEW.expect_epoch
     AND EXISTS (SELECT 1 FROM legal_transitions
                  WHERE from_state = jobs.state AND to_state = NEW.state)
     AND (jobs.state <> 'running' OR NEW.state <> 'running'
          OR jobs.started_at IS NEW.started_at);
  SELECT RAISE(ABORT, 'sqlq: a guard refused a move') WHERE changes() = 0;
END;

-- name: insert_jobs
-- A batch's new jobs, set-wise: one INSERT, all or none (a duplicate id or key fails it).
INSERT INTO jobs ({job_columns}) VALUES {rows};

-- name: move_jobs
-- A batch's moves, set-wise, when no job moves twice in it (batch.plan): each row of the
-- VALUES table is one transition ({t:NAME} is its column of that name,
-- sqlq.engines.rows.TRANSITION_COLUMNS), under the same guards as move_change; a row a
-- guard refuses changes nothing, so the caller compares the count and rolls back. The
-- rows go through no trigger: INSTEAD OF a view, each row of a statement is written to an
-- ephemeral table and runs the trigger's program (a b-tree made and zeroed each time:
-- ~70k instructions of a no-op job's three writes, callgrind).
UPDATE jobs
   SET state = {t:state}, epoch = {t:epoch}, attempts = {t:attempts},
       ready_at = {t:ready_at}, updated_at = {t:updated_at}, last_error = {t:last_error},
       result = {t:result}, started_at = {t:started_at},
       attempts_total = COALESCE({t:attempts_total}, jobs.attempts_total),
       cancel_requested_at = {t:cancel_requested_at}, progress = {t:progress},
       checkpoint = {t:checkpoint}, snoozes = {t:snoozes}, errors = {t:errors},
       holder = {t:holder}, lease_until = {t:lease_until}, cancel_forced = {t:cancel_forced}
  FROM (VALUES {rows}) AS t
 WHERE jobs.id = {t:id}
   AND jobs.epoch = {t:expect_epoch}
   AND EXISTS (SELECT 1 FROM legal_transitions
                WHERE from_state = jobs.state AND to_state = {t:state})
   AND (jobs.state <> 'running' OR {t:state} <> 'running'
        OR jobs.started_at IS {t:started_at});

-- name: apply_changes
-- Many rows in one statement: {rows} becomes one "(?, ...)" group per row (see
-- sqlq.common.engine.sql.batch_sql); rows are applied in order, so two changes of one
-- job in a batch apply as the fold would.
INSERT INTO batch_changes VALUES {rows};

-- name: get_job
SELECT {job_columns}
  FROM jobs WHERE id = ?;

-- name: live_jobs
SELECT {job_columns}
  FROM jobs WHERE state IN ('scheduled', 'running');

-- name: get_many
-- {ids} becomes one "?" per id (SQLiteStore.get_many, in slices).
SELECT {job_columns}
  FROM jobs WHERE id IN ({ids});

-- name: find_key
SELECT {job_columns}
  FROM jobs WHERE idempotency_key = ?;

-- name: list_jobs
-- Keyset paging in id order ({beyond} and {order}: < and DESC newest first, from below
-- the cursor, or from "g", past every hex id), one statement per filter shape: {filters} is the AND of
-- the list_by_* terms the query sets (sqlq.engines.listing), so that each shape plans on an
-- index. The one statement with `? IS NULL OR state = ?` planned every filter as a walk
-- of the primary key, which reads every retained job when the filter matches few.
SELECT {job_columns}
  FROM jobs
 WHERE id {beyond} :after{filters}
 ORDER BY id {order}
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

-- name: list_by_schedule
-- A schedule's jobs: the range of the idempotency keys its jobs carry (sqlq.common.schedule
-- key_range), on the unique key index, then sorted by id for keyset paging (a schedule
-- retains few jobs: its ticks within retention). {filters} is the AND of list_by_state,
-- list_by_kind and list_by_queue the query sets (sqlq.engines.sqlite.schedules). INDEXED BY
-- pins the plan: a state term could lure the planner onto jobs_live, or the id order onto
-- the primary key, either of which reads every retained job.
SELECT {job_columns}
  FROM jobs INDEXED BY jobs_key
 WHERE idempotency_key >= :low AND idempotency_key < :high AND id {beyond} :after{filters}
 ORDER BY id {order}
 LIMIT :limit;

-- name: schedule_columns
name, spec, version, cursor, last_job, created_at, updated_at

-- name: put_new_schedule
-- A PutSchedule expecting version 0: the name must be free. A taken name changes no row,
-- and a guarded statement that changed no row was refused (sqlq.engines.sqlite.batch).
INSERT INTO schedules ({schedule_columns}) VALUES (?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (name) DO NOTHING;

-- name: put_schedule
-- A PutSchedule replacing version ?: the whole record, if it is still at that version, but
-- never its cursor backwards (sqlq.common.schedule.fold: a put read before a tick and
-- committed after it keeps the tick's cursor and job). The SET list is evaluated on the
-- old row, so cursor < ? below is the stored cursor's test.
UPDATE schedules
   SET spec = ?, version = ?, last_job = CASE WHEN cursor < ?3 THEN ?4 ELSE last_job END,
       cursor = MAX(cursor, ?3), created_at = ?, updated_at = ?
 WHERE name = ? AND version = ?;

-- name: drop_schedule
-- Never refused: a schedule that is not there is dropped already.
DELETE FROM schedules WHERE name = ?;

-- name: advance_schedule
-- The compare-and-set of a tick: version and cursor as read, and for overlap skip the
-- previous tick's job not live (a job that is gone, pruned or never there, is not).
-- updated_at stays: it is when the schedule was last put (sqlq.common.schedule.fold).
UPDATE schedules
   SET cursor = :cursor, last_job = COALESCE(:job, last_job)
 WHERE name = :name AND version = :expect_version AND cursor = :expect_cursor
   AND (:idle IS NULL OR NOT EXISTS (
        SELECT 1 FROM jobs WHERE id = :idle AND state IN ('scheduled', 'running')));

-- name: get_schedule
SELECT {schedule_columns}
  FROM schedules WHERE name = ?;

-- name: list_schedules
SELECT {schedule_columns}
  FROM schedules ORDER BY name;

-- name: job_is_live
SELECT 1 FROM jobs WHERE id = ? AND state IN ('scheduled', 'running');

-- name: table_columns
SELECT name FROM pragma_table_info('jobs');

-- name: prune_terminal
-- sqlq.common.engine.index.retired: finished before the cutoff, and a workflow's member only
-- with its whole workflow (none of its members live or newer), never a parent under a live
-- child. A job outside every workflow costs one miss on flows' key.
DELETE FROM jobs
 WHERE state IN ('completed', 'dead', 'cancelled') AND updated_at < ?1
   AND NOT EXISTS (
       SELECT 1 FROM flows AS f
         JOIN flows AS g ON g.workflow_id = f.workflow_id
         JOIN jobs AS k ON k.id = g.job_id
        WHERE f.job_id = jobs.id
          AND (k.state NOT IN ('completed', 'dead', 'cancelled') OR k.updated_at >= ?1));

-- name: prune_flows
DELETE FROM flows WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.id = flows.job_id);

-- name: prune_edges
DELETE FROM edges WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.id = edges.child);

-- name: flow_columns
workflow_id, ref, deps_pending, failed, on_parent_failure, run_if, cancel_reason

-- name: insert_flow
INSERT INTO flows (job_id, {flow_columns}) VALUES (?, ?, ?, ?, ?, ?, ?, ?);

-- name: insert_edge
INSERT INTO edges (parent, child, n) VALUES (?, ?, ?);

-- name: update_flow
UPDATE flows SET deps_pending = ?, failed = ?, cancel_reason = ? WHERE job_id = ?;

-- name: update_flow_reason
UPDATE flows SET cancel_reason = ? WHERE job_id = ?;

-- name: get_flows
-- {ids} becomes one "?" per id (sqlq.engines.sqlite.flows).
SELECT job_id, {flow_columns} FROM flows WHERE job_id IN ({ids});

-- name: any_flow
SELECT EXISTS (SELECT 1 FROM flows);

-- name: live_flows
-- Recovery's: the flows of the live members (the live view holds their flows whole).
SELECT f.job_id, {flow_columns}
  FROM flows AS f JOIN jobs AS j ON j.id = f.job_id
 WHERE j.state IN ('waiting', 'scheduled', 'running');

-- name: waiting_jobs
SELECT {job_columns}
  FROM jobs WHERE state = 'waiting';

-- name: parents_of
SELECT parent FROM edges WHERE child = ? ORDER BY n;

-- name: parents_of_many
-- {ids} becomes one "?" per id: each child's parents, in the order named.
SELECT child, parent FROM edges WHERE child IN ({ids}) ORDER BY child, n;

-- name: children_of
-- The children of the parents {ids} (one "?" each: sqlq.engines.sqlite.flows), in their
-- ids' order (one order for every engine's walk).
SELECT {job_columns}
  FROM jobs WHERE id IN (SELECT child FROM edges WHERE parent IN ({ids}))
 ORDER BY id;

-- name: states_of
-- {ids} becomes one "?" per id (sqlq.engines.sqlite.flows).
SELECT id, state FROM jobs WHERE id IN ({ids});

-- name: workflow_jobs
-- A workflow's members, in the order they were stored.
SELECT {job_columns}
  FROM jobs WHERE id IN (SELECT job_id FROM flows WHERE workflow_id = ?);

-- name: workflow_order
SELECT job_id FROM flows WHERE workflow_id = ? ORDER BY rowid;

-- name: count_jobs
SELECT count(*) FROM jobs;

-- name: clear_transitions
DELETE FROM legal_transitions;

-- name: insert_transition
INSERT INTO legal_transitions (from_state, to_state) VALUES (?, ?);

-- name: set_meta
INSERT INTO meta (key, value) VALUES (?, ?)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: add_secret
-- The first open's random value for a secret (the signing key of remote claims' tokens,
-- sqlq.common.tokens); a later one keeps what is there.
INSERT OR IGNORE INTO secrets (name, value) VALUES (?, ?);

-- name: get_secret
SELECT value FROM secrets WHERE name = ?;

-- name: set_queue_paused
INSERT INTO queues (name, paused) VALUES (?, ?)
    ON CONFLICT (name) DO UPDATE SET paused = excluded.paused;

-- name: paused_queues
SELECT name FROM queues WHERE paused = 1 ORDER BY name;

-- name: set_queue_policy
INSERT INTO policies (name, policy) VALUES (?, ?)
    ON CONFLICT (name) DO UPDATE SET policy = excluded.policy;

-- name: drop_queue_policy
DELETE FROM policies WHERE name = ?;

-- name: queue_policies
SELECT name, policy FROM policies ORDER BY name;
