-- The further egress policies a session's open named (its own narrowing and its namespace's
-- ceiling), as JSON: kept so that a restarted sandboxd never lets a narrowed session reach more
-- than it could before.
ALTER TABLE sessions ADD COLUMN egress TEXT NOT NULL DEFAULT '[]';
