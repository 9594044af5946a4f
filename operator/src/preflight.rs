//! Start-up checks: the operator runs only where its CRDs are installed, and says how to
//! install them when they are not.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};

/// What the operator needs and did not find.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// Some CRDs are not installed (or not yet Established).
    #[error(
        "the sandboxd CRDs are not installed: {missing} missing. Install them with \
         `kubectl apply --server-side -f charts/sandboxd/crds/` (or `helm install` the chart, \
         which installs them), then start the operator again"
    )]
    MissingCrds {
        /// The missing CRD names, comma-separated.
        missing: String,
    },
    /// The API server could not be asked.
    #[error("could not read CRDs from the API server: {0}")]
    Kube(#[from] kube::Error),
}

/// The names of every CRD the operator needs.
pub fn required_crds() -> Vec<String> {
    sandboxd_crds::v1alpha1::crds()
        .into_iter()
        .filter_map(|crd| crd.metadata.name)
        .collect()
}

/// Succeeds when every required CRD exists and is Established.
pub async fn check_crds(client: &Client) -> Result<(), PreflightError> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let mut missing = Vec::new();
    for name in required_crds() {
        let established = api.get_opt(&name).await?.is_some_and(|crd| {
            crd.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
        if !established {
            missing.push(name);
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(PreflightError::MissingCrds {
            missing: missing.join(", "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requires_the_five_crds() {
        assert_eq!(
            required_crds(),
            [
                "sandboxsessions.sandboxd.dev",
                "runtimes.sandboxd.dev",
                "tombstones.sandboxd.dev",
                "sandboxhosts.sandboxd.dev",
                "sandboxsnapshots.sandboxd.dev"
            ]
        );
    }

    #[test]
    fn missing_crds_say_how_to_install_them() {
        let e = PreflightError::MissingCrds {
            missing: "runtimes.sandboxd.dev".into(),
        };
        assert_eq!(
            e.to_string(),
            "the sandboxd CRDs are not installed: runtimes.sandboxd.dev missing. Install them with \
             `kubectl apply --server-side -f charts/sandboxd/crds/` (or `helm install` the chart, \
             which installs them), then start the operator again"
        );
    }
}
