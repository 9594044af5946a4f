//! What the MCP tools answer, as text: the console tools of pydantic-ai-backend (the seed's
//! agent tools), their limits and their messages, so an agent reads the same words through
//! MCP as through the seed's toolset. Pure functions of what an operation returned; the
//! operations are in [`super::tools`].

use crate::http::wire::sh_quote;
use crate::run::RunOutcome;
use sandboxd_api::files::{Entry, EntryKind, Tree};

/// Output kept of one `run` (stdout then stderr); the rest is cut and said to be.
pub const MAX_RUN_OUTPUT_BYTES: usize = 100_000;
/// Lines a `read_file` returns when the caller names no limit.
pub const DEFAULT_READ_LIMIT: usize = 2000;
/// The timeout of a `run` that names none, in seconds.
pub const DEFAULT_RUN_TIMEOUT: u64 = 120;
/// The timeout of the `find` and `grep` behind `glob` and `grep`, in seconds.
pub const SEARCH_TIMEOUT: u64 = 120;
/// Matches `glob` lists before the rest are counted.
pub const GLOB_RESULT_LIMIT: usize = 100;
/// Files or lines `grep` lists before the rest are counted.
pub const GREP_RESULT_LIMIT: usize = 50;
/// Characters of a matching line `grep` shows in its content mode.
pub const GREP_LINE_WIDTH: usize = 100;

/// `output` cut to [`MAX_RUN_OUTPUT_BYTES`] on a character boundary, and whether it was cut.
pub fn bounded(output: &str) -> (String, bool) {
    if output.len() <= MAX_RUN_OUTPUT_BYTES {
        return (output.to_owned(), false);
    }
    let mut end = MAX_RUN_OUTPUT_BYTES;
    while !output.is_char_boundary(end) {
        end -= 1;
    }
    (output[..end].to_owned(), true)
}

/// What `run` answers for a finished command: its output, or the failure with its exit code,
/// or the timeout with what it printed before.
pub fn run_text(outcome: &RunOutcome) -> String {
    let (output, cut) = bounded(&format!("{}{}", outcome.stdout, outcome.stderr));
    if outcome.timed_out {
        return format!("Error: Command timed out\n{output}")
            .trim_end_matches('\n')
            .to_owned();
    }
    let mut output = output;
    if cut || outcome.truncated {
        output.push_str("\n\n... (output truncated)");
    }
    if outcome.exit_code != 0 {
        return format!(
            "Command failed (exit code {}):\n{output}",
            outcome.exit_code
        );
    }
    output
}

/// The lines of `text` as Python's `str.splitlines` makes them for text files (`\n`, `\r\n`
/// and `\r` end a line; no empty last line).
fn lines(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        match rest.find(['\n', '\r']) {
            Some(at) => {
                out.push(&rest[..at]);
                let skip = if rest[at..].starts_with("\r\n") { 2 } else { 1 };
                rest = &rest[at + skip..];
            }
            None => {
                out.push(rest);
                rest = "";
            }
        }
    }
    out
}

/// What `read_file` answers: lines `offset..offset + limit` numbered from 1 (`{n:>6}\t`), and
/// how many lines are left past them.
pub fn numbered(text: &str, offset: usize, limit: usize) -> String {
    let lines = lines(text);
    if offset >= lines.len() && !lines.is_empty() {
        return format!(
            "Error: Offset {offset} exceeds file length ({} lines)",
            lines.len()
        );
    }
    let end = offset.saturating_add(limit).min(lines.len());
    let shown = (offset..end)
        .map(|i| format!("{:>6}\t{}", i + 1, lines[i]))
        .collect::<Vec<_>>()
        .join("\n");
    if end < lines.len() {
        return format!("{shown}\n\n... ({} more lines)", lines.len() - end);
    }
    shown
}

/// The line count `write_file` reports.
pub fn line_count(text: &str) -> usize {
    lines(text).len()
}

