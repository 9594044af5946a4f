//! Validates `catalog/runtimes.json` (every error listed, each naming the entry and field) and
//! writes the chart's Runtime manifests and its copy of the catalog from it. Usage: `runtimegen [REPO_ROOT]`.

use std::path::PathBuf;
use std::process::ExitCode;

use sandboxd_crds::generate;

fn main() -> ExitCode {
    let root = std::env::args()
        .nth(1)
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    let path = root.join(generate::CATALOG);
    let result = std::fs::read_to_string(&path)
        .map_err(|e| format!("could not read {}: {e}", path.display()))
        .and_then(|text| {
            Ok([
                generate::runtime_file(&text).map_err(|e| format!("{}: {e}", path.display()))?,
                generate::chart_catalog_file(&text)
                    .map_err(|e| format!("{}: {e}", path.display()))?,
            ])
        })
        .and_then(|files| generate::write(&root, &files).map_err(|e| e.to_string()));
    match result {
        Ok(changed) => {
            for path in changed {
                eprintln!("wrote {}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("runtimegen: {e}");
            ExitCode::FAILURE
        }
    }
}
