//! Checkpoints of gVisor sandboxes through Docker's checkpoint API (dockerd with
//! `"experimental": true`): a sleep with memory writes one named [`SLEEP`] and stops the
//! container, a wake starts the container from it. Docker keeps it in its own folder for the
//! container (`<data-root>/containers/<id>/checkpoints/`: Debian's dockerd 20.10 refuses a
//! checkpoint folder of the caller's), and removes it with the container.
//!
//! bollard has create, list and delete; a start from a checkpoint is Docker's
//! `POST /containers/{id}/start?checkpoint=NAME`, which bollard's start does not carry, so it
//! is one plain HTTP/1.1 request on the Docker socket here.

use bollard::container::{CreateCheckpointOptions, DeleteCheckpointOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::DockerError;
use super::docker::DockerEngine;

/// The name of the checkpoint a sleep with memory writes.
pub const SLEEP: &str = "sandboxd-sleep";
/// The API version of the start request (Debian's dockerd 20.10 speaks 1.41).
const API: &str = "v1.41";
/// How many times a restore is tried when Docker answers that the content already exists.
const RESTORE_TRIES: u64 = 6;
/// The largest answer read from Docker for a start.
const MAX_ANSWER: u64 = 64 * 1024;

fn failed(action: String, status_code: u16, message: String) -> DockerError {
    DockerError {
        action,
        source: bollard::errors::Error::DockerResponseServerError {
            status_code,
            message,
        },
    }
}

impl DockerEngine {
    /// Writes checkpoint `name` of the running container `id` and stops it; a checkpoint of
    /// that name left by an earlier sleep goes first.
    pub async fn checkpoint(&self, id: &str, name: &str) -> Result<(), DockerError> {
        let _ = self.drop_checkpoint(id, name).await;
        self.client()
            .create_checkpoint(
                id,
                CreateCheckpointOptions {
                    checkpoint_id: name.to_owned(),
                    checkpoint_dir: None,
                    exit: true,
                },
            )
            .await
            .map_err(|source| DockerError {
                action: format!("checkpoint container {id}"),
                source,
            })
    }

    /// Whether container `id` has checkpoint `name`.
    pub async fn has_checkpoint(&self, id: &str, name: &str) -> Result<bool, DockerError> {
        let list = self
            .client()
            .list_checkpoints(id, None)
            .await
            .map_err(|source| DockerError {
                action: format!("list the checkpoints of container {id}"),
                source,
            })?;
        Ok(list.iter().any(|c| c.name == name))
    }

    /// Removes checkpoint `name` of container `id`; one already gone is fine.
    pub async fn drop_checkpoint(&self, id: &str, name: &str) -> Result<(), DockerError> {
        match self
            .client()
            .delete_checkpoint(id, name, None::<DeleteCheckpointOptions>)
            .await
        {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(source) => Err(DockerError {
                action: format!("remove checkpoint {name} of container {id}"),
                source,
            }),
        }
    }

    /// The bytes checkpoint `name` of container `id` takes on the node's disk: the blocks of
    /// every file under Docker's folder for it (`<DockerRootDir>/containers/<id>/checkpoints/
    /// <name>`, which sandboxd must be able to read: the chart mounts Docker's data root).
    pub async fn checkpoint_bytes(&self, id: &str, name: &str) -> Result<u64, String> {
        let info = self
            .client()
            .info()
            .await
            .map_err(|e| format!("cannot ask Docker for its data root: {e}"))?;
        let root = info
            .docker_root_dir
            .ok_or("Docker does not say where its data root is")?;
        let dir = std::path::Path::new(&root)
            .join("containers")
            .join(id)
            .join("checkpoints")
            .join(name);
        tokio::task::spawn_blocking(move || {
            disk_usage(&dir).map_err(|e| {
                format!(
                    "cannot measure {} ({e}): sandboxd must read Docker's data root",
                    dir.display()
                )
            })
        })
        .await
        .map_err(|e| format!("the measure of the checkpoint failed: {e}"))?
    }

    /// Starts the stopped container `id` from its checkpoint `name`. Debian's dockerd 20.10
    /// sometimes refuses with `failed to upload checkpoint to containerd: commit failed:
    /// content sha256:…: already exists` (moby/moby#42900: the checkpoint's content is still in
    /// containerd's store from the checkpoint itself, until its collector runs): that answer
    /// is tried again, up to [`RESTORE_TRIES`] times, 200 ms further apart each time.
    pub async fn restore(&self, id: &str, name: &str) -> Result<(), DockerError> {
        let mut tries = 1;
        loop {
            match self.start_from(id, name).await {
                Err(e) if tries < RESTORE_TRIES && e.to_string().contains("already exists") => {
                    tokio::time::sleep(std::time::Duration::from_millis(200 * tries)).await;
                    tries += 1;
                }
                done => return done,
            }
        }
    }

    /// One `POST /containers/{id}/start?checkpoint={name}`.
    async fn start_from(&self, id: &str, name: &str) -> Result<(), DockerError> {
        let action = format!("start container {id} from checkpoint {name}");
        let socket = docker_socket().ok_or_else(|| {
            failed(
                action.clone(),
                501,
                "DOCKER_HOST is not a unix socket: a start from a checkpoint needs Docker's socket"
                    .into(),
            )
        })?;
        let io = |e: std::io::Error| DockerError {
            action: action.clone(),
            source: bollard::errors::Error::IOError { err: e },
        };
        let mut conn = tokio::net::UnixStream::connect(&socket).await.map_err(io)?;
        let request = format!(
            "POST /{API}/containers/{id}/start?checkpoint={name} HTTP/1.1\r\nHost: docker\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        conn.write_all(request.as_bytes()).await.map_err(io)?;
        let mut answer = Vec::new();
        (&mut conn)
            .take(MAX_ANSWER)
            .read_to_end(&mut answer)
            .await
            .map_err(io)?;
        let text = String::from_utf8_lossy(&answer);
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .unwrap_or(0);
        if (200..300).contains(&status) {
            return Ok(());
        }
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        // Docker answers {"message": "..."} (chunked or not): the message, else the body.
        let message = body
            .find("{\"message\":")
            .and_then(|at| {
                let rest = &body[at..];
                let end = rest.find('}')?;
                serde_json::from_str::<serde_json::Value>(&rest[..=end])
                    .ok()?
                    .get("message")?
                    .as_str()
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| body.trim().to_owned());
        Err(failed(action, status, message))
    }
}

/// The bytes the files under `dir` take on disk (allocated blocks; links not followed).
fn disk_usage(dir: &std::path::Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt as _;
    let mut total = 0u64;
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                folders.push(entry.path());
            }
        }
    }
    Ok(total)
}

/// The path of Docker's socket: `DOCKER_HOST` when it is `unix://…`, else the default one.
fn docker_socket() -> Option<std::path::PathBuf> {
    match std::env::var("DOCKER_HOST") {
        Ok(host) if !host.is_empty() => host.strip_prefix("unix://").map(Into::into),
        _ => Some("/var/run/docker.sock".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_usage_counts_the_blocks_of_every_file_below() {
        let dir = tempfile::tempdir().expect("a temp dir");
        std::fs::create_dir(dir.path().join("sub")).expect("a folder");
        std::fs::write(dir.path().join("a"), vec![1u8; 1 << 20]).expect("a file");
        std::fs::write(dir.path().join("sub").join("b"), vec![2u8; 1 << 20]).expect("a file");
        let used = disk_usage(dir.path()).expect("measured");
        assert!((2 << 20..3 << 20).contains(&used), "{used}");
        assert!(disk_usage(&dir.path().join("missing")).is_err());
    }
}
