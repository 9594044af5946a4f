-- The nominal size of a session's workspace disk, in bytes: what it counts against the host's
-- workspace budget from its open until it is destroyed (asleep and reclaimed included). Rows from
-- before the budget take the size their limits recorded (0 for a workspace without a disk).
ALTER TABLE sessions ADD COLUMN disk_bytes INTEGER NOT NULL DEFAULT 0;
UPDATE sessions SET disk_bytes = COALESCE(CAST(json_extract(limits, '$.workspace_size') AS INTEGER), 0);
