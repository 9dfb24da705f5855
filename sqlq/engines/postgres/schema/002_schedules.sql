-- sqlq PostgreSQL schema, version 2: schedules (sqlq.common.schedule), shared by every node.

-- A schedule's jobs are found by a range of idempotency keys (sched:<name>: up to
-- sched:<name>;), and a range is only a range in byte order: under a locale collation
-- (en_US, say) punctuation weighs less than letters, so "sched:ab:1" can sort inside
-- "a"'s range. The key column takes the "C" collation, so every comparison of a key, and
-- jobs_key itself, is in byte order; equality is unchanged (every deterministic collation
-- compares equal exactly the byte-equal strings), so no key the index held collides now.
-- PostgreSQL changes a column's collation without rewriting the table, rebuilding only
-- jobs_key (under the migration's lock: writes wait for it, once).
ALTER TABLE jobs ALTER COLUMN idempotency_key TYPE text COLLATE "C";

-- One row per schedule: the record as sqlq.common.schedule.Schedule holds it. The spec is
-- JSON as text, as jobs' args are (jsonb would rewrite its numbers and refuse \u0000 in
-- its args). name is "C"-collated, so the primary key's order is list_schedules' order,
-- the code-point order every engine lists in.
CREATE TABLE schedules (
    name       text COLLATE "C" PRIMARY KEY,
    spec       text NOT NULL,
    version    bigint NOT NULL,              -- a put's compare-and-set, and an advance's fence
    cursor     bigint NOT NULL,              -- the newest tick handled, unix seconds
    last_job   text,                         -- the job of the newest tick enqueued
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL
);
