-- The PostgreSQL engine's statements, by name (loaded by sqlq.common.engine.sql.load_queries,
-- in sqlq.engines.postgres.queries). Times are unix seconds from the nodes' clocks, as in
-- every engine.
-- {job_columns} is a job's columns in the order of sqlq.engines.rows.JOB_COLUMNS (job_values
-- and row_job read rows in that order), as a select list: Job.holder is the node column
-- (node AS holder; sqlq.engines.postgres.queries says why), {table_columns} the same
-- columns by the table's names, for an INSERT's column list; {move_columns} is a guarded
-- transition's columns, sqlq.engines.postgres.queries.MOVE_COLUMNS. All are written
-- once, in Python, and put into these statements at import.

-- name: write_batch
-- One group-commit batch in one statement, so one round trip: the inserts as
-- columns ($1..$28, in {table_columns} order), the guarded transitions as columns
-- ($29..$48, in {move_columns} order), then the number of transitions asked for ($49)
-- and whether to wake the claimers ($50), with what ($51: the queues given jobs with a key,
-- one a line: batch.keyed_note). The casts are the table's column types, in
-- those orders (tests/test_postgres_rows.py holds them to the table).
-- A transition applies only if the job is at the expected epoch, the move is
-- legal (``allowed`` lists the states it may come from, as |a|b|; running -> running
-- must keep the attempt's start, Job.check), and the
-- fence holds: the holding node, and the lease still running (an outcome) or
-- run out (a rescue). If fewer rows changed than were asked for, sqlq_expect
-- aborts the statement, rolling back all of it, and the engine redoes the batch
-- one caller at a time. The INSERT and the UPDATE see the same snapshot, so a
-- batch that inserts a job and moves it is never sent this way.
-- Two rules of the shared mode are restated here, because another node may have written
-- the row since the transition's author read it (sqlq.common.store.SharedStore
-- .request_cancel): while the row is running, its cancel_requested_at is never cleared
-- (the first request's time holds; from any other state the transition's value is stored,
-- so a revive clears it); and a move out of running to scheduled or dead on a row whose
-- cancel was asked for lands as cancelled, with the transition's epoch, errors and
-- last_error (sqlq.common.backoff.after_failure's rule: its holder may not have heard).
-- Neither changes which rows apply: a guard refuses the same rows it did.
-- The holder (node) and the lease are the claim's and the renewals' (claim, renew, extend),
-- and cancel_forced a forced cancel's (request_cancel), never a transition's: a move that
-- stays running keeps the row's own, one out of running clears all three (a move row
-- carries none: MOVE_COLUMNS).
WITH ins AS (
    INSERT INTO jobs ({table_columns})
    SELECT * FROM unnest(
        $1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::int8[], $7::float8[],
        $8::int8[], $9::int8[], $10::float8[], $11::float8[], $12::text[], $13::text[],
        $14::float8[], $15::text[], $16::text[], $17::text[], $18::int8[], $19::float8[],
        $20::text[], $21::text[], $22::int8[], $23::text[], $24::text[], $25::float8[],
        $26::bool[], $27::text[], $28::int4[])
    RETURNING 1
), upd AS (
    UPDATE jobs j
       SET state = CASE WHEN j.state = 'running' AND j.cancel_requested_at IS NOT NULL
                         AND u.state IN ('scheduled', 'dead')
                        THEN 'cancelled' ELSE u.state END,
           epoch = u.epoch, attempts = u.attempts, ready_at = u.ready_at,
           updated_at = u.updated_at, last_error = u.last_error, result = u.result,
           started_at = u.started_at,
           attempts_total = coalesce(u.attempts_total, j.attempts_total),
           cancel_requested_at = CASE WHEN j.state = 'running'
                                      THEN coalesce(j.cancel_requested_at, u.cancel_requested_at)
                                      ELSE u.cancel_requested_at END,
           progress = u.progress, checkpoint = u.checkpoint, snoozes = u.snoozes,
           errors = u.errors,
           lease_until = CASE WHEN u.state = 'running' THEN j.lease_until END,
           node = CASE WHEN u.state = 'running' THEN j.node END,
           cancel_forced = u.state = 'running' AND j.cancel_forced
      FROM unnest(
        $29::text[], $30::int8[], $31::text[], $32::text[], $33::int8[], $34::int8[],
        $35::float8[], $36::float8[], $37::text[], $38::text[], $39::float8[], $40::int8[],
        $41::float8[], $42::text[], $43::text[], $44::int8[], $45::text[],
        $46::text[], $47::float8[], $48::float8[])
        AS u({move_columns})
     WHERE j.id = u.id
       AND j.epoch = u.expect_epoch
       AND strpos(u.allowed, '|' || j.state || '|') > 0
       AND (j.state <> 'running' OR u.state <> 'running'
            OR j.started_at IS NOT DISTINCT FROM u.started_at)
       AND (u.holder IS NULL OR j.node = u.holder)
       AND (u.lease_from IS NULL OR j.lease_until >= u.lease_from)
       AND (u.lease_before IS NULL OR j.lease_until < u.lease_before)
    RETURNING 1
)
SELECT sqlq_expect((SELECT count(*) FROM upd), $49),
       (SELECT count(*) FROM ins),
       (SELECT count(*) FROM (SELECT pg_notify('sqlq_jobs', $51) WHERE $50) AS woken);

