//! Admin tokens per node: two real sandboxd processes share a master admin token and are told
//! different nodes (SANDBOXD_NODE_NAME); each takes only its own derived token, and neither takes
//! the master. Without a node, the master is the admin token, as on a single host. Given only the
//! hash of its node's token (SANDBOXD_NODE_TOKEN_HASHES, as the chart mounts the operator's
//! ConfigMap), a sandboxd holds no token at all and still takes exactly its own.

mod common;

use std::process::Command;

use common::{Daemon, raw, until};
use reqwest::Method;
use sandboxd::service::auth::{hash, node_token};
use serde_json::json;

/// What every refused token gets on `/v1`: 401 and this body, whatever was presented.
fn unauthorized() -> serde_json::Value {
    json!({"code": "unauthorized", "message": "a valid token is required: send Authorization: Bearer <token>"})
}

async fn sessions_with(d: &Daemon, token: &str) -> (u16, serde_json::Value) {
    raw(
        Method::GET,
        &format!("{}/v1/sessions", d.base),
        Some(token),
        None,
    )
    .await
}

#[tokio::test]
async fn a_nodes_token_opens_that_node_only_and_the_master_opens_none() {
    let master = format!("master-{:016x}", rand::random::<u64>());
    let a = Daemon::start(&[
        ("SANDBOXD_TOKEN", master.as_str()),
        ("SANDBOXD_NODE_NAME", "node-a"),
    ]);
    let b = Daemon::start(&[
        ("SANDBOXD_TOKEN", master.as_str()),
        ("SANDBOXD_NODE_NAME", "node-b"),
    ]);
    let (token_a, token_b) = (node_token(&master, "node-a"), node_token(&master, "node-b"));

    let (status, body) = sessions_with(&a, &token_a).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"sessions": []}));
    let (status, body) = sessions_with(&b, &token_b).await;
    assert_eq!(status, 200, "{body}");

    // One node's token opens nothing on the other, and the master opens neither.
    assert_eq!(sessions_with(&b, &token_a).await, (401, unauthorized()));
    assert_eq!(sessions_with(&a, &token_b).await, (401, unauthorized()));
    assert_eq!(sessions_with(&a, &master).await, (401, unauthorized()));
    assert_eq!(sessions_with(&b, &master).await, (401, unauthorized()));

    // The wire surface takes the same admin token, and refuses the same ones.
    let wire = |d: &Daemon, token: &str| {
        let url = format!("{}/sessions", d.base);
        let token = token.to_owned();
        async move {
            let resp = reqwest::Client::new()
                .get(url)
                .header("X-Sandbox-Token", token)
                .send()
                .await
                .expect("sandboxd answers");
            resp.status().as_u16()
        }
    };
    assert_eq!(wire(&a, &token_a).await, 200);
    assert_eq!(wire(&b, &token_a).await, 401);
    assert_eq!(wire(&a, &master).await, 401);

    // A session opened with node a's token is reached with it, never with node b's.
    let opened = a
        .client(&token_a)
        .open("per-node", "org-a", None, None)
        .await
        .expect("open with node a's token");
    assert!(opened.token.is_some());
    let (status, body) = raw(
        Method::GET,
        &format!("{}/v1/sessions/per-node", a.base),
        Some(&token_b),
        None,
    )
    .await;
    assert_eq!((status, body), (401, unauthorized()));
}

#[tokio::test]
async fn a_node_given_only_its_own_token_takes_it_and_never_sees_the_master() {
    let master = format!("master-{:016x}", rand::random::<u64>());
    let own = node_token(&master, "node-c");
    // The harness's own SANDBOXD_TOKEN is removed: this sandboxd is never given a master.
    let c = Daemon::start(&[
        ("SANDBOXD_TOKEN", ""),
        ("SANDBOXD_NODE_TOKEN", own.as_str()),
        ("SANDBOXD_NODE_NAME", "node-c"),
    ]);
    let (status, body) = sessions_with(&c, &own).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(sessions_with(&c, &master).await, (401, unauthorized()));
    assert_eq!(
        sessions_with(&c, &node_token(&master, "node-d")).await,
        (401, unauthorized())
    );
}

