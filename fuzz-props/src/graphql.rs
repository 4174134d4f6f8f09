//! A GraphQL document through what `/graphql` does before async-graphql's own walks:
//! `parse_query` (as `Request::parsed_query` does), `graphql::introspection::is_introspection`,
//! `graphql::cost::check` and `graphql::introspection::check`. Properties: none panics; a
//! document the cost check accepts really is small once expanded, measured by a naive walk that follows every spread (with a budget, so the walk itself stays small):
//! at most `SELECTIONS_EXPANDED_MAX` selections of any kind (every field, fragment spread and
//! inline fragment a validation walk visits), at most `ROOT_FIELDS_MAX` fields at an
//! operation's root, nesting at most `NESTING_MAX`, and no fragment cycle, for every operation
//! and every fragment.

use async_graphql::parser::parse_query;
use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, Selection, SelectionSet,
};
use query_api::graphql::cost::{self, NESTING_MAX, ROOT_FIELDS_MAX, SELECTIONS_EXPANDED_MAX};
use query_api::graphql::introspection;

pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(doc) = parse_query(text) else {
        return;
    };
    // Runs on every parsed document, before any bound is checked: it must not panic or recurse.
    let _ = introspection::is_introspection(&doc);
    if cost::check(&doc).is_err() {
        return;
    }
    // Runs after the cost check, which bounds its walk.
    let _ = introspection::check(&doc, introspection::Bounds { of_type_max: 9 });
    let mut walk = Naive {
        doc: &doc,
        visited: 0,
        stack: Vec::new(),
    };
    for (name, fragment) in &doc.fragments {
        let cost = walk.set(&fragment.node.selection_set.node, 0);
        assert!(
            walk.visited <= SELECTIONS_EXPANDED_MAX,
            "fragment {name}: {text}"
        );
        assert!(
            cost.depth <= NESTING_MAX,
            "fragment {name} nests {}: {text}",
            cost.depth
        );
        walk.visited = 0;
    }
    let operations: Vec<_> = match &doc.operations {
        DocumentOperations::Single(op) => vec![op],
        DocumentOperations::Multiple(ops) => ops.values().collect(),
    };
    for op in operations {
        let cost = walk.set(&op.node.selection_set.node, 0);
        assert!(
            walk.visited <= SELECTIONS_EXPANDED_MAX,
            "{} visits: {text}",
            walk.visited
        );
        assert!(cost.depth <= NESTING_MAX, "nests {}: {text}", cost.depth);
        assert!(
            cost.root_fields <= ROOT_FIELDS_MAX,
            "{} root fields: {text}",
            cost.root_fields
        );
        walk.visited = 0;
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Measure {
    /// Fields at this level, through fragments.
    root_fields: usize,
    /// Levels below this one: a field with a selection set, an inline fragment and a spread
    /// each add one.
    depth: usize,
}

/// Expands every spread where it is used, as a validation walk does.
struct Naive<'a> {
    doc: &'a ExecutableDocument,
    /// Selections visited so far; the walk stops expanding past the limit (the assertion then
    /// fails), so it never runs away.
    visited: usize,
    /// Fragments being expanded: meeting one again is a cycle the check should have refused.
    stack: Vec<&'a str>,
}

impl<'a> Naive<'a> {
    fn set(&mut self, set: &'a SelectionSet, level: usize) -> Measure {
        let mut total = Measure::default();
        for item in &set.items {
            self.visited += 1;
            if self.visited > SELECTIONS_EXPANDED_MAX || level > NESTING_MAX + 1 {
                return total;
            }
            let m = match &item.node {
                Selection::Field(field) => {
                    let inner = &field.node.selection_set.node;
                    let below = self.set(inner, level + 1);
                    let nested = usize::from(!inner.items.is_empty());
                    Measure {
                        root_fields: 1,
                        depth: below.depth + nested,
                    }
                }
                Selection::InlineFragment(inline) => {
                    let inner = self.set(&inline.node.selection_set.node, level + 1);
                    Measure {
                        depth: inner.depth + 1,
                        ..inner
                    }
                }
                Selection::FragmentSpread(spread) => {
                    let name = spread.node.fragment_name.node.as_str();
                    self.fragment(name, level)
                }
            };
            total.root_fields += m.root_fields;
            total.depth = total.depth.max(m.depth);
        }
        total
    }

    fn fragment(&mut self, name: &'a str, level: usize) -> Measure {
        let Some((key, fragment)) = self.doc.fragments.get_key_value(name) else {
            return Measure {
                root_fields: 0,
                depth: 1,
            };
        };
        let key = key.as_str();
        assert!(
            !self.stack.contains(&key),
            "fragment cycle through {key} accepted"
        );
        self.stack.push(key);
        let inner = self.set(&fragment.node.selection_set.node, level + 1);
        self.stack.pop();
        Measure {
            depth: inner.depth + 1,
            ..inner
        }
    }
}
