//! File watch of a session: a folder of its workspace watched by inotify inside its sandbox
//! (through the agent), bounded in folders per watch (`SANDBOXD_WATCH_MAX_FOLDERS`) and in
//! watches per session ([`MAX_WATCHES_PER_SESSION`]).

use super::*;

use sandboxd_api::files::EntryKind;

use crate::run::terminal::TermError;
use crate::run::watch::Watch;
use crate::storage::store::State;
use crate::workspace::{FileError, workspace_relative};

/// Watches one session may have open at once.
pub const MAX_WATCHES_PER_SESSION: usize = 8;

/// A session's place among its watches, given back when dropped.
pub struct WatchSlot {
    core: Arc<Core>,
    id: String,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        if let Ok(mut watches) = self.core.watches.lock()
            && let Some(n) = watches.get_mut(&self.id)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                watches.remove(&self.id);
            }
        }
    }
}

/// Where a watch watches, in the sandbox and as the API names it.
#[derive(Debug, Clone)]
pub struct Watched {
    /// The folder, relative to the workspace root (`` for the root).
    pub path: String,
    /// Every folder below it too.
    pub recursive: bool,
}

impl Watched {
    /// The folder as the sandbox sees it.
    fn in_sandbox(&self) -> String {
        if self.path.is_empty() {
            "/workspace".to_owned()
        } else {
            format!("/workspace/{}", self.path)
        }
    }

    /// A path the agent reported (relative to the watched folder) as the API names it
    /// (relative to the workspace root).
    pub fn shown(&self, path: &str) -> String {
        match (self.path.is_empty(), path.is_empty()) {
            (true, _) => path.to_owned(),
            (false, true) => self.path.clone(),
            (false, false) => format!("{}/{path}", self.path),
        }
    }
}

impl Core {
    /// Starts watching folder `path` of session `id`'s workspace, waking the session; its
    /// place among the session's watches is held until the slot is dropped.
    pub async fn watch(
        self: &Arc<Self>,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<(Watched, Watch, WatchSlot), ServiceError> {
        let rel = workspace_relative(path)?;
        let slot = self.take_watch_slot(id)?;
        if self.is_rebuilding(id) {
            return Err(ServiceError::Rebuilding { id: id.to_owned() });
        }
        self.wake(id).await.map_err(|e| gone_if_destroying(id, e))?;
        let ws = self.workspace(id);
        let looked = rel.clone();
        let entry = tokio::task::spawn_blocking(move || ws.stat_followed(&looked))
            .await
            .map_err(|e| ServiceError::internal(format!("the look at the folder failed: {e}")))??;
        if entry.kind != EntryKind::Dir {
            return Err(FileError::NotADirectory {
                path: path.to_owned(),
            }
            .into());
        }
        let watched = Watched {
            path: rel,
            recursive,
        };
        let watch = self.rewatch(id, &watched).await?;
        Ok((watched, watch, slot))
    }

    /// Watches `watched` of session `id` again (after its sandbox slept), never waking it:
    /// `None` while it does not run.
    pub async fn rewatch(&self, id: &str, watched: &Watched) -> Result<Watch, ServiceError> {
        self.runner
            .watch(
                id,
                &watched.in_sandbox(),
                watched.recursive,
                self.settings.watch_max_folders,
            )
            .await
            .map_err(|e| match e {
                TermError::NotFound(why) => ServiceError::invalid(why),
                e => ServiceError::Terminal(e),
            })
    }

    /// Whether session `id` runs now (a watch resumes once it does).
    pub async fn runs_now(&self, id: &str) -> Result<bool, ServiceError> {
        Ok(self.row(id).await?.state == State::Running)
    }

    fn take_watch_slot(self: &Arc<Self>, id: &str) -> Result<WatchSlot, ServiceError> {
        let mut watches = self
            .watches
            .lock()
            .map_err(|_| ServiceError::internal("the watch table is poisoned"))?;
        let n = watches.entry(id.to_owned()).or_default();
        if *n >= MAX_WATCHES_PER_SESSION {
            return Err(ServiceError::WatchLimit { id: id.to_owned() });
        }
        *n += 1;
        Ok(WatchSlot {
            core: self.clone(),
            id: id.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_shown_from_the_workspace_root() {
        let root = Watched {
            path: String::new(),
            recursive: true,
        };
        assert_eq!(root.in_sandbox(), "/workspace");
        assert_eq!(root.shown("a/b.txt"), "a/b.txt");
        let sub = Watched {
            path: "src".to_owned(),
            recursive: false,
        };
        assert_eq!(sub.in_sandbox(), "/workspace/src");
        assert_eq!(sub.shown("a.rs"), "src/a.rs");
        assert_eq!(sub.shown(""), "src");
    }
}
