-- A replacement of a session's egress credentials is recorded too (its target names hosts, headers and sources, never a value). The SQLite twin is
-- ../sqlite/0005_credentials.sql.
ALTER TABLE operations DROP CONSTRAINT IF EXISTS operations_op_check;
ALTER TABLE operations ADD CONSTRAINT operations_op_check CHECK (op IN ('read', 'write', 'ls', 'mkdir', 'remove', 'execute', 'rebuild', 'credentials'));
