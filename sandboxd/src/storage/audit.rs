//! The audit log: every read, write, ls, mkdir, remove and execute that reaches a session is a
//! row — time, session and its incarnation, tenant, agent and run (from the request's
//! `X-Sandbox-Agent` and `X-Sandbox-Run` headers, marked as the caller's), operation, target (the
//! path, or the command cut to [`MAX_TARGET_CHARS`]), ok, the numeric exit status of a failed
//! command, bytes of a read, duration, and whether a field was cut at its cap. Never a payload
//! and never output.
//!
//! A row belongs to one incarnation of its session (made anew each time the id is opened from
//! nothing) and is numbered within it (`seq`, from 1): the activity feed of a session
//! ([`AuditStore::events`]) is its incarnation's rows in that order, and a session token never
//! sees another incarnation's rows.
//!
//! Stored through sqlx: SQLite in the state folder by default (`audit.db`), PostgreSQL when
//! `SANDBOXD_AUDIT_DATABASE_URL` is a `postgres://` URL; one migration set per backend
//! (`migrations/audit/{sqlite,postgres}`), the same queries. Rows are written off the request
//! path: [`Audit::record`] hands the row to a writer task over a channel, which writes what has
//! queued up in one transaction; [`Audit::flush`] waits for everything recorded before it (a
//! query flushes first, and so does a clean shutdown, so no row is lost).
//!
//! Over 600 lines with its tests: one writer, two backends (SQLite, PostgreSQL), one query set.

use std::time::Duration;

pub use sandboxd_api::audit::{
    DEFAULT_PAGE, EVENT_TARGET_CHARS, EVENTS_PAGE, MAX_PAGE, Op, Operation, OperationPage,
    OperationQuery, SessionEvent, SessionEvents, StreamQuery,
};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, AssertSqlSafe, Row};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

/// The longest target (a command) kept, in characters; the rest is cut and marked with `…`.
pub const MAX_TARGET_CHARS: usize = 1000;
/// The longest agent or run id kept, in characters.
pub const MAX_ID_CHARS: usize = 200;
/// The longest error kept, in characters.
pub const MAX_ERROR_CHARS: usize = 200;
/// The default retention, days (`OPERATION_RETENTION_DAYS`).
pub const RETENTION_DAYS: u32 = 30;
/// How often the retention sweep runs.
pub const SWEEP_EVERY: Duration = Duration::from_secs(24 * 60 * 60);
/// The PostgreSQL advisory lock the writers of every sandboxd sharing a store take for each
/// transaction (an arbitrary number of this project's own).
const WRITER_LOCK: i64 = 0x5eed_a0d1;
/// Rows the writer puts in one transaction at most.
const BATCH: usize = 500;
/// Rows waiting to be written at most, by default (`SANDBOXD_AUDIT_QUEUE`).
pub const DEFAULT_QUEUE: usize = 10_000;
/// The least time between two warnings of dropped rows.
const DROP_WARN_EVERY: Duration = Duration::from_secs(10);

/// A row to write.
#[derive(Debug, Clone, PartialEq)]
pub struct NewOperation {
    /// Unix milliseconds.
    pub at_ms: i64,
    /// The session.
    pub session: String,
    /// Its incarnation (see the module's documentation).
    pub incarnation: String,
    /// Its tenant.
    pub tenant: String,
    /// The agent, from `X-Sandbox-Agent`.
    pub agent: Option<String>,
    /// The run, from `X-Sandbox-Run`.
    pub run: Option<String>,
    /// What was done.
    pub op: Op,
    /// The path, or the command.
    pub target: String,
    /// Whether it succeeded (a command: exit status 0).
    pub ok: bool,
    /// A command's exit status (when it ran).
    pub exit_code: Option<i64>,
    /// Our own error code when it failed before or around the operation (never a message a
    /// shell printed: that is output).
    pub error: Option<String>,
    /// Bytes of a read or write.
    pub bytes: Option<i64>,
    /// How long it took.
    pub duration_ms: i64,
}

impl NewOperation {
    /// The row with every field within its cap: the target at [`MAX_TARGET_CHARS`], agent and
    /// run at [`MAX_ID_CHARS`], the error at [`MAX_ERROR_CHARS`]; whether any was cut.
    fn capped(mut self) -> (Self, bool) {
        let mut cut = false;
        let mut cap = |text: &mut String, max: usize| {
            if text.chars().nth(max).is_some() {
                *text = bounded(text, max);
                cut = true;
            }
        };
        cap(&mut self.target, MAX_TARGET_CHARS);
        for field in [&mut self.agent, &mut self.run] {
            if let Some(v) = field.as_mut() {
                cap(v, MAX_ID_CHARS);
            }
        }
        if let Some(e) = self.error.as_mut() {
            cap(e, MAX_ERROR_CHARS);
        }
        (self, cut)
    }
}

