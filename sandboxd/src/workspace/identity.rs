//! The sandbox user's file identity: threads that act on a workspace with exactly the
//! permissions the sandbox's uid has inside its container.
//!
//! sandboxd runs as root. Left as it is, every file operation it makes on a workspace would
//! carry root's `CAP_DAC_OVERRIDE`: a file the agent made unreadable (`chmod 000`) would still
//! be read through the API, a read-only directory still written. So each operation runs on a
//! thread of its own whose filesystem uid and gid (`setfsuid(2)`, `setfsgid(2)`, both
//! per-thread on Linux) are the sandbox's. Moving the fsuid away from 0 also makes the kernel
//! clear the file capabilities (`CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`, `CAP_FOWNER`,
//! `CAP_CHOWN`, `CAP_FSETID`, …) from that thread's effective set, so the kernel checks the
//! mode bits exactly as for the sandbox user. Files the thread creates belong to that user.
//!
//! The thread is a fresh one, started for the operation and ended after it: a changed identity
//! can never leak into tokio's shared blocking threads or any other work. Supplementary groups
//! are process-wide and stay the daemon's; the sandbox's files are owned by its uid and gid, so
//! they do not widen what it can do in a workspace.

use std::cell::Cell;
use std::io;

use nix::unistd::{Gid, Uid, setfsgid, setfsuid};

thread_local! {
    /// The file identity this thread acts with, when it is a sandbox user's thread.
    static ACTING_AS: Cell<Option<(u32, u32)>> = const { Cell::new(None) };
}

/// Whether this thread already acts as `uid`:`gid`.
pub fn acting_as(uid: u32, gid: u32) -> bool {
    ACTING_AS.with(|a| a.get() == Some((uid, gid)))
}

/// Runs `op` on a new thread whose filesystem identity is `uid`:`gid`, and waits for it.
/// On a thread that already acts as `uid`:`gid`, runs it right here.
///
/// Fails when the thread cannot be started or the identity cannot be taken (sandboxd is
/// neither root nor that user).
pub fn run_as<T: Send>(uid: u32, gid: u32, op: impl FnOnce() -> T + Send) -> io::Result<T> {
    if acting_as(uid, gid) {
        return Ok(op());
    }
    // The operation's ticket (deadline, memory) goes with it to the thread that does it.
    let ticket = super::deadline::current();
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name("sandboxd-files".to_owned())
            .spawn_scoped(scope, move || {
                become_user(uid, gid)?;
                ACTING_AS.with(|a| a.set(Some((uid, gid))));
                Ok(match ticket {
                    Some(ticket) => super::deadline::under(ticket, op),
                    None => op(),
                })
            })?;
        match thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Runs `op` with the daemon's own file identity on this thread, then takes the sandbox's
/// again: for opening the workspace directory itself, whose parents (the daemon's folders)
/// the sandbox user need not be able to search. Elsewhere, simply runs `op`.
pub fn as_daemon<T>(op: impl FnOnce() -> T) -> T {
    let Some((uid, gid)) = ACTING_AS.with(Cell::get) else {
        return op();
    };
    let daemon = (nix::unistd::geteuid(), nix::unistd::getegid());
    setfsuid(daemon.0);
    setfsgid(daemon.1);
    struct Back(u32, u32);
    impl Drop for Back {
        fn drop(&mut self) {
            setfsgid(Gid::from_raw(self.1));
            setfsuid(Uid::from_raw(self.0));
        }
    }
    let _back = Back(uid, gid);
    op()
}

/// Takes `uid`:`gid` as this thread's filesystem identity, checking that it took: setfsuid
/// reports no error, only the previous value, so a second call must return the new one.
fn become_user(uid: u32, gid: u32) -> io::Result<()> {
    // The group first: with the fsuid no longer 0, changing the fsgid could be refused.
    setfsgid(Gid::from_raw(gid));
    setfsuid(Uid::from_raw(uid));
    let (now_uid, now_gid) = (setfsuid(Uid::from_raw(uid)), setfsgid(Gid::from_raw(gid)));
    if now_uid.as_raw() != uid || now_gid.as_raw() != gid {
        return Err(io::Error::other(format!(
            "sandboxd could not act as the sandbox user {uid}:{gid} for a file operation \
             (it runs as uid {}; it must run as root or as that user)",
            nix::unistd::geteuid()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    #[test]
    fn a_user_thread_has_the_users_permissions_and_no_other_thread_does() {
        let temp = tempfile::tempdir().expect("tempdir");
        let secret = temp.path().join("secret");
        fs::write(&secret, b"root only").expect("write");
        fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).expect("chmod");
        fs::set_permissions(temp.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let as_user = run_as(10001, 10001, || fs::read(&secret)).expect("thread");
        let e = as_user.expect_err("the sandbox user cannot read a root-only file");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        // The calling thread (and so every other one) keeps its own identity.
        assert!(!acting_as(10001, 10001));
        assert_eq!(fs::read(&secret).expect("root reads"), b"root only");
        // What a user thread creates is the user's.
        let made = temp.path().join("made");
        fs::set_permissions(temp.path(), fs::Permissions::from_mode(0o777)).expect("chmod");
        run_as(10001, 10001, || fs::write(&made, b"x"))
            .expect("thread")
            .expect("write");
        let meta = fs::metadata(&made).expect("meta");
        assert_eq!((meta.uid(), meta.gid()), (10001, 10001));
        // Nested: runs on the same thread, and the daemon's identity can be borrowed back.
        let nested = run_as(10001, 10001, || {
            let inner = run_as(10001, 10001, || acting_as(10001, 10001)).expect("inner");
            let daemon_reads = as_daemon(|| fs::read(&secret).is_ok());
            let user_again = fs::read(&secret).is_err();
            (inner, daemon_reads, user_again)
        })
        .expect("thread");
        assert_eq!(nested, (true, true, true));
    }
}
