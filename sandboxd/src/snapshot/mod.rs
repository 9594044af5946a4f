//! Snapshots of a workspace in an object store (S3): the node's disk as a cache, the store as
//! the place a workspace is safe.
//!
//! A snapshot is a manifest and chunks. Every regular file is cut into chunks of at most
//! [`CHUNK_BYTES`]; a chunk is stored once under the SHA-256 of its bytes
//! (`<prefix>/chunks/<2 hex>/<64 hex>`), compressed with zstd, so a chunk two files, two
//! snapshots or two sessions share is stored and sent once. The manifest
//! (`<prefix>/snapshots/<name>.json`) lists every entry below the workspace root (folders,
//! files with their chunks, symlinks with their targets; modes and sizes) and is written last:
//! a snapshot interrupted anywhere before has no manifest, so it does not exist, and the chunks
//! it left are taken by the next collection ([`Store::collect`]).
//!
//! A restore reads the manifest, fetches each chunk, checks its bytes against its name and
//! writes the files into a new folder beside the destination, which takes the destination's
//! place only once every file is whole: a missing or corrupted chunk fails the restore with the
//! file named, and nothing is left behind. Paths of a manifest are checked before anything is
//! written (relative, without `..`): a manifest cannot write outside the destination.

mod store;

pub use store::{Store, StoreConfig};

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::{FutureExt as _, StreamExt as _, TryStreamExt as _};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The largest chunk: files are cut at this many bytes.
pub const CHUNK_BYTES: usize = 4 * 1024 * 1024;

/// Files read and sent at once by a snapshot, and restored at once.
const FILES_IN_FLIGHT: usize = 64;

/// The bytes of chunks a snapshot or a restore holds at once (read, being compressed, sent or
/// written), counted in [`BUDGET_UNIT`]s: 32 MiB, eight whole chunks or hundreds of small ones.
const BUDGET_UNITS: usize = 512;

/// The unit of [`BUDGET_UNITS`]: a chunk holds at least one.
const BUDGET_UNIT: usize = 64 * 1024;

/// The units a chunk of about `bytes` holds (at least one, at most a whole chunk's).
fn units(bytes: u64) -> u32 {
    let bytes = usize::try_from(bytes)
        .unwrap_or(CHUNK_BYTES)
        .clamp(1, CHUNK_BYTES);
    u32::try_from(bytes.div_ceil(BUDGET_UNIT)).unwrap_or(1)
}

/// The zstd level chunks are compressed at (fast, about 3x on text).
const ZSTD_LEVEL: i32 = 3;

/// The manifest format written.
const MANIFEST_VERSION: u32 = 1;

/// Why a snapshot, restore or collection failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The store refused or failed.
    #[error("the object store: {0}")]
    Store(String),
    /// A file of the workspace could not be read, or one of the restore written.
    #[error("{path}: {source}")]
    Io {
        /// The path, relative to the workspace.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
    /// No snapshot of this name.
    #[error("no snapshot '{0}' in the store")]
    NotFound(String),
    /// A chunk of a file is missing from the store or its bytes are not what its name says.
    #[error(
        "snapshot '{snapshot}' cannot be restored: file '{file}' needs chunk {chunk}, which {why}"
    )]
    Corrupt {
        /// The snapshot.
        snapshot: String,
        /// The file that needs the chunk.
        file: String,
        /// The chunk's name (its SHA-256).
        chunk: String,
        /// What is wrong with it.
        why: String,
    },
    /// The manifest is not one this sandboxd reads, or names a path outside the workspace.
    #[error("snapshot '{snapshot}' has a bad manifest: {why}")]
    BadManifest {
        /// The snapshot.
        snapshot: String,
        /// What is wrong.
        why: String,
    },
    /// The snapshot's name is not one a store key may carry.
    #[error(
        "'{0}' is not a snapshot name: 1 to 253 characters of a-z, 0-9, '-' and '.', starting and ending with a letter or digit, after its scope and a '/' when it has one (a DNS label)"
    )]
    BadName(String),
    /// The restore's destination exists already.
    #[error("{0} exists: a restore makes a new folder")]
    DestinationExists(String),
    /// The folder a restore was to fill has files in it.
    #[error("{0} is not empty: a restore fills an empty workspace")]
    NotEmpty(String),
}