/// What the audit store can fail with.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The database failed.
    #[error("the audit store failed: {0}")]
    Db(#[from] sqlx::Error),
    /// The migrations failed.
    #[error("the audit store's migrations failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A query was malformed.
    #[error("{0}")]
    BadQuery(String),
}

/// Cuts `text` to `max` characters, marking a cut with `…`.
pub fn bounded(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((i, _)) => format!("{}…", &text[..i]),
    }
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The database of the audit log.
#[derive(Clone, Debug)]
pub struct AuditStore {
    pool: AnyPool,
    postgres: bool,
}

enum Bind {
    Text(String),
    Int(i64),
}

impl AuditStore {
    /// Opens the store: PostgreSQL at `url` when given, else SQLite `audit.db` in `state_dir`;
    /// runs the migrations.
    pub async fn open(url: Option<&str>, state_dir: &std::path::Path) -> Result<Self, AuditError> {
        sqlx::any::install_default_drivers();
        match url.filter(|u| !u.is_empty()) {
            Some(url) => {
                let pool = AnyPoolOptions::new()
                    .max_connections(8)
                    .connect(url)
                    .await?;
                sqlx::migrate!("./migrations/audit/postgres")
                    .run(&pool)
                    .await?;
                Ok(Self {
                    pool,
                    postgres: true,
                })
            }
            None => {
                std::fs::create_dir_all(state_dir).map_err(sqlx::Error::Io)?;
                let url = format!("sqlite://{}?mode=rwc", state_dir.join("audit.db").display());
                let pool = AnyPoolOptions::new()
                    .max_connections(4)
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            sqlx::query("PRAGMA busy_timeout = 10000")
                                .execute(&mut *conn)
                                .await?;
                            Ok(())
                        })
                    })
                    .connect(&url)
                    .await?;
                sqlx::query("PRAGMA journal_mode = WAL")
                    .execute(&pool)
                    .await?;
                sqlx::migrate!("./migrations/audit/sqlite")
                    .run(&pool)
                    .await?;
                Ok(Self {
                    pool,
                    postgres: false,
                })
            }
        }
    }

    /// Whether this store is PostgreSQL.
    pub fn is_postgres(&self) -> bool {
        self.postgres
    }

    /// The pool, for tests that look into every table.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    fn ph(&self, n: usize) -> String {
        if self.postgres {
            format!("${n}")
        } else {
            format!("?{n}")
        }
    }

    /// Writes rows in one transaction, each field within its cap (flagged when cut), each
    /// numbered after the last row of its session's incarnation.
    pub async fn insert(&self, rows: &[NewOperation]) -> Result<(), AuditError> {
        if rows.is_empty() {
            return Ok(());
        }
        let sql = format!(
            "INSERT INTO operations (at_ms, session, tenant, agent, run, op, target, ok, exit_code, error, bytes, duration_ms, incarnation, seq, truncated, caller_labels) VALUES ({})",
            (1..=16).map(|n| self.ph(n)).collect::<Vec<_>>().join(", ")
        );
        let last = format!(
            "SELECT COALESCE(MAX(seq), 0) AS seq FROM operations WHERE session = {} AND incarnation = {}",
            self.ph(1),
            self.ph(2)
        );
        let mut next: std::collections::HashMap<(String, String), i64> = Default::default();
        let mut tx = self.pool.begin().await?;
        if self.postgres {
            // One writer at a time across every sandboxd sharing the store: ids are drawn
            // inside the lock, so they become visible in their order, and a stream that has
            // read up to an id never finds a smaller one committed later.
            sqlx::query(AssertSqlSafe(format!(
                "SELECT 1 AS locked FROM (SELECT pg_advisory_xact_lock({WRITER_LOCK})) AS l"
            )))
            .execute(&mut *tx)
            .await?;
        }
        for r in rows {
            let (r, truncated) = r.clone().capped();
            let key = (r.session.clone(), r.incarnation.clone());
            let seq = match next.get(&key) {
                Some(n) => *n,
                None => {
                    let found: i64 = sqlx::query(AssertSqlSafe(last.clone()))
                        .bind(&r.session)
                        .bind(&r.incarnation)
                        .fetch_one(&mut *tx)
                        .await?
                        .try_get("seq")?;
                    found + 1
                }
            };
            next.insert(key, seq + 1);
            let caller_labels = r.agent.is_some() || r.run.is_some();
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(r.at_ms)
                .bind(&r.session)
                .bind(&r.tenant)
                .bind(r.agent.as_deref())
                .bind(r.run.as_deref())
                .bind(r.op.as_str())
                .bind(&r.target)
                .bind(i64::from(r.ok))
                .bind(r.exit_code)
                .bind(r.error.as_deref())
                .bind(r.bytes)
                .bind(r.duration_ms)
                .bind(&r.incarnation)
                .bind(seq)
                .bind(i64::from(truncated))
                .bind(i64::from(caller_labels))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The activity feed of `session`'s incarnation `incarnation`: its rows after sequence
    /// number `after`, the newest [`EVENTS_PAGE`] of them, oldest first, and the highest
    /// sequence number it has.
    pub async fn events(
        &self,
        session: &str,
        incarnation: &str,
        after: i64,
    ) -> Result<SessionEvents, AuditError> {
        let (p1, p2, p3) = (self.ph(1), self.ph(2), self.ph(3));
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT seq, at_ms, op, target, ok, exit_code, error, duration_ms FROM operations WHERE session = {p1} AND incarnation = {p2} AND seq > {p3} ORDER BY seq DESC LIMIT {EVENTS_PAGE}"
        )))
        .bind(session)
        .bind(incarnation)
        .bind(after)
        .fetch_all(&self.pool)
        .await?;
        let mut events = rows.iter().map(event).collect::<Result<Vec<_>, _>>()?;
        events.reverse();
        let latest_seq: i64 = sqlx::query(AssertSqlSafe(format!(
            "SELECT COALESCE(MAX(seq), 0) AS seq FROM operations WHERE session = {p1} AND incarnation = {p2}"
        )))
        .bind(session)
        .bind(incarnation)
        .fetch_one(&self.pool)
        .await?
        .try_get("seq")?;
        Ok(SessionEvents { events, latest_seq })
    }

    /// At most `limit` rows after id `after`, oldest first: the audit stream's next lines.
    pub async fn after(&self, after: i64, limit: u32) -> Result<Vec<Operation>, AuditError> {
        let sql = format!(
            "SELECT id, at_ms, session, tenant, agent, run, op, target, ok, exit_code, error, bytes, duration_ms, incarnation, truncated, caller_labels FROM operations WHERE id > {} ORDER BY id ASC LIMIT {limit}",
            self.ph(1)
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(after)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(row).collect::<Result<Vec<_>, _>>()?)
    }

    /// One page of rows matching `q`, newest first; the cursor is the id of the last row.
    pub async fn query(&self, q: &OperationQuery) -> Result<OperationPage, AuditError> {
        let limit = q.limit.unwrap_or(DEFAULT_PAGE);
        if !(1..=MAX_PAGE).contains(&limit) {
            return Err(AuditError::BadQuery(format!(
                "limit must be between 1 and {MAX_PAGE}"
            )));
        }
        let mut wheres = Vec::new();
        let mut binds = Vec::new();
        let mut add = |clause: &dyn Fn(&str) -> String, value: Bind, binds: &mut Vec<Bind>| {
            binds.push(value);
            wheres.push(clause(&self.ph(binds.len())));
        };
        for (column, value) in [
            ("session", &q.session),
            ("tenant", &q.tenant),
            ("agent", &q.agent),
            ("run", &q.run),
            ("incarnation", &q.incarnation),
        ] {
            if let Some(v) = value {
                add(
                    &|p| format!("{column} = {p}"),
                    Bind::Text(v.clone()),
                    &mut binds,
                );
            }
        }
        if let Some(op) = q.op {
            add(
                &|p| format!("op = {p}"),
                Bind::Text(op.as_str().to_owned()),
                &mut binds,
            );
        }
        if let Some(text) = q.q.as_deref().filter(|t| !t.is_empty()) {
            let escaped = text
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_");
            let like = if self.postgres { "ILIKE" } else { "LIKE" };
            add(
                &|p| format!("target {like} {p} ESCAPE '\\'"),
                Bind::Text(format!("%{escaped}%")),
                &mut binds,
            );
        }
        if let Some(cursor) = q.cursor.as_deref() {
            let id: i64 = cursor.parse().map_err(|_| {
                AuditError::BadQuery(format!(
                    "cursor '{cursor}' is not one this server gave out; pass the next_cursor of the page before"
                ))
            })?;
            add(&|p| format!("id < {p}"), Bind::Int(id), &mut binds);
        }
        if q.failed {
            wheres.push("ok = 0".to_owned());
        }
        let sql = format!(
            "SELECT id, at_ms, session, tenant, agent, run, op, target, ok, exit_code, error, bytes, duration_ms, incarnation, truncated, caller_labels FROM operations{} ORDER BY id DESC LIMIT {}",
            if wheres.is_empty() {
                String::new()
            } else {
                format!(" WHERE {}", wheres.join(" AND "))
            },
            i64::from(limit) + 1
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for b in binds {
            query = match b {
                Bind::Text(t) => query.bind(t),
                Bind::Int(i) => query.bind(i),
            };
        }
        let rows = query.fetch_all(&self.pool).await?;
        let mut operations = rows.iter().map(row).collect::<Result<Vec<_>, _>>()?;
        let next_cursor = if operations.len() > limit as usize {
            operations.truncate(limit as usize);
            operations.last().map(|o| o.id.to_string())
        } else {
            None
        };
        Ok(OperationPage {
            operations,
            next_cursor,
        })
    }

    /// Deletes rows older than `retention_days` before `now_ms`; returns how many. Files are
    /// never touched.
    pub async fn sweep(&self, now_ms: i64, retention_days: u32) -> Result<u64, AuditError> {
        let cutoff = now_ms - i64::from(retention_days) * 24 * 60 * 60 * 1000;
        let sql = format!("DELETE FROM operations WHERE at_ms < {}", self.ph(1));
        Ok(sqlx::query(AssertSqlSafe(sql))
            .bind(cutoff)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }
}

fn row(r: &AnyRow) -> Result<Operation, sqlx::Error> {
    let op: String = r.try_get("op")?;
    Ok(Operation {
        id: r.try_get("id")?,
        at: rfc3339(r.try_get("at_ms")?),
        session: r.try_get("session")?,
        tenant: r.try_get("tenant")?,
        agent: r.try_get("agent")?,
        run: r.try_get("run")?,
        op: Op::parse(&op)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown operation '{op}'").into()))?,
        target: r.try_get("target")?,
        ok: r.try_get::<i64, _>("ok")? != 0,
        exit_code: r.try_get("exit_code")?,
        error: r.try_get("error")?,
        bytes: r.try_get("bytes")?,
        duration_ms: r.try_get("duration_ms")?,
        incarnation: Some(r.try_get::<String, _>("incarnation")?).filter(|i| !i.is_empty()),
        truncated: r.try_get::<i64, _>("truncated")? != 0,
        caller_labels: r.try_get::<i64, _>("caller_labels")? != 0,
    })
}

fn event(r: &AnyRow) -> Result<SessionEvent, sqlx::Error> {
    let name: String = r.try_get("op")?;
    let op = Op::parse(&name)
        .ok_or_else(|| sqlx::Error::Decode(format!("unknown operation '{name}'").into()))?;
    let ok = r.try_get::<i64, _>("ok")? != 0;
    let exit_code: Option<i64> = r.try_get("exit_code")?;
    let error: Option<String> = r.try_get("error")?;
    let target: String = r.try_get("target")?;
    Ok(SessionEvent {
        seq: r.try_get("seq")?,
        at: r.try_get::<i64, _>("at_ms")? as f64 / 1000.0,
        op: sandboxd_api::audit::event_op(op).to_owned(),
        target: bounded(&target, EVENT_TARGET_CHARS),
        ok,
        detail: sandboxd_api::audit::event_detail(op, ok, exit_code, error.as_deref()),
        duration_ms: r.try_get::<i64, _>("duration_ms")? as f64,
    })
}

enum Msg {
    Row(Box<NewOperation>),
    Flush(oneshot::Sender<()>),
}

/// The audit log of a running sandboxd: records off the request path, queries, sweeps.
#[derive(Clone, Debug)]
pub struct Audit {
    store: Option<AuditStore>,
    tx: mpsc::Sender<Msg>,
    dropped: Dropped,
}

/// Rows dropped (the queue full, or the store failing twice): counted for the
/// `sandboxd_audit_rows_dropped_total` metric, and warned of at most every
/// [`DROP_WARN_EVERY`] with how many since the last warning.
#[derive(Clone, Debug)]
struct Dropped {
    counter: prometheus_client::metrics::counter::Counter,
    warned: std::sync::Arc<std::sync::Mutex<(Option<std::time::Instant>, u64)>>,
}

impl Dropped {
    fn add(&self, rows: u64, why: &str) {
        self.counter.inc_by(rows);
        let mut w = self
            .warned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        w.1 += rows;
        let now = std::time::Instant::now();
        if w.0
            .is_none_or(|last| now.duration_since(last) >= DROP_WARN_EVERY)
        {
            warn!(
                rows = w.1,
                total = self.counter.get(),
                reason = why,
                "audit rows dropped"
            );
            *w = (Some(now), 0);
        }
    }
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Msg")
    }
}

