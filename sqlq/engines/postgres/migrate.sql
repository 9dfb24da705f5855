-- The statements of sqlq.engines.postgres.migrate, by name: the schema version a database
-- is at, and the lock that lets one migration at a time apply. The schema itself is in
-- schema/NNN_*.sql.

-- name: has_version
-- A database sqlq never touched has no version table.
SELECT to_regclass('sqlq_schema') IS NOT NULL;

-- name: version
SELECT version FROM sqlq_schema;

-- name: lock
-- Held to the end of the migration's transaction ($1 is MIGRATE_LOCK).
SELECT pg_advisory_xact_lock($1);

-- name: create_version
CREATE TABLE sqlq_schema (version integer NOT NULL);

-- name: first_version
INSERT INTO sqlq_schema VALUES (0);

-- name: set_version
UPDATE sqlq_schema SET version = $1;
