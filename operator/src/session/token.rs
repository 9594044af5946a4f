//! The session's token Secret, which the session owns: stored once an open hands out a token
//! (replaced whole after a rotation), and asked after without reading any Secret (a
//! server-side dry-run create), at most every `--token-check-seconds`.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::{Api, Resource, ResourceExt};
use sandboxd_crds::v1alpha1::SandboxSession;
use tracing::warn;

use super::MANAGER;
use crate::context::{Context, key};
use crate::error::Error;

/// The label on every token Secret this operator makes.
const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Its value.
const OPERATOR: &str = "sandbox-operator";

/// Stores `token` (with the endpoint, the session's id on its host and the host's CA) in the
/// token Secret `name` of session `s`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn store_token(
    s: &SandboxSession,
    secrets: &Api<Secret>,
    name: &str,
    token: &str,
    endpoint: &str,
    session_id: &str,
    ca: Option<&[u8]>,
) -> Result<(), Error> {
    let mut data = BTreeMap::from([
        ("token".to_owned(), ByteString(token.as_bytes().to_vec())),
        (
            "endpoint".to_owned(),
            ByteString(endpoint.as_bytes().to_vec()),
        ),
        (
            "session".to_owned(),
            ByteString(session_id.as_bytes().to_vec()),
        ),
    ]);
    // The CA that signed the host's certificate, for a platform that talks to it over https.
    if let Some(ca) = ca {
        data.insert("ca.crt".to_owned(), ByteString(ca.to_vec()));
    }
    let secret = Secret {
        data: Some(data),
        ..token_secret(s, name)
    };
    // Created once, the common case: a plain create costs the API server far less than an
    // apply. One that exists already (a token rotated after a crash) is replaced whole: a
    // replace answers with what it wrote, where a patch would answer with the Secret it changed,
    // and the operator may not read Secrets outside its namespace.
    let create = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    match secrets.create(&create, &secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            secrets.replace(name, &create, &secret).await?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The token Secret `name` of session `s`, without its data: owned by the session, labelled like
/// it and as this operator's.
fn token_secret(s: &SandboxSession, name: &str) -> Secret {
    let owner = s.controller_owner_ref(&()).into_iter().collect::<Vec<_>>();
    let mut labels = s.labels().clone();
    labels.insert(MANAGED_BY.into(), OPERATOR.into());
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            owner_references: Some(owner),
            labels: Some(labels),
            ..Default::default()
        },
        type_: Some("sandboxd.dev/session-token".into()),
        ..Default::default()
    }
}

/// Whether the token Secret `name` of `s` is there: taken as there for
/// `--token-check-seconds` after it was last found, then asked again.
pub(super) async fn token_secret_there(
    s: &SandboxSession,
    ctx: &Context,
    secrets: &Api<Secret>,
    name: &str,
) -> bool {
    if ctx.token_seen_recently(&key(s)) {
        return true;
    }
    let there = token_secret_exists(s, secrets, name).await;
    if there {
        ctx.token_seen(&key(s));
    }
    there
}

/// Whether the token Secret `name` exists, asked without reading any Secret: a server-side
/// dry-run create (of the Secret as it would be made, without its data, so admission judges
/// the same object) answers 409 AlreadyExists when it is there and succeeds, storing nothing,
/// when it is gone. Any other answer (a full Secret quota, an admission webhook, the API server
/// away) counts as there: a token is rotated only when its Secret is known to be gone.
async fn token_secret_exists(s: &SandboxSession, secrets: &Api<Secret>, name: &str) -> bool {
    let probe = token_secret(s, name);
    let dry_run = PostParams {
        dry_run: true,
        field_manager: Some(MANAGER.into()),
    };
    match secrets.create(&dry_run, &probe).await {
        Ok(_) => false,
        Err(kube::Error::Api(e)) if e.code == 409 => true,
        Err(e) => {
            warn!(secret = name, error = %e, "could not tell whether the token Secret exists; taking it as there");
            true
        }
    }
}
