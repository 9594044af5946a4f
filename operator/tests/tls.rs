//! A host that serves TLS: the operator trusts it through its CA Secret and refuses it with
//! another CA. Against the stack of `make up` (see `common`).

mod common;

use common::{Host, Scope, condition, phase, token_of, wait_host};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use sandboxd_crds::v1alpha1::SandboxHost;
use sandboxd_crds::v1alpha1::session::SessionPhase;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_host_is_trusted_through_its_ca_secret_and_refused_with_another_ca() {
    let mut scope = Scope::new("tls").await;
    let pki = tempfile::tempdir().expect("a temp dir");
    let ca = sandboxd_tests::pki::Ca::new("sandboxd e2e CA");
    let leaf = ca.leaf(&["127.0.0.1"], pki.path(), "tls");
    let host = Host::start(
        &format!("tls-host-{}", scope.scope),
        &[
            ("SANDBOXD_TLS_CERT_FILE", &leaf.cert.display().to_string()),
            ("SANDBOXD_TLS_KEY_FILE", &leaf.key.display().to_string()),
        ],
    );
    assert!(host.endpoint().starts_with("https://"));
    let secrets = Api::<Secret>::namespaced(scope.client.clone(), &scope.ns);
    let other = sandboxd_tests::pki::Ca::new("not the CA that signed sandboxd's certificate");
    for (name, pem) in [("tls-ca", &ca.pem), ("wrong-ca", &other.pem)] {
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": scope.labels()},
            "stringData": {"ca.crt": pem},
        }))
        .expect("secret");
        secrets
            .create(&Default::default(), &secret)
            .await
            .expect("CA Secret created");
    }
    // The right CA (key ca.crt by default), and, for the same sandboxd, another CA.
    scope.register(&host).await;
    let hosts = Api::<SandboxHost>::all(scope.client.clone());
    let good = host.name.clone();
    hosts
        .patch(
            &good,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "spec": {"caSecret": {"namespace": scope.ns, "name": "tls-ca"}}
            })),
        )
        .await
        .expect("caSecret set");
    let bad = format!("{}-wrong-ca", host.name);
    scope
        .register_endpoint_with(
            &bad,
            &host.endpoint(),
            &format!("{}-admin", host.name),
            serde_json::json!({"node": host.node, "caSecret": {"namespace": scope.ns, "name": "wrong-ca", "key": "ca.crt"}}),
        )
        .await;
    // A CA Secret outside the operator's namespace is refused unread, as an admin token is.
    let foreign = format!("{}-foreign-ca", host.name);
    scope
        .register_endpoint_with(
            &foreign,
            &host.endpoint(),
            &format!("{}-admin", host.name),
            serde_json::json!({"node": host.node, "caSecret": {"namespace": "kube-system", "name": "extension-apiserver-authentication", "key": "client-ca-file"}}),
        )
        .await;
    assert_eq!(
        hosts
            .get(&good)
            .await
            .expect("the host")
            .spec
            .ca_secret
            .map(|r| (r.name, r.key)),
        Some(("tls-ca".to_owned(), "ca.crt".to_owned())),
        "the API server kept spec.caSecret with its default key"
    );
    scope.default_runtime().await;
    scope.start_operator(&[]);

    let ready = wait_host(&scope.client, &good, "Ready over TLS", |h| {
        condition(h, "Ready").is_some_and(|c| c.status == "True")
    })
    .await;
    assert_eq!(ready.spec.endpoint, host.endpoint());
    let refused = wait_host(&scope.client, &bad, "refused for its certificate", |h| {
        condition(h, "Ready").is_some_and(|c| c.reason == "CertificateUntrusted")
    })
    .await;
    let message = |type_| {
        condition(&refused, type_)
            .map(|c| (c.status.clone(), c.message.clone()))
            .expect("the condition")
    };
    let untrusted = format!(
        "sandboxd at {} could not be reached: its TLS certificate is not trusted (invalid peer certificate: UnknownIssuer); this client trusts only the CA it was given",
        host.endpoint()
    );
    assert_eq!(
        message("Reachable"),
        ("False".to_owned(), untrusted.clone())
    );
    assert_eq!(
        message("Ready"),
        (
            "False".to_owned(),
            format!(
                "{untrusted}. Put the CA that signed sandboxd's certificate in the host's spec.caSecret (or the operator's --host-ca-file); the certificate must name the endpoint's address"
            )
        )
    );

    let refused_ca = wait_host(&scope.client, &foreign, "refused for its CA Secret", |h| {
        condition(h, "Ready").is_some_and(|c| c.reason == "CaUnusable")
    })
    .await;
    assert_eq!(
        condition(&refused_ca, "Ready").map(|c| c.message.clone()),
        Some(format!(
            "the CA of host {foreign} could not be used: spec.caSecret kube-system/extension-apiserver-authentication is not read: it must live in the operator's namespace {}, the only namespace the operator reads Secrets in",
            scope.ns
        ))
    );

    // A session reaches Running over TLS, on the host that trusts the right CA only.
    scope.kubectl_apply_session("xc-tls", serde_json::json!({}));
    let running = scope
        .wait_session("xc-tls", "Running", 90, |s| {
            phase(s) == Some(SessionPhase::Running)
        })
        .await;
    let status = running.status.clone().expect("status");
    assert_eq!(status.host.as_deref(), Some(good.as_str()));
    // The platform's Secret carries what it needs to talk to the host over https.
    let secret = secrets
        .get(
            status
                .credentials_secret
                .as_deref()
                .expect("a credentials Secret"),
        )
        .await
        .expect("the token Secret");
    let data = secret.data.clone().expect("data");
    let field = |k: &str| {
        String::from_utf8(data.get(k).map(|b| b.0.clone()).unwrap_or_default()).expect("utf-8")
    };
    assert_eq!(field("endpoint"), host.endpoint());
    assert_eq!(field("ca.crt"), ca.pem);
    let trust = sandboxd_api::client::Trust::ca(Some(field("ca.crt").as_bytes()), "ca.crt")
        .expect("the Secret's CA is usable");
    let platform =
        sandboxd_api::client::Client::with_trust(&field("endpoint"), &token_of(&secret), &trust);
    let ran = platform
        .run(
            status.session_id.as_deref().expect("a session id"),
            "echo platform-over-tls",
            None,
            None,
            None,
        )
        .await
        .expect("the platform runs a command over https with the Secret's token and CA");
    assert_eq!(ran.stdout.trim(), "platform-over-tls");

    scope.delete().await;
}
