//! Sessions as objects: open (create or find, then wait until Running, in words), list,
//! briefing, and the sandboxd client of one session (its endpoint and the token from its Secret).

use std::io::Write as _;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use sandboxd_api::session::{MemoryOp, SessionView};
use sandboxd_crds::v1alpha1::SandboxSession;
use sandboxd_crds::v1alpha1::session::SessionPhase;
use serde_json::json;

use crate::error::Error;
use crate::operators::{self, Handling};
use crate::render;

/// How long `open` waits for an operator's first report on a session before it asks which
/// operators run and whether one handles it.
pub const PICKUP_SECONDS: u64 = 5;

/// Where commands go: the cluster, the namespace, and an optional sandboxd endpoint override.
#[derive(Clone)]
pub struct Target {
    /// The API server.
    pub client: Client,
    /// The sessions' namespace.
    pub namespace: String,
    /// Reach sandboxd here instead of the session's endpoint.
    pub endpoint: Option<String>,
    /// Verify sandboxd's certificate with this CA instead of the Secret's `ca.crt`.
    pub ca_file: Option<std::path::PathBuf>,
}

/// What reaches a session's sandboxd: its endpoint, the session's id there, and the token (with
/// the Secret it is kept in) and trust of a client.
pub struct Reach {
    /// The sandboxd's base URL.
    pub endpoint: String,
    /// The session's id on that host.
    pub id: String,
    /// The Secret holding the session's token (key `token`).
    pub secret: String,
    /// The session's token.
    pub token: String,
    /// The trust of a client.
    pub trust: sandboxd_api::client::Trust,
}

/// The trust of a sandboxd client: the CA in `ca_file` if given, else `ca` (a Secret's
/// `ca.crt`, from `origin`), else the system's roots.
pub fn trust(
    ca_file: Option<&std::path::Path>,
    ca: Option<&[u8]>,
    origin: &str,
) -> Result<sandboxd_api::client::Trust, Error> {
    let trusted = match ca_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|source| Error::Local {
                path: path.display().to_string(),
                source,
            })?;
            sandboxd_api::client::Trust::ca(Some(&pem), &format!("--ca-file {}", path.display()))
        }
        None => sandboxd_api::client::Trust::ca(ca, origin),
    };
    trusted.map_err(|e| Error::Usage(e.to_string()))
}

