-- sqlq SQLite schema, version 8 (3 added the schedules table, 4 the running columns, 5 a
-- running job's holder and lease and the secrets table, 6 cancel_forced, 7 the flows and
-- edges tables of workflows, 8 a job's fairness key and weight, and the policies table; every
-- statement here runs at every open, IF NOT EXISTS, so an older database gains the tables it
-- lacks, and migrate_v*.sql the columns). Readable with the stdlib sqlite3 module and plain SQL.
CREATE TABLE IF NOT EXISTS jobs (
    id           TEXT PRIMARY KEY,
    kind         TEXT NOT NULL,
    args         TEXT NOT NULL,            -- JSON
    state        TEXT NOT NULL,            -- waiting | scheduled | running | completed | dead | cancelled
    attempts     INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    ready_at     REAL NOT NULL,            -- unix seconds
    priority     INTEGER NOT NULL,
    epoch        INTEGER NOT NULL,         -- bumped at every requeue; fences stale workers
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    last_error   TEXT,
    result       TEXT,                     -- JSON
    started_at   REAL,                     -- when the latest attempt started
    queue        TEXT NOT NULL DEFAULT 'default',
    idempotency_key TEXT,                  -- a client's key: one retained job per key
    request_hash TEXT,                     -- what was asked with that key
    attempts_total INTEGER NOT NULL DEFAULT 0, -- attempts before the latest operator retry
    -- What a running job carries (sqlq.common.running), NULL for none; migrate_v4.sql.
    cancel_requested_at REAL,              -- unix seconds: a cancel was asked for while it ran
    progress     TEXT,                     -- JSON {percent, message, at}
    checkpoint   TEXT,                     -- JSON: what the next attempt starts with
    snoozes      INTEGER NOT NULL DEFAULT 0,
    errors       TEXT,                     -- JSON [{attempt, error, at}], the last few failures
    -- Who holds a running job and until when: a remote worker's claim only (an in-process
    -- one leaves both NULL), cleared when it leaves running; migrate_v5.sql.
    holder       TEXT,                     -- worker:<name>
    lease_until  REAL,                     -- unix seconds
    -- 1: a forced cancel holds the lease at the grace's end (no renewal moves it), so the
    -- attempt ends cancelled then, after a restart too; 0 otherwise. migrate_v6.sql.
    cancel_forced INTEGER NOT NULL DEFAULT 0,
    -- A job's fairness key and weight (sqlq.common.fair); migrate_v8.sql.
    key     TEXT,
    weight       INTEGER NOT NULL DEFAULT 1
) WITHOUT ROWID;

-- Recovery reads only live jobs; pruning reads only old terminal ones.
CREATE INDEX IF NOT EXISTS jobs_live ON jobs (state) WHERE state IN ('scheduled', 'running');
CREATE INDEX IF NOT EXISTS jobs_terminal_age ON jobs (updated_at)
    WHERE state IN ('completed', 'dead', 'cancelled');

-- A copy of sqlq.common.models.TRANSITIONS, rewritten at every open, so the guarded
-- UPDATE refuses exactly the moves the Python fold refuses.
CREATE TABLE IF NOT EXISTS legal_transitions (
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    PRIMARY KEY (from_state, to_state)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

-- Secrets made once at random and kept with the data: the key remote claims' tokens are
-- signed with (name 'signing_key', 32 bytes), so a token outlives a restart. Never shown.
CREATE TABLE IF NOT EXISTS secrets (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL
) WITHOUT ROWID;

-- Queues an operator paused (durable: a restart keeps them paused).
CREATE TABLE IF NOT EXISTS queues (
    name   TEXT PRIMARY KEY,
    paused INTEGER NOT NULL
) WITHOUT ROWID;

-- A queue's policy (sqlq.common.fair.Policy as JSON), durable like its pause; no row: none.
CREATE TABLE IF NOT EXISTS policies (
    name   TEXT PRIMARY KEY,
    policy TEXT NOT NULL
) WITHOUT ROWID;

-- Schedules (sqlq.common.schedule.Schedule), by name. spec is the ScheduleSpec as JSON;
-- version fences every change (a put bumps it), cursor is the newest tick handled (unix
-- seconds), last_job the id of the newest tick's job. A schedule's jobs are not linked
-- here: they carry its name in their idempotency keys (sched:<name>:<tick>).
CREATE TABLE IF NOT EXISTS schedules (
    name       TEXT PRIMARY KEY,
    spec       TEXT NOT NULL,              -- JSON
    version    INTEGER NOT NULL,
    cursor     INTEGER NOT NULL,
    last_job   TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
) WITHOUT ROWID;

-- A workflow member's place in its graph (sqlq.common.workflow.Flow), one row per member,
-- apart from its job's row: a child's counts change at each parent's end, and a jobs row
-- that changes size is written again whole, its checkpoint too. A job outside every
-- workflow has no row here. The rowid is the order members were stored in. Version 7.
CREATE TABLE IF NOT EXISTS flows (
    job_id            TEXT PRIMARY KEY,
    workflow_id       TEXT NOT NULL,
    ref               TEXT,
    deps_pending      INTEGER NOT NULL,    -- parents not settled yet
    failed            INTEGER NOT NULL,    -- parents that failed and count as settled
    on_parent_failure TEXT NOT NULL,       -- cancel | run | wait
    run_if            TEXT NOT NULL,       -- all_completed | all_finished | any_failed
    cancel_reason     TEXT                 -- user | upstream_dead | upstream_cancelled | condition_false
);
CREATE INDEX IF NOT EXISTS flows_workflow ON flows (workflow_id);

-- A workflow's edges, by parent (whom a parent's end visits), and by child in the order
-- its parents were named (n: 0, 1, ...). Written once, with the child; never changed.
CREATE TABLE IF NOT EXISTS edges (
    parent TEXT NOT NULL,
    child  TEXT NOT NULL,
    n      INTEGER NOT NULL,
    PRIMARY KEY (parent, child)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS edges_child ON edges (child, n);
