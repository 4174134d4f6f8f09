//! What bounds an introspection document (`__schema`, `__type`): the schema's own size, not the
//! depth and complexity limits meant for data.
//!
//! A document is an *introspection document* when every operation in it is a query whose root
//! selects only `__schema`, `__type` and `__typename` ([`is_introspection`]). Such a document
//! is exempt from the data limits (`QUERY_DEPTH_MAX`, `QUERY_COMPLEXITY_MAX`, the cost check's
//! `NESTING_MAX`) and is held instead to [`INTROSPECTION_NESTING_MAX`] and to the shape rules of
//! [`check`], which every document meets, introspection or not:
//! - an `ofType` chain is at most [`Bounds::of_type_max`] deep: the deepest type wrapping the
//!   schema has, or the standard clients' [`STANDARD_TYPE_REF_DEPTH`], whichever is deeper (a
//!   deeper chain can only answer `null`s);
//! - on any path, at most one list of each kind: the schema's (`types`, `directives`), a type's
//!   members (`fields`, `inputFields`, `enumValues`, `interfaces`, `possibleTypes`) and a
//!   field's `args`. So an answer holds each type's members and their arguments at most once
//!   per selection: the schema's size times the (bounded) number of selections, and never
//!   `fields { type { fields { ... } } }`, whose size multiplies by the schema's at each level.
//!
//! The cost check's other bounds (expanded selections, root fields, fragment cycles) hold for
//! every document alike. Any other document, data alone or data mixed with introspection, is
//! held to the data limits as a whole: its introspection fields count toward them as any field
//! does (`docs/contract.md` §3, GraphQL).
//!
//! The field names counted above are the introspection types'; no type of the data schema may
//! use them (a unit test checks the SDL), so a data field never counts toward them.

use std::collections::{HashMap, HashSet};

use async_graphql::parser::types::{
    BaseType, DocumentOperations, ExecutableDocument, OperationType, Selection, SelectionSet,
    ServiceDocument, Type, TypeDefinition, TypeKind, TypeSystemDefinition,
};

/// How deep the standard introspection queries chain `ofType`: graphql-js 16's
/// `getIntrospectionQuery` (GraphiQL 3, Apollo and codegen tools) and graphql-core 3.2's
/// `get_introspection_query` both ask 9 levels.
pub const STANDARD_TYPE_REF_DEPTH: usize = 9;

/// Deepest nesting of an introspection document, counting a fragment spread and an inline
/// fragment as one level each (as the cost check does): the deepest path the rules of
/// [`check`] allow (`__schema`, a schema list, a member list, `args`, `type`, then the
/// `ofType` chain) with every step reached through a fragment, so each counts twice.
pub const fn introspection_nesting_max(of_type_max: usize) -> usize {
    2 * (5 + of_type_max) + 1
}

/// Introspection's bounds, taken from the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Deepest `ofType` chain accepted.
    pub of_type_max: usize,
}

impl Bounds {
    /// The bounds of the schema whose SDL is `sdl`.
    pub fn of_sdl(sdl: &str) -> Self {
        Self {
            of_type_max: deepest_wrapping(sdl).max(STANDARD_TYPE_REF_DEPTH),
        }
    }

    /// The nesting bound of an introspection document.
    pub fn nesting_max(self) -> usize {
        introspection_nesting_max(self.of_type_max)
    }
}

/// Why an introspection part is refused: the caller's doing, BAD_REQUEST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    OfTypeTooDeep(usize),
    ListsNested,
}

impl Refusal {
    /// The message the caller gets.
    pub fn message(self) -> String {
        match self {
            Self::OfTypeTooDeep(max) => format!(
                "the query chains ofType deeper than {max} levels, deeper than any type of the schema"
            ),
            Self::ListsNested => "the query nests an introspection list inside another of its \
                 kind (types or directives, a type's members, args)"
                .to_owned(),
        }
    }
}

/// The lists counted by [`check`], by kind.
const SCHEMA_LISTS: [&str; 2] = ["types", "directives"];
const MEMBER_LISTS: [&str; 5] = [
    "fields",
    "inputFields",
    "enumValues",
    "interfaces",
    "possibleTypes",
];
const ARG_LISTS: [&str; 1] = ["args"];
/// Every field name [`check`] counts.
pub const COUNTED_NAMES: [&str; 9] = [
    "types",
    "directives",
    "fields",
    "inputFields",
    "enumValues",
    "interfaces",
    "possibleTypes",
    "args",
    "ofType",
];

/// Whether every operation of `doc` is a query that selects only `__schema`, `__type` and
/// `__typename` at its root (through fragments too), at least one of them.
pub fn is_introspection(doc: &ExecutableDocument) -> bool {
    let operations: Vec<_> = match &doc.operations {
        DocumentOperations::Single(op) => vec![op],
        DocumentOperations::Multiple(ops) => ops.values().collect(),
    };
    !operations.is_empty()
        && operations.iter().all(|op| {
            op.node.ty == OperationType::Query
                && root_is_introspection(doc, &op.node.selection_set.node)
        })
}

