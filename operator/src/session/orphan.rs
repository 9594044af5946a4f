//! A session left behind by its namespace: the namespace is gone, or was made again after the
//! session. Kubernetes' namespace controller deletes a namespace's objects kind by kind, as far
//! as API discovery lists them; right after an API server restart the custom kinds can be
//! missing from discovery for a moment, and the namespace then goes with its sessions still
//! stored. Nobody can see or delete such a session with a namespace-scoped role, and a namespace
//! made again under the same name would inherit a previous owner's sandbox. So it is deleted like
//! any other session: its Tombstone destroys the sandbox, and the finalizer is released.
//!
//! The operator keeps a metadata-only cache of namespaces; a session is only ever deleted for
//! this after a direct read of its namespace agrees with the cache.

use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use sandboxd_crds::v1alpha1::SandboxSession;
use tracing::warn;

use super::step::session_api;
use crate::context::Context;
use crate::error::Error;

/// How long a reconcile waits for the namespace cache's first list before it goes on without
/// (then no session is taken for an orphan until the cache is filled).
const CACHE_WAIT: Duration = Duration::from_secs(10);

/// Why a session's namespace no longer holds it, if it does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Orphaned {
    /// The namespace does not exist.
    NamespaceGone,
    /// The namespace was made after the session: the session is a previous namespace's.
    NamespaceRemade,
}

impl std::fmt::Display for Orphaned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NamespaceGone => "its namespace no longer exists",
            Self::NamespaceRemade => "its namespace was deleted and made again after it",
        })
    }
}

/// What the namespace `ns` (as read, or `None` when absent) says of session `s`.
pub fn judge(s: &SandboxSession, ns: Option<&ObjectMeta>) -> Option<Orphaned> {
    let Some(ns) = ns else {
        return Some(Orphaned::NamespaceGone);
    };
    match (&ns.creation_timestamp, &s.metadata.creation_timestamp) {
        // Whole seconds on both: only a namespace made in a later second is surely newer.
        (Some(made), Some(session)) if made.0 > session.0 => Some(Orphaned::NamespaceRemade),
        _ => None,
    }
}

/// Deletes `s` if its namespace no longer holds it; true when it did (the delete's own event
/// brings the session back for its cleanup).
pub(super) async fn reap(s: &SandboxSession, ctx: &Context) -> Result<bool, Error> {
    let Some(store) = ctx.namespaces.get() else {
        return Ok(false);
    };
    let ns = s.namespace().unwrap_or_default();
    let ready = match store.wait_until_ready().now_or_never() {
        Some(r) => r.is_ok(),
        None => tokio::time::timeout(CACHE_WAIT, store.wait_until_ready())
            .await
            .is_ok_and(|r| r.is_ok()),
    };
    if !ready {
        return Ok(false);
    }
    let cached = store.get(&ObjectRef::new(&ns));
    if judge(s, cached.as_ref().map(|n| &n.metadata)).is_none() {
        return Ok(false);
    }
    // The cache may lag: the API server decides.
    let read = Api::<Namespace>::all(ctx.client.clone())
        .get_metadata_opt(&ns)
        .await?;
    let Some(why) = judge(s, read.as_ref().map(|n| &n.metadata)) else {
        return Ok(false);
    };
    warn!(session = %s.name_any(), namespace = %ns, %why, "deleting a session its namespace left behind");
    let params = DeleteParams {
        preconditions: s.uid().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match session_api(s, ctx).delete(&s.name_any(), &params).await {
        Ok(_) => Ok(true),
        // Gone already, or another object of that name now: nothing of this one to delete.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(true),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Option<Time> {
        Some(Time(Timestamp::from_second(secs).expect("a valid time")))
    }

    fn session(made: i64) -> SandboxSession {
        let mut s: SandboxSession = serde_json::from_value(serde_json::json!({
            "apiVersion": "sandboxd.dev/v1alpha1",
            "kind": "SandboxSession",
            "metadata": {"name": "s"},
            "spec": {"tenant": "t", "scope": "conversation", "subject": "c"},
        }))
        .expect("a session");
        s.metadata.namespace = Some("team".into());
        s.metadata.creation_timestamp = at(made);
        s
    }

    fn namespace(made: i64) -> ObjectMeta {
        ObjectMeta {
            name: Some("team".into()),
            creation_timestamp: at(made),
            ..Default::default()
        }
    }

    #[test]
    fn a_session_in_its_own_namespace_is_kept() {
        assert_eq!(judge(&session(100), Some(&namespace(50))), None);
        // Made in the same second: not surely newer, so kept.
        assert_eq!(judge(&session(100), Some(&namespace(100))), None);
    }

    #[test]
    fn a_session_whose_namespace_is_gone_is_an_orphan() {
        assert_eq!(judge(&session(100), None), Some(Orphaned::NamespaceGone));
    }

    #[test]
    fn a_session_older_than_its_namespace_is_a_previous_namespaces() {
        assert_eq!(
            judge(&session(100), Some(&namespace(101))),
            Some(Orphaned::NamespaceRemade)
        );
    }
}
