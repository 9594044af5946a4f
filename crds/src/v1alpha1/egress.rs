//! The egress policy as the custom resources carry it (`Runtime.spec.egress`,
//! `SandboxSession.spec.egress`): the shape of [`sandboxd_catalog::egress::Egress`] with the
//! bounds the API server enforces. What a policy allows is decided only by the catalog's type;
//! these convert to it and from it without loss of what a policy allows. A policy's
//! `credentials` (headers sandboxd's egress proxy adds, their values from Secrets) are the
//! operator's alone: the conversion leaves them out, so they never change what is allowed nor
//! whether a session's policy narrows its Runtime's.

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
#[x_kube(validation = Rule::new("self.mode == 'allowlist' || !has(self.credentials) || size(self.credentials) == 0").message("egress.credentials is allowed only with mode allowlist: only an allowlist's connections go through the egress proxy that adds them"))]
pub struct Egress {
    /// none (no network), allowlist (only what allow lists) or open (any destination).
    pub mode: EgressMode,
    /// With mode allowlist: the destinations allowed, at most 256.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub allow: Vec<EgressRule>,
    /// With mode allowlist: headers the node's egress proxy sets on requests to a host (TLS
    /// ended there), their values from Secrets the sandbox never sees, at most 16. Each host
    /// must be allowed on each of its ports by this policy and by every policy the session is
    /// bound by. A Runtime's come from Secrets in the operator's namespace, a session's from
    /// Secrets in its own; only Secrets labelled sandboxd.dev/egress-credential=true are used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub credentials: Vec<EgressCredential>,
}

/// The header a credential sets when it is not named.
pub const DEFAULT_CREDENTIAL_HEADER: &str = "Authorization";
/// The value of a credential's header when no format is given: the Secret's value alone.
pub const DEFAULT_CREDENTIAL_FORMAT: &str = "{}";
/// What a credential's format holds exactly once: where the Secret's value goes.
pub const CREDENTIAL_PLACEHOLDER: &str = "{}";
/// The headers a credential may not set: they frame the request or the connection.
pub const FORBIDDEN_CREDENTIAL_HEADERS: [&str; 8] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
];

fn default_credential_ports() -> Vec<u16> {
    vec![443]
}

fn default_credential_header() -> String {
    DEFAULT_CREDENTIAL_HEADER.to_owned()
}

fn default_credential_format() -> String {
    DEFAULT_CREDENTIAL_FORMAT.to_owned()
}

/// One credential: a header set on every request to `host` on one of `ports` through the
/// egress proxy, its value `format` with the Secret's value in place of `{}`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EgressCredential {
    /// The exact host name the header is set for (api.example.com): lowercase, no wildcard,
    /// no port, no scheme.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("egress.credentials[].host must be an exact lowercase DNS name (api.example.com): no wildcard, no port, no scheme"))]
    pub host: String,
    /// The ports it is set on (1 to 65535, each once, at most 16); defaults to 443.
    #[serde(default = "default_credential_ports")]
    #[schemars(
        with = "Vec<i32>",
        length(min = 1, max = 16),
        inner(range(min = 1, max = 65535))
    )]
    #[x_kube(validation = Rule::new("self.all(p, self.exists_one(q, q == p))").message("egress.credentials[].ports lists a port more than once"))]
    pub ports: Vec<u16>,
    /// The header set, replacing any the sandbox sent; defaults to Authorization. An HTTP
    /// token, and none of Host, Content-Length, Transfer-Encoding, Connection, Upgrade, TE,
    /// Trailer, Keep-Alive.
    #[serde(default = "default_credential_header")]
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new(r#"self.matches("^[-!#$%&'*+.^_`|~0-9A-Za-z]+$")"#).message("egress.credentials[].header must be an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)"))]
    #[x_kube(validation = Rule::new("!(self.lowerAscii() in ['host', 'content-length', 'transfer-encoding', 'connection', 'upgrade', 'te', 'trailer', 'keep-alive'])").message("egress.credentials[].header may not be Host, Content-Length, Transfer-Encoding, Connection, Upgrade, TE, Trailer or Keep-Alive: they frame the request, not credentials"))]
    pub header: String,
    /// The header's value with {} where the Secret's value goes, exactly once (Bearer {});
    /// defaults to {}, the value alone.
    #[serde(default = "default_credential_format")]
    #[schemars(length(min = 2, max = 256))]
    #[x_kube(validation = Rule::new("self.indexOf('{}') >= 0 && self.indexOf('{}') == self.lastIndexOf('{}')").message("egress.credentials[].format must contain {} exactly once, where the Secret's value goes (Bearer {})"))]
    pub format: String,
    /// The Secret and its key holding the value: in the operator's namespace for a Runtime's
    /// credential, in the session's own namespace for a session's. The Secret must carry the
    /// label sandboxd.dev/egress-credential=true.
    pub secret_ref: CredentialSecretRef,
}

/// The Secret a credential's value is read from: by name, in a namespace fixed by who declares
/// the credential (the operator's for a Runtime, the session's own for a session).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.__namespace__)").message("egress.credentials[].secretRef.namespace is not allowed: a Runtime's Secret lives in the operator's namespace, a session's in the session's own namespace"))]
pub struct CredentialSecretRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key of the Secret's data holding the value.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
    /// Not allowed: the namespace is fixed by who declares the credential. Here only so that
    /// naming one is refused with words, not dropped without a word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
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
            credentials: Vec::new(),
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

    #[test]
    fn credentials_take_their_defaults_and_never_reach_the_policy_that_is_matched() {
        let text = r#"{"mode":"allowlist","allow":[{"domain":"api.test"}],"credentials":[{"host":"api.test","secretRef":{"name":"model-key","key":"token"}},{"host":"api.test","ports":[8443],"header":"X-Api-Key","format":"Key {}","secretRef":{"name":"k","key":"v"}}]}"#;
        let ours: Egress = serde_json::from_str(text).expect("CRD shape");
        let first = &ours.credentials[0];
        assert_eq!(
            (
                first.ports.as_slice(),
                first.header.as_str(),
                first.format.as_str()
            ),
            (&[443][..], "Authorization", "{}")
        );
        assert_eq!(first.secret_ref.namespace, None);
        assert_eq!(ours.credentials[1].format, "Key {}");
        // What a policy allows, and whether it narrows another, ignores its credentials.
        let without: Egress =
            serde_json::from_str(r#"{"mode":"allowlist","allow":[{"domain":"api.test"}]}"#)
                .expect("CRD shape");
        assert_eq!(
            catalog::Egress::from(&ours),
            catalog::Egress::from(&without)
        );
        assert_eq!(
            Egress::from(&catalog::Egress::from(&ours)).credentials,
            vec![]
        );
        // Written back: camelCase, the defaults spelled out.
        let written = serde_json::to_value(&ours).expect("serialises");
        assert_eq!(
            written["credentials"][0],
            serde_json::json!({"host":"api.test","ports":[443],"header":"Authorization","format":"{}","secretRef":{"name":"model-key","key":"token"}})
        );
    }
}
