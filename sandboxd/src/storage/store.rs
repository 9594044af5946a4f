//! sandboxd's own state in SQLite (sqlx, with migrations). Every state change is a guarded
//! update (`… WHERE state IN (…)`), so two requests can never both act on one session, and the
//! caps are checked in the same statement that claims a slot.
//!
//! Over 600 lines with its tests: every guarded transition of a session row, in one place.

use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{AssertSqlSafe, Row, SqlitePool};

// The only SQL built with format! splices in HELD_SQL and state names from `State::as_str`,
// never input; every value is bound.

/// Where a session is in its life on this host.
/// The API shows it as [`sandboxd_api::SessionState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// The container is being created and started.
    Opening,
    /// The container runs.
    Running,
    /// Asleep: the container is stopped, the files stay.
    Stopped,
    /// The container was removed; the workspace stays.
    Reclaimed,
    /// The workspace vanished; reported, never recreated empty.
    Lost,
    /// Being destroyed.
    Destroying,
}

impl State {
    /// The states that hold a slot against the caps.
    pub const HELD: [State; 3] = [State::Opening, State::Running, State::Stopped];
    /// Every state.
    pub const ALL: [State; 6] = [
        State::Opening,
        State::Running,
        State::Stopped,
        State::Reclaimed,
        State::Lost,
        State::Destroying,
    ];

    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Opening => "opening",
            State::Running => "running",
            State::Stopped => "stopped",
            State::Reclaimed => "reclaimed",
            State::Lost => "lost",
            State::Destroying => "destroying",
        }
    }
}

impl From<State> for sandboxd_api::SessionState {
    fn from(state: State) -> Self {
        match state {
            State::Opening => Self::Opening,
            State::Running => Self::Running,
            State::Stopped => Self::Stopped,
            State::Reclaimed => Self::Reclaimed,
            State::Lost => Self::Lost,
            State::Destroying => Self::Destroying,
        }
    }
}

impl FromStr for State {
    type Err = sqlx::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "opening" => State::Opening,
            "running" => State::Running,
            "stopped" => State::Stopped,
            "reclaimed" => State::Reclaimed,
            "lost" => State::Lost,
            "destroying" => State::Destroying,
            other => {
                return Err(sqlx::Error::Decode(
                    format!("unknown session state '{other}'").into(),
                ));
            }
        })
    }
}

/// One session row.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRow {
    /// The session id (its name).
    pub id: String,
    /// The tenant.
    pub tenant: String,
    /// The runtime alias.
    pub runtime: String,
    /// The image it runs.
    pub image: String,
    /// Where it is.
    pub state: State,
    /// SHA-256 of its token.
    pub token_hash: String,
    /// Its container, when one exists.
    pub container_id: Option<String>,
    /// Its resource limits (JSON).
    pub limits: String,
    /// Unix milliseconds.
    pub created_at: i64,
    /// Unix milliseconds.
    pub updated_at: i64,
    /// Unix milliseconds of the last run or file operation.
    pub last_activity_at: i64,
    /// The object it belongs to; `None` for a session opened without one (or before owners).
    pub owner: Option<String>,
    /// Whether its container was taken from a warm pool (`launch = 'warm'`).
    pub warm: bool,
    /// Whether its workspace came from a snapshot (`launch = 'restored'`).
    pub restored: bool,
    /// Its incarnation: 32 hex digits made with the row, so a session opened again under the
    /// same id after a destroy is another incarnation (its audit rows are told apart).
    pub incarnation: String,
    /// What its last checkpoint or restore did (the API's `MemoryNote` as JSON); `None`
    /// before its first.
    pub memory: Option<String>,
    /// The ports of its sandbox it opened to be reached through sandboxd, ascending.
    pub ports: Vec<u16>,
}

/// A session to insert.
#[derive(Debug, Clone)]
pub struct NewSession<'a> {
    /// The id.
    pub id: &'a str,
    /// The tenant.
    pub tenant: &'a str,
    /// The runtime alias.
    pub runtime: &'a str,
    /// The image.
    pub image: &'a str,
    /// SHA-256 of the token.
    pub token_hash: &'a str,
    /// Limits as JSON.
    pub limits: &'a str,
    /// The object it belongs to, when the opener named one.
    pub owner: Option<&'a str>,
    /// The nominal size of its workspace disk (0 without one): what it counts against the
    /// workspace budget until it is destroyed.
    pub disk_bytes: u64,
}