-- name: why_refused
-- What a refused transition found, to name the error: the job, and who holds it until when.
SELECT {job_columns}, node, lease_until FROM jobs WHERE id = $1;

-- name: claimed
-- The due rows a claim locked (the CTE ``due``, its one column due_id), marked running
-- for this node, or the remote worker it claims for ($5: worker:<name>), with a new
-- epoch, one more attempt and a lease until $3. The job's
-- columns by name: the table's physical order is not the rows' (a column dropped and
-- added again moves to the end). RETURNING names the table's columns as they are after
-- the update; due's column has its own name, so that no name is ambiguous.
UPDATE jobs j
   SET state = 'running', epoch = j.epoch + 1, attempts = j.attempts + 1,
       started_at = $1, updated_at = $1, lease_until = $3, node = $5
  FROM due
 WHERE j.id = due.due_id
RETURNING {job_columns};

-- name: claim
-- Due jobs of queues that are neither paused nor capped (capped ones: claim_capped) nor
-- left out ($4 holds both: the capped queues and those this claim leaves out, the
-- remote queues for a node's own claim), nor under a policy (fair_claim's alone, read
-- here, so a node that has not heard of a new policy yet can't pass its limits), of the queues $6 names (NULL: any) and the kinds
-- $7 names (NULL: any), highest priority first, then oldest, locked so no other node
-- takes them; each gets a new epoch, one more attempt, its holder and a lease. The order
-- holds within a queue; the rows come back in no order and the caller sorts them.
-- The plan must walk jobs_claim in order and stop after n rows. With statistics
-- that lag a burst of submissions, the planner would rather read every due row
-- through another index and sort them all (26 ms for 20,000 due jobs, against
-- 0.6 ms): the engine runs claims on a connection with sorts and bitmap scans
-- turned off (CLAIM_SETTINGS in connections.py), which leaves only the ordered walk.
WITH due AS (
    SELECT id AS due_id FROM jobs
     WHERE state = 'scheduled' AND ready_at <= $1
       AND queue <> ALL ($4::text[] || ARRAY(SELECT name FROM queues WHERE paused)
                                   || ARRAY(SELECT name FROM policies))
       AND ($6::text[] IS NULL OR queue = ANY ($6::text[]))
       AND ($7::text[] IS NULL OR kind = ANY ($7::text[]))
     ORDER BY priority DESC, ready_at, id
     LIMIT $2
       FOR UPDATE SKIP LOCKED
)
{claimed}

-- name: cap_lock
-- A capped queue's claims, one node at a time: $1 is CAP_LOCK, $2 the queue. Held to the
-- end of the transaction that claims.
SELECT pg_advisory_xact_lock($1, hashtext($2));

-- name: claim_capped
-- The same for one capped queue ($4), taking at most what its cap ($6) leaves
-- beside the jobs of that queue running on every node, of the kinds $7 names (NULL: any). The caller holds the
-- queue's advisory lock, taken by an earlier statement of the transaction, so
-- this statement's snapshot already sees every other node's claims.
WITH due AS (
    SELECT id AS due_id FROM jobs
     WHERE state = 'scheduled' AND queue = $4 AND ready_at <= $1
       AND NOT EXISTS (SELECT 1 FROM queues WHERE name = $4 AND paused)
       AND NOT EXISTS (SELECT 1 FROM policies WHERE name = $4)  -- (fair_claim's, as claim's)
       AND ($7::text[] IS NULL OR kind = ANY ($7::text[]))
     ORDER BY priority DESC, ready_at, id
     LIMIT greatest(0, least($2, $6 - (SELECT count(*) FROM jobs
                                        WHERE state = 'running' AND queue = $4)))
       FOR UPDATE SKIP LOCKED
)
{claimed}

-- name: next_due
SELECT min(ready_at) FROM jobs WHERE state = 'scheduled' AND ready_at > $1;

-- name: renew
-- The unexpired leases of the jobs this node's workers hold ($4), and the node's own
-- row, in one statement. Only those jobs: a claim whose answer was lost in a
-- dropped connection is this node's in the table but no worker's, and must run out.
-- $5 is each held job's new progress (JSON text, in $4's order; NULL: none to store),
-- stored under the lease's own fence, so a job this node no longer holds keeps what its
-- holder wrote; a job given progress is updated now, as Job.touch would have it. The
-- values are the number of leases renewed, which of the renewed jobs have a cancel
-- asked for (the fallback for a NOTIFY on sqlq_cancel the listener missed), and which
-- were renewed (a held job left out is a lease lost: its attempt stops).
WITH seen AS (
    INSERT INTO nodes (name, started_at, seen_at) VALUES ($1, $2, $2)
    ON CONFLICT (name) DO UPDATE SET seen_at = excluded.seen_at
    RETURNING 1
), renewed AS (
    UPDATE jobs j
       SET lease_until = $3,
           progress = coalesce(h.progress, j.progress),
           updated_at = CASE WHEN h.progress IS NULL THEN j.updated_at ELSE $2 END
      FROM unnest($4::text[], $5::text[]) AS h(id, progress)
     WHERE j.id = h.id AND j.node = $1 AND j.state = 'running' AND j.lease_until >= $2
       AND (SELECT count(*) FROM seen) >= 0
    RETURNING j.id, j.cancel_requested_at IS NOT NULL AS asked
)
SELECT count(*), coalesce(array_agg(id) FILTER (WHERE asked), '{}'),
       coalesce(array_agg(id), '{}') FROM renewed;

