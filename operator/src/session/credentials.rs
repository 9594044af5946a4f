//! Step 3b, credentials: an open session's egress credentials kept current on its host. The
//! follow step has just read the session from its host, whose view says which set it holds
//! (`credentials_version`, none after a sandboxd restart: they live in its memory only); when
//! that is not the set wanted now ([`crate::credentials::wanted`]: its Runtime's, then its own,
//! values read from the cached labelled Secrets), the whole set is handed over again (`PUT
//! /v1/sessions/{id}/credentials`). A session without credentials costs nothing: no Secret is
//! looked at and nothing is sent, unless its host still holds some (they were removed), which
//! then gets an empty set.
//!
//! Condition `CredentialsApplied` says how it stands; `status.credentials` what was handed
//! over. Neither, nor any log line or event, ever holds a value: they name the Secrets.

use std::time::Duration;

use futures::FutureExt as _;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use sandboxd_api::client::{Client as HostClient, ClientError};
use sandboxd_api::egress::CredentialSet;
use sandboxd_api::session::SessionView;
use sandboxd_catalog::egress::Egress;
use sandboxd_crds::v1alpha1::condition::{ConditionType, SessionReason};
use sandboxd_crds::v1alpha1::{Runtime, SandboxSession, SandboxSessionStatus};
use tracing::{info, warn};

use crate::conditions;
use crate::context::Context;
use crate::credentials::{check, declared, empty_version, status_of, wanted};
use crate::egress::CEILING_ANNOTATION;

/// How soon a session is looked at again after its host could not be handed its credentials,
/// or before the Secret cache is filled.
const RETRY: Duration = Duration::from_secs(2);

/// Brings the credentials host `host` holds for open session `id` up to date with what the
/// session should have. Returns a sooner look when it could not be done now.
#[allow(clippy::too_many_arguments)]
pub(super) async fn keep_current(
    s: &SandboxSession,
    ctx: &Context,
    status: &mut SandboxSessionStatus,
    client: &HostClient,
    host: &str,
    runtime: Option<&Runtime>,
    id: &str,
    view: &SessionView,
) -> Option<Duration> {
    let generation = s.metadata.generation;
    let declared = declared(runtime, s, &ctx.namespace);
    let held = view.credentials_version.as_deref();
    if declared.is_empty() {
        status.credentials.clear();
        conditions::clear(&mut status.conditions, ConditionType::CredentialsApplied);
        if held.is_none_or(|v| v == empty_version()) {
            return None;
        }
        // Removed while the host still holds some: it is handed none.
        let none = CredentialSet {
            version: empty_version(),
            credentials: Vec::new(),
        };
        return match client.put_credentials(id, &none).await {
            Ok(_) => {
                info!(session = %s.name_any(), %host, "egress credentials removed from the host");
                None
            }
            Err(e) => {
                warn!(session = %s.name_any(), %host, error = %e, "the host's egress credentials could not be removed; tried again");
                Some(RETRY)
            }
        };
    }
    if !ctx.config.egress_credentials {
        let m = "this operator runs without egress credentials (installed with operator.egressCredentials.enabled=false, or started with --egress-credentials=false): the session's credentials are not handed to its host, and requests to their hosts go out without them";
        refuse(s, ctx, status, SessionReason::CredentialsUnsupported, m).await;
        return None;
    }
    let store = ctx.credential_secrets.get()?;
    if store
        .wait_until_ready()
        .now_or_never()
        .is_none_or(|r| r.is_err())
    {
        // Not filled yet: every Secret would look missing.
        return Some(RETRY);
    }
    let bound = bound(s, runtime, status);
    let labelled: Vec<(String, &Egress)> = bound.iter().map(|(w, p)| (w.clone(), p)).collect();
    if let Err(m) = check(&declared, &labelled) {
        let m = format!("{m}; host {host} keeps the credentials it held");
        refuse(s, ctx, status, SessionReason::CredentialInvalid, &m).await;
        return None;
    }
    let set = wanted(&declared, |ns, name| {
        store.get(&ObjectRef::new(name).within(ns))
    });
    if held != Some(set.version.as_str()) {
        match client.put_credentials(id, &set).await {
            Ok(_) => {
                let sources: Vec<String> = set
                    .credentials
                    .iter()
                    .map(|c| format!("{} ({})", c.host, c.source))
                    .collect();
                let note = format!(
                    "host {host} was handed {} egress credential(s), version {}: {}",
                    set.credentials.len(),
                    set.version,
                    sources.join("; ")
                );
                info!(session = %s.name_any(), %host, version = %set.version, credentials = set.credentials.len(), "egress credentials handed over");
                ctx.event(
                    s,
                    EventType::Normal,
                    "CredentialsApplied",
                    "Credentials",
                    note,
                )
                .await;
            }
            // Destroyed on its host meanwhile: the follow reports it.
            Err(ClientError::NoSuchSession(_)) => return None,
            Err(ClientError::VersionMismatch { .. }) => {
                let m = format!(
                    "host {host} does not support egress credentials (its sandboxd does not serve PUT /v1/sessions/{{id}}/credentials): upgrade sandboxd on it; requests to the credentials' hosts go out without them"
                );
                refuse(s, ctx, status, SessionReason::CredentialsUnsupported, &m).await;
                return None;
            }
            Err(e @ ClientError::Transport { .. }) => {
                warn!(session = %s.name_any(), %host, error = %e, "the host could not be handed the egress credentials; tried again");
                return Some(RETRY);
            }
            Err(e) => {
                let m = format!(
                    "host {host} refused the egress credentials: {e}; it keeps those it held"
                );
                refuse(s, ctx, status, SessionReason::CredentialInvalid, &m).await;
                return Some(Duration::from_secs(ctx.config.follow_seconds));
            }
        }
    }
    status.credentials = status_of(&set);
    let missing: Vec<&str> = set
        .credentials
        .iter()
        .filter_map(|c| c.missing.as_deref())
        .collect();
    if missing.is_empty() {
        conditions::set(
            &mut status.conditions,
            ConditionType::CredentialsApplied,
            true,
            SessionReason::CredentialsApplied,
            &format!(
                "host {host} holds the session's {} egress credential(s) (version {})",
                set.credentials.len(),
                set.version
            ),
            generation,
        );
    } else {
        let m = format!(
            "host {host} holds the session's {} egress credential(s), {} of them without a value: {}; requests to their hosts are answered 502 until that is fixed",
            set.credentials.len(),
            missing.len(),
            missing.join("; ")
        );
        refuse(s, ctx, status, SessionReason::CredentialSecretMissing, &m).await;
    }
    None
}

