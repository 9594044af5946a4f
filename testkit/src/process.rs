//! The processes of the end-to-end tests: sandboxd and the operator started from the
//! workspace's binaries with the tests' settings, what a test does to them (`kill -9`, a signal,
//! a clean stop), and what a sandboxd made on the project's dockerd (the containers and
//! networks of its instance).

use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use rand::Rng;

/// The label sandboxd puts on every container and network of its instance.
pub const INSTANCE_LABEL: &str = "sandboxd.dev/instance";
/// The label sandboxd puts on every container of a session: the session's id.
pub const SESSION_LABEL: &str = "sandboxd.dev/session";

/// The first line sandboxd prints on stdout, before its base URL.
const SANDBOXD_LISTENING: &str = "sandboxd listening on ";
/// The first line the operator prints on stdout, before its health base URL.
const OPERATOR_SERVING: &str = "sandbox-operator serving health on ";

/// The operator's short periods of the tests (flag, seconds), each unless the test gives it.
pub const TEST_PERIODS: [(&str, &str); 5] = [
    ("--lease-seconds", "3"),
    ("--probe-seconds", "1"),
    ("--follow-seconds", "1"),
    ("--tombstone-backoff-seconds", "1"),
    ("--tombstone-backoff-cap-seconds", "4"),
];

/// A workspace binary: next to the running program (a bin such as `faults`), or next to its
/// `deps/` folder (a test binary).
pub fn bin(name: &str) -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe
        .parent()
        .ok_or_else(|| io::Error::other("no target dir"))?;
    if dir.ends_with("deps")
        && let Some(up) = dir.parent()
    {
        dir = up;
    }
    let path = dir.join(name);
    if !path.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} is missing: build it with `cargo build --workspace --bins` (make test does)",
                path.display()
            ),
        ));
    }
    Ok(path)
}

/// A free loopback port (bound, then released).
pub fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Sends `signal` (KILL, STOP, CONT, HUP, TERM) to process `pid` with kill(1).
pub fn signal(pid: u32, signal: &str) -> io::Result<()> {
    let ok = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()?
        .success();
    if !ok {
        return Err(io::Error::other(format!("kill -{signal} {pid} failed")));
    }
    Ok(())
}

