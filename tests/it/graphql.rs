//! GraphQL: history with filters and cursor pagination, one transfer with its events, balances;
//! a user never reads another user's data; depth and complexity limits; errors carry the
//! contract's code in `extensions.code`; GraphiQL is served.

use domain::AccountType::{Funding, Spot};
use serde_json::{json, Value};

use crate::helpers::ApiStack;

async fn gql(api: &ApiStack, token: Option<&str>, query: &str, variables: Value) -> (u16, Value) {
    let mut req = api
        .http
        .post(format!("{}/graphql", api.base))
        .json(&json!({"query": query, "variables": variables}));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

const PAGE: &str = r#"query($first: Int, $after: String, $filter: TransferFilter) {
  transfers(first: $first, after: $after, filter: $filter) {
    nodes { reqId userId from to asset amount state }
    pageInfo { hasNextPage endCursor }
  }
}"#;

#[tokio::test]
async fn graphql_history_pages_with_filters_and_never_crosses_users() {
    let api = ApiStack::start().await;
    let alice = api.token(11, false);
    let bob = api.token(12, false);
    let admin = api.token(1, true);
    api.stack.deposit(11, "USDT", "100").await;
    api.stack.deposit(12, "USDT", "100").await;
    let mut alice_ids = Vec::new();
    for amount in ["1", "2", "3", "4", "5"] {
        alice_ids.push(
            api.stack
                .transfer(11, Funding, Spot, "USDT", amount)
                .await
                .req_id
                .to_string(),
        );
    }
    api.stack.transfer(11, Spot, Funding, "USDT", "1").await;
    api.stack.transfer(11, Funding, Spot, "USDT", "1000").await; // FAILED
    let bobs = api
        .stack
        .transfer(12, Funding, Spot, "USDT", "7")
        .await
        .req_id
        .to_string();

    // Pages of 2, newest first, only Alice's FUNDING→SPOT committed transfers.
    let filter = json!({"state": "COMMITTED", "direction": "FUNDING_TO_SPOT"});
    let mut after: Option<String> = None;
    let mut seen = Vec::new();
    for _ in 0..10 {
        let (status, body) = gql(
            &api,
            Some(&alice),
            PAGE,
            json!({"first": 2, "after": after, "filter": filter}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert!(body.get("errors").is_none(), "{body}");
        let page = &body["data"]["transfers"];
        for node in page["nodes"].as_array().unwrap() {
            assert_eq!(node["userId"], 11);
            assert_eq!(node["state"], "COMMITTED");
            assert_eq!(node["from"], "FUNDING");
            seen.push(node["reqId"].as_str().unwrap().to_owned());
        }
        if !page["pageInfo"]["hasNextPage"].as_bool().unwrap() {
            break;
        }
        after = page["pageInfo"]["endCursor"].as_str().map(str::to_owned);
    }
    alice_ids.reverse();
    assert_eq!(
        seen, alice_ids,
        "every page in order, nothing twice, nothing missing"
    );

    // Alice asking for Bob's transfer gets nothing; asking for Bob's history is refused.
    let one = r#"query($id: String!) { transfer(reqId: $id) { reqId state events { sequence eventType state } } }"#;
    let (_, body) = gql(&api, Some(&alice), one, json!({"id": bobs})).await;
    assert_eq!(body["data"]["transfer"], Value::Null, "{body}");
    let (_, body) = gql(&api, Some(&alice), PAGE, json!({"filter": {"userId": 12}})).await;
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "FORBIDDEN",
        "{body}"
    );
    let (_, body) = gql(
        &api,
        Some(&alice),
        "{ balances(userId: 12) { asset } }",
        json!({}),
    )
    .await;
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "FORBIDDEN",
        "{body}"
    );

    // Bob sees his own, with its events; an admin sees anyone's.
    let (_, body) = gql(&api, Some(&bob), one, json!({"id": bobs})).await;
    let events = body["data"]["transfer"]["events"].as_array().unwrap();
    assert_eq!(events.len(), 5, "{body}");
    assert_eq!(events[4]["eventType"], "TransferCommitted");
    assert_eq!(events[4]["state"], "COMMITTED");
    let (_, body) = gql(&api, Some(&admin), one, json!({"id": bobs})).await;
    assert_eq!(body["data"]["transfer"]["reqId"], bobs);
    let (_, body) = gql(&api, Some(&admin), PAGE, json!({"first": 100})).await;
    assert_eq!(
        body["data"]["transfers"]["nodes"].as_array().unwrap().len(),
        8
    );
    let (_, body) = gql(
        &api,
        Some(&admin),
        "{ stateCounts { state count } }",
        json!({}),
    )
    .await;
    assert!(
        body["data"]["stateCounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["state"] == "FAILED" && c["count"] == 1),
        "{body}"
    );
    let (_, body) = gql(
        &api,
        Some(&alice),
        "{ stateCounts { state count } }",
        json!({}),
    )
    .await;
    assert_eq!(body["errors"][0]["extensions"]["code"], "FORBIDDEN");

    // Balances: strings, never floats.
    let (_, body) = gql(
        &api,
        Some(&alice),
        "{ balances { asset funding spot inFlight } }",
        json!({}),
    )
    .await;
    let usdt = &body["data"]["balances"][0];
    assert_eq!(
        (
            usdt["asset"].as_str(),
            usdt["funding"].as_str(),
            usdt["spot"].as_str(),
            usdt["inFlight"].as_str()
        ),
        (Some("USDT"), Some("86"), Some("14"), Some("0")),
        "{body}"
    );
}

#[tokio::test]
async fn graphql_refuses_anonymous_callers_deep_and_costly_queries_with_codes() {
    let api = ApiStack::start().await;
    let user = api.token(5, false);
    let (status, body) = gql(&api, None, "{ balances { asset } }", json!({})).await;
    assert_eq!(status, 401);
    assert_eq!(body["errors"][0]["extensions"]["code"], "UNAUTHORIZED");
    let (status, _) = gql(
        &api,
        Some("not-a-token"),
        "{ balances { asset } }",
        json!({}),
    )
    .await;
    assert_eq!(status, 401);

    // Page size bounds.
    let (_, body) = gql(&api, Some(&user), PAGE, json!({"first": 101})).await;
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "BAD_REQUEST",
        "{body}"
    );
    let (_, body) = gql(&api, Some(&user), PAGE, json!({"after": "garbage"})).await;
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "BAD_REQUEST",
        "{body}"
    );

    // Too costly: 100 transfers × their events × fields.
    let costly = "{ transfers(first: 100) { nodes { reqId events { sequence eventType state occurredAt globalPosition eventVersion } } } }";
    let (_, body) = gql(&api, Some(&user), costly, json!({})).await;
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("complex"),
        "{body}"
    );
    assert_eq!(body["errors"][0]["extensions"]["code"], "BAD_REQUEST");
    // Too deep: introspection beside data counts toward the depth limit (introspection alone
    // is bounded by the schema's size instead: graphql_introspection.rs).
    let deep = "{ balances { asset } __schema { types { fields { type { ofType { ofType { ofType { ofType { name } } } } } } } } }";
    let (_, body) = gql(&api, Some(&user), deep, json!({})).await;
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("nested"),
        "{body}"
    );
    assert_eq!(body["errors"][0]["extensions"]["code"], "BAD_REQUEST");

    // GraphiQL for people.
    let page = api
        .http
        .get(format!("{}/graphql", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert!(page
        .text()
        .await
        .unwrap()
        .to_lowercase()
        .contains("graphiql"));
}

#[tokio::test]
async fn graphql_subscription_streams_the_callers_state_changes_over_websocket() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;

    let api = ApiStack::start().await;
    api.stack.deposit(21, "USDT", "10").await;
    api.stack.deposit(22, "USDT", "10").await;
    let url = format!("{}/graphql/ws", api.base.replace("http://", "ws://"));
    let mut request = url.into_client_request().unwrap();
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let token = api.token(21, false);
    ws.send(Message::text(
        json!({"type": "connection_init", "payload": {"token": token}}).to_string(),
    ))
    .await
    .unwrap();
    let deadline = std::time::Duration::from_secs(20);
    let ack = tokio::time::timeout(deadline, ws.next())
        .await
        .expect("an answer in time")
        .unwrap()
        .unwrap();
    let ack: Value = serde_json::from_str(ack.to_text().unwrap()).unwrap();
    assert_eq!(ack["type"], "connection_ack");
    // Money moves for another user and for the caller; the subscription asks from position 0, so
    // it cannot miss anything whenever it starts.
    api.stack.transfer(22, Funding, Spot, "USDT", "1").await;
    let mine = api.stack.transfer(21, Funding, Spot, "USDT", "2").await;
    ws.send(Message::text(
        json!({"id": "1", "type": "subscribe",
               "payload": {"query": "subscription { transferUpdates(after: 0) { reqId userId state eventType position } }"}})
        .to_string(),
    ))
    .await
    .unwrap();
    let mut states = Vec::new();
    while states.last().map(String::as_str) != Some("COMMITTED") {
        let msg = tokio::time::timeout(deadline, ws.next())
            .await
            .expect("an update in time")
            .unwrap()
            .unwrap();
        let Message::Text(text) = msg else { continue };
        let v: Value = serde_json::from_str(&text).unwrap();
        if v["type"] != "next" {
            continue;
        }
        let update = &v["payload"]["data"]["transferUpdates"];
        assert_eq!(
            update["userId"], 21,
            "only the caller's transfers: {update}"
        );
        assert_eq!(update["reqId"], mine.req_id.to_string());
        states.push(update["state"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        states,
        [
            "INIT",
            "SOURCE_PENDING",
            "SOURCE_DONE",
            "TARGET_PENDING",
            "COMMITTED"
        ]
    );
}
