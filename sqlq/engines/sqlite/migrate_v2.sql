-- Version 1 -> 2: named queues, idempotency keys, attempts kept across an operator retry.
-- Run once, when the jobs table lacks these columns; every row gets the defaults. One
-- transaction: a crash leaves all four columns or none (the check is for the first).
BEGIN IMMEDIATE;
ALTER TABLE jobs ADD COLUMN queue TEXT NOT NULL DEFAULT 'default';
ALTER TABLE jobs ADD COLUMN idempotency_key TEXT;
ALTER TABLE jobs ADD COLUMN request_hash TEXT;
ALTER TABLE jobs ADD COLUMN attempts_total INTEGER NOT NULL DEFAULT 0;
COMMIT;
