//! `kubectl sandbox`, a kubectl plugin for people: open a sandbox session and wait until it
//! runs, run commands in it, open a terminal in it (and list and end its terminals), copy files
//! in and out, list and walk its workspace, read its audit
//! log (or follow its activity feed) and briefing, see what its sandbox reached on the network
//! and what was refused, reach ports of its sandbox (`port-forward`), list sessions and what
//! their sandboxes use, and check every SandboxHost.
//!
//! It talks to the API server for the `SandboxSession` and `SandboxHost` objects and the session
//! token Secret, and to the session's sandboxd with that token (sandboxd's typed client).

pub mod doctor;
pub mod egress;
pub mod error;
pub mod operators;
pub mod ports;
pub mod render;
pub mod session;
pub mod snapshot;
pub mod terminal;
pub mod top;
pub mod workspace;

use clap::{Args, Parser, Subcommand};
use kube::Client;
use sandboxd_crds::v1alpha1::session::Scope;

pub use error::Error;

/// `kubectl sandbox`: sandbox sessions on Kubernetes, for people.
#[derive(Parser, Debug)]
#[command(name = "kubectl-sandbox", bin_name = "kubectl sandbox", version)]
pub struct Cli {
    /// Namespace of the sessions (default: the kubeconfig context's).
    #[arg(short = 'n', long, global = true, env = "KUBECTL_SANDBOX_NAMESPACE")]
    pub namespace: Option<String>,

    /// Reach sandboxd at this URL instead of the session's endpoint (for example through
    /// `kubectl port-forward` from outside the cluster).
    #[arg(long, global = true, env = "KUBECTL_SANDBOX_ENDPOINT")]
    pub endpoint: Option<String>,

