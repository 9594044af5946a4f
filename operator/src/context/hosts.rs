//! The context's clients of the hosts: one sandboxd client per SandboxHost, kept while its
//! endpoint, CA and admin token stay the same; the admin token read (once per host at a time)
//! and derived for the host's node, whose hash goes into the node-token ConfigMap; the CA its
//! https endpoint is verified with.

use super::*;

/// How long an admin token read from its Secret is used before it is read again.
const TOKEN_REFRESH: Duration = Duration::from_secs(60);

/// A sandboxd client kept between reconciles: its connections are reused, and the admin
/// token is read again only after [`TOKEN_REFRESH`] or when the host's spec changes.
pub(super) struct CachedClient {
    endpoint: String,
    secret: SecretKeyRef,
    node: Option<String>,
    token: String,
    client: HostClient,
    fetched: Instant,
    /// The CA the client trusts (None: the system's roots).
    ca: Option<HostCa>,
}

impl CachedClient {
    /// Whether it was made for the host's current endpoint, token Secret and node.
    fn serves(&self, host: &SandboxHost) -> bool {
        self.endpoint == host.spec.endpoint
            && self.secret == host.spec.admin_token_secret
            && self.node == host.spec.node
    }
}

impl Context {
    /// A sandboxd client for `host`, with its admin token. Clients are kept per host, so a
    /// reconcile costs no Secret read and no new connection; the token is read again after
    /// [`TOKEN_REFRESH`], when the host's spec changes, and on every probe.
    ///
    /// The reconciles that find no kept client at the same time (the first ones after a start,
    /// up to `--concurrency` of them) wait for one read of the Secret and take its client.
    pub async fn host_client(&self, host: &SandboxHost) -> Result<HostClient, Error> {
        if let Some(c) = self.kept_host_client(host) {
            return Ok(c);
        }
        let lock = self
            .host_reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(host.name_any())
            .or_default()
            .clone();
        let _one_read = lock.lock().await;
        match self.kept_host_client(host) {
            Some(c) => Ok(c),
            None => self.refresh_host_client(host).await,
        }
    }

