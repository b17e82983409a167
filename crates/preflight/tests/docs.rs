//! docs/preflight.md lists every finding code with its severity and summary,
//! as `codes::ALL` does: a code added, removed or changed in one and not the
//! other fails here.

use saferollout_preflight::codes;

#[test]
fn the_docs_table_lists_every_code() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/preflight.md");
    let text = std::fs::read_to_string(&path).expect("docs/preflight.md");
    let rows: Vec<(String, String, String)> = text
        .lines()
        .filter(|l| l.starts_with("| SR"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 3, "{l}");
            (cells[0].into(), cells[1].into(), cells[2].into())
        })
        .collect();
    let expected: Vec<(String, String, String)> = codes::ALL
        .iter()
        .map(|c| (c.code.into(), c.severity.to_string(), c.summary.into()))
        .collect();
    assert_eq!(rows, expected);
}
