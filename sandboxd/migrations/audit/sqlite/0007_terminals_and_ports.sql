-- A terminal's opening and its end are recorded too: op terminal (its id, program, how it ended
-- and the bytes typed and printed); so is each connection to a sandbox's port: op port. SQLite
-- cannot change a CHECK in place: the table is made anew with it and the rows copied. The
-- PostgreSQL twin is ../postgres/0007_terminals_and_ports.sql.
CREATE TABLE operations_new (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms         INTEGER NOT NULL,
    session       TEXT NOT NULL,
    tenant        TEXT NOT NULL,
    agent         TEXT,
    run           TEXT,
    op            TEXT NOT NULL CHECK (op IN ('read', 'write', 'ls', 'mkdir', 'remove', 'execute', 'rebuild', 'credentials', 'checkpoint', 'restore', 'terminal', 'port')),
    target        TEXT NOT NULL,
    ok            INTEGER NOT NULL,
    exit_code     INTEGER,
    error         TEXT,
    bytes         INTEGER,
    duration_ms   INTEGER NOT NULL,
    incarnation   TEXT NOT NULL DEFAULT '',
    seq           INTEGER NOT NULL DEFAULT 0,
    truncated     INTEGER NOT NULL DEFAULT 0,
    caller_labels INTEGER NOT NULL DEFAULT 0
);
INSERT INTO operations_new SELECT id, at_ms, session, tenant, agent, run, op, target, ok, exit_code, error, bytes, duration_ms, incarnation, seq, truncated, caller_labels FROM operations;
DROP TABLE operations;
ALTER TABLE operations_new RENAME TO operations;
CREATE INDEX operations_at ON operations (at_ms);
CREATE INDEX operations_session ON operations (session, id);
CREATE INDEX operations_tenant ON operations (tenant, id);
CREATE INDEX operations_feed ON operations (session, incarnation, seq);
