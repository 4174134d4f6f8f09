//! Bounds a GraphQL document's size once expanded, in time linear in the document, before
//! async-graphql validates it.
//!
//! Why: fragment spreads add no depth, and async-graphql's own depth, recursion and complexity
//! checks walk every expansion of every spread. `F{i} = { ...F{i-1} ...F{i-1} }` makes that walk
//! 2^n for a document of n lines (n = 29 held a core for minutes). Here each fragment's cost is
//! computed once and reused at every spread, so the check costs one pass over the document; a
//! document whose expansion is too big, too deep or too wide at the root is refused before any
//! of those walks runs. Every operation and every fragment is checked, executed or not, because
//! validation visits them all.

use std::collections::{HashMap, HashSet};

use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, Selection, SelectionSet,
};

/// Most selections an operation or fragment may expand to: fields, fragment spreads and inline
/// fragments, every spread counted as often as it is reached. Spreads count because a
/// validation walk visits each one, even a spread of a fragment with no field (or of an unknown
/// one). A legitimate history page selects a few dozen.
pub const SELECTIONS_EXPANDED_MAX: usize = 1_000;

/// Most fields at an operation's root, fragments included: each root field that does I/O runs
/// at once with the others, so aliases of one field must not multiply a request's load.
pub const ROOT_FIELDS_MAX: usize = 10;

/// Deepest nesting of selection sets, counting a fragment spread as one level (as
/// async-graphql's recursion check does).
pub const NESTING_MAX: usize = 16;

/// Why a document is refused. Each is the caller's doing: BAD_REQUEST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    TooManySelections,
    TooManyRootFields,
    TooDeep,
    FragmentCycle,
}

impl Refusal {
    /// The message the caller gets.
    pub fn message(self) -> String {
        match self {
            Self::TooManySelections => {
                format!("the query expands to more than {SELECTIONS_EXPANDED_MAX} selections")
            }
            Self::TooManyRootFields => {
                format!("the query has more than {ROOT_FIELDS_MAX} root fields")
            }
            Self::TooDeep => format!("the query nests deeper than {NESTING_MAX} levels"),
            Self::FragmentCycle => "the query's fragments spread each other in a cycle".to_owned(),
        }
    }
}

/// The cost of one selection set, independent of where it is used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Cost {
    /// Fields at this level, through fragments and inline fragments.
    fields: usize,
    /// Every selection (field, spread, inline fragment) at and below this level, expanded.
    selections: usize,
    /// Levels of nesting below this one (a leaf field's set is 0).
    depth: usize,
}

impl Cost {
    fn add(self, other: Cost) -> Cost {
        Cost {
            fields: self.fields.saturating_add(other.fields),
            selections: self.selections.saturating_add(other.selections),
            depth: self.depth.max(other.depth),
        }
    }

    fn check(self, nesting_max: usize) -> Result<Self, Refusal> {
        if self.selections > SELECTIONS_EXPANDED_MAX {
            return Err(Refusal::TooManySelections);
        }
        if self.depth > nesting_max {
            return Err(Refusal::TooDeep);
        }
        Ok(self)
    }
}

struct Walker<'a> {
    doc: &'a ExecutableDocument,
    /// Fragments whose cost is known: each is computed once.
    done: HashMap<&'a str, Cost>,
    /// Fragments being computed: reaching one again is a cycle.
    open: HashSet<&'a str>,
    /// Deepest nesting accepted: [`NESTING_MAX`], or an introspection document's bound.
    nesting_max: usize,
}

impl<'a> Walker<'a> {
    /// `level` is how deep this set sits in the walk itself, which bounds the walker's own
    /// recursion whatever the document's shape.
    fn set(&mut self, set: &'a SelectionSet, level: usize) -> Result<Cost, Refusal> {
        if level > self.nesting_max {
            return Err(Refusal::TooDeep);
        }
        let mut total = Cost::default();
        for item in &set.items {
            let cost = match &item.node {
                Selection::Field(field) => {
                    let below = self.set(&field.node.selection_set.node, level + 1)?;
                    let nested = usize::from(!field.node.selection_set.node.items.is_empty());
                    Cost {
                        fields: 1,
                        selections: below.selections.saturating_add(1),
                        depth: below.depth + nested,
                    }
                }
                Selection::InlineFragment(inline) => {
                    let inner = self.set(&inline.node.selection_set.node, level + 1)?;
                    Cost {
                        selections: inner.selections.saturating_add(1),
                        depth: inner.depth + 1,
                        ..inner
                    }
                }
                Selection::FragmentSpread(spread) => {
                    let inner = self.fragment(&spread.node.fragment_name.node, level + 1)?;
                    Cost {
                        selections: inner.selections.saturating_add(1),
                        depth: inner.depth + 1,
                        ..inner
                    }
                }
            };
            total = total.add(cost).check(self.nesting_max)?;
        }
        Ok(total)
    }

    /// A fragment's cost, computed on first use. An unknown fragment costs nothing here:
    /// validation refuses it.
    fn fragment(&mut self, name: &'a str, level: usize) -> Result<Cost, Refusal> {
        if let Some(cost) = self.done.get(name) {
            return Ok(*cost);
        }
        let Some((key, fragment)) = self.doc.fragments.get_key_value(name) else {
            return Ok(Cost::default());
        };
        let key = key.as_str();
        if !self.open.insert(key) {
            return Err(Refusal::FragmentCycle);
        }
        let cost = self.set(&fragment.node.selection_set.node, level)?;
        self.open.remove(key);
        self.done.insert(key, cost);
        Ok(cost)
    }
}

