-- sqlq PostgreSQL schema, version 4: remote workers (issue 23).
-- A running job's holder and lease (Job.holder, Job.lease_until) are the columns node and
-- lease_until that version 1 made for claims: a node's name for its own claim, worker:<name>
-- for a remote worker's (sqlq.common.protocol.remote_holder), which the rescue of expired
-- leases covers as it covers a dead node's. So no column changes here: the statements
-- read node as holder (sqlq.engines.postgres.queries).
-- Secrets every node reads: the key remote claims' tokens are signed with (name
-- 'signing_key', 32 random bytes, made by the first node that asks), so a token one node
-- issued verifies on any other and after any restart. Never shown.
CREATE TABLE secrets (
    name  text PRIMARY KEY,
    value bytea NOT NULL
);
