-- The egress log: what each session's sandbox reached through the egress proxy and resolver,
-- and what was refused, one row per session, name, port, verdict and minute (a loop of a
-- thousand refused connections is one row with its count). The SQLite twin is
-- ../sqlite/0004_egress.sql.
CREATE TABLE egress (
    minute_ms   BIGINT NOT NULL,
    session     TEXT NOT NULL,
    runtime     TEXT NOT NULL,
    name        TEXT NOT NULL,
    port        BIGINT NOT NULL,
    verdict     TEXT NOT NULL CHECK (verdict IN ('allowed', 'denied', 'resolved', 'refused')),
    count       BIGINT NOT NULL,
    bytes_out   BIGINT NOT NULL,
    bytes_in    BIGINT NOT NULL,
    reason      TEXT NOT NULL,
    PRIMARY KEY (session, minute_ms, name, port, verdict)
);
CREATE INDEX egress_minute ON egress (minute_ms);
