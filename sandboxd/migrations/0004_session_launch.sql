-- How a session's container was last started: 'warm' (taken from its runtime's warm pool) or
-- 'cold' (created for it). A warm container's workspace bind names the pool folder it was
-- started on, so it is never started again: a wake replaces it.
ALTER TABLE sessions ADD COLUMN launch TEXT NOT NULL DEFAULT 'cold';
