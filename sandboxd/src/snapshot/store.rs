//! The object store snapshots live in: an S3 bucket (any server of the S3 API), under a prefix
//! of the cluster's own, through the `object_store` crate.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::TryStreamExt as _;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};

use super::{Manifest, SnapshotError};

/// Where the store is and how to reach it.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// The S3 endpoint (`https://s3.example.com`, or `http://127.0.0.1:port` for a local server).
    pub endpoint: String,
    /// The bucket.
    pub bucket: String,
    /// The region.
    pub region: String,
    /// The access key id.
    pub access_key_id: String,
    /// The secret access key (never logged).
    pub secret_access_key: String,
    /// The prefix of every key of this cluster (`clusters/prod/`), so clusters share a bucket.
    pub prefix: String,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// Snapshots in one bucket under one prefix.
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    prefix: String,
}

fn failed(e: object_store::Error) -> SnapshotError {
    SnapshotError::Store(e.to_string())
}

impl Store {
    /// The store `config` names (nothing is sent until it is used).
    pub fn new(config: &StoreConfig) -> Result<Self, SnapshotError> {
        // Its HTTP client (reqwest, rustls) looks the process's crypto provider up.
        sandboxd_api::tls::install_provider();
        let inner = AmazonS3Builder::new()
            .with_endpoint(&config.endpoint)
            .with_allow_http(config.endpoint.starts_with("http://"))
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            .build()
            .map_err(failed)?;
        Ok(Self {
            inner: Arc::new(inner),
            prefix: config.prefix.trim_matches('/').to_owned(),
        })
    }

    fn key(&self, rest: &str) -> Key {
        if self.prefix.is_empty() {
            Key::from(rest)
        } else {
            Key::from(format!("{}/{rest}", self.prefix))
        }
    }

    pub(super) fn chunk_key(&self, name: &str) -> Key {
        self.key(&format!("chunks/{}/{name}", name.get(..2).unwrap_or("00")))
    }

    pub(super) fn manifest_key(&self, name: &str) -> Key {
        self.key(&format!("snapshots/{name}.json"))
    }

    pub(super) async fn put(&self, key: &Key, data: Vec<u8>) -> Result<(), SnapshotError> {
        self.inner
            .put(key, PutPayload::from(data))
            .await
            .map(|_| ())
            .map_err(failed)
    }

    /// The object at `key`, or `None` when there is none.
    pub(super) async fn get(&self, key: &Key) -> Result<Option<Vec<u8>>, SnapshotError> {
        match self.inner.get(key).await {
            Ok(got) => Ok(Some(got.bytes().await.map_err(failed)?.to_vec())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(failed(e)),
        }
    }

    pub(super) async fn remove(&self, key: &Key) -> Result<(), SnapshotError> {
        match self.inner.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(failed(e)),
        }
    }

    pub(super) async fn has_chunk(&self, name: &str) -> Result<bool, SnapshotError> {
        match self.inner.head(&self.chunk_key(name)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(failed(e)),
        }
    }

    pub(super) async fn put_manifest(&self, m: &Manifest) -> Result<(), SnapshotError> {
        let body = serde_json::to_vec(m).map_err(|e| SnapshotError::Store(e.to_string()))?;
        self.put(&self.manifest_key(&m.name), body).await
    }

    /// Snapshot `name`'s manifest.
    pub async fn manifest(&self, name: &str) -> Result<Manifest, SnapshotError> {
        if !super::valid_name(name) {
            return Err(SnapshotError::BadName(name.to_owned()));
        }
        let body = self
            .get(&self.manifest_key(name))
            .await?
            .ok_or_else(|| SnapshotError::NotFound(name.to_owned()))?;
        serde_json::from_slice(&body).map_err(|e| SnapshotError::BadManifest {
            snapshot: name.to_owned(),
            why: e.to_string(),
        })
    }

    /// The snapshots in the store, by name (`scope/name` for a scoped one).
    pub async fn list_snapshots(&self) -> Result<Vec<String>, SnapshotError> {
        let under = self.key("snapshots");
        let listed: Vec<_> = self
            .inner
            .list(Some(&under))
            .try_collect()
            .await
            .map_err(failed)?;
        let under = format!("{}/", under.as_ref());
        let mut names: Vec<String> = listed
            .into_iter()
            .filter_map(|o| {
                o.location
                    .as_ref()
                    .strip_prefix(&under)
                    .and_then(|f| f.strip_suffix(".json"))
                    .filter(|n| super::valid_name(n))
                    .map(str::to_owned)
            })
            .collect();
        names.sort();
        Ok(names)
    }

    /// Every chunk in the store, with when it was written.
    pub(super) async fn list_chunks(&self) -> Result<Vec<(String, DateTime<Utc>)>, SnapshotError> {
        let listed: Vec<_> = self
            .inner
            .list(Some(&self.key("chunks")))
            .try_collect()
            .await
            .map_err(failed)?;
        Ok(listed
            .into_iter()
            .filter_map(|o| {
                let name = o.location.filename()?.to_owned();
                Some((name, o.last_modified))
            })
            .collect())
    }
}
