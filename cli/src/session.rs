//! Sessions as objects: open (create or find, then wait until Running, in words), list,
//! briefing, and the sandboxd client of one session (its endpoint and the token from its Secret).

use std::io::Write as _;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use sandboxd_crds::v1alpha1::SandboxSession;
use sandboxd_crds::v1alpha1::session::SessionPhase;
use serde_json::json;

use crate::error::Error;
use crate::render;

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
        Ok((
            sandboxd_api::client::Client::with_trust(&endpoint, &token, &trust),
            id,
        ))
    }

    /// Refuses a session in a phase that has no sandbox to talk to.
    fn usable(&self, s: &SandboxSession) -> Result<(), Error> {
        match phase(s) {
            SessionPhase::Running | SessionPhase::Sleeping | SessionPhase::Reclaimed => Ok(()),
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
        SessionPhase::Lost => format!("workspace lost{detail}"),
        SessionPhase::Failed => format!("failed{detail}"),
        SessionPhase::Terminating => "being deleted…".into(),
    }
}

fn say(line: &str) {
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
    let running = wait_running(t, name, Duration::from_secs(args.timeout)).await?;
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
/// Failed and Terminating end the wait with what to do next.
pub async fn wait_running(
    t: &Target,
    name: &str,
    limit: Duration,
) -> Result<SandboxSession, Error> {
    let api = t.sessions();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(api, config)
        .default_backoff()
        .applied_objects()
        .boxed();
    let mut last = String::new();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let next = tokio::time::timeout_at(deadline, stream.next()).await;
        let s = match next {
            Err(_) => {
                return Err(Error::Timeout {
                    name: name.to_owned(),
                    namespace: t.namespace.clone(),
                    seconds: limit.as_secs(),
                    last,
                });
            }
            Ok(None) => return Err(Error::Usage("the watch of the session ended".into())),
            Ok(Some(Err(e))) => {
                return Err(Error::Usage(format!(
                    "watching SandboxSession {name} failed: {e}"
                )));
            }
            Ok(Some(Ok(s))) => s,
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
}
