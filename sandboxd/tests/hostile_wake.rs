//! No run loses its output: twenty runs that wake a reclaimed session at once each answer
//! their command's own output, round after round.
//!
//! The sandbox gets a twentieth of a core, so the agent's threads wait their turn as they do
//! on a busy node, and the window of the race this guards against is wide: the agent used to
//! report a run 100 ms after its program exited whether or not the thread that reads its
//! output had read what the program wrote, and a run then answered exit 0 with empty stdout.
//! Its supervisor now reads what is left in the pipes itself before it reports the run.

mod common;

use common::Daemon;
use sandboxd_api::Limits;

/// Runs that wake the session at once.
const RUNS: usize = 20;
/// Times the session is reclaimed and woken by them.
const ROUNDS: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runs_that_wake_a_reclaimed_session_at_once_never_lose_their_output() {
    let d = Daemon::start(&[("SANDBOXD_MAX_RUNS_PER_SESSION", "64")]);
    let admin = d.admin();
    let starved = Limits {
        cpus: Some(0.05),
        ..Limits::default()
    };
    let opened = admin
        .open("woken", "org-a", None, Some(&starved))
        .await
        .expect("open");
    let token = opened.token.expect("a token");
    let mut lost = Vec::new();
    for round in 0..ROUNDS {
        admin.reclaim("woken").await.expect("reclaim");
        let runs = (0..RUNS).map(|i| {
            let c = d.client(&token);
            tokio::spawn(async move {
                let out = c
                    .run("woken", &format!("echo ran-{i}"), Some(120), None, None)
                    .await;
                (i, out)
            })
        });
        for joined in futures::future::join_all(runs).await {
            let (i, out) = joined.expect("the run's task");
            let out = out.unwrap_or_else(|e| panic!("round {round}, run {i}: {e}"));
            if (out.exit_code, out.stdout.as_str()) != (0, format!("ran-{i}\n").as_str()) {
                lost.push(format!(
                    "round {round}, run {i}: exit {} stdout {:?} stderr {:?}",
                    out.exit_code, out.stdout, out.stderr
                ));
            }
        }
    }
    assert!(
        lost.is_empty(),
        "{} of {} runs lost their output:\n{}",
        lost.len(),
        RUNS * ROUNDS,
        lost.join("\n")
    );
}