-- name: extend
-- Remote workers' leases (sqlq.common.store.SharedStore.extend), all in one statement:
-- each row of l is a lease, renewed only where the job still runs at that epoch, held by
-- that holder (node = worker:<name>) with its lease unexpired at $1: the fence of an
-- outcome. The lease never shortens, and never moves at all while a forced cancel holds
-- it (cancel_forced: Job.renew's rule; the row may have been forced after the worker's
-- heartbeat read it, on any node); a lease given progress stores it and is updated now,
-- as renew does. Each renewed job comes back with its lease and whether a cancel was
-- asked for; a lease missing from the answer was fenced. The ids are distinct (the
-- engine keeps the last of a repeated one): one row of l per job.
WITH l AS (
    SELECT * FROM unnest($2::text[], $3::int8[], $4::text[], $5::float8[], $6::text[])
        AS l(id, epoch, holder, lease_until, progress)
)
UPDATE jobs j
   SET lease_until = CASE WHEN j.cancel_forced THEN j.lease_until
                          ELSE greatest(j.lease_until, l.lease_until) END,
       progress = coalesce(l.progress, j.progress),
       updated_at = CASE WHEN l.progress IS NULL THEN j.updated_at ELSE $1 END
  FROM l
 WHERE j.id = l.id AND j.state = 'running' AND j.epoch = l.epoch AND j.node = l.holder
   AND j.lease_until >= $1
RETURNING j.id, j.lease_until, j.cancel_requested_at IS NOT NULL;

