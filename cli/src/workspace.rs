//! A session's sandbox through its sandboxd, with the session's own token: exec (streamed),
//! cp in and out, ls, tree, the audit log and the activity feed.

use std::io::{Read as _, Write as _};
use std::path::Path;

use sandboxd_api::audit::{Op, OperationQuery};
use sandboxd_api::files::{Entry, EntryKind};

use crate::error::Error;
use crate::render;
use crate::session::Target;

/// Bytes read per request when copying out (below sandboxd's 8 MiB read cap).
const CHUNK: u64 = 4 * 1024 * 1024;

/// `exec`: runs the command, streaming its output; returns its exit status (0–255).
pub async fn exec(
    t: &Target,
    name: &str,
    command: &[String],
    timeout: Option<u64>,
) -> Result<u8, Error> {
    let (client, id) = t.sandbox(name).await?;
    let line = render::shell_command(command);
    let outcome = client
        .run_streaming(&id, &line, timeout, |event| match event {
            sandboxd_api::run::RunEvent::Stdout { data } => {
                let mut out = std::io::stdout();
                let _ = out.write_all(data.as_bytes());
                let _ = out.flush();
            }
            sandboxd_api::run::RunEvent::Stderr { data } => {
                let mut err = std::io::stderr();
                let _ = err.write_all(data.as_bytes());
                let _ = err.flush();
            }
        })
        .await?;
    if outcome.timed_out {
        eprintln!(
            "kubectl sandbox: the command ran out of time after {} ms (exit {}); give it longer with --timeout (the host caps it)",
            outcome.duration_ms, outcome.exit_code
        );
    }
    if outcome.truncated {
        eprintln!(
            "kubectl sandbox: the output was cut at the host's cap; write it to a file and copy that out with `kubectl sandbox cp`"
        );
    }
    Ok(u8::try_from(outcome.exit_code.clamp(0, 255)).unwrap_or(255))
}

/// Splits `NAME:path` (a session path) from a local path. A local path that contains a `/`
/// before its first `:` is local (`./a:b`).
fn remote(spec: &str) -> Option<(&str, &str)> {
    let (name, path) = spec.split_once(':')?;
    if name.is_empty() || name.contains('/') {
        return None;
    }
    Some((name, path))
}

fn base_name(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

/// `cp`: a file into the workspace or out of it.
pub async fn cp(t: &Target, src: &str, dst: &str) -> Result<(), Error> {
    match (remote(src), remote(dst)) {
        (None, Some((name, path))) => {
            let data = if src == "-" {
                let mut buf = Vec::new();
                std::io::stdin()
                    .read_to_end(&mut buf)
                    .map_err(|source| Error::Local {
                        path: "stdin".into(),
                        source,
                    })?;
                buf
            } else {
                std::fs::read(src).map_err(|source| Error::Local {
                    path: src.to_owned(),
                    source,
                })?
            };
            let target = if path.is_empty() || path.ends_with('/') {
                if src == "-" {
                    return Err(Error::Usage(
                        "copying stdin needs a file name: `cp - NAME:path/file`".into(),
                    ));
                }
                format!("{path}{}", base_name(src))
            } else {
                path.to_owned()
            };
            let (client, id) = t.sandbox(name).await?;
            let size = client.write(&id, &target, data).await?;
            eprintln!("copied {} to {name}:{target}", render::bytes(size));
            Ok(())
        }
        (Some((name, path)), None) => {
            if path.is_empty() || path.ends_with('/') {
                return Err(Error::Usage(format!(
                    "{src} is a folder: cp copies one file; list it with `kubectl sandbox ls {name} {path}`"
                )));
            }
            let (client, id) = t.sandbox(name).await?;
            let mut data = Vec::new();
            loop {
                let chunk = client
                    .read(&id, path, data.len() as u64, Some(CHUNK))
                    .await?;
                let done = (chunk.len() as u64) < CHUNK;
                data.extend_from_slice(&chunk);
                if done {
                    break;
                }
            }
            if dst == "-" {
                let mut out = std::io::stdout();
                out.write_all(&data)
                    .and_then(|()| out.flush())
                    .map_err(|source| Error::Local {
                        path: "stdout".into(),
                        source,
                    })?;
                return Ok(());
            }
            let local = if Path::new(dst).is_dir() {
                Path::new(dst).join(base_name(path))
            } else {
                Path::new(dst).to_path_buf()
            };
            std::fs::write(&local, &data).map_err(|source| Error::Local {
                path: local.display().to_string(),
                source,
            })?;
            eprintln!(
                "copied {} from {name}:{path} to {}",
                render::bytes(data.len() as u64),
                local.display()
            );
            Ok(())
        }
        (Some(_), Some(_)) => Err(Error::Usage(
            "both sides name a session: copy between sessions through a local file".into(),
        )),
        (None, None) => Err(Error::Usage(format!(
            "neither {src} nor {dst} names a session: write one side as NAME:path"
        ))),
    }
}

fn kind_mark(e: &Entry) -> &'static str {
    match e.kind {
        EntryKind::Dir => "/",
        EntryKind::Symlink => "@",
        EntryKind::File | EntryKind::Other => "",
    }
}

