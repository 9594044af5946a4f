//! The harness of sandboxd's end-to-end tests: a real sandboxd process on a free loopback
//! port, driving the project's real dockerd with the local base image. Each daemon has its own
//! instance name, workspace root and state, so tests run in parallel; dropping it kills the
//! process and removes every container it owns.
#![allow(dead_code, missing_docs)]

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::Command;

use rand::Rng;
use sandboxd_api::client::Client;

// The PKI, polling and process helpers every test crate shares.
#[allow(unused_imports)] // not every test binary uses every part
pub use sandboxd_testkit::{pki, poll, process, until};

pub use process::Sandboxd;

pub mod egress;

fn need(what: &str) -> String {
    std::env::var(what).unwrap_or_else(|_| {
        panic!("{what} is not set: start the local dockerd with `make up` and `eval \"$(make -s env)\"`, or run `make test`")
    })
}

/// Whether this run puts every sandbox on gVisor (`SANDBOXD_TEST_OCI_RUNTIME=runsc`, the
/// hostile and wire suites' second run in `make e2e`).
pub fn on_gvisor() -> bool {
    std::env::var("SANDBOXD_TEST_OCI_RUNTIME").is_ok_and(|r| r == "runsc")
}

/// The local base image.
pub fn base_image() -> String {
    need("SANDBOXD_BASE_IMAGE")
}

/// A running sandboxd on a free port (a new one at each start): its [`Sandboxd`] (the base
/// URL, admin token, instance and extra environment are its fields) and its folder.
pub struct Daemon {
    sandboxd: Sandboxd,
    pub dir: tempfile::TempDir,
    /// A tmpfs mounted at the workspace root, unmounted on drop.
    pub tmpfs: Option<PathBuf>,
}

impl Deref for Daemon {
    type Target = Sandboxd;
    fn deref(&self) -> &Sandboxd {
        &self.sandboxd
    }
}

impl DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut Sandboxd {
        &mut self.sandboxd
    }
}

/// How runs reach the sandboxes (`SANDBOXD_RUN_BACKEND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The resident agent, PID 1 of every sandbox (the default).
    Agent,
    /// Docker exec, with Docker's init as PID 1.
    Exec,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Exec => "exec",
        }
    }
}