/// The caps a new slot is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Sessions per host.
    pub max_sessions: u32,
    /// Sessions per tenant.
    pub max_per_tenant: u32,
    /// Workspaces one tenant may hold in any state until they are destroyed (asleep and
    /// reclaimed included).
    pub max_workspaces_per_tenant: u32,
    /// The bytes of workspace disks (their nominal sizes) the host may hold; `None`: no budget
    /// (workspaces without disks).
    pub workspace_budget: Option<u64>,
}

impl Caps {
    /// Session caps alone: no workspace cap of the tenant's and no disk budget (tests and tools).
    pub fn sessions(max_sessions: u32, max_per_tenant: u32) -> Self {
        Self {
            max_sessions,
            max_per_tenant,
            max_workspaces_per_tenant: u32::MAX,
            workspace_budget: None,
        }
    }
}

/// What the host holds now: sessions holding a slot, and workspaces holding disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Held {
    /// Sessions holding a slot on the host (opening, running, stopped).
    pub sessions: u32,
    /// Of them, the tenant's.
    pub tenant_sessions: u32,
    /// Workspaces on the host, in any state until destroyed.
    pub workspaces: u32,
    /// Of them, the tenant's.
    pub tenant_workspaces: u32,
    /// The nominal bytes of the host's workspace disks.
    pub workspace_bytes: u64,
}

/// What claiming a slot for a new session did.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// The row was inserted in state opening.
    Inserted,
    /// A session of that id already exists.
    Exists(Box<SessionRow>),
    /// The tenant holds its cap.
    TenantCap {
        /// Sessions it holds.
        held: u32,
    },
    /// The host holds its cap.
    HostCap {
        /// Sessions the host holds.
        held: u32,
    },
    /// The tenant holds as many workspaces as it may.
    TenantWorkspaces {
        /// Workspaces it holds.
        held: u32,
    },
    /// The host's workspace budget has no room for the new disk.
    Budget {
        /// Bytes its workspaces hold.
        held: u64,
        /// How many workspaces hold them.
        workspaces: u32,
    },
}

