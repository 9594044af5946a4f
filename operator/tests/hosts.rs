//! The SandboxHost controller: an admin token in another namespace is refused unread; a host
//! gets its own node's token and another node's name is refused; a host that hangs is
//! unreachable like a dead one and holds nothing up; an idle host is probed on its timer, not
//! after its own writes; a host without a node is sent nothing and takes no session. Against
//! the stack of `make up` (see `common`).

mod common;

use std::time::Duration;

use common::{Host, Scope, condition, phase, wait_gone, wait_host, wait_host_ready_condition};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_crds::v1alpha1::{SandboxHost, Tombstone};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_admin_token_is_in_another_namespace_is_refused_unread() {
    let mut scope = Scope::new("foreign").await;
    let host = Host::start(&format!("foreign-host-{}", scope.scope), &[]);
    // The host's real admin token, in a namespace other than the operator's: were it read, the
    // host would answer and become Ready.
    let other = sandboxd_tests::TestNamespace::create(&scope.client, "foreign-secret").await;
    let labels = scope.labels();
    let secret = |name: &str| -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "stringData": {"token": host.sandboxd.token},
        }))
        .expect("secret")
    };
    Api::<Secret>::namespaced(scope.client.clone(), &other.name)
        .create(&PostParams::default(), &secret("stolen-admin"))
        .await
        .expect("the Secret in the other namespace");
    let sbh: SandboxHost = serde_json::from_value(serde_json::json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxHost",
        "metadata": {"name": host.name, "labels": scope.labels()},
        "spec": {"endpoint": host.endpoint(), "node": host.node, "adminTokenSecret": {"namespace": other.name, "name": "stolen-admin", "key": "token"}},
    }))
    .expect("host");
    let hosts = Api::<SandboxHost>::all(scope.client.clone());
    hosts
        .create(&PostParams::default(), &sbh)
        .await
        .expect("host created");
    scope.default_runtime().await;
    scope.start_operator(&[]);

    let refused =
        wait_host_ready_condition(&hosts, &host.name, 30, |c| c.reason == "TokenSecretRefused")
            .await;
    assert_eq!(refused.status, "False");
    assert_eq!(
        refused.message,
        format!(
            "the admin-token Secret {}/stolen-admin is not read: it must live in the operator's namespace {}, the only namespace the operator reads Secrets in",
            other.name, scope.ns
        )
    );

    // No session is placed on it, chosen or pinned.
    scope.kubectl_apply_session("xc-foreign", serde_json::json!({}));
    scope.kubectl_apply_session("xc-foreign-pin", serde_json::json!({"host": host.name}));
    let placed_condition = |s: &sandboxd_crds::v1alpha1::SandboxSession| {
        s.status
            .as_ref()
            .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Placed"))
            .map(|c| (c.status.clone(), c.message.clone()))
    };
    let free = scope
        .wait_session("xc-foreign", "refused a host", 30, |s| {
            placed_condition(s).is_some()
        })
        .await;
    assert_eq!(
        placed_condition(&free),
        Some((
            "False".to_owned(),
            format!(
                "no host can take the session: {}: it is not ready",
                host.name
            )
        ))
    );
    let pinned = scope
        .wait_session("xc-foreign-pin", "refused its pinned host", 30, |s| {
            placed_condition(s).is_some()
        })
        .await;
    assert_eq!(
        placed_condition(&pinned),
        Some((
            "False".to_owned(),
            format!(
                "the pinned host '{}' cannot take sessions now: it is not ready",
                host.name
            )
        ))
    );
    for s in [&free, &pinned] {
        assert_eq!(phase(s), Some(SessionPhase::Pending));
        assert_eq!(s.annotations().get("sandboxd.dev/host"), None);
        assert_eq!(s.status.as_ref().and_then(|st| st.host.clone()), None);
    }
    assert!(
        host.client()
            .list()
            .await
            .expect("the host's sessions")
            .is_empty(),
        "nothing was opened on the refused host"
    );
    assert!(host.containers().is_empty(), "{:?}", host.containers());

    // The same token in the operator's namespace: the host is taken, and the session runs.
    Api::<Secret>::namespaced(scope.client.clone(), &scope.ns)
        .create(&PostParams::default(), &secret("admin"))
        .await
        .expect("the Secret in the operator's namespace");
    hosts
        .patch(
            &host.name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"adminTokenSecret": {"namespace": scope.ns, "name": "admin"}}})),
        )
        .await
        .expect("host moved to the operator's namespace");
    let ready = wait_host_ready_condition(&hosts, &host.name, 30, |c| c.status == "True").await;
    assert_eq!(ready.reason, "Ready");
    let running = scope
        .wait_session("xc-foreign", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    assert_eq!(running.status.and_then(|s| s.host), Some(host.name.clone()));
    other.delete().await;
    scope.delete().await;
}

