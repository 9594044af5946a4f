//! Step 1, place: the session's Runtime (its own or the default), and a host, chosen once and
//! recorded with the finalizer before anything happens on it; a session never moves.

use std::time::Duration;

use futures::FutureExt as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use sandboxd_api::client::Client as HostClient;
use sandboxd_catalog::egress::Egress;
use sandboxd_crds::v1alpha1::condition::{ConditionType, SessionReason};
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_crds::v1alpha1::{Runtime, SandboxHost, SandboxSession, SandboxSessionStatus};

use super::step::{Flow, set_phase, wait_again};
use super::{claim, has_finalizer, missing_runtime_message, placed_host};
use crate::conditions;
use crate::context::Context;
use crate::egress::{CEILING_ANNOTATION, EgressFacts, EgressRefusal, decide};
use crate::error::Error;
use crate::placement::{Candidate, place as choose};

/// Where the session is: its host and a client of it, and the runtime it opens with.
pub(super) struct Placed {
    /// The host's name.
    pub name: String,
    /// The host.
    pub host: SandboxHost,
    /// A client of the host's sandboxd (admin token).
    pub client: HostClient,
    /// The runtime alias the session opens with, if any.
    pub alias: Option<String>,
    /// Its Runtime, when it exists.
    pub runtime: Option<Runtime>,
    /// The further egress policies the open sends (its own narrowing, its namespace's
    /// ceiling): [`crate::egress::decide`]'s. Empty once the session is open.
    pub egress: Vec<Egress>,
}

