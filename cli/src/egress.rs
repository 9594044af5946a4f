//! `kubectl sandbox egress`: what a session's sandbox reached through its host's egress proxy
//! and resolver, and what was refused, over the last minutes (sandboxd's
//! `GET /v1/sessions/{id}/egress`, asked with the session's token like `ops`). By default one
//! row per name, port and verdict summed over the window; `--by-minute` shows sandboxd's rows
//! as they are, one per minute.

use sandboxd_api::egress::EgressRecord;
use sandboxd_crds::v1alpha1::SandboxSession;

use crate::error::Error;
use crate::render;
use crate::session::Target;

/// The widest window sandboxd keeps answering for (a day).
pub const MAX_MINUTES: u32 = 1440;

/// Prints session `name`'s egress of the last `minutes` minutes.
pub async fn egress(t: &Target, name: &str, minutes: u32, by_minute: bool) -> Result<(), Error> {
    if !(1..=MAX_MINUTES).contains(&minutes) {
        return Err(Error::Usage(format!(
            "--minutes {minutes}: use 1 to {MAX_MINUTES}"
        )));
    }
    let s = t.find(name).await?;
    let (client, id) = t.sandbox(name).await?;
    let log = client.egress(&id, minutes).await?;
    if let Some(policy) = policy_line(&s) {
        println!("{policy}");
    }
    if log.records.is_empty() {
        println!(
            "No egress in the last {minutes} minutes (only sandboxes of an allowlist policy go through the egress proxy and resolver)."
        );
        return Ok(());
    }
    print!("{}", table(&log.records, by_minute));
    Ok(())
}

/// What the session's host enforces beyond its Runtime's policy, as the operator last sent it
/// (and why a change is not in force), in a line.
fn policy_line(s: &SandboxSession) -> Option<String> {
    let status = s.status.as_ref()?;
    let applied = status
        .conditions
        .iter()
        .find(|c| c.type_ == "EgressApplied")
        .map(|c| c.message.clone());
    applied.map(|m| format!("Policy: {m}."))
}

/// The table of `records`: summed per name, port and verdict (LAST: the last minute it was
/// seen, REASON: the last refusal's), or one row per minute with `by_minute`.
pub fn table(records: &[EgressRecord], by_minute: bool) -> String {
    let row = |r: &EgressRecord, when: &str| {
        vec![
            r.name.clone(),
            r.port.to_string(),
            r.verdict.clone(),
            r.count.to_string(),
            r.bytes_out.to_string(),
            r.bytes_in.to_string(),
            when.to_owned(),
            if r.reason.is_empty() {
                "-".to_owned()
            } else {
                r.reason.clone()
            },
        ]
    };
    if by_minute {
        let rows: Vec<Vec<String>> = records.iter().map(|r| row(r, &r.minute)).collect();
        return render::table(
            &[
                "NAME",
                "PORT",
                "VERDICT",
                "COUNT",
                "BYTES-OUT",
                "BYTES-IN",
                "MINUTE",
                "REASON",
            ],
            &rows,
        );
    }
    // Oldest first from sandboxd: a later row of the same key brings its minute and reason.
    let mut summed: Vec<EgressRecord> = Vec::new();
    for r in records {
        match summed
            .iter_mut()
            .find(|s| s.name == r.name && s.port == r.port && s.verdict == r.verdict)
        {
            Some(s) => {
                s.count = s.count.saturating_add(r.count);
                s.bytes_out = s.bytes_out.saturating_add(r.bytes_out);
                s.bytes_in = s.bytes_in.saturating_add(r.bytes_in);
                s.minute.clone_from(&r.minute);
                if !r.reason.is_empty() {
                    s.reason.clone_from(&r.reason);
                }
            }
            None => summed.push(r.clone()),
        }
    }
    summed.sort_by(|a, b| (&a.name, a.port, &a.verdict).cmp(&(&b.name, b.port, &b.verdict)));
    let rows: Vec<Vec<String>> = summed.iter().map(|r| row(r, &r.minute)).collect();
    render::table(
        &[
            "NAME",
            "PORT",
            "VERDICT",
            "COUNT",
            "BYTES-OUT",
            "BYTES-IN",
            "LAST",
            "REASON",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(
        minute: &str,
        name: &str,
        port: u16,
        verdict: &str,
        n: u64,
        reason: &str,
    ) -> EgressRecord {
        EgressRecord {
            minute: minute.to_owned(),
            runtime: "python".to_owned(),
            name: name.to_owned(),
            port,
            verdict: verdict.to_owned(),
            count: n,
            bytes_out: n * 100,
            bytes_in: n * 1000,
            reason: reason.to_owned(),
        }
    }

    fn records() -> Vec<EgressRecord> {
        vec![
            rec("2026-12-06T14:00:00Z", "pypi.org", 443, "allowed", 2, ""),
            rec(
                "2026-12-06T14:00:00Z",
                "evil.test",
                443,
                "denied",
                1,
                "not in allowlist",
            ),
            rec("2026-12-06T14:01:00Z", "pypi.org", 443, "allowed", 3, ""),
            rec(
                "2026-12-06T14:01:00Z",
                "evil.test",
                53,
                "refused",
                4,
                "blocked by egress policy",
            ),
        ]
    }

    #[test]
    fn the_window_is_summed_per_name_port_and_verdict() {
        assert_eq!(
            table(&records(), false),
            "\
NAME       PORT  VERDICT  COUNT  BYTES-OUT  BYTES-IN  LAST                  REASON
evil.test  53    refused  4      400        4000      2026-12-06T14:01:00Z  blocked by egress policy
evil.test  443   denied   1      100        1000      2026-12-06T14:00:00Z  not in allowlist
pypi.org   443   allowed  5      500        5000      2026-12-06T14:01:00Z  -
"
        );
    }

    #[test]
    fn by_minute_shows_each_row_as_sandboxd_keeps_it() {
        assert_eq!(
            table(&records(), true),
            "\
NAME       PORT  VERDICT  COUNT  BYTES-OUT  BYTES-IN  MINUTE                REASON
pypi.org   443   allowed  2      200        2000      2026-12-06T14:00:00Z  -
evil.test  443   denied   1      100        1000      2026-12-06T14:00:00Z  not in allowlist
pypi.org   443   allowed  3      300        3000      2026-12-06T14:01:00Z  -
evil.test  53    refused  4      400        4000      2026-12-06T14:01:00Z  blocked by egress policy
"
        );
    }
}
