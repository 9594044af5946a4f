//! Step 2c, ports: an open session's `spec.ports` kept open on its host. [`change`] compares
//! the spec with what the operator last applied there (`status.ports`): a port listed and not
//! applied is opened (`POST /v1/sessions/{id}/ports`), a port applied and no longer listed is
//! closed (`DELETE /v1/sessions/{id}/ports/{port}`), closes first so a swap never meets the
//! host's cap. A port opened through the API directly, never listed, is the caller's and is
//! left alone. The host is called only when the two differ.
//!
//! A host that does not answer is asked again at the next reconcile; what was done before it
//! stopped answering is recorded. A refusal (429 `port_limit`, 400) is condition `PortsOpen`
//! False with the host's words and a Warning event; the session is never failed for it, and
//! the refused port is asked for again at each reconcile.

use std::collections::BTreeSet;

use kube::ResourceExt;
use kube::runtime::events::EventType;
use sandboxd_api::ErrorCode;
use sandboxd_api::client::ClientError;
use sandboxd_crds::v1alpha1::condition::{ConditionType, SessionReason};
use sandboxd_crds::v1alpha1::{SandboxSession, SandboxSessionStatus};
use tracing::{Instrument as _, info, warn};

use super::place::Placed;
use super::step::host_unreachable;
use crate::conditions;
use crate::context::Context;

/// What the operator asks the host to do about a session's ports, decided by [`change`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortChange {
    /// Ports the operator opened that `spec.ports` no longer lists, ascending: closed first.
    pub close: Vec<u16>,
    /// Ports `spec.ports` lists that the operator has not opened, ascending.
    pub open: Vec<u16>,
}

impl PortChange {
    /// Whether the host has nothing to be asked.
    pub fn is_empty(&self) -> bool {
        self.close.is_empty() && self.open.is_empty()
    }
}

/// What to open and what to close on the host, given the session's `spec.ports` (`spec`, a
/// port listed twice counting once) and the ports the operator opened there and has not
/// closed since (`applied`, `status.ports`). Ports neither lists are not looked at: one opened
/// through the API directly stays open.
pub fn change(spec: &[u16], applied: &[u16]) -> PortChange {
    let spec: BTreeSet<u16> = spec.iter().copied().collect();
    let applied: BTreeSet<u16> = applied.iter().copied().collect();
    PortChange {
        close: applied.difference(&spec).copied().collect(),
        open: spec.difference(&applied).copied().collect(),
    }
}

