//! The egress decision at a session's open: its Runtime's policy, the session's own narrowing
//! (`spec.egress`) and its namespace's ceiling (annotation [`CEILING_ANNOTATION`]) give the
//! policies sandboxd is sent with the open, or the reason the session is refused. Pure: the
//! caller reads the Runtime, the session and the namespace; what a policy allows is decided by
//! [`sandboxd_catalog::egress`] alone.

use sandboxd_catalog::egress::Egress;
use sandboxd_crds::v1alpha1::condition::SessionReason;

/// The Namespace annotation holding the widest egress policy a session of the namespace may
/// have, as JSON (`{"mode": "allowlist", "allow": [{"domain": "pypi.org"}]}`).
pub const CEILING_ANNOTATION: &str = "sandboxd.dev/egress-ceiling";

/// What the decision reads.
#[derive(Debug, Clone, Copy)]
pub struct EgressFacts<'a> {
    /// The Runtime's name; `None` when the session opens on no Runtime object (a host's own
    /// default), whose policy only the host knows: nothing is checked against it then, and
    /// the policies sent still bind the session there.
    pub runtime: Option<&'a str>,
    /// The Runtime's `spec.needsNetwork`.
    pub needs_network: bool,
    /// The Runtime's `spec.egress`.
    pub runtime_egress: Option<&'a Egress>,
    /// The session's `spec.egress`.
    pub session_egress: Option<&'a Egress>,
    /// The session's namespace.
    pub namespace: &'a str,
    /// The namespace's [`CEILING_ANNOTATION`], as written.
    pub ceiling: Option<&'a str>,
}

/// Why a session is not opened: the reason of its `Admitted=False` condition and the message
/// its status shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRefusal {
    /// EgressInvalid, EgressWidened or EgressCeiling.
    pub reason: SessionReason,
    /// What is wrong and what to change.
    pub message: String,
}

/// The further policies an open sends ([`sandboxd_api::session::OpenRequest::egress`]: the
/// session's own, then the namespace's ceiling, each when there is one), or why the session is
/// refused: a policy that is not valid, a session policy wider than its Runtime's, or an
/// effective policy (the session's, else the Runtime's) wider than the namespace's ceiling.
pub fn decide(f: &EgressFacts<'_>) -> Result<Vec<Egress>, EgressRefusal> {
    let refuse = |reason, message| Err(EgressRefusal { reason, message });
    let runtime = f
        .runtime
        .map(|name| (name, Egress::effective(f.needs_network, f.runtime_egress)));
    if let Some((name, policy)) = &runtime
        && let Some(problems) = problems(policy)
    {
        return refuse(
            SessionReason::EgressInvalid,
            format!(
                "Runtime '{name}' has an invalid spec.egress ({problems}): fix the Runtime and this session opens by itself"
            ),
        );
    }
    if let Some(session) = f.session_egress {
        if let Some(problems) = problems(session) {
            return refuse(
                SessionReason::EgressInvalid,
                format!(
                    "spec.egress is invalid ({problems}): delete the session and create it with a valid one"
                ),
            );
        }
        if let Some((name, policy)) = &runtime
            && let Err(m) = session.within(policy)
        {
            return refuse(
                SessionReason::EgressWidened,
                format!(
                    "spec.egress widens the runtime's policy (Runtime '{name}', {}): {m}; a session may only narrow it",
                    policy.summary()
                ),
            );
        }
    }
    let ceiling = match f.ceiling {
        None => None,
        Some(text) => {
            let named = || {
                format!(
                    "the annotation {CEILING_ANNOTATION} of namespace '{}'",
                    f.namespace
                )
            };
            let ceiling: Egress = match serde_json::from_str(text) {
                Ok(c) => c,
                Err(e) => {
                    return refuse(
                        SessionReason::EgressCeiling,
                        format!(
                            "{} is not an egress policy in JSON ({e}): no session of the namespace opens until it is fixed",
                            named()
                        ),
                    );
                }
            };
            if let Some(problems) = problems(&ceiling) {
                return refuse(
                    SessionReason::EgressCeiling,
                    format!(
                        "{} is not a valid egress policy ({problems}): no session of the namespace opens until it is fixed",
                        named()
                    ),
                );
            }
            let effective = match (f.session_egress, &runtime) {
                (Some(session), _) => Some(("spec.egress".to_owned(), session)),
                (None, Some((name, policy))) => {
                    Some((format!("the policy of Runtime '{name}'"), policy))
                }
                (None, None) => None,
            };
            if let Some((whose, effective)) = effective
                && let Err(m) = effective.within(&ceiling)
            {
                return refuse(
                    SessionReason::EgressCeiling,
                    format!(
                        "{whose} is wider than the ceiling in {} ({}): {m}; narrow it with spec.egress or raise the ceiling",
                        named(),
                        ceiling.summary()
                    ),
                );
            }
            Some(ceiling)
        }
    };
    Ok(f.session_egress
        .cloned()
        .into_iter()
        .chain(ceiling)
        .collect())
}

