//! Runtimes against the real dockerd and the local base image: a small runtime (base image + an
//! apt package + a tiny pip package) builds and runs as the sandbox user; a changed definition
//! gets a new tag; a broken one ends failed with its log tail after the retries, answering 409
//! `runtime_preparing` while it builds and 503 `runtime_failed` after; `sandboxd prepare` names
//! a broken runtime; `PUT /v1/runtimes` validates the whole catalog first.

mod common;

use sandboxd_api::ErrorCode;
use std::time::Duration;

use common::{Daemon, base_image, raw, until};
use rand::Rng;
use reqwest::Method;
use sandboxd::runtimes::{RuntimeKind, RuntimeStatus};
use sandboxd_api::BuildState;
use sandboxd_api::client::ClientError;
use sandboxd_catalog::CatalogEntry;
use serde_json::json;

/// Builds of the python runtime may take minutes on a cold cache (apt and PyPI downloads).
const BUILD: Duration = Duration::from_secs(600);

fn pysix(greeting: &str) -> serde_json::Value {
    json!({
        "alias": "pysix",
        "description": "Debian with Python and six, for tests",
        "base_image": base_image(),
        "setup_commands": ["apt-get update && apt-get install -y --no-install-recommends python3 python3-venv && rm -rf /var/lib/apt/lists/*"],
        "packages": ["six"],
        "env_vars": {"GREETING": greeting},
        "briefing": ["six is there for tests."],
    })
}

async fn status(d: &Daemon, alias: &str) -> RuntimeStatus {
    d.admin()
        .runtimes()
        .await
        .expect("runtimes")
        .runtimes
        .into_iter()
        .find(|r| r.alias == alias)
        .unwrap_or_else(|| panic!("runtime {alias} is listed"))
}

#[tokio::test]
async fn a_built_runtime_has_its_packages_the_sandbox_user_and_a_writable_home() {
    let catalog = json!([pysix("hello there"), {"alias": "base", "image": base_image()}]);
    let d = Daemon::start(&[("SANDBOXD_RUNTIMES", &catalog.to_string())]);
    let admin = d.admin();
    let listed = admin.runtimes().await.expect("runtimes");
    assert!(listed.catalog);
    assert_eq!(
        listed
            .runtimes
            .iter()
            .map(|r| (r.alias.as_str(), r.kind, r.default))
            .collect::<Vec<_>>(),
        [
            ("pysix", RuntimeKind::Build, true),
            ("base", RuntimeKind::Image, false)
        ]
    );
    assert_eq!(
        listed.runtimes[1].state,
        BuildState::Ready,
        "a present image is ready at once"
    );
    let briefing = listed.runtimes[0]
        .briefing
        .as_deref()
        .expect("a catalog runtime has a briefing");
    assert!(briefing.starts_with("Your sandbox runs the `pysix` runtime: Debian with Python and six, for tests. Python packages installed: six. six is there for tests. It has no network"), "{briefing}");
    let tag = listed.runtimes[0].tag.clone();
    assert!(tag.starts_with("sandboxd-runtime/pysix:"), "{tag}");

    let ready = until("pysix is built", BUILD, || async {
        let s = status(&d, "pysix").await;
        assert_ne!(
            s.state,
            BuildState::Failed,
            "the test runtime failed to build: {s:?}"
        );
        (s.state == BuildState::Ready).then_some(s)
    })
    .await;
    assert_eq!(ready.tag, tag);

    let opened = admin
        .open("py-1", "org-rt", None, None)
        .await
        .expect("open on the default runtime");
    assert_eq!(
        (
            opened.session.runtime.as_str(),
            opened.session.image.as_str()
        ),
        ("pysix", tag.as_str())
    );
    let s = d.client(opened.token.as_deref().expect("token"));
    let run = s
        .run(
            "py-1",
            "python -c 'import six; print(six.__name__)' && id -u && id -un && echo $HOME && touch ~/probe && ls ~ && echo $GREETING && stat -c %u /opt/venv",
            None,
            None,
            None,
        )
        .await
        .expect("run");
    assert_eq!(
        (run.exit_code, run.stdout.as_str(), run.stderr.as_str()),
        (
            0,
            "six\n10001\nsandbox\n/home/sandbox\nprobe\nhello there\n10001\n",
            ""
        )
    );
    // The sandbox user owns the virtualenv, so an agent can add to it (no network here: a
    // local no-op install shows pip works for that user).
    let pip = s
        .run("py-1", "pip --version", None, None, None)
        .await
        .expect("pip");
    assert!(pip.stdout.contains("/opt/venv"), "{pip:?}");

    // The same definition again keeps its image; a changed one gets a new tag and builds.
    let same = admin
        .put_runtimes(
            &serde_json::from_value::<Vec<CatalogEntry>>(catalog.clone()).expect("entries"),
        )
        .await
        .expect("put the same");
    assert_eq!(
        (same.runtimes[0].state, same.runtimes[0].tag.as_str()),
        (BuildState::Ready, tag.as_str())
    );
    let changed = json!([pysix("changed"), {"alias": "base", "image": base_image()}]);
    let after = admin
        .put_runtimes(&serde_json::from_value::<Vec<CatalogEntry>>(changed).expect("entries"))
        .await
        .expect("put a changed one");
    assert_ne!(
        after.runtimes[0].tag, tag,
        "a changed definition gets a new tag"
    );
    let rebuilt = until("the changed pysix is built", BUILD, || async {
        let s = status(&d, "pysix").await;
        assert_ne!(s.state, BuildState::Failed, "{s:?}");
        (s.state == BuildState::Ready).then_some(s)
    })
    .await;
    assert_eq!(rebuilt.tag, after.runtimes[0].tag);
    admin
        .open("py-2", "org-rt", Some("pysix"), None)
        .await
        .expect("open on the new image");
    let greeting = d
        .client(admin.rotate_token("py-2").await.expect("token").as_str())
        .run("py-2", "echo $GREETING", None, None, None)
        .await
        .expect("run");
    assert_eq!(greeting.stdout, "changed\n");
}

