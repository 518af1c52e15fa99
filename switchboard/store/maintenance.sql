-- Table maintenance run by the scheduler leader.

-- name: dead_tuples
-- Dead row versions in todos since its last vacuum (statistics, not exact; cheap).
SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables
                 WHERE relid = 'todos'::regclass), 0)

-- name: vacuum_todos
-- Every claim leaves a dead entry at the front of idx_todos_pending, and each later claim
-- walks past it until a VACUUM removes the page: without this, claim throughput decays within
-- a minute at 1,000 claims/s. INDEX_CLEANUP ON because a plain VACUUM skips index cleanup
-- when few heap pages changed, which is exactly the queue's pattern.
VACUUM (INDEX_CLEANUP ON) todos