/// `content` with `old` replaced by `new` (once, or everywhere with `all`) and how many places
/// changed; or why not: absent, or present more than once without `all`.
pub fn replace(content: &str, old: &str, new: &str, all: bool) -> Result<(String, usize), String> {
    if old.is_empty() {
        return Err("old_string is empty: name the text to replace".to_owned());
    }
    let occurrences = content.matches(old).count();
    if occurrences == 0 {
        return Err(format!("String '{old}' not found in file"));
    }
    if occurrences > 1 && !all {
        return Err(format!(
            "String '{old}' found {occurrences} times. Use replace_all=True to replace all, or provide more context."
        ));
    }
    if all {
        Ok((content.replace(old, new), occurrences))
    } else {
        Ok((content.replacen(old, new, 1), 1))
    }
}

/// What `list` answers for one folder's entries: folders first, then files with their sizes.
pub fn list_text(path: &str, entries: &[Entry]) -> String {
    if entries.is_empty() {
        return format!("Directory '{path}' is empty or does not exist");
    }
    let mut sorted: Vec<&Entry> = entries.iter().collect();
    sorted.sort_by(|a, b| {
        (a.kind != EntryKind::Dir, &a.name).cmp(&(b.kind != EntryKind::Dir, &b.name))
    });
    let mut out = vec![format!("Contents of {path}:")];
    for e in sorted {
        match e.kind {
            EntryKind::Dir => out.push(format!("  {}/", e.name)),
            EntryKind::File => out.push(format!("  {} ({} bytes)", e.name, e.size)),
            _ => out.push(format!("  {}", e.name)),
        }
    }
    out.join("\n")
}

/// What `tree` answers: every path below the folder (folders with a trailing `/`), breadth
/// first, and which bound cut it.
pub fn tree_text(path: &str, tree: &Tree) -> String {
    if tree.entries.is_empty() {
        return format!("Directory '{path}' is empty or does not exist");
    }
    let mut out = vec![format!("Tree of {path}:")];
    for e in &tree.entries {
        let shown = e
            .path
            .strip_prefix(&format!("{}/", tree.root))
            .filter(|_| !tree.root.is_empty())
            .unwrap_or(&e.path);
        if e.kind == EntryKind::Dir {
            out.push(format!("  {shown}/"));
        } else {
            out.push(format!("  {shown}"));
        }
    }
    if tree.entry_limit_reached {
        out.push(format!(
            "  ... cut at {} entries: list a folder below to see more",
            tree.max_entries
        ));
    }
    if tree.depth_limit_reached {
        out.push(format!(
            "  ... cut at {} levels deep: list a folder below to see more",
            tree.max_depth
        ));
    }
    for skipped in &tree.skipped {
        out.push(format!("  ... {skipped}/ could not be read"));
    }
    out.join("\n")
}

/// The ways a caller spells the workspace root.
fn is_root(path: &str) -> bool {
    matches!(path.trim(), "" | "/" | "." | "/workspace")
}

/// The `find` behind `glob`: files matching `pattern` at any depth below `path` (the
/// workspace for a root spelling); a leading `**/` is the same as none.
pub fn glob_command(pattern: &str, path: &str) -> String {
    let root = if is_root(path) { "." } else { path };
    let anywhere = pattern.strip_prefix("**/").unwrap_or(pattern);
    format!(
        "find {} -path {} -type f 2>/dev/null",
        sh_quote(root),
        sh_quote(&format!("*/{anywhere}"))
    )
}

/// What `glob` answers for what its `find` printed (nothing found when it failed).
pub fn glob_text(pattern: &str, path: &str, exit_code: i64, output: &str) -> String {
    let mut found: Vec<&str> = if exit_code == 0 {
        output.lines().filter(|l| !l.is_empty()).collect()
    } else {
        Vec::new()
    };
    found.sort_unstable();
    if found.is_empty() {
        return format!("No files matching '{pattern}' in {path}");
    }
    let mut out = vec![format!(
        "Found {} file(s) matching '{pattern}':",
        found.len()
    )];
    out.extend(
        found
            .iter()
            .take(GLOB_RESULT_LIMIT)
            .map(|p| format!("  {p}")),
    );
    if found.len() > GLOB_RESULT_LIMIT {
        out.push(format!(
            "  ... and {} more",
            found.len() - GLOB_RESULT_LIMIT
        ));
    }
    out.join("\n")
}

