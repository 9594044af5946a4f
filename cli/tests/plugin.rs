//! `kubectl sandbox` end to end: the real binary against the real API server from `make up`,
//! a real sandboxd on the project's dockerd and the real operator (scoped by a label, so it
//! touches only this test's objects). Asserts what a person sees: output and exit status.

mod common;

use common::{TestScope, ok, plugin, plugin_command, strip_and_delete, text};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use sandboxd_tests::host::{Host, free_port};
use sandboxd_tests::{base_image, within};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_opens_a_sandbox_runs_copies_lists_audits_and_checks_the_hosts() {
    let test = TestScope::new("plugin", "plugin").await;
    let (ns, scope, selector) = (test.ns.clone(), test.scope.clone(), test.selector.clone());
    let host_name = format!("plugin-host-{scope}");

    // One sandboxd, registered as a SandboxHost with its admin token, and the operator.
    let dir = tempfile::Builder::new()
        .prefix("sandboxd-plugin-test-")
        .tempdir()
        .expect("temp dir");
    let sandboxd_host = Host::start(&host_name, &[]);
    let endpoint = sandboxd_host.endpoint();
    // Its node is its name: the node its sandboxd takes the token of.
    test.register_host(&sandboxd_host).await;
    test.create_base_runtime().await;
    let operator = test.operator();

    // open: created, progress in words, then running with the next commands.
    let (out, err) = test.open("s1");
    assert!(
        err.contains(&format!(
            "created SandboxSession s1 in namespace {ns} (tenant org-1, scope conversation)"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "sandbox s1 is running on host {host_name} (runtime base-{scope})"
        )),
        "{err}"
    );
    assert!(
        out.contains(&format!(
            "next: kubectl sandbox exec s1 -n {ns} -- <command>"
        )),
        "{out}"
    );
    // Again: found, not created; another tenant is refused with the reason.
    let (_, err) = ok(&ns, &["open", "s1", "--tenant", "org-1"]);
    assert!(
        err.contains(&format!(
            "found SandboxSession s1 in namespace {ns} (Running)"
        )),
        "{err}"
    );
    let other = plugin(&ns, &["open", "s1", "--tenant", "org-2"]);
    assert_eq!(other.status.code(), Some(1));
    assert_eq!(
        text(&other).1,
        "kubectl sandbox: SandboxSession s1 belongs to tenant org-1, not org-2: a session never moves to another tenant; open another name\n"
    );

    // egress: a sandbox without network has reached nothing; a session that is not there, or
    // a window sandboxd does not keep, is told in words.
    let (out, _) = ok(&ns, &["egress", "s1", "--minutes", "5"]);
    assert_eq!(
        out,
        "No egress in the last 5 minutes (only sandboxes of an allowlist policy go through the egress proxy and resolver).\n"
    );
    let missing = plugin(&ns, &["egress", "nope"]);
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(
        text(&missing).1,
        format!(
            "kubectl sandbox: no SandboxSession nope in namespace {ns}: open it with `kubectl sandbox open nope --tenant <organization id> -n {ns}`\n"
        )
    );
    let wide = plugin(&ns, &["egress", "s1", "--minutes", "2000"]);
    assert_eq!(
        text(&wide).1,
        "kubectl sandbox: --minutes 2000: use 1 to 1440\n"
    );

    // exec: output streamed to the right stream, the command's status is the exit status.
    let run = plugin(
        &ns,
        &["exec", "s1", "--", "echo hello; echo oops >&2; exit 3"],
    );
    assert_eq!(run.status.code(), Some(3));
    assert_eq!(text(&run), ("hello\n".to_owned(), "oops\n".to_owned()));
    let (out, _) = ok(&ns, &["exec", "s1", "--", "id", "-u"]);
    assert_eq!(out, "10001\n");
    let (out, _) = ok(
        &ns,
        &["exec", "s1", "--", "printf", "%s|", "two words", "it's"],
    );
    assert_eq!(out, "two words|it's|");

    // cp in and out, byte for byte.
    let local = dir.path().join("report.txt");
    let payload = "line one\nline two ✓\n";
    std::fs::write(&local, payload).expect("write local");
    let local_str = local.to_str().expect("utf-8 path");
    let (_, err) = ok(&ns, &["cp", local_str, "s1:notes/report.txt"]);
    assert_eq!(err, "copied 22 B to s1:notes/report.txt\n");
    let back = dir.path().join("back.txt");
    ok(
        &ns,
        &["cp", "s1:notes/report.txt", back.to_str().expect("utf-8")],
    );
    assert_eq!(
        std::fs::read_to_string(&back).expect("copied back"),
        payload
    );
    let (out, _) = ok(&ns, &["cp", "s1:notes/report.txt", "-"]);
    assert_eq!(out, payload);
    let (out, _) = ok(&ns, &["exec", "s1", "--", "cat notes/report.txt"]);
    assert_eq!(out, payload);

    // ls and tree.
    let (out, _) = ok(&ns, &["ls", "s1", "notes"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("MODE") && lines[0].ends_with("NAME"),
        "{out}"
    );
    assert!(
        lines[1].contains("22 B") && lines[1].ends_with("report.txt"),
        "{out}"
    );
    let (out, _) = ok(&ns, &["tree", "s1"]);
    assert!(
        out.starts_with("/workspace\n  notes/\n    report.txt\n"),
        "{out}"
    );
    assert!(out.contains("1 folders, 1 files\n"), "{out}");

    // ops: newest first, with filters.
    let (out, _) = ok(&ns, &["ops", "s1", "--op", "execute"]);
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert!(rows[0].ends_with("cat notes/report.txt"), "{out}");
    assert!(rows.iter().any(|r| r.contains("exit 3")), "{out}");
    let (out, _) = ok(&ns, &["ops", "s1", "--failed"]);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(
        out.contains("exit 3") && out.contains("echo hello; echo oops >&2; exit 3"),
        "{out}"
    );
    let (out, _) = ok(&ns, &["ops", "s1", "--op", "write"]);
    assert!(out.contains("notes/report.txt"), "{out}");

    // ops --follow: the feed so far, then each new entry as it comes.
    let mut follow = plugin_command(&ns, &["ops", "s1", "--follow", "--limit", "3"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl-sandbox runs");
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let stdout = follow.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let next_line = || {
        lines
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("a line of ops --follow within 30 s")
    };
    // The last three so far: the run, the ls and the tree (a listing of the workspace root).
    let (first, second, third) = (next_line(), next_line(), next_line());
    assert!(
        first.contains("  run     exit 0  ") && first.ends_with("cat notes/report.txt"),
        "{first}"
    );
    assert!(
        second.contains("  ls      ok  ") && second.ends_with("notes"),
        "{second}"
    );
    assert!(third.contains("  ls      ok  "), "{third}");
    let exited = plugin(&ns, &["exec", "s1", "--", "echo followed; exit 5"]);
    assert_eq!(exited.status.code(), Some(5));
    let followed = next_line();
    assert!(
        followed.contains("  run     exit 5") && followed.ends_with("echo followed; exit 5"),
        "{followed}"
    );
    let _ = follow.kill();
    let _ = follow.wait();

    // top: both sessions of the namespace, what each uses.
    test.open("s2");
    ok(&ns, &["exec", "s2", "--", "true"]);
    let (out, _) = ok(&ns, &["top"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "NAME",
            "PHASE",
            "CPU",
            "MEMORY",
            "MEMORY",
            "LIMIT",
            "PROCESSES"
        ],
        "{out}"
    );
    let mut names: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap_or_default())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["s1", "s2"], "{out}");
    for row in &lines[1..] {
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[1], "Running", "{out}");
        assert!(cells[2].ends_with('%'), "{out}");
        assert!(["KiB", "MiB", "GiB"].contains(&cells[4]), "{out}");
        assert!(cells[7].parse::<u32>().is_ok_and(|p| p >= 1), "{out}");
    }
    let (out, _) = ok(&ns, &["top", "s2", "--sort-by", "cpu"]);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(
        out.lines().nth(1).is_some_and(|l| l.starts_with("s2 ")),
        "{out}"
    );

    // pause and resume: a gvisor session sleeps with its processes and memory and says so in
    // its status; a runc one is refused with the reason.
    let secure_alias = format!("secure-{scope}");
    test.create_runtime(
        &secure_alias,
        json!({"description": "the base image on gVisor", "image": base_image(), "isolation": "gvisor"}),
    )
    .await;
    ok(
        &ns,
        &[
            "open",
            "g1",
            "--tenant",
            "org-1",
            "--label",
            &selector,
            "--runtime",
            &secure_alias,
            "--timeout",
            "120",
        ],
    );
    ok(
        &ns,
        &[
            "exec",
            "g1",
            "--",
            "echo kept > /tmp/mem; (nohup sleep 100000 >/dev/null 2>&1 &)",
        ],
    );
    let (out, _) = ok(&ns, &["pause", "g1"]);
    assert_eq!(out, "session g1 paused: asleep with its memory\n");
    let sessions = test.sessions();
    let memory_kept = |reason: &'static str| {
        let sessions = sessions.clone();
        async move {
            sandboxd_tests::until(
                &format!("g1's MemoryKept is {reason}"),
                std::time::Duration::from_secs(60),
                async || {
                    let s = sessions.get("g1").await.map_err(|e| e.to_string())?;
                    let status = s.status.unwrap_or_default();
                    let found = status
                        .conditions
                        .iter()
                        .find(|c| c.type_ == "MemoryKept")
                        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
                    match &found {
                        Some(c) if c.1 == reason => Ok((status.phase, found)),
                        _ => Err(format!("{found:?}")),
                    }
                },
            )
            .await
        }
    };
    let (phase, condition) = memory_kept("Checkpointed").await;
    assert_eq!(
        condition,
        Some((
            "True".to_owned(),
            "Checkpointed".to_owned(),
            "asleep with its memory".to_owned()
        ))
    );
    assert_eq!(
        phase,
        Some(sandboxd_crds::v1alpha1::session::SessionPhase::Sleeping)
    );
    let (out, _) = ok(&ns, &["resume", "g1"]);
    assert_eq!(out, "session g1 resumed: awake with its memory\n");
    let (out, _) = ok(
        &ns,
        &[
            "exec",
            "g1",
            "--",
            "cat /tmp/mem; for p in /proc/[0-9]*; do [ \"$(tr -d '\\0' < $p/cmdline 2>/dev/null)\" = sleep100000 ] && echo sleeper; done; true",
        ],
    );
    assert_eq!(
        out, "kept\nsleeper\n",
        "the memory and the process are back"
    );
    memory_kept("Restored").await;
    let refused = plugin(&ns, &["pause", "s1"]);
    assert_eq!(refused.status.code(), Some(1));
    let err = text(&refused).1;
    assert!(
        err.starts_with("kubectl sandbox: pause_refused (409): session '")
            && err.contains(&format!(
                "runs on runtime 'base-{scope}', whose isolation is not gvisor: only a gVisor sandbox is paused with its memory (stop sleeps it without)"
            )),
        "{err}"
    );

    // rebuild: a new container from the runtime's image, the workspace kept.
    let (_, err) = ok(&ns, &["rebuild", "s1", "--timeout", "120"]);
    assert!(err.contains("rebuild 1 of s1 asked"), "{err}");
    assert!(
        err.contains(&format!(
            "rebuilt: running on image {}, the workspace kept",
            base_image()
        )),
        "{err}"
    );
    let (out, _) = ok(&ns, &["exec", "s1", "--", "cat notes/report.txt"]);
    assert_eq!(out, payload);

    // snapshot and fork: a SandboxSnapshot in the object store, a new session from one.
    let (out, err) = ok(&ns, &["snapshot", "s1", "before-fork", "--timeout", "120"]);
    assert_eq!(out, "before-fork\n");
    assert!(
        err.contains(&format!(
            "snapshot before-fork is ready: taken on host {host_name}: "
        )),
        "{err}"
    );
    let (_, err) = ok(&ns, &["fork", "s1", "s1-fork", "--timeout", "120"]);
    assert!(
        err.contains("created SandboxSession s1-fork from snapshot s1-fork of s1")
            && err.contains("fork s1-fork of s1 is running on host"),
        "{err}"
    );
    let (out, _) = ok(&ns, &["exec", "s1-fork", "--", "cat notes/report.txt"]);
    assert_eq!(out, payload, "the fork has the files");
    ok(
        &ns,
        &["exec", "s1-fork", "--", "echo forked > notes/report.txt"],
    );
    let (out, _) = ok(&ns, &["exec", "s1", "--", "cat notes/report.txt"]);
    assert_eq!(out, payload, "the two go their own ways");
    let taken = plugin(&ns, &["fork", "s1", "s1-fork"]);
    assert_eq!(taken.status.code(), Some(1));
    assert!(
        text(&taken).1.contains(&format!(
            "SandboxSession s1-fork exists already in namespace {ns}: a fork opens a new session"
        )),
        "{}",
        text(&taken).1
    );
    let failed = plugin(&ns, &["snapshot", "nope"]);
    assert_eq!(failed.status.code(), Some(1));
    let refused = plugin(&ns, &["restore", "s1"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused).1.contains(
            "SandboxSession s1 is Running, not Lost: restore opens a Lost session again from a snapshot (kubectl sandbox fork s1 NEW copies one that is not)"
        ),
        "{}",
        text(&refused).1
    );

    // briefing and list.
    let (out, _) = ok(&ns, &["briefing", "s1"]);
    assert!(out.contains("/bin/sh"), "{out}");
    let (out, _) = ok(&ns, &["list"]);
    let row = out
        .lines()
        .find(|l| l.starts_with("s1 "))
        .unwrap_or_else(|| panic!("no s1 in {out}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        &cells[..5],
        [
            "s1",
            "Running",
            "org-1",
            &host_name,
            &format!("base-{scope}")
        ]
    );
    assert!(cells[5] == "in", "sleeps-at is relative: {row}");

    // Errors say what to do next.
    let missing = plugin(&ns, &["exec", "nope", "--", "true"]);
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(
        text(&missing).1,
        format!(
            "kubectl sandbox: no SandboxSession nope in namespace {ns}: open it with `kubectl sandbox open nope --tenant <organization id> -n {ns}`\n"
        )
    );

    // doctor: healthy, then an unreachable host makes it fail, naming what to check.
    let (out, _) = ok(&ns, &["doctor", "-l", &selector]);
    assert!(
        out.starts_with(&format!(
            "ok   {host_name} {endpoint}: sandboxd {}, every route served",
            env!("CARGO_PKG_VERSION")
        )),
        "{out}"
    );
    assert!(out.ends_with("1 SandboxHosts healthy\n"), "{out}");
    let dead = format!("http://127.0.0.1:{}", free_port());
    let dead_name = format!("plugin-dead-{scope}");
    test.create_host(&dead_name, &dead, &dead_name, None).await;
    let sick = plugin(&ns, &["doctor", "-l", &selector]);
    let (out, err) = text(&sick);
    assert_eq!(sick.status.code(), Some(1), "{out}{err}");
    assert!(
        out.contains(&format!(
            "FAIL plugin-dead-{scope} {dead}: unreachable: sandboxd at {dead} could not be reached"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "next: check that its sandboxd runs and that this machine reaches {dead}"
        )),
        "{out}"
    );
    assert_eq!(
        err,
        "kubectl sandbox: 1 of 2 SandboxHosts are unhealthy (see above)\n"
    );

    // Clean up: the operator is stopped first, so drop finalizers.
    drop(operator);
    drop(sandboxd_host);
    let base = test.base_runtime();
    test.clean_up(
        &[&host_name, &dead_name],
        &[&base, &secure_alias],
        &["s1", "s2", "g1"],
    )
    .await;
}

