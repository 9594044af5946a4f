//! Workspace disks: every session's workspace is a filesystem of its own, so a sandbox that
//! writes without end fills its own disk ("No space left on device") and never the node's.
//!
//! A session's disk is an ext4 image file `{root}/{id}/workspace.img`, made sparse when the
//! session is created (its nominal size is the session's limit; the node's disk gives it only
//! what it writes), formatted without writing its inode tables or journal ahead, and
//! loop-mounted (`nosuid,nodev,noinit_itable,discard`: nothing zeroes the tables later, and
//! what a sandbox deletes goes back to the node) at `{root}/{id}/workspace`, the folder every
//! file operation and the container's `/workspace` bind mount use. A new 4 GiB disk takes about
//! 4 MiB of the node's. Sparse disks could together promise more than the node has: the
//! workspace budget (`SANDBOXD_WORKSPACE_BUDGET`, checked in the same statement that claims a
//! session's slot) never lets the nominal sizes of the workspaces a host holds add up to more
//! than the filesystem has less a reserve for sandboxd's state.
//!
//! This needs no filesystem quota support in the kernel (XFS project quotas and ext4 quotas
//! need `CONFIG_XFS_QUOTA` or `CONFIG_QUOTA`, which many VM and CI kernels are built without),
//! only loop devices, `mkfs.ext4` and `mount`, and root (`CAP_SYS_ADMIN`). The mounts are made
//! in sandboxd's mount namespace and must be seen by dockerd: sandboxd runs on the host, or in
//! a privileged container whose workspace root is mounted with bidirectional propagation.
//!
//! Everything is done with the tools (`mkfs.ext4`, `mount`, `umount`): this workspace forbids
//! unsafe code, and so the ioctls and syscalls behind them.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use tracing::{info, warn};

/// The image file of a session's disk, in its session folder.
pub const IMAGE_NAME: &str = "workspace.img";

/// The smallest workspace size: ext4 needs room for its journal and metadata.
pub const MIN_SIZE: u64 = 16 << 20;

