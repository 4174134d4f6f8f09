//! The limits every GraphQL request meets, HTTP and websocket alike, as one async-graphql
//! extension: before validation, the cost check (`cost.rs`) and introspection's shape rules
//! (`introspection.rs`) on the parsed document, linear in it; after validation, the data
//! limits ([`QUERY_DEPTH_MAX`], [`QUERY_COMPLEXITY_MAX`]) on the depth and complexity
//! async-graphql computed, except for an introspection document, which the schema's size
//! bounds instead. Also `GET /graphql/schema.graphql`, the schema's SDL.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextPrepareRequest, NextValidation,
};
use async_graphql::{
    ErrorExtensionValues, ObjectType, Schema, ServerError, ServerResult, SubscriptionType,
    ValidationResult,
};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use domain::ErrorCode;

use super::cost;
use super::introspection::{self, Bounds};

/// Deepest data query accepted (in fields).
pub(crate) const QUERY_DEPTH_MAX: usize = 8;
/// Most complex data query accepted (a field counts 1; a page counts its size times its fields).
pub(crate) const QUERY_COMPLEXITY_MAX: usize = 2_000;

/// Makes one [`Guard`] per request.
pub(crate) struct Limits {
    pub(crate) bounds: Bounds,
}

impl ExtensionFactory for Limits {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(Guard {
            bounds: self.bounds,
            introspection: AtomicBool::new(false),
        })
    }
}

/// One request's guard: remembers whether its document is an introspection document between
/// the two steps.
struct Guard {
    bounds: Bounds,
    introspection: AtomicBool,
}

fn bad_request(message: String) -> ServerError {
    let mut error = ServerError::new(message, None);
    let mut extensions = ErrorExtensionValues::default();
    extensions.set("code", ErrorCode::BadRequest.as_str());
    error.extensions = Some(extensions);
    error
}

#[async_graphql::async_trait::async_trait]
impl Extension for Guard {
    /// Runs before async-graphql's own checks and validation, whose walks expand every fragment
    /// spread. An introspection document runs with introspection only, so a data field in it,
    /// were one to get past [`introspection::is_introspection`], answers `null` unread.
    async fn prepare_request(
        &self,
        ctx: &ExtensionContext<'_>,
        mut request: async_graphql::Request,
        next: NextPrepareRequest<'_>,
    ) -> ServerResult<async_graphql::Request> {
        // Parsed once here; async-graphql reuses the parse.
        let document = request.parsed_query()?;
        let introspective = introspection::is_introspection(document);
        if introspective {
            cost::check_within(document, self.bounds.nesting_max()).map_err(|refusal| {
                bad_request(match refusal {
                    cost::Refusal::TooDeep => format!(
                        "the introspection query nests deeper than {} levels",
                        self.bounds.nesting_max()
                    ),
                    other => other.message(),
                })
            })?;
        } else {
            cost::check(document).map_err(|refusal| bad_request(refusal.message()))?;
        }
        introspection::check(document, self.bounds)
            .map_err(|refusal| bad_request(refusal.message()))?;
        self.introspection.store(introspective, Ordering::Relaxed);
        if introspective {
            request = request.only_introspection();
        }
        next.run(ctx, request).await
    }

    /// The data limits, with async-graphql's own messages.
    async fn validation(
        &self,
        ctx: &ExtensionContext<'_>,
        next: NextValidation<'_>,
    ) -> Result<ValidationResult, Vec<ServerError>> {
        let result = next.run(ctx).await?;
        if self.introspection.load(Ordering::Relaxed) {
            return Ok(result);
        }
        if result.complexity > QUERY_COMPLEXITY_MAX {
            return Err(vec![ServerError::new("Query is too complex.", None)]);
        }
        if result.depth > QUERY_DEPTH_MAX {
            return Err(vec![ServerError::new("Query is nested too deep.", None)]);
        }
        Ok(result)
    }
}

/// `GET /graphql/schema.graphql`: the schema in SDL, for clients and code generators that read
/// a file rather than introspect. Needs no token, like the OpenAPI document.
pub(crate) async fn schema_sdl<Q, M, S>(
    axum::Extension(schema): axum::Extension<Schema<Q, M, S>>,
) -> Response
where
    Q: ObjectType + 'static,
    M: ObjectType + 'static,
    S: SubscriptionType + 'static,
{
    ([(CONTENT_TYPE, "text/plain; charset=utf-8")], schema.sdl()).into_response()
}