/// The `grep` behind `grep`: recursive, numbered, with file names; hidden folders left out
/// unless asked for; the pattern and the glob quoted (a pattern that starts with `-` is a
/// pattern).
pub fn grep_command(
    pattern: &str,
    path: Option<&str>,
    glob: Option<&str>,
    ignore_hidden: bool,
) -> String {
    let mut options = vec!["-rnH".to_owned()];
    if ignore_hidden {
        options.push(format!("--exclude-dir={}", sh_quote(".[!./]*")));
        options.push(format!("--exclude-dir={}", sh_quote("*/.[!.]*")));
    }
    if let Some(glob) = glob.filter(|g| !g.is_empty()) {
        options.push(format!("--include={}", sh_quote(glob)));
    }
    format!(
        "grep {} -e {} {}",
        options.join(" "),
        sh_quote(pattern),
        sh_quote(path.filter(|p| !p.is_empty()).unwrap_or("."))
    )
}

/// One line `grep` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrepMatch {
    /// The file, as grep printed it.
    pub path: String,
    /// The line number, from 1.
    pub line_number: u64,
    /// The line.
    pub line: String,
}

/// The matches a `grep` printed (`file:line:content`), or its error (exit status 2 and up).
pub fn parse_grep(exit_code: i64, output: &str) -> Result<Vec<GrepMatch>, String> {
    match exit_code {
        0 => {}
        1 => return Ok(Vec::new()),
        _ => return Err(format!("Error: {output}")),
    }
    Ok(output
        .trim()
        .split('\n')
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let path = parts.next()?;
            let number = parts.next()?.parse().ok()?;
            let text = parts.next()?;
            Some(GrepMatch {
                path: path.to_owned(),
                line_number: number,
                line: text.to_owned(),
            })
        })
        .collect())
}

/// Whether a match lies in a hidden file or folder below the search root (a hidden folder
/// named as the root itself is searched).
pub fn hidden_match(path: &str, root: Option<&str>) -> bool {
    let base = root.unwrap_or(".").trim_end_matches('/');
    let base = if base.is_empty() { "/" } else { base };
    let relative = path.strip_prefix(base).unwrap_or(path);
    relative
        .split('/')
        .any(|part| part.starts_with('.') && part != "." && part != "..")
}

/// How `grep` presents its matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum GrepMode {
    /// Each matching line, `path:line: text`.
    Content,
    /// The files with a match.
    #[default]
    FilesWithMatches,
    /// How many lines matched.
    Count,
}

/// What `grep` answers for its matches.
pub fn grep_text(pattern: &str, mode: GrepMode, matches: &[GrepMatch]) -> String {
    if matches.is_empty() {
        return format!("No matches for '{pattern}'");
    }
    match mode {
        GrepMode::Count => format!("Found {} match(es) for '{pattern}'", matches.len()),
        GrepMode::FilesWithMatches => {
            let mut files: Vec<String> = matches.iter().map(|m| m.path.clone()).collect();
            files.sort_unstable();
            files.dedup();
            truncated_list(
                &format!("Files containing '{pattern}':"),
                &files,
                "more files",
            )
        }
        GrepMode::Content => {
            let rendered: Vec<String> = matches
                .iter()
                .map(|m| {
                    let line: String = m.line.chars().take(GREP_LINE_WIDTH).collect();
                    format!("{}:{}: {line}", m.path, m.line_number)
                })
                .collect();
            truncated_list(
                &format!("Matches for '{pattern}':"),
                &rendered,
                "more matches",
            )
        }
    }
}

