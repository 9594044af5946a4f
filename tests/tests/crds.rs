//! The CRDs against a real kube-apiserver: they install, their validation refuses what it
//! should with the rule's message, the catalog's Runtimes apply, and `kubectl explain` explains.

use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::discovery::ApiResource;
use sandboxd_crds::v1alpha1::{Runtime, SandboxHost, SandboxSession};
use std::time::Duration;

use sandboxd_tests::{
    FIELD_MANAGER, TestNamespace, api_message, client, install_crds, repo_root, until,
};
use serde_json::{Value, json};

fn runtime_api(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<Runtime>(&()))
}

fn session_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::erase::<SandboxSession>(&()),
    )
}

fn object(kind: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "sandboxd.dev/v1alpha1",
        "kind": kind,
        "metadata": { "name": name },
        "spec": spec,
    }))
    .expect("a valid object")
}

/// Creates with a server-side dry run, so nothing is left behind and tests do not collide.
async fn dry_run_create(
    api: &Api<DynamicObject>,
    obj: &DynamicObject,
) -> Result<DynamicObject, kube::Error> {
    api.create(
        &PostParams {
            dry_run: true,
            field_manager: None,
        },
        obj,
    )
    .await
}

#[tokio::test]
async fn all_crds_install_and_become_established() {
    let client = client().await;
    let mut names = install_crds(&client).await;
    names.sort();
    assert_eq!(
        names,
        [
            "runtimes.sandboxd.dev",
            "sandboxhosts.sandboxd.dev",
            "sandboxsessions.sandboxd.dev",
            "sandboxsnapshots.sandboxd.dev",
            "tombstones.sandboxd.dev"
        ]
    );
}

#[tokio::test]
async fn runtime_validation_rules_are_enforced_by_the_api_server() {
    let client = client().await;
    install_crds(&client).await;
    let api = runtime_api(&client);
    let cases = [
        (
            "Bad-Alias",
            json!({"image": "busybox"}),
            "metadata.name is the runtime alias: it must match [a-z][a-z0-9-]*",
        ),
        (
            "9lives",
            json!({"image": "busybox"}),
            "metadata.name is the runtime alias: it must match [a-z][a-z0-9-]*",
        ),
        (
            "both",
            json!({"image": "busybox", "baseImage": "debian"}),
            "exactly one of spec.image and spec.baseImage must be set",
        ),
        (
            "neither",
            json!({"description": "x"}),
            "exactly one of spec.image and spec.baseImage must be set",
        ),
        (
            "pkgs",
            json!({"image": "busybox", "packages": ["pandas"]}),
            "spec.packages is allowed only with spec.baseImage",
        ),
        (
            "setup",
            json!({"image": "busybox", "setupCommands": ["apt-get update"]}),
            "spec.setupCommands is allowed only with spec.baseImage",
        ),
        (
            "mem",
            json!({"image": "busybox", "memLimit": "2 gigs"}),
            "spec.memLimit must be a number with an optional unit b, k, m, g, t or p in Docker's syntax (for example 512m or 2g)",
        ),
        (
            "pool",
            json!({"image": "busybox", "warmPool": {"size": -1}}),
            "spec.warmPool.size must be between 0 and 1000 containers per host",
        ),
        (
            "bigpool",
            json!({"image": "busybox", "warmPool": {"size": 5000}}),
            "spec.warmPool.size must be between 0 and 1000 containers per host",
        ),
    ];
    for (name, spec, want) in cases {
        let message =
            api_message(dry_run_create(&api, &object("Runtime", name, spec.clone())).await);
        assert!(
            message.contains(want),
            "Runtime {name} {spec}: got {message:?}, want it to contain {want:?}"
        );
    }
    for (name, spec) in [
        ("tools", json!({"image": "busybox", "memLimit": "512m"})),
        (
            "built",
            json!({"baseImage": "debian", "packages": ["pandas"], "setupCommands": ["true"], "memLimit": "2g"}),
        ),
    ] {
        dry_run_create(&api, &object("Runtime", name, spec.clone()))
            .await
            .unwrap_or_else(|e| panic!("a valid Runtime {name} {spec} was refused: {e}"));
    }
}

