//! The fault harness: proves that a `kill -9` of any part of the stack loses no workspace,
//! no acknowledged write, and leaks no container, Tombstone or finalizer.
//!
//! Each trial, from a seed it prints, runs two sandboxd hosts (processes of the workspace's
//! `sandboxd` binary on the project's dockerd) and two operator replicas with leader election,
//! all in a scope of its own (a label and the operators' `--selector`). It drives a random
//! workload through the real stack: `kubectl apply` of SandboxSessions in two namespaces it
//! made, commands run and files written through each session's token Secret (`endpoint`,
//! `token`, `session`), deletes of sessions and of a namespace. At a random step, while that
//! step's requests are in flight, it sends `kill -9` to one target (consecutive seeds take the
//! targets in turn) and restarts it one to three steps later, as a kubelet or systemd would:
//! - `operator`: the replica that holds the Lease (spawned again with the same identity);
//! - `sandboxd`: one of the hosts (spawned again on the same port, state and workspaces);
//! - `apiserver`, `etcd`: the shared control plane (`hack/control-plane.sh start`, which
//!   restarts a dead component);
//! - `dockerd`: the shared dockerd (`hack/dockerd.sh start`);
//! - `store`: the shared S3 server of the snapshots (`hack/s3.sh start`);
//! - `hang`: one of the hosts is stopped (`kill -STOP`) rather than killed, so it holds its
//!   connections open and answers nothing, and is continued (`kill -CONT`) in its place.
//!
//! Besides sessions, writes, runs and deletes, the workload takes SandboxSnapshots of live
//! sessions and opens sessions from Ready ones (`spec.from`), changes the trial's Runtime (each
//! host must report the new definition), opens a session naming a Runtime that does not exist
//! yet (it must say so, then open once the Runtime is created) and removes a session's
//! workspace folder under it (the session must become Lost, saying why, and the folder must
//! not come back).
//!
//! Then it waits for convergence (`--converge-seconds`) and checks the invariants; a trial
//! passes when all hold:
//! - every live SandboxSession is Running, Sleeping or Reclaimed, none is stuck deleting; one
//!   whose workspace the workload removed is Lost with a message, and its folder is not back;
//! - every host reports every Runtime of the trial with its current description;
//! - every session deleted (alone or with its namespace) is gone, the namespace too;
//! - one container per Running or Sleeping session (running for a Running one), none for a
//!   Reclaimed one, none of the harness's hosts without a live session;
//! - no Tombstone of the scope is left;
//! - every SandboxSnapshot is Ready or Failed, and every Ready one restores (a session opened
//!   from it on a host, then destroyed);
//! - every live session's workspace folder exists, holding every file whose write the API
//!   acknowledged, byte for byte, and the audit row of each such write.
//!
//! One line per trial (seed, what was killed when, time to converge, verdict), a summary, and
//! exit status 1 when any invariant broke (each named with its trial's seed). Trial i's seed is
//! the run's plus i: `--seed S --trials N` replays a run, `--seed <trial seed> --trials 1` one
//! trial. Each trial removes what it made (namespaces, SandboxHosts, the
//! Runtime, Tombstones, its hosts' containers and folders), whatever its verdict.
//!
//! Killing the API server, etcd or dockerd breaks whatever else uses them at that moment, so
//! this is not a `cargo test`: `make test` runs it after the test suite. The control plane's
//! and dockerd's pid files and scripts are found from `KUBECONFIG` (`<root>/.dev/kubeconfig`),
//! so the harness works from any checkout that uses them.
//!
//! Needs `make up`, `eval "$(make -s env)"`, the binaries (`cargo build --workspace --bins`),
//! then `cargo run -p sandboxd-tests --bin faults -- --trials 10 --seed 1`.
//!
//! Over 600 lines: the workload, the kills and the invariants of one harness, read together.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_crds::v1alpha1::{
    Runtime, SandboxHost, SandboxSession, SandboxSnapshot, SnapshotPhase, Tombstone,
};
use sandboxd_tests::host::Host;
use sandboxd_tests::poll::poll;
use sandboxd_tests::process::{self, Operator};
use serde_json::json;

const SCOPE_LABEL: &str = "sandboxd.dev/test-scope";
/// The longest one workload step may take.
const STEP_LIMIT: Duration = Duration::from_secs(10);
/// The least time a `hang` target stays stopped: longer than the operators' host deadline.
const HANG_AT_LEAST: Duration = Duration::from_secs(6);

/// What a trial may kill.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    /// The operator replica that holds the Lease.
    Operator,
    /// One sandboxd host.
    Sandboxd,
    /// The shared kube-apiserver.
    Apiserver,
    /// The shared etcd.
    Etcd,
    /// The shared dockerd.
    Dockerd,
    /// One sandboxd host, stopped (`kill -STOP`) instead of killed: it hangs.
    Hang,
    /// The shared S3 server of the snapshots (versitygw).
    Store,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Operator => "operator",
            Target::Sandboxd => "sandboxd",
            Target::Apiserver => "apiserver",
            Target::Etcd => "etcd",
            Target::Dockerd => "dockerd",
            Target::Hang => "hang",
            Target::Store => "store",
        }
    }
}

#[derive(Parser)]
struct Args {
    /// The run's seed (each trial's seed derives from it); random when left out.
    #[arg(long)]
    seed: Option<u64>,
    /// Trials to run.
    #[arg(long, default_value_t = 10)]
    trials: usize,
    /// What the trials may kill, comma separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "operator,sandboxd,apiserver,etcd,dockerd,hang,store"
    )]
    targets: Vec<Target>,
    /// Workload steps per trial.
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// How long a trial may take to converge once every part is back.
    #[arg(long, default_value_t = 120)]
    converge_seconds: u64,
}

/// splitmix64: a small seeded generator, so a seed replays the same trial.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Where the shared services keep their pid files and scripts: `<root>/.dev`, from `KUBECONFIG`.
struct Dev {
    dir: PathBuf,
    root: PathBuf,
}

