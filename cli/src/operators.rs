//! Which running operators would handle a session, from what each leader publishes on its
//! Lease (`sandboxd_crds::lease`): its `--selector`. `open` asks when no operator has reported
//! on a new session within a few seconds, so a session no operator selects is named at once
//! instead of waiting out `--timeout`.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use sandboxd_crds::lease::{self, Published};
use sandboxd_crds::v1alpha1::SandboxSession;

/// What the running operators make of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handling {
    /// A running operator's selector matches it: that operator will report on it.
    Handled,
    /// Operators run, and none of their selectors matches it.
    Unhandled(Vec<Published>),
    /// No operator runs: no Lease labelled `sandboxd.dev/operator` was renewed in time.
    NoneRunning,
    /// The operators cannot be seen (why, in words).
    Unknown(String),
}

/// The running operators (every namespace's Leases labelled [`lease::LABEL`]), those with a
/// Lease in `namespace` first.
pub async fn running(client: &Client, namespace: &str) -> Result<Vec<Published>, kube::Error> {
    let leases = Api::<Lease>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{}=true", lease::LABEL)))
        .await?;
    let now = Timestamp::now();
    let mut running: Vec<(bool, Published)> = leases
        .items
        .iter()
        .filter_map(|l| {
            let here = l.namespace().as_deref() == Some(namespace);
            lease::running(l, now).map(|p| (!here, p))
        })
        .collect();
    running.sort_by(|a, b| (a.0, &a.1.lease).cmp(&(b.0, &b.1.lease)));
    Ok(running.into_iter().map(|(_, p)| p).collect())
}

/// Whether a running operator handles `session`: the API server answers whether the session
/// matches each operator's selector, exactly as the operator's watch sees it.
pub async fn handling(client: &Client, session: &SandboxSession) -> Handling {
    let namespace = session.namespace().unwrap_or_default();
    let operators = match running(client, &namespace).await {
        Ok(o) => o,
        Err(e) => return Handling::Unknown(format!("listing Leases: {e}")),
    };
    if operators.is_empty() {
        return Handling::NoneRunning;
    }
    let sessions = Api::<SandboxSession>::namespaced(client.clone(), &namespace);
    let by_name = format!("metadata.name={}", session.name_any());
    for op in &operators {
        if op.selector.is_empty() {
            return Handling::Handled;
        }
        let lp = ListParams::default()
            .labels(&op.selector)
            .fields(&by_name)
            .limit(1);
        match sessions.list(&lp).await {
            Ok(found) if !found.items.is_empty() => return Handling::Handled,
            Ok(_) => {}
            // A selector the API server cannot read matches nothing here; the operator's own
            // watch would fail the same way.
            Err(kube::Error::Api(s)) if s.code == 400 => {}
            Err(e) => return Handling::Unknown(format!("listing SandboxSessions: {e}")),
        }
    }
    Handling::Unhandled(operators)
}

/// The selectors of `operators`, in words: `` `k=v` (Lease ns/name), … ``.
pub fn selectors(operators: &[Published]) -> String {
    operators
        .iter()
        .map(|o| format!("`{}` (Lease {})", o.selector, o.lease))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `-l k=v` arguments that make a session match `operator`'s selector, or None when the
/// selector is not made of `k=v` terms alone.
pub fn label_args(operator: &Published) -> Option<String> {
    let labels = lease::labels_to_match(&operator.selector)?;
    Some(labels.iter().map(|(k, v)| format!(" -l {k}={v}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(selector: &str) -> Published {
        Published {
            lease: "sandboxd-demo/sandbox-operator".into(),
            holder: "op-0".into(),
            selector: selector.into(),
        }
    }

    #[test]
    fn selectors_are_named_with_their_lease() {
        assert_eq!(
            selectors(&[op("sandboxd.dev/demo=true")]),
            "`sandboxd.dev/demo=true` (Lease sandboxd-demo/sandbox-operator)"
        );
    }

    #[test]
    fn an_equality_selector_becomes_label_arguments() {
        assert_eq!(
            label_args(&op("sandboxd.dev/demo=true,team=a")).as_deref(),
            Some(" -l sandboxd.dev/demo=true -l team=a")
        );
        assert_eq!(label_args(&op("team in (a,b)")), None);
    }
}
