//! Egress credentials through the operator (#30): a Runtime (allowlist api.test) whose
//! credential comes from a labelled Secret in the operator's namespace; a session of it reaches
//! api.test of a test internet that answers only the right `Authorization`, with no key inside
//! the sandbox. The Secret edited reaches the sandbox within 5 s; deleted, requests are answered
//! 502 in words naming the Secret; a session of another namespace naming a Secret of that name
//! (which exists only in the first) never gets the key; a credential whose host its policies do
//! not allow is refused with words, the session running on; the CRD refuses what it can say
//! alone. A restarted sandboxd is handed them again; removed, the host is handed none. No
//! status, event or object ever holds a key. Against the stack of `make up` (see
//! `common`), with the tools image (curl) and root for the test internet.

mod common;

use std::time::{Duration, Instant};

use common::{Host, Scope, phase};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use rand::Rng;
use sandboxd_crds::v1alpha1::session::SessionPhase;
use sandboxd_crds::v1alpha1::{Runtime, SandboxSession};
use sandboxd_testkit::internet::{Internet, Range, Spec};
use sandboxd_tests::TestNamespace;
use serde_json::json;

/// The label a credential's Secret carries.
const LABEL: &str = "sandboxd.dev/egress-credential";

/// A key nobody could guess: found anywhere, it leaked.
fn new_key() -> String {
    format!("sk-op-{:032x}", rand::rng().random::<u128>())
}

/// Creates (or replaces the data of) labelled Secret `name` in `ns` with `token` = `key`.
async fn put_secret(scope: &Scope, ns: &str, name: &str, key: &str) {
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "labels": {LABEL: "true"}},
        "stringData": {"token": key},
    });
    Api::<Secret>::namespaced(scope.client.clone(), ns)
        .patch(
            name,
            &PatchParams::apply("credentials-test").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("secret written");
}

/// Creates Runtime `name` of this scope: the tools image, `egress` as given.
async fn runtime(scope: &Scope, name: &str, egress: serde_json::Value) -> Result<(), String> {
    let rt: Runtime = serde_json::from_value(json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": name, "labels": scope.labels()},
        "spec": {"description": "credentials test", "image": sandboxd_testkit::tools_image(), "egress": egress},
    }))
    .expect("runtime");
    Api::<Runtime>::all(scope.client.clone())
        .create(&PostParams::default(), &rt)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Creates session `name` in `ns` of this scope with `spec`'s further fields.
async fn session(scope: &Scope, ns: &str, name: &str, spec: serde_json::Value) {
    let mut full = json!({"scope": "conversation", "tenant": "org-1", "subject": name});
    if let (Some(f), Some(s)) = (full.as_object_mut(), spec.as_object()) {
        f.extend(s.clone());
    }
    let s: SandboxSession = serde_json::from_value(json!({
        "apiVersion": "sandboxd.dev/v1alpha1", "kind": "SandboxSession",
        "metadata": {"name": name, "namespace": ns, "labels": scope.labels()},
        "spec": full,
    }))
    .expect("session");
    Api::<SandboxSession>::namespaced(scope.client.clone(), ns)
        .create(&PostParams::default(), &s)
        .await
        .expect("session created");
}