#[tokio::test]
async fn a_host_node_name_is_never_empty() {
    let client = client().await;
    install_crds(&client).await;
    let api = Api::all_with(client.clone(), &ApiResource::erase::<SandboxHost>(&()));
    let spec = |node: Value| {
        json!({"endpoint": "http://10.0.3.7:8080", "node": node,
               "adminTokenSecret": {"namespace": "sandboxd-system", "name": "admin"}})
    };
    let message = api_message(
        dry_run_create(&api, &object("SandboxHost", "empty-node", spec(json!("")))).await,
    );
    assert!(
        message.contains("spec.node must not be empty when set: it names the node as sandboxd's SANDBOXD_NODE_NAME does"),
        "{message:?}"
    );
    for (name, node) in [("named", json!("worker-1")), ("unnamed", Value::Null)] {
        dry_run_create(&api, &object("SandboxHost", name, spec(node.clone())))
            .await
            .unwrap_or_else(|e| panic!("a valid SandboxHost with node {node} was refused: {e}"));
    }
}

#[tokio::test]
async fn session_validation_rules_are_enforced_by_the_api_server() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "session-rules").await;
    let api = session_api(&client, &ns.name);
    let bad_scope = api_message(
        dry_run_create(
            &api,
            &object(
                "SandboxSession",
                "s1",
                json!({"scope": "team", "tenant": "org"}),
            ),
        )
        .await,
    );
    assert!(
        bad_scope.contains("spec.scope")
            && bad_scope
                .contains(r#"supported values: "run", "conversation", "channel", "user", "agent""#),
        "got {bad_scope:?}"
    );
    let empty_tenant = api_message(
        dry_run_create(
            &api,
            &object(
                "SandboxSession",
                "s2",
                json!({"scope": "run", "tenant": ""}),
            ),
        )
        .await,
    );
    assert!(
        empty_tenant.contains("spec.tenant must not be empty: set it to the organization id"),
        "got {empty_tenant:?}"
    );
    let bad_mem = api_message(
        dry_run_create(
            &api,
            &object(
                "SandboxSession",
                "s3",
                json!({"scope": "run", "tenant": "org", "resources": {"memLimit": "lots"}}),
            ),
        )
        .await,
    );
    assert!(
        bad_mem.contains("spec.resources.memLimit must be a number"),
        "got {bad_mem:?}"
    );
    ns.delete().await;
}

#[tokio::test]
async fn session_identity_fields_are_immutable() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "immutable").await;
    let api = session_api(&client, &ns.name);
    let created = api
        .create(
            &PostParams::default(),
            &object(
                "SandboxSession",
                "xc-1",
                json!({"scope": "conversation", "tenant": "org-1", "subject": "c-1"}),
            ),
        )
        .await
        .expect("a valid session is created");
    // Defaults are applied by the API server: an unnamed runtime is the default runtime, "".
    assert_eq!(created.data["spec"]["runtime"], json!(""));
    let changes = [
        (json!({"tenant": "org-2"}), "spec.tenant is immutable"),
        (json!({"scope": "agent"}), "spec.scope is immutable"),
        (json!({"subject": "c-2"}), "spec.subject is immutable"),
        (json!({"runtime": "workbench"}), "spec.runtime is immutable"),
    ];
    for (change, want) in changes {
        let patch = json!({"spec": change});
        let message = api_message(
            api.patch("xc-1", &PatchParams::default(), &Patch::Merge(&patch))
                .await,
        );
        assert!(
            message.contains(want),
            "changing {change}: got {message:?}, want {want:?}"
        );
    }
    // What may change still does.
    api.patch(
        "xc-1",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"idleTimeoutSeconds": 600}})),
    )
    .await
    .expect("idleTimeoutSeconds may change");
    ns.delete().await;
}