/// Over https: the plugin trusts the CA the operator put in the session's token Secret
/// (nothing to pass), refuses a sandboxd its --ca-file did not sign with the reason and what to
/// do, and `doctor` checks the host with its spec.caSecret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_https_the_plugin_trusts_the_ca_of_the_token_secret_and_refuses_another() {
    let test = TestScope::new("plugin-tls", "plugin-tls").await;
    let (ns, scope, selector) = (test.ns.clone(), test.scope.clone(), test.selector.clone());
    let host_name = format!("plugin-tls-host-{scope}");
    let dir = tempfile::Builder::new()
        .prefix("sandboxd-plugin-tls-")
        .tempdir()
        .expect("temp dir");
    let ca = sandboxd_tests::pki::Ca::new("plugin test CA");
    let leaf = ca.leaf(&["127.0.0.1"], dir.path(), "tls");
    let other = sandboxd_tests::pki::Ca::new("another CA");
    let other_file = dir.path().join("other-ca.crt");
    std::fs::write(&other_file, &other.pem).expect("write the other CA");

    let sandboxd_host = Host::start(
        &host_name,
        &[
            ("SANDBOXD_TLS_CERT_FILE", leaf.cert.to_str().expect("utf-8")),
            ("SANDBOXD_TLS_KEY_FILE", leaf.key.to_str().expect("utf-8")),
        ],
    );
    let endpoint = sandboxd_host.endpoint();
    assert!(endpoint.starts_with("https://"), "{endpoint}");
    test.create_admin_secret(&sandboxd_host).await;
    test.create_secret("host-ca", "ca.crt", &ca.pem).await;
    test.create_host(&host_name, &endpoint, &sandboxd_host.node, Some("host-ca"))
        .await;
    test.create_base_runtime().await;
    let operator = test.operator();

    test.open("s1");
    // No flag: the CA comes from the session's token Secret.
    let (out, _) = ok(&ns, &["exec", "s1", "--", "echo", "over-https"]);
    assert_eq!(out, "over-https\n");
    // Another CA: refused, saying why and what to pass.
    let refused = plugin(
        &ns,
        &[
            "--ca-file",
            other_file.to_str().expect("utf-8"),
            "exec",
            "s1",
            "--",
            "true",
        ],
    );
    assert_eq!(refused.status.code(), Some(1));
    let (_, err) = text(&refused);
    assert!(
        err.contains(&format!(
            "sandboxd at {endpoint} could not be reached: its TLS certificate is not trusted (invalid peer certificate: UnknownIssuer); this client trusts only the CA it was given. Pass the CA that signed sandboxd's certificate with --ca-file (SANDBOXD_CA_FILE)"
        )),
        "{err}"
    );
    // doctor: the host's spec.caSecret.
    let (out, _) = ok(&ns, &["doctor", "-l", &selector]);
    assert!(
        out.contains(&format!("ok   {host_name} {endpoint}: ")),
        "{out}"
    );

    drop(operator);
    drop(sandboxd_host);
    let base = test.base_runtime();
    test.clean_up(&[&host_name], &[&base], &["s1"]).await;
}