/// The state store.
#[derive(Clone)]
pub struct Store {
    pool: SqlitePool,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

const HELD_SQL: &str = "state IN ('opening', 'running', 'stopped')";

/// The rows whose workspace still takes disk: every state until destroyed but lost (a lost
/// workspace has none left).
const DISK_SQL: &str = "state <> 'lost'";

fn row(r: &sqlx::sqlite::SqliteRow) -> Result<SessionRow, sqlx::Error> {
    Ok(SessionRow {
        id: r.try_get("id")?,
        tenant: r.try_get("tenant")?,
        runtime: r.try_get("runtime")?,
        image: r.try_get("image")?,
        state: r.try_get::<String, _>("state")?.parse()?,
        token_hash: r.try_get("token_hash")?,
        container_id: r.try_get("container_id")?,
        limits: r.try_get("limits")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
        last_activity_at: r.try_get("last_activity_at")?,
        owner: r.try_get("owner")?,
        warm: r.try_get::<String, _>("launch")? == "warm",
        restored: r.try_get::<String, _>("launch")? == "restored",
        incarnation: r.try_get("incarnation")?,
        memory: r.try_get("memory")?,
        // Written only by [`Store::set_ports`]; a value that does not read is no port.
        ports: serde_json::from_str(&r.try_get::<String, _>("ports")?).unwrap_or_default(),
    })
}

impl Store {
    /// Opens (creating) the database in `dir` and runs the migrations.
    pub async fn open(dir: &Path) -> Result<Self, sqlx::Error> {
        std::fs::create_dir_all(dir)?;
        let options = SqliteConnectOptions::new()
            .filename(dir.join("sandboxd.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(std::time::Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Self { pool })
    }

    /// One session by id.
    pub async fn get(&self, id: &str) -> Result<Option<SessionRow>, sqlx::Error> {
        sqlx::query("SELECT * FROM sessions WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(row)
            .transpose()
    }

    /// The session a token hash belongs to: its own token, or one granted on an attach.
    pub async fn by_token_hash(&self, hash: &str) -> Result<Option<SessionRow>, sqlx::Error> {
        sqlx::query(
            "SELECT * FROM sessions WHERE token_hash = ?1
             OR id = (SELECT session_id FROM session_tokens WHERE token_hash = ?1)",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(row)
        .transpose()
    }

    /// Every session, oldest first.
    pub async fn list(&self) -> Result<Vec<SessionRow>, sqlx::Error> {
        sqlx::query("SELECT * FROM sessions ORDER BY created_at, id")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(row)
            .collect()
    }

    /// How many sessions are in each state (states with none left out): one count, no row
    /// read into sandboxd.
    pub async fn counts(&self) -> Result<Vec<(State, u64)>, sqlx::Error> {
        sqlx::query("SELECT state, count(*) AS n FROM sessions GROUP BY state")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| {
                let state: State = r.try_get::<String, _>("state")?.parse()?;
                let n = u64::try_from(r.try_get::<i64, _>("n")?).unwrap_or(0);
                Ok((state, n))
            })
            .collect()
    }

    /// What the host holds, and of it `tenant`.
    pub async fn held(&self, tenant: &str) -> Result<Held, sqlx::Error> {
        let r = sqlx::query(AssertSqlSafe(format!(
            "SELECT (SELECT count(*) FROM sessions WHERE {HELD_SQL}) AS host,
                    (SELECT count(*) FROM sessions WHERE {HELD_SQL} AND tenant = ?1) AS tenant,
                    (SELECT count(*) FROM sessions WHERE {DISK_SQL}) AS workspaces,
                    (SELECT count(*) FROM sessions WHERE {DISK_SQL} AND tenant = ?1) AS tenant_workspaces,
                    (SELECT coalesce(sum(disk_bytes + checkpoint_bytes), 0) FROM sessions WHERE {DISK_SQL}) AS bytes"
        )))
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        let count = |name: &str| -> Result<u32, sqlx::Error> {
            Ok(u32::try_from(r.try_get::<i64, _>(name)?).unwrap_or(u32::MAX))
        };
        Ok(Held {
            sessions: count("host")?,
            tenant_sessions: count("tenant")?,
            workspaces: count("workspaces")?,
            tenant_workspaces: count("tenant_workspaces")?,
            workspace_bytes: u64::try_from(r.try_get::<i64, _>("bytes")?).unwrap_or(0),
        })
    }

    /// Why a claim under `caps` was refused, from what the host holds now.
    async fn refusal(
        &self,
        tenant: &str,
        caps: Caps,
        disk_bytes: u64,
    ) -> Result<Claim, sqlx::Error> {
        let held = self.held(tenant).await?;
        Ok(if held.tenant_sessions >= caps.max_per_tenant {
            Claim::TenantCap {
                held: held.tenant_sessions,
            }
        } else if held.tenant_workspaces >= caps.max_workspaces_per_tenant {
            Claim::TenantWorkspaces {
                held: held.tenant_workspaces,
            }
        } else if caps
            .workspace_budget
            .is_some_and(|b| held.workspace_bytes.saturating_add(disk_bytes) > b)
        {
            Claim::Budget {
                held: held.workspace_bytes,
                workspaces: held.workspaces,
            }
        } else {
            Claim::HostCap {
                held: held.sessions,
            }
        })
    }

    /// Inserts a new session in state opening if its id is free and both caps have room, in
    /// one statement (SQLite serialises writers, so concurrent claims cannot overshoot).
    pub async fn claim(&self, new: &NewSession<'_>, caps: Caps) -> Result<Claim, sqlx::Error> {
        let now = now_ms();
        let inserted = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO sessions (id, tenant, runtime, image, state, token_hash, limits, created_at, updated_at, last_activity_at, owner, incarnation, disk_bytes)
             SELECT ?1, ?2, ?3, ?4, 'opening', ?5, ?6, ?7, ?7, ?7, ?10, ?11, ?12
             WHERE (SELECT count(*) FROM sessions WHERE {HELD_SQL}) < ?8
               AND (SELECT count(*) FROM sessions WHERE {HELD_SQL} AND tenant = ?2) < ?9
               AND (SELECT count(*) FROM sessions WHERE {DISK_SQL} AND tenant = ?2) < ?13
               AND (SELECT coalesce(sum(disk_bytes + checkpoint_bytes), 0) FROM sessions WHERE {DISK_SQL}) + ?12 <= ?14
             ON CONFLICT (id) DO NOTHING"
        )))
        .bind(new.id)
        .bind(new.tenant)
        .bind(new.runtime)
        .bind(new.image)
        .bind(new.token_hash)
        .bind(new.limits)
        .bind(now)
        .bind(caps.max_sessions)
        .bind(caps.max_per_tenant)
        .bind(new.owner)
        .bind(format!("{:032x}", rand::random::<u128>()))
        .bind(i64::try_from(new.disk_bytes).unwrap_or(i64::MAX))
        .bind(caps.max_workspaces_per_tenant)
        .bind(caps.workspace_budget.map_or(i64::MAX, |b| i64::try_from(b).unwrap_or(i64::MAX)))
        .execute(&self.pool)
        .await?
        .rows_affected();
        if inserted == 1 {
            return Ok(Claim::Inserted);
        }
        if let Some(existing) = self.get(new.id).await? {
            return Ok(Claim::Exists(Box::new(existing)));
        }
        self.refusal(new.tenant, caps, new.disk_bytes).await
    }