impl Target {
    /// The sessions of the namespace.
    pub fn sessions(&self) -> Api<SandboxSession> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The session, or an error naming how to open it.
    pub async fn find(&self, name: &str) -> Result<SandboxSession, Error> {
        self.sessions()
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format!("reading SandboxSession {name}"), e))?
            .ok_or_else(|| Error::NoSession {
                name: name.to_owned(),
                namespace: self.namespace.clone(),
            })
    }

    /// A sandboxd client for the session, with its token: the session must have a sandbox
    /// (Running, Sleeping or Reclaimed: a run wakes it). Returns the client and the session id.
    pub async fn sandbox(
        &self,
        name: &str,
    ) -> Result<(sandboxd_api::client::Client, String), Error> {
        let r = self.reach(name).await?;
        Ok((
            sandboxd_api::client::Client::with_trust(&r.endpoint, &r.token, &r.trust),
            r.id,
        ))
    }

    /// Where the session's sandboxd is and what reaches it: the session must have a sandbox
    /// (as [`Target::sandbox`] says).
    pub async fn reach(&self, name: &str) -> Result<Reach, Error> {
        let s = self.find(name).await?;
        self.usable(&s)?;
        let status = s.status.clone().unwrap_or_default();
        let not_ready = || self.not_ready(&s);
        let endpoint = match (&self.endpoint, &status.endpoint) {
            (Some(e), _) | (None, Some(e)) => e.clone(),
            (None, None) => return Err(not_ready()),
        };
        let secret = status.credentials_secret.clone().ok_or_else(not_ready)?;
        let id = status.session_id.clone().unwrap_or_else(|| name.to_owned());
        let token_error = |message: String| Error::Token {
            name: name.to_owned(),
            namespace: self.namespace.clone(),
            secret: secret.clone(),
            message,
        };
        let found = Api::<Secret>::namespaced(self.client.clone(), &self.namespace)
            .get(&secret)
            .await
            .map_err(|e| token_error(e.to_string()))?;
        let token = found
            .data
            .as_ref()
            .and_then(|d| d.get("token"))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .ok_or_else(|| token_error("it holds no `token` key".into()))?;
        let ca = found
            .data
            .as_ref()
            .and_then(|d| d.get("ca.crt"))
            .map(|b| b.0.clone());
        let trust = trust(
            self.ca_file.as_deref(),
            ca.as_deref(),
            &format!("Secret {}/{secret} key ca.crt", self.namespace),
        )?;
        Ok(Reach {
            endpoint,
            id,
            secret,
            token,
            trust,
        })
    }

    /// Refuses a session in a phase that has no sandbox to talk to.
    fn usable(&self, s: &SandboxSession) -> Result<(), Error> {
        match phase(s) {
            // Rebuilding: the host answers a run with its words (409 session_rebuilding).
            SessionPhase::Running
            | SessionPhase::Sleeping
            | SessionPhase::Reclaimed
            | SessionPhase::Rebuilding => Ok(()),
            SessionPhase::Lost => Err(self.lost(s)),
            SessionPhase::Failed => Err(Error::Failed {
                name: s.name_any(),
                namespace: self.namespace.clone(),
                message: message(s),
            }),
            SessionPhase::Terminating => Err(Error::Terminating {
                name: s.name_any(),
                namespace: self.namespace.clone(),
            }),
            SessionPhase::Pending | SessionPhase::Preparing => Err(self.not_ready(s)),
        }
    }

    fn lost(&self, s: &SandboxSession) -> Error {
        Error::Lost {
            name: s.name_any(),
            namespace: self.namespace.clone(),
            host: s
                .status
                .as_ref()
                .and_then(|st| st.host.clone())
                .unwrap_or_else(|| "(unknown)".into()),
        }
    }

    fn not_ready(&self, s: &SandboxSession) -> Error {
        Error::NotReady {
            name: s.name_any(),
            namespace: self.namespace.clone(),
            tenant: s.spec.tenant.clone(),
            phase: format!("{:?}", phase(s)),
            message: message(s),
        }
    }
}

/// The session's phase (Pending before the operator wrote one).
pub fn phase(s: &SandboxSession) -> SessionPhase {
    s.status
        .as_ref()
        .and_then(|st| st.phase)
        .unwrap_or_default()
}

fn message(s: &SandboxSession) -> String {
    s.status
        .as_ref()
        .and_then(|st| st.message.clone())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "the operator has not reported on it yet".into())
}

/// Progress in words for a phase and the operator's message.
pub fn progress(phase: SessionPhase, message: &str) -> String {
    let detail = if message.is_empty() {
        String::new()
    } else {
        format!(" ({message})")
    };
    match phase {
        SessionPhase::Pending => format!("waiting for a host…{detail}"),
        SessionPhase::Preparing => format!("preparing sandbox…{detail}"),
        SessionPhase::Running => "sandbox is running".into(),
        SessionPhase::Sleeping | SessionPhase::Reclaimed => format!("waking sandbox…{detail}"),
        SessionPhase::Rebuilding => format!("rebuilding sandbox…{detail}"),
        SessionPhase::Lost => format!("workspace lost{detail}"),
        SessionPhase::Failed => format!("failed{detail}"),
        SessionPhase::Terminating => "being deleted…".into(),
    }
}

pub(crate) fn say(line: &str) {
    let mut err = std::io::stderr();
    let _ = writeln!(err, "{line}");
    let _ = err.flush();
}