    /// The kept client of `host`, if it serves the host's spec and its token is fresh.
    fn kept_host_client(&self, host: &SandboxHost) -> Option<HostClient> {
        self.host_clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&host.name_any())
            .filter(|c| c.serves(host) && c.fetched.elapsed() < TOKEN_REFRESH)
            .map(|c| c.client.clone())
    }

    /// Reads the admin token of `host` now: the master from its Secret, and from it the token
    /// derived for the host's node (which opens no other node). The kept client (and its
    /// connections) stays when the token did not change. A host that names no node is sent
    /// nothing (the master itself would be its token), and a Secret outside the operator's
    /// namespace is refused before any read: whoever may write a SandboxHost must not make the
    /// operator read a Secret of their choosing, or the master, and send it to an endpoint of
    /// their choosing.
    pub async fn refresh_host_client(&self, host: &SandboxHost) -> Result<HostClient, Error> {
        let r = &host.spec.admin_token_secret;
        let name = host.name_any();
        let Some(node) = host.spec.node.as_deref() else {
            self.forget_host_client(&name);
            return Err(Error::NodeUnset {
                host: name,
                endpoint: host.spec.endpoint.clone(),
            });
        };
        if r.namespace != self.namespace {
            self.forget_host_client(&name);
            return Err(Error::TokenSecretRefused {
                host: name,
                secret_namespace: r.namespace.clone(),
                secret_name: r.name.clone(),
                namespace: self.namespace.clone(),
            });
        }
        let secret = Api::<Secret>::namespaced(self.client.clone(), &r.namespace)
            .get_opt(&r.name)
            .await?
            .ok_or_else(|| Error::Token {
                host: name.clone(),
                why: format!("Secret {}/{} does not exist", r.namespace, r.name),
            })?;
        let token = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&r.key))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .ok_or_else(|| Error::Token {
                host: name.clone(),
                why: format!("Secret {}/{} has no key {}", r.namespace, r.name, r.key),
            })?;
        let token = sandboxd_api::auth::node_token(token.trim(), node);
        self.keep_node_token_hash(host, node, &token).await;
        let token = token.as_str();
        let ca = crate::trust::host_ca(
            &self.client,
            Some(&self.namespace),
            self.config.host_ca_file.as_deref(),
            host,
        )
        .await
        .map_err(|e| Error::Ca {
            host: name.clone(),
            why: e.to_string(),
        })?;
        self.warn_plain_http(host);
        let mut clients = self.host_clients.lock().unwrap_or_else(|p| p.into_inner());
        let client = match clients.get(&name) {
            Some(c) if c.serves(host) && c.token == token && c.ca == ca => c.client.clone(),
            _ => {
                let trust = match &ca {
                    Some(ca) => Trust::ca(Some(&ca.pem), &ca.origin),
                    None => Ok(Trust::system()),
                }
                .map_err(|e| Error::Ca {
                    host: name.clone(),
                    why: e.to_string(),
                })?;
                HostClient::with_trust(&host.spec.endpoint, token, &trust)
                    .with_deadline(Duration::from_secs(self.config.host_request_seconds.max(1)))
            }
        };
        clients.insert(
            name,
            CachedClient {
                endpoint: host.spec.endpoint.clone(),
                secret: r.clone(),
                node: host.spec.node.clone(),
                token: token.to_owned(),
                client: client.clone(),
                fetched: Instant::now(),
                ca,
            },
        );
        Ok(client)
    }

    /// Writes the hash of `node`'s token into the node-token-hash ConfigMap, when one is
    /// configured and the host's token comes from the discovery master (--host-token-secret):
    /// then the value under a node's name is a function of the master and that name alone, so
    /// whoever may write a SandboxHost cannot put another value there. Written again after
    /// [`TOKEN_REFRESH`] (a ConfigMap edited or recreated is mended); a failure is logged and
    /// tried again at the next probe (the host then says TokenRefused if its sandboxd lacks it).
    async fn keep_node_token_hash(&self, host: &SandboxHost, node: &str, token: &str) {
        let Some(map) = self.config.node_token_hashes.as_deref() else {
            return;
        };
        let master = self.config.host_token_secret_ref();
        if master.as_ref() != Some(&host.spec.admin_token_secret) {
            return;
        }
        let hash = sandboxd_api::auth::hash(token);
        let fresh = self
            .node_hashes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
            .is_some_and(|(h, at)| *h == hash && at.elapsed() < TOKEN_REFRESH);
        if fresh {
            return;
        }
        match self.write_node_token_hash(map, node, &hash).await {
            Ok(()) => {
                self.node_hashes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(node.to_owned(), (hash, Instant::now()));
            }
            Err(e) => {
                warn!(host = %host.name_any(), node, configmap = %map, error = %e, "the hash of the node's admin token could not be written; its sandboxd refuses the token until it is");
            }
        }
    }

    /// Merges `node: hash` into ConfigMap `map` of the operator's namespace, creating it when
    /// it is missing (the chart renders it, and grants no create).
    async fn write_node_token_hash(
        &self,
        map: &str,
        node: &str,
        hash: &str,
    ) -> Result<(), kube::Error> {
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), &self.namespace);
        let patch = serde_json::json!({"data": {node: hash}});
        match api
            .patch(map, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 404 => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(map.to_owned()),
                        labels: Some(self.labels.clone()),
                        ..Default::default()
                    },
                    data: Some(BTreeMap::from([(node.to_owned(), hash.to_owned())])),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &cm).await.map(|_| ())
            }
            other => other.map(|_| ()),
        }
    }

    /// The CA certificate (PEM) the client of host `name` trusts, if one is configured: what
    /// the platform needs to verify that host too.
    pub fn host_ca(&self, name: &str) -> Option<Vec<u8>> {
        self.host_clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .and_then(|c| c.ca.as_ref().map(|ca| ca.pem.clone()))
    }

    /// Warns once per host (and endpoint) whose sandboxd is reached over plain http://.
    fn warn_plain_http(&self, host: &SandboxHost) {
        if !host.spec.endpoint.starts_with("http://") {
            return;
        }
        let key = format!("{} {}", host.name_any(), host.spec.endpoint);
        let first = self
            .plain_http_warned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key);
        if first {
            warn!(host = %host.name_any(), endpoint = %host.spec.endpoint, "host is reached over plain HTTP: its admin token and the session tokens cross the network unencrypted; serve sandboxd with TLS (the chart does unless tls.enabled=false) and give the operator its CA");
        }
    }

    /// Forgets the client of a deleted host.
    pub fn forget_host_client(&self, host: &str) {
        self.host_clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(host);
        self.host_reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(host);
    }
}