#[tokio::test]
async fn a_placed_session_keeps_its_host_its_resources_may_change_and_its_rebuild_generation_only_grows()
 {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "fixed").await;
    let api = session_api(&client, &ns.name);
    api.create(
        &PostParams::default(),
        &object(
            "SandboxSession",
            "xc-1",
            json!({"scope": "conversation", "tenant": "org-1", "subject": "c-1",
                   "host": "h1", "resources": {"milliCpus": 64000}}),
        ),
    )
    .await
    .expect("a valid session is created");
    let spec = |change: Value| {
        let api = api.clone();
        async move {
            api.patch(
                "xc-1",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": change})),
            )
            .await
        }
    };
    let status = |change: Value| {
        let api = api.clone();
        async move {
            api.patch_status(
                "xc-1",
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": change})),
            )
            .await
            .expect("the operator's status write")
        }
    };
    // Not placed, not open (a host refused what it asks): both may change.
    spec(json!({"host": "h2", "resources": {"milliCpus": 500}}))
        .await
        .expect("an unplaced session's host and resources may change");

    status(json!({"host": "h2", "phase": "Pending"})).await;
    let host_fixed = "spec.host is fixed once the session is placed (status.host is set): a session never moves to another host";
    for change in [json!({"host": "h3"}), json!({"host": null})] {
        let message = api_message(spec(change.clone()).await);
        assert!(
            message.contains(host_fixed),
            "changing {change}: got {message:?}"
        );
    }
    spec(json!({"resources": {"milliCpus": 1000}}))
        .await
        .expect("a placed session not yet open may change its resources");

    status(json!({"sessionId": format!("{}.xc-1", ns.name), "phase": "Running"})).await;
    // Resources may change on an open session: a rebuild gives the sandbox the new ones.
    for change in [
        json!({"resources": {"milliCpus": 2000}}),
        json!({"resources": {"memLimit": "1g"}}),
        json!({"resources": null}),
    ] {
        spec(change.clone())
            .await
            .unwrap_or_else(|e| panic!("changing {change} on an open session: {e:?}"));
    }
    // A rebuild is asked by raising spec.rebuildGeneration; it never goes back.
    spec(json!({"rebuildGeneration": 2}))
        .await
        .expect("a rebuild may be asked");
    let message = api_message(spec(json!({"rebuildGeneration": 1})).await);
    assert!(
        message.contains("spec.rebuildGeneration only grows: raise it by one (kubectl sandbox rebuild) to ask for another rebuild"),
        "{message}"
    );
    // What may change still does, and the operator's status writes pass.
    spec(json!({"idleTimeoutSeconds": 600}))
        .await
        .expect("idleTimeoutSeconds may change on an open session");
    status(json!({"phase": "Sleeping"})).await;
    ns.delete().await;
}

