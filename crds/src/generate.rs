//! The generated files of the repository: the CRD YAML and the Runtime manifests of the chart.
//! `crdgen` and `runtimegen` write them; a test fails when the committed ones drift.

use std::path::{Path, PathBuf};

use kube::Resource;
use serde::Serialize;

use crate::catalog::{self, CatalogErrors};

/// The command that regenerates every generated file.
pub const REGENERATE: &str = "make generate";

/// The catalog, relative to the repository root.
pub const CATALOG: &str = "catalog/runtimes.json";
/// The chart's CRD folder, relative to the repository root.
pub const CRD_DIR: &str = "charts/sandboxd/crds";
/// The Runtime manifests generated from the catalog, relative to the repository root.
pub const RUNTIMES: &str = "charts/sandboxd/files/runtimes.yaml";
/// The catalog as the chart ships it to sandboxd (its start-up allowlist, `SANDBOXD_RUNTIMES_FILE`):
/// Helm reads only files inside the chart, so the generators copy it there.
pub const CHART_CATALOG: &str = "charts/sandboxd/files/runtimes.json";

/// A file the generators own: where it goes and what it must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedFile {
    /// Path relative to the repository root.
    pub path: PathBuf,
    /// The exact content.
    pub content: String,
}

/// Why a generated file could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The YAML encoder refused a value.
    #[error("could not encode {what} as YAML: {source}")]
    Yaml {
        /// What was being encoded.
        what: String,
        /// The encoder's error.
        source: serde_yaml::Error,
    },
    /// The catalog could not be read.
    #[error("could not read {path}: {source}")]
    Read {
        /// The catalog path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The catalog is malformed.
    #[error(transparent)]
    Catalog(#[from] CatalogErrors),
}

fn header(source: &str) -> String {
    format!("# Generated from {source} by `{REGENERATE}`. Do not edit by hand.\n")
}

fn yaml<T: Serialize>(what: &str, value: &T) -> Result<String, GenerateError> {
    serde_yaml::to_string(value).map_err(|source| GenerateError::Yaml {
        what: what.to_owned(),
        source,
    })
}

/// The CRD files, one per kind, named `<group>_<plural>.yaml`.
pub fn crd_files() -> Result<Vec<GeneratedFile>, GenerateError> {
    crate::v1alpha1::crds()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let body = yaml(&name, &crd)?;
            let (plural, group) = name.split_once('.').unwrap_or((&name, crate::GROUP));
            Ok(GeneratedFile {
                path: Path::new(CRD_DIR).join(format!("{group}_{plural}.yaml")),
                content: header("the Rust types in crds/src/v1alpha1") + &body,
            })
        })
        .collect()
}

/// The Runtime manifests for the catalog text: one YAML document per entry.
pub fn runtime_file(catalog_text: &str) -> Result<GeneratedFile, GenerateError> {
    let entries = catalog::parse(catalog_text)?;
    let mut content = header(CATALOG);
    for runtime in catalog::runtimes(&entries) {
        let name = runtime.meta().name.clone().unwrap_or_default();
        content.push_str("---\n");
        content.push_str(&yaml(&name, &runtime)?);
    }
    Ok(GeneratedFile {
        path: PathBuf::from(RUNTIMES),
        content,
    })
}

/// The catalog copied into the chart, validated first (JSON has no comments, so no header).
pub fn chart_catalog_file(catalog_text: &str) -> Result<GeneratedFile, GenerateError> {
    catalog::parse(catalog_text)?;
    Ok(GeneratedFile {
        path: PathBuf::from(CHART_CATALOG),
        content: catalog_text.to_owned(),
    })
}

/// Every generated file, for the repository at `root`.
pub fn all(root: &Path) -> Result<Vec<GeneratedFile>, GenerateError> {
    let path = root.join(CATALOG);
    let text =
        std::fs::read_to_string(&path).map_err(|source| GenerateError::Read { path, source })?;
    let mut files = crd_files()?;
    files.push(runtime_file(&text)?);
    files.push(chart_catalog_file(&text)?);
    Ok(files)
}

/// Writes `files` under `root`, creating folders; returns the paths that changed.
pub fn write(root: &Path, files: &[GeneratedFile]) -> std::io::Result<Vec<PathBuf>> {
    let mut changed = Vec::new();
    for file in files {
        let path = root.join(&file.path);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(file.content.as_str()) {
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, &file.content)?;
        changed.push(file.path.clone());
    }
    Ok(changed)
}

/// The generated files under `root` that differ from what the sources produce, each with the
/// message a developer needs: which file, and the command that regenerates it.
pub fn drift(root: &Path, files: &[GeneratedFile]) -> Vec<String> {
    files
        .iter()
        .filter(|f| {
            std::fs::read_to_string(root.join(&f.path)).ok().as_deref() != Some(f.content.as_str())
        })
        .map(|f| {
            format!(
                "{} is out of date with its sources: run `{REGENERATE}` and commit the result",
                f.path.display()
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    #[test]
    fn committed_generated_files_match_their_sources() {
        let files = all(&root()).expect("generated files");
        let drifted = drift(&root(), &files);
        assert!(drifted.is_empty(), "{}", drifted.join("\n"));
    }

    #[test]
    fn crd_files_are_named_group_plural() {
        let names: Vec<_> = crd_files()
            .expect("crds")
            .into_iter()
            .map(|f| f.path)
            .collect();
        assert_eq!(
            names,
            [
                "sandboxsessions",
                "runtimes",
                "tombstones",
                "sandboxhosts",
                "sandboxsnapshots"
            ]
            .map(|p| Path::new(CRD_DIR).join(format!("sandboxd.dev_{p}.yaml")))
        );
    }

    #[test]
    fn drift_names_the_file_and_the_command() {
        let file = GeneratedFile {
            path: PathBuf::from("no/such/file.yaml"),
            content: "x".into(),
        };
        assert_eq!(
            drift(&root(), &[file]),
            [
                "no/such/file.yaml is out of date with its sources: run `make generate` and commit the result"
            ]
        );
    }
}
