-- sqlq PostgreSQL schema, version 7: fair claims (sqlq.common.fair). A job's fairness key
-- and weight, written at its insert and never by a transition; a queue's policy as JSON,
-- durable like its pause (no row: none). Constant defaults are catalog changes
-- (003_running.sql): no row is rewritten, and every row an older version wrote reads as
-- keyless with weight 1.
ALTER TABLE jobs
    ADD COLUMN key text,
    ADD COLUMN weight int4 NOT NULL DEFAULT 1;
CREATE TABLE policies (
    name   text PRIMARY KEY,
    policy text NOT NULL
);
-- A fair queue's claims (sqlq.engines.postgres.fair): each key's bucket and finish tag,
-- and the queue's virtual time and own bucket, written under the queue's lock in the
-- transaction that claims. A key with no key ('' here: a key has a character at least).
-- A claim never deletes a row; running counts are never kept: they are counted from
-- running rows under unexpired leases.
CREATE TABLE fair_keys (
    queue  text NOT NULL,
    key    text NOT NULL,
    tat    float8,
    finish float8,
    PRIMARY KEY (queue, key)
);
CREATE TABLE fair_queues (
    queue   text PRIMARY KEY,
    virtual float8 NOT NULL DEFAULT 0,
    tat     float8
);
-- A fair queue's due jobs by key (the claim's count by key, and its pick in key order).
CREATE INDEX jobs_fair ON jobs (queue, key, priority DESC, ready_at, id) WHERE state = 'scheduled';
