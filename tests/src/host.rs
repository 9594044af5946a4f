//! A sandboxd host for the end-to-end tests of the operator and the CLI: the workspace's
//! `sandboxd` binary on a free loopback port, on the project's dockerd with the local base
//! image, its own instance name, workspaces and state; dropping it kills the process and
//! removes every container of its instance.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use rand::Rng;

use crate::base_image;

/// Where cargo put the workspace's binaries (next to this test's `deps/` folder).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build --workspace --bins` (make test does)",
        path.display()
    );
    path
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A sandboxd process on a fixed loopback port.
pub struct Host {
    /// The SandboxHost name the test registers it under.
    pub name: String,
    /// Its loopback port.
    pub port: u16,
    /// Its admin token (`SANDBOXD_TOKEN`).
    pub token: String,
    /// Its instance name, on every container it makes.
    pub instance: String,
    /// Its workspaces (`ws/`) and state (`state/`).
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    env: Vec<(String, String)>,
}

impl Host {
    /// Starts sandboxd as `name` with `env` on top of the test defaults.
    pub fn start(name: &str, env: &[(&str, &str)]) -> Self {
        let suffix: u32 = rand::rng().random();
        let mut h = Self {
            name: name.to_owned(),
            port: free_port(),
            token: format!("admin-{suffix:08x}{:016x}", rand::rng().random::<u64>()),
            instance: format!("op{suffix:08x}"),
            dir: tempfile::Builder::new()
                .prefix("sandboxd-op-test-")
                .tempdir()
                .expect("temp dir"),
            child: None,
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        h.spawn();
        h
    }

    /// Its base URL: https:// when started with SANDBOXD_TLS_CERT_FILE.
    pub fn endpoint(&self) -> String {
        let scheme = if self.env.iter().any(|(k, _)| k == "SANDBOXD_TLS_CERT_FILE") {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The host folder of session `id`'s workspace.
    pub fn workspace(&self, id: &str) -> PathBuf {
        self.dir.path().join("ws").join(id).join("workspace")
    }

    /// Starts the process (again, after [`Host::kill9`]), on the same port and state.
    pub fn spawn(&mut self) {
        let mut cmd = Command::new(bin("sandboxd"));
        cmd.env("SANDBOXD_TOKEN", &self.token)
            .env("SANDBOXD_WORKSPACE_QUOTA", "off")
            .env("SANDBOXD_PORT", self.port.to_string())
            .env("SANDBOXD_RUNTIMES", format!("base={}", base_image()))
            .env("SANDBOXD_INSTANCE", &self.instance)
            .env("SANDBOXD_WORKSPACE_ROOT", self.dir.path().join("ws"))
            .env("SANDBOXD_STATE_DIR", self.dir.path().join("state"))
            .env("SANDBOXD_MEM_LIMIT", "256m")
            .env("RUST_LOG", "warn,sandboxd::server=error")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("sandboxd starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("sandboxd says where it listens");
        assert!(
            line.contains(&format!(":{}", self.port)),
            "unexpected: {line}"
        );
        self.child = Some(child);
    }

    /// Kills the process (SIGKILL); its containers stay.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `signal` (STOP, CONT) to the host's sandboxd: a stopped one still accepts
    /// connections (the kernel does) and answers nothing, as a hung host does.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("sandboxd runs").id();
        let ok = Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill -{signal} {pid} failed");
    }

    /// A client of it with the admin token.
    pub fn client(&self) -> sandboxd_api::client::Client {
        sandboxd_api::client::Client::new(&self.endpoint(), &self.token)
    }

    /// Docker's ids of the containers of `session` on this host.
    pub fn container_ids(&self, session: &str) -> Vec<String> {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--no-trunc"])
            .args([
                "--filter",
                &format!("label=sandboxd.dev/instance={}", self.instance),
            ])
            .args(["--filter", &format!("label=sandboxd.dev/session={session}")])
            .output()
            .expect("docker ps");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    /// Containers of this host, as Docker reports them: (session label, running).
    pub fn containers(&self) -> Vec<(String, bool)> {
        let out = Command::new("docker")
            .args([
                "ps",
                "-a",
                "--filter",
                &format!("label=sandboxd.dev/instance={}", self.instance),
            ])
            .args(["--format", "{{.Label \"sandboxd.dev/session\"}} {{.State}}"])
            .output()
            .expect("docker ps");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                l.split_once(' ')
                    .map(|(s, st)| (s.to_owned(), st == "running"))
            })
            .collect()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill9();
        let out = Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=sandboxd.dev/instance={}", self.instance),
            ])
            .output();
        if let Ok(out) = out {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("docker").args(["rm", "-f", id]).output();
            }
        }
    }
}