/// `open`: create the session (or find it), then wait until it runs, saying what happens.
pub async fn open(t: &Target, args: &crate::OpenArgs) -> Result<(), Error> {
    let api = t.sessions();
    let name = &args.name;
    let labels: serde_json::Map<String, serde_json::Value> = args
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let doc = json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
        "metadata": {"name": name, "namespace": t.namespace, "labels": labels},
        "spec": {
            "scope": args.scope.as_str(),
            "tenant": args.tenant,
            "subject": args.subject.clone().unwrap_or_else(|| name.clone()),
            "runtime": args.runtime,
        },
    });
    let session: SandboxSession = serde_json::from_value(doc)
        .map_err(|e| Error::Usage(format!("cannot build the session: {e}")))?;
    let existing = match api.create(&PostParams::default(), &session).await {
        Ok(_) => {
            say(&format!(
                "created SandboxSession {name} in namespace {} (tenant {}, scope {})",
                t.namespace, args.tenant, args.scope
            ));
            None
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let found = t.find(name).await?;
            if found.spec.tenant != args.tenant {
                return Err(Error::OtherTenant {
                    name: name.clone(),
                    actual: found.spec.tenant.clone(),
                    asked: args.tenant.clone(),
                });
            }
            say(&format!(
                "found SandboxSession {name} in namespace {} ({:?})",
                t.namespace,
                phase(&found)
            ));
            Some(found)
        }
        Err(e) => return Err(Error::kube(format!("creating SandboxSession {name}"), e)),
    };
    if let Some(s) = &existing
        && matches!(phase(s), SessionPhase::Sleeping | SessionPhase::Reclaimed)
    {
        // A workspace operation wakes a sleeping sandbox; the operator then reports Running.
        say(&progress(phase(s), ""));
        let (client, id) = t.sandbox(name).await?;
        client.run(&id, "true", None, None, None).await?;
    }
    let running = wait_running(t, args, existing.is_none()).await?;
    let st = running.status.unwrap_or_default();
    say(&format!(
        "sandbox {name} is running on host {} (runtime {})",
        st.host.as_deref().unwrap_or("?"),
        st.runtime.as_deref().unwrap_or("?")
    ));
    let ns = if t.namespace == "default" {
        String::new()
    } else {
        format!(" -n {}", t.namespace)
    };
    println!("next: kubectl sandbox exec {name}{ns} -- <command>");
    println!("      kubectl sandbox cp ./file {name}:file{ns}");
    println!("      kubectl sandbox ls {name}{ns}");
    Ok(())
}

/// Watches the session until it is Running, printing each new phase and message; Lost,
/// Failed and Terminating end the wait with what to do next. When no operator has reported on
/// it after [`PICKUP_SECONDS`], asks which operators run: if none of them handles it, the wait
/// ends with their selectors and the command that would work (a session this run `created` is
/// removed again, so that command can create it anew).
pub async fn wait_running(
    t: &Target,
    args: &crate::OpenArgs,
    created: bool,
) -> Result<SandboxSession, Error> {
    let name = args.name.as_str();
    let mut watch = SessionWatch::new(t, name, Duration::from_secs(args.timeout));
    let pickup = tokio::time::sleep(Duration::from_secs(PICKUP_SECONDS));
    tokio::pin!(pickup);
    let mut asked = false;
    let mut latest: Option<SandboxSession> = None;
    let mut last = String::new();
    loop {
        let s = tokio::select! {
            s = watch.next(&last) => s?,
            () = &mut pickup, if !asked && latest.as_ref().is_none_or(unreported) => {
                asked = true;
                if let Some(s) = &latest {
                    t.picked_up(s, args, created).await?;
                }
                continue;
            }
        };
        let p = phase(&s);
        let m = s
            .status
            .as_ref()
            .and_then(|st| st.message.clone())
            .unwrap_or_default();
        match p {
            SessionPhase::Running => return Ok(s),
            SessionPhase::Lost => return Err(t.lost(&s)),
            SessionPhase::Failed | SessionPhase::Terminating => {
                t.usable(&s)?;
            }
            _ => {}
        }
        let words = progress(p, &m);
        if words != last {
            say(&words);
            last = words;
        }
        latest = Some(s);
    }
}