/// Places the session (or finds where it is placed) and records the placement in `status`.
pub(super) async fn place(
    s: &SandboxSession,
    ctx: &Context,
    status: &mut SandboxSessionStatus,
) -> Result<Flow<Placed>, Error> {
    let generation = s.metadata.generation;
    let runtime = resolve_runtime(s, ctx).await?;
    // A session naming a Runtime that does not exist says so at once, before it takes a host;
    // it opens by itself when that Runtime is created (the controller watches Runtimes).
    if runtime.is_none() && status.session_id.is_none() && !s.spec.runtime.is_empty() {
        let m = missing_runtime_message(&s.spec.runtime);
        conditions::set(
            &mut status.conditions,
            ConditionType::RuntimeReady,
            false,
            SessionReason::RuntimeNotFound,
            &m,
            generation,
        );
        set_phase(status, SessionPhase::Pending, m);
        return Ok(Flow::Done(Duration::from_secs(ctx.config.follow_seconds)));
    }
    if conditions::has_reason(
        &status.conditions,
        ConditionType::RuntimeReady,
        SessionReason::RuntimeNotFound,
    ) {
        conditions::clear(&mut status.conditions, ConditionType::RuntimeReady);
    }
    // The egress policies, decided before a host is taken: a session refused over them holds
    // none. Looked at again when the session, its Runtime or its namespace changes.
    let egress = if status.session_id.is_none() {
        match egress_policies(s, ctx, runtime.as_ref()).await? {
            Ok(policies) => policies,
            Err(refusal) => {
                conditions::set(
                    &mut status.conditions,
                    ConditionType::Admitted,
                    false,
                    refusal.reason,
                    &refusal.message,
                    generation,
                );
                set_phase(status, SessionPhase::Failed, refusal.message);
                return Ok(Flow::Done(Duration::from_secs(ctx.config.follow_seconds)));
            }
        }
    } else {
        Vec::new()
    };
    let alias = runtime
        .as_ref()
        .map(|r| r.name_any())
        .or_else(|| (!s.spec.runtime.is_empty()).then(|| s.spec.runtime.clone()));
    let all_hosts = hosts(ctx).await?;
    let host_name = match placed_host(s) {
        Some(h) => {
            if !has_finalizer(s) {
                claim(s, h, ctx).await?;
            }
            h.to_owned()
        }
        None => {
            // The load of a host is what it reports or what was placed on it since, whichever
            // is higher: placements in quick succession must not all see the same stale count.
            let placed_on = placed_counts(ctx).await?;
            // A session restored after it was Lost goes to another host than the one that
            // lost it (whose copy its Tombstone destroys there).
            let lost_on = status
                .restored_from
                .as_ref()
                .and_then(|r| r.lost_host.clone());
            let candidates: Vec<Candidate> = all_hosts
                .iter()
                .filter(|h| lost_on.as_deref() != Some(h.name_any().as_str()))
                .map(|h| {
                    let st = h.status.clone().unwrap_or_default();
                    let runtime_ready = match (
                        &alias,
                        runtime.as_ref().map(|r| r.spec.base_image.is_some()),
                    ) {
                        (Some(a), Some(true)) => Some(st.runtimes_ready.iter().any(|r| r == a)),
                        _ => None,
                    };
                    Candidate {
                        name: h.name_any(),
                        ready: conditions::is_true(&st.conditions, ConditionType::Ready),
                        disabled: h.spec.disabled,
                        sessions: st
                            .sessions
                            .map_or(0, |n| u32::try_from(n).unwrap_or(0))
                            .max(u32::try_from(placed_on(&h.name_any())).unwrap_or(u32::MAX)),
                        max_sessions: st
                            .capacity
                            .as_ref()
                            .map_or(0, |c| u32::try_from(c.max_sessions).unwrap_or(0)),
                        runtime_ready,
                        lacks_isolation: runtime
                            .as_ref()
                            .and_then(|r| r.spec.isolation)
                            .filter(|i| *i != sandboxd_crds::v1alpha1::runtime::Isolation::Runc)
                            .map(|i| sandboxd_catalog::Isolation::from(i).as_str().to_owned())
                            .filter(|level| !st.isolation.iter().any(|o| o == level)),
                        workspaces: st.capacity.as_ref().and_then(|c| {
                            let budget = u64::try_from(c.workspace_budget?).ok()?;
                            let size = u64::try_from(c.workspace_size?).ok()?;
                            let held = u64::try_from(st.workspace_bytes.unwrap_or(0)).ok()?;
                            Some((held, budget, size))
                        }),
                    }
                })
                .collect();
            match choose(&candidates, s.spec.host.as_deref()) {
                Ok(h) => {
                    claim(s, &h, ctx).await?;
                    h
                }
                Err(e) => {
                    conditions::set(
                        &mut status.conditions,
                        ConditionType::Placed,
                        false,
                        SessionReason::NoHost,
                        &e.to_string(),
                        generation,
                    );
                    set_phase(status, SessionPhase::Pending, e.to_string());
                    return Ok(Flow::Done(wait_again(s, ctx)));
                }
            }
        }
    };
    if status.host.is_none() {
        conditions::set(
            &mut status.conditions,
            ConditionType::Placed,
            true,
            SessionReason::Placed,
            &format!("placed on host {host_name}"),
            generation,
        );
        status.host = Some(host_name.clone());
    }
    let Some(host) = all_hosts.iter().find(|h| h.name_any() == host_name) else {
        conditions::set(
            &mut status.conditions,
            ConditionType::HostUnreachable,
            true,
            SessionReason::HostMissing,
            &format!("SandboxHost {host_name} does not exist"),
            generation,
        );
        return Ok(Flow::Done(wait_again(s, ctx)));
    };
    let client = ctx.host_client(host).await?;
    status.endpoint = Some(host.spec.endpoint.clone());
    if let Some(rt) = &runtime {
        status.briefing = Some(sandboxd_catalog::briefing(&runtime_entry(rt)));
    }

    Ok(Flow::Next(Placed {
        name: host_name,
        host: host.clone(),
        client,
        alias,
        runtime,
        egress,
    }))
}

