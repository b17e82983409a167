//! Manifest parsing (`kubectl saferollout lint`): any input lints or fails
//! with an error naming a document and a place inside the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saferollout_preflight::lint_documents;

/// Lines as YAML counts them: a line break is LF, CRLF or a lone CR (an
/// editor shows a lone CR as a break too), so a parser's position may lie
/// past what `str::lines` counts.
fn yaml_lines(text: &str) -> usize {
    1 + text.replace("\r\n", "\n").matches(['\r', '\n']).count()
}

fuzz_target!(|data: &[u8]| {
    let Ok(yaml) = std::str::from_utf8(data) else {
        return;
    };
    let lines = yaml_lines(yaml);
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
