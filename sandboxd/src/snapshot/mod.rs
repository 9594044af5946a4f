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

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The largest chunk: files are cut at this many bytes.
pub const CHUNK_BYTES: usize = 4 * 1024 * 1024;

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
        "'{0}' is not a snapshot name: 1 to 253 characters of a-z, 0-9, '-' and '.', starting and ending with a letter or digit"
    )]
    BadName(String),
    /// The restore's destination exists already.
    #[error("{0} exists: a restore makes a new folder")]
    DestinationExists(String),
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

/// Whether `name` may name a snapshot (a DNS subdomain, as a Kubernetes object's name).
pub fn valid_name(name: &str) -> bool {
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
        let mut entries = Vec::with_capacity(listed.len());
        let mut seen: HashSet<String> = HashSet::new();
        let (mut chunks_sent, mut bytes_sent, mut bytes) = (0usize, 0u64, 0u64);
        for (path, rel, meta) in listed {
            let mode = meta.permissions().mode() & 0o7777;
            let ft = meta.file_type();
            if ft.is_dir() {
                entries.push(Entry {
                    path: rel,
                    kind: Kind::Dir,
                    mode,
                    size: 0,
                    target: None,
                    chunks: Vec::new(),
                });
                continue;
            }
            if ft.is_symlink() {
                let target = std::fs::read_link(&path).map_err(|e| SnapshotError::Io {
                    path: rel.clone(),
                    source: e,
                })?;
                entries.push(Entry {
                    path: rel,
                    kind: Kind::Symlink,
                    mode,
                    size: 0,
                    target: Some(target.to_string_lossy().into_owned()),
                    chunks: Vec::new(),
                });
                continue;
            }
            let mut chunks = Vec::new();
            let mut size = 0u64;
            let mut file = std::fs::File::open(&path).map_err(|e| SnapshotError::Io {
                path: rel.clone(),
                source: e,
            })?;
            loop {
                let (block, f) = read_block(file, &rel).await?;
                file = f;
                if block.is_empty() {
                    break;
                }
                size += block.len() as u64;
                let name = chunk_name(&block);
                if seen.insert(name.clone())
                    && let Some(sent) = self.put_chunk(&name, block).await?
                {
                    chunks_sent += 1;
                    bytes_sent += sent;
                }
                chunks.push(name);
            }
            bytes += size;
            entries.push(Entry {
                path: rel,
                kind: Kind::File,
                mode,
                size,
                target: None,
                chunks,
            });
        }
        let manifest = Manifest {
            version: MANIFEST_VERSION,
            name: name.to_owned(),
            created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            bytes,
            chunk_count: seen.len(),
            entries,
        };
        self.put_manifest(&manifest).await?;
        Ok(Taken {
            manifest,
            chunks_sent,
            bytes_sent,
        })
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
        for e in &manifest.entries {
            let at = staging.join(&e.path);
            match e.kind {
                Kind::Dir => {
                    std::fs::create_dir(&at).map_err(|err| io(&e.path, err))?;
                    dirs.push((at.clone(), e.mode));
                }
                Kind::Symlink => {
                    let target = e.target.as_deref().unwrap_or_default();
                    std::os::unix::fs::symlink(target, &at).map_err(|err| io(&e.path, err))?;
                }
                Kind::File => {
                    let mut out = std::fs::File::create(&at).map_err(|err| io(&e.path, err))?;
                    let mut written = 0u64;
                    for chunk in &e.chunks {
                        let data = self.get_chunk(&manifest.name, &e.path, chunk).await?;
                        written += data.len() as u64;
                        std::io::Write::write_all(&mut out, &data)
                            .map_err(|err| io(&e.path, err))?;
                    }
                    if written != e.size {
                        return Err(SnapshotError::BadManifest {
                            snapshot: manifest.name.clone(),
                            why: format!(
                                "file '{}' is {} bytes in the manifest and {written} in its chunks",
                                e.path, e.size
                            ),
                        });
                    }
                    out.sync_all().map_err(|err| io(&e.path, err))?;
                    std::fs::set_permissions(&at, std::fs::Permissions::from_mode(e.mode))
                        .map_err(|err| io(&e.path, err))?;
                }
            }
            std::os::unix::fs::lchown(&at, Some(uid), Some(gid)).map_err(|err| io(&e.path, err))?;
        }
        // Folders' modes last: a folder without write permission still took its files.
        for (dir, mode) in dirs.into_iter().rev() {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
                .map_err(|err| io(&dir.display().to_string(), err))?;
        }
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

/// Reads the next block of at most [`CHUNK_BYTES`] of `file` off the async runtime.
async fn read_block(
    file: std::fs::File,
    rel: &str,
) -> Result<(Vec<u8>, std::fs::File), SnapshotError> {
    let rel = rel.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut file = file;
        let mut block = vec![0u8; CHUNK_BYTES];
        let mut filled = 0;
        while filled < CHUNK_BYTES {
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
        for bad in ["", "-a", "a-", "A", "a/b", "a_b", "../x", &"a".repeat(254)] {
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
