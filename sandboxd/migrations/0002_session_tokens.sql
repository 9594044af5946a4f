-- More tokens of a session, each kept only as its SHA-256: an attach over the pydantic-ai-backend
-- wire surface hands its caller a token of its own, so whoever holds an earlier one keeps it.
-- All of them end with the session (destroy) or with a rotation of its token.
CREATE TABLE session_tokens (
    token_hash TEXT PRIMARY KEY NOT NULL,
    session_id TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX session_tokens_session ON session_tokens (session_id);
