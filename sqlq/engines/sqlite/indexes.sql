-- Indexes on version-2 columns: created after any migration has added them.
-- One retained job per idempotency key; the key check and the insert are one statement.
CREATE UNIQUE INDEX IF NOT EXISTS jobs_key ON jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- Listing the dead letters (and cancelled jobs) in id order without a full scan. Partial:
-- a plain (state, id) index was rewritten at every state change, three per job, and
-- the common states fill a page from the primary key anyway. Live jobs list on jobs_live
-- (schema.sql: in a WITHOUT ROWID table its entries hold the id, so it is (state, id)).
-- A listing names the index's states for the planner to use it (sqlq.engines.listing).
-- No index serves completed, kind or queue: each costs the write path more than the
-- listing saves (bench/listing.py --micro: a partial (state, id) for completed jobs
-- +20 us per job at completion, (kind, id) and (queue, id) +6.5 us each per insert,
-- against ~150 us of server CPU per no-op job). Those filters walk the primary key.
DROP INDEX IF EXISTS jobs_state_id;
CREATE INDEX IF NOT EXISTS jobs_retryable ON jobs (state, id)
    WHERE state IN ('dead', 'cancelled');
-- A workflow's members that wait for their parents, read at recovery (the live view holds
-- them): few, and no other index lists them.
CREATE INDEX IF NOT EXISTS jobs_waiting ON jobs (state) WHERE state = 'waiting';
