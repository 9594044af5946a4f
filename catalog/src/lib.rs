//! The runtime catalog format (`catalog/runtimes.json`): the one source for `Runtime` manifests,
//! image builds and the model briefing. This crate knows nothing of Kubernetes: sandboxd reads
//! its allowlist in this format, and `sandboxd-crds` turns entries into `Runtime` objects.
//!
//! The file is a JSON array of entries; the first is the default runtime. An entry has one of
//! two forms, never both: `image` (a ready image, used as is) or `base_image` with optional
//! `setup_commands` and `packages` (built once, then cached). A malformed catalog is refused
//! when it is loaded, with every error listed at once, each naming the entry and the field.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod briefing;
pub mod egress;
pub mod memory;

pub use briefing::{briefing, briefing_for};

/// One runtime of the catalog, in the catalog's own (snake_case) format.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CatalogEntry {
    /// What a spec names: `[a-z][a-z0-9-]*`.
    pub alias: String,
    /// What it is for, shown to whoever chooses a runtime.
    #[serde(default)]
    pub description: String,
    /// A ready image, used as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The image the hosts build on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_image: Option<String>,
    /// Shell at build time, before the packages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setup_commands: Vec<String>,
    /// pip packages installed at build time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    /// Environment variables of every container on this runtime.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env_vars: BTreeMap<String, String>,
    /// Sentences for the model that the fields above cannot say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub briefing: Vec<String>,
    /// Memory limit in Docker's syntax.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_limit: Option<String>,
    /// Workspace size in Docker's syntax (at most the host's SANDBOXD_WORKSPACE_SIZE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_size: Option<String>,
    /// Whether a session gets a network.
    #[serde(default)]
    pub needs_network: bool,
    /// Started containers each host keeps ready for this runtime, so an open takes one instead
    /// of starting a container (0: no warm pool).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warm_pool: u32,
    /// Where its sessions may connect: an egress policy that, when given, wins over
    /// `needs_network` (true: mode open, false: mode none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<egress::Egress>,
    /// What stands between its sandboxes and the node's kernel: runc (the default: the
    /// node's kernel, namespaces and seccomp) or gvisor (gVisor's own kernel, runsc).
    #[serde(default, skip_serializing_if = "Isolation::is_runc")]
    pub isolation: Isolation,
}

/// What stands between a runtime's sandboxes and the node's kernel.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// runc: the node's kernel, with namespaces, cgroups and seccomp.
    #[default]
    Runc,
    /// gVisor (runsc): a kernel of its own in user space between the sandbox and the node's.
    Gvisor,
}

impl Isolation {
    /// Every level, as the catalog names them.
    pub const ALL: [Isolation; 2] = [Isolation::Runc, Isolation::Gvisor];

    /// The name in the catalog and on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Runc => "runc",
            Self::Gvisor => "gvisor",
        }
    }

    /// Whether it is runc (the default, left out when written).
    pub fn is_runc(&self) -> bool {
        *self == Self::Runc
    }

    /// The level a name gives, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|i| i.as_str() == name)
    }
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl CatalogEntry {
    /// The egress policy its sessions get: `egress` when given, else `needs_network`'s.
    pub fn effective_egress(&self) -> egress::Egress {
        egress::Egress::effective(self.needs_network, self.egress.as_ref())
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The largest `warm_pool` an entry may ask for.
pub const MAX_WARM_POOL: u32 = 1000;

/// The fields an entry may have.
pub const FIELDS: [&str; 14] = [
    "alias",
    "description",
    "image",
    "base_image",
    "setup_commands",
    "packages",
    "env_vars",
    "briefing",
    "mem_limit",
    "workspace_size",
    "needs_network",
    "warm_pool",
    "egress",
    "isolation",
];

/// One thing wrong with a catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatalogError {
    /// Which entry: `entry 2 (workbench)`, or `catalog` for the whole file.
    pub entry: String,
    /// Which field, if one.
    pub field: Option<String>,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl std::fmt::Display for CatalogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{}: {}: {}", self.entry, field, self.message),
            None => write!(f, "{}: {}", self.entry, self.message),
        }
    }
}