impl Audit {
    /// Starts the writer over `store` with a queue of [`DEFAULT_QUEUE`] rows; `None` turns the
    /// audit log off (nothing is recorded, queries answer empty).
    pub fn start(store: Option<AuditStore>) -> Self {
        Self::with_queue(store, DEFAULT_QUEUE, Default::default())
    }

    /// [`Audit::start`] with a queue of `capacity` rows (at least 1): a row recorded while it
    /// is full is dropped and counted in `dropped`.
    pub fn with_queue(
        store: Option<AuditStore>,
        capacity: usize,
        dropped: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let dropped = Dropped {
            counter: dropped,
            warned: Default::default(),
        };
        if let Some(s) = store.clone() {
            tokio::spawn(writer(s, rx, dropped.clone()));
        } else {
            tokio::spawn(async move {
                let mut rx = rx;
                while let Some(m) = rx.recv().await {
                    if let Msg::Flush(done) = m {
                        let _ = done.send(());
                    }
                }
            });
        }
        Self { store, tx, dropped }
    }

    /// The store, when the audit log is on.
    pub fn store(&self) -> Option<&AuditStore> {
        self.store.as_ref()
    }

    /// Records a row; never blocks and never fails the request. A row that finds the queue
    /// full (the store slow or down) is dropped, counted and warned of.
    pub fn record(&self, row: NewOperation) {
        if self.store.is_none() {
            return;
        }
        if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(Msg::Row(Box::new(row))) {
            self.dropped
                .add(1, "the audit queue is full (SANDBOXD_AUDIT_QUEUE)");
        }
    }

