//! What a running operator publishes about itself: the leader writes its `--selector` on its
//! leader-election Lease, which carries [`LABEL`], so `kubectl sandbox open` can tell a person
//! which operators run and which sessions they handle when none picks a session up.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// The label of every operator's Lease (value `"true"`): what a client lists them by.
pub const LABEL: &str = "sandboxd.dev/operator";
/// The annotation with the leader's `--selector` (empty: it handles every object).
pub const SELECTOR_ANNOTATION: &str = "sandboxd.dev/selector";

/// One running operator, as its Lease shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The Lease, `namespace/name`.
    pub lease: String,
    /// The replica holding it.
    pub holder: String,
    /// Its `--selector` (empty: every object).
    pub selector: String,
}

/// The operator behind `lease` if it is running at `now` (renewed within its duration) and
/// published its selector; None otherwise.
pub fn running(lease: &Lease, now: Timestamp) -> Option<Published> {
    let spec = lease.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref()?.0;
    let seconds = spec.lease_duration_seconds?;
    let end = renewed
        .checked_add(SignedDuration::from_secs(i64::from(seconds)))
        .ok()?;
    if end < now {
        return None;
    }
    let meta = &lease.metadata;
    Some(Published {
        lease: format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        ),
        holder: spec.holder_identity.clone().unwrap_or_default(),
        selector: meta.annotations.as_ref()?.get(SELECTOR_ANNOTATION)?.clone(),
    })
}

/// The labels an object needs to match `selector`, when it is made of equality terms alone
/// (`k=v`, `k==v`); None for a selector with other terms (`k!=v`, `k in (…)`, `!k`, `k`).
pub fn labels_to_match(selector: &str) -> Option<Vec<(String, String)>> {
    selector
        .split(',')
        .map(str::trim)
        .filter(|term| !term.is_empty())
        .map(|term| {
            if term.contains("!=") || term.contains('(') {
                return None;
            }
            let (k, v) = term.split_once("==").or_else(|| term.split_once('='))?;
            Some((k.trim().to_owned(), v.trim().to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    fn lease(renewed: Timestamp, selector: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("sandbox-operator".into()),
                namespace: Some("sandboxd-demo".into()),
                annotations: selector
                    .map(|s| [(SELECTOR_ANNOTATION.to_owned(), s.to_owned())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("op-0".into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(renewed)),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_lease_renewed_within_its_duration_is_a_running_operator() {
        let now = Timestamp::from_second(1_000_000).expect("time");
        let fresh = now - SignedDuration::from_secs(10);
        assert_eq!(
            running(&lease(fresh, Some("sandboxd.dev/demo=true")), now),
            Some(Published {
                lease: "sandboxd-demo/sandbox-operator".into(),
                holder: "op-0".into(),
                selector: "sandboxd.dev/demo=true".into(),
            })
        );
        let stale = now - SignedDuration::from_secs(16);
        assert_eq!(running(&lease(stale, Some("")), now), None);
        assert_eq!(running(&lease(fresh, None), now), None);
    }

    #[test]
    fn equality_selectors_become_labels_and_others_do_not() {
        assert_eq!(
            labels_to_match("sandboxd.dev/demo=true, team==a"),
            Some(vec![
                ("sandboxd.dev/demo".into(), "true".into()),
                ("team".into(), "a".into())
            ])
        );
        assert_eq!(labels_to_match(""), Some(vec![]));
        assert_eq!(labels_to_match("team!=a"), None);
        assert_eq!(labels_to_match("team in (a,b)"), None);
        assert_eq!(labels_to_match("team"), None);
    }
}
