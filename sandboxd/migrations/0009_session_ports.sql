-- Ports. `ports`: the ports of the sandbox's loopback the session has opened to be reached
-- through sandboxd (`POST /v1/sessions/{id}/ports`, a SandboxSession's `spec.ports`), as a JSON
-- array of numbers; a port not in it is refused.
ALTER TABLE sessions ADD COLUMN ports TEXT NOT NULL DEFAULT '[]';
