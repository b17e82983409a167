//! The `Selector` strategy's edits to pod templates, on their JSON (as
//! ControllerRevisions and `spec.template` hold them): the target's and the
//! canary's node-affinity expressions on the handover label, the canary's
//! pod label, and the inverse that gives a template's content back without
//! them, so a revision is named by what the agent runs whichever DaemonSet
//! runs it.

use serde_json::{Map, Value, json};

use super::CANARY_OF_LABEL;

/// The target's expression: it runs where the node is not handed to the
/// canary (`NotIn` also matches a node without the label).
pub fn target_expression(key: &str) -> Value {
    json!({"key": key, "operator": "NotIn", "values": ["drain", "new"]})
}

/// The canary's expression: it runs where the node is handed to it.
pub fn canary_expression(key: &str) -> Value {
    json!({"key": key, "operator": "In", "values": ["surge", "new"]})
}

/// `template` with `expression` ANDed into every required
/// `nodeSelectorTerm` (one term holding only it when there is none), after
/// removing any expression on the same key.
pub fn with_expression(template: &Value, key: &str, expression: Value) -> Value {
    let mut t = strip(template, key);
    let spec = object(root(&mut t), "spec");
    let required = object(
        object(object(spec, "affinity"), "nodeAffinity"),
        "requiredDuringSchedulingIgnoredDuringExecution",
    );
    let terms = required
        .entry("nodeSelectorTerms")
        .or_insert_with(|| Value::Array(Vec::new()));
    let Value::Array(terms) = terms else {
        return t;
    };
    if terms.is_empty() {
        terms.push(json!({}));
    }
    for term in terms.iter_mut() {
        if let Value::Object(term) = term {
            let exprs = term
                .entry("matchExpressions")
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(exprs) = exprs {
                exprs.push(expression.clone());
            }
        }
    }
    t
}

/// The target's template during a rollout: its own plus the target expression.
pub fn target_template(template: &Value, key: &str) -> Value {
    with_expression(template, key, target_expression(key))
}

/// The canary's template: `template` plus the canary expression and the
/// label that puts its pods under the canary's selector only.
pub fn canary_template(template: &Value, key: &str, rollout_id: &str) -> Value {
    let mut t = with_expression(template, key, canary_expression(key));
    object(object(root(&mut t), "metadata"), "labels")
        .insert(CANARY_OF_LABEL.into(), Value::String(rollout_id.into()));
    t
}

/// `template` without anything the strategy added: expressions on `key`,
/// the terms, affinities and maps left empty by their removal, and the
/// canary label. Applied to a template that has none, it changes nothing.
pub fn strip(template: &Value, key: &str) -> Value {
    let mut t = template.clone();
    if let Some(labels) = t
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        labels.remove(CANARY_OF_LABEL);
    }
    let Some(required) =
        t.pointer_mut("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution")
    else {
        return t;
    };
    if let Some(Value::Array(terms)) = required.get_mut("nodeSelectorTerms") {
        let mut touched = false;
        for term in terms.iter_mut() {
            let Some(Value::Array(exprs)) = term.get_mut("matchExpressions") else {
                continue;
            };
            let before = exprs.len();
            exprs.retain(|e| e.get("key").and_then(Value::as_str) != Some(key));
            if exprs.len() != before {
                touched = true;
                if exprs.is_empty()
                    && let Some(term) = term.as_object_mut()
                {
                    term.remove("matchExpressions");
                }
            }
        }
        if touched {
            terms.retain(|term| term.as_object().is_none_or(|m| !m.is_empty()));
        }
    }
    prune_empty(&mut t, &["spec", "affinity", "nodeAffinity"], |m| {
        let required = "requiredDuringSchedulingIgnoredDuringExecution";
        if m.get(required)
            .and_then(|r| r.get("nodeSelectorTerms"))
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
        {
            m.remove(required);
        }
    });
    t
}

/// Applies `trim` to the object at `path`, then removes each object along
/// the path (deepest first) that is left empty.
fn prune_empty(t: &mut Value, path: &[&str], trim: impl FnOnce(&mut Map<String, Value>)) {
    let pointer: String = path.iter().map(|p| format!("/{p}")).collect();
    match t.pointer_mut(&pointer).and_then(Value::as_object_mut) {
        Some(m) => trim(m),
        None => return,
    }
    for depth in (1..path.len()).rev() {
        let parent: String = path[..depth].iter().map(|p| format!("/{p}")).collect();
        let child = path[depth];
        let Some(p) = t.pointer_mut(&parent).and_then(Value::as_object_mut) else {
            return;
        };
        if p.get(child)
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
        {
            p.remove(child);
        }
    }
}

/// The object under `key` in `m`, created (empty) when absent or not an object.
fn object<'m>(m: &'m mut Map<String, Value>, key: &str) -> &'m mut Map<String, Value> {
    let slot = m
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    slot.as_object_mut().expect("just made an object")
}

/// `v` as an object, made one when it is not.
fn root(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    v.as_object_mut().expect("just made an object")
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "handover.saferollout.dev/ns.plugin";

    fn plain() -> Value {
        json!({
            "metadata": {"labels": {"app": "plugin"}},
            "spec": {"containers": [{"name": "p", "image": "plugin:v2"}]}
        })
    }

    fn with_user_affinity() -> Value {
        json!({
            "metadata": {"labels": {"app": "plugin"}},
            "spec": {
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                    ]
                }}},
                "containers": [{"name": "p", "image": "plugin:v2"}]
            }
        })
    }

    #[test]
    fn the_target_expression_is_anded_into_every_term_and_stripped_back() {
        let t = target_template(&with_user_affinity(), KEY);
        let terms = t
            .pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
            .and_then(Value::as_array)
            .unwrap();
        assert_eq!(terms.len(), 2);
        for term in terms {
            let exprs = term["matchExpressions"].as_array().unwrap();
            assert_eq!(exprs.last(), Some(&target_expression(KEY)));
        }
        assert_eq!(strip(&t, KEY), with_user_affinity());
    }

    #[test]
    fn a_template_without_affinity_gets_one_term_and_loses_it_again() {
        let t = canary_template(&plain(), KEY, "ns.plugin");
        assert_eq!(
            t.pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"),
            Some(&json!([{"matchExpressions": [canary_expression(KEY)]}]))
        );
        assert_eq!(t["metadata"]["labels"][CANARY_OF_LABEL], "ns.plugin");
        assert_eq!(strip(&t, KEY), plain());
    }

    #[test]
    fn writing_an_expression_twice_keeps_one() {
        let once = target_template(&plain(), KEY);
        assert_eq!(target_template(&once, KEY), once);
        // The canary's expression replaces the target's on the same key.
        let canary = canary_template(&once, KEY, "ns.plugin");
        assert_eq!(strip(&canary, KEY), plain());
    }

    #[test]
    fn strip_leaves_other_keys_and_user_affinity_alone() {
        assert_eq!(strip(&plain(), KEY), plain());
        assert_eq!(strip(&with_user_affinity(), KEY), with_user_affinity());
        let other = target_template(&plain(), "handover.saferollout.dev/other");
        assert_eq!(strip(&other, KEY), other);
    }
}
