-- The incarnation of a session: 32 hex digits made when its row is made (an open from nothing),
-- kept while the row lives (sleep, wake, reclaim, token rotation), gone with it (destroy). Its
-- audit rows carry it, and a session token sees only its own incarnation's rows. Rows from
-- before this column get one of their own here.
ALTER TABLE sessions ADD COLUMN incarnation TEXT NOT NULL DEFAULT '';
UPDATE sessions SET incarnation = lower(hex(randomblob(16)));