/// What an entry of the workspace is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A folder.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link (kept as a link, never followed).
    Symlink,
}

/// One entry of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The path below the workspace root, `/`-separated.
    pub path: String,
    /// What it is.
    pub kind: Kind,
    /// Its permission bits.
    pub mode: u32,
    /// Its size (a file's bytes).
    pub size: u64,
    /// A symlink's target, as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// A file's chunks in order (SHA-256, hex).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<String>,
}

/// A snapshot's manifest: what is restored from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The format.
    pub version: u32,
    /// The snapshot's name.
    pub name: String,
    /// When it was taken, RFC 3339.
    pub created_at: String,
    /// The bytes of its files.
    pub bytes: u64,
    /// Its distinct chunks.
    pub chunk_count: usize,
    /// Every entry below the root, parents before children.
    pub entries: Vec<Entry>,
}

impl Manifest {
    /// The distinct chunks it needs.
    pub fn chunks(&self) -> HashSet<&str> {
        self.entries
            .iter()
            .flat_map(|e| e.chunks.iter().map(String::as_str))
            .collect()
    }
}

/// What a snapshot did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// Its manifest.
    pub manifest: Manifest,
    /// Chunks it sent (the others were in the store already).
    pub chunks_sent: usize,
    /// Compressed bytes it sent.
    pub bytes_sent: u64,
}

/// One manifest entry as a snapshot made it, and what sending its chunks cost.
struct Described {
    entry: Entry,
    chunks_sent: usize,
    bytes_sent: u64,
}

/// Whether `name` may name a snapshot: a DNS subdomain (as a Kubernetes object's name),
/// optionally after its scope and a `/` (a DNS label: sandboxd keeps each namespace's
/// snapshots under `<namespace>/<name>`, so one namespace's names never reach another's).
pub fn valid_name(name: &str) -> bool {
    match name.split_once('/') {
        Some((scope, rest)) => scope.len() <= 63 && !scope.contains('.') && dns(scope) && dns(rest),
        None => dns(name),
    }
}

/// Whether `name` is a DNS subdomain of lower-case letters, digits, `-` and `.`.
fn dns(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (1..=253).contains(&name.len())
        && edge(name.chars().next())
        && edge(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

/// The SHA-256 of `data`, hex.
pub fn chunk_name(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Every entry below `root`, parents before children, each folder's entries by name; symlinks
/// are entries, never followed; what is neither a folder, a file nor a symlink (a socket, a
/// FIFO) is left out.
fn walk(root: &Path) -> Result<Vec<(PathBuf, String, std::fs::Metadata)>, SnapshotError> {
    let io = |path: &str, source| SnapshotError::Io {
        path: path.to_owned(),
        source,
    };
    let mut out = Vec::new();
    let mut pending = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, rel)) = pending.pop() {
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| io(&rel, e))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(|e| io(&rel, e))?;
        names.sort();
        let mut subdirs = Vec::new();
        for name in names {
            let name = name.to_string_lossy().into_owned();
            let path = dir.join(&name);
            let child = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let meta = std::fs::symlink_metadata(&path).map_err(|e| io(&child, e))?;
            let ft = meta.file_type();
            if ft.is_dir() {
                subdirs.push((path.clone(), child.clone()));
            } else if !ft.is_file() && !ft.is_symlink() {
                continue;
            }
            out.push((path, child, meta));
        }
        // Depth first, each folder's own entries before its folders' (a stack: reversed).
        pending.extend(subdirs.into_iter().rev());
    }
    Ok(out)
}

