//! Writes the CRD YAML of every kind into the chart's `crds/` folder.
//! Usage: `crdgen [REPO_ROOT]` (default: the current directory).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let root = std::env::args()
        .nth(1)
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    let result = sandboxd_crds::generate::crd_files()
        .map_err(|e| e.to_string())
        .and_then(|files| sandboxd_crds::generate::write(&root, &files).map_err(|e| e.to_string()));
    report(result)
}

fn report(result: Result<Vec<PathBuf>, String>) -> ExitCode {
    match result {
        Ok(changed) => {
            for path in changed {
                eprintln!("wrote {}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("crdgen: {e}");
            ExitCode::FAILURE
        }
    }
}