/// Walks a root selection set through its fragments with an explicit stack (a document's
/// spreads may chain arbitrarily before the cost check has run), each fragment once.
fn root_is_introspection(doc: &ExecutableDocument, root: &SelectionSet) -> bool {
    let mut stack = vec![root];
    let mut seen = HashSet::new();
    let mut fields = 0usize;
    while let Some(set) = stack.pop() {
        for item in &set.items {
            match &item.node {
                Selection::Field(field) => {
                    let name = field.node.name.node.as_str();
                    if !matches!(name, "__schema" | "__type" | "__typename") {
                        return false;
                    }
                    fields += 1;
                }
                Selection::InlineFragment(inline) => stack.push(&inline.node.selection_set.node),
                Selection::FragmentSpread(spread) => {
                    let name = spread.node.fragment_name.node.as_str();
                    if seen.insert(name) {
                        if let Some(fragment) = doc.fragments.get(name) {
                            stack.push(&fragment.node.selection_set.node);
                        }
                    }
                }
            }
        }
    }
    fields > 0
}

/// Per path, the most of each counted thing on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Shape {
    of_type: usize,
    schema_lists: usize,
    member_lists: usize,
    arg_lists: usize,
}

impl Shape {
    fn max(self, other: Shape) -> Shape {
        Shape {
            of_type: self.of_type.max(other.of_type),
            schema_lists: self.schema_lists.max(other.schema_lists),
            member_lists: self.member_lists.max(other.member_lists),
            arg_lists: self.arg_lists.max(other.arg_lists),
        }
    }

    /// This shape below a field named `name`.
    fn under(self, name: &str) -> Shape {
        let one = |names: &[&str]| usize::from(names.contains(&name));
        Shape {
            of_type: self.of_type + usize::from(name == "ofType"),
            schema_lists: self.schema_lists + one(&SCHEMA_LISTS),
            member_lists: self.member_lists + one(&MEMBER_LISTS),
            arg_lists: self.arg_lists + one(&ARG_LISTS),
        }
    }

    fn check(self, bounds: Bounds) -> Result<Self, Refusal> {
        if self.of_type > bounds.of_type_max {
            return Err(Refusal::OfTypeTooDeep(bounds.of_type_max));
        }
        if self.schema_lists > 1 || self.member_lists > 1 || self.arg_lists > 1 {
            return Err(Refusal::ListsNested);
        }
        Ok(self)
    }
}

struct Walker<'a> {
    doc: &'a ExecutableDocument,
    bounds: Bounds,
    /// Each fragment's shape, computed once: the walk is linear in the document.
    done: HashMap<&'a str, Shape>,
    /// Fragments being computed; the cost check refuses cycles first, this only stops a walk.
    open: HashSet<&'a str>,
}

impl<'a> Walker<'a> {
    fn set(&mut self, set: &'a SelectionSet) -> Result<Shape, Refusal> {
        let mut total = Shape::default();
        for item in &set.items {
            let shape = match &item.node {
                Selection::Field(field) => self
                    .set(&field.node.selection_set.node)?
                    .under(field.node.name.node.as_str()),
                Selection::InlineFragment(inline) => self.set(&inline.node.selection_set.node)?,
                Selection::FragmentSpread(spread) => {
                    self.fragment(spread.node.fragment_name.node.as_str())?
                }
            };
            total = total.max(shape.check(self.bounds)?);
        }
        Ok(total)
    }

    fn fragment(&mut self, name: &'a str) -> Result<Shape, Refusal> {
        if let Some(shape) = self.done.get(name) {
            return Ok(*shape);
        }
        let Some((key, fragment)) = self.doc.fragments.get_key_value(name) else {
            return Ok(Shape::default());
        };
        let key = key.as_str();
        if !self.open.insert(key) {
            return Ok(Shape::default());
        }
        let shape = self.set(&fragment.node.selection_set.node)?;
        self.open.remove(key);
        self.done.insert(key, shape);
        Ok(shape)
    }
}

/// Checks every operation and fragment of `doc` against the shape rules above. Runs after
/// the cost check, which bounds the walk's recursion and refuses fragment cycles.
pub fn check(doc: &ExecutableDocument, bounds: Bounds) -> Result<(), Refusal> {
    let mut walker = Walker {
        doc,
        bounds,
        done: HashMap::new(),
        open: HashSet::new(),
    };
    for name in doc.fragments.keys() {
        walker.fragment(name.as_str())?;
    }
    let operations: Vec<_> = match &doc.operations {
        DocumentOperations::Single(op) => vec![op],
        DocumentOperations::Multiple(ops) => ops.values().collect(),
    };
    for op in operations {
        walker.set(&op.node.selection_set.node)?;
    }
    Ok(())
}

