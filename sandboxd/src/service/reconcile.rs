//! Reconciling at start: every session's row held against what Docker and the disk have.

use super::*;

use serde::Serialize;
use tracing::{info, warn};

use crate::container::Presence;
use crate::storage::store::{SessionRow, State};

impl Core {
    /// Brings the rows in line with what Docker reports, after a crash at any point: no
    /// orphaned container, no lost workspace, no stuck session.
    pub async fn reconcile(&self) -> Result<Reconciled, ServiceError> {
        let mut done = Reconciled::default();
        self.note_all_egress().await?;
        let owned = self.engine.owned().await.map_err(ServiceError::Docker)?;
        let rows = self.store.list().await.map_err(db)?;
        for row in &rows {
            if row.state != State::Destroying
                && let Err(e) = self.disks.mount(&row.id)
            {
                warn!(session = %row.id, error = %e, "cannot mount the workspace disk");
            }
        }
        for c in &owned {
            // By container id: a container a session took from a warm pool is labelled with
            // the pool's name for it, not the session's.
            let row = rows
                .iter()
                .find(|r| r.container_id.as_deref() == Some(c.id.as_str()));
            let keep = row.is_some_and(|r| {
                matches!(r.state, State::Running | State::Stopped)
                    && r.container_id.as_deref() == Some(c.id.as_str())
            });
            if !keep {
                let _ = self.engine.remove(&c.id).await;
                done.containers_removed += 1;
            } else if c.paused
                && let Ok(docker) = self.engine.docker()
            {
                // Frozen for a snapshot when sandboxd stopped: it goes on.
                match docker.thaw(&c.id).await {
                    Ok(()) => {
                        warn!(container = %c.id, "a sandbox left paused by a snapshot cut off goes on")
                    }
                    Err(e) => {
                        warn!(container = %c.id, error = %e, "cannot unpause a sandbox a snapshot left paused")
                    }
                }
            }
        }
        for row in &rows {
            let container = owned
                .iter()
                .find(|c| Some(c.id.as_str()) == row.container_id.as_deref());
            // A row that cannot be fixed now is reported and left for the next start; it never
            // keeps the others (or sandboxd) from going on.
            match self.reconcile_row(row, container).await {
                Ok(true) => done.sessions_fixed += 1,
                Ok(false) => {}
                Err(e) => {
                    warn!(
                        session = %row.id,
                        state = ?row.state,
                        error = %e,
                        "reconcile could not fix this session; it is left as it is"
                    );
                    done.sessions_failed += 1;
                }
            }
        }
        info!(
            containers_removed = done.containers_removed,
            sessions_fixed = done.sessions_fixed,
            sessions_failed = done.sessions_failed,
            "reconciled with docker"
        );
        Ok(done)
    }

    /// Brings one row in line with its container (if Docker has it); returns whether it
    /// changed anything that counts as a fix.
    pub(super) async fn reconcile_row(
        &self,
        row: &SessionRow,
        container: Option<&crate::container::Owned>,
    ) -> Result<bool, ServiceError> {
        match (row.state, container) {
            (State::Opening, _)
                if std::fs::symlink_metadata(self.settings.workspace_root.join(&row.id))
                    .is_err()
                    && self.disks.size(&row.id).is_none() =>
            {
                // A first open interrupted before it made the session's folder: it never
                // answered, so no one holds its token or saw a file. Its row goes, as a failed
                // open's does, and the next open of the name creates the session (rather than
                // finding it and then reporting its never-made workspace as lost). A wake always
                // has its folder: its workspace is checked before it starts.
                self.store.delete(&row.id).await.map_err(db)?;
                self.forget_tokens(&row.id);
                Ok(true)
            }
            (State::Opening, _) => {
                // Interrupted open: whatever it made is gone (above); the workspace stays.
                self.store.set_container(&row.id, None).await.map_err(db)?;
                self.store
                    .transition(&row.id, &[State::Opening], State::Reclaimed)
                    .await
                    .map_err(db)?;
                Ok(true)
            }
            (State::Destroying, _) => {
                self.destroy(&row.id).await?;
                Ok(true)
            }
            (State::Running | State::Stopped, None) => {
                self.store.set_container(&row.id, None).await.map_err(db)?;
                self.store
                    .transition(&row.id, &[State::Running, State::Stopped], State::Reclaimed)
                    .await
                    .map_err(db)?;
                Ok(true)
            }
            (State::Running, Some(c)) if !c.running => {
                self.store
                    .transition(&row.id, &[State::Running], State::Stopped)
                    .await
                    .map_err(db)?;
                Ok(true)
            }
            (State::Stopped, Some(c)) if c.running => {
                self.store
                    .transition(&row.id, &[State::Stopped], State::Running)
                    .await
                    .map_err(db)?;
                Ok(true)
            }
            (State::Reclaimed | State::Lost, Some(_)) => {
                self.store.set_container(&row.id, None).await.map_err(db)?;
                Ok(false)
            }
            _ => Ok(false),
        }
    }
}

