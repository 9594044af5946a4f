//! The model briefing: the paragraph appended to an agent's instructions for the runtime its
//! run got. It is composed from the catalog entry (the package list is read from the definition,
//! never kept as a second list by hand), so a package added to the catalog reaches the prompt in
//! the same edit that puts it in the image. Only what cannot be derived is prose, in the entry's
//! `briefing` sentences.

use crate::CatalogEntry;
use crate::egress::EgressMode;

/// What every run is told about how to work in a sandbox, whatever the runtime.
pub const HOW_TO_WORK: [&str; 4] = [
    "Commands run under POSIX /bin/sh, not bash: brace expansion such as {a,b}, [[ ]] and arrays do not work.",
    "Keep project files in /workspace, the shared files; the rest of the sandbox is read-only but for ~ and /tmp, which are small, not shared, and emptied when the sandbox sleeps.",
    "Each command is a new process: variables, cd and shell state do not carry over to the next command, so chain steps with && in one command.",
    "Check the result of what you did (run it, list the file, read it back) before you report success.",
];

/// The briefing paragraph for one catalog entry.
pub fn briefing(entry: &CatalogEntry) -> String {
    let mut sentences = Vec::new();
    let what = entry.description.trim().trim_end_matches('.');
    if what.is_empty() {
        sentences.push(format!("Your sandbox runs the `{}` runtime.", entry.alias));
    } else {
        sentences.push(format!(
            "Your sandbox runs the `{}` runtime: {what}.",
            entry.alias
        ));
    }
    if !entry.packages.is_empty() {
        sentences.push(format!(
            "Python packages installed: {}.",
            entry.packages.join(", ")
        ));
    }
    sentences.extend(entry.briefing.iter().map(|s| s.trim().to_owned()));
    let egress = entry.effective_egress();
    sentences.push(match egress.mode {
        EgressMode::Open => {
            "It has a network: you can fetch pages and install packages.".to_owned()
        }
        EgressMode::Allowlist if !egress.allow.is_empty() => format!(
            "Its network reaches only {}; every other destination is refused.",
            egress.summary().trim_start_matches("allowlist: ")
        ),
        _ => {
            "It has no network: nothing can be downloaded or installed, so work with what is there."
                .to_owned()
        }
    });
    sentences.extend(HOW_TO_WORK.iter().map(|s| (*s).to_owned()));
    sentences.join(" ")
}

/// The briefing for the runtime `alias` of a deployment's catalog; `None` for an alias the
/// catalog does not ship (a host started with its own allowlist is not one whose images can be
/// described honestly, and a prompt that guesses is worse than one that is silent).
pub fn briefing_for(catalog: &[CatalogEntry], alias: &str) -> Option<String> {
    catalog.iter().find(|e| e.alias == alias).map(briefing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SHIPPED, parse};

    fn workbench() -> CatalogEntry {
        parse(SHIPPED)
            .expect("the shipped catalog is valid")
            .into_iter()
            .find(|e| e.alias == "workbench")
            .expect("workbench is shipped")
    }

    #[test]
    fn an_allowlist_is_told_destination_by_destination() {
        let mut entry = workbench();
        entry.egress = serde_json::from_str(
            r#"{"mode": "allowlist", "allow": [{"domain": "pypi.org"}, {"domain": "*.pythonhosted.org", "ports": [443]}]}"#,
        )
        .expect("valid");
        assert!(briefing(&entry).contains(
            "Its network reaches only pypi.org, *.pythonhosted.org (ports 443); every other destination is refused."
        ));
        entry.egress = serde_json::from_str(r#"{"mode": "allowlist"}"#).expect("valid");
        assert!(briefing(&entry).contains("It has no network"));
    }

    #[test]
    fn workbench_briefing_is_pinned() {
        assert_eq!(
            briefing(&workbench()),
            "Your sandbox runs the `workbench` runtime: Write and run code, read what the user attached (PDFs, office documents, images), chart it, fetch a page: Python 3.12 and Node 24 with the document, data and web toolkit. \
Python packages installed: liteparse, pypdf, python-docx, openpyxl, python-pptx, reportlab, pandas, duckdb, tabulate, matplotlib, pillow, httpx, requests, beautifulsoup4, lxml, markdownify, pyyaml. \
Read PDFs and images with `lit` (liteparse): text or Markdown, OCR included; for a PDF that already has a text layer `pdftotext` is faster, and `pdfinfo` gives the page count in milliseconds, so check it before planning work on a long document. \
Do not read a large file to look through it: extract it once into a text file, find the places that matter with `rg -n`, and read one with `sed -n '400,460p'`. \
OCR runs only on pages without a text layer and costs about 9 s per scanned page, so a long scan will not finish within the 300 s command limit: limit it with `lit --target-pages 1-40` and work through it in parts. `--no-ocr` on a scan succeeds with an almost empty result, which is the worse failure; check the size of what you extracted. \
LibreOffice runs headless: `soffice --headless --convert-to pdf deck.pptx` renders a deck, document or sheet you built, `--convert-to png` turns a slide into an image you can look at, and it reads the old .doc, .xls and .ppt formats. \
There is no C compiler; packages that need one to build will not install. With the network, `uv pip install --no-cache --target /workspace/.packages NAME` adds a pure-Python or wheel package (the image's own folders are read-only); run Python with `PYTHONPATH=/workspace/.packages` to use it. \
It has a network: you can fetch pages and install packages. \
Commands run under POSIX /bin/sh, not bash: brace expansion such as {a,b}, [[ ]] and arrays do not work. \
Keep project files in /workspace, the shared files; the rest of the sandbox is read-only but for ~ and /tmp, which are small, not shared, and emptied when the sandbox sleeps. \
Each command is a new process: variables, cd and shell state do not carry over to the next command, so chain steps with && in one command. \
Check the result of what you did (run it, list the file, read it back) before you report success."
        );
    }

    #[test]
    fn a_package_added_to_the_catalog_reaches_the_briefing() {
        let mut value: serde_json::Value = serde_json::from_str(SHIPPED).expect("json");
        value[0]["packages"]
            .as_array_mut()
            .expect("packages")
            .push("scikit-learn".into());
        let edited = parse(&value.to_string()).expect("still valid");
        let before = briefing(&workbench());
        let after = briefing(&edited[0]);
        assert_ne!(before, after);
        assert!(
            after.contains("markdownify, pyyaml, scikit-learn."),
            "{after}"
        );
        assert!(!before.contains("scikit-learn"));
    }

    #[test]
    fn no_network_and_unknown_alias() {
        let entries =
            parse(r#"[{"alias": "plain", "image": "debian:12", "briefing": ["Only coreutils."]}]"#)
                .expect("valid");
        let text = briefing_for(&entries, "plain").expect("shipped alias");
        assert!(
            text.starts_with(
                "Your sandbox runs the `plain` runtime. Only coreutils. It has no network"
            ),
            "{text}"
        );
        assert!(!text.contains("Python packages"));
        assert_eq!(briefing_for(&entries, "custom"), None);
    }
}