/// `ls`: one folder.
pub async fn ls(t: &Target, name: &str, path: &str) -> Result<(), Error> {
    let (client, id) = t.sandbox(name).await?;
    let listing = client.listing(&id, path).await?;
    let rows: Vec<Vec<String>> = listing
        .entries
        .iter()
        .map(|e| {
            vec![
                format!("{:04o}", e.mode),
                if e.kind == EntryKind::Dir {
                    "-".into()
                } else {
                    render::bytes(e.size)
                },
                e.modified
                    .map(|m| m.format("%Y-%m-%d %H:%M").to_string())
                    .unwrap_or_default(),
                format!("{}{}", e.name, kind_mark(e)),
            ]
        })
        .collect();
    if rows.is_empty() {
        println!("(empty)");
    } else {
        print!(
            "{}",
            render::table(&["MODE", "SIZE", "MODIFIED", "NAME"], &rows)
        );
    }
    if listing.truncated {
        println!(
            "incomplete: the folder holds more than {} entries; the first ones it yields are listed",
            rows.len()
        );
    }
    Ok(())
}

/// `tree`: the folder as an indented tree, with the limits said when reached.
pub async fn tree(t: &Target, name: &str, path: &str) -> Result<(), Error> {
    let (client, id) = t.sandbox(name).await?;
    let tree = client.tree(&id, path).await?;
    print!("{}", render_tree(&tree));
    Ok(())
}

/// The tree depth first, children under their folder, two spaces per level.
pub fn render_tree(tree: &sandboxd_api::files::Tree) -> String {
    let root_depth = tree.root.split('/').filter(|p| !p.is_empty()).count();
    let mut entries: Vec<&Entry> = tree.entries.iter().collect();
    entries.sort_by(|a, b| a.path.split('/').cmp(b.path.split('/')));
    let mut out = format!(
        "/workspace{}{}\n",
        if tree.root.is_empty() { "" } else { "/" },
        tree.root
    );
    for e in &entries {
        let depth = e.path.split('/').count().saturating_sub(root_depth);
        out.push_str(&"  ".repeat(depth));
        out.push_str(&e.name);
        out.push_str(kind_mark(e));
        out.push('\n');
    }
    let files = entries.iter().filter(|e| e.kind != EntryKind::Dir).count();
    out.push_str(&format!(
        "{} folders, {files} files\n",
        entries.len() - files
    ));
    if tree.depth_limit_reached {
        out.push_str(&format!(
            "incomplete: deeper than {} levels not listed; run tree on a subfolder\n",
            tree.max_depth
        ));
    }
    if tree.entry_limit_reached {
        out.push_str(&format!(
            "incomplete: more than {} entries; run tree on a subfolder\n",
            tree.max_entries
        ));
    }
    if !tree.skipped.is_empty() {
        out.push_str(&format!(
            "incomplete: unreadable folders skipped: {}\n",
            tree.skipped.join(", ")
        ));
    }
    out
}