/// The egress policies a session's open sends, or why it is refused ([`crate::egress::decide`]
/// on its Runtime, its spec and its namespace's ceiling).
pub(super) async fn egress_policies(
    s: &SandboxSession,
    ctx: &Context,
    runtime: Option<&Runtime>,
) -> Result<Result<Vec<Egress>, EgressRefusal>, Error> {
    let namespace = s.namespace().unwrap_or_default();
    let ceiling = ceiling(&namespace, ctx).await?;
    let runtime_egress = runtime
        .and_then(|r| r.spec.egress.as_ref())
        .map(Egress::from);
    let session_egress = s.spec.egress.as_ref().map(Egress::from);
    let name = runtime.map(|r| r.name_any());
    Ok(decide(&EgressFacts {
        runtime: name.as_deref(),
        needs_network: runtime.is_some_and(|r| r.spec.needs_network),
        runtime_egress: runtime_egress.as_ref(),
        session_egress: session_egress.as_ref(),
        namespace: &namespace,
        ceiling: ceiling.as_deref(),
    }))
}

/// The namespace's egress ceiling annotation: from the namespace cache when it holds the
/// namespace, else from the API server (a namespace made just now may not be cached yet, and
/// its ceiling must not be missed).
async fn ceiling(namespace: &str, ctx: &Context) -> Result<Option<String>, Error> {
    if let Some(store) = ctx.namespaces.get()
        && store
            .wait_until_ready()
            .now_or_never()
            .is_some_and(|r| r.is_ok())
        && let Some(ns) = store.get(&ObjectRef::new(namespace))
    {
        return Ok(ns.annotations().get(CEILING_ANNOTATION).cloned());
    }
    let read = Api::<Namespace>::all(ctx.client.clone())
        .get_metadata_opt(namespace)
        .await?;
    Ok(read.and_then(|ns| ns.annotations().get(CEILING_ANNOTATION).cloned()))
}

/// The sessions placed on each host: kept from the session watch while the controller runs
/// ([`super::placements`]), counted from a list before.
async fn placed_counts(ctx: &Context) -> Result<impl Fn(&str) -> usize + use<'_>, Error> {
    let listed = match ctx.sessions.get() {
        Some(_) => None,
        None => {
            let mut counts: std::collections::HashMap<String, usize> = Default::default();
            for s in Api::<SandboxSession>::all(ctx.client.clone())
                .list(&ctx.list_params())
                .await?
                .items
            {
                if let Some(h) = placed_host(&s) {
                    *counts.entry(h.to_owned()).or_default() += 1;
                }
            }
            Some(counts)
        }
    };
    Ok(move |host: &str| match &listed {
        Some(counts) => counts.get(host).copied().unwrap_or(0),
        None => ctx
            .placements
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .on(host),
    })
}

async fn hosts(ctx: &Context) -> Result<Vec<SandboxHost>, Error> {
    if let Some(c) = ctx.caches.get() {
        return Ok(c.hosts.state().iter().map(|h| (**h).clone()).collect());
    }
    Ok(Api::<SandboxHost>::all(ctx.client.clone())
        .list(&ctx.list_params())
        .await?
        .items)
}

/// The runtime alias a session opens with: its own, or the default Runtime's.
async fn resolve_runtime(s: &SandboxSession, ctx: &Context) -> Result<Option<Runtime>, Error> {
    let runtimes: Vec<Runtime> = match ctx.caches.get() {
        Some(c) => c.runtimes.state().iter().map(|r| (**r).clone()).collect(),
        None => {
            Api::<Runtime>::all(ctx.client.clone())
                .list(&ctx.list_params())
                .await?
                .items
        }
    };
    Ok(if s.spec.runtime.is_empty() {
        runtimes.into_iter().find(|r| r.spec.default)
    } else {
        runtimes
            .into_iter()
            .find(|r| r.name_any() == s.spec.runtime)
    })
}

fn runtime_entry(rt: &Runtime) -> sandboxd_catalog::CatalogEntry {
    crate::runtime::entry(rt)
}
