//! Where a field is written: the line of a path such as
//! `spec.template.spec.containers[0].image` in a YAML document.
//!
//! Rules see typed objects (k8s-openapi's), which keep no positions, so a
//! rule names the field it is about by its path ([`crate::Finding::field`])
//! and [`crate::lint_documents`] looks the path up here, in the document's
//! text, once a finding asks for it. The document is parsed a second time
//! into a tree of keys and items with their lines (`serde_yaml` here is
//! serde-saphyr, whose `Spanned` records where each node is used: an alias
//! or a key merged in with `<<` is at the line that refers to it). A path
//! the tree does not hold has no line, and the finding keeps only its
//! object's line.

use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_yaml::Spanned;

/// A parsed document with the line of every mapping key and sequence item.
#[derive(Debug)]
pub(crate) struct Located(Node);

#[derive(Debug)]
enum Node {
    /// Keys (`None` when not a scalar), each with its 1-based line and value.
    Map(Vec<(Option<String>, usize, Node)>),
    /// Items with the 1-based line each starts on.
    Seq(Vec<(usize, Node)>),
    Leaf,
}

/// One step of a path: a key, or an index into a sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

impl Located {
    /// Parses `text` (one document); `None` when it does not parse.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        serde_yaml::from_str::<Node>(text).ok().map(Located)
    }

    /// The 1-based line (in `text`) where the field at `path` is written: the
    /// line of its key, or of the item's first line for an index.
    pub(crate) fn line_of(&self, path: &str) -> Option<usize> {
        let mut node = &self.0;
        let mut line = None;
        for step in steps(path)? {
            let (next_line, next) = match (step, node) {
                (Step::Key(key), Node::Map(entries)) => entries
                    .iter()
                    .find(|(k, _, _)| k.as_deref() == Some(key))
                    .map(|(_, line, value)| (*line, value))?,
                (Step::Index(i), Node::Seq(items)) => items.get(i).map(|(line, n)| (*line, n))?,
                _ => return None,
            };
            line = Some(next_line);
            node = next;
        }
        line
    }
}

/// `a.b[2].c` -> `Key(a), Key(b), Index(2), Key(c)`; `None` when malformed.
fn steps(path: &str) -> Option<Vec<Step<'_>>> {
    let mut steps = Vec::new();
    for part in path.split('.') {
        let (key, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !key.is_empty() {
            steps.push(Step::Key(key));
        }
        while let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']')?;
            steps.push(Step::Index(after[..end].parse().ok()?));
            rest = &after[end + 1..];
        }
        if !rest.is_empty() || (key.is_empty() && part.is_empty()) {
            return None;
        }
    }
    Some(steps)
}

/// A line from a span: serde-saphyr counts from 1 and gives 0 when it does
/// not know (a value serde buffered before it reached `Spanned`).
fn line_of<T>(spanned: &Spanned<T>) -> usize {
    usize::try_from(spanned.referenced.line()).unwrap_or(0)
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<Key>>()? {
            let value = map.next_value::<Node>()?;
            let line = line_of(&key);
            entries.push((key.value.0, line, value));
        }
        Ok(Node::Map(entries))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Node>>()? {
            items.push((line_of(&item), item.value));
        }
        Ok(Node::Seq(items))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_i128<E>(self, _: i128) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_u128<E>(self, _: u128) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_str<E>(self, _: &str) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_bytes<E>(self, _: &[u8]) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
}

/// A mapping key: its text when it is a scalar (Kubernetes' keys are
/// strings; a number or boolean key is compared as written by serde).
struct Key(Option<String>);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a mapping key")
    }

    fn visit_str<E>(self, v: &str) -> Result<Key, E> {
        Ok(Key(Some(v.to_string())))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Key, E> {
        Ok(Key(Some(v.to_string())))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Key, E> {
        Ok(Key(Some(v.to_string())))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Key, E> {
        Ok(Key(Some(v.to_string())))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Key, E> {
        Ok(Key(Some(v.to_string())))
    }
    fn visit_u128<E>(self, v: u128) -> Result<Key, E> {
        Ok(Key(Some(v.to_string())))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Key, E> {
        Ok(Key(Some(v.to_string())))
    }
    fn visit_bytes<E>(self, _: &[u8]) -> Result<Key, E> {
        Ok(Key(None))
    }
    fn visit_unit<E>(self) -> Result<Key, E> {
        Ok(Key(None))
    }
    fn visit_none<E>(self) -> Result<Key, E> {
        Ok(Key(None))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        Key::deserialize(d)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        Key::deserialize(d)
    }
    // A complex key (a mapping or sequence) names no field of a Kubernetes object.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Key, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Key(None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Key, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Key(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
apiVersion: apps/v1
kind: DaemonSet
spec:
  template:
    spec:
      containers:
      - name: plugin
        image: example/plugin:v1
        env:
        - name: A
          value: \"1\"
        -   name: B
            value: \"2\"
      - {name: sidecar, image: example/sidecar:v1}
      initContainers:
        -
          name: init
          image: example/init:v1
";

    #[test]
    fn paths_parse() {
        assert_eq!(
            steps("a.b[2].c").unwrap(),
            [
                Step::Key("a"),
                Step::Key("b"),
                Step::Index(2),
                Step::Key("c")
            ]
        );
        assert_eq!(
            steps("a[1][0]").unwrap(),
            [Step::Key("a"), Step::Index(1), Step::Index(0)]
        );
        for bad in ["a..b", "a[x]", "a[1", "a[1]b", ""] {
            assert!(steps(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn lines_of_keys_and_items() {
        let doc = Located::parse(DOC).unwrap();
        let c = "spec.template.spec.containers";
        for (path, line) in [
            ("kind", 2),
            ("spec.template", 4),
            (&format!("{c}[0]") as &str, 7),
            (&format!("{c}[0].image"), 8),
            (&format!("{c}[0].env[0]"), 10),
            (&format!("{c}[0].env[1]"), 12),
            (&format!("{c}[0].env[1].value"), 13),
            (&format!("{c}[1]"), 14),
            ("spec.template.spec.initContainers[0].image", 18),
        ] {
            assert_eq!(doc.line_of(path), Some(line), "{path}");
        }
        // A flow mapping's keys are on its line.
        assert_eq!(doc.line_of(&format!("{c}[1].image")), Some(14));
        for missing in [
            "spec.selector",
            "kind.x",
            "spec.template.spec.containers[2]",
            "spec.template.spec.containers.image",
            "spec[0]",
        ] {
            assert_eq!(doc.line_of(missing), None, "{missing}");
        }
    }

    #[test]
    fn odd_documents_have_no_lines_and_do_not_panic() {
        assert!(Located::parse("a: [1\n").is_none());
        let scalar = Located::parse("just text\n").unwrap();
        assert_eq!(scalar.line_of("a"), None);
        let keys = Located::parse("1: one\ntrue: yes\n? [a, b]\n: c\nx: ~\n").unwrap();
        assert_eq!(keys.line_of("1"), Some(1));
        assert_eq!(keys.line_of("true"), Some(2));
        assert_eq!(keys.line_of("x"), Some(5));
        let anchors = Located::parse("a: &x {b: 1}\nc: *x\n").unwrap();
        assert_eq!(anchors.line_of("a.b"), Some(1));
    }
}
