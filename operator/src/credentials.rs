//! Egress credentials (issue #30): headers sandboxd's egress proxy sets on a sandbox's requests
//! to a host, their values read from Secrets the sandbox never sees. Declared in
//! `spec.egress.credentials` of a Runtime (Secrets in the operator's namespace) and of a
//! SandboxSession (Secrets in the session's own namespace); only Secrets labelled
//! [`LABEL`]`=true` are used, the only ones the operator watches.
//!
//! Pure: which credentials a session has ([`declared`]), whether the policies it is bound by
//! allow each ([`check`]), the set handed to its host with a version that changes with the
//! Secrets' versions and never with their values ([`wanted`]), what its status shows
//! ([`status_of`]), and which sessions a Secret's change concerns ([`sessions_referencing`]).
//! The session controller reads the objects and calls the host (`session::credentials`).
//!
//! Over 700 lines with its table tests; the logic is under 360.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use sandboxd_api::egress::{CredentialSet, CredentialValue, MAX_CREDENTIAL_VALUE, MAX_CREDENTIALS};
use sandboxd_catalog::egress::Egress;
use sandboxd_crds::v1alpha1::egress::{
    CREDENTIAL_PLACEHOLDER, EgressCredential, FORBIDDEN_CREDENTIAL_HEADERS,
};
use sandboxd_crds::v1alpha1::session::CredentialStatus;
use sandboxd_crds::v1alpha1::{Runtime, SandboxSession};

/// The label a Secret must carry (value `true`) for a credential to use it; the operator
/// watches only Secrets with it.
pub const LABEL: &str = "sandboxd.dev/egress-credential";

/// The label selector of the operator's Secret watch.
pub fn selector() -> String {
    format!("{LABEL}=true")
}

/// One credential a session has, with who declared it and where its Secret lives.
#[derive(Debug, Clone, PartialEq)]
pub struct Declared<'a> {
    /// The credential.
    pub credential: &'a EgressCredential,
    /// Where it is declared, for messages: `spec.egress.credentials[0]` (the session's) or
    /// `Runtime 'agents' spec.egress.credentials[0]`.
    pub field: String,
    /// The namespace of its Secret: the operator's for a Runtime's, the session's for its own.
    pub namespace: String,
    /// Whose it is: the Runtime's name, or `None` for the session's own.
    pub runtime: Option<String>,
}

impl Declared<'_> {
    /// `Secret <ns>/<name>, key <key>`: where the value comes from, never the value.
    pub fn source(&self) -> String {
        let r = &self.credential.secret_ref;
        format!("Secret {}/{}, key {}", self.namespace, r.name, r.key)
    }

    fn secret(&self) -> String {
        format!("{}/{}", self.namespace, self.credential.secret_ref.name)
    }
}

/// The credentials of a session: its Runtime's (Secrets in `operator_namespace`), then its
/// own (Secrets in its namespace).
pub fn declared<'a>(
    runtime: Option<&'a Runtime>,
    session: &'a SandboxSession,
    operator_namespace: &str,
) -> Vec<Declared<'a>> {
    let mut out = Vec::new();
    if let Some(rt) = runtime
        && let Some(e) = &rt.spec.egress
    {
        let name = rt.name_any();
        out.extend(e.credentials.iter().enumerate().map(|(i, c)| Declared {
            credential: c,
            field: format!("Runtime '{name}' spec.egress.credentials[{i}]"),
            namespace: operator_namespace.to_owned(),
            runtime: Some(name.clone()),
        }));
    }
    if let Some(e) = &session.spec.egress {
        let namespace = session.namespace().unwrap_or_default();
        out.extend(e.credentials.iter().enumerate().map(|(i, c)| Declared {
            credential: c,
            field: format!("spec.egress.credentials[{i}]"),
            namespace: namespace.clone(),
            runtime: None,
        }));
    }
    out
}

