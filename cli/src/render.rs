//! Text for people: aligned tables, shell quoting, relative times.

use k8s_openapi::jiff::Timestamp;

/// Lays `rows` out under `header` in columns two spaces apart (the last column unpadded).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count());
                out.push_str(cell);
                out.push_str(&" ".repeat(pad + 2));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// One command line for `/bin/sh` from arguments: a single argument is taken as a shell command
/// (`exec s -- 'ls | wc -l'`), several are quoted one by one (`exec s -- ls -la "my dir"`).
pub fn shell_command(args: &[String]) -> String {
    match args {
        [one] => one.clone(),
        many => many.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" "),
    }
}

/// POSIX single-quoting where a word needs it.
pub fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// A span of seconds in its largest fitting unit: `30s`, `29m`, `3h`, `5d`.
pub fn span(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// `in 29m`, `3m ago`, from `now` to `t`.
pub fn relative(t: Timestamp, now: Timestamp) -> String {
    let secs = t.as_second() - now.as_second();
    if secs >= 0 {
        format!("in {}", span(secs.unsigned_abs()))
    } else {
        format!("{} ago", span(secs.unsigned_abs()))
    }
}

/// Bytes for people: `512 B`, `3.4 KiB`, `2.0 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_trim() {
        let t = table(
            &["NAME", "PHASE", "HOST"],
            &[
                vec!["a".into(), "Running".into(), "h1".into()],
                vec!["longer-name".into(), "Preparing".into(), String::new()],
            ],
        );
        assert_eq!(
            t,
            "NAME         PHASE      HOST\na            Running    h1\nlonger-name  Preparing\n"
        );
    }

    #[test]
    fn commands_are_quoted_for_sh() {
        assert_eq!(shell_command(&["ls | wc -l".into()]), "ls | wc -l");
        assert_eq!(
            shell_command(&["ls".into(), "-la".into(), "my dir".into(), "it's".into()]),
            r"ls -la 'my dir' 'it'\''s'"
        );
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn relative_times_read_naturally() {
        let now = Timestamp::from_second(1_000_000).expect("time");
        let at = |s: i64| Timestamp::from_second(1_000_000 + s).expect("time");
        assert_eq!(relative(at(30), now), "in 30s");
        assert_eq!(relative(at(29 * 60), now), "in 29m");
        assert_eq!(relative(at(-3 * 3600), now), "3h ago");
        assert_eq!(relative(at(5 * 86400), now), "in 5d");
        assert_eq!(span(0), "0s");
        assert_eq!(span(3 * 60 + 59), "3m");
    }

    #[test]
    fn byte_counts() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 * 1024 + 400), "3.4 KiB");
        assert_eq!(bytes(2 << 20), "2.0 MiB");
    }
}
