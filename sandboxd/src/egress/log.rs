//! The egress log: every verdict of the proxy and the resolver, added up per session, name,
//! port, verdict and minute in memory and written every [`FLUSH_EVERY`] into the audit store's
//! `egress` table (adding to the row of the same minute), so 500 refused connections in a loop
//! are one row. A session gets at most [`MAX_KEYS_PER_MINUTE`] rows a minute; what comes after
//! in that minute is added to one row named [`OTHER`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandboxd_api::egress::EgressRecord;
use sqlx::{AssertSqlSafe, Row};
use tracing::warn;

use super::Principal;
use crate::storage::audit::{AuditError, AuditStore};

/// How often what was added up is written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(2);
/// Rows one session gets in one minute at most.
pub const MAX_KEYS_PER_MINUTE: usize = 64;
/// The name of the row that takes the rest of a minute's verdicts.
pub const OTHER: &str = "(other names)";
/// Keys waiting to be written at most; past it verdicts are only counted in the metrics.
const MAX_PENDING: usize = 100_000;

/// A verdict as the log names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// A connection went through.
    Allowed,
    /// A connection was closed.
    Denied,
    /// A DNS query was answered.
    Resolved,
    /// A DNS query was refused.
    Refused,
}

impl Verdict {
    /// The name in the table.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Resolved => "resolved",
            Self::Refused => "refused",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    session: String,
    minute_ms: i64,
    name: String,
    port: u16,
    verdict: Verdict,
}

#[derive(Debug, Clone, Default)]
struct Tally {
    runtime: String,
    count: u64,
    bytes_out: u64,
    bytes_in: u64,
    reason: String,
}

#[derive(Debug, Default)]
struct Pending {
    tallies: HashMap<Key, Tally>,
    /// Distinct keys per session and minute (for [`MAX_KEYS_PER_MINUTE`]), this minute's.
    seen: HashMap<(String, i64), usize>,
}

/// The log: verdicts added up in memory, and the store they go to.
#[derive(Clone)]
pub struct EgressLog {
    pending: Arc<Mutex<Pending>>,
    store: Option<AuditStore>,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl EgressLog {
    /// A log writing into `store` (none: kept nowhere but the metrics).
    pub fn new(store: Option<AuditStore>) -> Self {
        Self {
            pending: Arc::default(),
            store,
        }
    }

    /// Adds one verdict (with the bytes a connection carried, and why it was refused).
    pub fn record_with(
        &self,
        who: &Principal,
        name: &str,
        port: u16,
        verdict: Verdict,
        bytes: (u64, u64),
        reason: &str,
    ) {
        let minute_ms = now_ms() / 60_000 * 60_000;
        let mut p = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut key = Key {
            session: who.session.clone(),
            minute_ms,
            name: crate::storage::audit::bounded(name, 253),
            port,
            verdict,
        };
        if !p.tallies.contains_key(&key) {
            if p.tallies.len() >= MAX_PENDING {
                return;
            }
            let seen = p.seen.entry((key.session.clone(), minute_ms)).or_default();
            if *seen >= MAX_KEYS_PER_MINUTE {
                key.name = OTHER.to_owned();
                key.port = 0;
            } else {
                *seen += 1;
            }
        }
        let t = p.tallies.entry(key).or_default();
        t.runtime.clone_from(&who.runtime);
        t.count += 1;
        t.bytes_out += bytes.0;
        t.bytes_in += bytes.1;
        if !reason.is_empty() {
            t.reason = reason.to_owned();
        }
    }

    /// Adds one verdict without bytes or reason.
    pub fn record(
        &self,
        who: &Principal,
        name: &str,
        port: u16,
        verdict: Verdict,
        out: u64,
        inn: u64,
    ) {
        self.record_with(who, name, port, verdict, (out, inn), "");
    }

    /// Writes what was added up since the last flush.
    pub async fn flush(&self) {
        let tallies = {
            let mut p = self
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let minute = now_ms() / 60_000 * 60_000;
            // The per-minute counts of past minutes are done with.
            p.seen.retain(|(_, m), _| *m >= minute);
            std::mem::take(&mut p.tallies)
        };
        let Some(store) = &self.store else {
            return;
        };
        if tallies.is_empty() {
            return;
        }
        if let Err(e) = write(store, &tallies).await {
            warn!(error = %e, rows = tallies.len(), "cannot write the egress log");
        }
    }

    /// Flushes every [`FLUSH_EVERY`] until the task is dropped.
    pub fn spawn_flusher(&self) -> tokio::task::JoinHandle<()> {
        let log = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(FLUSH_EVERY).await;
                log.flush().await;
            }
        })
    }

    /// A session's rows of the last `minutes` minutes, oldest first (flushed first).
    pub async fn rows(&self, session: &str, minutes: u32) -> Result<Vec<EgressRecord>, AuditError> {
        self.flush().await;
        let Some(store) = &self.store else {
            return Ok(Vec::new());
        };
        let since = now_ms() / 60_000 * 60_000 - i64::from(minutes) * 60_000;
        let ph = |n: usize| {
            if store.is_postgres() {
                format!("${n}")
            } else {
                format!("?{n}")
            }
        };
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT minute_ms, runtime, name, port, verdict, count, bytes_out, bytes_in, reason FROM egress WHERE session = {} AND minute_ms >= {} ORDER BY minute_ms, name, port, verdict LIMIT 10000",
            ph(1),
            ph(2)
        )))
        .bind(session)
        .bind(since)
        .fetch_all(store.pool())
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let minute: i64 = r.try_get("minute_ms")?;
            out.push(EgressRecord {
                minute: chrono::DateTime::from_timestamp_millis(minute)
                    .unwrap_or_default()
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                runtime: r.try_get("runtime")?,
                name: r.try_get("name")?,
                port: u16::try_from(r.try_get::<i64, _>("port")?).unwrap_or(0),
                verdict: r.try_get("verdict")?,
                count: u64::try_from(r.try_get::<i64, _>("count")?).unwrap_or(0),
                bytes_out: u64::try_from(r.try_get::<i64, _>("bytes_out")?).unwrap_or(0),
                bytes_in: u64::try_from(r.try_get::<i64, _>("bytes_in")?).unwrap_or(0),
                reason: r.try_get("reason")?,
            });
        }
        Ok(out)
    }
}

