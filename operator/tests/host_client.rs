//! The operator's kept sandboxd clients against the real API server: how often a host's
//! admin-token Secret is read when many reconciles need the host's client at once.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use clap::Parser;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::client::ClientBuilder;
use sandboxd_crds::v1alpha1::SandboxHost;
use sandboxd_operator::config::Config;
use sandboxd_operator::context::Context;
use sandboxd_operator::metrics::Metrics;
use serde_json::json;

/// A client for `KUBECONFIG` that counts the GETs of Secret `name` it sends.
async fn counting_client(name: &str, reads: Arc<AtomicUsize>) -> kube::Client {
    let suffix = format!("/secrets/{name}");
    ClientBuilder::try_from(sandboxd_tests::kube_config().await)
        .expect("client builder")
        .with_layer(&tower::util::MapRequestLayer::new(
            move |req: http::Request<kube::client::Body>| {
                if req.method() == http::Method::GET && req.uri().path().ends_with(&suffix) {
                    reads.fetch_add(1, Ordering::SeqCst);
                }
                req
            },
        ))
        .build()
}

#[tokio::test]
async fn reconciles_that_need_a_hosts_client_at_once_read_its_admin_token_once() {
    let client = common::client().await;
    common::install_crds(&client).await;
    let ns = common::TestNamespace::create(&client, "hostclient").await;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("admin".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "token".to_owned(),
            ByteString(b"an-admin-token".to_vec()),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &secret)
        .await
        .expect("admin-token Secret created");

    let reads = Arc::new(AtomicUsize::new(0));
    let counted = counting_client("admin", reads.clone()).await;
    let config = Config::parse_from(["sandboxd-operator", "--namespace", ns.name.as_str()]);
    let ctx = Arc::new(Context::new(counted, config, Arc::new(Metrics::default())));
    let host: SandboxHost = serde_json::from_value(json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxHost",
        "metadata": {"name": format!("{}-host", ns.name)},
        "spec": {"endpoint": "https://127.0.0.1:9", "node": "worker-1", "adminTokenSecret": {"namespace": ns.name, "name": "admin", "key": "token"}},
    }))
    .expect("host");

    // As many reconciles as the operator runs at once by default, all finding no kept client.
    let calls = (0..64).map(|_| {
        let (ctx, host) = (ctx.clone(), host.clone());
        tokio::spawn(async move { ctx.host_client(&host).await.map(|_| ()) })
    });
    for call in futures::future::join_all(calls).await {
        call.expect("task").expect("a client for the host");
    }
    assert_eq!(
        reads.load(Ordering::SeqCst),
        1,
        "64 reconciles that needed the host's client together read its admin-token Secret this many times"
    );

    // A forced read (what a probe does) still reads it.
    ctx.refresh_host_client(&host).await.expect("refreshed");
    assert_eq!(reads.load(Ordering::SeqCst), 2);

    // A host whose Secret is gone gets the error that names it, from each caller in turn.
    Api::<Secret>::namespaced(client.clone(), &ns.name)
        .delete("admin", &Default::default())
        .await
        .expect("Secret deleted");
    ctx.forget_host_client(&format!("{}-host", ns.name));
    let Err(err) = ctx.host_client(&host).await else {
        panic!("a client without the admin-token Secret");
    };
    assert!(
        err.to_string()
            .contains(&format!("Secret {}/admin does not exist", ns.name)),
        "{err}"
    );
    ns.delete().await;
}
