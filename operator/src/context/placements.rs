//! How many sessions the session cache shows placed on each host, kept from the watch's events
//! so that placing a session reads one count per host instead of walking every session (a walk
//! per open made opening N sessions cost N² and showed at 1,000 sessions).

use std::collections::HashMap;

use kube::ResourceExt;
use kube::runtime::watcher::Event;
use sandboxd_crds::v1alpha1::SandboxSession;

/// Annotation with the host a session is placed on, written with the finalizer before the open
/// (the session controller's `claim`).
pub const HOST_ANNOTATION: &str = "sandboxd.dev/host";

/// The host a session is placed on: the status's, or the one recorded by the session
/// controller's `claim` before the status says so.
pub fn placed_host(s: &SandboxSession) -> Option<&str> {
    s.status
        .as_ref()
        .and_then(|st| st.host.as_deref())
        .or_else(|| s.annotations().get(HOST_ANNOTATION).map(String::as_str))
}

/// The host of every placed session in the cache, and the count per host.
#[derive(Debug, Default)]
pub struct Placements {
    by_session: HashMap<String, String>,
    per_host: HashMap<String, usize>,
    /// A relist in progress: what it has shown so far (it replaces the rest when done).
    relist: Option<HashMap<String, String>>,
}

impl Placements {
    /// Follows one event of the session watch, as the reflector's store does.
    pub fn observe(&mut self, event: &Event<SandboxSession>) {
        match event {
            Event::Init => self.relist = Some(HashMap::new()),
            Event::InitApply(s) => {
                if let (Some(relist), Some(host)) = (self.relist.as_mut(), placed_host(s)) {
                    relist.insert(key(s), host.to_owned());
                }
            }
            Event::InitDone => {
                if let Some(relist) = self.relist.take() {
                    self.per_host.clear();
                    for host in relist.values() {
                        *self.per_host.entry(host.clone()).or_default() += 1;
                    }
                    self.by_session = relist;
                }
            }
            Event::Apply(s) => match placed_host(s) {
                Some(host) => self.set(key(s), host),
                None => self.remove(&key(s)),
            },
            Event::Delete(s) => self.remove(&key(s)),
        }
    }

    /// The sessions the cache shows placed on `host`.
    pub fn on(&self, host: &str) -> usize {
        self.per_host.get(host).copied().unwrap_or(0)
    }

    fn set(&mut self, session: String, host: &str) {
        if self.by_session.get(&session).is_some_and(|h| h == host) {
            return;
        }
        self.remove(&session);
        *self.per_host.entry(host.to_owned()).or_default() += 1;
        self.by_session.insert(session, host.to_owned());
    }

    fn remove(&mut self, session: &str) {
        let Some(host) = self.by_session.remove(session) else {
            return;
        };
        if let Some(n) = self.per_host.get_mut(&host) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_host.remove(&host);
            }
        }
    }
}

fn key(s: &SandboxSession) -> String {
    format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use sandboxd_crds::v1alpha1::SandboxSessionStatus;

    fn session(name: &str, annotated: Option<&str>, status: Option<&str>) -> SandboxSession {
        let mut s: SandboxSession = serde_json::from_value(serde_json::json!({
            "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"scope": "conversation", "tenant": "org-1", "subject": name},
        }))
        .expect("session");
        s.metadata = ObjectMeta {
            annotations: annotated.map(|h| {
                [(HOST_ANNOTATION.to_owned(), h.to_owned())]
                    .into_iter()
                    .collect()
            }),
            ..s.metadata
        };
        s.status = status.map(|h| SandboxSessionStatus {
            host: Some(h.to_owned()),
            ..Default::default()
        });
        s
    }

    #[test]
    fn counts_follow_claims_moves_deletes_and_relists() {
        let mut p = Placements::default();
        p.observe(&Event::Init);
        p.observe(&Event::InitApply(session("a", Some("h1"), None)));
        p.observe(&Event::InitApply(session("b", None, Some("h2"))));
        p.observe(&Event::InitApply(session("unplaced", None, None)));
        assert_eq!(
            (p.on("h1"), p.on("h2")),
            (0, 0),
            "counted only when the relist is done"
        );
        p.observe(&Event::InitDone);
        assert_eq!((p.on("h1"), p.on("h2"), p.on("h3")), (1, 1, 0));

        // A claim, the same claim seen again, its status written: counted once.
        p.observe(&Event::Apply(session("c", Some("h1"), None)));
        p.observe(&Event::Apply(session("c", Some("h1"), None)));
        p.observe(&Event::Apply(session("c", Some("h1"), Some("h1"))));
        assert_eq!(p.on("h1"), 2);
        p.observe(&Event::Delete(session("a", Some("h1"), Some("h1"))));
        p.observe(&Event::Delete(session("never-seen", Some("h1"), None)));
        assert_eq!(p.on("h1"), 1);

        // A relist replaces what was known: "b" and "c" went while the watch was down.
        p.observe(&Event::Init);
        p.observe(&Event::InitApply(session("d", Some("h3"), None)));
        assert_eq!(
            p.on("h1"),
            1,
            "the old counts hold until the relist is done"
        );
        p.observe(&Event::InitDone);
        assert_eq!((p.on("h1"), p.on("h2"), p.on("h3")), (0, 0, 1));
    }
}