/// What the operator does about an open session's egress policies, decided by [`change`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Its host already enforces what the session should have: nothing is sent.
    Keep,
    /// The host is sent these policies with an open of the session (which replaces the ones
    /// it had, live).
    Send(Vec<Egress>),
    /// The session's current policy is refused (why): the one sent before stays in force.
    Refuse(EgressRefusal),
}

/// What to do about an open session's egress policies: `decided` is [`decide`]'s answer now,
/// `sent` what its host was last sent (`None`: not known, a session opened before the operator
/// recorded it). A refusal keeps the old policies in force. A session left with nothing to add
/// (it dropped its `spec.egress`, its namespace has no ceiling) after its host was sent
/// something is sent `open` alone: an open naming no policy leaves the host's as they were, and
/// `open` narrows nothing under any Runtime's policy, now or after the Runtime is edited.
pub fn change(decided: Result<Vec<Egress>, EgressRefusal>, sent: Option<&[Egress]>) -> Change {
    let want = match decided {
        Err(refusal) => return Change::Refuse(refusal),
        Ok(want) => want,
    };
    match sent {
        Some(sent) if sent == want.as_slice() => Change::Keep,
        Some(sent) if want.is_empty() && (sent.is_empty() || sent == [Egress::open()]) => {
            Change::Keep
        }
        _ if want.is_empty() => Change::Send(vec![Egress::open()]),
        _ => Change::Send(want),
    }
}

/// A policy's problems in a line (`allow[1].domain: …; allow[2].cidr: …`), if it has any.
fn problems(policy: &Egress) -> Option<String> {
    let problems = policy.validate();
    (!problems.is_empty()).then(|| {
        problems
            .iter()
            .map(|(field, m)| format!("{field}: {m}"))
            .collect::<Vec<_>>()
            .join("; ")
    })
}

#[cfg(test)]
mod tests {
    use sandboxd_catalog::egress::{EgressMode, EgressRule};

    use super::*;

    fn allowlist(domains: &[&str]) -> Egress {
        Egress {
            mode: EgressMode::Allowlist,
            allow: domains
                .iter()
                .map(|d| EgressRule {
                    domain: Some((*d).to_owned()),
                    cidr: None,
                    ports: vec![],
                })
                .collect(),
        }
    }

