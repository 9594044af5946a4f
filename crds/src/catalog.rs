//! The runtime catalog as `Runtime` objects. The format itself (entries, validation, the model
//! briefing) lives in the kube-free `sandboxd-catalog` crate, which sandboxd uses too; this
//! module re-exports it and adds only the conversion to the `Runtime` custom resource.

pub use sandboxd_catalog::*;

use crate::v1alpha1::runtime::WarmPool;
use crate::v1alpha1::{Runtime, RuntimeSpec};

/// The `Runtime` object for an entry; `default` marks the catalog's first entry.
pub fn to_runtime(entry: &CatalogEntry, default: bool) -> Runtime {
    Runtime::new(
        &entry.alias,
        RuntimeSpec {
            description: entry.description.clone(),
            image: entry.image.clone(),
            base_image: entry.base_image.clone(),
            setup_commands: entry.setup_commands.clone(),
            packages: entry.packages.clone(),
            env_vars: entry.env_vars.clone(),
            briefing: entry.briefing.clone(),
            mem_limit: entry.mem_limit.clone(),
            workspace_size: entry.workspace_size.clone(),
            needs_network: entry.needs_network,
            egress: entry.egress.as_ref().map(Into::into),
            isolation: (!entry.isolation.is_runc()).then(|| entry.isolation.into()),
            default,
            rebuild_policy: None,
            max_unavailable: None,
            warm_pool: (entry.warm_pool > 0).then(|| WarmPool {
                size: i32::try_from(entry.warm_pool).unwrap_or(i32::MAX),
            }),
        },
    )
}

/// The `Runtime` objects of a catalog, the first marked default.
pub fn runtimes(entries: &[CatalogEntry]) -> Vec<Runtime> {
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| to_runtime(e, i == 0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_catalog_becomes_runtimes_first_is_default() {
        let entries = parse(include_str!("../../catalog/runtimes.json")).expect("valid");
        let rts = runtimes(&entries);
        assert_eq!(rts[0].spec.description, entries[0].description);
        assert!(rts[0].spec.default);
        assert!(rts.iter().skip(1).all(|r| !r.spec.default));
    }

    #[test]
    fn egress_is_carried_to_the_runtime() {
        let entries = parse(
            r#"[{"alias": "a", "image": "i", "egress": {"mode": "allowlist", "allow": [{"domain": "pypi.org", "ports": [443]}]}}, {"alias": "b", "image": "i"}]"#,
        )
        .expect("valid");
        let rts = runtimes(&entries);
        let carried = rts[0].spec.egress.as_ref().expect("carried");
        assert_eq!(
            sandboxd_catalog::egress::Egress::from(carried),
            entries[0].egress.clone().expect("given")
        );
        assert!(rts[0].spec.needs_network, "an allowlist is a network");
        assert_eq!(rts[1].spec.egress, None);
    }
}