/// The Ready=False message of a host that names no node.
fn node_unset_message(endpoint: &str) -> String {
    format!(
        "spec.node is unset: the operator sends an admin token only to the sandboxd of a node (the token derived for spec.node, which opens no other node), so {endpoint} is sent no token, is not probed and takes no session. Set spec.node to the node name in its sandboxd's SANDBOXD_NODE_NAME"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_gets_its_own_nodes_token_and_another_nodes_name_is_refused() {
    let mut scope = Scope::new("nodetok").await;
    let node = format!("worker-{}", scope.scope);
    let host = Host::start(
        &format!("nt-{}", scope.scope),
        &[("SANDBOXD_NODE_NAME", node.as_str())],
    );
    // The Secret holds the master; spec.node names the node sandboxd was told.
    scope.register_on_node(&host, Some(&node)).await;
    let secret = format!("{}-admin", host.name);
    // The same sandboxd registered twice more: under another node's name (sandboxd refuses
    // that node's token), and without a node (sent nothing at all).
    let other = format!("other-{}", scope.scope);
    scope
        .register_endpoint_on_node(&other, &host.endpoint(), &secret, Some("another-node"))
        .await;
    let bare = format!("bare-{}", scope.scope);
    scope
        .register_endpoint_on_node(&bare, &host.endpoint(), &secret, None)
        .await;
    scope.default_runtime().await;
    scope.start_operator(&[]);

    let hosts = Api::<SandboxHost>::all(scope.client.clone());
    wait_host_ready_condition(&hosts, &host.name, 30, |c| c.status == "True").await;
    let refused = wait_host_ready_condition(&hosts, &other, 30, |c| {
        c.status == "False" && c.reason == "TokenRefused"
    })
    .await;
    assert_eq!(
        refused.message,
        format!(
            "sandboxd at {} refused the admin token (401): the operator sent the token derived for node 'another-node' (spec.node) from the master in Secret {}/{secret} key token. The node name in spec.node must match sandboxd's SANDBOXD_NODE_NAME, and the Secret must hold the master sandboxd was started with (SANDBOXD_TOKEN) or whose node token's hash it reads (SANDBOXD_NODE_TOKEN_HASHES, written by the operator with --node-token-hashes)",
            host.endpoint(),
            scope.ns
        )
    );
    let unsent = wait_host_ready_condition(&hosts, &bare, 30, |c| {
        c.status == "False" && c.reason == "NodeUnset"
    })
    .await;
    assert_eq!(unsent.message, node_unset_message(&host.endpoint()));

    // A session lands on the host whose token is taken, and runs there.
    scope.kubectl_apply_session("xc-node", serde_json::json!({}));
    let running = scope
        .wait_session("xc-node", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    assert_eq!(
        running.status.and_then(|s| s.host).as_deref(),
        Some(host.name.as_str())
    );
    assert_eq!(host.containers(), vec![(scope.host_id("xc-node"), true)]);
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_hangs_is_unreachable_like_a_dead_one_and_holds_nothing_up() {
    let mut scope = Scope::new("hang").await;
    let hung = Host::start(&format!("hung-{}", scope.scope), &[]);
    let healthy = Host::start(&format!("healthy-{}", scope.scope), &[]);
    scope.register(&hung).await;
    scope.register(&healthy).await;
    scope.default_runtime().await;
    scope.start_operator(&["--host-request-seconds", "2"]);
    let sessions = scope.sessions();
    let tombstones = Api::<Tombstone>::all(scope.client.clone());
    let hosts = Api::<SandboxHost>::all(scope.client.clone());

    scope.kubectl_apply_session("xc-hung", serde_json::json!({"host": hung.name}));
    let s = scope
        .wait_session("xc-hung", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let tomb = format!("sbx-{}", s.metadata.uid.clone().expect("uid"));

    // The host stops answering (SIGSTOP: connections are still accepted, nothing is said).
    hung.signal("STOP");
    let down = wait_host_ready_condition(&hosts, &hung.name, 30, |c| c.status == "False").await;
    assert_eq!(
        (down.reason.as_str(), down.message.clone()),
        (
            "Unreachable",
            format!("sandboxd at {} does not answer", hung.endpoint())
        )
    );
    let reachable = hosts
        .get(&hung.name)
        .await
        .expect("the host")
        .status
        .and_then(|st| st.conditions.into_iter().find(|c| c.type_ == "Reachable"))
        .expect("a Reachable condition");
    assert!(
        reachable.message.contains("no answer within 2 s"),
        "the host's Reachable condition does not say it hangs: {reachable:?}"
    );
    // A destroy on it fails within the deadline and is retried with backoff, not hung.
    sessions
        .delete("xc-hung", &DeleteParams::default())
        .await
        .expect("delete");
    wait_gone(sessions.clone(), "xc-hung", 30).await;
    let backing_off = tokio::time::timeout(
        Duration::from_secs(45),
        await_condition(tombstones.clone(), &tomb, |t: Option<&Tombstone>| {
            t.and_then(|t| t.status.as_ref()).is_some_and(|st| {
                st.attempts >= 3
                    && st
                        .last_error
                        .as_deref()
                        .is_some_and(|e| e.contains("no answer within 2 s"))
            })
        }),
    )
    .await;
    assert!(
        matches!(backing_off, Ok(Ok(Some(_)))),
        "the tombstone's attempts did not grow while the host hung: {:?}",
        tombstones.get_opt(&tomb).await
    );
    // Meanwhile sessions on the other host open as usual.
    scope.kubectl_apply_session("xc-fine", serde_json::json!({"host": healthy.name}));
    scope
        .wait_session("xc-fine", "Running beside a hung host", 60, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;

    // The host comes back: the destroy completes.
    hung.signal("CONT");
    wait_gone(tombstones.clone(), &tomb, 60).await;
    assert!(
        hung.containers().is_empty(),
        "the hung host's sandbox stayed"
    );
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_host_is_probed_on_its_timer_not_after_each_of_its_own_writes() {
    let mut scope = Scope::new("quiet").await;
    let host = Host::start(&format!("quiet-host-{}", scope.scope), &[]);
    scope.register(&host).await;
    scope.start_operator(&["--probe-seconds", "30"]);
    let ready = wait_host(&scope.client, &host.name, "Ready", |h| {
        condition(h, "Ready").is_some_and(|c| c.status == "True")
    })
    .await;
    let probed = ready
        .status
        .as_ref()
        .and_then(|s| s.last_probe_at.clone())
        .expect("lastProbeAt");
    // Each probe writes the status; were a write to bring the next probe, the host would be
    // probed and written about once a second. Its next probe is 30 s away: 3 s see no write.
    let hosts = Api::<SandboxHost>::all(scope.client.clone());
    let mut events = kube::runtime::watcher(
        hosts.clone(),
        kube::runtime::watcher::Config::default().fields(&format!("metadata.name={}", host.name)),
    )
    .boxed();
    let mut writes = Vec::new();
    let window = tokio::time::sleep(Duration::from_secs(3));
    tokio::pin!(window);
    loop {
        tokio::select! {
            () = &mut window => break,
            e = events.next() => match e {
                Some(Ok(kube::runtime::watcher::Event::Apply(h))) => writes.push(h.resource_version()),
                Some(Ok(_)) => {}
                Some(Err(e)) => panic!("watch: {e}"),
                None => break,
            },
        }
    }
    assert!(
        writes.is_empty(),
        "the idle host was written {} times in 3 s: {writes:?}",
        writes.len()
    );
    let now = hosts.get(&host.name).await.expect("host");
    assert_eq!(
        now.status.and_then(|s| s.last_probe_at),
        Some(probed),
        "probed again before its timer"
    );
    // Two reconciles in all: the one that added the finalizer and the probe. The probe's own
    // write brought a third (a second probe) before.
    let metrics = reqwest::get(format!("{}/metrics", scope.health_url(0)))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let reconciles: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("sandbox_operator_reconciles_total{controller=\"sandboxhost\"} ")
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sandboxhost reconciles in:\n{metrics}"));
    assert_eq!(reconciles, 2, "the host's reconciles (finalizer, probe)");
    scope.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_a_node_pointing_at_a_listener_is_sent_nothing_and_takes_no_session() {
    let mut scope = Scope::new("notoken").await;
    // A listener that records every byte it is sent: where whoever may write a SandboxHost
    // would point one to collect the admin token.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a listener");
    let endpoint = format!("http://{}", listener.local_addr().expect("its address"));
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Vec<u8>>::new()));
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (seen, accepted) = (received.clone(), connections.clone());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut bytes = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    match tokio::io::AsyncReadExt::read(&mut conn, &mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            bytes.extend_from_slice(&buf[..n]);
                            seen.lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(bytes.clone());
                        }
                    }
                }
            });
        }
    });
    // The master in the operator's namespace, named as the hosts' Secret is.
    let master = "the-master-admin-token-of-this-test";
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "sandboxd-admin-token", "labels": scope.labels()},
        "stringData": {"token": master},
    }))
    .expect("secret");
    Api::<Secret>::namespaced(scope.client.clone(), &scope.ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("the master");
    let trap = format!("trap-{}", scope.scope);
    scope
        .register_endpoint_on_node(&trap, &endpoint, "sandboxd-admin-token", None)
        .await;
    scope.default_runtime().await;
    scope.start_operator(&["--probe-seconds", "1"]);

    let hosts = Api::<SandboxHost>::all(scope.client.clone());
    let unsent = wait_host_ready_condition(&hosts, &trap, 30, |c| {
        c.status == "False" && c.reason == "NodeUnset"
    })
    .await;
    assert_eq!(unsent.message, node_unset_message(&endpoint));
    // A session finds no host to go to; the host is probed on its timer meanwhile.
    scope.kubectl_apply_session("xc-trap", serde_json::json!({}));
    let pending = scope
        .wait_session("xc-trap", "refused a host", 30, |s| {
            s.status
                .as_ref()
                .is_some_and(|st| st.conditions.iter().any(|c| c.type_ == "Placed"))
        })
        .await;
    let probed = |h: &SandboxHost| h.status.as_ref().and_then(|s| s.last_probe_at.clone());
    let first = probed(&hosts.get(&trap).await.expect("the host"));
    let later = tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(hosts.clone(), &trap, move |h: Option<&SandboxHost>| {
            h.is_some_and(|h| probed(h).is_some() && probed(h) != first)
        }),
    )
    .await;
    assert!(
        matches!(later, Ok(Ok(Some(_)))),
        "the host was not probed again"
    );
    let status = pending.status.expect("status");
    assert_eq!(status.host, None);
    assert_eq!(status.phase, Some(SessionPhase::Pending));
    // Not a connection, so not a byte: neither the master nor any token derived from it.
    let got = received.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        got.is_empty() && connections.load(std::sync::atomic::Ordering::SeqCst) == 0,
        "the listener was sent {:?}",
        got.iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect::<Vec<_>>()
    );
    scope.delete().await;
}
