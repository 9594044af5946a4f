//! A sandboxd host for the end-to-end tests of the operator and the CLI and for the fault
//! harness: the workspace's `sandboxd` binary ([`Sandboxd`]) on a loopback port it keeps across
//! restarts, on the project's dockerd with the local base image, its own instance name,
//! workspaces and state; dropping it kills the process and removes every container of its
//! instance, then its folder.

use std::io;
use std::path::PathBuf;

use crate::base_image;
pub use crate::process::Sandboxd;

/// A workspace binary (`make test` builds them first); fails the test when it is missing.
pub fn bin(name: &str) -> PathBuf {
    crate::process::bin(name).unwrap_or_else(|e| panic!("{e}"))
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    crate::process::free_port().expect("a free port")
}

/// A sandboxd process on a fixed loopback port, with a name and a folder, told its node
/// (`SANDBOXD_NODE_NAME`): it takes only the admin token derived for that node from its
/// master (`sandboxd.token`), the one the operator sends a SandboxHost whose `spec.node` names
/// the node.
pub struct Host {
    /// The SandboxHost name the test registers it under.
    pub name: String,
    /// Its node: the host's name unless the test gives `SANDBOXD_NODE_NAME`.
    pub node: String,
    /// The process and its settings: the token, instance and port are its fields. Dropped
    /// first: the process and its containers go before the folder.
    pub sandboxd: Sandboxd,
    /// Its workspaces (`workspaces/`) and state (`state/`).
    pub dir: tempfile::TempDir,
}

impl Host {
    /// Starts sandboxd as `name` with `env` on top of the test defaults; fails the test when it
    /// does not start.
    pub fn start(name: &str, env: &[(&str, &str)]) -> Self {
        let mut h = Self::new(name, &base_image()).expect("a sandboxd host");
        if let Some((_, node)) = env.iter().rev().find(|(k, _)| *k == "SANDBOXD_NODE_NAME") {
            h.node = (*node).to_owned();
        }
        h.sandboxd.with_env(env);
        h.spawn();
        h
    }

    /// A host's settings, not started ([`Sandboxd::launch`] starts it): runtime `base` =
    /// `image`, a fixed free port, sandboxes of 256 MiB, a random master token, node `name`
    /// and instance `op…`.
    pub fn new(name: &str, image: &str) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("sandboxd-op-test-")
            .tempdir()?;
        let mut sandboxd = Sandboxd::new(crate::process::bin("sandboxd")?, dir.path(), "op", image);
        sandboxd.port = crate::process::free_port()?;
        sandboxd.mem_limit = "256m".to_owned();
        sandboxd.with_env(&[("SANDBOXD_NODE_NAME", name)]);
        Ok(Self {
            name: name.to_owned(),
            node: name.to_owned(),
            sandboxd,
            dir,
        })
    }

    /// Its base URL: https:// when started with SANDBOXD_TLS_CERT_FILE.
    pub fn endpoint(&self) -> String {
        self.sandboxd.base.clone()
    }

    /// The host folder of session `id`'s workspace.
    pub fn workspace(&self, id: &str) -> PathBuf {
        self.sandboxd.workspace(id)
    }

    /// Starts the process (again, after [`Host::kill9`]), on the same port and state.
    pub fn spawn(&mut self) {
        self.sandboxd.launch().expect("sandboxd starts");
    }

    /// Kills the process (SIGKILL); its containers stay.
    pub fn kill9(&mut self) {
        self.sandboxd.process.kill9();
    }

    /// Sends `signal` (STOP, CONT) to the host's sandboxd: a stopped one still accepts
    /// connections (the kernel does) and answers nothing, as a hung host does.
    pub fn signal(&self, signal: &str) {
        self.sandboxd.process.signal(signal).expect("kill runs");
    }

    /// The admin token it takes: its node's, derived from the master.
    pub fn admin_token(&self) -> String {
        sandboxd_api::auth::node_token(&self.sandboxd.token, &self.node)
    }

    /// A client of it with the admin token.
    pub fn client(&self) -> sandboxd_api::client::Client {
        sandboxd_api::client::Client::new(&self.endpoint(), &self.admin_token())
    }

    /// Docker's ids of the containers of `session` on this host.
    pub fn container_ids(&self, session: &str) -> Vec<String> {
        self.all_containers()
            .into_iter()
            .filter(|(_, s, _)| s == session)
            .map(|(id, _, _)| id)
            .collect()
    }

    /// Containers of this host, as Docker reports them: (session label, running).
    pub fn containers(&self) -> Vec<(String, bool)> {
        self.all_containers()
            .into_iter()
            .map(|(_, s, running)| (s, running))
            .collect()
    }

    fn all_containers(&self) -> Vec<(String, String, bool)> {
        self.sandboxd.list_containers().expect("docker ps")
    }
}
