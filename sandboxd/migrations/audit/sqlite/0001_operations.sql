-- The audit log: one row per workspace operation that reached a session. A path or a command,
-- never a payload and never output. The PostgreSQL twin is ../postgres/0001_operations.sql.
CREATE TABLE operations (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms       INTEGER NOT NULL,
    session     TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    agent       TEXT,
    run         TEXT,
    op          TEXT NOT NULL CHECK (op IN ('read', 'write', 'ls', 'mkdir', 'remove', 'execute')),
    target      TEXT NOT NULL,
    ok          INTEGER NOT NULL,
    exit_code   INTEGER,
    error       TEXT,
    bytes       INTEGER,
    duration_ms INTEGER NOT NULL
);
CREATE INDEX operations_at ON operations (at_ms);
CREATE INDEX operations_session ON operations (session, id);
CREATE INDEX operations_tenant ON operations (tenant, id);