impl Dev {
    fn from_env() -> Result<Self> {
        let kubeconfig = std::env::var("KUBECONFIG")
            .context("KUBECONFIG is not set: eval \"$(make -s env)\" after make up")?;
        let dir = Path::new(&kubeconfig)
            .parent()
            .context("KUBECONFIG has no folder")?
            .to_path_buf();
        let root = dir
            .parent()
            .context("the .dev folder has no parent")?
            .to_path_buf();
        if !root.join("hack/control-plane.sh").exists() {
            bail!(
                "{} is not a checkout's .dev (no hack/control-plane.sh next to it)",
                dir.display()
            );
        }
        Ok(Self { dir, root })
    }

    fn pid_file(&self, target: Target) -> PathBuf {
        match target {
            Target::Apiserver => self.dir.join("control-plane/kube-apiserver.pid"),
            Target::Etcd => self.dir.join("control-plane/etcd.pid"),
            Target::Store => self.dir.join("s3/versitygw.pid"),
            _ => self.dir.join("dockerd.pid"),
        }
    }

    /// The pid of a shared service, from its pid file.
    fn pid(&self, target: Target) -> Result<u32> {
        let file = self.pid_file(target);
        std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?
            .trim()
            .parse()
            .with_context(|| format!("{} holds no pid", file.display()))
    }

    /// Starts a shared service again through its script (idempotent: restarts what is dead).
    fn restart(&self, target: Target) -> Result<()> {
        let script = match target {
            Target::Dockerd => "hack/dockerd.sh",
            Target::Store => "hack/s3.sh",
            _ => "hack/control-plane.sh",
        };
        let out = Command::new(self.root.join(script))
            .arg("start")
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .with_context(|| format!("running {script} start"))?;
        if !out.status.success() {
            bail!(
                "{script} start failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

/// `kill -9 pid`; waits (at most 30 s) until the process is gone or a zombie.
async fn kill9_and_wait(pid: u32) -> Result<()> {
    process::signal(pid, "KILL")?;
    poll(
        Duration::from_secs(30),
        Duration::from_millis(50),
        // A plain closure: the killer task that waits here must be Send.
        move || async move { process::is_dead(pid).then_some(()) },
    )
    .await
    .map_err(|_| anyhow!("pid {pid} outlived kill -9 by 30 s"))
}

/// A sandboxd host of the harness: the shared test host on the local base image, its token
/// from the trial's seed, its instance named by the trial, its snapshots under the trial's
/// prefix of the S3 server, quiet.
fn start_host(
    name: String,
    instance: String,
    image: &str,
    prefix: &str,
    rng: &mut Rng,
) -> Result<Host> {
    let mut host = Host::new(&name, image)?;
    host.sandboxd.with_env(&[("SANDBOXD_S3_PREFIX", prefix)]);
    host.sandboxd.token = format!("admin-{:016x}{:016x}", rng.next(), rng.next());
    host.sandboxd.instance = instance;
    host.sandboxd.log = "error".to_owned();
    host.sandboxd.quiet = true;
    host.sandboxd
        .launch()
        .with_context(|| format!("starting sandboxd {name}"))?;
    Ok(host)
}

/// An operator replica of the harness, started: identity `identity`, leading through Lease
/// `faults` in `home`, scoped by the trial's label, quiet.
fn start_operator(identity: &str, home: &str, scope: &str) -> Result<Operator> {
    let mut op = Operator::new(
        process::bin("sandbox-operator")?,
        home,
        &format!("{SCOPE_LABEL}={scope}"),
    );
    op.lease_name = Some("faults".to_owned());
    op.identity = Some(identity.to_owned());
    op.log = "error".to_owned();
    op.quiet = true;
    // Short host deadlines, so a hung host (`hang`) outlasts them.
    op.with_args(&["--host-request-seconds", "3", "--host-open-seconds", "10"])
        .launch()
        .context("starting the operator")?;
    Ok(op)
}

/// A session the workload created, and what it knows of it.
struct Tracked {
    ns: String,
    name: String,
    /// What should have become of it.
    fate: Fate,
    /// Files whose write the API acknowledged: path → bytes.
    writes: BTreeMap<String, Vec<u8>>,
    /// The workload removed its workspace folder: it must end Lost.
    vanished: bool,
}

/// What should have become of a session the workload created.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// kubectl applied it and nothing deleted it: it must be there.
    Live,
    /// A delete of it or its namespace was accepted: it must be gone.
    Deleted,
    /// Its apply or delete failed (an outage): it may be there or not.
    Unknown,
}

/// One trial's world.
struct Trial {
    client: Client,
    /// The part of the trial's names unique to it.
    short: String,
    scope: String,
    home: String,
    namespaces: Vec<String>,
    deleted_ns: BTreeSet<String>,
    ns_delete_tried: bool,
    /// Whether the workload already opened a session on a missing Runtime, and removed a
    /// workspace (once each per trial).
    late_tried: bool,
    /// The Runtime the missing-runtime step named, until it is created: a create that an
    /// outage cut off is made once the stack is back, as the platform would retry it.
    late_runtime: Option<String>,
    vanish_tried: bool,
    hosts: Vec<Host>,
    operators: Vec<Operator>,
    runtime: String,
    sessions: Vec<Tracked>,
    image: String,
    /// The target and how long after the trial's start it was killed and restarted.
    events: Vec<String>,
    started: Instant,
    /// When (after `started`) the kill was sent.
    killed_at: Option<Duration>,
    /// Workload steps by kind, and how many of them the stack accepted.
    did: BTreeMap<&'static str, (usize, usize)>,
    /// The SandboxSnapshots the workload asked for: namespace and name.
    snapshots: Vec<(String, String)>,
}

fn labels(scope: &str) -> serde_json::Value {
    json!({ SCOPE_LABEL: scope })
}

impl Trial {
    /// The trial's names: unique to this run (`run`) as well as the seed, so a run started
    /// while the namespaces of the last one are still terminating does not meet them.
    fn new(client: &Client, run: u32, seed: u64, image: &str) -> Self {
        let scope = format!("faults-{run:08x}-{seed:016x}");
        let short = format!("{run:08x}-{:08x}", seed as u32);
        let home = format!("sbx-faults-{short}");
        let namespaces = vec![
            format!("sbx-faults-{short}-a"),
            format!("sbx-faults-{short}-b"),
        ];
        Self {
            client: client.clone(),
            short: short.clone(),
            scope: scope.clone(),
            home: home.clone(),
            namespaces: namespaces.clone(),
            deleted_ns: BTreeSet::new(),
            ns_delete_tried: false,
            late_tried: false,
            late_runtime: None,
            vanish_tried: false,
            hosts: vec![],
            operators: vec![],
            runtime: format!("base-{scope}"),
            sessions: vec![],
            image: image.to_owned(),
            events: vec![],
            started: Instant::now(),
            killed_at: None,
            did: BTreeMap::new(),
            snapshots: vec![],
        }
    }

    /// Makes the trial's namespaces, hosts, Runtime and operators.
    async fn setup(&mut self, rng: &mut Rng) -> Result<()> {
        let (client, scope, home) = (self.client.clone(), self.scope.clone(), self.home.clone());
        let nsapi = Api::<Namespace>::all(client.clone());
        for ns in std::iter::once(&home).chain(&self.namespaces) {
            nsapi
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(
                        json!({"metadata": {"name": ns, "labels": labels(&scope)}}),
                    )?,
                )
                .await
                .with_context(|| format!("creating namespace {ns}"))?;
        }
        for i in 0..2 {
            let host = start_host(
                format!("faults-{}-h{i}", self.short),
                format!("flt{}h{i}", self.short.replace('-', "")),
                &self.image,
                &format!("faults-{}", self.short),
                rng,
            )?;
            Api::<Secret>::namespaced(client.clone(), &home)
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({
                    "metadata": {"name": format!("{}-admin", host.name), "labels": labels(&scope)},
                    "stringData": {"token": host.sandboxd.token}}))?,
                )
                .await?;
            Api::<SandboxHost>::all(client.clone())
                .create(&PostParams::default(), &serde_json::from_value(json!({
                    "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxHost",
                    "metadata": {"name": host.name, "labels": labels(&scope)},
                    "spec": {"endpoint": host.endpoint(), "node": host.node, "adminTokenSecret": {"namespace": home, "name": format!("{}-admin", host.name), "key": "token"}}}))?)
                .await?;
            self.hosts.push(host);
        }
        let runtime = self.runtime.clone();
        self.create_runtime(&runtime, true).await?;
        for i in 0..2 {
            self.operators
                .push(start_operator(&format!("{scope}-{i}"), &home, &scope)?);
        }
        Ok(())
    }