    /// Moves a reclaimed session back to opening if the caps have room; `Ok(None)` when it was
    /// not reclaimed any more, `Ok(Some(claim))` with the outcome otherwise.
    pub async fn reclaim_to_opening(
        &self,
        id: &str,
        tenant: &str,
        caps: Caps,
    ) -> Result<Option<Claim>, sqlx::Error> {
        let done = sqlx::query(AssertSqlSafe(format!(
            "UPDATE sessions SET state = 'opening', updated_at = ?2
             WHERE id = ?1 AND state = 'reclaimed'
               AND (SELECT count(*) FROM sessions WHERE {HELD_SQL}) < ?3
               AND (SELECT count(*) FROM sessions WHERE {HELD_SQL} AND tenant = ?4) < ?5"
        )))
        .bind(id)
        .bind(now_ms())
        .bind(caps.max_sessions)
        .bind(tenant)
        .bind(caps.max_per_tenant)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if done == 1 {
            return Ok(Some(Claim::Inserted));
        }
        match self.get(id).await? {
            // Its workspace already counts: only the session caps can refuse a wake.
            Some(r) if r.state == State::Reclaimed => {
                let caps = Caps::sessions(caps.max_sessions, caps.max_per_tenant);
                Ok(Some(self.refusal(tenant, caps, 0).await?))
            }
            _ => Ok(None),
        }
    }

    /// Moves `id` from one of `from` to `to`; false when it was in none of them (someone else acted).
    pub async fn transition(
        &self,
        id: &str,
        from: &[State],
        to: State,
    ) -> Result<bool, sqlx::Error> {
        self.guarded_transition(id, from, to, None).await
    }

    /// [`Store::transition`] only while the session has no owner or `owner`: a row another
    /// owner opened under the same id in the meantime is left as it is (false).
    pub async fn transition_owned(
        &self,
        id: &str,
        from: &[State],
        to: State,
        owner: &str,
    ) -> Result<bool, sqlx::Error> {
        self.guarded_transition(id, from, to, Some(owner)).await
    }