-- name: add_secret
-- A secret made once at random by the first node to ask ($2; the signing key of remote
-- claims' tokens, sqlq.common.tokens): every later one, on any node, keeps it. Its own
-- statement, so that the get_secret after it, in a snapshot of its own, sees the row
-- whichever node's insert won.
INSERT INTO secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING;

-- name: get_secret
SELECT value FROM secrets WHERE name = $1;

-- name: request_cancel
-- A cancel asked for, of the running job $1 at time $2 (any node may ask): recorded once
-- (a request already recorded keeps its time), the job updated now as
-- Job.request_cancel would have it, and its holder told on sqlq_cancel, in the same
-- transaction, so only a request that commits is heard. The payload names the job and
-- the node that holds it, so every other node's listener drops it unread. $3 (NULL: not
-- forced) is a forced cancel's grace's end: a row a remote worker holds (node worker:<name>,
-- sqlq.common.protocol.remote_holder; a node's own names start node:) has its lease cut to
-- it and held there (cancel_forced), as Job.force_cancel would have it, even if a cancel
-- was asked for before. No row: the job is not running, or its cancel was asked for (and
-- forced, if $3 forces it) already (the engine reads it as it is).
WITH asked AS (
    UPDATE jobs
       SET cancel_requested_at = coalesce(cancel_requested_at, $2), updated_at = $2,
           lease_until = CASE WHEN $3::float8 IS NOT NULL AND node LIKE 'worker:%'
                              THEN least(lease_until, $3::float8) ELSE lease_until END,
           cancel_forced = cancel_forced OR ($3::float8 IS NOT NULL AND node LIKE 'worker:%')
     WHERE id = $1 AND state = 'running'
       AND (cancel_requested_at IS NULL
            OR ($3::float8 IS NOT NULL AND node LIKE 'worker:%' AND NOT cancel_forced))
    RETURNING {job_columns}, node
)
SELECT {job_columns},
       pg_notify('sqlq_cancel', json_build_object('id', id, 'node', node)::text) AS told
  FROM asked;

-- name: expired
SELECT {job_columns} FROM jobs
 WHERE state = 'running' AND lease_until < $1
 ORDER BY lease_until
 LIMIT $2;

-- name: release
-- A clean stop: this node's leases end now, so any node rescues its jobs at once.
-- (Running jobs are few: jobs_leases finds them.) The one value is the number released.
WITH gone AS (DELETE FROM nodes WHERE name = $1 RETURNING 1),
released AS (
    UPDATE jobs SET lease_until = $2
     WHERE state = 'running' AND lease_until IS NOT NULL AND node = $1
       AND (SELECT count(*) FROM gone) >= 0
    RETURNING 1
)
SELECT count(*) FROM released;

-- name: census
-- Live jobs by queue and state, and how many have a key (a queue holding a scheduled one
-- is fair between its keys: leases.claim).
SELECT queue, state, count(*), count(key) FROM jobs
 WHERE state IN ('scheduled', 'running')
 GROUP BY queue, state;

-- name: nodes
SELECT n.name, n.started_at, n.seen_at,
       (SELECT count(*) FROM jobs WHERE state = 'running' AND node = n.name) AS running
  FROM nodes n
 WHERE n.seen_at >= $1
 ORDER BY n.name;

-- name: get
SELECT {job_columns} FROM jobs WHERE id = $1;

-- name: get_many
-- The jobs a remote worker's call names ($1): one statement, each by its primary key.
SELECT {job_columns} FROM jobs WHERE id = ANY($1::text[]);

-- name: finished
-- Which of the jobs this node's GET ?wait= requests wait on ($1) are finished: one
-- statement for all of them, each found by its primary key.
SELECT {job_columns} FROM jobs
 WHERE id = ANY($1::text[]) AND state IN ('completed', 'dead', 'cancelled');

-- name: find_key
SELECT {job_columns} FROM jobs WHERE idempotency_key = $1;

-- name: list
-- One page in id order ({order}: ASC, or DESC newest first, with {beyond} the cursor's
-- < in list_by_after), one statement per filter shape (sqlq.engines.listing): {filters} is
-- the AND of the list_by_* terms the query sets, numbered from $2, or true. A single
-- statement with `$1 IS NULL OR state = $1` terms reached a generic plan after five
-- runs (asyncpg prepares it) that walked jobs_pkey and filtered every row; listings
-- also run on connections that plan each run for its values (LIST_SETTINGS in
-- connections.py). A state filter reads jobs_state_id. kind and queue have no index: every
-- index is written at every claim and completion, and (kind, id) with (queue, id)
-- cost +26 us of PostgreSQL CPU per no-op job (74 -> 100) and 15.4k -> 12.1k
-- transitions/s (bench/listing.py --write), so those filters scan.
SELECT {job_columns} FROM jobs
 WHERE {filters}
 ORDER BY id {order}
 LIMIT $1;

-- name: list_by_state
state = $state::text

-- name: list_by_kind
kind = $kind::text

-- name: list_by_queue
queue = $queue::text

-- name: list_by_after
id {beyond} $after::text

-- name: set_paused
WITH up AS (
    INSERT INTO queues (name, paused) VALUES ($1, $2)
    ON CONFLICT (name) DO UPDATE SET paused = excluded.paused
    RETURNING 1
)
SELECT (SELECT count(*) FROM up),
       (SELECT count(*) FROM (SELECT pg_notify('sqlq_jobs', '') WHERE NOT $2) AS woken);

-- name: paused
SELECT name FROM queues WHERE paused ORDER BY name;

-- name: set_policy
-- A queue's policy (sqlq.common.fair, as JSON; NULL: none), beside its pause; the claimers
-- are woken so they read it at once.
WITH up AS (
    INSERT INTO policies (name, policy) SELECT $1, $2 WHERE $2::text IS NOT NULL
    ON CONFLICT (name) DO UPDATE SET policy = excluded.policy
    RETURNING 1
), gone AS (
    DELETE FROM policies WHERE name = $1 AND $2::text IS NULL
    RETURNING 1
)
SELECT (SELECT count(*) FROM up) + (SELECT count(*) FROM gone),
       (SELECT count(*) FROM (SELECT pg_notify('sqlq_jobs', '')) AS woken);

-- name: policies
SELECT name, policy FROM policies ORDER BY name;

-- name: prune_lock
-- Pruning, one node at a time ($1 is PRUNE_LOCK): true if this node may prune now.
SELECT pg_try_advisory_lock($1);

-- name: prune_keys
-- At most $1 of the fair keys (sqlq.engines.postgres.fair) that are idle: no scheduled or
-- running job of the key, and its bucket full (tat, on the database's clock, no later
-- than now). Made again, such a key starts with a full bucket at its queue's virtual
-- time, as a key back from idle does in one process (sqlq.runtime.fairlanes forgets it
-- the same way); a submission or a round racing this loses nothing (a round's save
-- makes the row again). The row of the jobs with no key ('') stays: one a queue.
DELETE FROM fair_keys WHERE (queue, key) IN (
    SELECT k.queue, k.key FROM fair_keys k
     WHERE k.key <> '' AND (k.tat IS NULL OR k.tat <= extract(epoch FROM clock_timestamp()))
       AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.state = 'scheduled'
                          AND j.queue = k.queue AND j.key = k.key)
       AND (k.queue, k.key) NOT IN (SELECT queue, key FROM jobs
                                     WHERE state = 'running' AND key IS NOT NULL)
     LIMIT $1);

