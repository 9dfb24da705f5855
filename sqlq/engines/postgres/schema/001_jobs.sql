-- sqlq PostgreSQL schema, version 1: the shared queue many nodes claim from.
-- args and result hold JSON as text, not jsonb: jsonb refuses \u0000 in strings and
-- rewrites numbers, and a job must come back exactly as it was submitted.
-- Counters are bigint: the store keeps whatever integer the job model holds.
CREATE TABLE jobs (
    id              text PRIMARY KEY,
    kind            text NOT NULL,
    args            text NOT NULL,
    state           text NOT NULL,          -- scheduled | running | completed | dead | cancelled
    attempts        bigint NOT NULL,
    max_attempts    bigint NOT NULL,
    ready_at        double precision NOT NULL,  -- unix seconds
    priority        bigint NOT NULL,
    epoch           bigint NOT NULL,        -- bumped at every claim and requeue; fences stale nodes
    created_at      double precision NOT NULL,
    updated_at      double precision NOT NULL,
    last_error      text,
    result          text NOT NULL,
    started_at      double precision,
    queue           text NOT NULL DEFAULT 'default',
    idempotency_key text,
    request_hash    text,
    attempts_total  bigint NOT NULL DEFAULT 0,
    lease_until     double precision,       -- a running job's claim expires then unless renewed
    node            text                    -- the node that holds the claim
);

-- The claim: due jobs, highest priority first, then oldest (a capped queue's claim
-- walks it too, filtering by queue).
CREATE INDEX jobs_claim ON jobs (priority DESC, ready_at, id) WHERE state = 'scheduled';
-- The next delayed job, for the claimer's timer.
CREATE INDEX jobs_next ON jobs (ready_at) WHERE state = 'scheduled';
-- Expired leases: the jobs of a dead or cut-off node. (A node renews its own by id.)
CREATE INDEX jobs_leases ON jobs (lease_until) WHERE state = 'running';
-- One retained job per idempotency key.
CREATE UNIQUE INDEX jobs_key ON jobs (idempotency_key) WHERE idempotency_key IS NOT NULL;
-- Listing by state in id order, and pruning past retention (finished jobs by state).
-- Every index here is written at every claim and completion: keep them few.
CREATE INDEX jobs_state_id ON jobs (state, id);

-- Queues an operator paused; every node honours them.
CREATE TABLE queues (
    name   text PRIMARY KEY,
    paused boolean NOT NULL
);

-- The nodes that share the queue, and when each last renewed its leases.
CREATE TABLE nodes (
    name       text PRIMARY KEY,
    started_at double precision NOT NULL,
    seen_at    double precision NOT NULL
);

-- A batch of guarded changes is one statement; if fewer rows changed than were
-- asked for, this aborts it (and so rolls all of it back) and the engine redoes
-- the batch one caller at a time to find the caller at fault.
CREATE FUNCTION sqlq_expect(got bigint, want bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF got <> want THEN
        RAISE EXCEPTION USING ERRCODE = 'SQ001',
            MESSAGE = format('sqlq: %s of %s guarded changes applied', got, want);
    END IF;
    RETURN got;
END
$$;
