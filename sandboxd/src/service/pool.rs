//! Warm pools: per runtime, started sandboxes with no tenant and an empty workspace of their
//! own, so that an open takes one instead of creating and starting a container.
//!
//! - A pooled container is made exactly as a session's ([`Core::sandbox_spec`]: the same image,
//!   uid, limits of a session opened with none given, network only when the runtime asks, the
//!   agent as PID 1), named `warm-<random>` and labelled [`LABEL_POOL`]. Its folder is
//!   `<workspace root>/.pool/<name>/` (its `workspace/` and the agent's `agent/`), on the
//!   same filesystem as the sessions' folders.
//! - An open takes one when its runtime's definition and the shape of its sandbox (CPUs,
//!   memory, processes) are the pool's, and the session needs no workspace disk of its own.
//!   Taking it out of the pool happens under the pool's lock, so no container is handed out
//!   twice, and a container is only ever used once. The claim renames the pool folder into the
//!   session's place (`rename(2)`: the bind mounts follow the directory) and records the
//!   container with `launch = 'warm'`; Docker's rename of the container to the session's name
//!   follows in the background once the session's first run is done. Anything that fails on
//!   the way falls back to a cold start.
//! - Because a warm container's bind mounts name the pool folder's old path, it is never
//!   started again: a wake of a session whose warm container stopped replaces it.
//! - Capacity: pooled containers are counted with the sessions that hold a slot (opening,
//!   running, stopped) against `max_sessions`. A pool fills only into free capacity, one
//!   container at a time, in the background, holding back while a session that just took a
//!   container has not finished its first run (at most [`FIRST_RUN_GRACE`]); a cold open
//!   that would take the host past `max_sessions` removes pooled containers first.
//! - Disks: on a host that gives each workspace a disk of its own
//!   (`SANDBOXD_WORKSPACE_QUOTA=loop`), a pooled container's `workspace/` is such a disk, made
//!   and mounted before the container starts, of the size a session of its runtime opened with
//!   no `workspace_size` gets. An open takes it only when its own size is that size; the
//!   claim's rename carries the disk along (its image is in the folder, its mount point moves
//!   with its parent). Pooled disks are unmounted before their folders are discarded.
//! - A runtime whose definition changes, or that leaves the allowlist, loses its pooled
//!   containers (and their folders); a pool larger than its size is cut down. At start, the
//!   reconcile removes every pooled container of this instance that no session holds, and the
//!   pool folder is emptied.
//!
//! Over 600 lines with its tests: the pool's whole life (fill, take, drain, the start's
//! clean-up) in one place.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use sandboxd_api::runtimes::RuntimeList;
use sandboxd_api::session::Launch;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::container::Engine;
use crate::metrics::RuntimeLabel;
use crate::runtimes::RuntimeImage;
use crate::service::{Core, Limits, ServiceError};
use crate::storage::store::Store;
use crate::workspace::Workspace;
use crate::workspace::disk::Disks;

pub use crate::container::docker::LABEL_POOL;

/// The folder of the pooled containers' folders, in the workspace root.
pub const POOL_FOLDER: &str = ".pool";

/// How often the filler looks again when nothing told it to.
const TICK: Duration = Duration::from_secs(1);

/// How long the pool's own Docker work (a refill, the rename of a taken container) holds back for
/// a session that just took a pooled container: until that session's first run is done, and
/// never longer than this. Its first command follows the open within milliseconds (the
/// operator's Running, then the platform's run), and a container start beside it on the same
/// cores doubles it (see `docs/benchmarks.md`).
const FIRST_RUN_GRACE: Duration = Duration::from_millis(250);

/// The longest pause after pooled containers failed to start.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// CPUs, memory in bytes and processes: what a sandbox's limits come to.
type Shape = (f64, i64, i64);

/// One started container waiting in a pool.
#[derive(Debug, Clone)]
struct Pooled {
    /// The pool's name for it: its session label and its folder's name.
    name: String,
    /// The container id.
    container: String,
    /// The runtime it was made for, as it was then.
    runtime: RuntimeImage,
    /// Its CPUs, memory and processes.
    shape: Shape,
    /// The size of its workspace disk; `None` on a host whose workspaces have none.
    disk: Option<u64>,
}

/// The warm pools of one sandboxd.
pub struct Pool {
    dir: PathBuf,
    ready: Mutex<Vec<Pooled>>,
    changed: Arc<Notify>,
    first_runs: Arc<FirstRuns>,
}

