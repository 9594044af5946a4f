//! The MCP tools of a session and its file resources: each is the run or the file operation
//! it stands for, through the same core, caps and audit log as `/v1` (a `run` is a run row, a
//! `read_file` a read, an `edit_file` a read and a write, a `glob` or `grep` the run of the
//! `find` or `grep` it made), answered with the seed console's words ([`super::text`]).

use std::collections::HashMap;
use std::time::Instant;

use base64::Engine as _;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::text::{self, GrepMode};
use crate::http::AppState;
use crate::http::audited::{Audited, record_run};
use crate::http::error::{ApiError, ErrorCode};
use crate::run::RunOutcome;
use crate::service::{Actor, RunRequest, ServiceError, auth};
use crate::storage::audit::Op;
use crate::workspace::{MAX_LIST_ENTRIES, TreeLimits};

/// The scheme and folder of a file resource's URI: `file:///workspace/<path>`.
pub const RESOURCE_PREFIX: &str = "file:///workspace/";

/// Who calls, on which session.
pub(super) struct Caller<'a> {
    pub state: &'a AppState,
    pub id: &'a str,
    pub actor: &'a Actor,
}

/// A tool's answer: its text, and whether it is a failure the agent should read as one.
pub(super) struct Answer {
    pub text: String,
    pub is_error: bool,
}

impl Answer {
    fn ok(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            is_error: false,
        }
    }

    fn error(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            is_error: true,
        }
    }
}

/// Every tool, as `tools/list` answers it: name, description and the JSON Schema of its
/// arguments.
pub(super) fn list() -> Value {
    let string = |d: &str| json!({"type": "string", "description": d});
    let integer = |d: &str, min: u64| json!({"type": "integer", "minimum": min, "description": d});
    let boolean = |d: &str| json!({"type": "boolean", "description": d});
    let tool =
        |name: &str, description: &str, properties: Value, required: &[&str], read_only: bool| {
            json!({
                "name": name,
                "description": description,
                "inputSchema": {
                    "type": "object",
                    "properties": properties,
                    "required": required,
                    "additionalProperties": false,
                },
                "annotations": {"readOnlyHint": read_only},
            })
        };
    json!([
        tool(
            "run",
            "Run a shell command (`/bin/sh -c`) in /workspace as the sandbox user. Answers its output (stdout, then stderr, at most 100,000 bytes), `Command failed (exit code N)` before the output of a failed command, `Error: Command timed out` past the timeout. With `background`, answers at once with a run id for `run_status`.",
            json!({
                "command": string("The command line."),
                "timeout": integer("Seconds before the command is stopped (default 120, at most the host's SANDBOXD_EXECUTE_TIMEOUT).", 1),
                "background": boolean("Start the command and answer with its run id at once (default false)."),
            }),
            &["command"],
            false,
        ),
        tool(
            "run_status",
            "The state of a run started with `background`: still running with its output so far, or how it ended.",
            json!({"run_id": string("The run id `run` answered.")}),
            &["run_id"],
            true,
        ),
        tool(
            "read_file",
            "Read a text file of the workspace, its lines numbered from 1; `offset` (a line index from 0) and `limit` (lines, default 2000) read a slice. Files over the host's read limit (8 MiB by default) are refused.",
            json!({
                "path": string("The file: relative to /workspace, or absolute under it."),
                "offset": integer("The first line to read, from 0 (default 0).", 0),
                "limit": integer("Lines to read at most (default 2000).", 1),
            }),
            &["path"],
            true,
        ),
        tool(
            "write_file",
            "Write a file of the workspace whole (created with its parent folders, or replaced).",
            json!({
                "path": string("The file: relative to /workspace, or absolute under it."),
                "content": string("The new content."),
            }),
            &["path", "content"],
            false,
        ),
        tool(
            "edit_file",
            "Replace an exact string in a file of the workspace: once (the string must appear exactly once) or, with `replace_all`, everywhere.",
            json!({
                "path": string("The file: relative to /workspace, or absolute under it."),
                "old_string": string("The text to replace, exactly as it is in the file."),
                "new_string": string("The text to put in its place."),
                "replace_all": boolean("Replace every occurrence (default false)."),
            }),
            &["path", "old_string", "new_string"],
            false,
        ),
        tool(
            "list",
            "List one folder of the workspace: folders first, then files with their sizes.",
            json!({"path": string("The folder (default `.`, the workspace).")}),
            &[],
            true,
        ),
        tool(
            "tree",
            "The paths below a folder of the workspace, breadth first, at most 6 levels deep and 2,000 entries (the cut is said).",
            json!({"path": string("The folder (default `.`, the workspace).")}),
            &[],
            true,
        ),
        tool(
            "glob",
            "Find files whose path matches a glob pattern (`*.py`, `**/test_*.rs`) at any depth below a folder; the first 100 are listed.",
            json!({
                "pattern": string("The glob pattern."),
                "path": string("The folder to search (default `.`, the workspace)."),
            }),
            &["pattern"],
            true,
        ),
        tool(
            "grep",
            "Search file contents for a regular expression (grep's basic syntax) below a folder or in one file.",
            json!({
                "pattern": string("The regular expression."),
                "path": string("The folder or file to search (default `.`, the workspace)."),
                "glob_pattern": string("Only files whose name matches this glob (`*.py`)."),
                "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"],
                    "description": "`files_with_matches` (default): the files; `content`: each matching line; `count`: how many lines matched."},
                "ignore_hidden": boolean("Leave out hidden files and folders (default true)."),
            }),
            &["pattern"],
            true,
        ),
    ])
}