#[cfg(test)]
mod tests {
    use super::introspection::{COUNTED_NAMES, STANDARD_TYPE_REF_DEPTH};

    /// A full introspection query of the standard clients' shape, its `ofType` chain
    /// `levels` deep.
    fn standard_query(levels: usize) -> String {
        let type_ref = format!(
            "kind name {}{}",
            "ofType { kind name ".repeat(levels),
            "}".repeat(levels)
        );
        format!(
            "query IntrospectionQuery {{ __schema {{ description queryType {{ name }} \
             mutationType {{ name }} subscriptionType {{ name }} types {{ ...FullType }} \
             directives {{ name description isRepeatable locations \
             args(includeDeprecated: true) {{ ...InputValue }} }} }} }}
             fragment FullType on __Type {{ kind name description specifiedByURL isOneOf \
             fields(includeDeprecated: true) {{ name description \
             args(includeDeprecated: true) {{ ...InputValue }} type {{ ...TypeRef }} \
             isDeprecated deprecationReason }} \
             inputFields(includeDeprecated: true) {{ ...InputValue }} \
             interfaces {{ ...TypeRef }} \
             enumValues(includeDeprecated: true) {{ name description isDeprecated \
             deprecationReason }} possibleTypes {{ ...TypeRef }} }}
             fragment InputValue on __InputValue {{ name description type {{ ...TypeRef }} \
             defaultValue isDeprecated deprecationReason }}
             fragment TypeRef on __Type {{ {type_ref} }}"
        )
    }

    async fn run(query: &str) -> async_graphql::Response {
        super::super::schema()
            .execute(async_graphql::Request::new(query))
            .await
    }

    #[tokio::test]
    async fn the_standard_introspection_query_is_answered_whole() {
        let response = run(&standard_query(STANDARD_TYPE_REF_DEPTH)).await;
        assert!(response.errors.is_empty(), "{:?}", response.errors);
        let data = response.data.into_json().expect("json");
        let types = data["__schema"]["types"].as_array().expect("types");
        assert!(types.iter().any(|t| t["name"] == "Transfer"), "{data}");
        assert_eq!(data["__schema"]["queryType"]["name"], "QueryRoot");
    }

    #[tokio::test]
    async fn deeper_of_type_chains_and_mixed_documents_are_refused() {
        let response = run(&standard_query(STANDARD_TYPE_REF_DEPTH + 1)).await;
        assert!(
            response.errors[0].message.contains("ofType"),
            "{:?}",
            response.errors
        );
        // Mixed with data, introspection counts toward the data limits: 9 levels > 8.
        let mixed = "{ stateCounts { state } __type(name: \"Transfer\") { fields { type { \
                     ofType { ofType { ofType { ofType { ofType { name } } } } } } } } }";
        let response = run(mixed).await;
        assert_eq!(response.errors[0].message, "Query is nested too deep.");
        // A small lookup alone is an introspection document.
        let small = "{ __type(name: \"Transfer\") { fields { name } } }";
        assert!(run(small).await.errors.is_empty());
    }

    /// The names introspection's shape rules count are the introspection types' alone.
    #[test]
    fn no_data_type_uses_a_counted_introspection_name() {
        let sdl = super::super::schema().sdl();
        let doc = async_graphql::parser::parse_schema(&sdl).expect("the SDL parses");
        for def in &doc.definitions {
            let async_graphql::parser::types::TypeSystemDefinition::Type(t) = def else {
                continue;
            };
            let names: Vec<String> = match &t.node.kind {
                async_graphql::parser::types::TypeKind::Object(o) => o
                    .fields
                    .iter()
                    .map(|f| f.node.name.node.to_string())
                    .collect(),
                async_graphql::parser::types::TypeKind::InputObject(i) => i
                    .fields
                    .iter()
                    .map(|f| f.node.name.node.to_string())
                    .collect(),
                _ => Vec::new(),
            };
            if t.node.name.node.starts_with("__") {
                continue;
            }
            for name in names {
                assert!(
                    !COUNTED_NAMES.contains(&name.as_str()),
                    "{}.{name} shares a name with an introspection list",
                    t.node.name.node
                );
            }
        }
    }
}
