//! Plain-text tables in the style of `kubectl get`: upper-case headers,
//! columns padded to the widest cell and separated by three spaces, no
//! trailing spaces, one row per line.

/// A table under construction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

const GAP: &str = "   ";

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&str]) -> Self {
        Self {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are empty, extra cells are dropped, line
    /// breaks in a cell become spaces (a cell may quote a manifest).
    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut row: Vec<String> = cells
            .into_iter()
            .map(|c| clean(&c.into()))
            .take(self.headers.len())
            .collect();
        row.resize(self.headers.len(), String::new());
        self.rows.push(row);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// The table as text, each line prefixed by `indent` and ending in `\n`.
    pub fn render(&self, indent: &str) -> String {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(width(cell));
            }
        }
        let mut out = String::new();
        for line in std::iter::once(&self.headers).chain(self.rows.iter()) {
            let mut text = String::from(indent);
            for (i, cell) in line.iter().enumerate() {
                text.push_str(cell);
                if i + 1 < columns {
                    text.push_str(&" ".repeat(widths[i] - width(cell)));
                    text.push_str(GAP);
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        out
    }
}

fn width(s: &str) -> usize {
    s.chars().count()
}

fn clean(s: &str) -> String {
    if s.chars().any(char::is_control) {
        s.chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect()
    } else {
        s.to_string()
    }
}

/// `a, b, c` for up to `max` items, else the first `max` and `(+N more)`.
pub fn list(items: &[String], max: usize) -> String {
    if items.len() <= max {
        return items.join(", ");
    }
    format!("{} (+{} more)", items[..max].join(", "), items.len() - max)
}

/// `s` cut to at most `max` characters, ending in `...` when cut (a long
/// message in a table row; JSON/YAML carry it whole).
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let kept: String = s.chars().take(max.saturating_sub(3)).collect();
    format!("{}...", kept.trim_end())
}

/// `-` for an empty or absent value.
pub fn or_dash(s: Option<&str>) -> String {
    match s {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => "-".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_padded_and_lines_have_no_trailing_space() {
        let mut t = Table::new(&["NAME", "STATE", "NODES"]);
        t.row(["0", "Passed", "node-a"]);
        t.row(["10", "Verifying", ""]);
        assert_eq!(
            t.render(""),
            "NAME   STATE       NODES\n\
             0      Passed      node-a\n\
             10     Verifying\n"
        );
    }

    #[test]
    fn rows_are_normalised() {
        let mut t = Table::new(&["A", "B"]);
        t.row(["x\ny"]);
        t.row(["1", "2", "3"]);
        assert_eq!(t.render("  "), "  A     B\n  x y\n  1     2\n");
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn unicode_width_counts_chars() {
        let mut t = Table::new(&["K", "V"]);
        t.row(["é…", "1"]);
        assert_eq!(t.render(""), "K    V\né…   1\n");
    }

    #[test]
    fn long_lists_are_cut() {
        let names: Vec<String> = (1..=5).map(|i| format!("n{i}")).collect();
        assert_eq!(list(&names, 5), "n1, n2, n3, n4, n5");
        assert_eq!(list(&names, 2), "n1, n2 (+3 more)");
        assert_eq!(list(&[], 2), "");
        assert_eq!(or_dash(Some("")), "-");
        assert_eq!(or_dash(None), "-");
        assert_eq!(or_dash(Some("x")), "x");
    }

    #[test]
    fn long_messages_are_cut() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("exactly 10", 10), "exactly 10");
        assert_eq!(truncate("a bit longer than ten", 10), "a bit l...");
        assert_eq!(truncate("a bit  longer", 9), "a bit...");
        assert_eq!(truncate("éééééééééééé", 6), "ééé...");
    }
}
