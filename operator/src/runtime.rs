//! The Runtime controller: hands the allowlist (every Runtime, the default first) to every
//! ready host and records per host the build state, image tag, attempts and last error. Ready
//! when built on every ready host; two defaults are a condition on both, never a silent pick.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use sandboxd_api::BuildState as HostBuildState;
use sandboxd_api::client::ClientError;
use sandboxd_api::runtimes::RuntimeList;
use sandboxd_catalog::CatalogEntry;
use sandboxd_catalog::egress::{Egress, EgressMode};
use sandboxd_crds::v1alpha1::condition::{ConditionType, RuntimeReason};
use sandboxd_crds::v1alpha1::runtime::{BuildState, RuntimeHostStatus, WarmPoolStatus};
use sandboxd_crds::v1alpha1::{Runtime, RuntimeStatus, SandboxHost};
use serde_json::json;
use tracing::{instrument, warn};

use crate::conditions;
use crate::context::{Context, key};
use crate::error::Error;

/// Field manager of this controller's status writes.
pub const MANAGER: &str = "sandbox-operator/runtime";

/// The catalog entry of a Runtime object.
///
/// An egress policy the API server let through that still does not validate (its CEL rules
/// check the shape, not every name) is handed out as mode none: the host refuses a catalog with
/// an invalid entry whole, and a bad policy of one Runtime must neither stop the others nor
/// open a network; its sessions are refused at open, saying what is wrong. `needs_network`
/// follows the policy, as the catalog requires.
pub fn entry(rt: &Runtime) -> CatalogEntry {
    let egress = rt.spec.egress.as_ref().map(|e| {
        let policy = Egress::from(e);
        if policy.validate().is_empty() {
            policy
        } else {
            Egress::none()
        }
    });
    CatalogEntry {
        alias: rt.name_any(),
        description: rt.spec.description.clone(),
        image: rt.spec.image.clone(),
        base_image: rt.spec.base_image.clone(),
        setup_commands: rt.spec.setup_commands.clone(),
        packages: rt.spec.packages.clone(),
        env_vars: rt.spec.env_vars.clone(),
        briefing: rt.spec.briefing.clone(),
        mem_limit: rt.spec.mem_limit.clone(),
        workspace_size: rt.spec.workspace_size.clone(),
        needs_network: egress
            .as_ref()
            .map_or(rt.spec.needs_network, |e| e.mode != EgressMode::None),
        egress,
        isolation: rt.spec.isolation.map(Into::into).unwrap_or_default(),
        // The API server keeps it within 0..=1000.
        warm_pool: rt
            .spec
            .warm_pool
            .as_ref()
            .map_or(0, |p| u32::try_from(p.size).unwrap_or(0)),
    }
}

