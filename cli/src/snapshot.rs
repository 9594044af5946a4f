//! `snapshot` and `fork`: a SandboxSnapshot of a session, waited for until it is Ready; a new
//! session opened from a fresh snapshot of another, waited for until it runs.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, PostParams};
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_crds::v1alpha1::{SandboxSnapshot, SnapshotPhase};
use serde_json::json;

use crate::error::Error;
use crate::session::{Target, say};

/// How often a snapshot is looked at while it is taken.
const POLL: Duration = Duration::from_millis(300);

fn snapshots(t: &Target) -> Api<SandboxSnapshot> {
    Api::namespaced(t.client.clone(), &t.namespace)
}

/// A snapshot name for `session` now: `<session>-<yyyymmdd-hhmmss>`.
fn default_name(session: &str) -> String {
    let now = Timestamp::now().strftime("%Y%m%d-%H%M%S").to_string();
    let keep = session.len().min(253 - now.len() - 1);
    format!("{}-{now}", session[..keep].trim_end_matches(['-', '.']))
}

/// Creates SandboxSnapshot `name` of session `session` and waits until it is Ready (or the
/// reason it failed); returns it.
pub async fn take(
    t: &Target,
    session: &str,
    name: Option<&str>,
    limit: Duration,
) -> Result<SandboxSnapshot, Error> {
    // The session must exist: its absence is said as for every command. Its labels go on the
    // snapshot, so the operator that handles the session (its --selector) handles it too.
    let source = t.find(session).await?;
    let name = name.map_or_else(|| default_name(session), str::to_owned);
    let doc = json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSnapshot",
        "metadata": {"name": name, "namespace": t.namespace, "labels": source.labels()},
        "spec": {"session": session},
    });
    let snapshot: SandboxSnapshot = serde_json::from_value(doc)
        .map_err(|e| Error::Usage(format!("cannot build the snapshot: {e}")))?;
    snapshots(t)
        .create(&PostParams::default(), &snapshot)
        .await
        .map_err(|e| Error::kube(format!("creating SandboxSnapshot {name}"), e))?;
    say(&format!("snapshot {name} of {session} asked"));
    let deadline = tokio::time::Instant::now() + limit;
    let mut last = String::new();
    loop {
        let s = snapshots(t)
            .get(&name)
            .await
            .map_err(|e| Error::kube(format!("reading SandboxSnapshot {name}"), e))?;
        let st = s.status.clone().unwrap_or_default();
        let message = st.message.clone().unwrap_or_default();
        match st.phase {
            Some(SnapshotPhase::Ready) => {
                say(&format!("snapshot {name} is ready: {message}"));
                return Ok(s);
            }
            Some(SnapshotPhase::Failed) => {
                return Err(Error::Usage(format!("snapshot {name} failed: {message}")));
            }
            _ if !message.is_empty() && message != last => {
                say(&message);
                last = message;
            }
            _ => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Usage(format!(
                "snapshot {name} was not ready after {} s (it goes on; kubectl get sandboxsnapshot {name} shows it): {last}",
                limit.as_secs()
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `snapshot SESSION [NAME]`.
pub async fn snapshot(
    t: &Target,
    session: &str,
    name: Option<&str>,
    limit: Duration,
) -> Result<(), Error> {
    let s = take(t, session, name, limit).await?;
    println!("{}", s.name_any());
    Ok(())
}

/// `fork SESSION NEW`: a snapshot of SESSION (named NEW), then the SandboxSession NEW with
/// SESSION's spec opened from it, waited for until it runs.
pub async fn fork(t: &Target, session: &str, new: &str, limit: Duration) -> Result<(), Error> {
    let source = t.find(session).await?;
    if t.sessions()
        .get_opt(new)
        .await
        .map_err(|e| Error::kube(format!("reading SandboxSession {new}"), e))?
        .is_some()
    {
        return Err(Error::Usage(format!(
            "SandboxSession {new} exists already in namespace {}: a fork opens a new session",
            t.namespace
        )));
    }
    let snap = take(t, session, Some(new), limit).await?;
    let mut spec = serde_json::to_value(&source.spec)
        .map_err(|e| Error::Usage(format!("cannot copy the spec of {session}: {e}")))?;
    if let Some(spec) = spec.as_object_mut() {
        // Placed anew (any host with room), rebuilt from generation 0, from the snapshot.
        spec.remove("host");
        spec.remove("rebuildGeneration");
        spec.insert("subject".to_owned(), json!(new));
        spec.insert("from".to_owned(), json!({"snapshot": snap.name_any()}));
    }
    let doc = json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
        "metadata": {"name": new, "namespace": t.namespace, "labels": source.labels()},
        "spec": spec,
    });
    let session_obj: sandboxd_crds::v1alpha1::SandboxSession = serde_json::from_value(doc)
        .map_err(|e| Error::Usage(format!("cannot build the session: {e}")))?;
    t.sessions()
        .create(&PostParams::default(), &session_obj)
        .await
        .map_err(|e| Error::kube(format!("creating SandboxSession {new}"), e))?;
    say(&format!(
        "created SandboxSession {new} from snapshot {new} of {session}"
    ));
    let args = crate::OpenArgs {
        name: new.to_owned(),
        tenant: source.spec.tenant.clone(),
        scope: source.spec.scope,
        runtime: source.spec.runtime.clone(),
        subject: Some(new.to_owned()),
        labels: Vec::new(),
        timeout: limit.as_secs(),
    };
    let running = crate::session::wait_running(t, &args, true).await?;
    let st = running.status.unwrap_or_default();
    say(&format!(
        "fork {new} of {session} is running on host {}",
        st.host.as_deref().unwrap_or("?")
    ));
    Ok(())
}

/// `restore SESSION [--snapshot NAME]`: a Lost session opened again from its newest snapshot
/// (or the one named) on another host; waits until it runs.
pub async fn restore(
    t: &Target,
    session: &str,
    snapshot: Option<&str>,
    limit: Duration,
) -> Result<(), Error> {
    let s = t.find(session).await?;
    let st = s.status.clone().unwrap_or_default();
    if st.phase != Some(SessionPhase::Lost) {
        return Err(Error::Usage(format!(
            "SandboxSession {session} is {}, not Lost: restore opens a Lost session again from a snapshot (kubectl sandbox fork {session} NEW copies one that is not)",
            st.phase
                .map_or_else(|| "not opened yet".to_owned(), |p| format!("{p:?}"))
        )));
    }
    let (name, taken) = match snapshot {
        Some(name) => {
            let snap = snapshots(t)
                .get_opt(name)
                .await
                .map_err(|e| Error::kube(format!("reading SandboxSnapshot {name}"), e))?
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "no SandboxSnapshot {name} in namespace {}",
                        t.namespace
                    ))
                })?;
            let taken = snap.status.and_then(|st| st.taken_at);
            (name.to_owned(), taken)
        }
        None => match st.newest_snapshot {
            Some(newest) => (newest.name, newest.taken_at),
            None => {
                return Err(Error::Usage(format!(
                    "SandboxSession {session} has no Ready snapshot to restore from: its workspace is gone with nothing to open it from"
                )));
            }
        },
    };
    let patch = json!({"spec": {"restore": {"snapshot": name}}});
    t.sessions()
        .patch(
            session,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .map_err(|e| Error::kube(format!("asking SandboxSession {session} to restore"), e))?;
    let age = taken.map_or_else(
        || "of unknown age".to_owned(),
        |t| format!("taken {}", crate::render::relative(t.0, Timestamp::now())),
    );
    say(&format!(
        "restoring {session} from snapshot {name}, {age}: what was written after it is gone"
    ));
    let args = crate::OpenArgs {
        name: session.to_owned(),
        tenant: s.spec.tenant.clone(),
        scope: s.spec.scope,
        runtime: s.spec.runtime.clone(),
        subject: Some(s.spec.subject.clone()),
        labels: Vec::new(),
        timeout: limit.as_secs(),
    };
    let running = crate::session::wait_running(t, &args, false).await?;
    let st = running.status.unwrap_or_default();
    say(&format!(
        "{session} is running again on host {}, from snapshot {name}",
        st.host.as_deref().unwrap_or("?")
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_name_is_the_session_and_the_time() {
        let n = default_name("conv-1");
        assert!(
            n.starts_with("conv-1-") && n.len() == "conv-1-".len() + 15,
            "{n}"
        );
        let long = default_name(&"a".repeat(253));
        assert_eq!(long.len(), 253);
    }
}