/// No operator has touched the session: no status, no finalizer.
fn unreported(s: &SandboxSession) -> bool {
    s.status.is_none() && s.finalizers().is_empty()
}

impl Target {
    /// After [`PICKUP_SECONDS`] without a report on `s`: an error naming the running
    /// operators' selectors when none handles it (removing `s` when this run `created` it);
    /// a line said when no operator runs or they cannot be seen (the wait goes on: one may be
    /// starting); nothing when one handles it.
    async fn picked_up(
        &self,
        s: &SandboxSession,
        args: &crate::OpenArgs,
        created: bool,
    ) -> Result<(), Error> {
        let name = &args.name;
        let operators = match operators::handling(&self.client, s).await {
            Handling::Handled => return Ok(()),
            Handling::NoneRunning => {
                say(&format!(
                    "no operator has picked up SandboxSession {name} yet, and none runs (no Lease labelled {}=true was renewed in time): install the chart (`helm install sandboxd charts/sandboxd`); still waiting…",
                    sandboxd_crds::lease::LABEL
                ));
                return Ok(());
            }
            Handling::Unknown(why) => {
                say(&format!(
                    "no operator has picked up SandboxSession {name} yet, and which operators run cannot be seen ({why}); still waiting…"
                ));
                return Ok(());
            }
            Handling::Unhandled(operators) => operators,
        };
        let ns = &self.namespace;
        let labels = operators.first().and_then(operators::label_args);
        let next = match (created, labels) {
            (true, Some(labels)) => {
                self.sessions()
                    .delete(name, &DeleteParams::default())
                    .await
                    .map_err(|e| Error::kube(format!("removing SandboxSession {name}"), e))?;
                format!(
                    "It was removed again; open it with the labels of {}: `kubectl sandbox open {}{labels}`",
                    operators[0].lease,
                    open_command(args, ns)
                )
            }
            (false, Some(labels)) => format!(
                "Label it for {} and wait for it: `kubectl label sbx {name} -n {ns}{} && kubectl sandbox open {}`",
                operators[0].lease,
                labels.replace(" -l ", " "),
                open_command(args, ns)
            ),
            (_, None) => format!(
                "Label it so that a selector matches it (`kubectl label sbx {name} -n {ns} <key>=<value>`), then `kubectl sandbox open {}`",
                open_command(args, ns)
            ),
        };
        Err(Error::Unhandled {
            name: name.clone(),
            namespace: ns.clone(),
            seconds: PICKUP_SECONDS,
            selectors: operators::selectors(&operators),
            next,
        })
    }
}

/// `open`'s arguments as a person types them, in namespace `ns` (`-n` after the tenant).
fn open_command(args: &crate::OpenArgs, ns: &str) -> String {
    let mut c = format!("{} --tenant {} -n {ns}", args.name, args.tenant);
    if args.scope != sandboxd_crds::v1alpha1::session::Scope::Conversation {
        c += &format!(" --scope {}", args.scope);
    }
    if !args.runtime.is_empty() {
        c += &format!(" --runtime {}", args.runtime);
    }
    if let Some(subject) = &args.subject {
        c += &format!(" --subject {subject}");
    }
    for (k, v) in &args.labels {
        c += &format!(" -l {k}={v}");
    }
    c
}

