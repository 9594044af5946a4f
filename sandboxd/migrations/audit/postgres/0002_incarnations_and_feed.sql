-- Rows belong to one incarnation of a session: a session token sees only its own incarnation's
-- rows, so whoever next opens the same id (a namespace made again) never reads an earlier
-- holder's. `seq` numbers an incarnation's rows from 1 for its activity feed. `truncated` flags a
-- field cut at its cap; `caller_labels` marks agent and run as what the request's headers said.
-- Rows from before this migration keep incarnation '' and seq 0: only the admin token sees them.
-- The SQLite twin is ../sqlite/0002_incarnations_and_feed.sql.
ALTER TABLE operations ADD COLUMN incarnation TEXT NOT NULL DEFAULT '';
ALTER TABLE operations ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE operations ADD COLUMN truncated BIGINT NOT NULL DEFAULT 0;
ALTER TABLE operations ADD COLUMN caller_labels BIGINT NOT NULL DEFAULT 0;
UPDATE operations SET caller_labels = 1 WHERE agent IS NOT NULL OR run IS NOT NULL;
CREATE INDEX operations_feed ON operations (session, incarnation, seq);
