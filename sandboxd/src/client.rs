//! Tests of the typed client of sandboxd's `/v1` API (`sandboxd_api::client`) against a
//! faked older server: they need a server, which the API crate does not carry.

use axum::Router;
use axum::http::StatusCode;
use sandboxd_api::client::*;
use serde_json::json;

/// Serves `router` on a free loopback port; the edge a unit test may fake.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

#[tokio::test]
async fn a_bare_404_is_a_version_mismatch_not_a_missing_session() {
    // An older server answers routes it lacks like a generic framework does.
    let base = serve(Router::new().fallback(|| async {
        (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"detail": "Not Found"})),
        )
    }))
    .await;
    let err = Client::new(&base, "t")
        .run("s-1", "true", None, None, None)
        .await
        .expect_err("must fail");
    match &err {
        ClientError::VersionMismatch { route, expected } => {
            assert_eq!(route, "POST /v1/sessions/{id}/runs");
            assert_eq!(expected, sandboxd_api::VERSION);
        }
        other => panic!("expected a version mismatch, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        format!(
            "The sandbox service does not serve POST /v1/sessions/{{id}}/runs - its version does not match this client (expected {})",
            sandboxd_api::VERSION
        )
    );
}

#[tokio::test]
async fn the_servers_own_404_is_no_such_session() {
    let base = serve(Router::new().fallback(|| async {
        crate::http::error::ApiError::from(crate::service::ServiceError::NoSuchSession {
            id: "s-1".into(),
        })
    }))
    .await;
    let err = Client::new(&base, "t")
        .get("s-1")
        .await
        .expect_err("must fail");
    assert!(
        matches!(err, ClientError::NoSuchSession(ref id) if id == "s-1"),
        "{err:?}"
    );
}
