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