/// Every error of a catalog, in file order.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the runtime catalog is invalid ({} errors):\n{}", .0.len(), render(.0))]
pub struct CatalogErrors(pub Vec<CatalogError>);

fn render(errors: &[CatalogError]) -> String {
    errors
        .iter()
        .map(|e| format!("  - {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `alias` is a valid runtime alias: `[a-z][a-z0-9-]*`.
pub fn is_valid_alias(alias: &str) -> bool {
    let mut chars = alias.chars();
    matches!(chars.next(), Some('a'..='z'))
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Parses and validates a catalog; on failure every error is returned at once.
pub fn parse(text: &str) -> Result<Vec<CatalogEntry>, CatalogErrors> {
    let whole = |message: String| {
        CatalogErrors(vec![CatalogError {
            entry: "catalog".into(),
            field: None,
            message,
        }])
    };
    let value: Value =
        serde_json::from_str(text).map_err(|e| whole(format!("not valid JSON: {e}")))?;
    let Value::Array(items) = value else {
        return Err(whole(
            "must be a JSON array of runtime entries (the first is the default)".into(),
        ));
    };
    if items.is_empty() {
        return Err(whole(
            "holds no runtime: at least one entry is needed (the first is the default)".into(),
        ));
    }
    let mut errors = Vec::new();
    let mut entries = Vec::new();
    let mut seen = BTreeSet::new();
    for (index, item) in items.iter().enumerate() {
        let label = match item.get("alias").and_then(Value::as_str) {
            Some(alias) => format!("entry {} ({alias})", index + 1),
            None => format!("entry {}", index + 1),
        };
        let before = errors.len();
        check_entry(item, &label, &mut errors);
        if let Some(alias) = item.get("alias").and_then(Value::as_str)
            && !seen.insert(alias.to_owned())
        {
            errors.push(CatalogError {
                entry: label.clone(),
                field: Some("alias".into()),
                message: format!(
                    "'{alias}' is already used by an earlier entry; aliases must be unique"
                ),
            });
        }
        if errors.len() == before {
            match serde_json::from_value::<CatalogEntry>(item.clone()) {
                Ok(mut entry) => {
                    // An egress policy wins; needs_network is made to agree with it, for
                    // whoever reads only that.
                    if let Some(policy) = &entry.egress {
                        entry.needs_network = policy.mode != egress::EgressMode::None;
                    }
                    entries.push(entry)
                }
                Err(e) => errors.push(CatalogError {
                    entry: label,
                    field: None,
                    message: e.to_string(),
                }),
            }
        }
    }
    if errors.is_empty() {
        Ok(entries)
    } else {
        Err(CatalogErrors(errors))
    }
}

fn check_entry(item: &Value, label: &str, errors: &mut Vec<CatalogError>) {
    let mut err = |field: &str, message: String| {
        errors.push(CatalogError {
            entry: label.to_owned(),
            field: Some(field.to_owned()),
            message,
        })
    };
    let Value::Object(map) = item else {
        err("(entry)", "must be a JSON object".into());
        return;
    };
    for key in map.keys() {
        if !FIELDS.contains(&key.as_str()) {
            err(
                key,
                format!("unknown field; allowed are {}", FIELDS.join(", ")),
            );
        }
    }
    let string = |v: &Value| v.as_str().map(str::to_owned);
    match map.get("alias") {
        None => err(
            "alias",
            "is required: the name a spec uses, [a-z][a-z0-9-]*".into(),
        ),
        Some(v) => match string(v) {
            Some(a) if is_valid_alias(&a) => {}
            Some(a) => err(
                "alias",
                format!(
                    "'{a}' must match [a-z][a-z0-9-]* (a lowercase letter, then lowercase letters, digits or '-')"
                ),
            ),
            None => err("alias", "must be a string".into()),
        },
    }
    for field in [
        "description",
        "image",
        "base_image",
        "mem_limit",
        "workspace_size",
    ] {
        if let Some(v) = map.get(field) {
            match v.as_str() {
                None => err(field, "must be a string".into()),
                Some("") if field != "description" => err(field, "must not be empty".into()),
                Some(_) => {}
            }
        }
    }
    match (map.contains_key("image"), map.contains_key("base_image")) {
        (true, true) => err(
            "image",
            "image and base_image exclude each other: image is used as is, base_image is built"
                .into(),
        ),
        (false, false) => err(
            "image",
            "one of image (a ready image) and base_image (built on the host) is required".into(),
        ),
        _ => {}
    }
    for field in ["setup_commands", "packages", "briefing"] {
        if let Some(v) = map.get(field) {
            match v.as_array() {
                Some(list) if list.iter().all(Value::is_string) => {
                    if field != "briefing" && !list.is_empty() && map.contains_key("image") {
                        err(
                            field,
                            "is allowed only with base_image: an image entry installs nothing"
                                .into(),
                        );
                    }
                }
                _ => err(field, "must be a list of strings".into()),
            }
        }
    }
    if let Some(v) = map.get("env_vars") {
        match v.as_object() {
            Some(vars) => {
                for (name, value) in vars {
                    if !is_env_name(name) {
                        err(
                            "env_vars",
                            format!("'{name}' is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"),
                        );
                    }
                    if !value.is_string() {
                        err(
                            "env_vars",
                            format!("the value of '{name}' must be a string"),
                        );
                    }
                }
            }
            None => err(
                "env_vars",
                "must be an object of NAME: value strings".into(),
            ),
        }
    }
    if let Some(limit) = map.get("mem_limit").and_then(Value::as_str)
        && !limit.is_empty()
        && memory::parse(limit).is_none()
    {
        err("mem_limit", format!("'{limit}' is not {}", memory::ALLOWED));
    }
    if let Some(size) = map.get("workspace_size").and_then(Value::as_str)
        && !size.is_empty()
        && memory::parse(size).is_none()
    {
        err(
            "workspace_size",
            format!("'{size}' is not {}", memory::ALLOWED),
        );
    }
    if let Some(v) = map.get("needs_network")
        && !v.is_boolean()
    {
        err("needs_network", "must be true or false".into());
    }
    if let Some(v) = map.get("egress") {
        check_egress(v, map.get("needs_network"), &mut err);
    }
    if let Some(v) = map.get("isolation")
        && v.as_str().and_then(Isolation::parse).is_none()
    {
        err(
            "isolation",
            format!("must be runc (the node's kernel) or gvisor (gVisor's runsc), not {v}"),
        );
    }
    if let Some(v) = map.get("warm_pool")
        && v.as_u64().is_none_or(|n| n > u64::from(MAX_WARM_POOL))
    {
        err(
            "warm_pool",
            format!(
                "must be a whole number of containers from 0 to {MAX_WARM_POOL} (0: no warm pool), not {v}"
            ),
        );
    }
}

/// The problems of an entry's `egress` (and its disagreement with an explicit `needs_network`),
/// each reported at `egress.<path>`.
fn check_egress(v: &Value, needs_network: Option<&Value>, err: &mut impl FnMut(&str, String)) {
    let policy = match serde_json::from_value::<egress::Egress>(v.clone()) {
        Ok(policy) => policy,
        Err(e) => {
            err(
                "egress",
                format!(
                    "{e}; an egress policy is {{\"mode\": \"none\" | \"allowlist\" | \"open\", \"allow\": [{{\"domain\": …}} or {{\"cidr\": …}}, optional \"ports\": […]]}}"
                ),
            );
            return;
        }
    };
    for (field, message) in policy.validate() {
        err(&format!("egress.{field}"), message);
    }
    if let Some(needs) = needs_network.and_then(Value::as_bool) {
        let networked = policy.mode != egress::EgressMode::None;
        if needs != networked {
            err(
                "egress.mode",
                format!(
                    "is {} but needs_network is {needs}: they disagree; drop needs_network (egress wins) or make them agree",
                    policy.mode
                ),
            );
        }
    }
}

/// The shipped catalog, `catalog/runtimes.json`, as compiled into this crate.
pub const SHIPPED: &str = include_str!("../runtimes.json");

/// Serialises entries back into the catalog format (a JSON array), as [`parse`] reads it.
pub fn to_json(entries: &[CatalogEntry]) -> String {
    serde_json::to_string_pretty(entries).unwrap_or_else(|_| "[]".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(text: &str) -> Vec<String> {
        match parse(text) {
            Ok(_) => vec![],
            Err(CatalogErrors(errors)) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn shipped_catalog_is_valid_and_first_is_default() {
        let entries = parse(SHIPPED).expect("the shipped catalog is valid");
        assert_eq!(entries[0].alias, "workbench");
    }

    #[test]
    fn every_error_is_listed_at_once_naming_entry_and_field() {
        let text = r#"[
            {"alias": "Bad_Alias", "image": "busybox", "packages": ["x"]},
            {"alias": "both", "image": "a", "base_image": "b", "mem_limit": "2 gigs"},
            {"alias": "none", "colour": "red", "needs_network": "yes"},
            {"alias": "both", "base_image": "b", "env_vars": {"1X": "y", "OK": 3}}
        ]"#;
        assert_eq!(
            messages(text),
            vec![
                "entry 1 (Bad_Alias): alias: 'Bad_Alias' must match [a-z][a-z0-9-]* (a lowercase letter, then lowercase letters, digits or '-')",
                "entry 1 (Bad_Alias): packages: is allowed only with base_image: an image entry installs nothing",
                "entry 2 (both): image: image and base_image exclude each other: image is used as is, base_image is built",
                "entry 2 (both): mem_limit: '2 gigs' is not a number with an optional unit b, k, m, g, t or p in Docker's syntax (for example 512m or 2g)",
                "entry 3 (none): colour: unknown field; allowed are alias, description, image, base_image, setup_commands, packages, env_vars, briefing, mem_limit, workspace_size, needs_network, warm_pool, egress, isolation",
                "entry 3 (none): image: one of image (a ready image) and base_image (built on the host) is required",
                "entry 3 (none): needs_network: must be true or false",
                "entry 4 (both): env_vars: '1X' is not a variable name ([A-Za-z_][A-Za-z0-9_]*)",
                "entry 4 (both): env_vars: the value of 'OK' must be a string",
                "entry 4 (both): alias: 'both' is already used by an earlier entry; aliases must be unique",
            ]
        );
    }

    #[test]
    fn isolation_is_runc_or_gvisor() {
        let ok = parse(
            r#"[{"alias": "a", "image": "i", "isolation": "gvisor"}, {"alias": "b", "image": "i"}]"#,
        )
        .expect("valid");
        assert_eq!(
            (ok[0].isolation, ok[1].isolation),
            (Isolation::Gvisor, Isolation::Runc)
        );
        // Written back only when it is not the default.
        assert_eq!(to_json(&ok).matches("isolation").count(), 1);
        assert_eq!(
            messages(
                r#"[{"alias": "a", "image": "i", "isolation": "kata"}, {"alias": "b", "image": "i", "isolation": true}]"#
            ),
            vec![
                "entry 1 (a): isolation: must be runc (the node's kernel) or gvisor (gVisor's runsc), not \"kata\"",
                "entry 2 (b): isolation: must be runc (the node's kernel) or gvisor (gVisor's runsc), not true",
            ]
        );
    }

    #[test]
    fn warm_pool_is_a_whole_number_of_containers() {
        let ok = parse(
            r#"[{"alias": "a", "image": "i", "warm_pool": 3}, {"alias": "b", "image": "i"}]"#,
        )
        .expect("valid");
        assert_eq!((ok[0].warm_pool, ok[1].warm_pool), (3, 0));
        // Written back only when there is a pool.
        assert!(to_json(&ok).contains("\"warm_pool\": 3"));
        assert_eq!(to_json(&ok).matches("warm_pool").count(), 1);
        assert_eq!(
            messages(
                r#"[{"alias": "a", "image": "i", "warm_pool": -1}, {"alias": "b", "image": "i", "warm_pool": "2"}, {"alias": "c", "image": "i", "warm_pool": 1001}]"#
            ),
            vec![
                "entry 1 (a): warm_pool: must be a whole number of containers from 0 to 1000 (0: no warm pool), not -1",
                "entry 2 (b): warm_pool: must be a whole number of containers from 0 to 1000 (0: no warm pool), not \"2\"",
                "entry 3 (c): warm_pool: must be a whole number of containers from 0 to 1000 (0: no warm pool), not 1001",
            ]
        );
    }

    #[test]
    fn egress_is_read_and_wins_over_needs_network() {
        let entries = parse(
            r#"[
                {"alias": "a", "image": "i", "egress": {"mode": "allowlist", "allow": [{"domain": "pypi.org"}, {"domain": "*.pythonhosted.org", "ports": [443]}]}},
                {"alias": "b", "image": "i", "needs_network": true},
                {"alias": "c", "image": "i", "needs_network": false, "egress": {"mode": "none"}},
                {"alias": "d", "image": "i"}
            ]"#,
        )
        .expect("valid");
        let a = &entries[0];
        assert!(a.needs_network, "an allowlist is a network");
        assert!(a.effective_egress().allows("files.pythonhosted.org", 443));
        assert!(!a.effective_egress().allows("files.pythonhosted.org", 80));
        assert_eq!(entries[1].effective_egress(), egress::Egress::open());
        assert_eq!(entries[2].effective_egress(), egress::Egress::none());
        assert_eq!(entries[3].effective_egress(), egress::Egress::none());
        // Written back as read, and read again the same.
        let again = parse(&to_json(&entries)).expect("round trip");
        assert_eq!(again, entries);
        assert_eq!(to_json(&entries).matches("\"egress\"").count(), 2);
    }

    #[test]
    fn egress_errors_name_the_entry_and_the_policy_field() {
        let text = r#"[
            {"alias": "a", "image": "i", "egress": {"mode": "allowlist", "allow": [{"domain": "pypi.org"}, {"domain": "a*.b.org"}, {"cidr": "10.0.0.1/8", "ports": [0]}]}},
            {"alias": "b", "image": "i", "needs_network": true, "egress": {"mode": "none"}},
            {"alias": "c", "image": "i", "needs_network": false, "egress": {"mode": "open"}},
            {"alias": "d", "image": "i", "egress": {"mode": "open", "allow": [{"domain": "pypi.org"}]}},
            {"alias": "e", "image": "i", "egress": {"mode": "closed"}},
            {"alias": "f", "image": "i", "egress": {"mode": "allowlist", "allow": [{"domain": "a.org", "port": 443}]}},
            {"alias": "g", "image": "i", "egress": true}
        ]"#;
        let shape = "; an egress policy is {\"mode\": \"none\" | \"allowlist\" | \"open\", \"allow\": [{\"domain\": …} or {\"cidr\": …}, optional \"ports\": […]]}";
        assert_eq!(
            messages(text),
            vec![
                "entry 1 (a): egress.allow[1].domain: 'a*.b.org': '*' is allowed only as the whole first label (*.example.com)".to_owned(),
                "entry 1 (a): egress.allow[2].cidr: '10.0.0.1/8' has host bits set: the network is 10.0.0.0/8".to_owned(),
                "entry 1 (a): egress.allow[2].ports: 0 is not a port: ports are 1 to 65535".to_owned(),
                "entry 2 (b): egress.mode: is none but needs_network is true: they disagree; drop needs_network (egress wins) or make them agree".to_owned(),
                "entry 3 (c): egress.mode: is open but needs_network is false: they disagree; drop needs_network (egress wins) or make them agree".to_owned(),
                "entry 4 (d): egress.allow: is allowed only with mode allowlist: mode open allows everything".to_owned(),
                format!("entry 5 (e): egress: unknown variant `closed`, expected one of `none`, `allowlist`, `open`{shape}"),
                format!("entry 6 (f): egress: unknown field `port`, expected one of `domain`, `cidr`, `ports`{shape}"),
                format!("entry 7 (g): egress: invalid type: boolean `true`, expected struct Egress{shape}"),
            ]
        );
    }

    #[test]
    fn whole_file_errors() {
        assert_eq!(
            messages("{}"),
            vec!["catalog: must be a JSON array of runtime entries (the first is the default)"]
        );
        assert_eq!(
            messages("[]"),
            vec![
                "catalog: holds no runtime: at least one entry is needed (the first is the default)"
            ]
        );
        assert!(
            messages("[")
                .first()
                .is_some_and(|m| m.starts_with("catalog: not valid JSON"))
        );
    }
}

/// Properties of the catalog parser on arbitrary input: it never panics, what it accepts
/// written back parses to the same entries, and a refusal always names its errors.
#[cfg(test)]
mod props {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// Entries that are mostly valid: an alias, an image or a base image, some of the other
    /// fields, sometimes one of them wrong.
    fn entry() -> impl Strategy<Value = Value> {
        (
            prop_oneof!["[a-z][a-z0-9-]{0,12}", any::<String>()],
            prop_oneof![
                "[a-z]{1,8}(:[a-z0-9.]{1,5})?".prop_map(|i| json!({ "image": i })),
                "[a-z]{1,8}".prop_map(|i| json!({ "base_image": i, "packages": ["requests"] })),
                Just(json!({})),
            ],
            prop::option::of(any::<String>()),
            prop::option::of(prop_oneof!["[0-9]{1,4}[kmg]", any::<String>()]),
            any::<bool>(),
        )
            .prop_map(|(alias, source, description, mem, net)| {
                let mut v = source;
                v["alias"] = json!(alias);
                if let Some(d) = description {
                    v["description"] = json!(d);
                }
                if let Some(m) = mem {
                    v["mem_limit"] = json!(m);
                }
                v["needs_network"] = json!(net);
                v
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        #[test]
        fn never_panics_on_any_text(text in any::<String>()) {
            let _ = parse(&text);
        }

        #[test]
        fn never_panics_on_any_json(value in any_json()) {
            if let Err(e) = parse(&value.to_string()) {
                prop_assert!(!e.0.is_empty());
            }
        }

        #[test]
        fn accepted_catalogs_round_trip(entries in prop::collection::vec(entry(), 1..5)) {
            let text = Value::Array(entries).to_string();
            match parse(&text) {
                Ok(parsed) => {
                    let again = serde_json::to_string(&parsed).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert_eq!(parse(&again).ok(), Some(parsed.clone()));
                    for e in &parsed {
                        prop_assert!(is_valid_alias(&e.alias));
                        prop_assert!(e.image.is_some() != e.base_image.is_some());
                    }
                }
                Err(errors) => {
                    prop_assert!(!errors.0.is_empty());
                    prop_assert!(!errors.to_string().is_empty());
                }
            }
        }
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<String>().prop_map(Value::String),
            prop::sample::select(FIELDS.to_vec()).prop_map(|f| json!(f)),
        ];
        leaf.prop_recursive(3, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![
                        prop::sample::select(FIELDS.to_vec()).prop_map(str::to_owned),
                        any::<String>()
                    ],
                    inner,
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
