//! Docker restarts under sandboxd. While Docker does not answer, `/healthz` says so (503, in
//! words naming the socket) and runs fail with words instead of hanging; once Docker is back,
//! sandboxd serves again without a restart of its own: `/healthz` is 200, the session whose
//! container the restart stopped runs again (its container started anew), and a new session
//! opens.
//!
//! The test runs a dockerd of its own (its own socket, data root, exec root, pid file and
//! containerd namespaces, a bridge of its own and no iptables rules), which it stops and
//! starts: the project's dockerd, which other tests share, is never touched. (Not `--bridge
//! none`: a dockerd started so removes the node's `docker0`, the shared dockerd's bridge.)

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Daemon, hack_path};

/// A dockerd of the test's own.
struct OwnDockerd {
    dir: tempfile::TempDir,
    exec_root: PathBuf,
    namespace: String,
    /// Its default bridge, made by the test.
    bridge: String,
    child: Option<Child>,
}

impl OwnDockerd {
    fn start() -> Self {
        let tag = format!("{:08x}", rand::random::<u32>());
        let mut d = Self {
            dir: tempfile::Builder::new()
                .prefix("sandboxd-dockerd-")
                .tempdir()
                .expect("a temp dir"),
            // Docker's exec root holds Unix sockets: a short path.
            exec_root: PathBuf::from(format!("/run/sbxt-{tag}")),
            namespace: format!("sbxt-{tag}"),
            bridge: format!("sbxt{tag}"),
            child: None,
        };
        for args in [
            vec!["link", "add", d.bridge.as_str(), "type", "bridge"],
            vec!["addr", "add", "203.0.113.254/24", "dev", d.bridge.as_str()],
            vec!["link", "set", d.bridge.as_str(), "up"],
        ] {
            let out = Command::new("ip").args(&args).output().expect("ip runs");
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        d.launch();
        d
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("docker.sock")
    }

    /// Its DOCKER_HOST.
    fn host(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    /// The docker CLI against it.
    fn docker(&self, args: &[&str]) -> std::process::Output {
        Command::new("docker")
            .env("DOCKER_HOST", self.host())
            .args(args)
            .output()
            .expect("docker runs")
    }

    /// Starts it and waits until it answers.
    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("dockerd.log"))
            .expect("a log file");
        let child = Command::new("dockerd")
            .arg("--host")
            .arg(self.host())
            .arg("--data-root")
            .arg(self.dir.path().join("data"))
            .arg("--exec-root")
            .arg(&self.exec_root)
            .arg("--pidfile")
            .arg(self.dir.path().join("dockerd.pid"))
            .args([
                "--bridge",
                &self.bridge,
                "--iptables=false",
                "--ip6tables=false",
            ])
            // The project's dockerd's settings (`make up`): its OCI runtimes, gVisor's among
            // them, so the suite's gVisor run (SANDBOXD_TEST_OCI_RUNTIME) runs here too.
            .arg("--config-file")
            .arg(common::repo().join(".dev").join("dockerd.json"))
            .args(["--containerd-namespace", &self.namespace])
            .args([
                "--containerd-plugins-namespace",
                &format!("{}-plugins", self.namespace),
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log"))
            .stderr(log)
            .spawn()
            .expect("dockerd starts (the test needs Debian's docker.io and root)");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !self.docker(&["version"]).status.success() {
            assert!(
                std::time::Instant::now() < deadline,
                "the test's dockerd did not answer within 60 s: {}",
                std::fs::read_to_string(self.dir.path().join("dockerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops it as a restart does (SIGTERM: its containers stop with it) and waits until it
    /// is gone.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            common::process::signal(child.id(), "TERM").expect("SIGTERM to dockerd");
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                if child.try_wait().expect("dockerd's status").is_some() {
                    break;
                }
                if std::time::Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

impl Drop for OwnDockerd {
    fn drop(&mut self) {
        if self.child.is_some() {
            let ids = self.docker(&["ps", "-aq"]);
            for id in String::from_utf8_lossy(&ids.stdout).split_whitespace() {
                let _ = self.docker(&["rm", "-f", id]);
            }
        }
        self.stop();
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
        let _ = std::fs::remove_dir_all(&self.exec_root);
        // Anything its storage left mounted goes before the folder.
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for mount in info.lines().filter_map(|l| l.split(' ').nth(4)) {
            if mount.starts_with(&self.dir.path().display().to_string()) {
                let _ = Command::new("umount").args(["-l", mount]).output();
            }
        }
    }
}

/// `GET /healthz`: the status and the body.
async fn health(d: &Daemon) -> (u16, serde_json::Value) {
    common::raw(
        reqwest::Method::GET,
        &format!("{}/healthz", d.base),
        None,
        None,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_restart_is_reported_by_healthz_and_survived_without_a_restart() {
    let mut dockerd = OwnDockerd::start();
    // The busybox image (made by `make up`), copied from the project's dockerd into this one.
    let image = hack_path("busybox-image.sh");
    let copied = Command::new("sh")
        .args([
            "-c",
            &format!(
                "docker save '{image}' | DOCKER_HOST='{}' docker load",
                dockerd.host()
            ),
        ])
        .output()
        .expect("sh runs");
    assert!(
        copied.status.success(),
        "docker save | docker load: {}",
        String::from_utf8_lossy(&copied.stderr)
    );
    let host = dockerd.host();
    let runtimes = format!("base={image}");
    let d = Daemon::start(&[
        ("DOCKER_HOST", host.as_str()),
        ("SANDBOXD_RUNTIMES", runtimes.as_str()),
    ]);
    let admin = d.admin();
    let opened = admin
        .open("before", "org-a", None, None)
        .await
        .expect("open");
    let c = d.client(opened.token.as_deref().expect("a token"));
    let ran = c
        .run("before", "echo before", Some(30), None, None)
        .await
        .expect("run");
    assert_eq!((ran.exit_code, ran.stdout.as_str()), (0, "before\n"));
    let (status, body) = health(&d).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("ok")),
        "{body}"
    );

    // Docker goes away: /healthz says so, naming the socket, within a few seconds.
    dockerd.stop();
    let body = common::until(
        "/healthz answering 503 while Docker is down",
        Duration::from_secs(10),
        async || {
            let (status, body) = health(&d).await;
            (status == 503).then_some(body)
        },
    )
    .await;
    assert_eq!(body["status"], "unavailable", "{body}");
    let problem = body["problems"][0].as_str().expect("a problem");
    assert!(
        problem.starts_with(&format!("cannot reach Docker at {host} (")),
        "{problem}"
    );
    assert!(
        problem.ends_with("); sessions cannot be opened, woken or run until it answers again"),
        "{problem}"
    );
    assert_eq!(body["sessions"], 1, "the counts are still there: {body}");
    // A run meanwhile fails, in words, instead of hanging.
    let refused = tokio::time::timeout(
        Duration::from_secs(30),
        c.run("before", "echo during", Some(30), None, None),
    )
    .await
    .expect("the run answers while Docker is down");
    assert!(refused.is_err(), "{refused:?}");

    // Docker is back: sandboxd serves again with no restart of its own.
    dockerd.launch();
    common::until(
        "/healthz answering 200 once Docker is back",
        Duration::from_secs(15),
        async || {
            let (status, body) = health(&d).await;
            (status == 200).then_some(()).ok_or(body)
        },
    )
    .await;
    // The session's container stopped with Docker: its next run starts it again.
    let ran = c
        .run("before", "echo after", Some(30), None, None)
        .await
        .expect("a run after the restart");
    assert_eq!((ran.exit_code, ran.stdout.as_str()), (0, "after\n"));
    let opened = admin
        .open("after", "org-a", None, None)
        .await
        .expect("an open after the restart");
    let ran = d
        .client(opened.token.as_deref().expect("a token"))
        .run("after", "echo new", Some(30), None, None)
        .await
        .expect("a run in a new session");
    assert_eq!(ran.stdout, "new\n");
    drop(d);
}