/// The ports, for messages: `3000, 3001`.
fn listed(ports: &[u16]) -> String {
    ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// How one call to the host ended ([`ask`]).
enum Outcome {
    /// Done: the port is open (or closed) as asked.
    Done,
    /// The host refused it: what it said.
    Refused(String),
    /// The host does not serve ports (an older sandboxd).
    Unsupported,
    /// The host does not answer: why.
    Unreachable(String),
    /// The host no longer has the session (the follow reports it).
    Gone,
}

/// Asks `placed`'s host to open (`open`) or close `port` of session `id`.
async fn ask(placed: &Placed, id: &str, port: u16, open: bool) -> Outcome {
    let route = if open {
        "POST /v1/sessions/{id}/ports"
    } else {
        "DELETE /v1/sessions/{id}/ports/{port}"
    };
    let call = tracing::info_span!("host call", host = %placed.name, route, port);
    let answer = if open {
        placed.client.open_port(id, port).instrument(call).await
    } else {
        placed.client.close_port(id, port).instrument(call).await
    };
    match answer {
        Ok(_) => Outcome::Done,
        // Closed meanwhile through the API directly: closed all the same.
        Err(ClientError::Api {
            code: ErrorCode::PortNotOpen,
            ..
        }) if !open => Outcome::Done,
        Err(ClientError::NoSuchSession(_)) => Outcome::Gone,
        Err(e @ ClientError::Transport { .. }) => Outcome::Unreachable(e.to_string()),
        Err(ClientError::VersionMismatch { .. }) => Outcome::Unsupported,
        Err(e) => Outcome::Refused(format!(
            "host {} refused to {} port {port}: {e}",
            placed.name,
            if open { "open" } else { "close" }
        )),
    }
}

/// Brings the open ports of open session `id` on its host up to date with its `spec.ports`,
/// as [`change`] decides (closes first, so a swap never meets the host's cap), and records
/// what was applied in `status.ports`, what was done before a host stopped answering
/// included. Never stops the reconcile nor fails the session.
pub(super) async fn keep_current(
    s: &SandboxSession,
    ctx: &Context,
    status: &mut SandboxSessionStatus,
    placed: &Placed,
    id: &str,
) {
    if status.session_id.is_none() {
        return;
    }
    let generation = s.metadata.generation;
    let host = placed.name.as_str();
    let wanted = change(&s.spec.ports, &[]).open;
    let todo = change(&s.spec.ports, &status.ports);
    let mut applied: BTreeSet<u16> = status.ports.iter().copied().collect();
    let mut refusals = Vec::new();
    let calls = todo.close.iter().map(|p| (*p, false));
    for (port, open) in calls.chain(todo.open.iter().map(|p| (*p, true))) {
        match ask(placed, id, port, open).await {
            Outcome::Done if open => {
                applied.insert(port);
            }
            Outcome::Done => {
                applied.remove(&port);
            }
            Outcome::Refused(m) => refusals.push(m),
            Outcome::Unsupported => {
                let m = format!(
                    "host {host} does not serve ports (its sandboxd has no /v1/sessions/{{id}}/ports): upgrade sandboxd on it; until then spec.ports is not applied"
                );
                refuse(s, ctx, status, SessionReason::PortsUnsupported, &m).await;
                status.ports = applied.into_iter().collect();
                return;
            }
            Outcome::Unreachable(why) => {
                warn!(session = %s.name_any(), %host, error = %why, "the host could not be asked to change the session's ports; tried again at the next reconcile");
                host_unreachable(status, &why, generation);
                status.ports = applied.into_iter().collect();
                return;
            }
            Outcome::Gone => {
                status.ports = applied.into_iter().collect();
                return;
            }
        }
    }
    if !todo.is_empty() {
        info!(session = %s.name_any(), %host, asked_open = %listed(&todo.open), asked_closed = %listed(&todo.close), refused = refusals.len(), "the session's ports asked of its host");
    }
    status.ports = applied.iter().copied().collect();
    if !refusals.is_empty() {
        let open_now: Vec<u16> = wanted
            .iter()
            .copied()
            .filter(|p| applied.contains(p))
            .collect();
        let m = format!(
            "{}; spec.ports open on host {host}: {}; tried again at the next reconcile",
            refusals.join("; "),
            if open_now.is_empty() {
                "none".to_owned()
            } else {
                listed(&open_now)
            }
        );
        refuse(s, ctx, status, SessionReason::PortsRefused, &m).await;
    } else if wanted.is_empty() {
        conditions::clear(&mut status.conditions, ConditionType::PortsOpen);
    } else {
        opened(status, host, &wanted, generation);
    }
}

/// Sets `PortsOpen` True: every port of `spec.ports` (`ports`) is open on `host`.
fn opened(status: &mut SandboxSessionStatus, host: &str, ports: &[u16], generation: Option<i64>) {
    conditions::set(
        &mut status.conditions,
        ConditionType::PortsOpen,
        true,
        SessionReason::PortsOpened,
        &format!("host {host} has spec.ports open: {}", listed(ports)),
        generation,
    );
}

/// Sets `PortsOpen` False with `reason` and `m`; a Warning event when that is new.
async fn refuse(
    s: &SandboxSession,
    ctx: &Context,
    status: &mut SandboxSessionStatus,
    reason: SessionReason,
    m: &str,
) {
    let before = conditions::get(&status.conditions, ConditionType::PortsOpen)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
    conditions::set(
        &mut status.conditions,
        ConditionType::PortsOpen,
        false,
        reason,
        m,
        s.metadata.generation,
    );
    if before != Some(("False".to_owned(), reason.as_str().to_owned(), m.to_owned())) {
        warn!(session = %s.name_any(), reason = reason.as_str(), message = m, "spec.ports not applied");
        ctx.event(
            s,
            EventType::Warning,
            reason.as_str(),
            "Ports",
            m.to_owned(),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_what_the_spec_adds_and_closes_only_what_the_operator_opened() {
        /// spec.ports, status.ports → what is closed, what is opened.
        type Row<'a> = (&'a [u16], &'a [u16], &'a [u16], &'a [u16]);
        let table: &[Row<'_>] = &[
            // Nothing asked, nothing applied: nothing to do.
            (&[], &[], &[], &[]),
            // First apply: every listed port opened, ascending.
            (&[3001, 3000], &[], &[], &[3000, 3001]),
            // Already applied: the host is not called.
            (&[3000, 3001], &[3000, 3001], &[], &[]),
            (&[3001, 3000], &[3000, 3001], &[], &[]),
            // A port listed twice counts once.
            (&[3000, 3000], &[], &[], &[3000]),
            (&[3000, 3000], &[3000], &[], &[]),
            // Swapped: the old one closed, the new one opened.
            (&[3001], &[3000], &[3000], &[3001]),
            // One added, one kept.
            (&[3000, 8080], &[3000], &[], &[8080]),
            // The list emptied: what the operator opened is closed.
            (&[], &[3000, 3001], &[3000, 3001], &[]),
            // One dropped, one kept.
            (&[3001], &[3000, 3001], &[3000], &[]),
        ];
        for (spec, applied, close, open) in table {
            assert_eq!(
                change(spec, applied),
                PortChange {
                    close: close.to_vec(),
                    open: open.to_vec(),
                },
                "spec {spec:?}, applied {applied:?}"
            );
        }
    }

    #[test]
    fn a_port_opened_through_the_api_directly_is_never_closed() {
        // The host has 9000 open too (someone's POST): neither list has it, so no decision
        // names it, whatever the spec becomes.
        for spec in [&[][..], &[3000], &[3001, 3002]] {
            let c = change(spec, &[3000]);
            assert!(!c.close.contains(&9000) && !c.open.contains(&9000), "{c:?}");
        }
        assert!(change(&[3000], &[3000]).is_empty());
        assert!(!change(&[3000], &[]).is_empty());
    }

    #[test]
    fn the_crd_holds_the_hosts_cap_and_range() {
        use kube::CustomResourceExt as _;
        let crd = serde_json::to_value(SandboxSession::crd()).expect("serialises");
        let ports = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["ports"];
        assert_eq!(
            ports["maxItems"].as_u64(),
            u64::try_from(sandboxd_api::ports::MAX_PORTS).ok(),
            "{ports}"
        );
        assert_eq!(ports["items"]["minimum"].as_f64(), Some(1.0), "{ports}");
        assert_eq!(ports["items"]["maximum"].as_f64(), Some(65535.0), "{ports}");
    }
}
