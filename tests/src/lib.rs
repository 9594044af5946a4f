//! The harness of the end-to-end tests: a client for the real control plane that `make up`
//! started, a randomly named and labelled namespace per test, the CRDs installed from the chart,
//! and waits that watch with a deadline.
//!
//! A test that needs the control plane and cannot reach it fails, naming what is missing and
//! the command that starts it; it never skips.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Config};
use rand::Rng;

pub mod bench;
pub mod host;

// The parts every test crate shares, under this crate's name too.
pub use sandboxd_testkit::{pki, poll, process, until};

/// The field manager of everything the tests apply.
pub const FIELD_MANAGER: &str = "sandboxd-tests";
/// The label every test namespace carries, so leftovers can be found and removed.
pub const TEST_LABEL: &str = "sandboxd.dev/test";
/// How long a wait for the API server may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn need(what: &str) -> ! {
    panic!(
        "{what}: start the local control plane with `make up` (and `eval \"$(make env)\"`), or run `make test`, which does both"
    )
}

/// The client configuration of the control plane named by `KUBECONFIG`. Panics (fails the
/// test) when it is unset or unusable.
pub async fn kube_config() -> Config {
    let Ok(path) = std::env::var("KUBECONFIG") else {
        need("KUBECONFIG is not set")
    };
    let kubeconfig = Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| need(&format!("cannot read KUBECONFIG {path}: {e}")));
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| need(&format!("KUBECONFIG {path} is not usable: {e}")))
}

/// A client for the control plane named by `KUBECONFIG`. Panics (fails the test) when it is unset
/// or the API server does not answer.
pub async fn client() -> Client {
    let config = kube_config().await;
    let path = std::env::var("KUBECONFIG").unwrap_or_default();
    let client =
        Client::try_from(config).unwrap_or_else(|e| need(&format!("no client for {path}: {e}")));
    if let Err(e) = client.apiserver_version().await {
        need(&format!("the API server of {path} does not answer ({e})"));
    }
    client
}

/// The path of the pinned `kubectl` (`SANDBOXD_KUBECTL`, set by `make env`).
pub fn kubectl() -> PathBuf {
    match std::env::var("SANDBOXD_KUBECTL") {
        Ok(path) => PathBuf::from(path),
        Err(_) => need("SANDBOXD_KUBECTL is not set"),
    }
}

/// The path of the pinned `helm` (`SANDBOXD_HELM`, set by `make env`).
pub fn helm() -> PathBuf {
    match std::env::var("SANDBOXD_HELM") {
        Ok(path) => PathBuf::from(path),
        Err(_) => need("SANDBOXD_HELM is not set"),
    }
}

/// Runs `cmd` to its end; fails the test when it cannot start.
pub fn run(cmd: &mut std::process::Command) -> std::process::Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("{cmd:?} did not start: {e}"))
}

/// Runs `cmd` and returns what it printed; fails the test, with its output, when it fails.
pub fn ok(cmd: &mut std::process::Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A namespace of one test: random name, labelled, removed by [`TestNamespace::delete`].
pub struct TestNamespace {
    /// The namespace name.
    pub name: String,
    client: Client,
}

impl TestNamespace {
    /// Creates a namespace `sbx-test-<prefix>-<random>`.
    pub async fn create(client: &Client, prefix: &str) -> Self {
        let suffix: u32 = rand::rng().random();
        let name = format!("sbx-test-{prefix}-{suffix:08x}");
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": { TEST_LABEL: "true" } }
        }))
        .expect("a namespace object");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("cannot create test namespace {name}: {e}"));
        Self {
            name,
            client: client.clone(),
        }
    }

    /// Deletes the namespace (the namespace controller removes what is in it).
    pub async fn delete(self) {
        let _ = Api::<Namespace>::all(self.client)
            .delete(&self.name, &DeleteParams::default())
            .await;
    }
}

/// Server-side applies every CRD of the chart and waits until each is Established.
pub async fn install_crds(client: &Client) -> Vec<String> {
    let dir = repo_root().join("charts/sandboxd/crds");
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let mut names = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let crd: CustomResourceDefinition = serde_yaml::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not a CRD: {e}", path.display()));
        let name = crd
            .metadata
            .name
            .clone()
            .unwrap_or_else(|| panic!("{} has no name", path.display()));
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("the API server refused {}: {e}", path.display()));
        names.push(name);
    }
    for name in &names {
        within(
            DEADLINE,
            await_condition(api.clone(), name, conditions::is_crd_established()),
        )
        .await
        .unwrap_or_else(|e| panic!("watching CRD {name} failed: {e}"));
    }
    names
}

/// Awaits `fut`, failing the test when it takes longer than `limit`.
pub async fn within<F: std::future::Future>(limit: Duration, fut: F) -> F::Output {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("gave up after {limit:?}"))
}

/// The message of an API error, or a failure naming what was expected instead.
pub fn api_message<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("expected the API server to refuse the request, got {other:?}"),
    }
}

/// The name of the local base image (`SANDBOXD_BASE_IMAGE`, set by `make env`).
pub fn base_image() -> String {
    std::env::var("SANDBOXD_BASE_IMAGE").unwrap_or_else(|_| need("SANDBOXD_BASE_IMAGE is not set"))
}

/// The Docker endpoint (`DOCKER_HOST`, set by `make env`).
pub fn docker_host() -> String {
    std::env::var("DOCKER_HOST").unwrap_or_else(|_| need("DOCKER_HOST is not set"))
}