/// Puts a catalog of one small built runtime (the base image and `GREETING`) beside `base`,
/// waits until it is built, and returns its tag.
async fn build_greeting(d: &Daemon, alias: &str, greeting: &str) -> String {
    let catalog = json!([
        {"alias": alias, "base_image": base_image(), "env_vars": {"GREETING": greeting}},
        {"alias": "base", "image": base_image()},
    ]);
    let put = d
        .admin()
        .put_runtimes(&serde_json::from_value::<Vec<CatalogEntry>>(catalog).expect("entries"))
        .await
        .expect("put the catalog");
    let tag = put.runtimes[0].tag.clone();
    let built = until(&format!("{alias} ({greeting}) is built"), BUILD, || async {
        let s = status(d, alias).await;
        assert_ne!(s.state, BuildState::Failed, "{s:?}");
        (s.state == BuildState::Ready).then_some(s)
    })
    .await;
    assert_eq!(built.tag, tag);
    tag
}

#[tokio::test]
async fn superseded_images_are_pruned_after_a_build_unless_a_session_uses_them() {
    // An alias of this test alone: pruning looks at every image built for an alias.
    let alias = format!("prune-{:08x}", rand::rng().random::<u32>());
    let d = Daemon::start(&[]);
    let docker = sandboxd::container::Engine::connect("prune-test")
        .await
        .expect("docker");
    let present = |tag: String| {
        let docker = &docker;
        async move { docker.has_image(&tag).await.expect("image inspect") }
    };
    let first = build_greeting(&d, &alias, "first").await;
    let admin = d.admin();
    let opened = admin
        .open("on-first", "org-prune", Some(&alias), None)
        .await
        .expect("open on the first image");
    assert_eq!(opened.session.image, first);
    let s = d.client(opened.token.as_deref().expect("token"));

    // A changed definition builds a new tag; the old one stays while a session runs on it.
    let second = build_greeting(&d, &alias, "second").await;
    assert_ne!(second, first, "a changed definition gets a new tag");
    assert!(
        present(second.clone()).await,
        "the new image {second} is there"
    );
    assert!(
        present(first.clone()).await,
        "the image {first} of a running session was pruned"
    );
    let run = s
        .run("on-first", "echo $GREETING", None, None, None)
        .await
        .expect("run on the first image");
    assert_eq!(run.stdout, "first\n");
    // Asleep, its session still uses it.
    admin.stop("on-first").await.expect("sleep");
    let third = build_greeting(&d, &alias, "third").await;
    assert!(
        present(first.clone()).await,
        "the image {first} of a sleeping session was pruned"
    );
    assert!(
        !present(second.clone()).await,
        "the superseded image {second}, which no session used, is still there"
    );
    let woken = s
        .run("on-first", "echo $GREETING", None, None, None)
        .await
        .expect("a run wakes the session on its image");
    assert_eq!(woken.stdout, "first\n");

    // Once no session uses it, the next build prunes it; the newest stays.
    admin.destroy("on-first").await.expect("destroy");
    let fourth = build_greeting(&d, &alias, "fourth").await;
    assert!(
        !present(first.clone()).await,
        "the superseded image {first} is still there after its session went"
    );
    assert!(
        !present(third.clone()).await,
        "the superseded image {third} is still there"
    );
    assert!(
        present(fourth.clone()).await,
        "the newest image {fourth} is there"
    );

    // The test's images go with it.
    let catalog = json!([{"alias": "base", "image": base_image()}]);
    admin
        .put_runtimes(&serde_json::from_value::<Vec<CatalogEntry>>(catalog).expect("entries"))
        .await
        .expect("put the base catalog");
    let _ = docker
        .docker()
        .expect("a Docker client")
        .client()
        .remove_image(
            &fourth,
            None::<bollard::query_parameters::RemoveImageOptions>,
            None,
        )
        .await;
}

