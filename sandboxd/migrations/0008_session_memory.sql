-- Sleep with memory. `memory`: what a session's last checkpoint (a sleep with memory) or
-- restore did, as JSON (the API's MemoryNote), shown with the session so its status can say
-- why a sandbox woke without its memory; NULL: never checkpointed (every runc session).
-- `checkpoint_bytes`: what its checkpoint takes on the node's disk while it sleeps with its
-- memory, counted against the workspace budget with its disk; 0 without one.
ALTER TABLE sessions ADD COLUMN memory TEXT;
ALTER TABLE sessions ADD COLUMN checkpoint_bytes INTEGER NOT NULL DEFAULT 0;
