//! `top`: what each session's sandbox uses now (CPU, memory and its limit, processes), as
//! `kubectl top pods` shows pods, from each session's sandboxd with the session's own token.

use futures::future::join_all;
use kube::ResourceExt;
use kube::api::ListParams;
use sandboxd_api::session::SessionUsage;
use sandboxd_crds::v1alpha1::SandboxSession;
use sandboxd_crds::v1alpha1::session::SessionPhase;

use crate::error::Error;
use crate::render;
use crate::session::{Target, phase};

/// How `top` orders its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SortBy {
    /// Most CPU first.
    Cpu,
    /// Most memory first.
    Memory,
    /// By name.
    Name,
}

/// One session's row: its name, phase, and usage when its sandbox runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The session.
    pub name: String,
    /// Its phase.
    pub phase: SessionPhase,
    /// What its sandbox uses; `None` when it does not run (or could not be asked).
    pub usage: Option<SessionUsage>,
}

/// Orders rows as `sort` says (ties and sessions without figures by name, after the rest).
pub fn sort(rows: &mut [Row], sort: SortBy) {
    let key = |r: &Row| -> f64 {
        let u = r.usage.as_ref();
        match sort {
            SortBy::Cpu => u.and_then(|u| u.cpu_percent).unwrap_or(-1.0),
            SortBy::Memory => u.and_then(|u| u.memory_bytes).map_or(-1.0, |m| m as f64),
            SortBy::Name => 0.0,
        }
    };
    rows.sort_by(|a, b| key(b).total_cmp(&key(a)).then_with(|| a.name.cmp(&b.name)));
}

/// The table `top` prints.
pub fn rows_table(rows: &[Row]) -> String {
    let dash = || "-".to_owned();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let u = r.usage.clone().unwrap_or_default();
            vec![
                r.name.clone(),
                format!("{:?}", r.phase),
                u.cpu_percent.map_or_else(dash, |c| format!("{c:.1}%")),
                u.memory_bytes.map_or_else(dash, render::bytes),
                u.memory_limit_bytes.map_or_else(dash, render::bytes),
                u.pids.map_or_else(dash, |p| p.to_string()),
            ]
        })
        .collect();
    render::table(
        &[
            "NAME",
            "PHASE",
            "CPU",
            "MEMORY",
            "MEMORY LIMIT",
            "PROCESSES",
        ],
        &cells,
    )
}

async fn row(t: &Target, s: &SandboxSession) -> Row {
    let name = s.name_any();
    let phase = phase(s);
    let usage = if phase == SessionPhase::Running {
        match t.sandbox(&name).await {
            Ok((client, id)) => match client.get(&id).await {
                Ok(view) => view.usage,
                Err(e) => {
                    eprintln!("kubectl sandbox: {name}: {e}");
                    None
                }
            },
            Err(e) => {
                eprintln!("kubectl sandbox: {name}: {e}");
                None
            }
        }
    } else {
        None
    };
    Row { name, phase, usage }
}

/// `top [NAME]`: the sessions of the namespace (or NAME), with what each uses.
pub async fn top(t: &Target, name: Option<&str>, by: SortBy) -> Result<(), Error> {
    let sessions = match name {
        Some(n) => vec![t.find(n).await?],
        None => {
            t.sessions()
                .list(&ListParams::default())
                .await
                .map_err(|e| Error::kube("listing SandboxSessions", e))?
                .items
        }
    };
    if sessions.is_empty() {
        println!(
            "No sandbox sessions in namespace {}. Open one with `kubectl sandbox open NAME --tenant ORG`.",
            t.namespace
        );
        return Ok(());
    }
    let mut rows = join_all(sessions.iter().map(|s| row(t, s))).await;
    sort(&mut rows, by);
    print!("{}", rows_table(&rows));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, cpu: Option<f64>, memory: Option<u64>) -> Row {
        Row {
            name: name.into(),
            phase: if memory.is_some() {
                SessionPhase::Running
            } else {
                SessionPhase::Sleeping
            },
            usage: memory.map(|m| SessionUsage {
                memory_bytes: Some(m),
                memory_limit_bytes: Some(512 << 20),
                cpu_percent: cpu,
                pids: Some(3),
            }),
        }
    }

    #[test]
    fn rows_sort_heaviest_first_and_print_like_top() {
        let mut rows = vec![
            row("a", Some(1.0), Some(200 << 20)),
            row("b", None, None),
            row("c", Some(50.0), Some(10 << 20)),
        ];
        sort(&mut rows, SortBy::Memory);
        assert_eq!(
            rows_table(&rows),
            "NAME  PHASE     CPU    MEMORY     MEMORY LIMIT  PROCESSES\n\
             a     Running   1.0%   200.0 MiB  512.0 MiB     3\n\
             c     Running   50.0%  10.0 MiB   512.0 MiB     3\n\
             b     Sleeping  -      -          -             -\n"
        );
        sort(&mut rows, SortBy::Cpu);
        assert_eq!(
            rows.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
            ["c", "a", "b"]
        );
        sort(&mut rows, SortBy::Name);
        assert_eq!(
            rows.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
    }
}