/// `rebuild`: raises the session's `spec.rebuildGeneration` by one, so the operator recreates
/// its container from its Runtime's current image with its spec.resources (the workspace
/// kept), and waits until that rebuild is done: Running (on which image), or Failed with the
/// operator's words.
pub async fn rebuild(t: &Target, name: &str, limit: Duration) -> Result<(), Error> {
    let s = t.find(name).await?;
    let generation = s.spec.rebuild_generation.unwrap_or(0) + 1;
    let patch = json!({
        "metadata": {"resourceVersion": s.resource_version()},
        "spec": {"rebuildGeneration": generation},
    });
    t.sessions()
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .map_err(|e| Error::kube(format!("asking SandboxSession {name} to rebuild"), e))?;
    say(&format!("rebuild {generation} of {name} asked"));
    let mut watch = SessionWatch::new(t, name, limit);
    let mut last = String::new();
    loop {
        let s = watch.next(&last).await?;
        let st = s.status.clone().unwrap_or_default();
        let m = st.message.clone().unwrap_or_default();
        if st.rebuild_generation.unwrap_or(0) >= generation {
            match phase(&s) {
                SessionPhase::Running => {
                    say(&format!(
                        "rebuilt: running on image {}, the workspace kept",
                        st.image.unwrap_or_default()
                    ));
                    return Ok(());
                }
                SessionPhase::Failed => return Err(Error::Usage(m)),
                _ => {}
            }
        }
        let words = progress(phase(&s), &m);
        if words != last {
            say(&words);
            last = words;
        }
    }
}

/// A watch of one session until a deadline: each copy of it as it changes, or the error that
/// ends the wait (the time limit, with the last progress shown; the watch ending or failing).
struct SessionWatch<'a> {
    t: &'a Target,
    name: &'a str,
    limit: Duration,
    deadline: tokio::time::Instant,
    stream: futures::stream::BoxStream<'static, Result<SandboxSession, watcher::Error>>,
}

impl<'a> SessionWatch<'a> {
    fn new(t: &'a Target, name: &'a str, limit: Duration) -> Self {
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let stream = watcher(t.sessions(), config)
            .default_backoff()
            .applied_objects()
            .boxed();
        Self {
            t,
            name,
            limit,
            deadline: tokio::time::Instant::now() + limit,
            stream,
        }
    }

    /// The session's next copy; `last` is the progress last shown, for the timeout's words.
    async fn next(&mut self, last: &str) -> Result<SandboxSession, Error> {
        let name = self.name;
        match tokio::time::timeout_at(self.deadline, self.stream.next()).await {
            Err(_) => Err(Error::Timeout {
                name: name.to_owned(),
                namespace: self.t.namespace.clone(),
                seconds: self.limit.as_secs(),
                last: last.to_owned(),
            }),
            Ok(None) => Err(Error::Usage("the watch of the session ended".into())),
            Ok(Some(Err(e))) => Err(Error::Usage(format!(
                "watching SandboxSession {name} failed: {e}"
            ))),
            Ok(Some(Ok(s))) => Ok(s),
        }
    }
}

/// `pause`: the session asleep with its processes and memory, or the host's refusal.
pub async fn pause(t: &Target, name: &str) -> Result<(), Error> {
    let (client, id) = t.sandbox(name).await?;
    let view = client.pause(&id).await?;
    println!("{}", paused_line(name, &view));
    Ok(())
}

/// `resume`: the session awake, with its memory when it was paused.
pub async fn resume(t: &Target, name: &str) -> Result<(), Error> {
    let (client, id) = t.sandbox(name).await?;
    let view = client.resume(&id).await?;
    println!("{}", resumed_line(name, &view));
    Ok(())
}

/// What a pause left session `name` with, from the host's note of its last checkpoint.
pub fn paused_line(name: &str, view: &SessionView) -> String {
    match &view.memory {
        Some(note) if note.op == MemoryOp::Checkpoint => {
            format!("session {name} paused: {}", note.line())
        }
        _ => format!("session {name} is asleep"),
    }
}

/// What a resume left session `name` with: a wake that restored it says so (the host notes
/// each restore, and each sleep with memory before it).
pub fn resumed_line(name: &str, view: &SessionView) -> String {
    match &view.memory {
        Some(note) if note.op == MemoryOp::Restore => {
            format!("session {name} resumed: {}", note.line())
        }
        _ => format!(
            "session {name} runs: not restored from a checkpoint (it slept without its memory, or was awake)"
        ),
    }
}