/// The arguments of a tool call, or the error an agent reads when they do not fit.
fn args<T: DeserializeOwned>(tool: &str, arguments: Value) -> Result<T, Answer> {
    let arguments = if arguments.is_null() {
        json!({})
    } else {
        arguments
    };
    serde_json::from_value(arguments)
        .map_err(|e| Answer::error(format!("Error: invalid arguments for {tool}: {e}")))
}

/// Calls tool `name`; `None` when there is no such tool (a protocol error, not a tool's).
pub(super) async fn call(c: &Caller<'_>, name: &str, arguments: Value) -> Option<Answer> {
    Some(match name {
        "run" => with(name, arguments, |a| run(c, a)).await,
        "run_status" => with(name, arguments, |a| run_status(c, a)).await,
        "read_file" => with(name, arguments, |a| read_file(c, a)).await,
        "write_file" => with(name, arguments, |a| write_file(c, a)).await,
        "edit_file" => with(name, arguments, |a| edit_file(c, a)).await,
        "list" => with(name, arguments, |a| list_folder(c, a)).await,
        "tree" => with(name, arguments, |a| tree(c, a)).await,
        "glob" => with(name, arguments, |a| glob(c, a)).await,
        "grep" => with(name, arguments, |a| grep(c, a)).await,
        _ => return None,
    })
}

/// Tool `name` run as `tool` with its `arguments`, or the error of arguments that do not fit.
async fn with<A: DeserializeOwned, F: std::future::Future<Output = Answer>>(
    name: &str,
    arguments: Value,
    tool: impl FnOnce(A) -> F,
) -> Answer {
    match args(name, arguments) {
        Ok(a) => tool(a).await,
        Err(e) => e,
    }
}