    fn facts<'a>(
        needs_network: bool,
        runtime: Option<&'a Egress>,
        session: Option<&'a Egress>,
        ceiling: Option<&'a str>,
    ) -> EgressFacts<'a> {
        EgressFacts {
            runtime: Some("python"),
            needs_network,
            runtime_egress: runtime,
            session_egress: session,
            namespace: "team-a",
            ceiling,
        }
    }

    #[test]
    fn what_is_sent_to_an_open_session_on_a_change() {
        let pypi = allowlist(&["pypi.org"]);
        let docs = allowlist(&["docs.python.org"]);
        let open = Egress::open();
        let widened = EgressRefusal {
            reason: SessionReason::EgressWidened,
            message: "spec.egress widens the runtime's policy".to_owned(),
        };
        for (what, decided, sent, expected) in [
            (
                "the same as sent",
                Ok(vec![pypi.clone()]),
                Some(vec![pypi.clone()]),
                Change::Keep,
            ),
            (
                "nothing to add, nothing sent",
                Ok(vec![]),
                Some(vec![]),
                Change::Keep,
            ),
            (
                "a new narrowing",
                Ok(vec![docs.clone()]),
                Some(vec![pypi.clone()]),
                Change::Send(vec![docs.clone()]),
            ),
            (
                "a first narrowing of a session opened without one",
                Ok(vec![pypi.clone()]),
                Some(vec![]),
                Change::Send(vec![pypi.clone()]),
            ),
            (
                "a ceiling added after the session's own",
                Ok(vec![pypi.clone(), docs.clone()]),
                Some(vec![pypi.clone()]),
                Change::Send(vec![pypi.clone(), docs.clone()]),
            ),
            (
                "the narrowing dropped: open replaces it",
                Ok(vec![]),
                Some(vec![pypi.clone()]),
                Change::Send(vec![open.clone()]),
            ),
            (
                "dropped before, open sent: kept",
                Ok(vec![]),
                Some(vec![open.clone()]),
                Change::Keep,
            ),
            (
                "not known what was sent: sent once",
                Ok(vec![]),
                None,
                Change::Send(vec![open.clone()]),
            ),
            (
                "not known, a narrowing: sent once",
                Ok(vec![pypi.clone()]),
                None,
                Change::Send(vec![pypi.clone()]),
            ),
            (
                "refused: the old policy stays",
                Err(widened.clone()),
                Some(vec![pypi.clone()]),
                Change::Refuse(widened.clone()),
            ),
        ] {
            assert_eq!(change(decided, sent.as_deref()), expected, "{what}");
        }
    }

    #[test]
    fn what_an_open_sends_or_why_it_is_refused() {
        let pypi = allowlist(&["pypi.org", "*.pythonhosted.org"]);
        let only_pypi = allowlist(&["pypi.org"]);
        let evil = allowlist(&["pypi.org", "*.evil.test"]);
        let bad = allowlist(&["pypi_org"]);
        let pypi_json = r#"{"mode": "allowlist", "allow": [{"domain": "pypi.org"}, {"domain": "*.pythonhosted.org"}]}"#;
        let ok = |v: Vec<Egress>| Ok::<_, EgressRefusal>(v);
        let no = |reason, message: &str| {
            Err::<Vec<Egress>, _>(EgressRefusal {
                reason,
                message: message.to_owned(),
            })
        };
        for (what, f, expected) in [
            (
                "nothing to add: the runtime's policy alone",
                facts(true, None, None, None),
                ok(vec![]),
            ),
            (
                "a narrowing is sent",
                facts(false, Some(&pypi), Some(&only_pypi), None),
                ok(vec![only_pypi.clone()]),
            ),
            (
                "any allowlist narrows an open runtime",
                facts(true, None, Some(&evil), None),
                ok(vec![evil.clone()]),
            ),
            (
                "none narrows anything",
                facts(
                    false,
                    Some(&pypi),
                    Some(&Egress::none()),
                    Some(r#"{"mode": "none"}"#),
                ),
                ok(vec![Egress::none(), Egress::none()]),
            ),
            (
                "the ceiling is sent after the session's own",
                facts(true, None, Some(&only_pypi), Some(pypi_json)),
                ok(vec![only_pypi.clone(), pypi.clone()]),
            ),
            (
                "a runtime within the ceiling",
                facts(false, Some(&pypi), None, Some(pypi_json)),
                ok(vec![pypi.clone()]),
            ),
            (
                "a session widening its runtime",
                facts(false, Some(&pypi), Some(&evil), None),
                no(
                    SessionReason::EgressWidened,
                    "spec.egress widens the runtime's policy (Runtime 'python', allowlist: pypi.org, *.pythonhosted.org): allow[1] (domain *.evil.test, ports 443, 80) is not within the wider policy; a session may only narrow it",
                ),
            ),
            (
                "open over a runtime without network",
                facts(false, None, Some(&Egress::open()), None),
                no(
                    SessionReason::EgressWidened,
                    "spec.egress widens the runtime's policy (Runtime 'python', none): mode open is wider than none; a session may only narrow it",
                ),
            ),
            (
                "an open runtime over an allowlist ceiling",
                facts(true, None, None, Some(pypi_json)),
                no(
                    SessionReason::EgressCeiling,
                    "the policy of Runtime 'python' is wider than the ceiling in the annotation sandboxd.dev/egress-ceiling of namespace 'team-a' (allowlist: pypi.org, *.pythonhosted.org): mode open is wider than allowlist; narrow it with spec.egress or raise the ceiling",
                ),
            ),
            (
                "a session over the ceiling",
                facts(true, None, Some(&evil), Some(pypi_json)),
                no(
                    SessionReason::EgressCeiling,
                    "spec.egress is wider than the ceiling in the annotation sandboxd.dev/egress-ceiling of namespace 'team-a' (allowlist: pypi.org, *.pythonhosted.org): allow[1] (domain *.evil.test, ports 443, 80) is not within the wider policy; narrow it with spec.egress or raise the ceiling",
                ),
            ),
            (
                "a ceiling that is not JSON",
                facts(true, None, None, Some("pypi.org")),
                no(
                    SessionReason::EgressCeiling,
                    "the annotation sandboxd.dev/egress-ceiling of namespace 'team-a' is not an egress policy in JSON (expected value at line 1 column 1): no session of the namespace opens until it is fixed",
                ),
            ),
            (
                "a ceiling of another shape",
                facts(true, None, None, Some(r#"{"mode": "closed"}"#)),
                no(
                    SessionReason::EgressCeiling,
                    "the annotation sandboxd.dev/egress-ceiling of namespace 'team-a' is not an egress policy in JSON (unknown variant `closed`, expected one of `none`, `allowlist`, `open` at line 1 column 17): no session of the namespace opens until it is fixed",
                ),
            ),
            (
                "a ceiling that is not valid",
                facts(
                    true,
                    None,
                    None,
                    Some(r#"{"mode": "allowlist", "allow": [{"domain": "*"}]}"#),
                ),
                no(
                    SessionReason::EgressCeiling,
                    "the annotation sandboxd.dev/egress-ceiling of namespace 'team-a' is not a valid egress policy (allow[0].domain: '*': '*' is allowed only as the whole first label (*.example.com)): no session of the namespace opens until it is fixed",
                ),
            ),
            (
                "an invalid session policy",
                facts(true, None, Some(&bad), None),
                no(
                    SessionReason::EgressInvalid,
                    "spec.egress is invalid (allow[0].domain: 'pypi_org': label 'pypi_org' may hold only letters, digits and '-'): delete the session and create it with a valid one",
                ),
            ),
            (
                "no Runtime object: only the session's own is checked against the ceiling",
                EgressFacts {
                    runtime: None,
                    ..facts(true, None, None, Some(pypi_json))
                },
                ok(vec![pypi.clone()]),
            ),
            (
                "no Runtime object, a session over the ceiling",
                EgressFacts {
                    runtime: None,
                    ..facts(true, None, Some(&Egress::open()), Some(pypi_json))
                },
                no(
                    SessionReason::EgressCeiling,
                    "spec.egress is wider than the ceiling in the annotation sandboxd.dev/egress-ceiling of namespace 'team-a' (allowlist: pypi.org, *.pythonhosted.org): mode open is wider than allowlist; narrow it with spec.egress or raise the ceiling",
                ),
            ),
            (
                "an invalid runtime policy",
                facts(true, Some(&allowlist(&["a..b"])), None, None),
                no(
                    SessionReason::EgressInvalid,
                    "Runtime 'python' has an invalid spec.egress (allow[0].domain: 'a..b' has an empty label): fix the Runtime and this session opens by itself",
                ),
            ),
        ] {
            assert_eq!(decide(&f), expected, "{what}");
        }
    }
}