    /// Creates a Runtime of the trial on the local base image.
    async fn create_runtime(&self, name: &str, default: bool) -> Result<()> {
        Api::<Runtime>::all(self.client.clone())
            .create(&PostParams::default(), &serde_json::from_value(json!({
                "apiVersion": "sandboxd.dev/v1alpha1", "kind": "Runtime",
                "metadata": {"name": name, "labels": labels(&self.scope)},
                "spec": {"description": "the local base image", "image": self.image, "default": default}}))?)
            .await
            .with_context(|| format!("creating Runtime {name}"))?;
        Ok(())
    }

    /// A session on a Runtime that does not exist yet: it must say so at once, and open once
    /// the Runtime is created. True when it said so and the Runtime was created.
    async fn open_on_missing_runtime(&mut self, ns: &str, n: usize) -> bool {
        let runtime = format!("late-{}-{n}", self.short);
        let name = format!("late{n}");
        if !self.apply_session_on(ns, &name, &runtime) {
            return false;
        }
        let want = format!("Runtime '{runtime}' does not exist");
        let api = Api::<SandboxSession>::namespaced(self.client.clone(), ns);
        let said = poll(
            Duration::from_secs(5),
            Duration::from_millis(200),
            async || {
                let session = api.get_opt(&name).await.ok().flatten();
                let message = session.and_then(|s| s.status).and_then(|st| st.message);
                message.is_some_and(|m| m.contains(&want)).then_some(())
            },
        )
        .await
        .is_ok();
        self.late_runtime = Some(runtime.clone());
        let created = self.create_runtime(&runtime, false).await.is_ok();
        if created {
            self.late_runtime = None;
        }
        created && said
    }

    /// Creates the missing-runtime step's Runtime if an outage cut its create off.
    async fn finish_late_runtime(&mut self) {
        let Some(runtime) = self.late_runtime.clone() else {
            return;
        };
        let there = Api::<Runtime>::all(self.client.clone())
            .get_opt(&runtime)
            .await
            .is_ok_and(|r| r.is_some());
        if there || self.create_runtime(&runtime, false).await.is_ok() {
            self.late_runtime = None;
        }
    }

    /// Removes a placed session's workspace folder on its host, under it.
    async fn vanish(&mut self, i: usize) -> bool {
        let t = &self.sessions[i];
        let Ok(Some(s)) = Api::<SandboxSession>::namespaced(self.client.clone(), &t.ns)
            .get_opt(&t.name)
            .await
        else {
            return false;
        };
        let st = s.status.unwrap_or_default();
        let (Some(hname), Some(id)) = (st.host, st.session_id) else {
            return false;
        };
        let Some(host) = self.hosts.iter().find(|h| h.name == hname) else {
            return false;
        };
        let ws = host.workspace(&id);
        if !ws.is_dir() || std::fs::remove_dir_all(&ws).is_err() {
            return false;
        }
        self.sessions[i].vanished = true;
        true
    }

    fn at(&self) -> String {
        format!("{:.1}s", self.started.elapsed().as_secs_f64())
    }

    /// `kubectl apply` of a new session in `ns`.
    fn apply_session(&mut self, ns: &str, name: &str) -> bool {
        self.apply_session_on(ns, name, "")
    }

    /// `kubectl apply` of a new session in `ns` naming `runtime` (empty: the default).
    fn apply_session_on(&mut self, ns: &str, name: &str, runtime: &str) -> bool {
        let mut doc = json!({
            "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
            "metadata": {"name": name, "namespace": ns, "labels": labels(&self.scope)},
            "spec": {"scope": "conversation", "tenant": "org-1", "subject": name},
        });
        if !runtime.is_empty() {
            doc["spec"]["runtime"] = json!(runtime);
        }
        let applied = kubectl(
            &["apply", "--request-timeout=10s", "-f", "-"],
            Some(&doc.to_string()),
        );
        self.sessions.push(Tracked {
            ns: ns.to_owned(),
            name: name.to_owned(),
            fate: if applied { Fate::Live } else { Fate::Unknown },
            writes: BTreeMap::new(),
            vanished: false,
        });
        applied
    }