    /// At most `limit` rows after id `after`, oldest first, once everything recorded before
    /// is written.
    pub async fn after(&self, after: i64, limit: u32) -> Result<Vec<Operation>, AuditError> {
        self.flush().await;
        match &self.store {
            Some(s) => s.after(after, limit).await,
            None => Ok(vec![]),
        }
    }

    /// Rows waiting in the queue for the writer now, and the queue's size.
    pub fn queued(&self) -> (usize, usize) {
        let size = self.tx.max_capacity();
        (size.saturating_sub(self.tx.capacity()), size)
    }

    /// Rows dropped since start.
    pub fn dropped(&self) -> u64 {
        self.dropped.counter.get()
    }

    /// Waits until every row recorded before this call is written (or dropped).
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Msg::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }

    /// One page of rows (after a flush, so a caller sees what it did).
    pub async fn query(&self, q: &OperationQuery) -> Result<OperationPage, AuditError> {
        self.flush().await;
        match &self.store {
            Some(s) => s.query(q).await,
            None => Ok(OperationPage {
                operations: vec![],
                next_cursor: None,
            }),
        }
    }

    /// The activity feed of a session's incarnation after `after` (after a flush, so a caller
    /// sees what it did); empty when the audit log is off.
    pub async fn events(
        &self,
        session: &str,
        incarnation: &str,
        after: i64,
    ) -> Result<SessionEvents, AuditError> {
        self.flush().await;
        match &self.store {
            Some(s) => s.events(session, incarnation, after).await,
            None => Ok(SessionEvents::default()),
        }
    }

    /// Sweeps rows older than `retention_days` now, then once a day.
    pub fn spawn_sweeper(&self, retention_days: u32) {
        let Some(store) = self.store.clone() else {
            return;
        };
        tokio::spawn(async move {
            let mut every = tokio::time::interval(SWEEP_EVERY);
            loop {
                every.tick().await;
                match store
                    .sweep(crate::storage::store::now_ms(), retention_days)
                    .await
                {
                    Ok(n) => info!(removed = n, retention_days, "audit rows swept"),
                    Err(e) => warn!(error = %e, "audit retention sweep failed"),
                }
            }
        });
    }
}

