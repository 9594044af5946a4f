//! Step 2b, egress: an open session's egress policies kept up to date on its host. When its
//! `spec.egress` or its namespace's ceiling (or its Runtime) changed since its host was last
//! sent them, [`crate::egress::decide`] looks at them again: admitted, the session is opened
//! again with the new policies (same name, tenant, runtime and owner), which its host puts in
//! force from the next connection, the sandbox untouched; refused, the policies sent before
//! stay in force and condition `EgressApplied` False says why (the session is not failed).
//! What was sent is kept in `status.egress`, so it is sent only on a change.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use sandboxd_api::client::ClientError;
use sandboxd_api::session::OpenRequest;
use sandboxd_catalog::egress::Egress;
use sandboxd_crds::v1alpha1::condition::{ConditionType, SessionReason};
use sandboxd_crds::v1alpha1::session::SessionEgress;
use sandboxd_crds::v1alpha1::{SandboxSession, SandboxSessionStatus};
use tracing::{Instrument as _, info, warn};

use super::place::{Placed, egress_policies};
use super::step::host_unreachable;
use crate::conditions;
use crate::context::Context;
use crate::egress::{Change, change};
use crate::error::Error;

/// Brings the host's egress policies of open session `id` up to date, as [`change`] decides.
/// Never stops the reconcile: a host that does not answer is tried again at the next one.
pub(super) async fn keep_current(
    s: &SandboxSession,
    ctx: &Context,
    status: &mut SandboxSessionStatus,
    placed: &Placed,
    id: &str,
    uid: Option<&str>,
) -> Result<(), Error> {
    if status.session_id.is_none() {
        return Ok(());
    }
    let generation = s.metadata.generation;
    let decided = egress_policies(s, ctx, placed.runtime.as_ref()).await?;
    let sent: Option<Vec<Egress>> = status
        .egress
        .as_ref()
        .map(|e| e.policies.iter().map(Egress::from).collect());
    match change(decided, sent.as_deref()) {
        Change::Keep => {
            // A refusal undone (the spec or the ceiling went back to what the host enforces).
            if conditions::get(&status.conditions, ConditionType::EgressApplied)
                .is_some_and(|c| c.status == "False")
            {
                conditions::set(
                    &mut status.conditions,
                    ConditionType::EgressApplied,
                    true,
                    SessionReason::EgressApplied,
                    &applied_message(&placed.name, sent.as_deref().unwrap_or_default()),
                    generation,
                );
            }
        }
        Change::Send(policies) => {
            let call =
                tracing::info_span!("host call", host = %placed.name, route = "POST /v1/sessions");
            let sending = placed
                .client
                .with_deadline(Duration::from_secs(ctx.config.host_open_seconds.max(1)))
                .open_request(&OpenRequest {
                    name: id.to_owned(),
                    tenant: s.spec.tenant.clone(),
                    runtime: placed.alias.clone(),
                    limits: super::rebuild::asked(s.spec.resources.as_ref()),
                    owner: uid.map(str::to_owned),
                    egress: policies.clone(),
                    from_snapshot: None,
                })
                .instrument(call)
                .await;
            match sending {
                Ok(_) => {
                    let m = applied_message(&placed.name, &policies);
                    info!(session = %s.name_any(), host = %placed.name, policies = %m, "egress policies sent");
                    status.egress = Some(SessionEgress {
                        policies: policies.iter().map(Into::into).collect(),
                        sent_at: Some(Time(Timestamp::now())),
                        observed_generation: generation,
                    });
                    conditions::set(
                        &mut status.conditions,
                        ConditionType::EgressApplied,
                        true,
                        SessionReason::EgressApplied,
                        &m,
                        generation,
                    );
                }
                // Destroyed on its host meanwhile: the follow reports it.
                Err(ClientError::NoSuchSession(_)) => {}
                Err(e @ (ClientError::Transport { .. } | ClientError::VersionMismatch { .. })) => {
                    host_unreachable(status, &e.to_string(), generation);
                }
                Err(e) => {
                    warn!(session = %s.name_any(), host = %placed.name, error = %e, "the host refused the session's new egress policies; tried again at the next reconcile");
                }
            }
        }
        Change::Refuse(refusal) => {
            let kept = applied_message(&placed.name, sent.as_deref().unwrap_or_default());
            let m = format!(
                "{}; the policy sent before stays in force ({kept})",
                refusal.message
            );
            let before = conditions::get(&status.conditions, ConditionType::EgressApplied)
                .map(|c| (c.status.clone(), c.message.clone()));
            conditions::set(
                &mut status.conditions,
                ConditionType::EgressApplied,
                false,
                refusal.reason,
                &m,
                generation,
            );
            if before != Some(("False".to_owned(), m.clone())) {
                warn!(session = %s.name_any(), reason = refusal.reason.as_str(), "egress change refused");
                ctx.event(s, EventType::Warning, refusal.reason.as_str(), "Egress", m)
                    .await;
            }
        }
    }
    Ok(())
}

/// What host `host` enforces with `policies` sent, for the condition's message.
pub(super) fn applied_message(host: &str, policies: &[Egress]) -> String {
    let extra: Vec<String> = policies
        .iter()
        .filter(|p| **p != Egress::open())
        .map(Egress::summary)
        .collect();
    if extra.is_empty() {
        format!("host {host} enforces the Runtime's egress policy alone")
    } else {
        format!(
            "host {host} enforces the Runtime's egress policy narrowed to {}",
            extra.join(" and ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_what_narrows_the_runtime() {
        let pypi: Egress =
            serde_json::from_str(r#"{"mode": "allowlist", "allow": [{"domain": "pypi.org"}]}"#)
                .expect("a policy");
        assert_eq!(
            applied_message("h1", &[]),
            "host h1 enforces the Runtime's egress policy alone"
        );
        assert_eq!(
            applied_message("h1", &[Egress::open()]),
            "host h1 enforces the Runtime's egress policy alone"
        );
        assert_eq!(
            applied_message("h1", &[pypi, Egress::none()]),
            "host h1 enforces the Runtime's egress policy narrowed to allowlist: pypi.org and none"
        );
    }
}
