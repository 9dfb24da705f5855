-- sqlq PostgreSQL schema, version 6: workflows (sqlq.common.workflow). A member's place in
-- its graph is its row's flow (jsonb: its workflow, ref, counts, policies and cancel
-- reason, never its parents), NULL for a job outside every workflow, so a plain job
-- costs a NULL; the graph's edges are their own table, written once with the child, and
-- a workflow's members are listed, in the order they were stored, in members (what
-- GET /workflows/{id} and retention read). state gains 'waiting' (text: no constraint
-- to change). A NULL column is a catalog change: no row is rewritten.
ALTER TABLE jobs
    ADD COLUMN flow jsonb;

-- Each edge by parent (whom a parent's end visits, in the outcome's transaction) and by
-- child in the order its parents were named (n: 0, 1, ...).
CREATE TABLE edges (
    parent text NOT NULL,
    child  text NOT NULL,
    n      integer NOT NULL,
    PRIMARY KEY (parent, child)
);
CREATE INDEX edges_child ON edges (child, n);

-- A workflow's members, in the order they were stored.
CREATE TABLE members (
    job_id      text PRIMARY KEY,
    workflow_id text NOT NULL,
    seq         bigserial NOT NULL
);
CREATE INDEX members_workflow ON members (workflow_id, seq);