/// `kubectl scale rt/NAME --replicas=N` sets the warm pool's size through the scale
/// subresource, on a Runtime that had no pool; the scale reads the size back, and the ready
/// count (none yet) from the status.
#[tokio::test]
async fn kubectl_scale_sets_a_runtimes_warm_pool_size() {
    let client = client().await;
    install_crds(&client).await;
    let api = runtime_api(&client);
    let suffix: u32 = rand::random();
    let name = format!("warm-{suffix:08x}");
    api.create(
        &PostParams::default(),
        &object("Runtime", &name, json!({"image": "busybox"})),
    )
    .await
    .expect("a Runtime without a pool");
    let kubeconfig = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    let out = tokio::process::Command::new(sandboxd_tests::kubectl())
        .args([
            "--kubeconfig",
            &kubeconfig,
            "scale",
            &format!("rt/{name}"),
            "--replicas=3",
        ])
        .output()
        .await
        .expect("kubectl runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let live = api.get(&name).await.expect("the Runtime");
    let scale = api.get_scale(&name).await.expect("its scale");
    let _ = api.delete(&name, &Default::default()).await;
    assert!(out.status.success(), "kubectl scale failed: {said}");
    assert_eq!(said.trim(), format!("runtime.sandboxd.dev/{name} scaled"));
    assert_eq!(live.data["spec"]["warmPool"], json!({"size": 3}));
    let spec = scale.spec.expect("a scale spec");
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(scale.status.map(|s| s.replicas), Some(0));
}

#[tokio::test]
async fn catalog_runtime_manifests_apply_cleanly() {
    let client = client().await;
    install_crds(&client).await;
    let api = runtime_api(&client);
    let path = repo_root().join(sandboxd_crds::generate::RUNTIMES);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut applied = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let obj: DynamicObject = serde::Deserialize::deserialize(doc).expect("a Runtime manifest");
        let name = obj.metadata.name.clone().expect("a name");
        let params = PatchParams {
            dry_run: true,
            ..PatchParams::apply(FIELD_MANAGER).force()
        };
        let live = api
            .patch(&name, &params, &Patch::Apply(&obj))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "the API server refused Runtime {name} from {}: {e}",
                    path.display()
                )
            });
        applied.push((name, live.data["spec"]["default"].clone()));
    }
    assert_eq!(
        applied.first(),
        Some(&("workbench".to_owned(), json!(true)))
    );
}

#[tokio::test]
async fn kubectl_explain_shows_the_field_docs() {
    let client = client().await;
    install_crds(&client).await;
    let kubeconfig = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    // The OpenAPI document kubectl explain reads is published shortly after a CRD is
    // established; there is nothing to watch for it, so ask until it answers.
    let last = until(
        "kubectl explain to answer",
        Duration::from_secs(30),
        || async {
            let out = tokio::process::Command::new(sandboxd_tests::kubectl())
                .args([
                    "--kubeconfig",
                    &kubeconfig,
                    "explain",
                    "sandboxsession.spec.scope",
                ])
                .output()
                .await
                .map_err(|e| format!("kubectl did not run: {e}"))?;
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if out.status.success() {
                Ok(text)
            } else {
                Err(text)
            }
        },
    )
    .await;
    assert!(last.contains("FIELD: scope"), "{last}");
    assert!(
        last.contains("Who shares this sandbox: one of run, conversation, channel, user or agent"),
        "{last}"
    );
    assert!(last.contains("sandboxd.dev"), "{last}");
}

#[tokio::test]
async fn get_wide_shows_when_a_session_sleeps() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "sleeps-at").await;
    let api = session_api(&client, &ns.name);
    api.create(
        &PostParams::default(),
        &object(
            "SandboxSession",
            "sleepy",
            json!({"scope": "conversation", "tenant": "org-1", "subject": "c-1"}),
        ),
    )
    .await
    .expect("create");
    // What the operator writes for a running session: when it goes to sleep, in the future.
    let sleeps_at = (k8s_openapi::jiff::Timestamp::now()
        + k8s_openapi::jiff::SignedDuration::from_secs(3600))
    .round(k8s_openapi::jiff::Unit::Second)
    .expect("a whole second")
    .to_string();
    api.patch_status(
        "sleepy",
        &PatchParams::apply(FIELD_MANAGER),
        &Patch::Merge(json!({"status": {"sleepsAt": sleeps_at}})),
    )
    .await
    .expect("the status");
    let kubeconfig = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    let out = tokio::process::Command::new(sandboxd_tests::kubectl())
        .args([
            "--kubeconfig",
            &kubeconfig,
            "get",
            "sbx",
            "sleepy",
            "-o",
            "wide",
        ])
        .args(["-n", &ns.name])
        .output()
        .await
        .expect("kubectl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("SLEEPS AT"), "{text}");
    assert!(!text.contains("<invalid>"), "{text}");
    assert!(
        text.contains(&sleeps_at),
        "the time it sleeps, {sleeps_at}: {text}"
    );
}