impl Store {
    /// Writes a snapshot `name` of the folder `root` (the caller keeps it still: the session's
    /// container paused) and returns its manifest, written last.
    pub async fn snapshot(&self, name: &str, root: &Path) -> Result<Taken, SnapshotError> {
        if !valid_name(name) {
            return Err(SnapshotError::BadName(name.to_owned()));
        }
        let listed = {
            let root = root.to_path_buf();
            tokio::task::spawn_blocking(move || walk(&root))
                .await
                .map_err(|e| SnapshotError::Store(e.to_string()))??
        };
        // Files are read and sent several at a time, and each file's chunks several at a
        // time, at most BUDGET_UNITS of chunks held at once; the entries keep the walk's order.
        let seen: Arc<Mutex<HashSet<String>>> = Arc::default();
        let permits = Arc::new(tokio::sync::Semaphore::new(BUDGET_UNITS));
        let described: Vec<Option<Described>> = futures::stream::iter(listed)
            .map(|(path, rel, meta)| {
                let (seen, permits) = (seen.clone(), permits.clone());
                self.describe(path, rel, meta, seen, permits).boxed()
            })
            .buffered(FILES_IN_FLIGHT)
            .try_collect()
            .await?;
        let (mut chunks_sent, mut bytes_sent, mut bytes) = (0usize, 0u64, 0u64);
        let mut entries = Vec::with_capacity(described.len());
        for d in described.into_iter().flatten() {
            chunks_sent += d.chunks_sent;
            bytes_sent += d.bytes_sent;
            bytes += d.entry.size;
            entries.push(d.entry);
        }
        let chunk_count = seen.lock().map(|s| s.len()).unwrap_or_default();
        let manifest = Manifest {
            version: MANIFEST_VERSION,
            name: name.to_owned(),
            created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            bytes,
            chunk_count,
            entries,
        };
        self.put_manifest(&manifest).await?;
        Ok(Taken {
            manifest,
            chunks_sent,
            bytes_sent,
        })
    }

