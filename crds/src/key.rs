//! The session key: the name of a `SandboxSession` and the session id on its host.
//!
//! It folds together exactly what decides which runs share a container and a workspace:
//!
//! ```text
//! xc-4f2a91c8-7b3e5d10-9c1f…      backend · scope · organization · host · subject
//! ^^                              `x` a container service, `d` a document; `c` the conversation scope
//! ```
//!
//! The organization and host parts are the first eight hex digits of the SHA-256 of the value;
//! the subject part is the subject itself when it is a short, valid name part (a uuid is), and
//! otherwise the first 32 hex digits of its SHA-256. The result is always a valid Kubernetes
//! object name (RFC 1123 label) of at most 63 characters. The derivation is frozen: changing it
//! would move every existing workspace, so the unit tests pin examples.

use sha2::{Digest, Sha256};

use crate::v1alpha1::Scope;

/// The longest Kubernetes object name a session key may be (an RFC 1123 label).
pub const MAX_LEN: usize = 63;

/// Where a workspace lives: a container service (sandboxd) or a stored document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A container with a host directory (sandboxd): letter `x`.
    Container,
    /// A document in a database: letter `d`.
    Document,
}

impl Backend {
    fn letter(self) -> char {
        match self {
            Backend::Container => 'x',
            Backend::Document => 'd',
        }
    }
}

/// The letter of a scope in a key.
pub fn scope_letter(scope: Scope) -> char {
    match scope {
        Scope::Run => 'r',
        Scope::Conversation => 'c',
        Scope::Channel => 'h',
        Scope::User => 'u',
        Scope::Agent => 'a',
    }
}

/// On whose behalf a run acts. Only matters for the `user` scope, which belongs to the
/// signed-in person: a run standing in for someone else has no user workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Actor {
    /// The signed-in person the subject names.
    Member,
    /// A visitor of a published widget, acting through the publisher's agent.
    WidgetVisitor,
    /// A trigger; `as_creator` when it runs as the person who created it.
    Trigger {
        /// Whether the trigger runs as its creator.
        as_creator: bool,
    },
}

/// What a key is derived from.
#[derive(Clone, Copy, Debug)]
pub struct KeyParts<'a> {
    /// The kind of backend that carries the workspace.
    pub backend: Backend,
    /// Who shares the session.
    pub scope: Scope,
    /// The organization id.
    pub tenant: &'a str,
    /// The host (connection) that carries the workspace: two installations are never the same.
    pub host: &'a str,
    /// The conversation, channel, user, agent or run id.
    pub subject: &'a str,
    /// On whose behalf the run acts.
    pub actor: Actor,
}

/// Why no key could be derived.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A part that must not be empty was.
    #[error("cannot derive a session key: {0} must not be empty")]
    Empty(&'static str),
    /// The user scope was asked for by a run acting for someone else.
    #[error(
        "scope 'user' belongs to the signed-in person, and this run acts for someone else ({0}): \
         it has no user workspace. Use the conversation or agent scope for it"
    )]
    ActsForSomeoneElse(&'static str),
}

/// Derives the session key (the SandboxSession name) from its parts.
pub fn session_key(parts: &KeyParts<'_>) -> Result<String, KeyError> {
    if parts.scope == Scope::User {
        match parts.actor {
            Actor::Member | Actor::Trigger { as_creator: true } => {}
            Actor::WidgetVisitor => return Err(KeyError::ActsForSomeoneElse("a widget visitor")),
            Actor::Trigger { as_creator: false } => {
                return Err(KeyError::ActsForSomeoneElse(
                    "a trigger not running as its creator",
                ));
            }
        }
    }
    for (name, value) in [
        ("tenant", parts.tenant),
        ("host", parts.host),
        ("subject", parts.subject),
    ] {
        if value.is_empty() {
            return Err(KeyError::Empty(name));
        }
    }
    let prefix = format!(
        "{}{}-{}-{}-",
        parts.backend.letter(),
        scope_letter(parts.scope),
        short_hash(parts.tenant, 8),
        short_hash(parts.host, 8),
    );
    let room = MAX_LEN - prefix.len();
    let subject = if is_name_part(parts.subject) && parts.subject.len() <= room {
        parts.subject.to_owned()
    } else {
        short_hash(parts.subject, 32)
    };
    Ok(prefix + &subject)
}

