//! Manifest parsing (`kubectl saferollout lint`): any input lints or fails
//! with an error naming a document and a place inside the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saferollout_preflight::lint_documents;

fuzz_target!(|data: &[u8]| {
    let Ok(yaml) = std::str::from_utf8(data) else {
        return;
    };
    let lines = yaml.lines().count().max(1);
    match lint_documents(yaml, None) {
        Ok(results) => {
            for (doc, _) in results {
                assert!(doc.document >= 1);
                assert!((1..=lines).contains(&doc.line), "{doc:?} of {lines}");
            }
        }
        Err(e) => {
            assert!(e.document >= 1);
            if let Some(line) = e.line {
                assert!((1..=lines + 1).contains(&line), "{e} of {lines}");
            }
        }
    }
});
