//! Where a new session goes: a ready, enabled host with room and the runtime, the least loaded
//! first; a pin is honoured or refused, never silently replaced.

/// What placement knows about one host.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The SandboxHost name.
    pub name: String,
    /// Ready condition is True (reachable, versions match).
    pub ready: bool,
    /// `spec.disabled`.
    pub disabled: bool,
    /// Sessions it holds.
    pub sessions: u32,
    /// Its cap.
    pub max_sessions: u32,
    /// Whether the runtime is built there (None: not known, e.g. an image runtime). A host
    /// that has it is preferred; one still building it is chosen when no other can take the
    /// session, and the session waits there in Preparing.
    pub runtime_ready: Option<bool>,
    /// The host's workspace budget as (held, budget, a new workspace's size), bytes; `None`
    /// where workspaces are not limited. A host whose budget has no room for one more
    /// workspace is not chosen: sandboxd would refuse the open.
    pub workspaces: Option<(u64, u64, u64)>,
    /// The isolation level the session's runtime needs that this host's dockerd does not offer
    /// (`None`: it offers what is needed). Such a host is never chosen.
    pub lacks_isolation: Option<String>,
}

/// Why no host was chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The pinned host does not exist.
    #[error("the pinned host '{0}' does not exist")]
    PinnedMissing(String),
    /// The pinned host cannot take the session now.
    #[error("the pinned host '{host}' cannot take sessions now: {why}")]
    PinnedUnavailable {
        /// The host.
        host: String,
        /// Why.
        why: String,
    },
    /// No host can take it.
    #[error("no host can take the session: {0}")]
    NoHost(String),
}

fn why_not(c: &Candidate) -> Option<String> {
    if c.disabled {
        Some("it is disabled".into())
    } else if let Some(level) = &c.lacks_isolation {
        Some(format!(
            "its dockerd does not offer isolation {level} (runsc for gvisor: see the SandboxHost's status.isolation)"
        ))
    } else if !c.ready {
        Some("it is not ready".into())
    } else if c.max_sessions > 0 && c.sessions >= c.max_sessions {
        Some(format!(
            "it holds {} of {} sessions",
            c.sessions, c.max_sessions
        ))
    } else if let Some((held, budget, size)) = c.workspaces
        && held.saturating_add(size) > budget
    {
        Some(format!(
            "its workspaces hold {} of its {} budget, no room for one of {}",
            gib(held),
            gib(budget),
            gib(size)
        ))
    } else {
        None
    }
}

/// Bytes in GiB, as the budget is usually set.
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// Picks a host for a session, honouring `pin`.
pub fn place(candidates: &[Candidate], pin: Option<&str>) -> Result<String, PlacementError> {
    if let Some(pin) = pin.filter(|p| !p.is_empty()) {
        let c = candidates
            .iter()
            .find(|c| c.name == pin)
            .ok_or_else(|| PlacementError::PinnedMissing(pin.to_owned()))?;
        return match why_not(c) {
            None => Ok(c.name.clone()),
            Some(why) => Err(PlacementError::PinnedUnavailable {
                host: c.name.clone(),
                why,
            }),
        };
    }
    let load = |c: &Candidate| {
        if c.max_sessions == 0 {
            0.0
        } else {
            f64::from(c.sessions) / f64::from(c.max_sessions)
        }
    };
    candidates
        .iter()
        .filter(|c| why_not(c).is_none())
        .min_by(|a, b| {
            let building = |c: &Candidate| c.runtime_ready == Some(false);
            building(a)
                .cmp(&building(b))
                .then_with(|| load(a).total_cmp(&load(b)))
                .then_with(|| a.sessions.cmp(&b.sessions))
                .then_with(|| a.name.cmp(&b.name))
        })
        .map(|c| c.name.clone())
        .ok_or_else(|| {
            if candidates.is_empty() {
                PlacementError::NoHost("no SandboxHost is registered".into())
            } else {
                PlacementError::NoHost(
                    candidates
                        .iter()
                        .filter_map(|c| why_not(c).map(|w| format!("{}: {w}", c.name)))
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, sessions: u32, max: u32) -> Candidate {
        Candidate {
            name: name.into(),
            ready: true,
            disabled: false,
            sessions,
            max_sessions: max,
            runtime_ready: None,
            workspaces: None,
            lacks_isolation: None,
        }
    }

    #[test]
    fn least_loaded_ready_enabled_host_with_room_wins() {
        let hosts = [
            host("a", 5, 20),
            host("b", 2, 20),
            Candidate {
                disabled: true,
                ..host("c", 0, 20)
            },
            Candidate {
                ready: false,
                ..host("d", 0, 20)
            },
        ];
        assert_eq!(place(&hosts, None), Ok("b".into()));
        let full = [
            host("a", 20, 20),
            Candidate {
                disabled: true,
                ..host("b", 0, 20)
            },
        ];
        assert_eq!(
            place(&full, None),
            Err(PlacementError::NoHost(
                "a: it holds 20 of 20 sessions; b: it is disabled".into()
            ))
        );
        // A host with the runtime built wins over a less loaded one still building it; a
        // building host is still chosen when it is the only one with room.
        let building = [
            Candidate {
                runtime_ready: Some(false),
                ..host("a", 0, 20)
            },
            Candidate {
                runtime_ready: Some(true),
                ..host("b", 9, 20)
            },
        ];
        assert_eq!(place(&building, None), Ok("b".into()));
        assert_eq!(place(&building[..1], None), Ok("a".into()));
        assert_eq!(
            place(&[], None),
            Err(PlacementError::NoHost(
                "no SandboxHost is registered".into()
            ))
        );
    }

    #[test]
    fn a_host_whose_workspace_budget_is_spent_is_passed_over() {
        let gib = 1u64 << 30;
        let hosts = [
            Candidate {
                workspaces: Some((92 * gib, 95 * gib, 4 * gib)),
                ..host("a", 1, 20)
            },
            Candidate {
                workspaces: Some((40 * gib, 95 * gib, 4 * gib)),
                ..host("b", 9, 20)
            },
        ];
        assert_eq!(place(&hosts, None), Ok("b".into()));
        assert_eq!(
            place(&hosts[..1], None),
            Err(PlacementError::NoHost(
                "a: its workspaces hold 92.0 GiB of its 95.0 GiB budget, no room for one of 4.0 GiB"
                    .into()
            ))
        );
    }

    #[test]
    fn a_gvisor_session_goes_only_where_dockerd_offers_gvisor() {
        let hosts = [
            Candidate {
                lacks_isolation: Some("gvisor".into()),
                ..host("a", 0, 20)
            },
            host("b", 9, 20),
        ];
        assert_eq!(
            place(&hosts, None),
            Ok("b".into()),
            "the idle host lacks gvisor"
        );
        assert_eq!(
            place(&hosts[..1], None),
            Err(PlacementError::NoHost(
                "a: its dockerd does not offer isolation gvisor (runsc for gvisor: see the SandboxHost's status.isolation)"
                    .into()
            ))
        );
    }

    #[test]
    fn a_pin_is_honoured_or_refused() {
        let hosts = [
            host("a", 5, 20),
            host("b", 2, 20),
            Candidate {
                disabled: true,
                ..host("c", 0, 20)
            },
        ];
        assert_eq!(place(&hosts, Some("a")), Ok("a".into()));
        assert_eq!(
            place(&hosts, Some("c")),
            Err(PlacementError::PinnedUnavailable {
                host: "c".into(),
                why: "it is disabled".into()
            })
        );
        assert_eq!(
            place(&hosts, Some("z")),
            Err(PlacementError::PinnedMissing("z".into()))
        );
    }
}