/// The longest session id sandboxd accepts.
pub const MAX_HOST_ID_LEN: usize = 128;

/// The session's id on its host: `<namespace>.<name>`, so the same name in two namespaces is
/// two sandboxes. A namespace holds no '.', so the id names exactly one (namespace, name).
/// Longer than sandboxd's 128 characters, it is cut and ends in `-` and the first 32 hex
/// digits of the SHA-256 of `<namespace>/<name>`, always 128 characters. Frozen like the key:
/// the unit tests pin examples.
pub fn host_session_id(namespace: &str, name: &str) -> String {
    let full = format!("{namespace}.{name}");
    if full.len() <= MAX_HOST_ID_LEN {
        return full;
    }
    let suffix = short_hash(&format!("{namespace}/{name}"), 32);
    // Names and namespaces are ASCII, so any byte index is a character boundary.
    let mut keep = full[..MAX_HOST_ID_LEN - suffix.len() - 1].to_owned();
    // Never end the kept part on a separator ("a.-…" stays readable and valid either way).
    while keep.ends_with(['.', '-']) {
        keep.pop();
    }
    format!("{keep}-{suffix}")
}

/// Whether `name` is a valid Kubernetes object name of the kind a key is (RFC 1123 label).
pub fn is_valid_name(name: &str) -> bool {
    name.len() <= MAX_LEN && is_name_part(name)
}

fn is_name_part(s: &str) -> bool {
    let bytes = s.as_bytes();
    let inner = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            inner(first) && inner(last) && bytes.iter().all(|b| inner(b) || *b == b'-')
        }
        _ => false,
    }
}