/// Runs the controller until the stream ends. A Runtime is reconciled when it is created or
/// its spec (or scale) changes, and then on its timer; not on its own status writes, each of
/// which would otherwise bring another hand-out to every host.
pub async fn run(ctx: Arc<Context>) {
    let api = Api::<Runtime>::all(ctx.client.clone());
    let (runtimes, stream) = crate::context::without_own_status(api, ctx.watcher_config());
    Controller::for_stream(stream, runtimes)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

fn error_policy(rt: Arc<Runtime>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(runtime = %rt.name_any(), error = %error, "runtime reconcile failed");
    Action::requeue(ctx.failed("runtime", &key(rt.as_ref()), error))
}

#[instrument(skip_all, fields(runtime = %rt.name_any()))]
async fn reconcile(rt: Arc<Runtime>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = hand_out(&rt, &ctx).await;
    ctx.observe("runtime", started);
    result
}

async fn hand_out(rt: &Runtime, ctx: &Context) -> Result<Action, Error> {
    let name = rt.name_any();
    let generation = rt.metadata.generation;
    let mut all = Api::<Runtime>::all(ctx.client.clone())
        .list(&ctx.list_params())
        .await?
        .items;
    // The default first: a host's first entry is its default.
    all.sort_by_key(|r| (!r.spec.default, r.name_any()));
    let catalog: Vec<CatalogEntry> = all.iter().map(entry).collect();
    let defaults: Vec<String> = all
        .iter()
        .filter(|r| r.spec.default)
        .map(|r| r.name_any())
        .collect();
    let old = rt.status.clone().unwrap_or_default();
    let mut status = RuntimeStatus {
        observed_generation: generation,
        conditions: old.conditions.clone(),
        ..Default::default()
    };
    if defaults.len() > 1 && rt.spec.default {
        let m = format!(
            "more than one Runtime is marked default ({}); mark exactly one",
            defaults.join(", ")
        );
        conditions::set(
            &mut status.conditions,
            ConditionType::DefaultConflict,
            true,
            RuntimeReason::SeveralDefaults,
            &m,
            generation,
        );
    } else {
        conditions::clear(&mut status.conditions, ConditionType::DefaultConflict);
    }
    let hosts = Api::<SandboxHost>::all(ctx.client.clone())
        .list(&ctx.list_params())
        .await?
        .items;
    let mut building = false;
    // The fewest ready pooled containers on any ready host that answered.
    let mut pool_ready: Option<u32> = None;
    for host in hosts.iter().filter(|h| {
        h.status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, ConditionType::Ready))
    }) {
        let host_name = host.name_any();
        let previous = old.hosts.iter().find(|h| h.host == host_name);
        let client = ctx.host_client(host).await?;
        // The host keeps an unchanged definition's image and state, so handing it the whole
        // list each time is cheap and converges a host that restarted with another list.
        let listed = client.put_runtimes(&catalog).await;
        let (entry_status, ready) = host_entry(&name, host_name, previous, listed);
        if let Some(ready) = ready {
            pool_ready = Some(pool_ready.map_or(ready, |n| n.min(ready)));
        }
        building |= matches!(
            entry_status.state,
            BuildState::Pending | BuildState::Building
        );
        status.hosts.push(entry_status);
    }
    let pool_size = entry(rt).warm_pool;
    if pool_size > 0 || old.warm_pool.is_some() {
        status.warm_pool = Some(WarmPoolStatus {
            ready: i32::try_from(pool_ready.unwrap_or(0)).unwrap_or(i32::MAX),
        });
    }
    // A pool still filling is looked at again soon, so its ready count (the scale's status
    // replicas) follows.
    let filling = pool_ready.is_some_and(|n| n < pool_size);
    let ready_everywhere =
        !status.hosts.is_empty() && status.hosts.iter().all(|h| h.state == BuildState::Ready);
    let message = if status.hosts.is_empty() {
        "no ready host to build on".to_owned()
    } else {
        let by_state: BTreeMap<String, Vec<&str>> =
            status.hosts.iter().fold(BTreeMap::new(), |mut m, h| {
                m.entry(format!("{:?}", h.state))
                    .or_default()
                    .push(h.host.as_str());
                m
            });
        by_state
            .iter()
            .map(|(k, v)| format!("{k}: {}", v.join(", ")))
            .collect::<Vec<_>>()
            .join("; ")
    };
    conditions::set(
        &mut status.conditions,
        ConditionType::Ready,
        ready_everywhere,
        if ready_everywhere {
            RuntimeReason::Built
        } else {
            RuntimeReason::NotBuilt
        },
        &message,
        generation,
    );
    if status != old {
        let patch =
            json!({"apiVersion": "sandboxd.dev/v1alpha1", "kind": "Runtime", "status": status});
        Api::<Runtime>::all(ctx.client.clone())
            .patch_status(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
    }
    ctx.succeeded(&key(rt));
    Ok(Action::requeue(if building || filling {
        Duration::from_secs(5)
    } else {
        Duration::from_secs(ctx.config.probe_seconds)
    }))
}