/// A session no running operator selects: within seconds `open` names the operators'
/// selectors and the command that works (instead of waiting out its timeout), and removes the
/// session it made; that command's session is then picked up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_names_the_operators_selectors_when_none_picks_the_session_up() {
    let test = TestScope::new("plugin-unhandled", "plugin").await;
    let (ns, selector) = (test.ns.clone(), test.selector.clone());
    let operator = test.operator();
    // The operator leads: its Lease carries its selector.
    let leases = Api::<Lease>::namespaced(test.client.clone(), &ns);
    within(
        std::time::Duration::from_secs(60),
        kube::runtime::wait::await_condition(leases, "sandbox-operator", |l: Option<&_>| {
            l.and_then(|l| sandboxd_crds::lease::running(l, k8s_openapi::jiff::Timestamp::now()))
                .is_some_and(|p| p.selector == selector)
        }),
    )
    .await
    .expect("the Lease is watched");

    // Without the operator's label: named within seconds, not after --timeout.
    let started = std::time::Instant::now();
    let o = plugin(
        &ns,
        &["open", "lone", "--tenant", "org-1", "--timeout", "120"],
    );
    let took = started.elapsed();
    let (_, err) = text(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        took < std::time::Duration::from_secs(30),
        "took {took:?}: {err}"
    );
    assert!(
        err.contains(&format!(
            "kubectl sandbox: no operator has picked up SandboxSession lone in namespace {ns} within 5 s: the running operators handle only sessions their selectors match, `{selector}` (Lease {ns}/sandbox-operator)"
        )),
        "{err}"
    );
    assert!(
        err.ends_with(&format!(
            ", and it matches none. It was removed again; open it with the labels of {ns}/sandbox-operator: `kubectl sandbox open lone --tenant org-1 -n {ns} -l {selector}`\n"
        )),
        "{err}"
    );
    let sessions = test.sessions();
    assert!(
        sessions.get_opt("lone").await.expect("get").is_none(),
        "the session open made is removed again"
    );

    // The named command: the operator reports on it (no host runs here, so it waits).
    let o = plugin(
        &ns,
        &[
            "open",
            "lone",
            "--tenant",
            "org-1",
            "-l",
            &selector,
            "--timeout",
            "10",
        ],
    );
    let (_, err) = text(&o);
    assert!(!err.contains("no operator has picked up"), "{err}");
    assert!(
        err.contains(
            "kubectl sandbox: session lone was not Running after 10 s (last: waiting for a host…"
        ),
        "{err}"
    );

    drop(operator);
    strip_and_delete(&sessions, "lone").await;
    test.delete_namespace().await;
}
