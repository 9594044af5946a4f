//! The egress policy as the custom resources carry it (`Runtime.spec.egress`,
//! `SandboxSession.spec.egress`): the shape of [`sandboxd_catalog::egress::Egress`] with the
//! bounds the API server enforces. What a policy allows is decided only by the catalog's type;
//! these convert to it and from it without loss.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use sandboxd_catalog::egress as catalog;

/// How much network a sandbox gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EgressMode {
    /// No network at all.
    None,
    /// Only the names and networks `allow` lists.
    Allowlist,
    /// Any destination.
    Open,
}

/// An egress policy: where a sandbox may connect.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("self.mode == 'allowlist' || !has(self.allow) || size(self.allow) == 0").message("egress.allow is allowed only with mode allowlist: mode none allows nothing, open allows everything"))]
pub struct Egress {
    /// none (no network), allowlist (only what allow lists) or open (any destination).
    pub mode: EgressMode,
    /// With mode allowlist: the destinations allowed, at most 256.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub allow: Vec<EgressRule>,
}

/// One destination of an allowlist: a name or an IPv4 network, and its ports.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("has(self.domain) != has(self.cidr)").message("each egress.allow entry needs exactly one of domain (a name) and cidr (an IPv4 network a.b.c.d/n)"))]
pub struct EgressRule {
    /// An exact name (pypi.org), or *.x for every name under x (a.x, a.b.x) but not x itself.
    /// Case does not matter. Exclusive with cidr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub domain: Option<String>,
    /// An IPv4 network a.b.c.d/n with the host bits zero, for a destination without a name.
    /// Exclusive with domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 9, max = 18))]
    pub cidr: Option<String>,
    /// The ports allowed (1 to 65535, each once, at most 16); none listed means 443 and 80.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    // An integer of the API's own format (the server warns about uint16), bounded to a port.
    #[schemars(
        with = "Vec<i32>",
        length(max = 16),
        inner(range(min = 1, max = 65535))
    )]
    #[x_kube(validation = Rule::new("self.all(p, self.exists_one(q, q == p))").message("egress.allow[].ports lists a port more than once"))]
    pub ports: Vec<u16>,
}

impl From<EgressMode> for catalog::EgressMode {
    fn from(m: EgressMode) -> Self {
        match m {
            EgressMode::None => Self::None,
            EgressMode::Allowlist => Self::Allowlist,
            EgressMode::Open => Self::Open,
        }
    }
}

impl From<catalog::EgressMode> for EgressMode {
    fn from(m: catalog::EgressMode) -> Self {
        match m {
            catalog::EgressMode::None => Self::None,
            catalog::EgressMode::Allowlist => Self::Allowlist,
            catalog::EgressMode::Open => Self::Open,
        }
    }
}

impl From<&Egress> for catalog::Egress {
    fn from(e: &Egress) -> Self {
        Self {
            mode: e.mode.into(),
            allow: e
                .allow
                .iter()
                .map(|r| catalog::EgressRule {
                    domain: r.domain.clone(),
                    cidr: r.cidr.clone(),
                    ports: r.ports.clone(),
                })
                .collect(),
        }
    }
}

impl From<&catalog::Egress> for Egress {
    fn from(e: &catalog::Egress) -> Self {
        Self {
            mode: e.mode.into(),
            allow: e
                .allow
                .iter()
                .map(|r| EgressRule {
                    domain: r.domain.clone(),
                    cidr: r.cidr.clone(),
                    ports: r.ports.clone(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_both_ways_without_loss_and_serialises_alike() {
        let text = r#"{"mode":"allowlist","allow":[{"domain":"pypi.org"},{"domain":"*.pythonhosted.org","ports":[443]},{"cidr":"203.0.113.0/24","ports":[22,443]}]}"#;
        let ours: Egress = serde_json::from_str(text).expect("CRD shape");
        let theirs: catalog::Egress = serde_json::from_str(text).expect("catalog shape");
        assert_eq!(catalog::Egress::from(&ours), theirs);
        assert_eq!(Egress::from(&theirs), ours);
        assert_eq!(serde_json::to_string(&ours).expect("serialises"), text);
        for mode in ["none", "open"] {
            let text = format!(r#"{{"mode":"{mode}"}}"#);
            let ours: Egress = serde_json::from_str(&text).expect("CRD shape");
            assert_eq!(serde_json::to_string(&ours).expect("serialises"), text);
        }
    }
}