    /// `kubectl apply` of SandboxSnapshot `snap<n>` of session `session` in `ns`.
    fn snapshot(&mut self, ns: &str, session: &str, n: usize) -> bool {
        let name = format!("snap{n}");
        let doc = json!({
            "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSnapshot",
            "metadata": {"name": name, "namespace": ns, "labels": labels(&self.scope)},
            "spec": {"session": session},
        });
        let applied = kubectl(
            &["apply", "--request-timeout=10s", "-f", "-"],
            Some(&doc.to_string()),
        );
        self.snapshots.push((ns.to_owned(), name));
        applied
    }

    /// A new session `f<n>` from a snapshot the workload took that is Ready now (none: an
    /// idle step that did nothing).
    async fn fork(&mut self, rng: &mut Rng, n: usize) -> bool {
        let mut ready = vec![];
        for (ns, name) in &self.snapshots {
            if self.deleted_ns.contains(ns) {
                continue;
            }
            let snap = Api::<SandboxSnapshot>::namespaced(self.client.clone(), ns)
                .get_opt(name)
                .await;
            if let Ok(Some(snap)) = snap
                && snap.status.and_then(|s| s.phase) == Some(SnapshotPhase::Ready)
            {
                ready.push((ns.clone(), name.clone()));
            }
        }
        if ready.is_empty() {
            return true;
        }
        let (ns, snapshot) = ready[rng.below(ready.len())].clone();
        let name = format!("f{n}");
        let doc = json!({
            "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
            "metadata": {"name": name, "namespace": ns, "labels": labels(&self.scope)},
            "spec": {"scope": "conversation", "tenant": "org-1", "subject": name, "from": {"snapshot": snapshot}},
        });
        let applied = kubectl(
            &["apply", "--request-timeout=10s", "-f", "-"],
            Some(&doc.to_string()),
        );
        self.sessions.push(Tracked {
            ns,
            name,
            fate: if applied { Fate::Live } else { Fate::Unknown },
            writes: BTreeMap::new(),
            vanished: false,
        });
        applied
    }

