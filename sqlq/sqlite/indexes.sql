-- Indexes on version-2 columns: created after any migration has added them.
-- One retained job per idempotency key; the key check and the insert are one statement.
CREATE UNIQUE INDEX IF NOT EXISTS jobs_key ON jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- Listing the dead letters (and cancelled jobs) in id order without a full scan. Partial:
-- a plain (state, id) index was rewritten at every state change, three per job, and
-- the common states fill a page from the primary key anyway.
DROP INDEX IF EXISTS jobs_state_id;
CREATE INDEX IF NOT EXISTS jobs_retryable ON jobs (state, id)
    WHERE state IN ('dead', 'cancelled');