/// What one host's answer to the hand-out says of runtime `name` there: its build state,
/// image tag, attempts and last error (the transition time kept from `previous` unless the
/// state changed), and its warm pool's ready count when the host listed it.
fn host_entry(
    name: &str,
    host_name: String,
    previous: Option<&RuntimeHostStatus>,
    listed: Result<RuntimeList, ClientError>,
) -> (RuntimeHostStatus, Option<u32>) {
    let mut ready = None;
    let entry = match listed {
        Err(e) => RuntimeHostStatus {
            host: host_name.clone(),
            state: BuildState::Failed,
            image_tag: None,
            attempts: previous.map_or(0, |p| p.attempts),
            last_error: Some(e.to_string()),
            last_transition_time: Some(Time(Timestamp::now())),
        },
        Ok(list) => match list.runtimes.into_iter().find(|r| r.alias == name) {
            None => RuntimeHostStatus {
                host: host_name.clone(),
                state: BuildState::Pending,
                image_tag: None,
                attempts: 0,
                last_error: None,
                last_transition_time: previous.and_then(|p| p.last_transition_time.clone()),
            },
            Some(r) => {
                ready = Some(r.warm_pool.ready);
                let state = match r.state {
                    HostBuildState::Pending => BuildState::Pending,
                    HostBuildState::Building => BuildState::Building,
                    HostBuildState::Ready => BuildState::Ready,
                    HostBuildState::Failed => BuildState::Failed,
                };
                let changed = previous.is_none_or(|p| p.state != state);
                RuntimeHostStatus {
                    host: host_name.clone(),
                    state,
                    image_tag: Some(r.tag),
                    attempts: i32::try_from(r.attempts).unwrap_or(i32::MAX),
                    last_error: r.last_error.map(|e| match r.log_tail {
                        Some(tail) => crate::context::truncate(format!("{e}\n{tail}"), 2000),
                        None => e,
                    }),
                    last_transition_time: if changed {
                        Some(Time(Timestamp::now()))
                    } else {
                        previous.and_then(|p| p.last_transition_time.clone())
                    },
                }
            }
        },
    };
    (entry, ready)
}

#[cfg(test)]
mod tests {
    use sandboxd_crds::v1alpha1::RuntimeSpec;

    use super::*;

    fn runtime(needs_network: bool, egress: Option<&str>) -> Runtime {
        Runtime::new(
            "python",
            RuntimeSpec {
                description: String::new(),
                image: Some("python:3.12".into()),
                base_image: None,
                setup_commands: vec![],
                packages: vec![],
                env_vars: BTreeMap::new(),
                briefing: vec![],
                mem_limit: None,
                workspace_size: None,
                needs_network,
                egress: egress.map(|e| serde_json::from_str(e).expect("CRD shape")),
                isolation: None,
                default: false,
                rebuild_policy: None,
                max_unavailable: None,
                warm_pool: None,
            },
        )
    }

    #[test]
    fn the_entry_carries_egress_and_a_needs_network_that_agrees() {
        let allow = r#"{"mode": "allowlist", "allow": [{"domain": "pypi.org"}]}"#;
        let e = entry(&runtime(false, Some(allow)));
        assert_eq!(
            e.egress,
            Some(serde_json::from_str(allow).expect("catalog shape"))
        );
        assert!(e.needs_network);
        let e = entry(&runtime(true, Some(r#"{"mode": "none"}"#)));
        assert_eq!(e.egress, Some(Egress::none()));
        assert!(!e.needs_network);
        let e = entry(&runtime(true, None));
        assert_eq!((e.egress, e.needs_network), (None, true));
        // What the hosts are handed parses as a catalog.
        let catalog = sandboxd_catalog::to_json(&[
            entry(&runtime(false, Some(allow))),
            entry(&runtime(true, Some(r#"{"mode": "none"}"#))),
        ]);
        let catalog = catalog.replacen("\"python\"", "\"other\"", 1);
        assert!(sandboxd_catalog::parse(&catalog).is_ok(), "{catalog}");
    }

    #[test]
    fn a_policy_that_does_not_validate_is_handed_out_as_none() {
        let e = entry(&runtime(
            true,
            Some(r#"{"mode": "allowlist", "allow": [{"domain": "a..b"}]}"#),
        ));
        assert_eq!(e.egress, Some(Egress::none()));
        assert!(!e.needs_network);
    }
}