    /// The one guarded update behind both: from one of `from`, and, with `owner`, only while
    /// the row has no owner or that one.
    async fn guarded_transition(
        &self,
        id: &str,
        from: &[State],
        to: State,
        owner: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        let list = from
            .iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect::<Vec<_>>()
            .join(", ");
        let n = sqlx::query(AssertSqlSafe(format!(
            "UPDATE sessions SET state = ?2, updated_at = ?3 WHERE id = ?1 AND state IN ({list}) AND (?4 IS NULL OR owner IS NULL OR owner = ?4)"
        )))
        .bind(id)
        .bind(to.as_str())
        .bind(now_ms())
        .bind(owner)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    /// Records the container of a session; one it names was created for it (cold).
    pub async fn set_container(
        &self,
        id: &str,
        container_id: Option<&str>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE sessions SET container_id = ?2, launch = CASE WHEN ?2 IS NULL THEN launch ELSE 'cold' END, updated_at = ?3 WHERE id = ?1")
            .bind(id)
            .bind(container_id)
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Records that session `id`'s workspace came from a snapshot (its launch `restored`).
    pub async fn set_restored(&self, id: &str) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE sessions SET launch = 'restored', updated_at = ?2 WHERE id = ?1")
            .bind(id)
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Counts `bytes` of checkpoint against the workspace budget for session `id`, when they
    /// fit `budget` (`None`: no budget) beside every workspace and checkpoint the host holds,
    /// in one statement (SQLite serialises writers, so a concurrent open cannot overshoot).
    /// False: they do not fit, and nothing changed.
    pub async fn hold_checkpoint(
        &self,
        id: &str,
        bytes: u64,
        budget: Option<u64>,
    ) -> Result<bool, sqlx::Error> {
        let updated = sqlx::query(AssertSqlSafe(format!(
            "UPDATE sessions SET checkpoint_bytes = ?2 WHERE id = ?1
               AND (SELECT coalesce(sum(disk_bytes + checkpoint_bytes), 0) FROM sessions
                    WHERE {DISK_SQL} AND id <> ?1) + disk_bytes + ?2 <= ?3"
        )))
        .bind(id)
        .bind(i64::try_from(bytes).unwrap_or(i64::MAX))
        .bind(budget.map_or(i64::MAX, |b| i64::try_from(b).unwrap_or(i64::MAX)))
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(updated == 1)
    }

    /// Session `id`'s checkpoint is gone (restored, dropped, or removed with its container):
    /// it no longer counts against the budget.
    pub async fn release_checkpoint(&self, id: &str) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE sessions SET checkpoint_bytes = 0 WHERE id = ?1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Records what session `id`'s last checkpoint or restore did (JSON).
    pub async fn set_memory(&self, id: &str, memory: &str) -> Result<(), sqlx::Error> {
        self.update("UPDATE sessions SET memory = ?2 WHERE id = ?1", id, memory)
            .await
    }

    /// Records the ports session `id` has open.
    pub async fn set_ports(&self, id: &str, ports: &[u16]) -> Result<(), sqlx::Error> {
        let json = serde_json::to_string(ports).unwrap_or_else(|_| "[]".to_owned());
        self.update("UPDATE sessions SET ports = ?2 WHERE id = ?1", id, &json)
            .await
    }

    /// Records the further egress policies session `id`'s open named (JSON).
    pub async fn set_egress(&self, id: &str, egress: &str) -> Result<(), sqlx::Error> {
        self.update("UPDATE sessions SET egress = ?2 WHERE id = ?1", id, egress)
            .await
    }

    /// One update of session `id` (`?1`) with one text value (`?2`).
    async fn update(&self, sql: &'static str, id: &str, value: &str) -> Result<(), sqlx::Error> {
        sqlx::query(sql)
            .bind(id)
            .bind(value)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Every session's runtime and further egress policies (JSON), for the egress gate at start.
    pub async fn egress_all(&self) -> Result<Vec<(String, String, String)>, sqlx::Error> {
        let rows = sqlx::query("SELECT id, runtime, egress FROM sessions")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get("id")?,
                    r.try_get("runtime")?,
                    r.try_get("egress")?,
                ))
            })
            .collect()
    }

    /// Counts `bytes` as the size of session `id`'s disk, if the host's workspaces with it fit
    /// `budget`; false (nothing changed) when they do not.
    pub async fn grow_disk_bytes(
        &self,
        id: &str,
        bytes: u64,
        budget: Option<u64>,
    ) -> Result<bool, sqlx::Error> {
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        let done = sqlx::query(AssertSqlSafe(format!(
            "UPDATE sessions SET disk_bytes = ?2
             WHERE id = ?1
               AND (SELECT coalesce(sum(disk_bytes + checkpoint_bytes), 0) FROM sessions WHERE {DISK_SQL}) - disk_bytes + ?2 <= ?3"
        )))
        .bind(id)
        .bind(bytes)
        .bind(budget.map_or(i64::MAX, |b| i64::try_from(b).unwrap_or(i64::MAX)))
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(done == 1)
    }