/// What is wrong with a credential by itself (what the CRD's rules also refuse), if anything.
pub fn problems(c: &EgressCredential) -> Option<String> {
    let host_ok = !c.host.is_empty()
        && c.host.len() <= 253
        && c.host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if !host_ok {
        return Some(format!(
            "host '{}' is not an exact lowercase DNS name (no wildcard, no port, no scheme)",
            c.host
        ));
    }
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if c.header.is_empty() || !c.header.bytes().all(token) {
        return Some(format!("header '{}' is not an HTTP header name", c.header));
    }
    if FORBIDDEN_CREDENTIAL_HEADERS
        .iter()
        .any(|h| h.eq_ignore_ascii_case(&c.header))
    {
        return Some(format!(
            "header '{}' frames the request and may not be set by a credential",
            c.header
        ));
    }
    if c.format.matches(CREDENTIAL_PLACEHOLDER).count() != 1 {
        return Some(format!(
            "format '{}' must contain {CREDENTIAL_PLACEHOLDER} exactly once",
            c.format
        ));
    }
    if c.ports.is_empty()
        || c.ports.contains(&0)
        || c.ports
            .iter()
            .enumerate()
            .any(|(i, p)| c.ports[..i].contains(p))
    {
        return Some("ports must list 1 to 16 ports from 1 to 65535, each once".to_owned());
    }
    if c.secret_ref.namespace.is_some() {
        return Some(
            "secretRef.namespace is not allowed: a Runtime's Secret lives in the operator's namespace, a session's in its own".to_owned(),
        );
    }
    None
}