/// Sets `CredentialsApplied` False with `reason` and `m`; a Warning event when that is new.
async fn refuse(
    s: &SandboxSession,
    ctx: &Context,
    status: &mut SandboxSessionStatus,
    reason: SessionReason,
    m: &str,
) {
    let before = conditions::get(&status.conditions, ConditionType::CredentialsApplied)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
    conditions::set(
        &mut status.conditions,
        ConditionType::CredentialsApplied,
        false,
        reason,
        m,
        s.metadata.generation,
    );
    if before != Some(("False".to_owned(), reason.as_str().to_owned(), m.to_owned())) {
        warn!(session = %s.name_any(), reason = reason.as_str(), message = m, "egress credentials not applied");
        ctx.event(
            s,
            EventType::Warning,
            reason.as_str(),
            "Credentials",
            m.to_owned(),
        )
        .await;
    }
}

/// The policies the session's connections are bound by, each named for messages: its
/// Runtime's, and what its host was sent beyond it (its own spec.egress, its namespace's
/// ceiling; `status.egress`, else its spec.egress).
fn bound(
    s: &SandboxSession,
    runtime: Option<&Runtime>,
    status: &SandboxSessionStatus,
) -> Vec<(String, Egress)> {
    let mut out = Vec::new();
    if let Some(rt) = runtime {
        let own = rt.spec.egress.as_ref().map(Egress::from);
        out.push((
            format!("Runtime '{}'", rt.name_any()),
            Egress::effective(rt.spec.needs_network, own.as_ref()),
        ));
    }
    let spec = s.spec.egress.as_ref().map(Egress::from);
    let sent: Vec<Egress> = match &status.egress {
        Some(e) => e.policies.iter().map(Egress::from).collect(),
        None => spec.clone().into_iter().collect(),
    };
    let namespace = s.namespace().unwrap_or_default();
    for p in sent {
        let whose = if Some(&p) == spec.as_ref() {
            "this session's spec.egress".to_owned()
        } else {
            format!(
                "the egress ceiling of namespace '{namespace}' (annotation {CEILING_ANNOTATION})"
            )
        };
        out.push((whose, p));
    }
    out
}