/// The first `len` hex digits of the SHA-256 of `value`.
pub fn short_hash(value: &str, len: usize) -> String {
    let mut hex = hex::encode(Sha256::digest(value.as_bytes()));
    hex.truncate(len);
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts<'a>(scope: Scope, subject: &'a str, actor: Actor) -> KeyParts<'a> {
        KeyParts {
            backend: Backend::Container,
            scope,
            tenant: "org-7",
            host: "sbh-node-a",
            subject,
            actor,
        }
    }

    #[test]
    fn host_ids_are_namespaced_and_fit_sandboxd() {
        assert_eq!(
            host_session_id("victim", "demo-session"),
            "victim.demo-session"
        );
        assert_ne!(
            host_session_id("victim", "demo-session"),
            host_session_id("attacker", "demo-session")
        );
        // "a.b" in "x" and "b" in "x.a" cannot be asked for: a namespace holds no '.'.
        let long = "n".repeat(200);
        let id = host_session_id("team-a", &long);
        assert_eq!(id.len(), MAX_HOST_ID_LEN);
        assert!(id.starts_with("team-a.nnnn"));
        // Pinned: changing it moves existing workspaces.
        assert!(id.ends_with("-50e83c9bd7d9c8a130e2fd3ac2262798"), "{id}");
        let other = host_session_id("team-a", &format!("{}m", "n".repeat(199)));
        assert_ne!(id, other);
        assert_eq!(other.len(), MAX_HOST_ID_LEN);
        let fits = |id: &str| {
            id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
                && id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        assert!(fits(&id) && fits(&other));
        let exact = format!("{}.{}", "a".repeat(63), "b".repeat(64));
        assert_eq!(host_session_id(&"a".repeat(63), &"b".repeat(64)), exact);
    }

    #[test]
    fn pinned_examples_never_change() {
        // Changing any of these moves existing workspaces: the derivation is frozen.
        let conversation = "3f6b2a0e-9c1f-4d8e-b2a7-5e4c3d2b1a09";
        let cases = [
            (
                parts(Scope::Conversation, conversation, Actor::Member),
                "xc-a81e9bd7-853e3610-3f6b2a0e-9c1f-4d8e-b2a7-5e4c3d2b1a09",
            ),
            (
                parts(Scope::Agent, "Agent_42", Actor::Member),
                "xa-a81e9bd7-853e3610-ab08dc76f78bb7295e745956f6db0b70",
            ),
            (
                parts(Scope::User, "u-1", Actor::Trigger { as_creator: true }),
                "xu-a81e9bd7-853e3610-u-1",
            ),
            (
                KeyParts {
                    backend: Backend::Document,
                    ..parts(Scope::Run, "run-9", Actor::WidgetVisitor)
                },
                "dr-a81e9bd7-853e3610-run-9",
            ),
            (
                parts(Scope::Channel, "c0ffee", Actor::Member),
                "xh-a81e9bd7-853e3610-c0ffee",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(session_key(&input).as_deref(), Ok(want), "{input:?}");
        }
    }

    #[test]
    fn keys_are_valid_names_of_at_most_63() {
        let long = "x".repeat(500);
        let odd = ["UPPER", "-lead", "trail-", "a b", "ü", "a.b", &long];
        for subject in odd {
            for scope in Scope::ALL {
                let key = session_key(&parts(scope, subject, Actor::Member)).expect("a key");
                assert!(
                    is_valid_name(&key),
                    "{key} from {subject:?} is not a valid name"
                );
            }
        }
        let longest_literal = "a".repeat(MAX_LEN - 21);
        let key = session_key(&parts(Scope::Run, &longest_literal, Actor::Member)).expect("a key");
        assert_eq!(key.len(), MAX_LEN);
        assert!(key.ends_with(&longest_literal));
    }

    #[test]
    fn every_part_separates_sessions() {
        let base = parts(Scope::Conversation, "c-1", Actor::Member);
        let key = |p: KeyParts<'_>| session_key(&p).expect("a key");
        let k = key(base);
        assert_ne!(
            k,
            key(KeyParts {
                tenant: "org-8",
                ..base
            })
        );
        assert_ne!(
            k,
            key(KeyParts {
                host: "sbh-node-b",
                ..base
            })
        );
        assert_ne!(
            k,
            key(KeyParts {
                subject: "c-2",
                ..base
            })
        );
        assert_ne!(
            k,
            key(KeyParts {
                scope: Scope::Agent,
                ..base
            })
        );
        assert_ne!(
            k,
            key(KeyParts {
                backend: Backend::Document,
                ..base
            })
        );
    }

    #[test]
    fn user_scope_refuses_runs_acting_for_someone_else() {
        let visitor = session_key(&parts(Scope::User, "u-1", Actor::WidgetVisitor));
        assert_eq!(
            visitor.map_err(|e| e.to_string()),
            Err(
                "scope 'user' belongs to the signed-in person, and this run acts for someone \
                 else (a widget visitor): it has no user workspace. Use the conversation or \
                 agent scope for it"
                    .to_owned()
            )
        );
        let trigger = session_key(&parts(
            Scope::User,
            "u-1",
            Actor::Trigger { as_creator: false },
        ));
        assert_eq!(
            trigger,
            Err(KeyError::ActsForSomeoneElse(
                "a trigger not running as its creator"
            ))
        );
        // Other scopes do not belong to a person, so a visitor may use them.
        assert!(session_key(&parts(Scope::Conversation, "c-1", Actor::WidgetVisitor)).is_ok());
    }

    /// The vectors the Python SDK (`sdk/python`, `sandboxd.key.session_key`) is tested against
    /// too: both derive every row's key, or refuse it with the same words.
    #[test]
    fn shared_vectors_agree_with_the_python_sdk() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/session_keys.json");
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
        let doc: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"));
        let rows = doc["vectors"].as_array().expect("a vectors array");
        assert!(rows.len() >= 50, "{path} holds only {} vectors", rows.len());
        let field = |row: &serde_json::Value, name: &str| -> String {
            row[name]
                .as_str()
                .unwrap_or_else(|| panic!("{row} has no string {name}"))
                .to_owned()
        };
        for row in rows {
            let backend = match field(row, "backend").as_str() {
                "container" => Backend::Container,
                "document" => Backend::Document,
                other => panic!("unknown backend {other}"),
            };
            let scope_name = field(row, "scope");
            let scope = Scope::ALL
                .into_iter()
                .find(|s| s.as_str() == scope_name)
                .unwrap_or_else(|| panic!("unknown scope {scope_name}"));
            let actor = match field(row, "actor").as_str() {
                "member" => Actor::Member,
                "widget_visitor" => Actor::WidgetVisitor,
                "trigger" => Actor::Trigger { as_creator: false },
                "trigger_as_creator" => Actor::Trigger { as_creator: true },
                other => panic!("unknown actor {other}"),
            };
            let (tenant, host, subject) = (
                field(row, "tenant"),
                field(row, "host"),
                field(row, "subject"),
            );
            let got = session_key(&KeyParts {
                backend,
                scope,
                tenant: &tenant,
                host: &host,
                subject: &subject,
                actor,
            })
            .map_err(|e| e.to_string());
            let want = match (row["key"].as_str(), row["error"].as_str()) {
                (Some(key), None) => Ok(key.to_owned()),
                (None, Some(error)) => Err(error.to_owned()),
                _ => panic!("{row} needs exactly one of key and error"),
            };
            assert_eq!(got, want, "{row}");
        }
    }

    #[test]
    fn empty_parts_are_named() {
        let p = parts(Scope::Run, "", Actor::Member);
        assert_eq!(session_key(&p), Err(KeyError::Empty("subject")));
        let p = KeyParts {
            tenant: "",
            ..parts(Scope::Run, "r", Actor::Member)
        };
        assert_eq!(
            session_key(&p).map_err(|e| e.to_string()),
            Err("cannot derive a session key: tenant must not be empty".to_owned())
        );
    }
}