-- name: prune_unlock
SELECT pg_advisory_unlock($1);

-- name: prune
-- Finished jobs past retention, and nodes not seen for as long. A workflow's member goes
-- only with its whole workflow (sqlq.common.engine.index.retired: none of its members
-- live or newer), never a parent under a live child; its edges and membership with it.
WITH pruned AS (
    DELETE FROM jobs
     WHERE state IN ('completed', 'dead', 'cancelled') AND updated_at < $1
       AND (flow IS NULL OR NOT EXISTS (
            SELECT 1 FROM members m JOIN members o ON o.workflow_id = m.workflow_id
              JOIN jobs k ON k.id = o.job_id
             WHERE m.job_id = jobs.id
               AND (k.state NOT IN ('completed', 'dead', 'cancelled') OR k.updated_at >= $1)))
    RETURNING id, flow IS NOT NULL AS member
), unlisted AS (
    DELETE FROM members WHERE job_id IN (SELECT id FROM pruned WHERE member) RETURNING 1
), unlinked AS (
    DELETE FROM edges WHERE child IN (SELECT id FROM pruned WHERE member) RETURNING 1
), forgotten AS (
    DELETE FROM nodes WHERE seen_at < $1 RETURNING 1
)
SELECT (SELECT count(*) FROM pruned), (SELECT count(*) FROM forgotten),
       (SELECT count(*) FROM unlisted) + (SELECT count(*) FROM unlinked);