/// Why a disk could not be made, mounted or released.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The node's filesystem refused the disk's image file.
    #[error(
        "this host has no room for a workspace of {} (the node's disk under {root} is too full); close sessions or ask for a smaller limits.workspace_size",
        human(*.size)
    )]
    NoRoom {
        /// The size asked for.
        size: u64,
        /// The workspace root.
        root: String,
    },
    /// A tool failed.
    #[error("{what} failed: {message}")]
    Tool {
        /// What was run.
        what: String,
        /// Its error output.
        message: String,
    },
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Sizes as people read them: `64 MiB`, `10 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (unit, shift) in UNITS {
        let one = 1u64 << shift;
        if bytes >= one {
            return if bytes.is_multiple_of(one) {
                format!("{} {unit}", bytes >> shift)
            } else {
                format!("{:.1} {unit}", bytes as f64 / one as f64)
            };
        }
    }
    format!("{bytes} bytes")
}

/// The disks of one sandboxd's sessions, under its workspace root.
#[derive(Debug, Clone)]
pub struct Disks {
    root: PathBuf,
    uid: u32,
}

fn run(what: &str, cmd: &mut Command) -> Result<(), DiskError> {
    let out = cmd.output().map_err(|e| DiskError::Tool {
        what: what.to_owned(),
        message: format!("cannot run it: {e}"),
    })?;
    if out.status.success() {
        return Ok(());
    }
    let mut message = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    if message.is_empty() {
        message = format!("exit status {}", out.status);
    }
    Err(DiskError::Tool {
        what: what.to_owned(),
        message,
    })
}

/// `e2fsck -f -p` of a disk image before an offline resize (which refuses an unchecked one):
/// exit status 0 (clean) and 1 (errors corrected) go on, anything else fails with its words.
fn check(image: &Path) -> Result<(), DiskError> {
    let out = Command::new("e2fsck")
        .args(["-f", "-p"])
        .arg(image)
        .output()
        .map_err(|e| DiskError::Tool {
            what: "e2fsck".to_owned(),
            message: format!("cannot run it: {e}"),
        })?;
    match out.status.code() {
        Some(0 | 1) => Ok(()),
        _ => Err(DiskError::Tool {
            what: "e2fsck".to_owned(),
            message: format!(
                "{}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }),
    }
}

fn on_path(tool: &str) -> bool {
    let dirs = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&dirs)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .any(|d| d.join(tool).is_file())
}

impl Disks {
    /// The disks under `root`, whose workspaces belong to `uid`.
    pub fn new(root: &Path, uid: u32) -> Self {
        Self {
            root: root.to_owned(),
            uid,
        }
    }

    /// Whether this host can give sessions disks of their own; the error names what is
    /// missing.
    pub fn check(&self) -> Result<(), String> {
        let mut missing = Vec::new();
        let euid = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
        if euid != Some(0) {
            missing.push("root (mounting a filesystem needs CAP_SYS_ADMIN)".to_owned());
        }
        for tool in ["mkfs.ext4", "mount", "umount"] {
            if !on_path(tool) {
                missing.push(format!(
                    "{tool} (Debian's {})",
                    if tool == "mkfs.ext4" {
                        "e2fsprogs"
                    } else {
                        "util-linux and mount"
                    }
                ));
            }
        }
        if !Path::new("/dev/loop-control").exists() {
            missing.push("loop devices (/dev/loop-control)".to_owned());
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join(", "))
        }
    }

    fn folder(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// The image file of a session's disk.
    pub fn image(&self, id: &str) -> PathBuf {
        self.folder(id).join(IMAGE_NAME)
    }

    fn mount_point(&self, id: &str) -> PathBuf {
        self.folder(id).join("workspace")
    }

    /// The size of a session's disk: `None` when it has none (a host without workspace
    /// limits, or a session from before them).
    pub fn size(&self, id: &str) -> Option<u64> {
        std::fs::symlink_metadata(self.image(id))
            .ok()
            .filter(std::fs::Metadata::is_file)
            .map(|m| m.len())
    }

    /// Whether the session's disk is mounted at its workspace folder (the folder is on another
    /// device than its parent).
    pub fn is_mounted(&self, id: &str) -> bool {
        let dev = |p: PathBuf| std::fs::symlink_metadata(p).map(|m| m.dev()).ok();
        match (dev(self.mount_point(id)), dev(self.folder(id))) {
            (Some(inner), Some(outer)) => inner != outer,
            _ => false,
        }
    }

    /// Makes and mounts a new disk of `size` bytes for session `id`; a disk already there is
    /// only mounted. A workspace folder that already holds files and has no disk is left as it
    /// is (a session from before workspace limits), with a warning.
    pub fn create(&self, id: &str, size: u64) -> Result<(), DiskError> {
        let folder = self.folder(id);
        let image = self.image(id);
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| DiskError::Io { path, source }
        };
        std::fs::create_dir_all(&folder).map_err(io(&folder))?;
        if image.exists() {
            return self.mount(id);
        }
        let mount_point = self.mount_point(id);
        if std::fs::read_dir(&mount_point).is_ok_and(|mut d| d.next().is_some()) {
            warn!(
                session = id,
                "the workspace predates workspace limits and keeps no size limit"
            );
            return Ok(());
        }
        let partial = folder.join(format!("{IMAGE_NAME}.new"));
        let _ = std::fs::remove_file(&partial);
        // Sparse: the file has its nominal size and no blocks yet.
        let allocated = std::fs::File::create(&partial)
            .and_then(|f| f.set_len(size))
            .map_err(io(&partial));
        if let Err(e) = allocated {
            let _ = std::fs::remove_file(&partial);
            return Err(match e {
                DiskError::Io { source, .. }
                    if source.raw_os_error() == Some(28) || source.raw_os_error() == Some(27) =>
                {
                    DiskError::NoRoom {
                        size,
                        root: self.root.display().to_string(),
                    }
                }
                other => other,
            });
        }
        let formatted = run(
            "mkfs.ext4",
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "0", "-E"])
                .arg(format!(
                    "root_owner={0}:{0},nodiscard,lazy_itable_init=1,lazy_journal_init=1",
                    self.uid
                ))
                .arg(&partial),
        );
        if let Err(e) = formatted {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
        std::fs::rename(&partial, &image).map_err(io(&image))?;
        self.mount(id)?;
        // A new ext4 has lost+found; a workspace starts empty.
        let _ = std::fs::remove_dir(mount_point.join("lost+found"));
        info!(session = id, size, "workspace disk made");
        Ok(())
    }

    /// Grows a session's disk to `size` bytes: the image file is allocated to the new size,
    /// the loop device behind the mount told of it (`losetup -c`) and the ext4 on it grown
    /// (`resize2fs`) online. Where the kernel refuses an online resize (it needs
    /// `CAP_SYS_RESOURCE`, which a container may lack) the disk is grown offline instead:
    /// unmounted (refused while anything holds it: no lazy unmount here), checked
    /// (`e2fsck -f -p`), grown and mounted again; the caller makes sure no container binds it.
    /// A size at or below the disk's changes nothing (a disk never shrinks: the caller
    /// refuses that, naming the size).
    pub fn grow(&self, id: &str, size: u64) -> Result<(), DiskError> {
        let image = self.image(id);
        let Some(current) = self.size(id) else {
            return Err(DiskError::Tool {
                what: "grow".to_owned(),
                message: format!("session '{id}' has no workspace disk to grow"),
            });
        };
        if size <= current {
            return Ok(());
        }
        self.mount(id)?;
        let allocated = run(
            "fallocate",
            Command::new("fallocate")
                .arg("-l")
                .arg(size.to_string())
                .arg(&image),
        );
        if let Err(e) = allocated {
            return Err(match e {
                DiskError::Tool { message, .. } if message.contains("No space left") => {
                    DiskError::NoRoom {
                        size,
                        root: self.root.display().to_string(),
                    }
                }
                other => other,
            });
        }
        let online = self.loop_device(&image).and_then(|device| {
            run(
                "losetup -c",
                Command::new("losetup").arg("--set-capacity").arg(&device),
            )?;
            run("resize2fs", Command::new("resize2fs").arg(&device))
        });
        if let Err(e) = online {
            info!(session = id, error = %e, "online resize refused; the disk is grown offline");
            let mount_point = self.mount_point(id);
            run("umount", Command::new("umount").arg(&mount_point))?;
            let grown = check(&image)
                .and_then(|()| run("resize2fs", Command::new("resize2fs").arg(&image)));
            // Mounted again whatever happened: the workspace is never left unmounted.
            let mounted = self.mount(id);
            grown?;
            mounted?;
        }
        info!(
            session = id,
            from = current,
            to = size,
            "workspace disk grown"
        );
        Ok(())
    }

    /// The loop device that holds `image`.
    fn loop_device(&self, image: &Path) -> Result<String, DiskError> {
        let out = Command::new("losetup")
            .args(["--noheadings", "--output", "NAME", "--associated"])
            .arg(image)
            .output()
            .map_err(|e| DiskError::Tool {
                what: "losetup".to_owned(),
                message: format!("cannot run it: {e}"),
            })?;
        let listed = String::from_utf8_lossy(&out.stdout);
        listed
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| DiskError::Tool {
                what: "losetup".to_owned(),
                message: format!(
                    "no loop device holds {}: {}",
                    image.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            })
    }

    /// Mounts a session's disk at its workspace folder if it has one and it is not mounted.
    pub fn mount(&self, id: &str) -> Result<(), DiskError> {
        let image = self.image(id);
        if !image.is_file() || self.is_mounted(id) {
            return Ok(());
        }
        let mount_point = self.mount_point(id);
        std::fs::create_dir_all(&mount_point).map_err(|source| DiskError::Io {
            path: mount_point.display().to_string(),
            source,
        })?;
        run(
            "mount",
            Command::new("mount")
                .args([
                    "-t",
                    "ext4",
                    "-o",
                    "loop,nosuid,nodev,noatime,noinit_itable,discard",
                ])
                .arg(&image)
                .arg(&mount_point),
        )
    }

    /// Unmounts a session's disk and removes its image, which frees its space; the session
    /// folder stays.
    pub fn release(&self, id: &str) -> Result<(), DiskError> {
        self.unmount(id)?;
        let image = self.image(id);
        match std::fs::remove_file(&image) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(DiskError::Io {
                path: image.display().to_string(),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// Unmounts a session's disk (before its folder is removed); not mounted is fine.
    pub fn unmount(&self, id: &str) -> Result<(), DiskError> {
        if !self.is_mounted(id) {
            return Ok(());
        }
        let mount_point = self.mount_point(id);
        match run("umount", Command::new("umount").arg(&mount_point)) {
            Ok(()) => Ok(()),
            // Still busy (a file operation in flight): detach it now, the kernel finishes.
            Err(_) => run(
                "umount -l",
                Command::new("umount").arg("-l").arg(&mount_point),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_words() {
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human(10 << 30), "10 GiB");
        assert_eq!(human(1536 << 20), "1.5 GiB");
        assert_eq!(human(512), "512 bytes");
    }

    #[test]
    fn no_disk_no_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disks = Disks::new(dir.path(), 10001);
        assert_eq!(disks.size("s1"), None);
        assert!(!disks.is_mounted("s1"));
        std::fs::create_dir_all(dir.path().join("s1/workspace")).expect("mkdir");
        assert!(!disks.is_mounted("s1"));
        std::fs::write(dir.path().join("s1").join(IMAGE_NAME), vec![0u8; 4096]).expect("write");
        assert_eq!(disks.size("s1"), Some(4096));
        assert!(disks.unmount("s1").is_ok());
    }
}
