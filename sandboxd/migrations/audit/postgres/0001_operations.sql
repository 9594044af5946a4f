-- The audit log: one row per workspace operation that reached a session. A path or a command,
-- never a payload and never output. The SQLite twin is ../sqlite/0001_operations.sql.
CREATE TABLE operations (
    id          BIGSERIAL PRIMARY KEY,
    at_ms       BIGINT NOT NULL,
    session     TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    agent       TEXT,
    run         TEXT,
    op          TEXT NOT NULL CHECK (op IN ('read', 'write', 'ls', 'mkdir', 'remove', 'execute')),
    target      TEXT NOT NULL,
    ok          BIGINT NOT NULL,
    exit_code   BIGINT,
    error       TEXT,
    bytes       BIGINT,
    duration_ms BIGINT NOT NULL
);
CREATE INDEX operations_at ON operations (at_ms);
CREATE INDEX operations_session ON operations (session, id);
CREATE INDEX operations_tenant ON operations (tenant, id);
