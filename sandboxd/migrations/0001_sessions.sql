-- Sessions: one row per sandbox this host holds. Every state change is a guarded update.
CREATE TABLE sessions (
    id               TEXT PRIMARY KEY NOT NULL,
    tenant           TEXT NOT NULL,
    runtime          TEXT NOT NULL,
    image            TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('opening', 'running', 'stopped', 'reclaimed', 'lost', 'destroying')),
    token_hash       TEXT NOT NULL UNIQUE,
    container_id     TEXT,
    limits           TEXT NOT NULL DEFAULT '{}',
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    last_activity_at INTEGER NOT NULL
);
CREATE INDEX sessions_tenant_state ON sessions (tenant, state);