/// Whether process `pid` is gone or a zombie (killed, not yet reaped).
pub fn is_dead(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// A child process of the tests, once started: killed (SIGKILL) and reaped when dropped.
#[derive(Default)]
pub struct Process(Option<Child>);

impl Process {
    /// Starts `cmd` (standard input and error to /dev/null when `quiet`) and reads the first
    /// line of its stdout, which must start with `prefix`: returns what follows. Kills and reaps
    /// the child when the line is another (`what` did not start).
    fn start(
        cmd: &mut Command,
        quiet: bool,
        prefix: &str,
        what: &str,
    ) -> io::Result<(Self, String)> {
        cmd.stdout(Stdio::piped());
        if quiet {
            cmd.stdin(Stdio::null()).stderr(Stdio::null());
        }
        let mut child = Self(Some(cmd.spawn()?));
        let mut line = String::new();
        let read = match child.0.as_mut().and_then(|c| c.stdout.take()) {
            Some(out) => BufReader::new(out).read_line(&mut line).map(drop),
            None => Err(io::Error::other("no stdout")),
        };
        match (read, line.trim().strip_prefix(prefix)) {
            (Ok(()), Some(rest)) => Ok((child, rest.to_owned())),
            // Dropping the child kills it.
            (read, _) => Err(io::Error::other(format!(
                "{what} did not start: {line:?}{}",
                read.err().map(|e| format!(" ({e})")).unwrap_or_default()
            ))),
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.0.as_ref().map(Child::id)
    }

    /// Kills the process (SIGKILL): no cleanup of its own. It is reaped.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `signal` to the process: STOP makes it hang (the kernel still accepts its
    /// connections, it answers nothing) until CONT; HUP makes sandboxd read its certificates
    /// again.
    pub fn signal(&self, signal: &str) -> io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| io::Error::other("the process does not run"))?;
        self::signal(pid, signal)
    }

    /// Stops the process with SIGTERM (a clean shutdown) and waits for it to exit.
    pub fn terminate(&mut self) -> io::Result<ExitStatus> {
        let mut child = self
            .0
            .take()
            .ok_or_else(|| io::Error::other("the process does not run"))?;
        signal(child.id(), "TERM")?;
        child.wait()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Runs the docker CLI; its stdout, or an error with docker's own words.
fn docker(args: &[&str]) -> io::Result<String> {
    let out = Command::new("docker").args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A sandboxd process of the tests and how it is started: its settings stay, so it can be
/// killed and started again on the same state, workspaces and instance. Dropping it kills the
/// process and removes every container of its instance.
pub struct Sandboxd {
    /// The binary.
    pub binary: PathBuf,
    /// `SANDBOXD_PORT`: a fixed port, kept across restarts, or 0 for a free one at each start.
    pub port: u16,
    /// Its admin token (`SANDBOXD_TOKEN`).
    pub token: String,
    /// Its instance name, on every container and network it makes (`SANDBOXD_INSTANCE`).
    pub instance: String,
    /// `SANDBOXD_WORKSPACE_ROOT`.
    pub workspace_root: PathBuf,
    /// `SANDBOXD_STATE_DIR`.
    pub state_dir: PathBuf,
    /// `SANDBOXD_RUNTIMES`.
    pub runtimes: String,
    /// `SANDBOXD_MEM_LIMIT`, each sandbox's memory.
    pub mem_limit: String,
    /// `RUST_LOG`.
    pub log: String,
    /// More environment, on top of the settings above (and able to override them).
    pub env: Vec<(String, String)>,
    /// Standard input and error to /dev/null rather than the test's.
    pub quiet: bool,
    /// A file its standard error (its log) is appended to rather than the test's, kept
    /// across restarts: what a test reads back (`quiet` aside).
    pub log_file: Option<PathBuf>,
    /// Its base URL, as it printed it when it last started.
    pub base: String,
    /// The process, once started.
    pub process: Process,
}

impl Sandboxd {
    /// The settings of a test sandboxd of `binary` with its workspaces (`workspaces/`) and state
    /// (`state/`) in `dir`, runtime `base` = `image`, a random admin token and an instance
    /// named `<prefix><random>`, on a free port at each start, sandboxes of 512 MiB, warnings
    /// logged. Nothing runs until [`Sandboxd::launch`].
    pub fn new(binary: PathBuf, dir: &Path, instance_prefix: &str, image: &str) -> Self {
        let suffix: u32 = rand::rng().random();
        Self {
            binary,
            port: 0,
            token: format!("admin-{suffix:08x}-{:016x}", rand::rng().random::<u64>()),
            instance: format!("{instance_prefix}{suffix:08x}"),
            workspace_root: dir.join("workspaces"),
            state_dir: dir.join("state"),
            runtimes: format!("base={image}"),
            mem_limit: "512m".to_owned(),
            log: "warn,sandboxd::server=error".to_owned(),
            env: vec![],
            quiet: false,
            log_file: None,
            base: String::new(),
            process: Process::default(),
        }
    }

    /// Adds `env` to the environment of the next start.
    pub fn with_env(&mut self, env: &[(&str, &str)]) -> &mut Self {
        self.env
            .extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        self
    }

    /// The command that starts it, without the standard streams.
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.env("SANDBOXD_TOKEN", &self.token)
            .env("SANDBOXD_HOST", "127.0.0.1")
            .env("SANDBOXD_PORT", self.port.to_string())
            .env("SANDBOXD_RUNTIMES", &self.runtimes)
            .env("SANDBOXD_INSTANCE", &self.instance)
            .env("SANDBOXD_WORKSPACE_ROOT", &self.workspace_root)
            .env("SANDBOXD_STATE_DIR", &self.state_dir)
            .env("SANDBOXD_MEM_LIMIT", &self.mem_limit)
            // Workspaces without disks of their own, unless a test asks for them (the disk
            // tests: SANDBOXD_WORKSPACE_QUOTA=loop).
            .env("SANDBOXD_WORKSPACE_QUOTA", "off")
            .env("RUST_LOG", &self.log);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Starts the process (again, after a `kill9` of [`Sandboxd::process`]) and waits until
    /// it listens: its first line on stdout, whose base URL becomes [`Sandboxd::base`].
    pub fn launch(&mut self) -> io::Result<()> {
        let mut cmd = self.command();
        if let Some(path) = &self.log_file
            && !self.quiet
        {
            let file = std::fs::File::options()
                .create(true)
                .append(true)
                .open(path)?;
            cmd.stderr(file);
        }
        let (process, base) = Process::start(&mut cmd, self.quiet, SANDBOXD_LISTENING, "sandboxd")?;
        if self.port != 0 && !base.ends_with(&format!(":{}", self.port)) {
            return Err(io::Error::other(format!(
                "sandboxd listens on {base}, not on port {}",
                self.port
            )));
        }
        self.base = base;
        self.process = process;
        Ok(())
    }

    /// The host folder of session `id`'s workspace.
    pub fn workspace(&self, id: &str) -> PathBuf {
        self.workspace_root.join(id).join("workspace")
    }

    /// The containers of its instance, as Docker reports them: (id, session label, running).
    pub fn list_containers(&self) -> io::Result<Vec<(String, String, bool)>> {
        let filter = format!("label={INSTANCE_LABEL}={}", self.instance);
        let format = format!("{{{{.ID}}}} {{{{.Label \"{SESSION_LABEL}\"}}}} {{{{.State}}}}");
        let out = docker(&[
            "ps",
            "-a",
            "--no-trunc",
            "--filter",
            &filter,
            "--format",
            &format,
        ])?;
        Ok(out
            .lines()
            .filter_map(|l| {
                let mut p = l.splitn(3, ' ');
                Some((
                    p.next()?.to_owned(),
                    p.next()?.to_owned(),
                    p.next()? == "running",
                ))
            })
            .collect())
    }

    /// The ids of the Docker networks of its instance.
    pub fn list_networks(&self) -> io::Result<Vec<String>> {
        let filter = format!("label={INSTANCE_LABEL}={}", self.instance);
        let out = docker(&["network", "ls", "-q", "--filter", &filter])?;
        Ok(out.split_whitespace().map(str::to_owned).collect())
    }

    /// Removes every container of its instance (`docker rm -f`), best effort.
    pub fn remove_containers(&self) {
        for (id, _, _) in self.list_containers().unwrap_or_default() {
            let _ = docker(&["rm", "-f", &id]);
        }
    }

    /// Runs `sandboxd remove-network` for its instance, with its extra environment, as an
    /// uninstall would.
    pub fn remove_network(&self) -> io::Result<std::process::Output> {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("remove-network")
            .env("SANDBOXD_INSTANCE", &self.instance)
            .env("RUST_LOG", "warn");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.output()
    }
}

impl Drop for Sandboxd {
    fn drop(&mut self) {
        self.process.kill9();
        self.remove_containers();
    }
}

/// An operator process of the tests and how it is started: a replica scoped by `--selector`,
/// leading through a Lease in its namespace, serving health on a free loopback port, with the
/// short periods of the tests. Its settings stay, so it can be killed and started again with
/// the same identity. Dropping it kills the process.
pub struct Operator {
    /// The binary.
    pub binary: PathBuf,
    /// `KUBECONFIG`, when not the test's own.
    pub kubeconfig: Option<String>,
    /// `POD_NAMESPACE` (where the hosts' admin-token Secrets are) and the Lease's namespace.
    pub namespace: String,
    /// `--selector`: the label of the objects it sees.
    pub selector: String,
    /// `--lease-name`, when not the default.
    pub lease_name: Option<String>,
    /// `--identity`, when not the default.
    pub identity: Option<String>,
    /// `RUST_LOG`.
    pub log: String,
    /// The short periods of the tests ([`TEST_PERIODS`]) for those `args` do not give.
    pub test_periods: bool,
    /// More arguments.
    pub args: Vec<String>,
    /// More environment variables.
    pub env: Vec<(String, String)>,
    /// Standard input and error to /dev/null rather than the test's.
    pub quiet: bool,
    /// Its health and metrics base URL, as it printed it when it last started.
    pub health: String,
    /// The process, once started.
    pub process: Process,
}

impl Operator {
    /// The settings of a test operator of `binary` in `namespace`, seeing the objects of
    /// `selector`, with the short periods of the tests and warnings logged. Nothing runs until
    /// [`Operator::launch`].
    pub fn new(binary: PathBuf, namespace: &str, selector: &str) -> Self {
        Self {
            binary,
            kubeconfig: None,
            namespace: namespace.to_owned(),
            selector: selector.to_owned(),
            lease_name: None,
            identity: None,
            log: "warn".to_owned(),
            test_periods: true,
            args: vec![],
            env: vec![],
            quiet: false,
            health: String::new(),
            process: Process::default(),
        }
    }

    /// Adds `args` to the arguments of the next start.
    pub fn with_args(&mut self, args: &[&str]) -> &mut Self {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// Starts the process (again, after a `kill9` of [`Operator::process`]) and waits until it
    /// serves health:
    /// its first line on stdout, whose address becomes [`Operator::health`].
    pub fn launch(&mut self) -> io::Result<()> {
        let mut cmd = Command::new(&self.binary);
        if let Some(kubeconfig) = &self.kubeconfig {
            cmd.env("KUBECONFIG", kubeconfig);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("POD_NAMESPACE", &self.namespace)
            .env("RUST_LOG", &self.log)
            .args(["--selector", &self.selector])
            .args(["--lease-namespace", &self.namespace]);
        if let Some(name) = &self.lease_name {
            cmd.args(["--lease-name", name]);
        }
        if let Some(identity) = &self.identity {
            cmd.args(["--identity", identity]);
        }
        cmd.args(["--http-addr", "127.0.0.1:0"]).args(&self.args);
        if self.test_periods {
            for (flag, value) in TEST_PERIODS {
                if !self.args.iter().any(|a| a == flag) {
                    cmd.args([flag, value]);
                }
            }
        }
        let (process, health) =
            Process::start(&mut cmd, self.quiet, OPERATOR_SERVING, "the operator")?;
        self.health = health;
        self.process = process;
        Ok(())
    }
}