fn truncated_list(header: &str, items: &[String], noun: &str) -> String {
    let mut out = vec![header.to_owned()];
    out.extend(
        items
            .iter()
            .take(GREP_RESULT_LIMIT)
            .map(|item| format!("  {item}")),
    );
    if items.len() > GREP_RESULT_LIMIT {
        out.push(format!(
            "  ... and {} {noun}",
            items.len() - GREP_RESULT_LIMIT
        ));
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(exit_code: i64, stdout: &str, timed_out: bool) -> RunOutcome {
        RunOutcome {
            run_id: "r".into(),
            exit_code,
            stdout: stdout.into(),
            stderr: String::new(),
            truncated: false,
            timed_out,
            stopped: false,
            duration_ms: 1,
            cpu_ns: None,
        }
    }

    #[test]
    fn runs_read_as_the_seed_console_says() {
        assert_eq!(run_text(&outcome(0, "42\n", false)), "42\n");
        assert_eq!(
            run_text(&outcome(3, "no\n", false)),
            "Command failed (exit code 3):\nno\n"
        );
        assert_eq!(
            run_text(&outcome(124, "partial\n", true)),
            "Error: Command timed out\npartial"
        );
        let long = "x".repeat(MAX_RUN_OUTPUT_BYTES + 10);
        let text = run_text(&outcome(0, &long, false));
        assert!(text.ends_with("\n\n... (output truncated)"));
        assert_eq!(
            text.len(),
            MAX_RUN_OUTPUT_BYTES + "\n\n... (output truncated)".len()
        );
    }

    #[test]
    fn reads_are_numbered_and_say_what_is_left() {
        assert_eq!(
            numbered("a\nb\nc\n", 0, 2000),
            "     1\ta\n     2\tb\n     3\tc"
        );
        assert_eq!(numbered("a\nb\nc", 1, 1), "     2\tb\n\n... (1 more lines)");
        assert_eq!(
            numbered("a\nb\n", 5, 10),
            "Error: Offset 5 exceeds file length (2 lines)"
        );
        assert_eq!(numbered("", 0, 10), "");
        assert_eq!(
            numbered("a\r\nb\rc", 0, 10),
            "     1\ta\n     2\tb\n     3\tc"
        );
        assert_eq!(line_count("one\ntwo\n"), 2);
    }

    #[test]
    fn edits_refuse_absent_and_ambiguous_strings() {
        assert_eq!(
            replace("a b a", "a", "c", false),
            Err("String 'a' found 2 times. Use replace_all=True to replace all, or provide more context.".into())
        );
        assert_eq!(replace("a b a", "a", "c", true), Ok(("c b c".into(), 2)));
        assert_eq!(replace("a b", "b", "x", false), Ok(("a x".into(), 1)));
        assert_eq!(
            replace("a b", "z", "x", false),
            Err("String 'z' not found in file".into())
        );
        assert!(replace("a", "", "x", false).is_err());
    }

    #[test]
    fn searches_quote_what_the_caller_gave() {
        assert_eq!(
            glob_command("**/*.py", "."),
            "find . -path '*/*.py' -type f 2>/dev/null"
        );
        assert_eq!(
            glob_command("*.txt", "/workspace"),
            "find . -path '*/*.txt' -type f 2>/dev/null"
        );
        assert_eq!(
            grep_command("don't", None, Some("*.rs"), false),
            r#"grep -rnH --include='*.rs' -e 'don'"'"'t' ."#
        );
        assert!(grep_command("-v", Some("src"), None, true).ends_with("-e -v src"));
    }

    #[test]
    fn grep_output_is_parsed_and_rendered() {
        let found = parse_grep(0, "./a.txt:3:hello: world\n./.git/x:1:hello\n").expect("parsed");
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].line, "hello: world");
        assert!(hidden_match(&found[1].path, None));
        assert!(!hidden_match(&found[0].path, None));
        assert!(!hidden_match("./.github/x", Some("./.github")));
        assert_eq!(parse_grep(1, ""), Ok(vec![]));
        assert!(parse_grep(2, "grep: bad").is_err());
        assert_eq!(
            grep_text("hello", GrepMode::FilesWithMatches, &found[..1]),
            "Files containing 'hello':\n  ./a.txt"
        );
        assert_eq!(
            grep_text("hello", GrepMode::Content, &found[..1]),
            "Matches for 'hello':\n  ./a.txt:3: hello: world"
        );
        assert_eq!(
            grep_text("hello", GrepMode::Count, &found),
            "Found 2 match(es) for 'hello'"
        );
        assert_eq!(grep_text("x", GrepMode::Count, &[]), "No matches for 'x'");
    }

    #[test]
    fn globs_are_sorted_and_bounded() {
        assert_eq!(
            glob_text("*.md", ".", 0, "./b.md\n./a.md\n"),
            "Found 2 file(s) matching '*.md':\n  ./a.md\n  ./b.md"
        );
        assert_eq!(
            glob_text("*.md", ".", 1, ""),
            "No files matching '*.md' in ."
        );
        let many: String = (0..150).map(|i| format!("./f{i:03}\n")).collect();
        assert!(glob_text("*", ".", 0, &many).ends_with("  ... and 50 more"));
    }
}