    /// Records what a session's next container is made of: its image, and (a rebuild) its
    /// limits as JSON.
    pub async fn set_image(
        &self,
        id: &str,
        image: &str,
        limits: Option<&str>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE sessions SET image = ?2, limits = coalesce(?3, limits), updated_at = ?4 WHERE id = ?1",
        )
        .bind(id)
        .bind(image)
        .bind(limits)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records a container taken from a warm pool as an opening session's, and makes the
    /// session running, in one write; false when the session is no longer opening.
    pub async fn set_warm_running(
        &self,
        id: &str,
        container_id: &str,
    ) -> Result<bool, sqlx::Error> {
        let n = sqlx::query(
            "UPDATE sessions SET container_id = ?2, launch = 'warm', state = 'running', updated_at = ?3 WHERE id = ?1 AND state = 'opening'",
        )
        .bind(id)
        .bind(container_id)
        .bind(now_ms())
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    /// Replaces a session's token hash; the tokens granted on attaches end with it.
    pub async fn set_token_hash(&self, id: &str, hash: &str) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE sessions SET token_hash = ?2, updated_at = ?3 WHERE id = ?1")
            .bind(id)
            .bind(hash)
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        sqlx::query("DELETE FROM session_tokens WHERE session_id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Adds a token (its hash) to a session beside the ones it has; false when there is no
    /// such session.
    pub async fn add_token_hash(&self, id: &str, hash: &str) -> Result<bool, sqlx::Error> {
        Ok(sqlx::query(
            "INSERT INTO session_tokens (token_hash, session_id, created_at)
             SELECT ?2, id, ?3 FROM sessions WHERE id = ?1",
        )
        .bind(id)
        .bind(hash)
        .bind(now_ms())
        .execute(&self.pool)
        .await?
        .rows_affected()
            == 1)
    }

    /// Gives a session without an owner to `owner` (a session from before owners is adopted
    /// by the first owner that opens it); returns the row as it is after, `None` when there
    /// is no such session. A row that has an owner keeps it.
    pub async fn adopt(&self, id: &str, owner: &str) -> Result<Option<SessionRow>, sqlx::Error> {
        sqlx::query(
            "UPDATE sessions SET owner = ?2, updated_at = ?3 WHERE id = ?1 AND owner IS NULL",
        )
        .bind(id)
        .bind(owner)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        self.get(id).await
    }

    /// Marks activity now.
    pub async fn touch(&self, id: &str) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE sessions SET last_activity_at = ?2 WHERE id = ?1")
            .bind(id)
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Removes a session row (and every token granted for it); true when there was one.
    pub async fn delete(&self, id: &str) -> Result<bool, sqlx::Error> {
        sqlx::query("DELETE FROM session_tokens WHERE session_id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(sqlx::query("DELETE FROM sessions WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?
            .rows_affected()
            == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new<'a>(id: &'a str, tenant: &'a str, hash: &'a str) -> NewSession<'a> {
        NewSession {
            id,
            tenant,
            runtime: "base",
            image: "img",
            token_hash: hash,
            limits: "{}",
            owner: None,
            disk_bytes: 0,
        }
    }

    #[tokio::test]
    async fn claims_respect_both_caps_and_ids() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).await.expect("store");
        let caps = Caps::sessions(3, 2);
        assert_eq!(
            store
                .claim(&new("a", "t1", "h1"), caps)
                .await
                .expect("claim"),
            Claim::Inserted
        );
        assert!(
            matches!(store.claim(&new("a", "t1", "h9"), caps).await.expect("claim"), Claim::Exists(r) if r.token_hash == "h1")
        );
        assert_eq!(
            store
                .claim(&new("b", "t1", "h2"), caps)
                .await
                .expect("claim"),
            Claim::Inserted
        );
        assert_eq!(
            store
                .claim(&new("c", "t1", "h3"), caps)
                .await
                .expect("claim"),
            Claim::TenantCap { held: 2 }
        );
        assert_eq!(
            store
                .claim(&new("c", "t2", "h3"), caps)
                .await
                .expect("claim"),
            Claim::Inserted
        );
        assert_eq!(
            store
                .claim(&new("d", "t3", "h4"), caps)
                .await
                .expect("claim"),
            Claim::HostCap { held: 3 }
        );
        // A reclaimed session holds no slot.
        assert!(
            store
                .transition("a", &[State::Opening], State::Reclaimed)
                .await
                .expect("t")
        );
        assert_eq!(
            store
                .claim(&new("d", "t3", "h4"), caps)
                .await
                .expect("claim"),
            Claim::Inserted
        );
        assert_eq!(
            store.reclaim_to_opening("a", "t1", caps).await.expect("r"),
            Some(Claim::HostCap { held: 3 })
        );
    }

