-- Indexes on version-2 columns: created after any migration has added them.
-- One retained job per idempotency key; the key check and the insert are one statement.
CREATE UNIQUE INDEX IF NOT EXISTS jobs_key ON jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- Listing by state in id order (the dead letters, say) without a full scan.
CREATE INDEX IF NOT EXISTS jobs_state_id ON jobs (state, id);