/// `briefing`: the paragraph for an agent's instructions.
pub async fn briefing(t: &Target, name: &str) -> Result<(), Error> {
    let s = t.find(name).await?;
    match s.status.as_ref().and_then(|st| st.briefing.clone()) {
        Some(b) if !b.is_empty() => {
            println!("{}", b.trim_end());
            Ok(())
        }
        _ => Err(Error::Usage(format!(
            "session {name} has no briefing yet ({:?}): the operator writes it when the session opens; wait for it with `kubectl sandbox open {name} --tenant {}`",
            phase(&s),
            s.spec.tenant
        ))),
    }
}

/// `list`: sessions with phase, tenant, host, runtime and when they sleep.
pub async fn list(t: &Target, all: bool, selector: Option<&str>) -> Result<(), Error> {
    let api: Api<SandboxSession> = if all {
        Api::all(t.client.clone())
    } else {
        t.sessions()
    };
    let mut lp = ListParams::default();
    if let Some(s) = selector {
        lp = lp.labels(s);
    }
    let items = api
        .list(&lp)
        .await
        .map_err(|e| Error::kube("listing SandboxSessions", e))?
        .items;
    if items.is_empty() {
        let place = if all {
            "any namespace".to_owned()
        } else {
            format!("namespace {}", t.namespace)
        };
        println!(
            "No sandbox sessions in {place}. Open one with `kubectl sandbox open NAME --tenant ORG`."
        );
        return Ok(());
    }
    let now = Timestamp::now();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|s| {
            let st = s.status.clone().unwrap_or_default();
            let sleeps = match (phase(s), st.sleeps_at) {
                (SessionPhase::Running, Some(t)) => render::relative(t.0, now),
                _ => "-".into(),
            };
            let mut row = vec![
                s.name_any(),
                format!("{:?}", phase(s)),
                s.spec.tenant.clone(),
                st.host.unwrap_or_else(|| "-".into()),
                st.runtime.unwrap_or_else(|| "-".into()),
                sleeps,
            ];
            if all {
                row.insert(0, s.namespace().unwrap_or_default());
            }
            row
        })
        .collect();
    let mut header = vec!["NAME", "PHASE", "TENANT", "HOST", "RUNTIME", "SLEEPS"];
    if all {
        header.insert(0, "NAMESPACE");
    }
    print!("{}", render::table(&header, &rows));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_in_words() {
        assert_eq!(
            progress(SessionPhase::Preparing, "runtime demo is being built"),
            "preparing sandbox… (runtime demo is being built)"
        );
        assert_eq!(progress(SessionPhase::Pending, ""), "waiting for a host…");
    }

    #[test]
    fn pause_and_resume_say_what_the_memory_became() {
        let view = |note: Option<(MemoryOp, Option<&str>, &str)>| {
            let mut v: SessionView = serde_json::from_value(json!({
                "id": "s", "tenant": "t", "runtime": "secure", "image": "i", "state": "stopped",
                "created_at": "2026-01-01T00:00:00Z", "last_activity_at": "2026-01-01T00:00:00Z",
                "runs_in_flight": 0, "workspace_exists": true
            }))
            .expect("a view");
            v.memory = note.map(|(op, error, outcome)| sandboxd_api::session::MemoryNote {
                op,
                kept: error.is_none(),
                outcome: outcome.to_owned(),
                error: error.map(str::to_owned),
                at: "2026-01-01T00:00:01Z".to_owned(),
            });
            v
        };
        assert_eq!(
            paused_line(
                "s",
                &view(Some((MemoryOp::Checkpoint, None, "asleep with its memory")))
            ),
            "session s paused: asleep with its memory"
        );
        assert_eq!(paused_line("s", &view(None)), "session s is asleep");
        assert_eq!(
            resumed_line(
                "s",
                &view(Some((
                    MemoryOp::Restore,
                    Some("damaged"),
                    "awake fresh with its files"
                )))
            ),
            "session s resumed: awake fresh with its files: the restore failed: damaged"
        );
        assert_eq!(
            resumed_line(
                "s",
                &view(Some((MemoryOp::Checkpoint, None, "asleep with its memory")))
            ),
            "session s runs: not restored from a checkpoint (it slept without its memory, or was awake)"
        );
    }
}