/// Whether the session's credentials may be handed over: at most [`MAX_CREDENTIALS`], each
/// valid by itself, and each host allowed on each of its ports by every policy in `bound`
/// (labelled for messages: `Runtime 'agents'`, `this session's spec.egress`, the namespace's
/// ceiling). Err: the first refusal, in words naming the credential and the policy.
pub fn check(declared: &[Declared<'_>], bound: &[(String, &Egress)]) -> Result<(), String> {
    if declared.len() > MAX_CREDENTIALS {
        return Err(format!(
            "the session has {} egress credentials (its Runtime's and its own): at most {MAX_CREDENTIALS}",
            declared.len()
        ));
    }
    for d in declared {
        let c = d.credential;
        if let Some(p) = problems(c) {
            return Err(format!("{}: {p}", d.field));
        }
        for &port in &c.ports {
            if let Some((whose, policy)) = bound.iter().find(|(_, p)| !p.allows(&c.host, port)) {
                return Err(format!(
                    "{}: {}:{port} is not on the allow list of {whose} ({}): allow it there or remove the credential",
                    d.field,
                    c.host,
                    policy.summary()
                ));
            }
        }
    }
    Ok(())
}

/// The value of credential `d` from its Secret (`None`: not found among the labelled ones), or
/// why there is none, in words that name the Secret and never hold the value.
fn value_of(d: &Declared<'_>, secret: Option<&Secret>) -> Result<String, String> {
    let whose = if d.runtime.is_some() {
        format!("the operator's namespace {}", d.namespace)
    } else {
        "the session's namespace".to_owned()
    };
    let secret = secret
        .filter(|s| s.labels().get(LABEL).map(String::as_str) == Some("true"))
        .ok_or_else(|| {
            format!(
                "Secret {} was not found (a credential's Secret must exist in {whose} and carry the label {LABEL}=true)",
                d.secret()
            )
        })?;
    let key = &d.credential.secret_ref.key;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .ok_or_else(|| format!("Secret {} has no key '{key}'", d.secret()))?;
    let text = std::str::from_utf8(&bytes.0)
        .map_err(|_| format!("Secret {}, key '{key}' is not UTF-8 text", d.secret()))?;
    // One trailing line end (a value written from a file) is not part of it.
    let text = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(text);
    if text.is_empty() {
        return Err(format!("Secret {}, key '{key}' is empty", d.secret()));
    }
    if text.contains(['\r', '\n']) {
        return Err(format!(
            "Secret {}, key '{key}' holds more than one line: a header value is one line",
            d.secret()
        ));
    }
    if text.chars().any(|c| c.is_control() && c != '\t') {
        return Err(format!(
            "Secret {}, key '{key}' holds a control character a header value cannot carry",
            d.secret()
        ));
    }
    let value = d
        .credential
        .format
        .replacen(CREDENTIAL_PLACEHOLDER, text, 1);
    if value.len() > MAX_CREDENTIAL_VALUE {
        return Err(format!(
            "Secret {}, key '{key}' is too long: the header value may hold at most {MAX_CREDENTIAL_VALUE} bytes",
            d.secret()
        ));
    }
    Ok(value)
}

/// The set handed to the session's host: each credential with its value or why it has none,
/// and a version that is a digest (hex SHA-256, 16 digits) of the credentials' hosts, ports,
/// headers, formats and sources, each Secret's uid and resourceVersion, and the missing words:
/// it changes when a Secret is written, and never depends on a value. `secret` looks a Secret
/// up by namespace and name among the labelled ones.
pub fn wanted(
    declared: &[Declared<'_>],
    secret: impl Fn(&str, &str) -> Option<Arc<Secret>>,
) -> CredentialSet {
    let mut digest = String::new();
    let credentials = declared
        .iter()
        .map(|d| {
            let c = d.credential;
            let found = secret(&d.namespace, &c.secret_ref.name);
            let (value, missing) = match value_of(d, found.as_deref()) {
                Ok(v) => (Some(v), None),
                Err(m) => (None, Some(m)),
            };
            let (uid, rv) = found
                .as_deref()
                .map(|s| {
                    (
                        s.metadata.uid.clone().unwrap_or_default(),
                        s.metadata.resource_version.clone().unwrap_or_default(),
                    )
                })
                .unwrap_or_default();
            let fields = [
                c.host.clone(),
                format!("{:?}", c.ports),
                c.header.clone(),
                c.format.clone(),
                d.source(),
                uid,
                rv,
                missing.clone().unwrap_or_default(),
            ];
            for f in fields {
                // Length-prefixed, so no two sets read alike.
                digest.push_str(&format!("{}:{f};", f.len()));
            }
            digest.push('\n');
            CredentialValue {
                host: c.host.clone(),
                ports: c.ports.clone(),
                header: c.header.clone(),
                source: d.source(),
                value,
                missing,
            }
        })
        .collect();
    CredentialSet {
        version: version_of(&digest),
        credentials,
    }
}

/// The version of an empty set: what a host that was handed one holds.
pub fn empty_version() -> String {
    version_of("")
}

fn version_of(text: &str) -> String {
    let mut hex = sandboxd_api::auth::hash(text);
    hex.truncate(16);
    hex
}

/// What `status.credentials` shows of a set: where each comes from and whether it has a value.
pub fn status_of(set: &CredentialSet) -> Vec<CredentialStatus> {
    set.credentials
        .iter()
        .map(|c| CredentialStatus {
            host: c.host.clone(),
            ports: c.ports.clone(),
            header: c.header.clone(),
            source: c.source.clone(),
            ready: c.value.is_some(),
            message: c.missing.clone(),
        })
        .collect()
}

/// The open sessions a change of Secret `namespace/name` concerns: those whose own credentials
/// name it in their namespace, and, when it is in the operator's namespace, those of a Runtime
/// whose credentials name it (the Runtime they were opened with).
pub fn sessions_referencing(
    namespace: &str,
    name: &str,
    operator_namespace: &str,
    sessions: &[Arc<SandboxSession>],
    runtimes: &[Arc<Runtime>],
) -> Vec<ObjectRef<SandboxSession>> {
    let names_it = |e: Option<&sandboxd_crds::v1alpha1::egress::Egress>| {
        e.is_some_and(|e| e.credentials.iter().any(|c| c.secret_ref.name == name))
    };
    let runtimes_naming: Vec<String> = if namespace == operator_namespace {
        runtimes
            .iter()
            .filter(|r| names_it(r.spec.egress.as_ref()))
            .map(|r| r.name_any())
            .collect()
    } else {
        Vec::new()
    };
    sessions
        .iter()
        .filter(|s| s.status.as_ref().is_some_and(|st| st.session_id.is_some()))
        .filter(|s| {
            (s.namespace().as_deref() == Some(namespace) && names_it(s.spec.egress.as_ref()))
                || s.status
                    .as_ref()
                    .and_then(|st| st.runtime.as_ref())
                    .is_some_and(|rt| runtimes_naming.contains(rt))
        })
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use sandboxd_crds::v1alpha1::SandboxSessionStatus;
    use sandboxd_crds::v1alpha1::egress::CredentialSecretRef;

    use super::*;

    fn credential(host: &str, ports: &[u16], header: &str, format: &str) -> EgressCredential {
        EgressCredential {
            host: host.to_owned(),
            ports: ports.to_vec(),
            header: header.to_owned(),
            format: format.to_owned(),
            secret_ref: CredentialSecretRef {
                name: "model-key".to_owned(),
                key: "token".to_owned(),
                namespace: None,
            },
        }
    }

    fn own(c: &EgressCredential) -> Declared<'_> {
        Declared {
            credential: c,
            field: "spec.egress.credentials[0]".to_owned(),
            namespace: "agents".to_owned(),
            runtime: None,
        }
    }

    fn policy(text: &str) -> Egress {
        serde_json::from_str(text).expect("a policy")
    }

    fn secret(ns: &str, name: &str, rv: &str, labelled: bool, data: &[(&str, &[u8])]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(ns.to_owned()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some(rv.to_owned()),
                labels: labelled.then(|| BTreeMap::from([(LABEL.to_owned(), "true".to_owned())])),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_credential_is_refused_unless_every_policy_allows_its_host_on_each_port() {
        let runtime = policy(
            r#"{"mode":"allowlist","allow":[{"domain":"api.test"},{"domain":"*.models.test","ports":[443]}]}"#,
        );
        let narrowed =
            policy(r#"{"mode":"allowlist","allow":[{"domain":"api.test","ports":[443]}]}"#);
        fn bound<'a>(runtime: &'a Egress, extra: Option<&'a Egress>) -> Vec<(String, &'a Egress)> {
            let mut b = vec![("Runtime 'agents'".to_owned(), runtime)];
            if let Some(e) = extra {
                b.push(("this session's spec.egress".to_owned(), e));
            }
            b
        }
        for (what, c, extra, expected) in [
            (
                "allowed",
                credential("api.test", &[443], "Authorization", "Bearer {}"),
                None,
                Ok(()),
            ),
            (
                "under a wildcard entry",
                credential("eu.models.test", &[443], "X-Api-Key", "{}"),
                None,
                Ok(()),
            ),
            (
                "not on the allow list",
                credential("other.test", &[443], "Authorization", "{}"),
                None,
                Err(
                    "spec.egress.credentials[0]: other.test:443 is not on the allow list of Runtime 'agents' (allowlist: api.test, *.models.test (ports 443)): allow it there or remove the credential",
                ),
            ),
            (
                "a port the entry does not list",
                credential("eu.models.test", &[8443], "Authorization", "{}"),
                None,
                Err(
                    "spec.egress.credentials[0]: eu.models.test:8443 is not on the allow list of Runtime 'agents'",
                ),
            ),
            (
                "a port the session's narrowing drops",
                credential("api.test", &[443, 80], "Authorization", "{}"),
                Some(&narrowed),
                Err(
                    "spec.egress.credentials[0]: api.test:80 is not on the allow list of this session's spec.egress",
                ),
            ),
            (
                "a wildcard host",
                credential("*.models.test", &[443], "Authorization", "{}"),
                None,
                Err(
                    "spec.egress.credentials[0]: host '*.models.test' is not an exact lowercase DNS name",
                ),
            ),
            (
                "an uppercase host",
                credential("API.test", &[443], "Authorization", "{}"),
                None,
                Err("host 'API.test' is not an exact lowercase DNS name"),
            ),
            (
                "a format without the placeholder",
                credential("api.test", &[443], "Authorization", "Bearer"),
                None,
                Err("format 'Bearer' must contain {} exactly once"),
            ),
            (
                "a format with it twice",
                credential("api.test", &[443], "Authorization", "{} {}"),
                None,
                Err("format '{} {}' must contain {} exactly once"),
            ),
            (
                "a header that frames the request",
                credential("api.test", &[443], "Content-Length", "{}"),
                None,
                Err("header 'Content-Length' frames the request"),
            ),
            (
                "a header that is no token",
                credential("api.test", &[443], "X Key", "{}"),
                None,
                Err("header 'X Key' is not an HTTP header name"),
            ),
            (
                "a port twice",
                credential("api.test", &[443, 443], "Authorization", "{}"),
                None,
                Err("ports must list 1 to 16 ports"),
            ),
        ] {
            let got = check(&[own(&c)], &bound(&runtime, extra));
            match (got, expected) {
                (Ok(()), Ok(())) => {}
                (Err(m), Err(start)) => {
                    assert!(m.starts_with(start) || m.contains(start), "{what}: {m}")
                }
                (got, expected) => panic!("{what}: {got:?}, expected {expected:?}"),
            }
        }
        let c = credential("api.test", &[443], "Authorization", "{}");
        let many: Vec<Declared<'_>> = (0..17).map(|_| own(&c)).collect();
        assert!(check(&many, &bound(&runtime, None)).is_err_and(|m| m.contains("at most 16")));
    }

    #[test]
    fn the_value_is_the_format_filled_from_a_labelled_secret_or_words_naming_it() {
        let c = credential("api.test", &[443], "Authorization", "Bearer {}");
        let d = own(&c);
        let value = |s: Option<Secret>| value_of(&d, s.as_ref());
        assert_eq!(
            value(Some(secret(
                "agents",
                "model-key",
                "1",
                true,
                &[("token", b"sk-1\n")]
            ))),
            Ok("Bearer sk-1".to_owned())
        );
        let not_found = "Secret agents/model-key was not found (a credential's Secret must exist in the session's namespace and carry the label sandboxd.dev/egress-credential=true)";
        assert_eq!(value(None), Err(not_found.to_owned()));
        assert_eq!(
            value(Some(secret(
                "agents",
                "model-key",
                "1",
                false,
                &[("token", b"sk-1")]
            ))),
            Err(not_found.to_owned())
        );
        assert_eq!(
            value(Some(secret(
                "agents",
                "model-key",
                "1",
                true,
                &[("other", b"sk-1")]
            ))),
            Err("Secret agents/model-key has no key 'token'".to_owned())
        );
        for (bytes, words) in [
            (&b"sk-1\nsk-2"[..], "holds more than one line"),
            (&b"\xff\xfe"[..], "is not UTF-8 text"),
            (&b""[..], "is empty"),
            (&b"sk\x001"[..], "control character"),
        ] {
            let m = value(Some(secret(
                "agents",
                "model-key",
                "1",
                true,
                &[("token", bytes)],
            )))
            .expect_err("no value");
            assert!(m.contains(words), "{m}");
            assert!(!m.contains("sk-"), "the words hold the value: {m}");
        }
        // A Runtime's says where its Secret must live.
        let rt = Declared {
            runtime: Some("agents".to_owned()),
            namespace: "sandboxd-system".to_owned(),
            field: "Runtime 'agents' spec.egress.credentials[0]".to_owned(),
            credential: &c,
        };
        assert!(
            value_of(&rt, None)
                .is_err_and(|m| m.contains("Secret sandboxd-system/model-key was not found (a credential's Secret must exist in the operator's namespace sandboxd-system"))
        );
        assert_eq!(rt.source(), "Secret sandboxd-system/model-key, key token");
    }

    #[test]
    fn the_version_moves_with_a_secrets_resource_version_and_not_with_its_value() {
        let c = credential("api.test", &[443], "Authorization", "Bearer {}");
        let declared = [own(&c)];
        let set_of = |s: Option<Secret>| {
            let s = s.map(Arc::new);
            wanted(&declared, move |_, _| s.clone())
        };
        let v1 = set_of(Some(secret(
            "agents",
            "model-key",
            "7",
            true,
            &[("token", b"sk-1")],
        )));
        assert_eq!(v1.credentials[0].value.as_deref(), Some("Bearer sk-1"));
        assert_eq!(v1.version.len(), 16);
        // Another value under the same resourceVersion (never so on a server): the same version,
        // so the version says nothing of the value.
        let same = set_of(Some(secret(
            "agents",
            "model-key",
            "7",
            true,
            &[("token", b"sk-2")],
        )));
        assert_eq!(same.version, v1.version);
        assert!(!format!("{same:?}").contains("sk-2"));
        // The Secret written: another version.
        let v2 = set_of(Some(secret(
            "agents",
            "model-key",
            "8",
            true,
            &[("token", b"sk-2")],
        )));
        assert_ne!(v2.version, v1.version);
        // Gone: another still, with words.
        let gone = set_of(None);
        assert_ne!(gone.version, v1.version);
        assert_eq!(gone.credentials[0].value, None);
        assert!(gone.credentials[0].missing.is_some());
        // Computed twice: the same.
        assert_eq!(
            set_of(Some(secret(
                "agents",
                "model-key",
                "8",
                true,
                &[("token", b"sk-2")]
            )))
            .version,
            v2.version
        );
        // Another header: another version.
        let other = credential("api.test", &[443], "X-Api-Key", "Bearer {}");
        let s = Arc::new(secret(
            "agents",
            "model-key",
            "8",
            true,
            &[("token", b"sk-2")],
        ));
        assert_ne!(
            wanted(&[own(&other)], |_, _| Some(s.clone())).version,
            v2.version
        );
        assert_eq!(wanted(&[], |_, _| None).version, empty_version());
        let shown = status_of(&gone);
        assert_eq!(
            (shown[0].source.as_str(), shown[0].ready),
            ("Secret agents/model-key, key token", false)
        );
        assert!(status_of(&v2)[0].message.is_none() && status_of(&v2)[0].ready);
    }

    fn session(ns: &str, name: &str, runtime: &str, secret: Option<&str>) -> Arc<SandboxSession> {
        let mut s = SandboxSession::new(
            name,
            serde_json::from_value(serde_json::json!({"scope": "run", "tenant": "t"}))
                .expect("a spec"),
        );
        s.metadata.namespace = Some(ns.to_owned());
        if let Some(secret) = secret {
            s.spec.egress = Some(
                serde_json::from_value(serde_json::json!({"mode": "allowlist", "allow": [{"domain": "api.test"}],
                    "credentials": [{"host": "api.test", "secretRef": {"name": secret, "key": "token"}}]}))
                .expect("a policy"),
            );
        }
        s.status = Some(SandboxSessionStatus {
            session_id: Some(format!("{ns}.{name}")),
            runtime: Some(runtime.to_owned()),
            ..Default::default()
        });
        Arc::new(s)
    }

    #[test]
    fn a_secret_concerns_the_sessions_that_name_it_in_their_namespace_and_those_of_a_runtime_naming_it()
     {
        let runtime: Arc<Runtime> = Arc::new(Runtime::new(
            "agents",
            serde_json::from_value(serde_json::json!({"image": "python:3.12",
                "egress": {"mode": "allowlist", "allow": [{"domain": "api.test"}],
                    "credentials": [{"host": "api.test", "secretRef": {"name": "model-key", "key": "token"}}]}}))
            .expect("a spec"),
        ));
        let sessions = vec![
            session("team-a", "own", "python", Some("model-key")),
            session("team-b", "elsewhere", "python", Some("model-key")),
            session("team-a", "other-key", "python", Some("other")),
            session("team-b", "on-agents", "agents", None),
            session("team-a", "plain", "python", None),
        ];
        let names = |ns: &str, name: &str| {
            let mut n: Vec<String> = sessions_referencing(
                ns,
                name,
                "sandboxd-system",
                &sessions,
                std::slice::from_ref(&runtime),
            )
            .into_iter()
            .map(|r| r.name)
            .collect();
            n.sort();
            n
        };
        assert_eq!(names("team-a", "model-key"), ["own"]);
        assert_eq!(names("team-b", "model-key"), ["elsewhere"]);
        assert_eq!(names("sandboxd-system", "model-key"), ["on-agents"]);
        assert_eq!(names("sandboxd-system", "other"), Vec::<String>::new());
        assert_eq!(names("team-a", "other"), ["other-key"]);
        // A session not yet open has nothing on a host to keep current.
        let mut waiting = (*session("team-a", "waiting", "python", Some("model-key"))).clone();
        waiting.status = None;
        assert!(
            sessions_referencing(
                "team-a",
                "model-key",
                "sandboxd-system",
                &[Arc::new(waiting)],
                &[]
            )
            .is_empty()
        );
    }
}