#[tokio::test]
async fn a_node_given_only_its_tokens_hash_takes_its_token_and_refuses_the_others() {
    let master = format!("master-{:016x}", rand::random::<u64>());
    let (own, other) = (node_token(&master, "node-e"), node_token(&master, "node-f"));
    // The directory as the chart mounts the ConfigMap: one file per node, each a hash.
    let hashes = tempfile::tempdir().expect("tempdir");
    std::fs::write(hashes.path().join("node-e"), hash(&own)).expect("write");
    std::fs::write(hashes.path().join("node-f"), hash(&other)).expect("write");
    let dir = hashes.path().to_str().expect("utf-8 path");
    let e = Daemon::start(&[
        ("SANDBOXD_TOKEN", ""),
        ("SANDBOXD_NODE_TOKEN_HASHES", dir),
        ("SANDBOXD_NODE_NAME", "node-e"),
    ]);
    let (status, body) = sessions_with(&e, &own).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"sessions": []}));
    // Another node's token, the master, and a hash presented as a token open nothing.
    assert_eq!(sessions_with(&e, &other).await, (401, unauthorized()));
    assert_eq!(sessions_with(&e, &master).await, (401, unauthorized()));
    assert_eq!(sessions_with(&e, &hash(&own)).await, (401, unauthorized()));
    let opened = e
        .client(&own)
        .open("by-hash", "org-e", None, None)
        .await
        .expect("open with node e's token");
    assert!(opened.token.is_some());
}

#[tokio::test]
async fn a_node_started_before_its_hash_exists_takes_its_token_once_it_is_written() {
    let master = format!("master-{:016x}", rand::random::<u64>());
    let own = node_token(&master, "node-g");
    let hashes = tempfile::tempdir().expect("tempdir");
    let dir = hashes.path().to_str().expect("utf-8 path");
    let g = Daemon::start(&[
        ("SANDBOXD_TOKEN", ""),
        ("SANDBOXD_NODE_TOKEN_HASHES", dir),
        ("SANDBOXD_NODE_NAME", "node-g"),
    ]);
    assert_eq!(sessions_with(&g, &own).await, (401, unauthorized()));
    // Written the way the kubelet updates a ConfigMap volume: a new folder swapped in
    // through the ..data symlink, the file a link into it.
    let data = hashes.path().join("..2026_01_01_00_00_00.1");
    std::fs::create_dir(&data).expect("mkdir");
    std::fs::write(data.join("node-g"), hash(&own)).expect("write");
    std::os::unix::fs::symlink(&data, hashes.path().join("..data")).expect("symlink");
    std::os::unix::fs::symlink("..data/node-g", hashes.path().join("node-g")).expect("symlink");
    let (status, body) = until(
        "sandboxd takes its token once its hash is written",
        std::time::Duration::from_secs(15),
        || async {
            let (status, body) = sessions_with(&g, &own).await;
            (status == 200).then_some((status, body))
        },
    )
    .await;
    assert_eq!((status, body), (200, json!({"sessions": []})));
    assert_eq!(sessions_with(&g, &master).await, (401, unauthorized()));
}

#[tokio::test]
async fn without_a_node_name_the_master_is_the_admin_token() {
    let d = Daemon::start(&[]);
    let (status, body) = sessions_with(&d, &d.token).await;
    assert_eq!(status, 200, "{body}");
    // A node's derived token is not the master: refused.
    assert_eq!(
        sessions_with(&d, &node_token(&d.token, "node-a")).await,
        (401, unauthorized())
    );
}

#[test]
fn admin_token_prints_the_nodes_token_from_the_master_in_the_environment() {
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["admin-token", "--node", "worker-1"])
        .env("SANDBOXD_TOKEN", "master-secret")
        .output()
        .expect("sandboxd runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // hmac.new(b"master-secret", b"sandboxd-admin-token/v1/worker-1", hashlib.sha256)
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "bbfec97528119c08a66defbe0f62aee6f7a0631364eb7af3de8340fea16add74\n"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["admin-token", "--node", "worker-1"])
        .env_remove("SANDBOXD_TOKEN")
        .output()
        .expect("sandboxd runs");
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "sandboxd admin-token: SANDBOXD_TOKEN (--token) is required: the master admin token that node tokens are derived from\n"
    );
}
