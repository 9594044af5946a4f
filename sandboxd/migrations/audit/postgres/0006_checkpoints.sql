-- A gvisor session's sleep with its memory and its wake are recorded too: ops checkpoint and
-- restore (a failed one names its reason in the target). The SQLite twin is
-- ../sqlite/0006_checkpoints.sql.
ALTER TABLE operations DROP CONSTRAINT IF EXISTS operations_op_check;
ALTER TABLE operations ADD CONSTRAINT operations_op_check CHECK (op IN ('read', 'write', 'ls', 'mkdir', 'remove', 'execute', 'rebuild', 'credentials', 'checkpoint', 'restore'));