#[tokio::test]
async fn a_broken_runtime_answers_preparing_then_fails_with_its_log_tail() {
    // A unique definition, so the build really runs (never cached), slow enough to be seen.
    let nonce: u64 = rand::rng().random();
    let catalog = json!([
        {"alias": "base", "image": base_image()},
        {"alias": "broken", "base_image": base_image(), "setup_commands": [format!("echo nonce {nonce:x}; sleep 2; echo 'step two broke' >&2; exit 3")]},
    ]);
    let d = Daemon::start(&[
        ("SANDBOXD_RUNTIMES", &catalog.to_string()),
        ("SANDBOXD_BUILD_BACKOFF", "1"),
    ]);
    let admin = d.admin();
    match admin.open("b-1", "org-b", Some("broken"), None).await {
        Err(ClientError::Api {
            status: 409,
            code,
            message,
        }) => {
            assert_eq!(code, ErrorCode::RuntimePreparing);
            assert!(
                message.starts_with(
                    "Runtime 'broken' is being prepared (its image sandboxd-runtime/broken:"
                ),
                "{message}"
            );
        }
        other => panic!("expected 409 runtime_preparing, got {other:?}"),
    }
    // The default runtime is not held up by it.
    admin
        .open("b-0", "org-b", None, None)
        .await
        .expect("open on base");

    let failed = until("broken ends failed", Duration::from_secs(120), || async {
        let s = status(&d, "broken").await;
        (s.state == BuildState::Failed).then_some(s)
    })
    .await;
    assert_eq!(
        failed.attempts, 3,
        "tried at start, then twice more: {failed:?}"
    );
    let tail = failed.log_tail.clone().expect("a log tail");
    assert!(tail.contains("step two broke"), "{tail}");
    let error = failed.last_error.clone().expect("an error");
    assert!(
        error.starts_with(&format!("building {} failed: ", failed.tag)),
        "{error}"
    );
    assert!(error.contains("returned a non-zero code: 3"), "{error}");

    let (code, body) = raw(
        Method::POST,
        &format!("{}/v1/sessions", d.base),
        Some(&d.token),
        Some(r#"{"name": "b-2", "tenant": "org-b", "runtime": "broken"}"#),
    )
    .await;
    assert_eq!((code, body["code"].as_str()), (503, Some("runtime_failed")));
    let message = body["message"].as_str().expect("message");
    assert!(
        message.starts_with(&format!("Runtime 'broken' could not be built after 3 attempts: {error}\nLast lines of the build log:\n")),
        "{message}"
    );
    assert!(message.contains("step two broke"), "{message}");
    assert!(
        admin
            .list()
            .await
            .expect("list")
            .iter()
            .all(|s| s.id != "b-2"),
        "a refused open holds nothing"
    );
}

#[tokio::test]
async fn put_runtimes_validates_the_whole_catalog_and_needs_the_admin_token() {
    let d = Daemon::start(&[]);
    let admin = d.admin();
    let before = admin.runtimes().await.expect("runtimes");
    assert!(!before.catalog, "the compact form has no briefings");
    assert_eq!(
        before
            .runtimes
            .iter()
            .map(|r| (r.alias.as_str(), r.state, r.briefing.is_none()))
            .collect::<Vec<_>>(),
        [
            ("base", BuildState::Ready, true),
            ("alt", BuildState::Ready, true)
        ]
    );
    let (code, body) = raw(
        Method::PUT,
        &format!("{}/v1/runtimes", d.base),
        Some(&d.token),
        Some(r#"[{"alias": "ok", "image": "x"}, {"alias": "Bad", "image": "a", "base_image": "b"}, {"alias": "ok", "packages": "six"}]"#),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(
        body,
        json!({"code": "invalid_catalog", "message": "the runtime catalog is invalid (5 errors):\n  - entry 2 (Bad): alias: 'Bad' must match [a-z][a-z0-9-]* (a lowercase letter, then lowercase letters, digits or '-')\n  - entry 2 (Bad): image: image and base_image exclude each other: image is used as is, base_image is built\n  - entry 3 (ok): image: one of image (a ready image) and base_image (built on the host) is required\n  - entry 3 (ok): packages: must be a list of strings\n  - entry 3 (ok): alias: 'ok' is already used by an earlier entry; aliases must be unique"})
    );
    assert_eq!(
        admin.runtimes().await.expect("unchanged"),
        before,
        "a refused catalog changes nothing"
    );

    let opened = admin.open("pr-1", "org-p", None, None).await.expect("open");
    let session = d.client(opened.token.as_deref().expect("token"));
    match session.put_runtimes(&[]).await {
        Err(ClientError::Api {
            status: 403, code, ..
        }) => assert_eq!(code, ErrorCode::Forbidden),
        other => panic!("expected 403, got {other:?}"),
    }
    assert_eq!(
        session.runtimes().await.expect("a session may read them"),
        before
    );

    let entries: Vec<CatalogEntry> = serde_json::from_value(
        json!([{"alias": "only", "image": base_image(), "description": "the one"}]),
    )
    .expect("entries");
    let after = admin.put_runtimes(&entries).await.expect("replace");
    assert!(after.catalog);
    assert_eq!(after.runtimes.len(), 1);
    assert_eq!(
        (after.runtimes[0].state, after.runtimes[0].default),
        (BuildState::Ready, true)
    );
    match admin.open("pr-2", "org-p", Some("base"), None).await {
        Err(ClientError::Api {
            status: 400,
            code,
            message,
        }) => {
            assert_eq!(code, ErrorCode::UnknownRuntime);
            assert_eq!(
                message,
                "Runtime 'base' is not allowed on this host; allowed: only"
            );
        }
        other => panic!("expected unknown_runtime, got {other:?}"),
    }
    // A session opened on a runtime that left the list is still found by name.
    assert!(
        !admin
            .open("pr-1", "org-p", None, None)
            .await
            .expect("found")
            .created
    );
}

#[test]
fn prepare_builds_the_allowlist_and_names_a_broken_runtime() {
    common::base_image();
    let nonce: u64 = rand::rng().random();
    let catalog = json!([
        {"alias": "base", "image": base_image()},
        {"alias": "broken", "base_image": base_image(), "setup_commands": [format!("echo {nonce:x}; exit 7")]},
    ]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .arg("prepare")
        .env("SANDBOXD_RUNTIMES", catalog.to_string())
        .env("SANDBOXD_BUILD_BACKOFF", "0")
        .env("RUST_LOG", "warn")
        .output()
        .expect("sandboxd prepare runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert_eq!(stdout, format!("ready base {}\n", base_image()));
    assert!(
        stderr.contains("failed broken after 3 attempts: building sandboxd-runtime/broken:"),
        "{stderr}"
    );
    assert!(
        stderr.ends_with("sandboxd prepare: these runtimes could not be built: broken\n"),
        "{stderr}"
    );

    let ok = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .arg("prepare")
        .env("SANDBOXD_RUNTIMES", format!("base={}", base_image()))
        .env("RUST_LOG", "warn")
        .output()
        .expect("sandboxd prepare runs");
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}
