//! GraphQL clients can read the schema: graphql-core (a client that is not ours, installed at a
//! pinned version by `scripts/ensure-graphql-core`) sends its standard introspection query as a
//! user and as an admin, builds a client schema, checks it against the SDL served at
//! `GET /graphql/schema.graphql`, and validates the README's example queries against it
//! (`tests/graphql/introspect.py`). Introspection abuse past the schema's own shape is still
//! refused (contract §3, GraphQL).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::helpers::ApiStack;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// Runs the graphql-core client against `base` with `token`; returns its output.
async fn graphql_core_reads_the_schema(base: &str, token: &str) -> String {
    let root = repo_root();
    let mut client = tokio::process::Command::new("python3");
    client.arg(root.join("tests/graphql/introspect.py")).args([
        base,
        token,
        root.join("README.md").to_str().expect("a UTF-8 path"),
    ]);
    let out = client.output().await.expect("run python3");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "graphql-core's client failed:\n{text}"
    );
    text
}

#[tokio::test]
async fn graphql_core_introspects_the_schema_and_validates_the_readme_examples() {
    let status = std::process::Command::new(repo_root().join("scripts/ensure-graphql-core"))
        .status()
        .expect("run scripts/ensure-graphql-core");
    assert!(status.success(), "scripts/ensure-graphql-core failed");
    let api = ApiStack::start().await;
    for (who, token) in [
        ("user", api.token(31, false)),
        ("admin", api.token(1, true)),
    ] {
        let out = graphql_core_reads_the_schema(&api.base, &token).await;
        assert!(out.contains("README examples validate"), "{who}: {out}");
        assert_eq!(
            out.matches("ok: introspection").count(),
            2,
            "{who}: both option sets answered: {out}"
        );
    }
    // The SDL needs no token and names the query root's fields.
    let sdl = api
        .http
        .get(format!("{}/graphql/schema.graphql", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(sdl.status(), 200);
    let sdl = sdl.text().await.unwrap();
    assert!(
        sdl.contains("transfers(") && sdl.contains("stateCounts"),
        "{sdl}"
    );
}

async fn gql(api: &ApiStack, token: &str, query: &str) -> Value {
    api.http
        .post(format!("{}/graphql", api.base))
        .bearer_auth(token)
        .json(&json!({ "query": query }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn introspection_past_the_schemas_own_shape_is_still_refused() {
    let api = ApiStack::start().await;
    let user = api.token(32, false);
    let chain = |levels: usize| {
        format!(
            "{{ __type(name: \"TransferConnection\") {{ fields {{ type {{ {}name{} }} }} }} }}",
            "ofType { ".repeat(levels),
            " }".repeat(levels)
        )
    };
    // As deep as the standard queries ask: answered.
    let body = gql(&api, &user, &chain(9)).await;
    assert!(body["errors"].is_null(), "{body}");
    assert!(body["data"]["__type"]["fields"].is_array(), "{body}");
    // One level past it, deeper than any type of the schema: refused before validation.
    let body = gql(&api, &user, &chain(10)).await;
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "BAD_REQUEST",
        "{body}"
    );
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("ofType"),
        "{body}"
    );
    // A type's members nested in another's multiply the answer by the schema's size: refused.
    let nested =
        "{ __schema { types { fields { type { fields { type { fields { name } } } } } } } }";
    let body = gql(&api, &user, nested).await;
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "BAD_REQUEST",
        "{body}"
    );
    // Aliases of the whole schema still meet the root-field cap.
    let many: String = (0..11)
        .map(|i| format!("s{i}: __schema {{ types {{ name }} }} "))
        .collect();
    let body = gql(&api, &user, &format!("{{ {many} }}")).await;
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "BAD_REQUEST",
        "{body}"
    );
    // Data beside introspection: the data limits hold for the whole document.
    let mixed = "{ stateCounts { state } __schema { types { fields { type { ofType { ofType { ofType { ofType { name } } } } } } } } }";
    let body = gql(&api, &user, mixed).await;
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("nested"),
        "{body}"
    );
}