-- name: set_flows
-- New members' flows ($2, by id $1; their parents are edges: add_edges) and membership
-- ($3, their workflows, listed in the order given).
WITH listed AS (
    INSERT INTO members (job_id, workflow_id)
    SELECT id, w FROM unnest($1::text[], $3::text[]) WITH ORDINALITY AS u(id, w, i)
     ORDER BY i
    RETURNING 1
)
UPDATE jobs j SET flow = u.flow::jsonb
  FROM unnest($1::text[], $2::text[]) AS u(id, flow)
 WHERE j.id = u.id AND (SELECT count(*) FROM listed) >= 0;

-- name: add_edges
-- New members' edges: parent $1, child $2, the parent's place among the child's $3.
INSERT INTO edges (parent, child, n)
SELECT * FROM unnest($1::text[], $2::text[], $3::int[]);

-- name: lock_workflows
-- The workflows of the members a caller moves ($1) and makes ($2), each a transaction-
-- level advisory lock of class $3 keyed by its name's hash, taken once each in the keys'
-- order (flows.lock_workflows): two callers take any two keys in one order.
SELECT pg_advisory_xact_lock($3::int, k)
  FROM (SELECT DISTINCT hashtext(w) AS k
          FROM (SELECT flow->>'workflow_id' AS w FROM jobs
                 WHERE id = ANY($1::text[]) AND flow IS NOT NULL
                UNION SELECT unnest($2::text[])) AS named
         ORDER BY k) AS ordered;

-- name: merge_flow
-- A member's new counts and cancel reason (sqlq.common.workflow.FlowChange), over its flow.
UPDATE jobs SET flow = flow || $2::jsonb WHERE id = $1 AND flow IS NOT NULL;

-- name: merge_flows
-- merge_flow for several members, each once: their ids $1 and their changes $2.
UPDATE jobs SET flow = jobs.flow || u.change::jsonb
  FROM unnest($1::text[], $2::text[]) AS u(id, change)
 WHERE jobs.id = u.id AND jobs.flow IS NOT NULL;

-- name: locked
-- A job as it stands, its row locked until the transaction ends: a member's own before its
-- move, so no other node's outcome moves it between this read and that write.
SELECT {job_columns} FROM jobs WHERE id = $1 FOR UPDATE;

