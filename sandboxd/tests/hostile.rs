//! A hostile sandbox against the real dockerd: trees too deep to delete recursively, a FIFO
//! raced in place of a folder sandboxd creates, an open made to fail, concurrent opens and
//! wakes. Each test is the attack, and checks what a user would see: sandboxd still up,
//! another session still answering, the exact error, nothing left behind.

mod common;

use sandboxd_api::ErrorCode;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Daemon, exists, until};
use sandboxd_api::Limits;
use sandboxd_api::SessionState as State;
use sandboxd_api::client::{Client, ClientError};

/// How deep the sandbox digs: more folders than a process may hold descriptors for (20,000
/// here), and far more than a recursion per level fits in a thread's stack.
const DEPTH: usize = 60_000;

/// Makes `/workspace/{name}/d/d/…` `DEPTH` folders deep from inside the sandbox (perl is in
/// Debian's minbase, the base image).
async fn dig(client: &Client, id: &str, name: &str) {
    let script = format!(
        "mkdir {name} && cd {name} && perl -e 'for $n (1..{DEPTH}) {{ mkdir \"d\" or die \"mkdir at $n: $!\"; chdir \"d\" or die \"chdir at $n: $!\" }} print \"dug\\n\"'"
    );
    let out = client
        .run(id, &script, Some(240), None, None)
        .await
        .expect("the dig runs");
    if common::on_gvisor() && out.stderr.contains("Too many open files") {
        // gVisor holds a host descriptor for each folder on the path (its gofer's, at most
        // 20,000 by Docker's limit for it): the sandbox gets EMFILE there, and stays a
        // sandbox that can be killed (runsc's --directfs=false: its sentry's own descriptors
        // are not the ones spent). A tree that deep is still far past what sandboxd walks.
        let depth: usize = out
            .stderr
            .split(" at ")
            .nth(1)
            .and_then(|s| s.split(':').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(
            depth >= 10_000,
            "the sandbox dug {depth} levels: {}",
            out.stderr
        );
        // Its gofer is left without descriptors, so this sandbox's own next runs fail (no
        // other is touched) until it starts again: it is put to sleep, and its next use
        // starts it afresh with the tree in its workspace.
        client.stop(id).await.expect("the sandbox sleeps");
        return;
    }
    assert_eq!(
        (out.exit_code, out.stdout.as_str()),
        (0, "dug\n"),
        "the sandbox made the deep tree: {}",
        out.stderr
    );
}

/// Where the daemons of the deep-tree tests keep their workspaces: a tmpfs, so that making
/// and deleting 60,000 folders is bound by sandboxd, not by a shared disk's journal.
fn deep_daemon() -> Daemon {
    let shm = Path::new("/dev/shm");
    assert!(
        shm.is_dir(),
        "/dev/shm (a tmpfs) is needed for the deep-tree tests"
    );
    Daemon::start_in(shm, &[])
}

/// The entries of the trash folder (none when it is not there).
fn trash_entries(root: &Path) -> Vec<String> {
    match std::fs::read_dir(root.join(".trash")) {
        Ok(entries) => entries
            .map(|e| {
                e.expect("a trash entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("cannot read the trash: {e}"),
    }
}

async fn trash_emptied(root: &Path) {
    until("the trash is emptied", Duration::from_secs(90), || async {
        trash_entries(root).is_empty().then_some(())
    })
    .await;
}

/// A command in `id` answers.
async fn answers(client: &Client, id: &str) {
    let out = client
        .run(id, "echo alive", Some(30), None, None)
        .await
        .expect("the other session runs a command");
    assert_eq!((out.exit_code, out.stdout.as_str()), (0, "alive\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deep_tree_is_destroyed_at_once_and_deleted_across_a_restart() {
    let mut d = deep_daemon();
    let admin = d.admin();
    let deep = admin.open("deep", "org-a", None, None).await.expect("open");
    let other = admin
        .open("other", "org-b", None, None)
        .await
        .expect("open");
    let deep = d.client(deep.token.as_deref().expect("a token"));
    let other_token = other.token.expect("a token");
    let other = d.client(&other_token);
    dig(&deep, "deep", "tree").await;

    let started = Instant::now();
    let destroyed = admin.destroy("deep").await.expect("the destroy answers");
    let took = started.elapsed();
    assert!(destroyed.destroyed, "{destroyed:?}");
    assert!(took < Duration::from_secs(10), "the destroy took {took:?}");
    assert!(
        !exists(&d.workspace_root().join("deep")),
        "the session's folder left the workspace root at once"
    );
    // sandboxd is up, and the other session answers.
    admin.index().await.expect("sandboxd answers");
    answers(&other, "other").await;
    match admin.get("deep").await {
        Err(ClientError::NoSuchSession(id)) => assert_eq!(id, "deep"),
        got => panic!("the destroyed session is gone, got {got:?}"),
    }

    // A clean restart, the deletion perhaps still under way: sandboxd starts and goes on.
    let status = d.terminate();
    assert!(status.success(), "sandboxd stopped cleanly: {status}");
    d.spawn();
    let (admin, other) = (d.admin(), d.client(&other_token));
    admin
        .index()
        .await
        .expect("sandboxd answers after the restart");
    answers(&other, "other").await;
    trash_emptied(&d.workspace_root()).await;
    assert!(!exists(&d.workspace_root().join("deep")));
    answers(&other, "other").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandboxd_killed_mid_deletion_finishes_after_its_restart() {
    let mut d = deep_daemon();
    let admin = d.admin();
    let deep = admin
        .open("deep-kill", "org-a", None, None)
        .await
        .expect("open");
    let other = admin
        .open("other", "org-b", None, None)
        .await
        .expect("open");
    let deep = d.client(deep.token.as_deref().expect("a token"));
    let other_token = other.token.expect("a token");
    dig(&deep, "deep-kill", "tree").await;

    admin
        .destroy("deep-kill")
        .await
        .expect("the destroy answers");
    d.process.kill9();
    let left = trash_entries(&d.workspace_root());
    assert_eq!(
        left.len(),
        1,
        "the kill came while the tree was still being deleted: {left:?}"
    );
    assert!(left[0].starts_with("deep-kill-"), "{left:?}");

    d.spawn();
    let (admin, other) = (d.admin(), d.client(&other_token));
    admin
        .index()
        .await
        .expect("sandboxd answers after the restart");
    answers(&other, "other").await;
    trash_emptied(&d.workspace_root()).await;
    assert!(!exists(&d.workspace_root().join("deep-kill")));
    match admin.get("deep-kill").await {
        Err(ClientError::NoSuchSession(id)) => assert_eq!(id, "deep-kill"),
        got => panic!("the destroyed session stays gone, got {got:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_destroy_that_cannot_finish_never_keeps_sandboxd_from_starting() {
    let mut d = Daemon::start(&[]);
    let admin = d.admin();
    admin
        .open("stuck", "org-a", None, None)
        .await
        .expect("open");
    let other = admin
        .open("other", "org-b", None, None)
        .await
        .expect("open");
    let other_token = other.token.expect("a token");
    let other = d.client(&other_token);
    // The trash cannot be made: the destroy fails after the container went, and the row
    // stays destroying.
    let trash = d.workspace_root().join(".trash");
    std::fs::write(&trash, b"not a folder").expect("a file where the trash goes");
    match admin.destroy("stuck").await {
        Err(ClientError::Api {
            status: 500,
            code,
            message,
        }) => {
            assert_eq!(code, ErrorCode::Internal);
            assert!(
                message.starts_with(&format!(
                    "could not move {} into the trash {}:",
                    d.workspace_root().join("stuck").display(),
                    trash.display()
                )),
                "{message}"
            );
        }
        got => panic!("the destroy fails and says why, got {got:?}"),
    }
    answers(&other, "other").await;

    // The start-up reconcile cannot finish it either: it reports it and starts all the same.
    d.process.kill9();
    d.spawn();
    let (admin, other) = (d.admin(), d.client(&other_token));
    admin.index().await.expect("sandboxd started");
    answers(&other, "other").await;
    assert_eq!(
        admin.get("stuck").await.expect("still there").state,
        State::Destroying
    );

    // Once the trash can be made, the next start finishes the destroy.
    std::fs::remove_file(&trash).expect("the file goes");
    d.process.kill9();
    d.spawn();
    let (admin, other) = (d.admin(), d.client(&other_token));
    match admin.get("stuck").await {
        Err(ClientError::NoSuchSession(id)) => assert_eq!(id, "stuck"),
        got => panic!("the reconcile finished the destroy, got {got:?}"),
    }
    trash_emptied(&d.workspace_root()).await;
    assert!(!exists(&d.workspace_root().join("stuck")));
    answers(&other, "other").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_files_api_remove_of_a_deep_tree_answers_at_once() {
    let d = deep_daemon();
    let admin = d.admin();
    let opened = admin
        .open("digger", "org-a", None, None)
        .await
        .expect("open");
    let digger = d.client(opened.token.as_deref().expect("a token"));
    dig(&digger, "digger", "tree").await;
    digger
        .write("digger", "keep.txt", b"kept".to_vec())
        .await
        .expect("a file beside it");

    let started = Instant::now();
    digger
        .remove("digger", "tree", true)
        .await
        .expect("the remove answers");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "the remove took {took:?}");
    let names: Vec<String> = digger
        .ls("digger", "")
        .await
        .expect("ls")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["keep.txt"]);
    assert!(!exists(&d.workspace("digger").join("tree")));
    // The session goes on, and the tree is deleted in the background.
    answers(&digger, "digger").await;
    trash_emptied(&d.workspace_root()).await;
    assert_eq!(
        digger
            .read("digger", "keep.txt", 0, None)
            .await
            .expect("read"),
        b"kept"
    );
    // A missing folder is still 404.
    match digger.remove("digger", "tree", true).await {
        Err(ClientError::Api { status, code, .. }) => {
            assert_eq!((status, code.as_str()), (404, "not_found"));
        }
        got => panic!("removing it again is not found, got {got:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fifo_raced_into_a_new_folder_is_refused_at_once() {
    let d = Daemon::start(&[]);
    let admin = d.admin();
    let opened = admin
        .open("racer", "org-a", None, None)
        .await
        .expect("open");
    let racer = d.client(opened.token.as_deref().expect("a token"));
    // Inside the sandbox, for 25 s: whenever `race/x` is a fresh empty folder, it becomes a
    // FIFO (and the FIFO goes again, so that sandboxd keeps creating the folder).
    let attack = {
        let racer = racer.clone();
        tokio::spawn(async move {
            racer
                .run(
                    "racer",
                    "mkdir -p race && perl -MPOSIX -e 'my $end = time + 25; my $n = 0; while (time < $end) { if (rmdir \"race/x\") { POSIX::mkfifo(\"race/x\", 0600) and $n++ } unlink \"race/x\" } print \"swapped $n\\n\"'",
                    Some(60),
                    None,
                    None,
                )
                .await
        })
    };
    until("the attack started", Duration::from_secs(30), || async {
        racer.ls("racer", "race").await.ok()
    })
    .await;

    let mut made = 0;
    let mut refused = 0;
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        let answer = tokio::time::timeout(Duration::from_secs(5), racer.mkdir("racer", "race/x"))
            .await
            .expect("a mkdir answers at once, never hangs on a FIFO");
        match answer {
            Ok(()) => made += 1,
            Err(ClientError::Api {
                status: 409,
                code,
                message,
            }) => {
                assert_eq!(code, ErrorCode::NotADirectory);
                assert_eq!(
                    message,
                    "'race/x' is not a directory (or a component on the way is not one)"
                );
                refused += 1;
            }
            // The sandbox removed the new folder before sandboxd opened it.
            Err(ClientError::Api {
                status: 404,
                code,
                message,
            }) => {
                assert_eq!(code, ErrorCode::NotFound);
                assert_eq!(message, "'race/x' does not exist");
                refused += 1;
            }
            Err(other) => panic!("a mkdir either makes the folder or says why not: {other:?}"),
        }
    }
    let out = attack
        .await
        .expect("the attack's task")
        .expect("the attack ran");
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    assert!(
        out.stdout.starts_with("swapped ") && out.stdout != "swapped 0\n",
        "the sandbox swapped FIFOs in: {}",
        out.stdout
    );
    assert!(made > 0, "some mkdirs made the folder ({refused} refused)");
    // sandboxd still does file work at once.
    let answer = tokio::time::timeout(Duration::from_secs(5), racer.mkdir("racer", "after/y"))
        .await
        .expect("a mkdir after the attack answers at once");
    answer.expect("and makes the folder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_open_leaves_no_folder_for_the_next_tenant() {
    let d = Daemon::start(&[]);
    let admin = d.admin();
    // Docker refuses a memory limit under 6 MB: the open fails after making its folder.
    let tiny = Limits {
        mem_limit: Some("1m".to_owned()),
        ..Limits::default()
    };
    match admin.open("shared-name", "org-a", None, Some(&tiny)).await {
        Err(ClientError::Api { status, code, .. }) => {
            assert_eq!((status, code.as_str()), (502, "docker_error"));
        }
        got => panic!("the open fails, got {got:?}"),
    }
    assert!(
        !exists(&d.workspace_root().join("shared-name")),
        "the failed open removed the folder it made"
    );
    match admin.get("shared-name").await {
        Err(ClientError::NoSuchSession(id)) => assert_eq!(id, "shared-name"),
        got => panic!("no session is left, got {got:?}"),
    }
    let opened = admin
        .open("shared-name", "org-b", None, None)
        .await
        .expect("another tenant opens the name");
    assert!(opened.created);
    let b = d.client(opened.token.as_deref().expect("a token"));
    assert!(
        b.ls("shared-name", "").await.expect("ls").is_empty(),
        "the new session starts empty"
    );

    // A folder that was there before the open (made by no open of this sandboxd) is not the
    // failed open's to remove.
    let before = d.workspace_root().join("there-before").join("workspace");
    std::fs::create_dir_all(&before).expect("a folder");
    std::fs::write(before.join("notes"), b"mine").expect("a file");
    assert!(
        admin
            .open("there-before", "org-a", None, Some(&tiny))
            .await
            .is_err()
    );
    assert_eq!(std::fs::read(before.join("notes")).expect("kept"), b"mine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_opens_and_wakes_never_see_a_half_opened_session() {
    // Twenty runs at once in one session: above the default cap of runs in flight.
    let d = Daemon::start(&[("SANDBOXD_MAX_RUNS_PER_SESSION", "64")]);
    let admin = d.admin();
    // Thirty opens of a new name: every one sees it running.
    let opens = (0..30).map(|_| {
        let admin = admin.clone();
        tokio::spawn(async move { admin.open("fresh", "org-a", None, None).await })
    });
    for r in futures::future::join_all(opens).await {
        let opened = r.expect("task").expect("open");
        assert_eq!(opened.session.state, State::Running, "{opened:?}");
    }
    let opened = admin
        .open("woken", "org-a", None, None)
        .await
        .expect("open");
    let token = opened.token.expect("a token");
    for round in 0..3 {
        // Its container goes; then twenty runs wake it at once, while twenty opens and twenty
        // starts ask for it.
        admin.reclaim("woken").await.expect("reclaim");
        let runs = (0..20).map(|_| {
            let c = d.client(&token);
            tokio::spawn(async move { c.run("woken", "echo ran", Some(60), None, None).await })
        });
        let opens = (0..20).map(|_| {
            let admin = admin.clone();
            tokio::spawn(async move { admin.open("woken", "org-a", None, None).await })
        });
        let starts = (0..20).map(|_| {
            let admin = admin.clone();
            tokio::spawn(async move { admin.start("woken").await })
        });
        let (runs, opens, starts) = futures::join!(
            futures::future::join_all(runs),
            futures::future::join_all(opens),
            futures::future::join_all(starts)
        );
        for r in runs {
            let out = r
                .expect("task")
                .unwrap_or_else(|e| panic!("round {round}: every run finds a container: {e}"));
            assert_eq!((out.exit_code, out.stdout.as_str()), (0, "ran\n"));
        }
        for r in starts {
            let woken = r
                .expect("task")
                .unwrap_or_else(|e| panic!("round {round}: every start wakes it: {e}"));
            assert_eq!(woken.state, State::Running, "round {round}");
        }
        for r in opens {
            let opened = r.expect("task").expect("open");
            assert_ne!(
                opened.session.state,
                State::Opening,
                "round {round}: an open answered with a half-opened session"
            );
        }
        let containers = d.containers();
        assert_eq!(
            containers.iter().filter(|c| c.1 == "woken").count(),
            1,
            "round {round}: one container: {containers:?}"
        );
    }
}