    /// The manifest entry of one walked path; a regular file's chunks are sent (those the
    /// store lacks), each under one of `permits`. `None` for a file removed since the walk (a
    /// file operation is not frozen): it is left out.
    async fn describe(
        &self,
        path: PathBuf,
        rel: String,
        meta: std::fs::Metadata,
        seen: Arc<Mutex<HashSet<String>>>,
        permits: Arc<tokio::sync::Semaphore>,
    ) -> Result<Option<Described>, SnapshotError> {
        let mode = meta.permissions().mode() & 0o7777;
        let ft = meta.file_type();
        let plain = |kind, target| Described {
            entry: Entry {
                path: rel.clone(),
                kind,
                mode,
                size: 0,
                target,
                chunks: Vec::new(),
            },
            chunks_sent: 0,
            bytes_sent: 0,
        };
        if ft.is_dir() {
            return Ok(Some(plain(Kind::Dir, None)));
        }
        if ft.is_symlink() {
            let target = std::fs::read_link(&path).map_err(|e| SnapshotError::Io {
                path: rel.clone(),
                source: e,
            })?;
            return Ok(Some(plain(
                Kind::Symlink,
                Some(target.to_string_lossy().into_owned()),
            )));
        }
        let mut file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(SnapshotError::Io {
                    path: rel.clone(),
                    source: e,
                });
            }
        };
        let mut sending = Vec::new();
        let mut size = 0u64;
        loop {
            // The block expected next, from the file's size at the walk (it is held still).
            let want = usize::try_from(meta.len().saturating_sub(size))
                .unwrap_or(CHUNK_BYTES)
                .clamp(BUDGET_UNIT, CHUNK_BYTES);
            let permit = permits
                .clone()
                .acquire_many_owned(units(want as u64))
                .await
                .map_err(|e| SnapshotError::Store(e.to_string()))?;
            let (block, f) = read_block(file, &rel, want).await?;
            file = f;
            if block.is_empty() {
                break;
            }
            size += block.len() as u64;
            let (store, seen) = (self.clone(), seen.clone());
            sending.push(tokio::spawn(async move {
                let _permit = permit;
                let (name, block) =
                    tokio::task::spawn_blocking(move || (chunk_name(&block), block))
                        .await
                        .map_err(|e| SnapshotError::Store(e.to_string()))?;
                let first = seen.lock().is_ok_and(|mut s| s.insert(name.clone()));
                let sent = if first {
                    store.put_chunk(&name, block).await?
                } else {
                    None
                };
                Ok::<_, SnapshotError>((name, sent))
            }));
        }
        let mut d = plain(Kind::File, None);
        d.entry.size = size;
        for job in sending {
            let (name, sent) = job
                .await
                .map_err(|e| SnapshotError::Store(e.to_string()))??;
            if let Some(n) = sent {
                d.chunks_sent += 1;
                d.bytes_sent += n;
            }
            d.entry.chunks.push(name);
        }
        Ok(Some(d))
    }

    /// Sends chunk `name` (the SHA-256 of `data`) compressed, unless the store has it:
    /// the compressed bytes sent, or `None`.
    async fn put_chunk(&self, name: &str, data: Vec<u8>) -> Result<Option<u64>, SnapshotError> {
        if self.has_chunk(name).await? {
            return Ok(None);
        }
        let packed = tokio::task::spawn_blocking(move || zstd::bulk::compress(&data, ZSTD_LEVEL))
            .await
            .map_err(|e| SnapshotError::Store(e.to_string()))?
            .map_err(|e| SnapshotError::Store(format!("compressing chunk {name}: {e}")))?;
        let sent = packed.len() as u64;
        self.put(&self.chunk_key(name), packed).await?;
        Ok(Some(sent))
    }

    /// Restores snapshot `name` into `dest` (which must not exist): every file whole, owned
    /// by `owner` (uid, gid), with its mode; or nothing, and the error naming the file.
    pub async fn restore(
        &self,
        name: &str,
        dest: &Path,
        owner: (u32, u32),
    ) -> Result<Manifest, SnapshotError> {
        let manifest = self.manifest(name).await?;
        check_paths(&manifest)?;
        if dest.symlink_metadata().is_ok() {
            return Err(SnapshotError::DestinationExists(dest.display().to_string()));
        }
        let staging = staging_of(dest);
        let _ = std::fs::remove_dir_all(&staging);
        let result = self.restore_into(&manifest, &staging, owner).await;
        match result {
            Ok(()) => {
                std::fs::rename(&staging, dest).map_err(|e| SnapshotError::Io {
                    path: dest.display().to_string(),
                    source: e,
                })?;
                Ok(manifest)
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&staging);
                Err(e)
            }
        }
    }

    /// Restores snapshot `name` into the empty folder `dest` (a session's workspace, the
    /// mount point of its disk): the files are written into a folder inside it first, on the
    /// same filesystem, and moved up only once every file is whole. A failure removes what it
    /// wrote and leaves `dest` empty.
    pub async fn restore_in(
        &self,
        name: &str,
        dest: &Path,
        owner: (u32, u32),
    ) -> Result<Manifest, SnapshotError> {
        let manifest = self.manifest(name).await?;
        check_paths(&manifest)?;
        let io = |path: &Path, source| SnapshotError::Io {
            path: path.display().to_string(),
            source,
        };
        if std::fs::read_dir(dest)
            .map_err(|e| io(dest, e))?
            .next()
            .is_some()
        {
            return Err(SnapshotError::NotEmpty(dest.display().to_string()));
        }
        let staging = dest.join(format!(".sandboxd-restoring-{:08x}", rand::random::<u32>()));
        let moved = match self.restore_into(&manifest, &staging, owner).await {
            Ok(()) => (|| {
                for child in std::fs::read_dir(&staging).map_err(|e| io(&staging, e))? {
                    let child = child.map_err(|e| io(&staging, e))?;
                    let to = dest.join(child.file_name());
                    std::fs::rename(child.path(), &to).map_err(|e| io(&to, e))?;
                }
                std::fs::remove_dir(&staging).map_err(|e| io(&staging, e))
            })(),
            Err(e) => Err(e),
        };
        if let Err(e) = moved {
            // Nothing half-restored is left: the folder is emptied again.
            if let Ok(children) = std::fs::read_dir(dest) {
                for child in children.flatten() {
                    let path = child.path();
                    let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
                }
            }
            return Err(e);
        }
        Ok(manifest)
    }

    /// Writes every entry of `manifest` into the new folder `staging`: folders first (a
    /// manifest lists a folder before what it holds), then the files several at a time (at
    /// most [`BUDGET_UNITS`] of chunks held at once), then the links; one flush of the
    /// filesystem for all of them, and the folders' modes last (a folder without write
    /// permission still took its files).
    async fn restore_into(
        &self,
        manifest: &Manifest,
        staging: &Path,
        (uid, gid): (u32, u32),
    ) -> Result<(), SnapshotError> {
        let io = |path: &str, source| SnapshotError::Io {
            path: path.to_owned(),
            source,
        };
        std::fs::create_dir_all(staging).map_err(|e| io("", e))?;
        std::os::unix::fs::chown(staging, Some(uid), Some(gid)).map_err(|e| io("", e))?;
        let mut dirs = Vec::new();
        for e in manifest.entries.iter().filter(|e| e.kind == Kind::Dir) {
            let at = staging.join(&e.path);
            std::fs::create_dir(&at).map_err(|err| io(&e.path, err))?;
            std::os::unix::fs::lchown(&at, Some(uid), Some(gid)).map_err(|err| io(&e.path, err))?;
            dirs.push((at, e.mode));
        }
        let permits = Arc::new(tokio::sync::Semaphore::new(BUDGET_UNITS));
        let files: Vec<Entry> = manifest
            .entries
            .iter()
            .filter(|e| e.kind == Kind::File)
            .cloned()
            .collect();
        futures::stream::iter(files)
            .map(|e| {
                let at = staging.join(&e.path);
                self.restore_file(&manifest.name, e, at, (uid, gid), permits.clone())
                    .boxed()
            })
            .buffer_unordered(FILES_IN_FLIGHT)
            .try_collect::<()>()
            .await?;
        for e in manifest.entries.iter().filter(|e| e.kind == Kind::Symlink) {
            let at = staging.join(&e.path);
            let target = e.target.as_deref().unwrap_or_default();
            std::os::unix::fs::symlink(target, &at).map_err(|err| io(&e.path, err))?;
            std::os::unix::fs::lchown(&at, Some(uid), Some(gid)).map_err(|err| io(&e.path, err))?;
        }
        // Every file on the disk before the restore counts as done.
        let root = std::fs::File::open(staging).map_err(|e| io("", e))?;
        nix::unistd::syncfs(&root).map_err(|e| io("", std::io::Error::from(e)))?;
        for (dir, mode) in dirs.into_iter().rev() {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
                .map_err(|err| io(&dir.display().to_string(), err))?;
        }
        Ok(())
    }

    /// Writes file entry `e` at `at` from its chunks, fetched two at a time in order, each
    /// under one of `permits` until it is written.
    async fn restore_file(
        &self,
        snapshot: &str,
        e: Entry,
        at: PathBuf,
        (uid, gid): (u32, u32),
        permits: Arc<tokio::sync::Semaphore>,
    ) -> Result<(), SnapshotError> {
        let io = |source| SnapshotError::Io {
            path: e.path.clone(),
            source,
        };
        let mut out = std::fs::File::create(&at).map_err(io)?;
        let size = e.size;
        let mut chunks = futures::stream::iter(e.chunks.clone().into_iter().enumerate())
            .map(|(i, chunk)| {
                let (store, permits) = (self.clone(), permits.clone());
                let (snapshot, file) = (snapshot.to_owned(), e.path.clone());
                // Chunk i's size, as the manifest's file size says.
                let expected = size.saturating_sub(i as u64 * CHUNK_BYTES as u64);
                async move {
                    let permit = permits
                        .acquire_many_owned(units(expected))
                        .await
                        .map_err(|err| SnapshotError::Store(err.to_string()))?;
                    let data = store.get_chunk(&snapshot, &file, &chunk).await?;
                    Ok::<_, SnapshotError>((data, permit))
                }
                .boxed()
            })
            .buffered(2);
        let mut written = 0u64;
        while let Some(next) = chunks.next().await {
            let (data, permit) = next?;
            written += data.len() as u64;
            out = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                std::io::Write::write_all(&mut out, &data).map(|()| out)
            })
            .await
            .map_err(|err| SnapshotError::Store(err.to_string()))?
            .map_err(io)?;
        }
        if written != e.size {
            return Err(SnapshotError::BadManifest {
                snapshot: snapshot.to_owned(),
                why: format!(
                    "file '{}' is {} bytes in the manifest and {written} in its chunks",
                    e.path, e.size
                ),
            });
        }
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(e.mode)).map_err(io)?;
        std::os::unix::fs::lchown(&at, Some(uid), Some(gid)).map_err(io)?;
        Ok(())
    }

    /// Chunk `chunk` of `file`, checked: its bytes are what its name says.
    async fn get_chunk(
        &self,
        snapshot: &str,
        file: &str,
        chunk: &str,
    ) -> Result<Vec<u8>, SnapshotError> {
        let corrupt = |why: String| SnapshotError::Corrupt {
            snapshot: snapshot.to_owned(),
            file: file.to_owned(),
            chunk: chunk.to_owned(),
            why,
        };
        let packed = self
            .get(&self.chunk_key(chunk))
            .await?
            .ok_or_else(|| corrupt("is missing from the store".to_owned()))?;
        let data = tokio::task::spawn_blocking(move || {
            zstd::stream::decode_all(std::io::Cursor::new(packed))
        })
        .await
        .map_err(|e| SnapshotError::Store(e.to_string()))?
        .map_err(|e| corrupt(format!("does not decompress ({e})")))?;
        if data.len() > CHUNK_BYTES {
            return Err(corrupt(format!(
                "holds {} bytes, more than a chunk",
                data.len()
            )));
        }
        let actual = chunk_name(&data);
        if actual != chunk {
            return Err(corrupt(format!("holds other bytes (SHA-256 {actual})")));
        }
        Ok(data)
    }

    /// Deletes snapshot `name`'s manifest (its chunks go with the next collection).
    pub async fn delete(&self, name: &str) -> Result<(), SnapshotError> {
        if !valid_name(name) {
            return Err(SnapshotError::BadName(name.to_owned()));
        }
        self.remove(&self.manifest_key(name)).await
    }

    /// Deletes every chunk no snapshot needs that is older than `grace` (a snapshot under way
    /// has sent chunks its manifest does not name yet: they are younger than that). Returns
    /// how many were deleted.
    pub async fn collect(&self, grace: std::time::Duration) -> Result<usize, SnapshotError> {
        // Chunks are listed before the manifests are read: a chunk a manifest written meanwhile
        // needs is either in that manifest (read after) or younger than the grace.
        let chunks = self.list_chunks().await?;
        let mut needed: HashSet<String> = HashSet::new();
        for name in self.list_snapshots().await? {
            match self.manifest(&name).await {
                Ok(m) => needed.extend(m.chunks().into_iter().map(str::to_owned)),
                // Deleted meanwhile: its chunks are not needed by it.
                Err(SnapshotError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let cutoff = chrono::Utc::now()
            - chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::zero());
        let mut deleted = 0;
        for (name, modified) in chunks {
            if !needed.contains(&name) && modified < cutoff {
                self.remove(&self.chunk_key(&name)).await?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}

/// Reads the next block of `file` off the async runtime: at most `want` bytes, which is
/// [`CHUNK_BYTES`] but for a file's last block (so a file is cut where its size says).
async fn read_block(
    file: std::fs::File,
    rel: &str,
    want: usize,
) -> Result<(Vec<u8>, std::fs::File), SnapshotError> {
    let rel = rel.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut file = file;
        let mut block = vec![0u8; want];
        let mut filled = 0;
        while filled < want {
            match std::io::Read::read(&mut file, &mut block[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(SnapshotError::Io {
                        path: rel,
                        source: e,
                    });
                }
            }
        }
        block.truncate(filled);
        Ok((block, file))
    })
    .await
    .map_err(|e| SnapshotError::Store(e.to_string()))?
}

/// The folder a restore into `dest` is written in first.
fn staging_of(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dest.with_file_name(format!(".{name}.restoring"))
}

/// Refuses a manifest with a path that is absolute, climbs with `..`, repeats, or comes
/// before its folder.
fn check_paths(m: &Manifest) -> Result<(), SnapshotError> {
    let bad = |why: String| SnapshotError::BadManifest {
        snapshot: m.name.clone(),
        why,
    };
    if m.version != MANIFEST_VERSION {
        return Err(bad(format!(
            "format {} (this sandboxd reads {MANIFEST_VERSION})",
            m.version
        )));
    }
    let mut dirs: HashSet<&str> = HashSet::new();
    let mut seen: HashSet<&str> = HashSet::new();
    for e in &m.entries {
        let p = Path::new(&e.path);
        if e.path.is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(bad(format!("path '{}' is not below the workspace", e.path)));
        }
        if !seen.insert(&e.path) {
            return Err(bad(format!("path '{}' is listed twice", e.path)));
        }
        if let Some((parent, _)) = e.path.rsplit_once('/')
            && !dirs.contains(parent)
        {
            return Err(bad(format!("path '{}' comes before its folder", e.path)));
        }
        if e.kind == Kind::Dir {
            dirs.insert(&e.path);
        }
        if e.chunks
            .iter()
            .any(|c| c.len() != 64 || !c.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(bad(format!(
                "file '{}' names a chunk that is not a SHA-256",
                e.path
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, kind: Kind) -> Entry {
        Entry {
            path: path.to_owned(),
            kind,
            mode: 0o644,
            size: 0,
            target: None,
            chunks: Vec::new(),
        }
    }

    fn manifest(entries: Vec<Entry>) -> Manifest {
        Manifest {
            version: MANIFEST_VERSION,
            name: "s".into(),
            created_at: String::new(),
            bytes: 0,
            chunk_count: 0,
            entries,
        }
    }

    #[test]
    fn names_are_dns_subdomains() {
        assert!(valid_name("before-refactor.1"));
        assert!(valid_name("team-a/before-refactor.1"));
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a/b/c",
            "a.b/c",
            "/a",
            "a/",
            "a_b",
            "../x",
            &"a".repeat(254),
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_manifest_cannot_write_outside_the_workspace() {
        assert!(
            check_paths(&manifest(vec![
                entry("a", Kind::Dir),
                entry("a/b", Kind::File)
            ]))
            .is_ok()
        );
        for bad in [
            vec![entry("../x", Kind::File)],
            vec![entry("/etc/passwd", Kind::File)],
            vec![entry("a/../../x", Kind::File)],
            vec![entry("a/b", Kind::File)],
            vec![entry("x", Kind::File), entry("x", Kind::File)],
            vec![entry("", Kind::Dir)],
        ] {
            assert!(
                matches!(
                    check_paths(&manifest(bad.clone())),
                    Err(SnapshotError::BadManifest { .. })
                ),
                "{bad:?}"
            );
        }
        let mut file = entry("f", Kind::File);
        file.chunks = vec!["../../x".into()];
        assert!(check_paths(&manifest(vec![file])).is_err());
    }

    #[test]
    fn a_walk_lists_parents_first_and_never_follows_a_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("b/c")).expect("dirs");
        std::fs::write(dir.path().join("b/c/f"), "x").expect("file");
        std::fs::write(dir.path().join("a"), "y").expect("file");
        std::os::unix::fs::symlink("/etc", dir.path().join("link")).expect("link");
        let listed: Vec<String> = walk(dir.path())
            .expect("walk")
            .into_iter()
            .map(|(_, rel, _)| rel)
            .collect();
        assert_eq!(listed, ["a", "b", "link", "b/c", "b/c/f"]);
    }
}
