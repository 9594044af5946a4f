-- The object a session belongs to (for the operator: its SandboxSession's uid). An open, token
-- rotation or destroy that names another owner is refused. A row from before this column (NULL)
-- is adopted by the first owner that opens it.
ALTER TABLE sessions ADD COLUMN owner TEXT;