    /// Every SandboxSnapshot of the trial settled (Ready or Failed, none taken still), and
    /// every Ready one restorable: a session opened from it on a host, then destroyed.
    async fn check_snapshots(&self, broken: &mut Vec<String>) -> Result<()> {
        let lp = ListParams::default().labels(&format!("{SCOPE_LABEL}={}", self.scope));
        for ns in self
            .namespaces
            .iter()
            .filter(|ns| !self.deleted_ns.contains(*ns))
        {
            let snaps = Api::<SandboxSnapshot>::namespaced(self.client.clone(), ns)
                .list(&lp)
                .await?;
            for snap in snaps.items {
                let name = snap.name_any();
                let st = snap.status.clone().unwrap_or_default();
                match st.phase {
                    Some(SnapshotPhase::Ready) => {}
                    Some(SnapshotPhase::Failed) => continue,
                    _ if snap.metadata.deletion_timestamp.is_some() => continue,
                    other => {
                        broken.push(format!(
                            "SandboxSnapshot {ns}/{name} is {other:?}, not settled: {}",
                            st.message.unwrap_or_default()
                        ));
                        continue;
                    }
                }
                let Some(key) = st.key else {
                    broken.push(format!(
                        "SandboxSnapshot {ns}/{name} is Ready without a key"
                    ));
                    continue;
                };
                let Some(host) = self.hosts.first() else {
                    continue;
                };
                let admin = host.client().with_deadline(Duration::from_secs(60));
                let probe = format!("verify-{}", sandboxd_crds::key::short_hash(&key, 12));
                let opened = admin
                    .open_request(&sandboxd_api::session::OpenRequest {
                        name: probe.clone(),
                        tenant: "faults-verify".to_owned(),
                        runtime: None,
                        limits: None,
                        owner: None,
                        egress: Vec::new(),
                        from_snapshot: Some(key.clone()),
                    })
                    .await;
                let _ = admin.destroy(&probe).await;
                if let Err(e) = opened {
                    broken.push(format!(
                        "SandboxSnapshot {ns}/{name} is Ready but does not restore: {e}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The session's client from its token Secret, when the operator wrote one.
    async fn session_client(
        &self,
        ns: &str,
        name: &str,
    ) -> Option<(sandboxd_api::client::Client, String)> {
        let s = Api::<SandboxSession>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await
            .ok()??;
        let secret_name = s.status.as_ref()?.credentials_secret.clone()?;
        let secret = Api::<Secret>::namespaced(self.client.clone(), ns)
            .get_opt(&secret_name)
            .await
            .ok()??;
        let data = secret.data?;
        let field = |k: &str| {
            data.get(k)
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
        };
        let client = sandboxd_api::client::Client::new(&field("endpoint")?, &field("token")?)
            .with_deadline(Duration::from_secs(15));
        Some((client, field("session")?))
    }

    fn live(&self) -> Vec<usize> {
        (0..self.sessions.len())
            .filter(|&i| self.sessions[i].fate != Fate::Deleted)
            .collect()
    }

    /// [`Trial::step`], counted, and bounded: during an outage it fails, and a call to an API
    /// server without etcd hangs.
    async fn bounded_step(&mut self, rng: &mut Rng, n: usize) {
        let (kind, ok) = tokio::time::timeout(STEP_LIMIT, self.step(rng, n))
            .await
            .unwrap_or(("timed out", false));
        let tally = self.did.entry(kind).or_default();
        tally.0 += 1;
        tally.1 += usize::from(ok);
    }

    /// One random workload step: what it did and whether the stack accepted it.
    async fn step(&mut self, rng: &mut Rng, n: usize) -> (&'static str, bool) {
        let live = self.live();
        let open_ns: Vec<String> = self
            .namespaces
            .iter()
            .filter(|ns| !self.deleted_ns.contains(*ns))
            .cloned()
            .collect();
        match rng.below(15) {
            0..=2 if !open_ns.is_empty() => {
                let ns = open_ns[rng.below(open_ns.len())].clone();
                let ok = self.apply_session(&ns, &format!("s{n}"));
                ("create", ok)
            }
            3..=5 if !live.is_empty() => {
                let i = live[rng.below(live.len())];
                let path = format!("dir/f{n}.txt");
                let data = format!("{n}:{:016x}\n", rng.next()).into_bytes();
                let (ns, name) = (self.sessions[i].ns.clone(), self.sessions[i].name.clone());
                let Some((c, id)) = self.session_client(&ns, &name).await else {
                    return ("write", false);
                };
                let ok = c.write(&id, &path, data.clone()).await.is_ok();
                // A session whose workspace is gone keeps no write: it must be refused there.
                if ok && !self.sessions[i].vanished {
                    self.sessions[i].writes.insert(path, data);
                }
                ("write", ok)
            }
            6 | 7 if !live.is_empty() => {
                let i = live[rng.below(live.len())];
                let (ns, name) = (self.sessions[i].ns.clone(), self.sessions[i].name.clone());
                let Some((c, id)) = self.session_client(&ns, &name).await else {
                    return ("run", false);
                };
                let ok = c
                    .run(&id, "ls -R . | wc -l", Some(20), None, None)
                    .await
                    .is_ok_and(|o| o.exit_code == 0);
                ("run", ok)
            }
            8 if !live.is_empty() => {
                let i = live[rng.below(live.len())];
                let (ns, name) = (self.sessions[i].ns.clone(), self.sessions[i].name.clone());
                let ok = kubectl(
                    &[
                        "delete",
                        "sandboxsession",
                        &name,
                        "-n",
                        &ns,
                        "--wait=false",
                        "--ignore-not-found",
                        "--request-timeout=10s",
                    ],
                    None,
                );
                // A delete that timed out may still have happened: either outcome is fine then.
                self.sessions[i].fate = if ok { Fate::Deleted } else { Fate::Unknown };
                ("delete", ok)
            }
            9 if !self.ns_delete_tried && !open_ns.is_empty() => {
                let ns = open_ns[rng.below(open_ns.len())].clone();
                self.ns_delete_tried = true;
                let ok = kubectl(
                    &[
                        "delete",
                        "namespace",
                        &ns,
                        "--wait=false",
                        "--request-timeout=10s",
                    ],
                    None,
                );
                if ok {
                    self.deleted_ns.insert(ns.clone());
                }
                for s in self.sessions.iter_mut().filter(|s| s.ns == ns) {
                    s.fate = if ok { Fate::Deleted } else { Fate::Unknown };
                }
                ("delete namespace", ok)
            }
            10 => {
                let description = format!("changed at step {n}");
                let ok = Api::<Runtime>::all(self.client.clone())
                    .patch(
                        &self.runtime,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"description": description}})),
                    )
                    .await
                    .is_ok();
                ("change runtime", ok)
            }
            11 if !self.late_tried && !open_ns.is_empty() => {
                self.late_tried = true;
                let ns = open_ns[rng.below(open_ns.len())].clone();
                (
                    "missing runtime",
                    self.open_on_missing_runtime(&ns, n).await,
                )
            }
            12 if !self.vanish_tried && !live.is_empty() => {
                self.vanish_tried = true;
                let i = live[rng.below(live.len())];
                ("vanish workspace", self.vanish(i).await)
            }
            13 if !live.is_empty() => {
                let i = live[rng.below(live.len())];
                let (ns, session) = (self.sessions[i].ns.clone(), self.sessions[i].name.clone());
                ("snapshot", self.snapshot(&ns, &session, n))
            }
            14 => ("fork", self.fork(rng, n).await),
            _ => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                ("idle", true)
            }
        }
    }

    /// The replica that holds the Lease.
    async fn leader(&self) -> Option<usize> {
        let lease = Api::<Lease>::namespaced(self.client.clone(), &self.home)
            .get_opt("faults")
            .await
            .ok()??;
        let holder = lease.spec?.holder_identity?;
        self.operators
            .iter()
            .position(|o| o.identity.as_deref() == Some(holder.as_str()))
    }

    /// Chooses what of `target` to kill: the victim and its pid.
    async fn victim(&self, target: Target, dev: &Dev, rng: &mut Rng) -> Result<(Killed, u32)> {
        Ok(match target {
            Target::Operator => {
                let i = match self.leader().await {
                    Some(i) => i,
                    None => rng.below(self.operators.len()),
                };
                let pid = self.operators[i].process.pid();
                (Killed::Operator(i), pid.context("the operator runs")?)
            }
            Target::Sandboxd | Target::Hang => {
                let i = rng.below(self.hosts.len());
                let pid = self.hosts[i]
                    .sandboxd
                    .process
                    .pid()
                    .context("sandboxd runs")?;
                if target == Target::Hang {
                    (Killed::Hung(i, pid), pid)
                } else {
                    (Killed::Host(i), pid)
                }
            }
            shared => (Killed::Shared(shared), dev.pid(shared)?),
        })
    }

    /// Reaps a killed child of the harness and notes the kill, sent `after` the trial began.
    fn killed(&mut self, killed: &Killed, after: Duration) {
        self.killed_at = Some(after);
        match killed {
            Killed::Operator(i) => self.operators[*i].process.kill9(),
            Killed::Host(i) => self.hosts[*i].kill9(),
            Killed::Shared(_) | Killed::Hung(..) => {}
        }
        let how = killed.hung_or("kill -STOP", "kill -9");
        self.events.push(format!(
            "{how} {} at {:.1}s",
            killed.describe(self),
            after.as_secs_f64()
        ));
    }

    /// How long ago the trial's kill was sent.
    fn since_kill(&self) -> Duration {
        self.started
            .elapsed()
            .saturating_sub(self.killed_at.unwrap_or_default())
    }

    fn restart(&mut self, killed: Killed, dev: &Dev) -> Result<()> {
        let began = Instant::now();
        match killed {
            Killed::Operator(i) => {
                self.operators[i]
                    .launch()
                    .context("starting the operator")?;
            }
            Killed::Host(i) => {
                let host = &mut self.hosts[i];
                let name = host.name.clone();
                host.sandboxd
                    .launch()
                    .with_context(|| format!("starting sandboxd {name}"))?;
            }
            Killed::Hung(_, pid) => {
                // Hung for longer than the operators' host deadline (3 s) before it goes on.
                std::thread::sleep(HANG_AT_LEAST.saturating_sub(self.since_kill()));
                process::signal(pid, "CONT")?;
            }
            Killed::Shared(t) => dev.restart(t)?,
        }
        let how = killed.hung_or("continued", "restarted");
        self.events.push(format!(
            "{how} at {} (took {:.1} s)",
            self.at(),
            began.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    /// Every invariant that does not hold now (empty: converged).
    async fn broken(&self) -> Vec<String> {
        match self.check().await {
            Ok(broken) => broken,
            Err(e) => vec![format!("cannot check: {e:#}")],
        }
    }

    async fn check(&self) -> Result<Vec<String>> {
        let mut broken = vec![];
        let lp = ListParams::default().labels(&format!("{SCOPE_LABEL}={}", self.scope));
        // Sessions: live ones settled, deleted ones gone, none stuck deleting.
        let mut live: BTreeMap<(String, String), SandboxSession> = BTreeMap::new();
        for ns in &self.namespaces {
            for s in Api::<SandboxSession>::namespaced(self.client.clone(), ns)
                .list(&lp)
                .await?
                .items
            {
                live.insert((ns.clone(), s.name_any()), s);
            }
        }
        let vanished: BTreeSet<(String, String)> = self
            .sessions
            .iter()
            .filter(|t| t.vanished)
            .map(|t| (t.ns.clone(), t.name.clone()))
            .collect();
        for ((ns, name), s) in &live {
            let st = s.status.clone().unwrap_or_default();
            if s.metadata.deletion_timestamp.is_some() {
                broken.push(format!(
                    "session {ns}/{name} stuck deleting (finalizers {:?}, phase {:?}: {})",
                    s.finalizers(),
                    st.phase,
                    st.message.unwrap_or_default()
                ));
                continue;
            }
            let gone = vanished.contains(&(ns.clone(), name.clone()));
            match st.phase {
                Some(SessionPhase::Lost)
                    if gone && st.message.as_deref().is_some_and(|m| !m.is_empty()) => {}
                Some(SessionPhase::Running | SessionPhase::Sleeping | SessionPhase::Reclaimed)
                    if !gone => {}
                p if gone => broken.push(format!(
                    "session {ns}/{name} lost its workspace and is {p:?}, not Lost: {}",
                    st.message.unwrap_or_default()
                )),
                p => broken.push(format!(
                    "session {ns}/{name} is {p:?}: {}",
                    st.message.unwrap_or_default()
                )),
            }
        }
        for t in &self.sessions {
            let key = (t.ns.clone(), t.name.clone());
            if t.fate == Fate::Deleted && live.contains_key(&key) {
                broken.push(format!(
                    "session {}/{} was deleted and is still there",
                    t.ns, t.name
                ));
            }
            if t.fate == Fate::Live && !live.contains_key(&key) {
                broken.push(format!(
                    "session {}/{} was applied and is gone",
                    t.ns, t.name
                ));
            }
        }
        let nsapi = Api::<Namespace>::all(self.client.clone());
        for ns in &self.deleted_ns {
            if let Some(n) = nsapi.get_opt(ns).await? {
                broken.push(format!(
                    "namespace {ns} stuck deleting: {:?}",
                    n.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .filter(|c| c.status == "True")
                        .map(|c| c.message.clone().unwrap_or_default())
                        .collect::<Vec<_>>()
                ));
            }
        }
        // Tombstones of the scope: none left.
        for t in Api::<Tombstone>::all(self.client.clone())
            .list(&lp)
            .await?
            .items
        {
            broken.push(format!(
                "Tombstone {} left (host {}, session {})",
                t.name_any(),
                t.spec.host,
                t.spec.session_id
            ));
        }
        // Containers: one per Running/Sleeping session, none for a Reclaimed one, no stray.
        let mut placed: BTreeMap<(String, String), (SessionPhase, (String, String))> =
            BTreeMap::new();
        for ((ns, name), s) in &live {
            let st = s.status.clone().unwrap_or_default();
            if let (Some(h), Some(id), Some(p)) = (st.host, st.session_id, st.phase) {
                placed.insert((h, id), (p, (ns.clone(), name.clone())));
            }
        }
        for h in &self.hosts {
            let mut per: BTreeMap<String, usize> = BTreeMap::new();
            let mut runs: BTreeSet<String> = BTreeSet::new();
            for (_, label, running) in h.sandboxd.list_containers()? {
                *per.entry(label.clone()).or_default() += 1;
                if running {
                    runs.insert(label);
                }
            }
            for (id, n) in &per {
                match placed.get(&(h.name.clone(), id.clone())) {
                    None => broken.push(format!(
                        "{n} container(s) of session {id} on host {} without a live session",
                        h.name
                    )),
                    // A Lost session keeps its container, if it still has one, until deleted.
                    Some((SessionPhase::Lost, (ns, name))) if *n > 1 => broken.push(format!(
                        "session {ns}/{name} (Lost) has {n} containers on host {}",
                        h.name
                    )),
                    Some((SessionPhase::Lost, _)) => {}
                    Some((p, (ns, name))) => {
                        let want = usize::from(*p != SessionPhase::Reclaimed);
                        if *n != want {
                            broken.push(format!(
                                "session {ns}/{name} ({p:?}) has {n} containers on host {}, not {want}",
                                h.name
                            ));
                        } else if *p == SessionPhase::Running && !runs.contains(id) {
                            broken.push(format!(
                                "session {ns}/{name} is Running but its container on host {} is not",
                                h.name
                            ));
                        }
                    }
                }
            }
            for ((host, id), (p, (ns, name))) in &placed {
                if host == &h.name
                    && !matches!(p, SessionPhase::Reclaimed | SessionPhase::Lost)
                    && !per.contains_key(id)
                {
                    broken.push(format!(
                        "session {ns}/{name} ({p:?}) has no container on host {host}"
                    ));
                }
            }
        }
        // Runtimes: every host reports each of the trial's, as it is now defined.
        let runtimes = Api::<Runtime>::all(self.client.clone())
            .list(&lp)
            .await?
            .items;
        for h in &self.hosts {
            let admin = h.client().with_deadline(Duration::from_secs(15));
            let reported = admin.runtimes().await?.runtimes;
            for rt in &runtimes {
                let name = rt.name_any();
                match reported.iter().find(|r| r.alias == name) {
                    None => broken.push(format!("host {} does not report Runtime {name}", h.name)),
                    Some(r) if r.description != rt.spec.description => broken.push(format!(
                        "host {} reports Runtime {name} as {:?}, not {:?}",
                        h.name, r.description, rt.spec.description
                    )),
                    Some(_) => {}
                }
            }
        }
        // Workspaces and acknowledged writes.
        for t in self.sessions.iter().filter(|t| t.fate != Fate::Deleted) {
            let Some(s) = live.get(&(t.ns.clone(), t.name.clone())) else {
                continue;
            };
            let st = s.status.clone().unwrap_or_default();
            let (Some(hname), Some(id)) = (st.host, st.session_id) else {
                if !t.writes.is_empty() {
                    broken.push(format!(
                        "session {}/{} with acknowledged writes names no host",
                        t.ns, t.name
                    ));
                }
                continue;
            };
            let Some(host) = self.hosts.iter().find(|h| h.name == hname) else {
                broken.push(format!(
                    "session {}/{} is on unknown host {hname}",
                    t.ns, t.name
                ));
                continue;
            };
            let ws = host.workspace(&id);
            if t.vanished {
                if ws.exists() {
                    broken.push(format!(
                        "the removed workspace of session {}/{} is back: {}",
                        t.ns,
                        t.name,
                        ws.display()
                    ));
                }
                continue;
            }
            if !ws.is_dir() {
                broken.push(format!(
                    "workspace of session {}/{} lost: {} is missing",
                    t.ns,
                    t.name,
                    ws.display()
                ));
                continue;
            }
            if !t.writes.is_empty() {
                let query = sandboxd_api::audit::OperationQuery {
                    session: Some(id.clone()),
                    op: Some(sandboxd_api::audit::Op::Write),
                    limit: Some(sandboxd_api::audit::MAX_PAGE),
                    ..Default::default()
                };
                let admin = host.client().with_deadline(Duration::from_secs(15));
                let rows = admin.operations(&query).await?.operations;
                for path in t.writes.keys() {
                    if !rows
                        .iter()
                        .any(|r| r.ok && r.target.ends_with(path.as_str()))
                    {
                        broken.push(format!(
                            "audit row of the acknowledged write {path} of session {}/{} lost",
                            t.ns, t.name
                        ));
                    }
                }
            }
            for (path, data) in &t.writes {
                match std::fs::read(ws.join(path)) {
                    Ok(on_disk) if &on_disk == data => {}
                    Ok(_) => broken.push(format!(
                        "acknowledged write {path} of session {}/{} has other bytes",
                        t.ns, t.name
                    )),
                    Err(e) => broken.push(format!(
                        "acknowledged write {path} of session {}/{} lost: {e}",
                        t.ns, t.name
                    )),
                }
            }
        }
        // Last, once the rest holds (it opens a session per Ready snapshot).
        if broken.is_empty() {
            self.check_snapshots(&mut broken).await?;
        }
        Ok(broken)
    }

    /// Removes what the trial made, whatever its verdict.
    async fn cleanup(mut self) {
        for o in &mut self.operators {
            o.process.kill9();
        }
        let lp = ListParams::default().labels(&format!("{SCOPE_LABEL}={}", self.scope));
        for ns in &self.namespaces {
            strip_and_delete(
                Api::<SandboxSession>::namespaced(self.client.clone(), ns),
                &lp,
            )
            .await;
            strip_and_delete(
                Api::<SandboxSnapshot>::namespaced(self.client.clone(), ns),
                &lp,
            )
            .await;
        }
        strip_and_delete(Api::<SandboxHost>::all(self.client.clone()), &lp).await;
        strip_and_delete(Api::<Runtime>::all(self.client.clone()), &lp).await;
        strip_and_delete(Api::<Tombstone>::all(self.client.clone()), &lp).await;
        let nsapi = Api::<Namespace>::all(self.client.clone());
        for ns in std::iter::once(&self.home).chain(&self.namespaces) {
            let _ = nsapi.delete(ns, &DeleteParams::default()).await;
        }
        // Each host's process, containers and folder.
        self.hosts.clear();
    }
}

enum Killed {
    Operator(usize),
    Host(usize),
    /// A host stopped with `kill -STOP`, and its pid.
    Hung(usize, u32),
    Shared(Target),
}

impl Killed {
    /// `hung` for a host stopped with `kill -STOP`, `otherwise` for what was killed.
    fn hung_or(&self, hung: &'static str, otherwise: &'static str) -> &'static str {
        if matches!(self, Killed::Hung(..)) {
            hung
        } else {
            otherwise
        }
    }

    fn describe(&self, t: &Trial) -> String {
        match self {
            Killed::Operator(i) => format!(
                "operator {} (leader)",
                t.operators[*i].identity.as_deref().unwrap_or_default()
            ),
            Killed::Host(i) => format!("sandboxd {}", t.hosts[*i].name),
            Killed::Hung(i, _) => format!("sandboxd {} (hangs)", t.hosts[*i].name),
            Killed::Shared(s) => s.name().to_owned(),
        }
    }
}

async fn strip_and_delete<K>(api: Api<K>, lp: &ListParams)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if let Ok(list) = api.list(lp).await {
        for o in list.items {
            let name = o.name_any();
            let _ = api
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                )
                .await;
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    }
}

/// Runs the pinned kubectl; true when it succeeded.
fn kubectl(args: &[&str], stdin: Option<&str>) -> bool {
    let kubectl = std::env::var("SANDBOXD_KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let Ok(mut child) = Command::new(kubectl)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take())
        && std::io::Write::write_all(&mut pipe, text.as_bytes()).is_err()
    {
        let _ = child.kill();
    }
    child.wait().is_ok_and(|s| s.success())
}

/// The outcome of one trial.
struct Outcome {
    line: String,
    broken: Vec<String>,
}

async fn trial(
    client: &Client,
    run: u32,
    args: &Args,
    dev: &Dev,
    image: &str,
    seed: u64,
) -> Result<(Outcome, Target)> {
    let mut rng = Rng(seed);
    // Consecutive seeds take the targets in turn: ten trials of five targets kill each twice.
    let target = args.targets[(seed % args.targets.len() as u64) as usize];
    let mut t = Trial::new(client, run, seed, image);
    if let Err(e) = t.setup(&mut rng).await {
        t.cleanup().await;
        return Err(e);
    }
    let result = drive(&mut t, args, dev, &mut rng, target).await;
    let outcome = match result {
        Ok(converged) => {
            let (verdict, broken) = match converged {
                Ok(took) => (
                    format!("converged in {:.1} s, ok", took.as_secs_f64()),
                    vec![],
                ),
                Err(broken) => (
                    format!(
                        "NOT converged within {} s: {} broken",
                        args.converge_seconds,
                        broken.len()
                    ),
                    broken,
                ),
            };
            Outcome {
                line: format!(
                    "seed {seed}: {}; workload {}; {verdict}",
                    t.events.join(", "),
                    t.did
                        .iter()
                        .filter(|(k, _)| **k != "idle")
                        .map(|(k, (n, ok))| format!("{k} {ok}/{n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                broken,
            }
        }
        Err(e) => Outcome {
            line: format!("seed {seed}: {}; harness error: {e:#}", t.events.join(", ")),
            broken: vec![format!("harness error: {e:#}")],
        },
    };
    t.cleanup().await;
    Ok((outcome, target))
}

/// The workload with its kill and restart, then the wait for convergence: Ok(time taken) or
/// the invariants still broken at the deadline.
async fn drive(
    t: &mut Trial,
    args: &Args,
    dev: &Dev,
    rng: &mut Rng,
    target: Target,
) -> Result<std::result::Result<Duration, Vec<String>>> {
    // A few sessions first, so writes and runs have somewhere to go.
    for i in 0..3 {
        let ns = t.namespaces[i % 2].clone();
        t.apply_session(&ns, &format!("s-init{i}"));
    }
    // Whether they all run by then or not, the workload goes on.
    let _ = poll(
        Duration::from_secs(90),
        Duration::from_millis(500),
        async || {
            let mut running = 0;
            for s in &t.sessions {
                if let Ok(Some(o)) = Api::<SandboxSession>::namespaced(t.client.clone(), &s.ns)
                    .get_opt(&s.name)
                    .await
                    && o.status.and_then(|st| st.phase) == Some(SessionPhase::Running)
                {
                    running += 1;
                }
            }
            (running == t.sessions.len()).then_some(())
        },
    )
    .await;
    let steps = args.steps.max(1);
    let kill_at = rng.below(steps);
    let restart_at = kill_at + 1 + rng.below(3);
    let mut killed = None;
    for n in 0..steps {
        if n == kill_at {
            // The kill lands while this step's requests are in flight (or just before them).
            let (victim, pid) = t.victim(target, dev, rng).await?;
            let delay = Duration::from_millis(rng.below(400) as u64);
            let started = t.started;
            let hang = target == Target::Hang;
            let killer = tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let at = started.elapsed();
                if hang {
                    process::signal(pid, "STOP")?;
                } else {
                    kill9_and_wait(pid).await?;
                }
                anyhow::Ok(at)
            });
            t.bounded_step(rng, n).await;
            let at = killer.await.context("the killer task")??;
            t.killed(&victim, at);
            killed = Some(victim);
            continue;
        }
        if n == restart_at
            && let Some(k) = killed.take()
        {
            t.restart(k, dev)?;
        }
        t.bounded_step(rng, n).await;
        tokio::time::sleep(Duration::from_millis(200 + rng.below(600) as u64)).await;
    }
    if let Some(k) = killed.take() {
        t.restart(k, dev)?;
    }
    let back = Instant::now();
    let mut broken = vec![];
    let converged = poll(
        Duration::from_secs(args.converge_seconds),
        Duration::from_secs(1),
        async || {
            t.finish_late_runtime().await;
            broken = t.broken().await;
            broken.is_empty().then_some(())
        },
    )
    .await;
    Ok(match converged {
        Ok(()) => Ok(back.elapsed()),
        Err(_) => Err(broken),
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    sandboxd_api::tls::install_provider();
    if args.targets.is_empty() {
        bail!("--targets names nothing to kill");
    }
    let dev = Dev::from_env()?;
    let image = std::env::var("SANDBOXD_BASE_IMAGE")
        .context("SANDBOXD_BASE_IMAGE is not set: eval \"$(make -s env)\" after make up")?;
    let client = Client::try_default()
        .await
        .context("KUBECONFIG: run make up and eval \"$(make -s env)\"")?;
    // The CRDs of this checkout.
    let crds = sandboxd_root().join("charts/sandboxd/crds");
    if !kubectl(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &crds.display().to_string(),
        ],
        None,
    ) {
        bail!("kubectl apply --server-side -f {} failed", crds.display());
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let targets: Vec<&str> = args.targets.iter().map(|t| t.name()).collect();
    println!(
        "faults: seed {seed}, {} trials, targets {}",
        args.trials,
        targets.join(",")
    );
    let started = Instant::now();
    // What makes this run's names its own.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        ^ std::process::id();
    let mut kills: BTreeMap<&str, usize> = BTreeMap::new();
    let mut failed: Vec<(u64, Vec<String>)> = vec![];
    for i in 0..args.trials {
        // Trial i's seed is the run's plus i: `--seed <trial seed> --trials 1` replays it.
        let trial_seed = seed.wrapping_add(i as u64);
        match trial(&client, run, &args, &dev, &image, trial_seed).await {
            Ok((o, target)) => {
                *kills.entry(target.name()).or_default() += 1;
                println!("{}", o.line);
                for b in &o.broken {
                    println!("  broken: {b}");
                }
                if !o.broken.is_empty() {
                    failed.push((trial_seed, o.broken));
                }
            }
            Err(e) => {
                println!("seed {trial_seed}: setup failed: {e:#}");
                failed.push((trial_seed, vec![format!("setup failed: {e:#}")]));
            }
        }
    }
    let per: Vec<String> = kills.iter().map(|(t, n)| format!("{t} {n}")).collect();
    println!(
        "faults: {} trials in {:.0} s, kills: {}; {} failed",
        args.trials,
        started.elapsed().as_secs_f64(),
        per.join(", "),
        failed.len()
    );
    if !failed.is_empty() {
        for (s, broken) in &failed {
            eprintln!("trial seed {s} broke: {}", broken.join("; "));
        }
        eprintln!(
            "faults: {} of {} trials broke an invariant (replay one with --seed <its seed> --trials 1)",
            failed.len(),
            args.trials
        );
        std::process::exit(1);
    }
    Ok(())
}

/// The root of the checkout this binary was built from (its CRDs).
fn sandboxd_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}