/// Properties of the session key and the host id on arbitrary parts: never a panic, always a
/// valid name that fits, the same parts always the same key.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;

    fn backend() -> impl Strategy<Value = Backend> {
        prop_oneof![Just(Backend::Container), Just(Backend::Document)]
    }

    fn scope() -> impl Strategy<Value = Scope> {
        prop_oneof![
            Just(Scope::Run),
            Just(Scope::Conversation),
            Just(Scope::Channel),
            Just(Scope::User),
            Just(Scope::Agent),
        ]
    }

    fn actor() -> impl Strategy<Value = Actor> {
        prop_oneof![
            Just(Actor::Member),
            Just(Actor::WidgetVisitor),
            any::<bool>().prop_map(|as_creator| Actor::Trigger { as_creator }),
        ]
    }

    /// RFC 1123 labels, as Kubernetes namespaces and names are.
    fn label() -> impl Strategy<Value = String> {
        "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn a_key_is_a_valid_name_that_fits(
            backend in backend(),
            scope in scope(),
            actor in actor(),
            tenant in any::<String>(),
            host in any::<String>(),
            subject in prop_oneof![any::<String>(), label(), "[a-z0-9-]{0,80}"],
        ) {
            let parts = KeyParts { backend, scope, tenant: &tenant, host: &host, subject: &subject, actor };
            match session_key(&parts) {
                Ok(key) => {
                    prop_assert!(is_valid_name(&key), "{key:?}");
                    prop_assert!(key.len() <= MAX_LEN);
                    prop_assert_eq!(session_key(&parts), Ok(key.clone()));
                    // A subject that is itself a short name is kept readable at the end.
                    if is_name_part(&subject) && subject.len() <= MAX_LEN - 21 {
                        prop_assert_eq!(key.len(), 21 + subject.len());
                        prop_assert!(key.ends_with(&subject));
                    }
                }
                Err(KeyError::Empty(_)) => {
                    prop_assert!(tenant.is_empty() || host.is_empty() || subject.is_empty())
                }
                Err(KeyError::ActsForSomeoneElse(_)) => {
                    prop_assert_eq!(scope, Scope::User);
                    let someone_else = matches!(actor, Actor::WidgetVisitor | Actor::Trigger { as_creator: false });
                    prop_assert!(someone_else);
                }
            }
        }

        #[test]
        fn different_subjects_give_different_keys(a in label(), b in label()) {
            prop_assume!(a != b);
            let key = |subject: &str| session_key(&KeyParts {
                backend: Backend::Container,
                scope: Scope::Conversation,
                tenant: "org",
                host: "host",
                subject,
                actor: Actor::Member,
            });
            prop_assert_ne!(key(&a), key(&b));
        }

        #[test]
        fn a_host_id_fits_sandboxd_and_names_one_object(ns in label(), name in label(), other in label()) {
            let id = host_session_id(&ns, &name);
            prop_assert!(id.len() <= MAX_HOST_ID_LEN, "{id:?}");
            let prefix = format!("{ns}.");
            prop_assert!(id.starts_with(&prefix) || id.len() == MAX_HOST_ID_LEN, "{}", id);
            prop_assert!(id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'));
            if other != name {
                prop_assert_ne!(host_session_id(&ns, &other), id);
            }
        }
    }
}
