//! The allowlist: the catalog format, or the compact `alias=image,…` form, and the runtime
//! images it resolves to.

use std::collections::BTreeMap;

use sandboxd_catalog::egress::Egress;
use sandboxd_catalog::{CatalogEntry, CatalogErrors};

/// The allowlist: catalog entries, and whether they came in the catalog format (JSON) or the
/// compact `alias=image,…` form.
#[derive(Debug, Clone, PartialEq)]
pub struct Allowlist {
    /// The entries; the first is the default.
    pub entries: Vec<CatalogEntry>,
    /// Whether it came in the catalog format.
    pub catalog: bool,
}

/// Why an allowlist was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowlistError {
    /// The catalog format, with every error.
    #[error(transparent)]
    Catalog(#[from] CatalogErrors),
    /// The compact form.
    #[error("{0}")]
    Compact(String),
}

impl Allowlist {
    /// Parses the catalog format (a JSON array, as `catalog/runtimes.json`) or the compact
    /// `alias=image,alias2=image2` form.
    pub fn parse(text: &str) -> Result<Self, AllowlistError> {
        if text.trim_start().starts_with('[') || text.trim_start().starts_with('{') {
            return Ok(Self {
                entries: sandboxd_catalog::parse(text)?,
                catalog: true,
            });
        }
        let compact = parse_runtimes(text).map_err(AllowlistError::Compact)?;
        Ok(Self {
            entries: compact
                .into_iter()
                .map(|r| CatalogEntry {
                    alias: r.alias,
                    description: String::new(),
                    image: Some(r.image),
                    base_image: None,
                    setup_commands: vec![],
                    packages: vec![],
                    env_vars: BTreeMap::new(),
                    briefing: vec![],
                    mem_limit: None,
                    workspace_size: None,
                    needs_network: false,
                    warm_pool: 0,
                    egress: None,
                    isolation: sandboxd_catalog::Isolation::Runc,
                })
                .collect(),
            catalog: false,
        })
    }
}

/// A runtime sessions may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeImage {
    /// The alias a session names.
    pub alias: String,
    /// The image it runs.
    pub image: String,
    /// Whether its sessions get the open network (egress mode `open`).
    pub needs_network: bool,
    /// Its egress policy (`egress`, or what `needs_network` means).
    pub egress: Egress,
    /// What stands between its sandboxes and the node's kernel.
    pub isolation: sandboxd_catalog::Isolation,
    /// Its memory limit, if it names one.
    pub mem_limit: Option<String>,
    /// Its workspace size, if it names one (at most the host's).
    pub workspace_size: Option<String>,
    /// Environment of its containers.
    pub env: BTreeMap<String, String>,
}

/// Parses the compact runtime form `alias=image,alias2=image2`; an error names the setting.
pub fn parse_runtimes(text: &str) -> Result<Vec<RuntimeImage>, String> {
    let refused = |message: String| format!("SANDBOXD_RUNTIMES (--runtimes): {message}");
    let mut out: Vec<RuntimeImage> = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((alias, image)) = item.split_once('=') else {
            return Err(refused(format!("'{item}' is not alias=image")));
        };
        let (alias, image) = (alias.trim(), image.trim());
        let valid = alias.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            && alias
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !valid {
            return Err(refused(format!(
                "alias '{alias}' must match [a-z][a-z0-9-]*"
            )));
        }
        if image.is_empty() {
            return Err(refused(format!("alias '{alias}' names no image")));
        }
        if out.iter().any(|r| r.alias == alias) {
            return Err(refused(format!("alias '{alias}' is listed twice")));
        }
        out.push(RuntimeImage {
            alias: alias.to_owned(),
            image: image.to_owned(),
            needs_network: false,
            egress: Egress::none(),
            isolation: sandboxd_catalog::Isolation::Runc,
            mem_limit: None,
            workspace_size: None,
            env: BTreeMap::new(),
        });
    }
    if out.is_empty() {
        return Err(refused(
            "lists no runtime; give at least one alias=image".into(),
        ));
    }
    Ok(out)
}