    /// A CA certificate (PEM) to verify sandboxd's https:// certificate with. Unset: the CA
    /// the operator put in the session's token Secret (`ca.crt`), or for `doctor` the host's
    /// spec.caSecret; with neither, the system's CA roots.
    #[arg(long, global = true, env = "SANDBOXD_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create the SandboxSession NAME (or find it) and wait until it runs.
    Open(OpenArgs),
    /// Run a command in the session's sandbox under /bin/sh in /workspace; exits with its status.
    Exec {
        /// The session.
        name: String,
        /// Seconds the command may run (the host caps it).
        #[arg(long)]
        timeout: Option<u64>,
        /// The command: one argument is a shell line, several are quoted one by one.
        #[arg(last = true, required = true, num_args = 1..)]
        command: Vec<String>,
    },
    /// A terminal in the session's sandbox, like `kubectl exec -it`; exits with its status.
    ///
    /// Opens one (a login shell, or the command after `--`) sized to this terminal and attaches
    /// to it: keys go to it (this terminal in raw mode), its output comes here, its size follows
    /// this one's. The terminal outlives the connection: `--attach TID` goes back to it, with
    /// what it printed meanwhile. With stdin piped, stdin is typed in, then an end of input.
    Shell(ShellArgs),
    /// The session's terminals; with --kill, end one.
    ///
    /// One row per terminal, running ones first: id, pid, state (running, or how it ended and
    /// its status), size, connections attached, idle time and what it runs.
    Terminals {
        /// The session.
        name: String,
        /// End this terminal: its program and everything it started.
        #[arg(long, value_name = "TID")]
        kill: Option<String>,
    },
    /// Forward local ports to ports of the session's sandbox, like `kubectl port-forward`.
    ///
    /// `8080:3000` listens on local port 8080 and carries each connection to port 3000 in the
    /// sandbox, `3000` is `3000:3000`, `:3000` listens on a free local port (printed). The
    /// sandbox's ports must be open (`kubectl sandbox ports NAME --open PORT`); a sandbox
    /// without network is reached too. Runs until interrupted.
    PortForward(PortForwardArgs),
    /// The URL of the session's MCP server and a configuration for an agent.
    ///
    /// The server (Streamable HTTP, at /v1/sessions/ID/mcp on the session's sandboxd) has the
    /// tools run, run_status, read_file, write_file, edit_file, list, tree, glob and grep on
    /// this sandbox, and its files as resources; it takes the session token as a bearer. The
    /// configuration names the token's Secret; --show-token writes the token itself into it.
    Mcp {
        /// The session.
        name: String,
        /// Put the session token itself in the configuration (it reaches this session only).
        #[arg(long)]
        show_token: bool,
    },
    /// The session's open ports, one a line; with --open and --close, open and close some first.
    ///
    /// An open port of the sandbox is reached through sandboxd (`port-forward`, or HTTP under
    /// /v1/sessions/ID/ports/PORT/); closing one refuses new connections, those made go on.
    Ports {
        /// The session.
        name: String,
        /// Open this port (repeatable).
        #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
        open: Vec<u16>,
        /// Close this port (repeatable).
        #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
        close: Vec<u16>,
        /// Print a signed preview link to this open port: a browser reaches it with no token
        /// until it expires (the session's token rotated or the session gone end it too).
        #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
        preview: Option<u16>,
        /// Seconds the preview link lasts (1 to 604800; one hour when not given).
        #[arg(long, value_name = "SECONDS", requires = "preview")]
        expires: Option<u64>,
    },
    /// Copy a file in or out: `cp ./local NAME:path` or `cp NAME:path ./local` (`-` is stdin/stdout).
    Cp {
        /// From.
        src: String,
        /// To.
        dst: String,
    },
    /// List one folder of the workspace.
    Ls {
        /// The session.
        name: String,
        /// The folder, relative to /workspace.
        #[arg(default_value = "")]
        path: String,
    },
    /// The workspace as a tree (6 levels and 2,000 entries at most, said when reached).
    Tree {
        /// The session.
        name: String,
        /// The folder, relative to /workspace.
        #[arg(default_value = "")]
        path: String,
    },
    /// The session's audit log, newest first; with --follow, its activity feed as it grows.
    Ops(OpsArgs),
    /// What each session's sandbox uses now: CPU, memory and its limit, processes (as `kubectl
    /// top pods`), heaviest first.
    Top {
        /// Only this session.
        name: Option<String>,
        /// Order by cpu, memory (the default) or name.
        #[arg(long, value_enum, default_value = "memory")]
        sort_by: top::SortBy,
    },
    /// What the session's sandbox reached on the network and what was refused, over the last
    /// minutes: one row per name, port and verdict (allowed or denied for a connection,
    /// resolved or refused for a DNS query), summed over the window, with connections, bytes
    /// out and in, the last minute seen and the last refusal's reason. Only sandboxes of an
    /// allowlist egress policy go through the host's egress proxy and resolver.
    Egress {
        /// The session.
        name: String,
        /// How many minutes back, 1 to 1440.
        #[arg(long, default_value_t = 60)]
        minutes: u32,
        /// One row per minute instead of sums over the window.
        #[arg(long)]
        by_minute: bool,
    },
    /// The paragraph for an agent's instructions: what the session's runtime holds.
    Briefing {
        /// The session.
        name: String,
    },
    /// Rebuild the session: its container recreated from its Runtime's current image with its
    /// spec.resources, the workspace kept (runs in flight are stopped); waits until it runs.
    Rebuild {
        /// The session.
        name: String,
        /// Seconds to wait until it runs again.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
    /// Snapshot the session's workspace into the object store (a SandboxSnapshot; the
    /// sandbox paused for the moment of the copy) and wait until it is Ready. NAME defaults to
    /// SESSION-<date>-<time>; the name is printed.
    Snapshot {
        /// The session.
        session: String,
        /// The snapshot's name.
        name: Option<String>,
        /// Seconds to wait until it is Ready.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Fork a session: snapshot SESSION (the snapshot is named NEW) and open the new
    /// SandboxSession NEW from it with SESSION's spec, on any host; wait until it runs. The
    /// two then go their own ways.
    Fork {
        /// The session to fork.
        session: String,
        /// The new session.
        new: String,
        /// Seconds to wait for the snapshot, then for the new session to run.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Open a Lost session again from a snapshot (its newest Ready one, or --snapshot), on
    /// another host than the one that lost it; what was written after the snapshot is gone.
    /// Waits until it runs.
    Restore {
        /// The Lost session.
        session: String,
        /// The SandboxSnapshot to open it from; default: its newest Ready one.
        #[arg(long)]
        snapshot: Option<String>,
        /// Seconds to wait until it runs.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Pause the session with its processes and memory (a runtime of isolation gvisor): it
    /// sleeps as a checkpoint of its sandbox, and `resume` (or any run) goes on where it was.
    /// Refused with the reason otherwise (a runc runtime sleeps without its memory).
    Pause {
        /// The session.
        name: String,
    },
    /// Wake a paused (or sleeping) session and say whether it kept its memory.
    Resume {
        /// The session.
        name: String,
    },
    /// Sessions with phase, host, runtime and when they sleep.
    List {
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Only sessions with these labels (`k=v,k2=v2`).
        #[arg(short = 'l', long)]
        selector: Option<String>,
    },
    /// Check every SandboxHost: reachable, version, missing routes; exits 1 when any is unhealthy.
    Doctor {
        /// Only hosts with these labels (`k=v,k2=v2`).
        #[arg(short = 'l', long)]
        selector: Option<String>,
        /// The sandboxd image named when a host must be upgraded.
        #[arg(long, default_value = "sandboxd")]
        image: String,
        /// Seconds to wait for each host.
        #[arg(long, default_value_t = 5)]
        timeout: u64,
    },
}

/// `open`'s arguments.
#[derive(Args, Debug)]
pub struct OpenArgs {
    /// The session's name (its key).
    pub name: String,
    /// The organization id the session belongs to.
    #[arg(long)]
    pub tenant: String,
    /// Who shares it: run, conversation, channel, user or agent.
    #[arg(long, value_parser = parse_scope, default_value = "conversation")]
    pub scope: Scope,
    /// The Runtime alias; empty is the default Runtime.
    #[arg(long, default_value = "")]
    pub runtime: String,
    /// What the scope is about (the conversation id, …); defaults to NAME.
    #[arg(long)]
    pub subject: Option<String>,
    /// Labels of a new session (`k=v`, repeatable).
    #[arg(short = 'l', long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Seconds to wait until it runs (a runtime build may take minutes).
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
}

/// `shell`'s arguments.
#[derive(Args, Debug)]
pub struct ShellArgs {
    /// The session.
    pub name: String,
    /// Attach to this running terminal (from `kubectl sandbox terminals`) instead of opening one.
    #[arg(long, value_name = "TID", conflicts_with = "command")]
    pub attach: Option<String>,
    /// Rows of the terminal (1 to 1000); set, the size no longer follows this terminal's.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub rows: Option<u16>,
    /// Columns of the terminal (1 to 1000); set, the size no longer follows this terminal's.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub cols: Option<u16>,
    /// The command instead of a login shell: one argument is a shell line, several are quoted
    /// one by one.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// `port-forward`'s arguments.
#[derive(Args, Debug)]
pub struct PortForwardArgs {
    /// The session.
    pub name: String,
    /// What to forward, one or more: `LOCAL:REMOTE`, `REMOTE` (the same port here) or `:REMOTE`
    /// (a free local port).
    #[arg(required = true, num_args = 1.., value_name = "[LOCAL:]REMOTE", value_parser = ports::parse_mapping)]
    pub mappings: Vec<ports::Mapping>,
    /// The local IP address to listen on (`localhost` is 127.0.0.1).
    #[arg(long, default_value = "127.0.0.1", value_parser = ports::parse_address)]
    pub address: std::net::IpAddr,
}

/// `ops`' arguments.
#[derive(Args, Debug)]
pub struct OpsArgs {
    /// The session.
    pub name: String,
    /// Only this kind: read, write, ls, mkdir, remove, execute or rebuild.
    #[arg(long)]
    pub op: Option<String>,
    /// Only failed operations.
    #[arg(long)]
    pub failed: bool,
    /// Only this agent.
    #[arg(long)]
    pub agent: Option<String>,
    /// Only this run.
    #[arg(long)]
    pub run: Option<String>,
    /// Only targets (paths, commands) containing this text.
    #[arg(long)]
    pub grep: Option<String>,
    /// Rows at most.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// The page after this cursor (printed under a full page).
    #[arg(long)]
    pub cursor: Option<String>,
    /// Follow the session's activity feed: the last `--limit` entries, oldest first, then each
    /// new one as it comes (every second), until interrupted.
    #[arg(short = 'f', long, conflicts_with_all = ["op", "failed", "agent", "run", "grep", "cursor"])]
    pub follow: bool,
}

fn parse_scope(s: &str) -> Result<Scope, String> {
    Scope::ALL
        .into_iter()
        .find(|x| x.as_str() == s)
        .ok_or_else(|| {
            format!("'{s}' is not a scope: use run, conversation, channel, user or agent")
        })
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("'{s}' is not key=value"))
}

async fn kube_client() -> Result<Client, Error> {
    Client::try_default()
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))
}

/// Runs one command line; `Ok(status)` is the process's exit status.
pub async fn run(cli: Cli) -> Result<u8, Error> {
    let client = kube_client().await?;
    let ns = cli
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let target = session::Target {
        client: client.clone(),
        namespace: ns,
        endpoint: cli.endpoint.clone(),
        ca_file: cli.ca_file.clone(),
    };
    match cli.command {
        Command::Open(args) => session::open(&target, &args).await.map(|()| 0),
        Command::Exec {
            name,
            timeout,
            command,
        } => workspace::exec(&target, &name, &command, timeout).await,
        Command::Shell(args) => terminal::shell(&target, &args).await,
        Command::Terminals { name, kill } => match kill {
            Some(tid) => terminal::kill(&target, &name, &tid).await.map(|()| 0),
            None => terminal::list(&target, &name).await.map(|()| 0),
        },
        Command::PortForward(args) => ports::forward(&target, &args).await,
        Command::Mcp { name, show_token } => {
            ports::mcp(&target, &name, show_token).await.map(|()| 0)
        }
        Command::Ports {
            name,
            open,
            close,
            preview: Some(port),
            expires,
        } if open.is_empty() && close.is_empty() => ports::preview(&target, &name, port, expires)
            .await
            .map(|()| 0),
        Command::Ports {
            preview: Some(_), ..
        } => Err(Error::Usage(
            "--preview is given alone: open the port first (`--open PORT`), then ask for its link"
                .to_owned(),
        )),
        Command::Ports {
            name, open, close, ..
        } => ports::ports(&target, &name, &open, &close)
            .await
            .map(|()| 0),
        Command::Cp { src, dst } => workspace::cp(&target, &src, &dst).await.map(|()| 0),
        Command::Ls { name, path } => workspace::ls(&target, &name, &path).await.map(|()| 0),
        Command::Tree { name, path } => workspace::tree(&target, &name, &path).await.map(|()| 0),
        Command::Ops(args) if args.follow => workspace::follow(&target, &args).await.map(|()| 0),
        Command::Ops(args) => workspace::ops(&target, &args).await.map(|()| 0),
        Command::Top { name, sort_by } => top::top(&target, name.as_deref(), sort_by)
            .await
            .map(|()| 0),
        Command::Egress {
            name,
            minutes,
            by_minute,
        } => egress::egress(&target, &name, minutes, by_minute)
            .await
            .map(|()| 0),
        Command::Briefing { name } => session::briefing(&target, &name).await.map(|()| 0),
        Command::Rebuild { name, timeout } => {
            session::rebuild(&target, &name, std::time::Duration::from_secs(timeout))
                .await
                .map(|()| 0)
        }
        Command::Snapshot {
            session,
            name,
            timeout,
        } => snapshot::snapshot(
            &target,
            &session,
            name.as_deref(),
            std::time::Duration::from_secs(timeout),
        )
        .await
        .map(|()| 0),
        Command::Fork {
            session,
            new,
            timeout,
        } => snapshot::fork(
            &target,
            &session,
            &new,
            std::time::Duration::from_secs(timeout),
        )
        .await
        .map(|()| 0),
        Command::Restore {
            session,
            snapshot,
            timeout,
        } => snapshot::restore(
            &target,
            &session,
            snapshot.as_deref(),
            std::time::Duration::from_secs(timeout),
        )
        .await
        .map(|()| 0),
        Command::Pause { name } => session::pause(&target, &name).await.map(|()| 0),
        Command::Resume { name } => session::resume(&target, &name).await.map(|()| 0),
        Command::List {
            all_namespaces,
            selector,
        } => session::list(&target, all_namespaces, selector.as_deref())
            .await
            .map(|()| 0),
        Command::Doctor {
            selector,
            image,
            timeout,
        } => doctor::doctor(
            &client,
            selector.as_deref(),
            &image,
            timeout,
            cli.ca_file.as_deref(),
        )
        .await
        .map(|()| 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn exec_takes_everything_after_the_double_dash() {
        let cli = Cli::parse_from(["kubectl-sandbox", "exec", "s1", "--", "ls", "-la", "/"]);
        match cli.command {
            Command::Exec { name, command, .. } => {
                assert_eq!(name, "s1");
                assert_eq!(command, ["ls", "-la", "/"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn shell_opens_with_a_command_or_attaches_without_one() {
        let cli = Cli::parse_from([
            "kubectl-sandbox",
            "shell",
            "s1",
            "--rows",
            "30",
            "--",
            "echo $((6*7)); exit 7",
        ]);
        match cli.command {
            Command::Shell(a) => {
                assert_eq!(a.name, "s1");
                assert_eq!((a.rows, a.cols, a.attach), (Some(30), None, None));
                assert_eq!(a.command, ["echo $((6*7)); exit 7"]);
            }
            other => panic!("{other:?}"),
        }
        let cli = Cli::parse_from(["kubectl-sandbox", "shell", "s1", "--attach", "term-1"]);
        match cli.command {
            Command::Shell(a) => {
                assert_eq!(a.attach.as_deref(), Some("term-1"));
                assert!(a.command.is_empty());
            }
            other => panic!("{other:?}"),
        }
        for refused in [
            &["shell", "s1", "--attach", "term-1", "--", "ls"][..],
            &["shell", "s1", "--rows", "0"][..],
            &["shell", "s1", "--cols", "1001"][..],
        ] {
            let args = std::iter::once("kubectl-sandbox").chain(refused.iter().copied());
            assert!(Cli::try_parse_from(args).is_err(), "{refused:?}");
        }
        let cli = Cli::parse_from(["kubectl-sandbox", "terminals", "s1", "--kill", "term-2"]);
        match cli.command {
            Command::Terminals { name, kill } => {
                assert_eq!((name.as_str(), kill.as_deref()), ("s1", Some("term-2")));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn port_forward_takes_mappings_and_ports_opens_and_closes() {
        let cli = Cli::parse_from([
            "kubectl-sandbox",
            "port-forward",
            "s1",
            "8080:3000",
            ":4000",
        ]);
        match cli.command {
            Command::PortForward(a) => {
                assert_eq!(a.name, "s1");
                assert_eq!(
                    a.mappings,
                    [
                        ports::Mapping {
                            local: 8080,
                            remote: 3000
                        },
                        ports::Mapping {
                            local: 0,
                            remote: 4000
                        }
                    ]
                );
                assert_eq!(a.address.to_string(), "127.0.0.1");
            }
            other => panic!("{other:?}"),
        }
        let cli = Cli::parse_from([
            "kubectl-sandbox",
            "ports",
            "s1",
            "--open",
            "3000",
            "--open",
            "3001",
            "--close",
            "4000",
        ]);
        match cli.command {
            Command::Ports {
                name,
                open,
                close,
                preview,
                expires,
            } => {
                assert_eq!(
                    (name.as_str(), open, close, preview, expires),
                    ("s1", vec![3000, 3001], vec![4000], None, None)
                );
            }
            other => panic!("{other:?}"),
        }
        for refused in [
            &["port-forward", "s1"][..],
            &["port-forward", "s1", "8080:http"][..],
            &["port-forward", "s1", "3000", "--address", "somewhere"][..],
            &["ports", "s1", "--open", "0"][..],
            &["ports", "s1", "--expires", "60"][..],
        ] {
            let args = std::iter::once("kubectl-sandbox").chain(refused.iter().copied());
            assert!(Cli::try_parse_from(args).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn a_wrong_scope_says_which_are_valid() {
        let err = Cli::try_parse_from([
            "kubectl-sandbox",
            "open",
            "s",
            "--tenant",
            "t",
            "--scope",
            "team",
        ])
        .expect_err("refused")
        .to_string();
        assert!(
            err.contains("'team' is not a scope: use run, conversation, channel, user or agent"),
            "{err}"
        );
    }
}
