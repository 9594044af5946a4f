-- A rebuild is recorded too (its target is the image). The SQLite twin is
-- ../sqlite/0003_rebuild.sql.
ALTER TABLE operations DROP CONSTRAINT IF EXISTS operations_op_check;
ALTER TABLE operations ADD CONSTRAINT operations_op_check CHECK (op IN ('read', 'write', 'ls', 'mkdir', 'remove', 'execute', 'rebuild'));