/// `ops`: the session's audit rows, newest first.
pub async fn ops(t: &Target, args: &crate::OpsArgs) -> Result<(), Error> {
    let op = match &args.op {
        None => None,
        Some(s) => Some(Op::parse(s).ok_or_else(|| {
            Error::Usage(format!(
                "--op {s}: use read, write, ls, mkdir, remove, execute or rebuild"
            ))
        })?),
    };
    let (client, id) = t.sandbox(&args.name).await?;
    let query = OperationQuery {
        session: Some(id),
        agent: args.agent.clone(),
        run: args.run.clone(),
        op,
        failed: args.failed,
        q: args.grep.clone(),
        cursor: args.cursor.clone(),
        limit: Some(args.limit),
        ..OperationQuery::default()
    };
    let page = client.operations(&query).await?;
    if page.operations.is_empty() {
        println!("No operations match.");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = page
        .operations
        .iter()
        .map(|o| {
            let result = if o.ok {
                "ok".to_owned()
            } else {
                o.error.clone().unwrap_or_else(|| match o.exit_code {
                    Some(c) => format!("exit {c}"),
                    None => "failed".into(),
                })
            };
            vec![
                o.at.clone(),
                o.op.as_str().to_owned(),
                result,
                format!("{}ms", o.duration_ms),
                o.agent.clone().unwrap_or_else(|| "-".into()),
                o.target.replace('\n', "⏎"),
            ]
        })
        .collect();
    print!(
        "{}",
        render::table(&["AT", "OP", "RESULT", "TOOK", "AGENT", "TARGET"], &rows)
    );
    if let Some(c) = page.next_cursor {
        println!("older rows: kubectl sandbox ops {} --cursor {c}", args.name);
    }
    Ok(())
}

/// How often `ops --follow` asks for new entries.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// One line of the activity feed: when, what, how it went, how long, on what.
pub fn event_line(e: &sandboxd_api::audit::SessionEvent) -> String {
    let at = k8s_openapi::jiff::Timestamp::from_millisecond((e.at * 1000.0) as i64)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("{:.3}", e.at));
    let result = match (e.ok, e.detail.as_str()) {
        (true, "") => "ok".to_owned(),
        (_, "") => "failed".to_owned(),
        (_, d) => d.to_owned(),
    };
    format!(
        "{at}  {:<6}  {:<10}  {:>7}  {}",
        e.op,
        result,
        format!("{}ms", e.duration_ms.round() as i64),
        e.target.replace('\n', "⏎")
    )
}

/// `ops --follow`: the last `--limit` entries of the session's activity feed, then each new one
/// as it comes, until interrupted (or the session goes).
pub async fn follow(t: &Target, args: &crate::OpsArgs) -> Result<(), Error> {
    let (client, id) = t.sandbox(&args.name).await?;
    let first = client.events(&id, 0).await?;
    let skip = first.events.len().saturating_sub(args.limit as usize);
    let mut out = std::io::stdout();
    for e in &first.events[skip..] {
        let _ = writeln!(out, "{}", event_line(e));
    }
    let _ = out.flush();
    let mut after = first.latest_seq;
    loop {
        tokio::time::sleep(FOLLOW_EVERY).await;
        let next = client.events(&id, after).await?;
        for e in &next.events {
            let _ = writeln!(out, "{}", event_line(e));
        }
        let _ = out.flush();
        after = after.max(next.latest_seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feed_lines_say_what_happened() {
        let e = |op: &str, ok, detail: &str| sandboxd_api::audit::SessionEvent {
            seq: 1,
            at: 1_800_000_000.5,
            op: op.into(),
            target: "ls\n-la".into(),
            ok,
            detail: detail.into(),
            duration_ms: 12.4,
        };
        assert_eq!(
            event_line(&e("run", false, "exit 2")),
            "2027-01-15T08:00:00.5Z  run     exit 2         12ms  ls⏎-la"
        );
        assert_eq!(
            event_line(&e("write", true, "")),
            "2027-01-15T08:00:00.5Z  write   ok             12ms  ls⏎-la"
        );
    }

    fn entry(path: &str, kind: EntryKind) -> Entry {
        Entry {
            name: base_name(path).to_owned(),
            path: path.to_owned(),
            kind,
            size: 0,
            modified: None,
            mode: 0o644,
        }
    }

    #[test]
    fn remote_specs() {
        assert_eq!(remote("s1:notes/a.txt"), Some(("s1", "notes/a.txt")));
        assert_eq!(remote("s1:"), Some(("s1", "")));
        assert_eq!(remote("./a:b"), None);
        assert_eq!(remote("file.txt"), None);
    }

    #[test]
    fn trees_render_depth_first() {
        let tree = sandboxd_api::files::Tree {
            root: String::new(),
            entries: vec![
                entry("a", EntryKind::Dir),
                entry("a-b", EntryKind::File),
                entry("z.txt", EntryKind::File),
                entry("a/inner.txt", EntryKind::File),
            ],
            depth_limit_reached: false,
            entry_limit_reached: true,
            max_depth: 6,
            max_entries: 2000,
            incomplete: true,
            skipped: vec![],
        };
        assert_eq!(
            render_tree(&tree),
            "/workspace\n  a/\n    inner.txt\n  a-b\n  z.txt\n1 folders, 3 files\nincomplete: more than 2000 entries; run tree on a subfolder\n"
        );
    }
}