/// What a reconcile changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Reconciled {
    /// Containers removed because no session owns them.
    pub containers_removed: usize,
    /// Sessions whose state was corrected.
    pub sessions_fixed: usize,
    /// Sessions that could not be brought in line (each logged with why); they stay as they
    /// were until the next start.
    pub sessions_failed: usize,
}

/// The state a session is shown in: its row's, except that a vanished workspace is `lost` and a
/// running row whose container Docker has stopped or removed is `stopped` or `reclaimed`, which
/// is what the next use finds (it starts or recreates the container).
pub(super) fn shown_state(
    row: State,
    workspace_exists: bool,
    container: Option<Presence>,
) -> State {
    if !workspace_exists && row != State::Destroying {
        return State::Lost;
    }
    match (row, container) {
        (State::Running, Some(Presence::Gone)) => State::Reclaimed,
        (State::Running, Some(Presence::Stopped)) => State::Stopped,
        _ => row,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::server::noop::Noop;
    use crate::storage::store::{Caps, Claim, NewSession, Store};

    const RUNTIMES: &str = r#"[{"alias": "base", "image": "never-pulled:1"}]"#;

    /// sandboxd killed in the middle of opens: one had inserted its row and made nothing else,
    /// one had made the session's folder too. After the start, the first is gone (the next
    /// open of its name creates it) and the second is kept, reclaimed, with its folder.
    #[tokio::test]
    async fn an_open_cut_before_it_made_anything_is_gone_after_a_restart() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let sandboxd = Noop::start(dir.path(), "noop-cut", RUNTIMES).await;
        let admin = sandboxd.admin.clone();
        admin.open("kept", "org", None, None).await.expect("open");
        sandboxd.stop().await;

        let store = Store::open(&dir.path().join("state"))
            .await
            .expect("the store");
        let caps = Caps::sessions(100, 100);
        for id in ["cut", "halfway"] {
            let new = NewSession {
                id,
                tenant: "org",
                runtime: "base",
                image: "never-pulled:1",
                token_hash: id,
                limits: "{}",
                owner: None,
                disk_bytes: 0,
            };
            assert_eq!(
                store.claim(&new, caps).await.expect("claim"),
                Claim::Inserted
            );
        }
        let halfway = dir.path().join("workspaces/halfway/workspace");
        std::fs::create_dir_all(&halfway).expect("the folder the open made");
        drop(store);

        let sandboxd = Noop::start(dir.path(), "noop-cut", RUNTIMES).await;
        let admin = sandboxd.admin.clone();
        let listed: Vec<_> = admin
            .list()
            .await
            .expect("list")
            .into_iter()
            .map(|s| (s.id, s.state))
            .collect();
        assert!(!listed.iter().any(|(id, _)| id == "cut"), "{listed:?}");
        assert!(
            listed.contains(&("halfway".to_owned(), sandboxd_api::SessionState::Reclaimed)),
            "{listed:?}"
        );
        assert!(halfway.is_dir(), "the folder of an open that made it stays");
        let opened = admin.open("cut", "org", None, None).await.expect("open");
        assert!(opened.created, "the cut open's name opens anew");
        assert_eq!(opened.session.state, sandboxd_api::SessionState::Running);
        sandboxd.stop().await;
    }

    #[test]
    fn a_session_is_shown_as_docker_and_the_disk_have_it() {
        let gone = Some(Presence::Gone);
        assert_eq!(shown_state(State::Running, true, gone), State::Reclaimed);
        assert_eq!(
            shown_state(State::Running, true, Some(Presence::Stopped)),
            State::Stopped
        );
        assert_eq!(
            shown_state(State::Running, true, Some(Presence::Running(Some(7)))),
            State::Running
        );
        // Docker could not be asked: the row is all there is.
        assert_eq!(shown_state(State::Running, true, None), State::Running);
        // A stopped or reclaimed row is never second-guessed.
        assert_eq!(shown_state(State::Stopped, true, gone), State::Stopped);
        // A vanished workspace wins over everything but a destroy in progress.
        assert_eq!(shown_state(State::Running, false, gone), State::Lost);
        assert_eq!(shown_state(State::Reclaimed, false, None), State::Lost);
        assert_eq!(
            shown_state(State::Destroying, false, None),
            State::Destroying
        );
    }
}