/// Adds `tallies` to their rows in one transaction.
async fn write(store: &AuditStore, tallies: &HashMap<Key, Tally>) -> Result<(), AuditError> {
    let ph = |n: usize| {
        if store.is_postgres() {
            format!("${n}")
        } else {
            format!("?{n}")
        }
    };
    let sql = format!(
        "INSERT INTO egress (minute_ms, session, runtime, name, port, verdict, count, bytes_out, bytes_in, reason) VALUES ({}) \
         ON CONFLICT (session, minute_ms, name, port, verdict) DO UPDATE SET count = egress.count + excluded.count, \
         bytes_out = egress.bytes_out + excluded.bytes_out, bytes_in = egress.bytes_in + excluded.bytes_in, \
         runtime = excluded.runtime, reason = CASE WHEN excluded.reason = '' THEN egress.reason ELSE excluded.reason END",
        (1..=10).map(ph).collect::<Vec<_>>().join(", ")
    );
    let mut tx = store.pool().begin().await?;
    for (k, t) in tallies {
        sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(k.minute_ms)
            .bind(&k.session)
            .bind(&t.runtime)
            .bind(&k.name)
            .bind(i64::from(k.port))
            .bind(k.verdict.as_str())
            .bind(i64::try_from(t.count).unwrap_or(i64::MAX))
            .bind(i64::try_from(t.bytes_out).unwrap_or(i64::MAX))
            .bind(i64::try_from(t.bytes_in).unwrap_or(i64::MAX))
            .bind(&t.reason)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who() -> Principal {
        Principal {
            session: "s".into(),
            runtime: "rt".into(),
            extra: vec![],
        }
    }

    #[test]
    fn a_loop_is_one_row_and_a_minute_holds_a_bounded_number_of_names() {
        let log = EgressLog::new(None);
        for _ in 0..500 {
            log.record_with(
                &who(),
                "denied.test",
                443,
                Verdict::Denied,
                (0, 0),
                "not allowed",
            );
        }
        for i in 0..200 {
            log.record(&who(), &format!("n{i}.test"), 443, Verdict::Denied, 0, 0);
        }
        let p = log.pending.lock().expect("not poisoned");
        let loop_row = p
            .tallies
            .iter()
            .find(|(k, _)| k.name == "denied.test")
            .map(|(_, t)| t.count);
        assert_eq!(loop_row, Some(500));
        assert_eq!(
            p.tallies.len(),
            MAX_KEYS_PER_MINUTE + 1,
            "the rest in one row"
        );
        let other = p
            .tallies
            .iter()
            .find(|(k, _)| k.name == OTHER)
            .map(|(_, t)| t.count);
        assert_eq!(other, Some(200 - (MAX_KEYS_PER_MINUTE as u64 - 1)));
    }
}