-- name: children
-- The children of the parents $1, each row locked (in id order, one order for every node,
-- so two parents' outcomes lock a shared child in turn and never in a cycle): the second of
-- two nodes completing a fan-in's last two parents waits here, then reads the first's count.
SELECT {job_columns} FROM jobs
 WHERE id IN (SELECT child FROM edges WHERE parent = ANY($1::text[]))
 ORDER BY id
   FOR UPDATE;

-- name: states
SELECT id, state FROM jobs WHERE id = ANY($1::text[]);

-- name: states_shared
-- New members' parents, each row held FOR SHARE (in id order) until the append commits.
SELECT id, state FROM jobs WHERE id = ANY($1::text[]) ORDER BY id FOR SHARE;

-- name: workflow
-- A workflow's members kept, in the order they were stored.
SELECT {job_columns} FROM members m JOIN jobs ON jobs.id = m.job_id
 WHERE m.workflow_id = $1
 ORDER BY m.seq;

-- name: live
SELECT count(*) FROM jobs WHERE state IN ('scheduled', 'running');

-- name: size
SELECT pg_total_relation_size('jobs');

-- name: ping
-- Whether a connection that only listens still reaches the database (connections.py).
SELECT 1;

-- name: fair_lock
-- A fair queue's claims, one node at a time: $1 is FAIR_LOCK, $2 the queue. Held to the end
-- of the transaction that claims (its state and its jobs in one commit).
SELECT pg_advisory_xact_lock($1, hashtext($2));

-- name: fair_read
-- What a fair queue's claim decides by, read under its lock (sqlq.engines.postgres.fair):
-- the database's clock, whether it is paused, its due jobs by key of the kinds $4 names
-- (NULL: any; {due_by_key}: due_walked, $5 the most a round takes, $6 the most keys it
-- reads, $7 the key its sweep goes on after), its running jobs by key under unexpired
-- leases ($3: the node's now, as every lease is written), each such key's row, and the
-- queue's; and its policy as stored now (a node's may be a census old). The round's clock
-- is also set for the rest of the transaction (sqlq_audit.fair_now), so an audit trigger
-- can record each start at the time its bucket counted it (the crash test's,
-- sqlq.bench.fairaudit): nothing of the engine reads it.
SELECT c.db_now, set_config('sqlq_audit.fair_now', c.db_now::text, true) AS fair_now,
       EXISTS (SELECT 1 FROM queues WHERE name = $1 AND paused) AS paused,
       (SELECT coalesce(json_agg(json_build_array(d.key, d.n, d.oldest, coalesce(r.n, 0),
                                                 k.tat, k.finish, d.weight, d.depth)), '[]')
          FROM ({due_by_key}) d
          LEFT JOIN (SELECT coalesce(key, '') AS key, count(*) AS n FROM jobs
                      WHERE state = 'running' AND queue = $1 AND lease_until > $3
                      GROUP BY 1) r ON r.key = d.key
          LEFT JOIN LATERAL (SELECT tat, finish FROM fair_keys
                              WHERE queue = $1 AND key = d.key LIMIT 1) k ON true) AS keys,
       (SELECT count(*) FROM jobs WHERE state = 'running' AND queue = $1) AS running,
       (SELECT virtual FROM fair_queues WHERE queue = $1) AS virtual,
       (SELECT tat FROM fair_queues WHERE queue = $1) AS queue_tat,
       (SELECT policy FROM policies WHERE name = $1) AS policy
  FROM (SELECT extract(epoch FROM clock_timestamp())::float8 AS db_now) c;

-- name: fair_due
-- Of the fair queues $1 (a policy, or a key at the last census), those not paused with a
-- due job of the kinds $3 names (NULL: any) now ($2): one probe each down jobs_fair, so a
-- claim pays a fair round (a transaction, the queue's lock) only where one can take
-- something.
-- (A probe a queue, down jobs_fair in its order: as an EXISTS, the planner hashed every
-- due job of every queue by queue, 30 ms a claim behind a backlog of 100,000.)
SELECT q FROM unnest($1::text[]) AS q, LATERAL (
    SELECT 1 FROM jobs WHERE state = 'scheduled' AND queue = q AND ready_at <= $2
       AND ($3::text[] IS NULL OR kind = ANY ($3::text[]))
     ORDER BY queue, key, priority DESC, ready_at, id LIMIT 1) f
 WHERE NOT EXISTS (SELECT 1 FROM queues WHERE name = q AND paused);

-- name: due_walked
-- fair_read's due jobs by key (key, n, oldest, weight, depth): jobs_fair walked key by key
-- from the first key after $7 ('': from the first of all; each next key found by one
-- index probe, a skip scan), and of each key only its next $5 due jobs in claim order,
-- which is all a round of $5 can take: n is at most $5, oldest the oldest of those,
-- weight the largest of theirs, depth the key's place in the walk (a key walked with no
-- due job is a row with n 0: where the window ended, for the sweep). Cheap however long a
-- few keys' backlogs are; a probe a key. The walk stops past $6 keys with scheduled
-- jobs, due or not, and says so by a row with a NULL key (more keys after: the next
-- round sweeps on from there). The jobs with no key are the row of key '', depth 0.
WITH RECURSIVE walk AS (
    (SELECT key, 1 AS depth FROM jobs WHERE state = 'scheduled' AND queue = $1
        AND key > $7 ORDER BY key LIMIT 1)
    UNION ALL
    SELECT (SELECT j.key FROM jobs j WHERE j.state = 'scheduled' AND j.queue = $1
               AND j.key > w.key ORDER BY j.key LIMIT 1), w.depth + 1
      FROM walk w WHERE w.key IS NOT NULL AND w.depth <= $6
)
SELECT w.key, t.n, t.oldest, t.weight, w.depth FROM walk w, LATERAL (
    SELECT count(*) AS n, min(ready_at) AS oldest, max(weight) AS weight FROM (
        SELECT ready_at, weight FROM jobs
         WHERE state = 'scheduled' AND queue = $1 AND key = w.key AND ready_at <= $2
           AND ($4::text[] IS NULL OR kind = ANY ($4::text[]))
         ORDER BY priority DESC, ready_at, id LIMIT $5) f
) t
 WHERE w.key IS NOT NULL AND w.depth <= $6
UNION ALL
SELECT NULL, 0, 0, 1, depth FROM walk WHERE key IS NOT NULL AND depth > $6
UNION ALL
SELECT '', count(*), min(ready_at), max(weight), 0 FROM (
    SELECT ready_at, weight FROM jobs
     WHERE state = 'scheduled' AND queue = $1 AND key IS NULL AND ready_at <= $2
       AND ($4::text[] IS NULL OR kind = ANY ($4::text[]))
     ORDER BY key, priority DESC, ready_at, id LIMIT $5) f
HAVING count(*) > 0

-- name: fair_claim
-- The jobs a fair queue's plan takes: for each key ($6) its next $7 due jobs (priority,
-- then age), and $9 of the jobs with no key, of the kinds $8 names (NULL: any), locked;
-- claimed as claim's are ($5: the holder). Each key's walk is jobs_fair's, in order.
WITH want AS (
    SELECT * FROM unnest($6::text[], $7::int[]) AS w(k, c)
), keyed AS (
    SELECT p.id AS due_id FROM want w, LATERAL (
        SELECT id FROM jobs
         WHERE state = 'scheduled' AND queue = $4 AND key = w.k AND ready_at <= $1
           AND ($8::text[] IS NULL OR kind = ANY ($8::text[]))
         ORDER BY priority DESC, ready_at, id
         LIMIT least(w.c, $2::int)
           FOR UPDATE SKIP LOCKED
    ) p
), keyless AS (
    SELECT id AS due_id FROM jobs
     WHERE state = 'scheduled' AND queue = $4 AND key IS NULL AND ready_at <= $1
       AND ($8::text[] IS NULL OR kind = ANY ($8::text[]))
     ORDER BY key, priority DESC, ready_at, id
     LIMIT $9
       FOR UPDATE SKIP LOCKED
), due AS (
    SELECT due_id FROM keyed UNION ALL SELECT due_id FROM keyless
)
{claimed}

