-- name: insert_job
INSERT INTO jobs (id, kind, args, state, attempts, max_attempts, ready_at, priority, epoch,
                  created_at, updated_at, last_error, result, started_at)
VALUES (:id, :kind, :args, :state, :attempts, :max_attempts, :ready_at, :priority, :epoch,
        :created_at, :updated_at, :last_error, :result, :started_at);

-- name: apply_transition
-- The epoch guard fences stale workers; the EXISTS guard enforces the transition table.
UPDATE jobs
   SET state = :state, epoch = :epoch, attempts = :attempts, ready_at = :ready_at,
       updated_at = :updated_at, last_error = :last_error, result = :result,
       started_at = :started_at
 WHERE id = :id
   AND epoch = :expect_epoch
   AND EXISTS (SELECT 1 FROM legal_transitions
                WHERE from_state = jobs.state AND to_state = :state);

-- name: get_job
SELECT id, kind, args, state, attempts, max_attempts, ready_at, priority, epoch,
       created_at, updated_at, last_error, result, started_at
  FROM jobs WHERE id = ?;

-- name: live_jobs
SELECT id, kind, args, state, attempts, max_attempts, ready_at, priority, epoch,
       created_at, updated_at, last_error, result, started_at
  FROM jobs WHERE state IN ('scheduled', 'running');

-- name: prune_terminal
DELETE FROM jobs
 WHERE state IN ('completed', 'dead', 'cancelled') AND updated_at < ?;

-- name: count_jobs
SELECT count(*) FROM jobs;

-- name: clear_transitions
DELETE FROM legal_transitions;

-- name: insert_transition
INSERT INTO legal_transitions (from_state, to_state) VALUES (?, ?);

-- name: set_meta
INSERT INTO meta (key, value) VALUES (?, ?)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