/// Checks every operation and fragment of `doc` against the limits above.
pub fn check(doc: &ExecutableDocument) -> Result<(), Refusal> {
    check_within(doc, NESTING_MAX)
}

/// [`check`] with another nesting bound (an introspection document's, `introspection.rs`).
pub fn check_within(doc: &ExecutableDocument, nesting_max: usize) -> Result<(), Refusal> {
    let mut walker = Walker {
        doc,
        done: HashMap::new(),
        open: HashSet::new(),
        nesting_max,
    };
    for name in doc.fragments.keys() {
        walker.fragment(name.as_str(), 0)?;
    }
    let operations: Vec<_> = match &doc.operations {
        DocumentOperations::Single(op) => vec![op],
        DocumentOperations::Multiple(ops) => ops.values().collect(),
    };
    for op in operations {
        let cost = walker.set(&op.node.selection_set.node, 0)?;
        if cost.fields > ROOT_FIELDS_MAX {
            return Err(Refusal::TooManyRootFields);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_graphql::parser::parse_query;
    use std::time::{Duration, Instant};

    fn checked(query: &str) -> Result<(), Refusal> {
        check(&parse_query(query).expect("parses"))
    }

    /// `fragment F0 on QueryRoot { __typename }` and `F{i} = { ...F{i-1} ...F{i-1} }`.
    fn fan_out(levels: usize, root: &str) -> String {
        let mut q = format!("{root}\nfragment F0 on QueryRoot {{ __typename }}\n");
        for i in 1..=levels {
            q.push_str(&format!(
                "fragment F{i} on QueryRoot {{ ...F{p} ...F{p} }}\n",
                p = i - 1
            ));
        }
        q
    }

    #[test]
    fn ordinary_queries_pass() {
        let page = r#"query($f: TransferFilter) { transfers(first: 100, filter: $f) {
            edges { cursor node { reqId userId from to asset amount state failureCode
                    createdAt updatedAt events { sequence eventType state } } }
            nodes { ...T } pageInfo { hasNextPage endCursor } } }
            fragment T on Transfer { reqId state amount }"#;
        assert_eq!(checked(page), Ok(()));
        assert_eq!(
            checked("{ balances { asset funding spot inFlight } stateCounts { state } }"),
            Ok(())
        );
    }

    #[test]
    fn exponential_fragment_fan_out_is_refused_in_linear_time() {
        assert_eq!(
            checked(&fan_out(3, "{ ...F3 }")),
            Ok(()),
            "8 root fields through 14 spreads"
        );
        let nested = "{ transfers { nodes { ...F5 } } }".replace("QueryRoot", "Transfer");
        assert_eq!(
            checked(&fan_out(5, &nested).replace("on QueryRoot", "on Transfer")),
            Ok(()),
            "32 selections below one root field"
        );
        let start = Instant::now();
        // Shallow enough to pass the nesting cap: refused for its expanded size (16,384).
        assert_eq!(
            checked(&fan_out(14, "{ ...F14 }")),
            Err(Refusal::TooManySelections)
        );
        // The issue's document, and a longer chain, whichever limit they meet first; even
        // unused fragments are refused, since validation would walk them.
        assert!(checked(&fan_out(29, "{ ...F29 }")).is_err());
        assert!(checked(&fan_out(200, "{ __typename }")).is_err());
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
    }

    /// Found by the `graphql` fuzz target's naive walk: spreads of a fragment that selects no
    /// field (here an unknown one) added nothing, so 12 levels of 10 spreads (10^11 visits for
    /// a validation walk) passed.
    #[test]
    fn atk_spreads_without_fields_count_toward_the_expanded_size() {
        let mut q = String::from("{ ...F12 }\nfragment F1 on QueryRoot { ...U ...U }\n");
        for i in 2..=12 {
            let spreads = format!("...F{} ", i - 1).repeat(10);
            q.push_str(&format!("fragment F{i} on QueryRoot {{ {spreads}}}\n"));
        }
        assert_eq!(checked(&q), Err(Refusal::TooManySelections));
        let inline = format!("{{ {} }}", "... on QueryRoot { __typename } ".repeat(600));
        assert_eq!(checked(&inline), Err(Refusal::TooManySelections));
    }

    #[test]
    fn aliases_at_the_root_are_capped() {
        let ten: String = (0..10)
            .map(|i| format!("a{i}: balances {{ asset }} "))
            .collect();
        assert_eq!(checked(&format!("{{ {ten} }}")), Ok(()));
        let eleven = format!("{{ {ten} a10: balances {{ asset }} }}");
        assert_eq!(checked(&eleven), Err(Refusal::TooManyRootFields));
        // Through a fragment and an inline fragment they still count.
        let hidden = format!(
            "{{ ...R ... on QueryRoot {{ b: balances {{ asset }} }} }} fragment R on QueryRoot {{ {ten} }}"
        );
        assert_eq!(checked(&hidden), Err(Refusal::TooManyRootFields));
    }

    #[test]
    fn deep_nesting_and_cycles_are_refused() {
        let deep = format!("{}{}", "{ a ".repeat(40), "}".repeat(40));
        assert_eq!(checked(&deep), Err(Refusal::TooDeep));
        let chain: String = (1..40)
            .map(|i| format!("fragment G{i} on QueryRoot {{ ...G{} }}\n", i - 1))
            .collect();
        let q = format!("{{ ...G39 }}\nfragment G0 on QueryRoot {{ __typename }}\n{chain}");
        assert_eq!(checked(&q), Err(Refusal::TooDeep));
        let cycle = "{ ...A } fragment A on QueryRoot { ...B } fragment B on QueryRoot { ...A }";
        assert_eq!(checked(cycle), Err(Refusal::FragmentCycle));
    }
}