-- name: fair_push_back
-- A handler's RateLimited: key $2 of queue $1 may start nothing for $3 seconds, on the
-- database's clock as its rounds count (the caller holds the queue's FAIR_LOCK). A key
-- without a row gets one (its finish tag NULL: the virtual time, as for any new key).
INSERT INTO fair_keys (queue, key, tat)
VALUES ($1, $2, extract(epoch FROM clock_timestamp())::float8 + $3)
ON CONFLICT (queue, key) DO UPDATE SET tat = greatest(fair_keys.tat, excluded.tat);

-- name: fair_save
-- The plan's state: each key's bucket and finish tag ($2..$4), the queue's virtual time and
-- bucket ($5, $6). Rows are made or updated, never deleted by a claim.
WITH keys AS (
    INSERT INTO fair_keys (queue, key, tat, finish)
    SELECT $1, k, t, f FROM unnest($2::text[], $3::float8[], $4::float8[]) AS u(k, t, f)
    ON CONFLICT (queue, key) DO UPDATE SET tat = excluded.tat, finish = excluded.finish
    RETURNING 1
)
INSERT INTO fair_queues (queue, virtual, tat) VALUES ($1, $5, $6)
ON CONFLICT (queue) DO UPDATE SET virtual = excluded.virtual, tat = excluded.tat;