    #[tokio::test]
    async fn workspaces_count_against_the_budget_until_destroyed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).await.expect("store");
        let caps = Caps {
            max_sessions: 100,
            max_per_tenant: 100,
            max_workspaces_per_tenant: 3,
            workspace_budget: Some(100),
        };
        let sized = |id: &'static str, tenant: &'static str, disk_bytes: u64| NewSession {
            disk_bytes,
            ..new(id, tenant, id)
        };
        for id in ["a1", "a2"] {
            assert_eq!(
                store.claim(&sized(id, "a", 40), caps).await.expect("claim"),
                Claim::Inserted
            );
        }
        // Reclaimed and asleep workspaces keep their disks: they still count.
        assert!(
            store
                .transition("a1", &[State::Opening], State::Reclaimed)
                .await
                .expect("transition")
        );
        assert_eq!(
            store
                .claim(&sized("b1", "b", 40), caps)
                .await
                .expect("claim"),
            Claim::Budget {
                held: 80,
                workspaces: 2
            }
        );
        assert_eq!(
            store
                .claim(&sized("b1", "b", 20), caps)
                .await
                .expect("claim"),
            Claim::Inserted
        );
        // The tenant's own cap on workspaces counts every state but lost.
        assert_eq!(
            store
                .claim(&sized("a3", "a", 0), caps)
                .await
                .expect("claim"),
            Claim::Inserted
        );
        assert_eq!(
            store
                .claim(&sized("a4", "a", 0), caps)
                .await
                .expect("claim"),
            Claim::TenantWorkspaces { held: 3 }
        );
        // A destroyed workspace gives its bytes back; a lost one holds none.
        assert!(store.delete("a2").await.expect("delete"));
        assert!(
            store
                .transition("a1", &[State::Reclaimed], State::Lost)
                .await
                .expect("transition")
        );
        let held = store.held("a").await.expect("held");
        assert_eq!(
            (
                held.workspaces,
                held.workspace_bytes,
                held.tenant_workspaces
            ),
            (2, 20, 1)
        );
        assert_eq!(
            store
                .claim(&sized("b2", "b", 80), caps)
                .await
                .expect("claim"),
            Claim::Inserted
        );
        // A disk grown by a rebuild counts with its new size, within the budget only.
        assert!(
            !store
                .grow_disk_bytes("b2", 81, Some(100))
                .await
                .expect("grow")
        );
        assert!(
            store
                .grow_disk_bytes("b1", 20, Some(100))
                .await
                .expect("grow")
        );
        assert_eq!(store.held("b").await.expect("held").workspace_bytes, 100);
    }

    #[tokio::test]
    async fn owners_are_adopted_once_and_guard_transitions() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).await.expect("store");
        let caps = Caps::sessions(3, 3);
        store
            .claim(&new("a", "t", "h1"), caps)
            .await
            .expect("claim");
        let owned = NewSession {
            owner: Some("uid-b"),
            disk_bytes: 0,
            ..new("b", "t", "h2")
        };
        store.claim(&owned, caps).await.expect("claim");
        // Without an owner: the first adopts it, a second does not.
        let a = store
            .adopt("a", "uid-1")
            .await
            .expect("adopt")
            .expect("row");
        assert_eq!(a.owner.as_deref(), Some("uid-1"));
        let a = store
            .adopt("a", "uid-2")
            .await
            .expect("adopt")
            .expect("row");
        assert_eq!(a.owner.as_deref(), Some("uid-1"));
        assert_eq!(store.adopt("nope", "uid-1").await.expect("adopt"), None);
        // A transition for another owner changes nothing; for its own it does.
        let all = [State::Opening];
        assert!(
            !store
                .transition_owned("b", &all, State::Destroying, "uid-x")
                .await
                .expect("t")
        );
        assert_eq!(
            store.get("b").await.expect("get").map(|r| r.state),
            Some(State::Opening)
        );
        assert!(
            store
                .transition_owned("b", &all, State::Destroying, "uid-b")
                .await
                .expect("t")
        );
    }

    #[tokio::test]
    async fn transitions_are_guarded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).await.expect("store");
        let caps = Caps::sessions(3, 2);
        store
            .claim(&new("a", "t1", "h1"), caps)
            .await
            .expect("claim");
        assert!(
            store
                .transition("a", &[State::Opening], State::Running)
                .await
                .expect("t")
        );
        assert!(
            !store
                .transition("a", &[State::Opening], State::Running)
                .await
                .expect("t"),
            "a second mover must lose"
        );
        assert_eq!(
            store.get("a").await.expect("get").map(|r| r.state),
            Some(State::Running)
        );
        assert!(store.delete("a").await.expect("delete"));
        assert!(!store.delete("a").await.expect("delete"));
    }
}
