-- A terminal's opening and its end are recorded too: op terminal (its id, program, how it ended
-- and the bytes typed and printed); so is each connection to a sandbox's port: op port.
-- The SQLite twin is ../sqlite/0007_terminals_and_ports.sql.
ALTER TABLE operations DROP CONSTRAINT IF EXISTS operations_op_check;
ALTER TABLE operations ADD CONSTRAINT operations_op_check CHECK (op IN ('read', 'write', 'ls', 'mkdir', 'remove', 'execute', 'rebuild', 'credentials', 'checkpoint', 'restore', 'terminal', 'port'));