/// The session's condition of `type_`: (status, reason, message).
fn condition(s: &SandboxSession, type_: &str) -> Option<(String, String, String)> {
    s.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Runs `command` in session `id` on `host` (admin client): exit code and output.
async fn sh(host: &Host, id: &str, command: &str) -> (i64, String) {
    let out = host
        .client()
        .run(id, command, Some(30), None, None)
        .await
        .unwrap_or_else(|e| panic!("run {command}: {e}"));
    (out.exit_code, format!("{}{}", out.stdout, out.stderr))
}

/// `curl` of https://api.test/ from the sandbox: the HTTP status, then the body.
const CURL: &str = "curl -sS --max-time 5 -w '\\n%{http_code}' https://api.test/";

/// The status and body of [`CURL`] in session `id`.
async fn get_api(host: &Host, id: &str) -> (String, String) {
    let (_, out) = sh(host, id, CURL).await;
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", &out));
    (code.trim().to_owned(), body.to_owned())
}

/// Asks api.test from session `id` until the status is `want`, within 5 s; the body.
async fn within_5_s(host: &Host, id: &str, want: &str, what: &str) -> String {
    let started = Instant::now();
    loop {
        let (code, body) = get_api(host, id).await;
        if code == want {
            return body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what} within 5 s: {code} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_from_secrets_reach_the_proxy_and_never_the_sandbox_or_the_status() {
    let mut scope = Scope::new("credentials").await;
    let other = TestNamespace::create(&scope.client, "credentials-other").await;
    let scratch = tempfile::tempdir().expect("a temp dir");
    let expected = scratch.path().join("expected");
    let keys = [new_key(), new_key(), new_key()];
    std::fs::write(&expected, format!("Bearer {}\n", keys[0])).expect("the server's key");
    let net = Internet::start(
        Spec::new()
            .host("api.test", Range::TestNet2)
            .host("other.test", Range::TestNet2)
            .auth("api.test", "Authorization", &expected),
    )
    .expect("the test internet starts (root and iproute2 are needed)");
    let resolver = net.dns().to_string();
    let upstream = net.ca_file().display().to_string();
    let mut host = Host::start(
        &format!("cr-{}", scope.scope),
        &[
            ("SANDBOXD_EGRESS_RESOLVER", resolver.as_str()),
            ("SANDBOXD_EGRESS_UPSTREAM_CA", upstream.as_str()),
        ],
    );
    scope.register(&host).await;
    let secret = "model-key";
    put_secret(&scope, &scope.ns, secret, &keys[0]).await;
    let agents = format!("agents-{}", scope.scope);
    let plain = format!("plain-{}", scope.scope);
    let allow = json!([{"domain": "api.test"}, {"domain": "other.test"}]);
    runtime(
        &scope,
        &agents,
        json!({"mode": "allowlist", "allow": allow, "credentials": [
            {"host": "api.test", "format": "Bearer {}", "secretRef": {"name": secret, "key": "token"}}]}),
    )
    .await
    .expect("the Runtime is accepted");
    runtime(&scope, &plain, json!({"mode": "allowlist", "allow": allow}))
        .await
        .expect("the Runtime is accepted");

    // What the CRD says alone: credentials only with an allowlist, an exact host, no namespace.
    for (egress, words) in [
        (
            json!({"mode": "open", "credentials": [{"host": "api.test", "secretRef": {"name": "k", "key": "t"}}]}),
            "egress.credentials is allowed only with mode allowlist",
        ),
        (
            json!({"mode": "allowlist", "allow": allow, "credentials": [{"host": "*.test", "secretRef": {"name": "k", "key": "t"}}]}),
            "egress.credentials[].host must be an exact lowercase DNS name",
        ),
        (
            json!({"mode": "allowlist", "allow": allow, "credentials": [{"host": "api.test", "format": "Bearer", "secretRef": {"name": "k", "key": "t"}}]}),
            "egress.credentials[].format must contain {} exactly once",
        ),
        (
            json!({"mode": "allowlist", "allow": allow, "credentials": [{"host": "api.test", "header": "Host", "secretRef": {"name": "k", "key": "t"}}]}),
            "egress.credentials[].header may not be Host",
        ),
        (
            json!({"mode": "allowlist", "allow": allow, "credentials": [{"host": "api.test", "secretRef": {"name": "k", "key": "t", "namespace": "elsewhere"}}]}),
            "egress.credentials[].secretRef.namespace is not allowed",
        ),
    ] {
        let refused = runtime(&scope, &format!("refused-{}", scope.scope), egress)
            .await
            .expect_err("refused by the API server");
        assert!(refused.contains(words), "{refused}");
    }

    // A probe period of 2 s: a restarted sandboxd (which holds no credentials) is seen soon.
    scope.start_operator(&["--follow-seconds", "2"]);
    session(&scope, &scope.ns, "xc-cred", json!({"runtime": agents})).await;
    let id = scope.host_id("xc-cred");
    let s = scope
        .wait_session("xc-cred", "Running with its credentials", 120, |s| {
            phase(s) == Some(SessionPhase::Running)
                && condition(s, "CredentialsApplied").is_some_and(|c| c.0 == "True")
        })
        .await;
    let shown = &s.status.as_ref().expect("a status").credentials;
    assert_eq!(
        serde_json::to_value(shown).expect("serialises"),
        json!([{"host": "api.test", "ports": [443], "header": "Authorization",
            "source": format!("Secret {}/{secret}, key token", scope.ns), "ready": true}])
    );
    let body = net.body("api.test").expect("a body");
    // From the sandbox, no key inside: 200.
    assert_eq!(within_5_s(&host, &id, "200", "the key added").await, body);
    let (_, env) = sh(&host, &id, "env; cat /proc/1/environ").await;
    assert!(!env.contains(&keys[0]), "the sandbox holds the key");

    // The Secret edited, and the server's key with it: the new key within 5 s.
    std::fs::write(&expected, format!("Bearer {}\n", keys[1])).expect("the server's key");
    put_secret(&scope, &scope.ns, secret, &keys[1]).await;
    within_5_s(&host, &id, "200", "the rotated key").await;

    // Deleted: 502 in words naming the Secret, never a key.
    Api::<Secret>::namespaced(scope.client.clone(), &scope.ns)
        .delete(secret, &DeleteParams::default())
        .await
        .expect("secret deleted");
    let words = within_5_s(&host, &id, "502", "the missing Secret answered").await;
    assert!(
        words.contains(&format!("Secret {}/{secret}", scope.ns)),
        "{words}"
    );
    assert!(keys.iter().all(|k| !words.contains(k)), "{words}");
    let s = scope
        .wait_session("xc-cred", "told the Secret is missing", 10, |s| {
            condition(s, "CredentialsApplied").is_some_and(|c| c.1 == "CredentialSecretMissing")
        })
        .await;
    let (_, _, m) = condition(&s, "CredentialsApplied").expect("condition");
    assert!(
        m.contains(&format!(
            "Secret {}/{secret} was not found (a credential's Secret must exist in the operator's namespace {} and carry the label {LABEL}=true)",
            scope.ns, scope.ns
        )),
        "{m}"
    );
    assert_eq!(phase(&s), Some(SessionPhase::Running));

    // Made again (a third key): used again within 5 s.
    std::fs::write(&expected, format!("Bearer {}\n", keys[2])).expect("the server's key");
    put_secret(&scope, &scope.ns, secret, &keys[2]).await;
    within_5_s(&host, &id, "200", "the Secret made again").await;

    // Another namespace naming a Secret of that name (only in the first): never the key.
    session(
        &scope,
        &other.name,
        "xc-other",
        json!({"runtime": plain, "egress": {"mode": "allowlist", "allow": [{"domain": "api.test"}],
            "credentials": [{"host": "api.test", "format": "Bearer {}", "secretRef": {"name": secret, "key": "token"}}]}}),
    )
    .await;
    let s = scope
        .wait_session_in(
            &other.name,
            "xc-other",
            "Running, its credential missing",
            120,
            |s| {
                phase(s) == Some(SessionPhase::Running)
                    && condition(s, "CredentialsApplied")
                        .is_some_and(|c| c.1 == "CredentialSecretMissing")
            },
        )
        .await;
    let shown = &s.status.as_ref().expect("a status").credentials;
    assert_eq!(shown.len(), 1);
    assert!(!shown[0].ready);
    assert_eq!(
        shown[0].message.as_deref(),
        Some(format!("Secret {}/{secret} was not found (a credential's Secret must exist in the session's namespace and carry the label {LABEL}=true)", other.name).as_str())
    );
    let other_id = sandboxd_crds::key::host_session_id(&other.name, "xc-other");
    let words = within_5_s(
        &host,
        &other_id,
        "502",
        "the other namespace's missing Secret",
    )
    .await;
    assert!(
        words.contains(&format!("Secret {}/{secret}", other.name)),
        "{words}"
    );
    assert!(keys.iter().all(|k| !words.contains(k)), "{words}");

    // A credential whose host its Runtime does not allow: refused in words, the session runs.
    session(
        &scope,
        &scope.ns,
        "xc-refused",
        json!({"runtime": agents, "egress": {"mode": "allowlist", "allow": [{"domain": "api.test"}],
            "credentials": [{"host": "denied.test", "secretRef": {"name": secret, "key": "token"}}]}}),
    )
    .await;
    let s = scope
        .wait_session("xc-refused", "told its credential is refused", 120, |s| {
            phase(s) == Some(SessionPhase::Running)
                && condition(s, "CredentialsApplied").is_some_and(|c| c.0 == "False")
        })
        .await;
    assert_eq!(
        condition(&s, "CredentialsApplied"),
        Some((
            "False".into(),
            "CredentialInvalid".into(),
            format!(
                "spec.egress.credentials[0]: denied.test:443 is not on the allow list of Runtime '{agents}' (allowlist: api.test, other.test): allow it there or remove the credential; host {} keeps the credentials it held",
                host.name
            )
        ))
    );

    // sandboxd restarted holds none (memory only): handed them again at the next look.
    host.kill9();
    host.spawn();
    let started = Instant::now();
    loop {
        let (code, _) = get_api(&host, &id).await;
        if code == "200" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the key handed again after a restart: {code}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The Runtime's credentials removed: the host is handed an empty set, the status shows none.
    Api::<Runtime>::all(scope.client.clone())
        .patch(
            &agents,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"egress": {"credentials": null}}})),
        )
        .await
        .expect("the Runtime's credentials removed");
    let s = scope
        .wait_session("xc-cred", "without credentials", 10, |s| {
            s.status
                .as_ref()
                .is_some_and(|st| st.credentials.is_empty())
                && condition(s, "CredentialsApplied").is_none()
        })
        .await;
    assert_eq!(phase(&s), Some(SessionPhase::Running));
    let held = host
        .client()
        .get(&id)
        .await
        .expect("the session on its host");
    assert_eq!(
        held.credentials_version,
        Some(sandboxd_operator::credentials::empty_version())
    );
    assert_ne!(get_api(&host, &id).await.0, "200", "no key added any more");

    // No key in any session, nor in any event of either namespace.
    for ns in [scope.ns.as_str(), other.name.as_str()] {
        let sessions = Api::<SandboxSession>::namespaced(scope.client.clone(), ns)
            .list(&ListParams::default())
            .await
            .expect("sessions");
        let events = Api::<Event>::namespaced(scope.client.clone(), ns)
            .list(&ListParams::default())
            .await
            .expect("events");
        let text = format!(
            "{}{}",
            serde_json::to_string(&sessions.items).expect("serialises"),
            serde_json::to_string(&events.items).expect("serialises")
        );
        assert!(text.contains("CredentialsApplied"), "events were published");
        for k in &keys {
            assert!(!text.contains(k.as_str()), "a key in {ns}'s objects");
        }
    }
    other.delete().await;
    scope.delete().await;
}