/// The most `ofType` steps any type reference of the schema takes to reach its named type
/// (`[Transfer!]!` takes 3), over fields, arguments and input fields.
pub fn deepest_wrapping(sdl: &str) -> usize {
    let Ok(doc) = async_graphql::parser::parse_schema(sdl) else {
        return 0;
    };
    type_definitions(&doc)
        .flat_map(|def| match &def.kind {
            TypeKind::Object(o) => o
                .fields
                .iter()
                .flat_map(|f| {
                    let args = f.node.arguments.iter().map(|a| wrapping(&a.node.ty.node));
                    args.chain([wrapping(&f.node.ty.node)]).collect::<Vec<_>>()
                })
                .collect::<Vec<_>>(),
            TypeKind::Interface(i) => i.fields.iter().map(|f| wrapping(&f.node.ty.node)).collect(),
            TypeKind::InputObject(i) => {
                i.fields.iter().map(|f| wrapping(&f.node.ty.node)).collect()
            }
            _ => Vec::new(),
        })
        .max()
        .unwrap_or(0)
}

fn type_definitions(doc: &ServiceDocument) -> impl Iterator<Item = &TypeDefinition> {
    doc.definitions.iter().filter_map(|d| match d {
        TypeSystemDefinition::Type(t) => Some(&t.node),
        _ => None,
    })
}

/// `ofType` steps from `ty` to its named type: one per non-null and one per list.
fn wrapping(ty: &Type) -> usize {
    usize::from(!ty.nullable)
        + match &ty.base {
            BaseType::Named(_) => 0,
            BaseType::List(inner) => 1 + wrapping(inner),
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_graphql::parser::parse_query;

    const BOUNDS: Bounds = Bounds {
        of_type_max: STANDARD_TYPE_REF_DEPTH,
    };

    fn doc(q: &str) -> ExecutableDocument {
        parse_query(q).expect("parses")
    }

    fn chain(levels: usize) -> String {
        format!(
            "{{ __type(name: \"Transfer\") {{ {}name{} }} }}",
            "ofType { ".repeat(levels),
            " }".repeat(levels)
        )
    }

    #[test]
    fn introspection_documents_are_told_from_data_and_mixed_ones() {
        assert!(is_introspection(&doc("{ __schema { types { name } } }")));
        assert!(is_introspection(&doc(
            "query A { ...R } fragment R on QueryRoot { __type(name: \"X\") { name } __typename }"
        )));
        assert!(!is_introspection(&doc(
            "{ __schema { types { name } } balances { asset } }"
        )));
        assert!(!is_introspection(&doc(
            "{ ...R } fragment R on QueryRoot { ... on QueryRoot { balances { asset } } }"
        )));
        assert!(!is_introspection(&doc(
            "query A { __schema { types { name } } } query B { balances { asset } }"
        )));
        assert!(!is_introspection(&doc("subscription { __typename }")));
        assert!(!is_introspection(&doc("{ ...Unknown }")));
    }

    #[test]
    fn of_type_chains_deeper_than_the_bound_are_refused() {
        assert_eq!(check(&doc(&chain(9)), BOUNDS), Ok(()));
        assert_eq!(
            check(&doc(&chain(10)), BOUNDS),
            Err(Refusal::OfTypeTooDeep(9))
        );
        // Through fragments too, each computed once.
        let q = "{ __type(name: \"X\") { ...A } } fragment A on __Type { ofType { ...B } } \
                 fragment B on __Type { ofType { ofType { ofType { ofType { ofType { ofType { \
                 ofType { ofType { ofType { name } } } } } } } } } }";
        assert_eq!(check(&doc(q), BOUNDS), Err(Refusal::OfTypeTooDeep(9)));
    }

    #[test]
    fn lists_of_one_kind_nested_in_each_other_are_refused() {
        let ok = "{ __schema { types { fields { args { type { name } } } } directives { args { name } } } }";
        assert_eq!(check(&doc(ok), BOUNDS), Ok(()));
        let nested = "{ __schema { types { fields { type { fields { name } } } } } }";
        assert_eq!(check(&doc(nested), BOUNDS), Err(Refusal::ListsNested));
        let hidden = "{ __type(name: \"X\") { fields { type { ...M } } } } \
                      fragment M on __Type { interfaces { name } }";
        assert_eq!(check(&doc(hidden), BOUNDS), Err(Refusal::ListsNested));
    }

    #[test]
    fn wrapping_is_counted_in_of_type_steps() {
        let sdl = "type Q { a: Int b: [Int!]! c(x: [[Int!]]): Int } input I { d: [[Int!]!]! }";
        assert_eq!(deepest_wrapping(sdl), 5);
        assert_eq!(
            Bounds::of_sdl(sdl).of_type_max,
            STANDARD_TYPE_REF_DEPTH,
            "never below the standard queries"
        );
    }
}