/// Makes each named `async fn name(backend: Backend)` a test twice: `agent::name` and
/// `exec::name`, with the attributes given (`#[tokio::test]` and its flavor).
#[macro_export]
macro_rules! on_both_backends {
    ($( $(#[$attr:meta])* $name:ident ),* $(,)?) => {
        mod agent {
            $( $(#[$attr])* async fn $name() { super::$name(super::common::Backend::Agent).await } )*
        }
        mod exec {
            $( $(#[$attr])* async fn $name() { super::$name(super::common::Backend::Exec).await } )*
        }
    };
}

impl Daemon {
    /// Starts a sandboxd on `backend` with the defaults and `env` on top.
    pub fn start_on(backend: Backend, env: &[(&str, &str)]) -> Self {
        let mut all = vec![("SANDBOXD_RUN_BACKEND", backend.as_str())];
        all.extend_from_slice(env);
        Self::start(&all)
    }

    /// Starts a sandboxd with the defaults and `env` on top.
    pub fn start(env: &[(&str, &str)]) -> Self {
        Self::start_with(&std::env::temp_dir(), env, None, false)
    }

    /// [`Daemon::start`] with its log (standard error) appended to [`Daemon::log_file`]
    /// rather than the test's, across restarts: for a test that reads it back.
    pub fn start_logged(env: &[(&str, &str)]) -> Self {
        Self::start_with(&std::env::temp_dir(), env, None, true)
    }

    /// The file a [`Daemon::start_logged`] sandboxd logs to.
    pub fn log_file(&self) -> PathBuf {
        self.dir.path().join("sandboxd.log")
    }

    /// [`Daemon::start`] with its state and workspaces in a temp dir under `parent` (a tmpfs
    /// for tests that make hundreds of thousands of folders).
    pub fn start_in(parent: &Path, env: &[(&str, &str)]) -> Self {
        Self::start_with(parent, env, None, false)
    }

    /// Starts a sandboxd whose workspace root is a tmpfs of its own (`mount -t tmpfs` with
    /// `options`, as root): for tests that make more files than a disk makes in good time.
    /// Fails (never skips) when the mount is refused.
    pub fn start_on_tmpfs(env: &[(&str, &str)], options: &str) -> Self {
        Self::start_with(&std::env::temp_dir(), env, Some(options), false)
    }

    fn start_with(parent: &Path, env: &[(&str, &str)], tmpfs: Option<&str>, logged: bool) -> Self {
        need("DOCKER_HOST");
        // The tests' own reqwest clients find the crypto provider sandboxd's clients use.
        sandboxd::tls::install_provider();
        let dir = tempfile::Builder::new()
            .prefix("sandboxd-test-")
            .tempdir_in(parent)
            .expect("a temp dir");
        let mut sandboxd = Sandboxd::new(
            PathBuf::from(env!("CARGO_BIN_EXE_sandboxd")),
            dir.path(),
            "t",
            &base_image(),
        );
        sandboxd.runtimes = format!("base={},alt={}", base_image(), base_image());
        // `make e2e` runs the hostile and wire suites a second time with every sandbox on
        // gVisor: SANDBOXD_TEST_OCI_RUNTIME=runsc becomes the daemon's SANDBOXD_OCI_RUNTIME
        // (a test's own setting wins).
        if let Ok(oci) = std::env::var("SANDBOXD_TEST_OCI_RUNTIME") {
            sandboxd.with_env(&[("SANDBOXD_OCI_RUNTIME", oci.as_str())]);
        }
        sandboxd.with_env(env);
        if logged {
            sandboxd.log_file = Some(dir.path().join("sandboxd.log"));
        }
        let mut d = Self {
            sandboxd,
            dir,
            tmpfs: None,
        };
        if let Some(options) = tmpfs {
            let root = d.workspace_root();
            std::fs::create_dir_all(&root).expect("the workspace root");
            let out = Command::new("mount")
                .args(["-t", "tmpfs", "-o", options, "sandboxd-test"])
                .arg(&root)
                .output()
                .expect("mount runs");
            assert!(
                out.status.success(),
                "mount -t tmpfs at {} failed (the test needs root): {}",
                root.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            d.tmpfs = Some(root);
        }
        d.spawn();
        d
    }

    pub fn workspace_root(&self) -> PathBuf {
        self.sandboxd.workspace_root.clone()
    }

    /// (Re)starts the process with the same state, workspaces and instance.
    pub fn spawn(&mut self) {
        self.sandboxd.launch().expect("sandboxd starts");
    }

    pub fn admin(&self) -> Client {
        Client::new(&self.base, &self.token)
    }

    pub fn client(&self, token: &str) -> Client {
        Client::new(&self.base, token)
    }

    /// Containers of this instance, as Docker reports them (id, session label, running).
    pub fn containers(&self) -> Vec<(String, String, bool)> {
        self.list_containers().expect("docker ps")
    }
}

impl Daemon {
    /// Docker networks labelled as this instance's.
    pub fn networks(&self) -> Vec<String> {
        self.list_networks().expect("docker network ls")
    }

    /// Runs `sandboxd remove-network` for this instance (with the daemon's settings).
    pub fn remove_network(&self) -> std::process::Output {
        self.sandboxd
            .remove_network()
            .expect("sandboxd remove-network runs")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.sandboxd.process.kill9();
        self.remove_containers();
        // A runtime with network made the instance's network and firewall: removed as an
        // uninstall would (docker's address pools are small).
        if !self.list_networks().unwrap_or_default().is_empty() {
            let out = self.remove_network();
            if !out.status.success() && !std::thread::panicking() {
                panic!(
                    "sandboxd remove-network failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        // Workspace disks left mounted (SANDBOXD_WORKSPACE_QUOTA=loop) go before their folders.
        for mount in self.mounts() {
            let _ = Command::new("umount").arg("-l").arg(&mount).output();
        }
        if let Some(root) = self.tmpfs.take() {
            let _ = Command::new("umount").arg("-l").arg(&root).output();
        }
        // Workspaces are owned by the sandbox uid; the temp dir removes them as root, however
        // deep a sandbox made them (iteratively, as sandboxd does).
        let path = self.dir.path();
        if let (Some(parent), Some(name)) = (path.parent(), path.file_name())
            && let Ok(parent) = std::fs::File::open(parent)
        {
            let _ =
                sandboxd::workspace::trash::remove_tree_at(std::os::fd::AsFd::as_fd(&parent), name);
        }
    }
}

/// Raw HTTP for what the typed client does not send (bad tokens, odd paths).
pub async fn raw(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new().request(method, url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_owned());
    }
    let resp = req.send().await.expect("sandboxd answers");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

pub fn exists(p: &Path) -> bool {
    p.symlink_metadata().is_ok()
}

impl Daemon {
    /// Stops the process with SIGTERM (a clean shutdown) and waits for it to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.sandboxd.process.terminate().expect("sandboxd exits")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.sandboxd.state_dir.clone()
    }

    /// The mount points under this daemon's folder (its sessions' workspace disks), from
    /// /proc/self/mountinfo.
    pub fn mounts(&self) -> Vec<PathBuf> {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let under = self.dir.path();
        info.lines()
            .filter_map(|l| l.split(' ').nth(4))
            // mountinfo escapes space, tab, newline and backslash in octal.
            .map(|p| {
                PathBuf::from(
                    p.replace("\\040", " ")
                        .replace("\\011", "\t")
                        .replace("\\012", "\n")
                        .replace("\\134", "\\"),
                )
            })
            .filter(|p| p.starts_with(under))
            .collect()
    }
}

/// The PostgreSQL cluster `make up` started, with a fresh database for one test; fails (never
/// skips) when it is not there.
pub async fn postgres_database() -> String {
    use sqlx::AssertSqlSafe;
    let base = std::env::var("SANDBOXD_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("SANDBOXD_TEST_POSTGRES_URL is not set: start PostgreSQL with `make up` and `eval \"$(make -s env)\"`, or run `make test`")
    });
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(&base)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {base} does not answer ({e}): run `make up`"));
    let name = format!("sbx_e2e_{:016x}", rand::rng().random::<u64>());
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&pool)
        .await
        .expect("create a test database");
    let (prefix, _) = base.rsplit_once('/').expect("a database in the URL");
    format!("{prefix}/{name}")
}

/// Runs the docker CLI against the project's dockerd and returns its trimmed stdout; a failure
/// fails the test with docker's own words.
/// What `GET /metrics` of `d` answers.
pub async fn metrics(d: &Daemon) -> String {
    reqwest::get(format!("{}/metrics", d.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("a body")
}

/// The value of the series `name` (with its labels, if any) in `metrics`; 0 when absent.
pub fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().expect("docker");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The id of the container of `session` on `d`.
pub fn container_of(d: &Daemon, session: &str) -> String {
    d.containers()
        .into_iter()
        .find(|c| c.1 == session)
        .map(|c| c.0)
        .expect("the session's container")
}

/// The workspace root (the repository).
pub fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// Runs `hack/<script>` (one that makes something once and prints its path) and returns what
/// it printed; a failure fails the test with the script's own words.
pub fn hack_path(script: &str) -> String {
    let out = std::process::Command::new(repo().join("hack").join(script))
        .output()
        .unwrap_or_else(|e| panic!("hack/{script} does not run: {e}"));
    assert!(
        out.status.success(),
        "hack/{script} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("a path")
        .trim()
        .to_owned()
}

/// Runs `dd` in session `id` to write `mib` MiB into /workspace/x, more than its disk holds,
/// then `then`; asserts that dd failed with "No space left on device" and returns the run.
pub async fn write_past_its_disk(
    client: &Client,
    id: &str,
    mib: u32,
    then: &str,
) -> sandboxd_api::run::RunOutcome {
    let dd = client
        .run(
            id,
            &format!(
                "dd if=/dev/zero of=/workspace/x bs=1M count={mib}; echo \"dd exit $?\"; {then}"
            ),
            Some(120),
            None,
            None,
        )
        .await
        .expect("the run answers");
    assert!(
        dd.stderr.contains("No space left on device"),
        "dd must fail on the session's own disk: {dd:?}"
    );
    assert!(!dd.stdout.contains("dd exit 0"), "{dd:?}");
    dd
}