async fn writer(store: AuditStore, mut rx: mpsc::Receiver<Msg>, dropped: Dropped) {
    while let Some(first) = rx.recv().await {
        let mut batch = Vec::new();
        let mut waiters = Vec::new();
        let mut take = |m: Msg, batch: &mut Vec<NewOperation>| match m {
            Msg::Row(r) => batch.push(*r),
            Msg::Flush(done) => waiters.push(done),
        };
        take(first, &mut batch);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(m) => take(m, &mut batch),
                Err(_) => break,
            }
        }
        if let Err(e) = store.insert(&batch).await {
            warn!(error = %e, rows = batch.len(), "audit rows could not be written; retrying once");
            if let Err(e) = store.insert(&batch).await {
                warn!(error = %e, rows = batch.len(), "audit rows lost");
                dropped.add(batch.len() as u64, "the audit store failed twice");
            }
        }
        for w in waiters {
            let _ = w.send(());
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh PostgreSQL database on the cluster `make up` started; fails (never skips) when
    /// it is not there.
    pub(crate) async fn postgres_url() -> String {
        let base = std::env::var("SANDBOXD_TEST_POSTGRES_URL").unwrap_or_else(|_| {
            panic!("SANDBOXD_TEST_POSTGRES_URL is not set: start PostgreSQL with `make up` and `eval \"$(make -s env)\"`, or run `make test`")
        });
        sqlx::any::install_default_drivers();
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .connect(&base)
            .await
            .unwrap_or_else(|e| {
                panic!("PostgreSQL at {base} does not answer ({e}): run `make up`")
            });
        let name = format!("sbx_audit_{:016x}", rand::random::<u64>());
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&pool)
            .await
            .expect("create a test database");
        let (prefix, _) = base.rsplit_once('/').expect("a database in the URL");
        format!("{prefix}/{name}")
    }

    fn op(at_ms: i64, session: &str, tenant: &str, op: Op, target: &str, ok: bool) -> NewOperation {
        NewOperation {
            at_ms,
            session: session.into(),
            incarnation: format!("{session}-i1"),
            tenant: tenant.into(),
            agent: Some("agent-1".into()),
            run: Some("run-1".into()),
            op,
            target: target.into(),
            ok,
            exit_code: (op == Op::Execute).then_some(if ok { 0 } else { 2 }),
            error: (!ok).then(|| "exit 2".into()),
            bytes: None,
            duration_ms: 3,
        }
    }

    async fn store_suite(store: AuditStore) {
        let now = 1_800_000_000_000;
        let day = 24 * 60 * 60 * 1000;
        let mut rows = vec![
            op(now - 31 * day, "s1", "t1", Op::Read, "old.txt", true),
            op(now - 29 * day, "s1", "t1", Op::Read, "kept.txt", true),
        ];
        for i in 0..25 {
            rows.push(op(
                now + i,
                "s1",
                "t1",
                Op::Write,
                &format!("dir/file_{i}.txt"),
                true,
            ));
        }
        rows.push(op(
            now + 30,
            "s2",
            "t2",
            Op::Execute,
            "grep -r 100% src",
            false,
        ));
        store.insert(&rows).await.expect("insert");

        // Filters.
        let page = |q: OperationQuery| {
            let store = store.clone();
            async move { store.query(&q).await.expect("query") }
        };
        let failed = page(OperationQuery {
            failed: true,
            ..Default::default()
        })
        .await;
        assert_eq!(failed.operations.len(), 1);
        let f = &failed.operations[0];
        assert_eq!(
            (f.op, f.exit_code, f.error.as_deref(), f.ok),
            (Op::Execute, Some(2), Some("exit 2"), false)
        );
        assert_eq!(
            page(OperationQuery {
                tenant: Some("t2".into()),
                ..Default::default()
            })
            .await
            .operations
            .len(),
            1
        );
        assert_eq!(
            page(OperationQuery {
                op: Some(Op::Read),
                ..Default::default()
            })
            .await
            .operations
            .len(),
            2
        );
        assert_eq!(
            page(OperationQuery {
                q: Some("100%".into()),
                ..Default::default()
            })
            .await
            .operations
            .len(),
            1
        );
        assert_eq!(
            page(OperationQuery {
                q: Some("FILE_1".into()),
                ..Default::default()
            })
            .await
            .operations
            .len(),
            11,
            "case-insensitive search, _ taken literally"
        );
        assert_eq!(
            page(OperationQuery {
                agent: Some("nobody".into()),
                ..Default::default()
            })
            .await
            .operations
            .len(),
            0
        );

        // Keyset paging: newest first, no row twice, none left out.
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let p = page(OperationQuery {
                session: Some("s1".into()),
                limit: Some(10),
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await;
            seen.extend(p.operations.iter().map(|o| o.id));
            match p.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(seen.len(), 27);
        assert!(seen.windows(2).all(|w| w[0] > w[1]));
        assert!(
            matches!(store.query(&OperationQuery { limit: Some(MAX_PAGE + 1), ..Default::default() }).await, Err(AuditError::BadQuery(m)) if m == "limit must be between 1 and 1000")
        );
        assert!(matches!(
            store
                .query(&OperationQuery {
                    cursor: Some("abc".into()),
                    ..Default::default()
                })
                .await,
            Err(AuditError::BadQuery(_))
        ));

        // Retention, with an injected now.
        assert_eq!(store.sweep(now, RETENTION_DAYS).await.expect("sweep"), 1);
        let reads = page(OperationQuery {
            op: Some(Op::Read),
            ..Default::default()
        })
        .await;
        assert_eq!(
            reads
                .operations
                .iter()
                .map(|o| o.target.as_str())
                .collect::<Vec<_>>(),
            ["kept.txt"]
        );
        assert_eq!(store.sweep(now, RETENTION_DAYS).await.expect("sweep"), 0);
    }

    /// The feed of one incarnation: numbered from 1 per incarnation, `after` and the page,
    /// the wire protocol's names and details; another incarnation of the same id sees none of
    /// it; an oversize field is cut and flagged, caller labels marked.
    async fn feed_suite(store: AuditStore) {
        let mut first = op(1_000, "s", "t", Op::Execute, "echo hi", true);
        first.incarnation = "old".into();
        let mut rows = vec![first];
        for (i, (o, target, ok)) in [
            (Op::Execute, "ls -la", true),
            (Op::Write, "/workspace/a.txt", true),
            (Op::Read, "missing.txt", false),
        ]
        .into_iter()
        .enumerate()
        {
            let mut r = op(2_000 + i as i64, "s", "t", o, target, ok);
            r.incarnation = "new".into();
            if o == Op::Read {
                r.error = Some("not_found".into());
            }
            rows.push(r);
        }
        store.insert(&rows).await.expect("insert");
        let feed = store.events("s", "new", 0).await.expect("events");
        let seen: Vec<_> = feed
            .events
            .iter()
            .map(|e| {
                (
                    e.seq,
                    e.op.as_str(),
                    e.target.as_str(),
                    e.ok,
                    e.detail.as_str(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (1, "run", "ls -la", true, "exit 0"),
                (2, "write", "/workspace/a.txt", true, ""),
                (3, "read", "missing.txt", false, "not found"),
            ]
        );
        assert_eq!(feed.latest_seq, 3);
        assert_eq!(feed.events[0].at, 2.0);
        let later = store.events("s", "new", 3).await.expect("events");
        assert_eq!((later.events.len(), later.latest_seq), (0, 3));
        let old = store.events("s", "old", 0).await.expect("events");
        assert_eq!(
            old.events
                .iter()
                .map(|e| e.target.as_str())
                .collect::<Vec<_>>(),
            ["echo hi"]
        );
        // A later batch goes on numbering; only the newest EVENTS_PAGE come back.
        let more: Vec<_> = (0..250)
            .map(|i| {
                let mut r = op(3_000 + i, "s", "t", Op::Ls, &format!("d{i}"), true);
                r.incarnation = "new".into();
                r
            })
            .collect();
        store.insert(&more).await.expect("insert");
        let page = store.events("s", "new", 0).await.expect("events");
        assert_eq!(page.latest_seq, 253);
        assert_eq!(page.events.len(), EVENTS_PAGE as usize);
        assert_eq!(
            (
                page.events[0].seq,
                page.events[199].seq,
                page.events[199].target.as_str()
            ),
            (54, 253, "d249")
        );
        // Oversize fields are cut and flagged; the feed cuts targets further, as the protocol.
        let mut big = op(9_000, "s", "t", Op::Execute, &"x".repeat(5000), true);
        big.incarnation = "big".into();
        big.agent = Some("a".repeat(300));
        store.insert(&[big]).await.expect("insert");
        let rows = store
            .query(&OperationQuery {
                incarnation: Some("big".into()),
                ..Default::default()
            })
            .await
            .expect("query")
            .operations;
        let r = &rows[0];
        assert_eq!(
            (
                r.target.chars().count(),
                r.agent.as_deref().map(|a| a.chars().count()),
                r.truncated,
                r.caller_labels,
                r.incarnation.as_deref(),
            ),
            (
                MAX_TARGET_CHARS + 1,
                Some(MAX_ID_CHARS + 1),
                true,
                true,
                Some("big")
            )
        );
        let feed = store.events("s", "big", 0).await.expect("events");
        assert_eq!(
            feed.events[0].target,
            format!("{}…", "x".repeat(EVENT_TARGET_CHARS))
        );
    }

    /// A database made by the first migration, with rows in it, takes the second: the old rows
    /// stay (incarnation none, seq 0, labels marked), visible to an unfiltered query only.
    async fn migrates_an_existing_database(url: &str, postgres: bool, dir: &std::path::Path) {
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .connect(url)
            .await
            .expect("connect");
        let mut first = if postgres {
            sqlx::migrate!("./migrations/audit/postgres")
        } else {
            sqlx::migrate!("./migrations/audit/sqlite")
        };
        first.migrations = first
            .migrations
            .iter()
            .filter(|m| m.version == 1)
            .cloned()
            .collect::<Vec<_>>()
            .into();
        first.run(&pool).await.expect("the first migration");
        sqlx::query("INSERT INTO operations (at_ms, session, tenant, agent, run, op, target, ok, exit_code, error, bytes, duration_ms) VALUES (1, 's', 't', 'agent-1', NULL, 'read', 'old.txt', 1, NULL, NULL, 3, 2)")
            .execute(&pool)
            .await
            .expect("an old row");
        pool.close().await;
        let store = AuditStore::open(postgres.then_some(url), dir)
            .await
            .expect("the store opens and migrates");
        let rows = store
            .query(&OperationQuery::default())
            .await
            .expect("query")
            .operations;
        assert_eq!(
            rows.iter()
                .map(|o| (
                    o.target.as_str(),
                    o.incarnation.clone(),
                    o.caller_labels,
                    o.truncated
                ))
                .collect::<Vec<_>>(),
            [("old.txt", None, true, false)]
        );
        let mut r = op(5, "s", "t", Op::Write, "new.txt", true);
        r.incarnation = "i".into();
        store.insert(&[r]).await.expect("insert");
        let feed = store.events("s", "i", 0).await.expect("events");
        assert_eq!(
            feed.events
                .iter()
                .map(|e| (e.seq, e.target.as_str()))
                .collect::<Vec<_>>(),
            [(1, "new.txt")]
        );
    }

    #[tokio::test]
    async fn sqlite_feed_numbers_per_incarnation() {
        let dir = tempfile::tempdir().expect("dir");
        feed_suite(AuditStore::open(None, dir.path()).await.expect("sqlite")).await;
    }

    #[tokio::test]
    async fn postgres_feed_numbers_per_incarnation() {
        let url = postgres_url().await;
        let dir = tempfile::tempdir().expect("dir");
        feed_suite(
            AuditStore::open(Some(&url), dir.path())
                .await
                .expect("postgres"),
        )
        .await;
    }

    #[tokio::test]
    async fn sqlite_migrates_an_existing_database() {
        let dir = tempfile::tempdir().expect("dir");
        sqlx::any::install_default_drivers();
        let url = format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("audit.db").display()
        );
        migrates_an_existing_database(&url, false, dir.path()).await;
    }

    #[tokio::test]
    async fn postgres_migrates_an_existing_database() {
        let url = postgres_url().await;
        let dir = tempfile::tempdir().expect("dir");
        migrates_an_existing_database(&url, true, dir.path()).await;
    }

    #[tokio::test]
    async fn sqlite_store_filters_pages_and_sweeps() {
        let dir = tempfile::tempdir().expect("dir");
        let store = AuditStore::open(None, dir.path()).await.expect("sqlite");
        assert!(!store.is_postgres());
        store_suite(store).await;
    }

    #[tokio::test]
    async fn postgres_store_filters_pages_and_sweeps() {
        let url = postgres_url().await;
        let dir = tempfile::tempdir().expect("dir");
        let store = AuditStore::open(Some(&url), dir.path())
            .await
            .expect("postgres");
        assert!(store.is_postgres());
        store_suite(store).await;
    }

    #[tokio::test]
    async fn the_writer_batches_and_a_flush_loses_nothing() {
        let dir = tempfile::tempdir().expect("dir");
        let audit = Audit::start(Some(
            AuditStore::open(None, dir.path()).await.expect("sqlite"),
        ));
        for i in 0..1200 {
            audit.record(op(i, "s", "t", Op::Execute, &"x".repeat(5000), true));
        }
        audit.flush().await;
        let page = audit
            .query(&OperationQuery {
                limit: Some(MAX_PAGE),
                ..Default::default()
            })
            .await
            .expect("query");
        assert_eq!(page.operations.len(), 1000);
        assert!(page.next_cursor.is_some());
        assert_eq!(
            page.operations[0].target.chars().count(),
            MAX_TARGET_CHARS + 1
        );
        assert!(page.operations[0].target.ends_with('…'));
    }

    /// The store cannot keep up (here: the writer gets no turn while 1,000 rows are recorded
    /// on a single-threaded runtime): the queue holds what it can, every other row is dropped
    /// and counted, and nothing waits.
    #[tokio::test(flavor = "current_thread")]
    async fn a_full_queue_drops_rows_and_counts_them() {
        let dir = tempfile::tempdir().expect("dir");
        let counter = prometheus_client::metrics::counter::Counter::default();
        let audit = Audit::with_queue(
            Some(AuditStore::open(None, dir.path()).await.expect("sqlite")),
            16,
            counter.clone(),
        );
        for i in 0..1000 {
            audit.record(op(i, "s", "t", Op::Write, "f.txt", true));
        }
        assert_eq!((audit.dropped(), counter.get()), (984, 984));
        audit.flush().await;
        let page = audit
            .query(&OperationQuery {
                limit: Some(MAX_PAGE),
                ..Default::default()
            })
            .await
            .expect("query");
        assert_eq!(page.operations.len(), 16);
        // Once the writer caught up, rows are recorded again.
        audit.record(op(2000, "s", "t", Op::Write, "after.txt", true));
        audit.flush().await;
        let page = audit
            .query(&OperationQuery::default())
            .await
            .expect("query");
        assert_eq!(page.operations[0].target, "after.txt");
        assert_eq!(counter.get(), 984);
    }

    #[test]
    fn bounded_cuts_on_characters() {
        assert_eq!(bounded("héllo", 2), "hé…");
        assert_eq!(bounded("hi", 2), "hi");
    }
}