fn default_path() -> String {
    ".".to_owned()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunArgs {
    command: String,
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    background: bool,
}

/// A run of `command` as the session's other runs go (woken if asleep, audited as a run).
async fn run_command(
    c: &Caller<'_>,
    command: String,
    timeout: u64,
) -> Result<RunOutcome, ServiceError> {
    let req = RunRequest {
        command: command.clone(),
        timeout_seconds: Some(timeout),
        env: None,
        run_id: None,
    };
    let started = Instant::now();
    let result = c.state.core.run(c.id, req, None, None).await;
    record_run(&c.state.core, c.id, c.actor, &command, &result, started);
    result
}

fn failed(e: impl Into<ApiError>) -> Answer {
    Answer::error(format!("Error: {}", e.into().message))
}

async fn run(c: &Caller<'_>, a: RunArgs) -> Answer {
    let timeout = a.timeout.unwrap_or(text::DEFAULT_RUN_TIMEOUT);
    if !a.background {
        return match run_command(c, a.command, timeout).await {
            Ok(outcome) => Answer::ok(text::run_text(&outcome)),
            Err(e) => failed(e),
        };
    }
    // In the background: the run goes on in a task of its own (its caller going away does not
    // stop it), and the answer comes once it is under way, or with why it could not start.
    let run_id = format!("run-{}", &auth::new_session_token()[4..20]);
    let req = RunRequest {
        command: a.command.clone(),
        timeout_seconds: Some(timeout),
        env: None,
        run_id: Some(run_id.clone()),
    };
    let (core, id, actor) = (c.state.core.clone(), c.id.to_owned(), c.actor.clone());
    let (under_way_tx, under_way) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let started = Instant::now();
        let result = core.run(&id, req, None, Some(under_way_tx)).await;
        record_run(&core, &id, &actor, &a.command, &result, started);
        result
    });
    match under_way.await {
        Ok(()) => Answer::ok(format!(
            "Started run {run_id} in the background. Ask run_status with run_id \"{run_id}\" for its output and exit code."
        )),
        // The run ended before it was under way: it could not start.
        Err(_) => match task.await {
            Ok(Err(e)) => failed(e),
            Ok(Ok(outcome)) => Answer::ok(text::run_text(&outcome)),
            Err(e) => Answer::error(format!("Error: the run's task failed: {e}")),
        },
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunStatusArgs {
    run_id: String,
}

async fn run_status(c: &Caller<'_>, a: RunStatusArgs) -> Answer {
    match c.state.core.run_status(c.id, &a.run_id).await {
        Ok(s) if s.running => {
            let (output, _) = text::bounded(&format!("{}{}", s.stdout, s.stderr));
            Answer::ok(format!(
                "Run {} is still running. Output so far:\n{output}",
                s.run_id
            ))
        }
        Ok(s) => Answer::ok(text::run_text(&RunOutcome {
            run_id: s.run_id,
            exit_code: s.exit_code.unwrap_or(-1),
            stdout: s.stdout,
            stderr: s.stderr,
            truncated: s.truncated,
            timed_out: s.timed_out,
            stopped: s.stopped,
            duration_ms: s.duration_ms.unwrap_or(0),
            cpu_ns: s.cpu_ns,
        })),
        Err(e) => failed(e),
    }
}

/// The whole of file `path` (at most the policy's read limit), read as an audited read.
async fn read_whole(c: &Caller<'_>, path: &str) -> Result<Vec<u8>, ApiError> {
    let audited = Audited::new(&c.state.core, c.id, c.actor, Op::Read, path);
    let ws = c.state.core.files(c.id).await?;
    let max = c.state.core.policy().max_read_bytes;
    let p = path.to_owned();
    let read = audited
        .blocking(
            move || ws.read(&p, 0, None, max),
            |r| i64::try_from(r.data.len()).ok(),
            ApiError::from,
        )
        .await?;
    Ok(read.data)
}

/// `data` written whole to file `path`, as an audited write.
async fn write_whole(c: &Caller<'_>, path: &str, data: Vec<u8>) -> Result<(), ApiError> {
    let audited = Audited::new(&c.state.core, c.id, c.actor, Op::Write, path);
    let ws = c.state.core.files(c.id).await?;
    let p = path.to_owned();
    audited
        .blocking(
            move || ws.write(&p, &data),
            |w| i64::try_from(w.size).ok(),
            ApiError::from,
        )
        .await?;
    Ok(())
}

/// A read's failure in the seed's words: a missing file by name, anything else as it is.
fn read_failed(path: &str, e: ApiError) -> Answer {
    if e.code == ErrorCode::NotFound {
        Answer::error(format!("Error: File '{path}' not found"))
    } else {
        Answer::error(format!("Error: {}", e.message))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
    #[serde(default)]
    offset: usize,
    #[serde(default)]
    limit: Option<usize>,
}

async fn read_file(c: &Caller<'_>, a: ReadArgs) -> Answer {
    match read_whole(c, &a.path).await {
        Ok(data) => {
            let shown = text::numbered(
                &String::from_utf8_lossy(&data),
                a.offset,
                a.limit.unwrap_or(text::DEFAULT_READ_LIMIT),
            );
            if shown.starts_with("Error: ") {
                Answer::error(shown)
            } else {
                Answer::ok(shown)
            }
        }
        Err(e) => read_failed(&a.path, e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}

async fn write_file(c: &Caller<'_>, a: WriteArgs) -> Answer {
    let lines = text::line_count(&a.content);
    match write_whole(c, &a.path, a.content.into_bytes()).await {
        Ok(()) => Answer::ok(format!("Wrote {lines} lines to {}", a.path)),
        Err(e) => Answer::error(format!(
            "Error: Failed to write '{}': {}",
            a.path, e.message
        )),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

/// The edits under way, one lock per session and file: an edit is a read and a write, so two
/// edits of one file at once would lose one.
static EDITING: std::sync::LazyLock<std::sync::Mutex<HashMap<(String, String), FileLock>>> =
    std::sync::LazyLock::new(Default::default);

/// One file's edit lock.
type FileLock = std::sync::Arc<tokio::sync::Mutex<()>>;

/// The lock of file `path` of session `id` (paths spelled two ways are one file).
fn edit_lock(id: &str, path: &str) -> FileLock {
    let file = crate::workspace::workspace_relative(path).unwrap_or_else(|_| path.to_owned());
    let mut editing = EDITING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Locks no edit holds any more go (only this map holds them).
    editing.retain(|_, lock| std::sync::Arc::strong_count(lock) > 1);
    editing.entry((id.to_owned(), file)).or_default().clone()
}

async fn edit_file(c: &Caller<'_>, a: EditArgs) -> Answer {
    let lock = edit_lock(c.id, &a.path);
    let _editing = lock.lock().await;
    let data = match read_whole(c, &a.path).await {
        Ok(data) => data,
        Err(e) => return read_failed(&a.path, e),
    };
    let Ok(content) = String::from_utf8(data) else {
        return Answer::error(format!(
            "Error: '{}' is not UTF-8 text: edit it with run instead",
            a.path
        ));
    };
    let (edited, occurrences) =
        match text::replace(&content, &a.old_string, &a.new_string, a.replace_all) {
            Ok(done) => done,
            Err(why) => return Answer::error(format!("Error: {why}")),
        };
    match write_whole(c, &a.path, edited.into_bytes()).await {
        Ok(()) => Answer::ok(format!(
            "Edited {}: replaced {occurrences} occurrence(s)",
            a.path
        )),
        Err(e) => Answer::error(format!(
            "Error: Failed to write '{}': {}",
            a.path, e.message
        )),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FolderArgs {
    #[serde(default = "default_path")]
    path: String,
}

/// Whether a listing's failure means "nothing to list there" in the seed's words.
fn nothing_there(e: &ApiError) -> bool {
    matches!(e.code, ErrorCode::NotFound | ErrorCode::NotADirectory)
}

async fn list_folder(c: &Caller<'_>, a: FolderArgs) -> Answer {
    let audited = Audited::new(&c.state.core, c.id, c.actor, Op::Ls, &a.path);
    let ws = match c.state.core.files(c.id).await {
        Ok(ws) => ws,
        Err(e) => return failed(e),
    };
    let p = a.path.clone();
    let listed = audited
        .blocking(
            move || ws.list(&p, MAX_LIST_ENTRIES),
            |_| None,
            ApiError::from,
        )
        .await;
    match listed {
        Ok(listing) => {
            let mut shown = text::list_text(&a.path, &listing.entries);
            if listing.truncated {
                shown.push_str(&format!(
                    "\n  ... cut at {MAX_LIST_ENTRIES} entries: use glob or run to see the rest"
                ));
            }
            Answer::ok(shown)
        }
        Err(e) if nothing_there(&e) => Answer::ok(text::list_text(&a.path, &[])),
        Err(e) => failed(e),
    }
}

async fn tree(c: &Caller<'_>, a: FolderArgs) -> Answer {
    let audited = Audited::new(&c.state.core, c.id, c.actor, Op::Ls, &a.path);
    let ws = match c.state.core.files(c.id).await {
        Ok(ws) => ws,
        Err(e) => return failed(e),
    };
    let p = a.path.clone();
    let walked = audited
        .blocking(
            move || ws.tree(&p, TreeLimits::default()),
            |_| None,
            ApiError::from,
        )
        .await;
    match walked {
        Ok(tree) => Answer::ok(text::tree_text(&a.path, &tree)),
        Err(e) if nothing_there(&e) => {
            Answer::ok(format!("Directory '{}' is empty or does not exist", a.path))
        }
        Err(e) => failed(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GlobArgs {
    pattern: String,
    #[serde(default = "default_path")]
    path: String,
}

async fn glob(c: &Caller<'_>, a: GlobArgs) -> Answer {
    let command = text::glob_command(&a.pattern, &a.path);
    match run_command(c, command, text::SEARCH_TIMEOUT).await {
        Ok(o) if o.timed_out => Answer::error(text::run_text(&o)),
        Ok(o) => Answer::ok(text::glob_text(&a.pattern, &a.path, o.exit_code, &o.stdout)),
        Err(e) => failed(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrepArgs {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    glob_pattern: Option<String>,
    #[serde(default)]
    output_mode: GrepMode,
    #[serde(default = "yes")]
    ignore_hidden: bool,
}

fn yes() -> bool {
    true
}

async fn grep(c: &Caller<'_>, a: GrepArgs) -> Answer {
    let command = text::grep_command(
        &a.pattern,
        a.path.as_deref(),
        a.glob_pattern.as_deref(),
        a.ignore_hidden,
    );
    let outcome = match run_command(c, command, text::SEARCH_TIMEOUT).await {
        Ok(o) if o.timed_out => return Answer::error(text::run_text(&o)),
        Ok(o) => o,
        Err(e) => return failed(e),
    };
    let output = format!("{}{}", outcome.stdout, outcome.stderr);
    match text::parse_grep(outcome.exit_code, &output) {
        Ok(mut found) => {
            if a.ignore_hidden {
                found.retain(|m| !text::hidden_match(&m.path, a.path.as_deref()));
            }
            Answer::ok(text::grep_text(&a.pattern, a.output_mode, &found))
        }
        Err(why) => Answer::error(why),
    }
}

/// The media type of a file resource, by its name (text when unknown).
fn media_type(path: &str, is_text: bool) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("md") => "text/markdown",
        Some("json") => "application/json",
        Some("html" | "htm") => "text/html",
        Some("csv") => "text/csv",
        Some("py") => "text/x-python",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("pdf") => "application/pdf",
        _ if is_text => "text/plain",
        _ => "application/octet-stream",
    }
}

/// The file resources: the files of the workspace's tree (within the tree's bounds).
pub(super) async fn resources(c: &Caller<'_>) -> Result<Value, ApiError> {
    let audited = Audited::new(&c.state.core, c.id, c.actor, Op::Ls, "");
    let ws = c.state.core.files(c.id).await?;
    let tree = audited
        .blocking(
            move || ws.tree("", TreeLimits::default()),
            |_| None,
            ApiError::from,
        )
        .await?;
    let files: Vec<Value> = tree
        .entries
        .iter()
        .filter(|e| e.kind == sandboxd_api::files::EntryKind::File)
        .map(|e| {
            json!({
                "uri": format!("{RESOURCE_PREFIX}{}", urlencoding::encode(&e.path).replace("%2F", "/")),
                "name": e.path,
                "mimeType": media_type(&e.path, true),
                "size": e.size,
            })
        })
        .collect();
    Ok(json!({ "resources": files }))
}

/// The template every file resource fits.
pub(super) fn templates() -> Value {
    json!({"resourceTemplates": [{
        "uriTemplate": format!("{RESOURCE_PREFIX}{{+path}}"),
        "name": "workspace-file",
        "title": "A file of the session's workspace",
        "description": "Any file below /workspace, by its path.",
    }]})
}

/// Why a resource read failed: the URI is not one of this server's, or there is no such file,
/// or the read failed.
pub(super) enum ResourceError {
    NotOurs,
    NotFound,
    Failed(ApiError),
}

/// The content of file resource `uri`: text when it is UTF-8, base64 otherwise.
pub(super) async fn read_resource(c: &Caller<'_>, uri: &str) -> Result<Value, ResourceError> {
    let encoded = uri
        .strip_prefix(RESOURCE_PREFIX)
        .ok_or(ResourceError::NotOurs)?;
    let path = urlencoding::decode(encoded).map_err(|_| ResourceError::NotOurs)?;
    let data = read_whole(c, &path).await.map_err(|e| {
        if e.code == ErrorCode::NotFound {
            ResourceError::NotFound
        } else {
            ResourceError::Failed(e)
        }
    })?;
    let content = match String::from_utf8(data) {
        Ok(text) => json!({"uri": uri, "mimeType": media_type(&path, true), "text": text}),
        Err(e) => json!({
            "uri": uri,
            "mimeType": media_type(&path, false),
            "blob": base64::engine::general_purpose::STANDARD.encode(e.into_bytes()),
        }),
    };
    Ok(json!({ "contents": [content] }))
}