/// The sessions that took a pooled container and have not finished a run yet, with when they
/// took it: the pool's own Docker work waits for them (see [`FIRST_RUN_GRACE`]).
#[derive(Default)]
struct FirstRuns {
    taken: Mutex<HashMap<String, Instant>>,
    ran: Notify,
}

impl FirstRuns {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.taken.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until every session that took a pooled container before this call has finished a
    /// run, or [`FIRST_RUN_GRACE`] has passed since it took it; never longer than the grace from
    /// now, whatever is taken meanwhile.
    async fn settled(&self) {
        let called = Instant::now();
        let limit = called + FIRST_RUN_GRACE;
        loop {
            let ran = self.ran.notified();
            tokio::pin!(ran);
            ran.as_mut().enable();
            let until = {
                let mut taken = self.lock();
                let now = Instant::now();
                taken.retain(|_, at| now < *at + FIRST_RUN_GRACE);
                taken
                    .values()
                    .filter(|at| **at <= called)
                    .map(|at| *at + FIRST_RUN_GRACE)
                    .max()
            };
            let Some(until) = until else { return };
            tokio::select! {
                () = tokio::time::sleep_until(until.min(limit)) => {}
                () = ran => {}
            }
            if Instant::now() >= limit {
                return;
            }
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// The pools of a host whose workspaces are under `workspace_root`; empty until
    /// [`spawn`] starts filling them.
    pub fn new(workspace_root: &Path) -> Self {
        Self {
            dir: workspace_root.join(POOL_FOLDER),
            ready: Mutex::default(),
            changed: Arc::default(),
            first_runs: Arc::default(),
        }
    }

    /// Session `id` finished a run: what the pool held back for its first one may go on.
    pub fn ran(&self, id: &str) {
        if self.first_runs.lock().remove(id).is_some() {
            self.first_runs.ran.notify_waiters();
        }
    }

    /// Tells the filler to look now (the allowlist changed, a container was taken).
    pub fn changed(&self) {
        self.changed.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Pooled>> {
        self.ready.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Pooled containers of `runtime`, as it is defined now, ready to be taken.
    pub fn ready(&self, runtime: &RuntimeImage) -> u32 {
        let n = self.lock().iter().filter(|p| p.runtime == *runtime).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Every pooled container, of every runtime.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no container waits in any pool.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Takes a container of `runtime` with `shape` and a workspace disk of `disk` out of its
    /// pool: from here on it is the caller's alone.
    fn take(&self, runtime: &RuntimeImage, shape: Shape, disk: Option<u64>) -> Option<Pooled> {
        let mut ready = self.lock();
        let i = ready
            .iter()
            .position(|p| p.runtime == *runtime && p.shape == shape && p.disk == disk)?;
        Some(ready.swap_remove(i))
    }

    /// Takes the containers `drop` picks out of the pools.
    fn take_where(&self, mut drop: impl FnMut(&Pooled) -> bool) -> Vec<Pooled> {
        let mut ready = self.lock();
        let (out, keep): (Vec<_>, Vec<_>) = ready.drain(..).partition(|p| drop(p));
        *ready = keep;
        out
    }

    fn folder(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The workspace disks of the pooled containers' folders.
    fn disks(&self, uid: u32) -> Disks {
        Disks::new(&self.dir, uid)
    }
}

/// The allowlist as `GET /v1/runtimes` shows it, with each runtime's warm pool.
pub fn runtime_list(core: &Core) -> RuntimeList {
    let mut list = core.runtimes().list();
    list.isolation = core.isolation();
    for rt in &mut list.runtimes {
        rt.warm_pool.ready = core
            .runtimes()
            .ready(&rt.alias)
            .map_or(0, |image| core.pool().ready(&image));
    }
    list
}

/// Starts session `id`'s sandbox: on a container of its runtime's warm pool when one fits
/// (see the module docs), else cold ([`Core::create_container`]), after making room for it
/// among the pooled containers. An open of a runtime that keeps a pool which is empty is
/// counted (`sandboxd_warm_pool_empty_opens_total`): the pool does not keep up.
pub(crate) async fn open(
    core: &Core,
    id: &str,
    tenant: &str,
    runtime: &RuntimeImage,
    limits: &Limits,
) -> Result<Launch, ServiceError> {
    {
        let shape = core.shape(runtime, limits);
        let disk = core.workspace_size_of(runtime, limits);
        while let Some(pooled) = core.pool().take(runtime, shape, disk) {
            // The refill starts once the claim is done: it would hold dockerd meanwhile.
            let claimed = claim(core, id, &pooled).await;
            core.pool().changed();
            match claimed {
                Ok(()) => {
                    publish(core);
                    info!(session = id, tenant, runtime = %runtime.alias, container = %pooled.name, "session opened on a warm container");
                    return Ok(Launch::Warm);
                }
                Err(Claimed::Changed(e)) => return Err(e),
                Err(Claimed::Failed(why)) => {
                    warn!(session = id, container = %pooled.name, error = %why, "a warm container could not be taken; trying another or a cold start");
                }
            }
        }
        publish(core);
        // No container fitted; when none was there at all, the pool did not keep up.
        let keeps_pool = core
            .runtimes()
            .warm_pools()
            .iter()
            .any(|(alias, size, _)| *alias == runtime.alias && *size > 0);
        if keeps_pool && core.pool().ready(runtime) == 0 {
            core.metrics()
                .warm_pool_empty_opens
                .get_or_create(&RuntimeLabel {
                    runtime: runtime.alias.clone(),
                })
                .inc();
        }
    }
    make_room(core).await;
    core.create_container(id, tenant, runtime, limits)
        .await
        .map(|()| Launch::Cold)
}

/// Why a claim did not give the session its container.
enum Claimed {
    /// The session changed while it opened: the open fails as a cold one would.
    Changed(ServiceError),
    /// The container or its folder could not be taken (it is removed); open otherwise.
    Failed(String),
}

/// Gives `pooled` to session `id`: the pool folder takes the session's place and the row the
/// container; Docker's rename of the container to the session's name (the slow part) follows
/// in the background ([`rename`]). Whatever fails removes the container and whatever is left of
/// its folder (nothing of the session is in it yet).
async fn claim(core: &Core, id: &str, pooled: &Pooled) -> Result<(), Claimed> {
    let target = core.settings().workspace_root.join(id);
    let recorded = async {
        std::fs::rename(core.pool().folder(&pooled.name), &target).map_err(|e| {
            Claimed::Failed(format!(
                "cannot move its folder to {}: {e}",
                target.display()
            ))
        })?;
        // The agent's run folder came with the folder; this forgets whatever the run path
        // remembered of an earlier container of this name and checks the folder is root's.
        core.runner()
            .agent_mount(id)
            .map_err(|e| Claimed::Failed(format!("cannot check the agent folder: {e}")))?;
        // A container that vanished from the pool is never recorded as a session's. The run
        // path learns the agent's PID 1 from this same look (no inspect on the first run).
        match core.runner().taken(id, &pooled.container).await {
            Ok(true) => {}
            Ok(false) => return Err(Claimed::Failed("it no longer runs".to_owned())),
            Err(e) => return Err(Claimed::Failed(e)),
        }
        match core.store().set_warm_running(id, &pooled.container).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Claimed::Changed(ServiceError::ChangedWhileOpening {
                id: id.to_owned(),
            })),
            Err(e) => Err(Claimed::Changed(ServiceError::Store(e))),
        }
    }
    .await;
    match recorded {
        Ok(()) => {
            let first_runs = core.pool().first_runs.clone();
            first_runs.lock().insert(id.to_owned(), Instant::now());
            tokio::spawn(rename(
                first_runs,
                core.engine().clone(),
                core.store().clone(),
                id.to_owned(),
                pooled.container.clone(),
            ));
            Ok(())
        }
        Err(failure) => {
            discard(core, pooled).await;
            if matches!(failure, Claimed::Failed(_)) && std::fs::symlink_metadata(&target).is_ok() {
                // The folder took the session's place: its disk, if it has one, goes first.
                if let Err(e) = core.disks.unmount(id) {
                    warn!(session = id, error = %e, "cannot unmount a failed claim's disk");
                }
                let _ = core
                    .trash()
                    .discard(&target, &format!("{}-claim", pooled.name));
            }
            Err(failure)
        }
    }
}

/// Renames session `id`'s warm container to the session's container name, which whatever
/// finds a session's container by name (a look at `docker ps`, the run path without the row's
/// container id) uses. The run path checks a run's agent by the container id of the row, so
/// nothing waits for this; it waits for the session's first run ([`FIRST_RUN_GRACE`] at most).
/// A container the session no longer holds is left as it is; one that
/// holds the name without being the session's (left by a failed open) is removed first.
async fn rename(
    first_runs: Arc<FirstRuns>,
    engine: Engine,
    store: Store,
    id: String,
    container: String,
) {
    first_runs.settled().await;
    let name = engine.container_name(&id);
    let mine = || async {
        store
            .get(&id)
            .await
            .ok()
            .flatten()
            .is_some_and(|r| r.container_id.as_deref() == Some(container.as_str()))
    };
    let result = match engine.rename(&container, &name).await {
        Err(e) if e.is_conflict() && mine().await => {
            let _ = engine.remove(&name).await;
            engine.rename(&container, &name).await
        }
        other => other,
    };
    if let Err(e) = result
        && !e.is_not_found()
        && mine().await
    {
        warn!(session = %id, error = %e, "the warm container keeps its pool name");
    }
}

/// Removes a pooled container and its folder (its disk unmounted first).
async fn discard(core: &Core, pooled: &Pooled) {
    if let Err(e) = core.engine().remove(&pooled.container).await {
        warn!(container = %pooled.name, error = %e, "cannot remove a pooled container");
    }
    discard_folder(core, &pooled.name);
}

/// Removes a pooled container's folder, unmounting its workspace disk first.
fn discard_folder(core: &Core, name: &str) {
    if let Err(e) = core.pool().disks(core.settings().uid).unmount(name) {
        warn!(container = %name, error = %e, "cannot unmount a pooled container's disk");
    }
    if let Err(e) = core.trash().discard(&core.pool().folder(name), name) {
        warn!(container = %name, error = %e, "cannot remove a pooled container's folder");
    }
}

/// Sessions holding a slot on this host.
async fn held(core: &Core) -> Option<usize> {
    match core.store().held("").await {
        Ok(held) => Some(held.sessions as usize),
        Err(e) => {
            warn!(error = %e, "cannot count the sessions for the warm pools");
            None
        }
    }
}

/// Removes pooled containers while they and the sessions holding a slot (this open's among
/// them) are more than the host's `max_sessions`.
async fn make_room(core: &Core) {
    if core.pool().is_empty() {
        return;
    }
    let Some(held) = held(core).await else { return };
    let max = core.caps().max_sessions as usize;
    let over = (held + core.pool().len()).saturating_sub(max);
    if over == 0 {
        return;
    }
    let mut left = over;
    let evicted = core.pool().take_where(|_| {
        let pick = left > 0;
        left = left.saturating_sub(1);
        pick
    });
    for pooled in &evicted {
        discard(core, pooled).await;
    }
    debug!(
        evicted = evicted.len(),
        "pooled containers removed to make room for a cold open"
    );
    core.pool().changed();
    publish(core);
}

/// Sets the warm pool metrics: size, ready and memory per runtime.
fn publish(core: &Core) {
    let m = core.metrics();
    m.warm_pool_size.clear();
    m.warm_pool_ready.clear();
    m.warm_pool_memory.clear();
    let ready = core.pool().lock().clone();
    for (alias, size, _) in core.runtimes().warm_pools() {
        if size == 0 && !ready.iter().any(|p| p.runtime.alias == alias) {
            continue;
        }
        let label = RuntimeLabel {
            runtime: alias.clone(),
        };
        let mine = ready.iter().filter(|p| p.runtime.alias == alias);
        let _ = m.warm_pool_empty_opens.get_or_create(&label);
        m.warm_pool_size.get_or_create(&label).set(i64::from(size));
        m.warm_pool_ready
            .get_or_create(&label)
            .set(i64::try_from(mine.clone().count()).unwrap_or(i64::MAX));
        m.warm_pool_memory
            .get_or_create(&label)
            .set(mine.map(|p| p.shape.1).sum());
    }
}

/// Starts filling the pools in the background, after clearing the pool folder of an earlier
/// run (the start-up reconcile removed its containers; their disks are unmounted here). The
/// task ends with the core.
pub fn spawn(core: &Arc<Core>) {
    let dir = core.pool().dir.clone();
    // Only when there is one: a discard makes the trash folder, and a host that never kept a
    // pool has no business making it at start (nor failing to, when it cannot be made).
    if std::fs::symlink_metadata(&dir).is_ok() {
        let disks = core.pool().disks(core.settings().uid);
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Err(e) = disks.unmount(&name) {
                warn!(container = %name, error = %e, "cannot unmount the disk of an earlier run's pooled container");
            }
        }
        match core.trash().discard(&dir, POOL_FOLDER) {
            Ok(true) => info!("the warm pool folder of an earlier run was removed"),
            Ok(false) => {}
            Err(e) => warn!(error = %e, "cannot remove the warm pool folder of an earlier run"),
        }
    }
    let changed = core.pool().changed.clone();
    let weak = Arc::downgrade(core);
    tokio::spawn(fill(weak, changed));
}

async fn fill(core: Weak<Core>, changed: Arc<Notify>) {
    let mut failures = 0u32;
    loop {
        let pause = {
            let Some(core) = core.upgrade() else { return };
            let first_runs = core.pool().first_runs.clone();
            first_runs.settled().await;
            match fill_once(&core).await {
                Ok(true) => {
                    failures = 0;
                    Duration::ZERO
                }
                Ok(false) => {
                    failures = 0;
                    TICK
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let pause = TICK
                        .saturating_mul(2u32.saturating_pow(failures.min(6)))
                        .min(MAX_BACKOFF);
                    warn!(error = %e, retry_in_s = pause.as_secs(), "a warm pool container could not be started");
                    pause
                }
            }
        };
        if pause.is_zero() {
            tokio::task::yield_now().await;
        } else {
            let _ = tokio::time::timeout(pause, changed.notified()).await;
        }
    }
}

/// One pass: drains what no longer belongs in a pool, then starts at most one container.
/// Returns whether there is more to fill at once.
async fn fill_once(core: &Core) -> Result<bool, String> {
    let wanted: HashMap<String, (u32, Option<RuntimeImage>)> = core
        .runtimes()
        .warm_pools()
        .into_iter()
        .map(|(alias, size, image)| (alias, (size, image)))
        .collect();
    let default_shape = |rt: &RuntimeImage| core.shape(rt, &Limits::default());
    let default_disk = |rt: &RuntimeImage| core.workspace_size_of(rt, &Limits::default());
    // Drain: runtimes gone or changed, pools above their size.
    let mut kept: HashMap<String, u32> = HashMap::new();
    let stale = core.pool().take_where(|p| {
        let fits = wanted.get(&p.runtime.alias).is_some_and(|(size, image)| {
            image.as_ref() == Some(&p.runtime)
                && p.shape == default_shape(&p.runtime)
                && p.disk == default_disk(&p.runtime)
                && kept.get(&p.runtime.alias).copied().unwrap_or(0) < *size
        });
        if fits {
            *kept.entry(p.runtime.alias.clone()).or_default() += 1;
        }
        !fits
    });
    for pooled in &stale {
        info!(runtime = %pooled.runtime.alias, container = %pooled.name, "pooled container drained");
        discard(core, pooled).await;
    }
    publish(core);
    // A host whose max_sessions went down (PUT /v1/policy) keeps only what fits.
    make_room(core).await;
    // Fill: one container of the first runtime short of its size, within the capacity.
    let Some((runtime, _)) = core
        .runtimes()
        .warm_pools()
        .into_iter()
        .filter_map(|(alias, size, image)| {
            let image = image?;
            (kept.get(&alias).copied().unwrap_or(0) < size).then_some((image, size))
        })
        .next()
    else {
        return Ok(false);
    };
    let Some(holding) = held(core).await else {
        return Ok(false);
    };
    if holding + core.pool().len() >= core.caps().max_sessions as usize {
        return Ok(false);
    }
    let pooled = start(core, &runtime).await?;
    // Still wanted, and still room for it, now that it runs?
    let still = core
        .runtimes()
        .warm_pools()
        .into_iter()
        .find(|(alias, _, _)| *alias == runtime.alias)
        .is_some_and(|(_, size, image)| {
            image.as_ref() == Some(&runtime) && core.pool().ready(&runtime) < size
        });
    let room = held(core)
        .await
        .is_some_and(|h| h + core.pool().len() < core.caps().max_sessions as usize);
    if still && room {
        debug!(runtime = %runtime.alias, container = %pooled.name, "pooled container ready");
        core.pool().lock().push(pooled);
        publish(core);
        Ok(true)
    } else {
        discard(core, &pooled).await;
        Ok(false)
    }
}

/// Starts one pooled container of `runtime` in a folder of its own.
async fn start(core: &Core, runtime: &RuntimeImage) -> Result<Pooled, String> {
    let name = format!("warm-{}", hex::encode(rand::random::<[u8; 12]>()));
    let folder = core.pool().folder(&name);
    let disk = core.workspace_size_of(runtime, &Limits::default());
    let made = async {
        if let Some(size) = disk {
            let disks = core.pool().disks(core.settings().uid);
            let name = name.clone();
            tokio::task::spawn_blocking(move || disks.create(&name, size))
                .await
                .map_err(|e| format!("the disk task failed: {e}"))?
                .map_err(|e| format!("cannot make its workspace disk: {e}"))?;
        }
        let workspace = Workspace::new(
            folder.join("workspace"),
            core.settings().uid,
            core.settings().uid,
        );
        workspace
            .prepare()
            .map_err(|e| format!("cannot make its workspace folder: {e}"))?;
        let limits = Limits::default();
        let spec = core
            .sandbox_spec(
                &name,
                &format!("{POOL_FOLDER}/{name}"),
                "",
                runtime,
                &limits,
                &workspace,
            )
            .await
            .map_err(|e| e.to_string())?;
        let container = core
            .engine()
            .create_pooled(&spec, &runtime.alias)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(Pooled {
            name: name.clone(),
            container,
            runtime: runtime.clone(),
            shape: (spec.cpus, spec.memory, spec.pids_limit),
            disk,
        })
    }
    .await;
    if made.is_err() {
        discard_folder(core, &name);
    }
    made.map_err(|e| format!("runtime '{}': {e}", runtime.alias))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sandboxd_api::SessionState as State;
    use sandboxd_api::session::Launch;

    /// What the pool holds back for a session's first run ends with that run, or after the
    /// grace; a session taken later never stretches a wait already under way.
    #[tokio::test(start_paused = true)]
    async fn the_pool_holds_back_for_a_first_run_until_it_is_done_or_the_grace_is_over() {
        use super::{FIRST_RUN_GRACE, FirstRuns};
        use std::sync::Arc;
        use tokio::time::Instant;

        let runs = Arc::new(FirstRuns::default());
        // Nothing taken: no wait.
        let at = Instant::now();
        runs.settled().await;
        assert_eq!(at.elapsed(), Duration::ZERO);

        // Taken, then run after 40 ms: the wait ends with the run.
        runs.lock().insert("s-1".to_owned(), Instant::now());
        let waiting = tokio::spawn({
            let runs = runs.clone();
            async move {
                let at = Instant::now();
                runs.settled().await;
                at.elapsed()
            }
        });
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(!waiting.is_finished(), "it waits for the first run");
        runs.lock().remove("s-1");
        runs.ran.notify_waiters();
        let waited = waiting.await.expect("the wait");
        assert_eq!(waited, Duration::from_millis(40));

        // Taken and never run, while others keep being taken: the wait is the grace, no more.
        runs.lock().insert("s-2".to_owned(), Instant::now());
        let at = Instant::now();
        let keep_taking = tokio::spawn({
            let runs = runs.clone();
            async move {
                for i in 0..20 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    runs.lock().insert(format!("later-{i}"), Instant::now());
                }
            }
        });
        runs.settled().await;
        assert_eq!(at.elapsed(), FIRST_RUN_GRACE);
        keep_taking.abort();
    }

    /// The operator bench's no-op engine keeps a pool too: an open takes a pooled record,
    /// renamed to the session's, and a wake after a sleep replaces it.
    #[tokio::test]
    async fn the_noop_engine_keeps_a_warm_pool() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let catalog = r#"[{"alias": "base", "image": "never-pulled:1", "warm_pool": 2}]"#;
        let sandboxd = crate::server::noop::Noop::start(dir.path(), "noop-pool", catalog).await;
        let admin = sandboxd.admin.clone();
        let ready = || async {
            let list = admin.runtimes().await.expect("runtimes");
            list.runtimes[0].warm_pool
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while ready().await.ready < 2 {
            assert!(tokio::time::Instant::now() < deadline, "the pool fills");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(ready().await.size, 2);

        let opened = admin.open("s1", "org", None, None).await.expect("open");
        assert_eq!(
            (opened.session.state, opened.session.launch),
            (State::Running, Launch::Warm)
        );
        assert!(dir.path().join("workspaces/s1/workspace").is_dir());
        assert_eq!(admin.stop("s1").await.expect("stop").state, State::Stopped);
        let woken = admin.start("s1").await.expect("start");
        assert_eq!((woken.state, woken.launch), (State::Running, Launch::Cold));
        assert!(admin.destroy("s1").await.expect("destroy").destroyed);
        sandboxd.stop().await;
    }
}
