//! Receipts (issue 36): every transfer answer (`POST /api/v1/internal_transfer`, each item of
//! `POST /api/v1/internal_transfers`, `GET /api/v1/internal_transfer/{req_id}`) and every GraphQL
//! transfer carries its events' feed positions, which are exactly those the event table holds
//! for it; the user keeps them and later proves each against a newer signed checkpoint, with
//! the log routes and the test's own RFC 6962 verifier. The `cell` parameter names the log: cell 1
//! without a map, any other is not here.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use reqwest::Method;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::helpers::ApiStack;
use crate::tlog::follow;

/// The feed positions the event table holds for `req_id`, in sequence order.
async fn stored_positions(api: &ApiStack, req_id: &str) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT feed_position FROM events
         WHERE aggregate_type = 'Transfer' AND aggregate_id = $1 ORDER BY sequence",
    )
    .bind(req_id)
    .fetch_all(&api.stack.db.pool)
    .await
    .unwrap()
}

fn positions(value: &Value) -> Vec<i64> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("positions: {value}"))
        .iter()
        .map(|p| p.as_i64().unwrap())
        .collect()
}

fn sha(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

/// RFC 9162 2.1.3.2: the root an inclusion proof of leaf `index` in a tree of `size` leads to.
fn root_from_proof(index: u64, size: u64, leaf: [u8; 32], proof: &[[u8; 32]]) -> Option<[u8; 32]> {
    if index >= size {
        return None;
    }
    let (mut fn_, mut sn, mut r) = (index, size - 1, leaf);
    for p in proof {
        if sn == 0 {
            return None;
        }
        if fn_ & 1 == 1 || fn_ == sn {
            r = sha(&[&[1], p, &r]);
            while fn_ & 1 == 0 && fn_ != 0 {
                fn_ >>= 1;
                sn >>= 1;
            }
        } else {
            r = sha(&[&[1], &r, p]);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    (sn == 0).then_some(r)
}

#[tokio::test]
async fn tlog_every_transfer_answer_carries_its_receipt_which_proves_inclusion_later() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let user = api.token(1, false);
    let body = json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "1"});

    let (status, single) = api
        .call(
            Method::POST,
            "/api/v1/internal_transfer",
            Some(&user),
            Some(body.clone()),
        )
        .await;
    assert_eq!(status, 200, "{single}");
    let req_id = single["req_id"].as_str().unwrap().to_owned();
    let receipt = positions(&single["log_positions"]);
    assert_eq!(receipt, stored_positions(&api, &req_id).await);
    assert!(!receipt.is_empty() && single.get("log_cell").is_none());

    let (status, bulk) = api
        .call(
            Method::POST,
            "/api/v1/internal_transfers",
            Some(&user),
            Some(json!({"transfers": [body.clone(), body.clone()]})),
        )
        .await;
    assert_eq!(status, 200, "{bulk}");
    for item in bulk["results"].as_array().unwrap() {
        let id = item["req_id"].as_str().unwrap();
        assert_eq!(
            positions(&item["log_positions"]),
            stored_positions(&api, id).await
        );
    }

    let (status, got) = api
        .call(
            Method::GET,
            &format!("/api/v1/internal_transfer/{req_id}"),
            Some(&user),
            None,
        )
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(positions(&got["log_positions"]), receipt);

    let query = json!({
        "query": "query($id: String!) { transfer(reqId: $id) { reqId logPositions logCell } }",
        "variables": {"id": req_id},
    });
    let gql: Value = api
        .http
        .post(format!("{}/graphql", api.base))
        .bearer_auth(&user)
        .json(&query)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        positions(&gql["data"]["transfer"]["logPositions"]),
        receipt,
        "{gql}"
    );
    assert_eq!(gql["data"]["transfer"]["logCell"], Value::Null);

    // Later, against a newer checkpoint: each position of the receipt is in the log.
    let size = follow(&api.stack.db.pool).await;
    let (status, note) = api
        .call(
            Method::GET,
            "/api/v1/log/checkpoint?cell=1",
            Some(&user),
            None,
        )
        .await;
    assert_eq!(status, 200, "{note}");
    let note = note.as_str().unwrap().to_owned();
    let mut lines = note.lines().skip(1);
    assert_eq!(lines.next().unwrap().parse::<u64>().unwrap(), size);
    let root: [u8; 32] = STANDARD
        .decode(lines.next().unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    for p in &receipt {
        let entry = api
            .http
            .get(format!("{}/api/v1/log/entries/{p}", api.base))
            .bearer_auth(&user)
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let leaf = sha(&[&[0], &entry]);
        let path = format!("/api/v1/log/proof/inclusion?position={p}&size={size}&cell=1");
        let (status, proof) = api.call(Method::GET, &path, Some(&user), None).await;
        assert_eq!(status, 200, "{proof}");
        let hashes: Vec<[u8; 32]> = proof["hashes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                STANDARD
                    .decode(h.as_str().unwrap())
                    .unwrap()
                    .try_into()
                    .unwrap()
            })
            .collect();
        let index = *p as u64 - 1;
        assert_eq!(
            root_from_proof(index, size, leaf, &hashes),
            Some(root),
            "{p}"
        );
        let mut flipped = hashes.clone();
        if let Some(h) = flipped.first_mut() {
            h[5] ^= 4;
            assert_ne!(root_from_proof(index, size, leaf, &flipped), Some(root));
        }
    }

    // Without a cell map the one log is cell 1; any other cell is not here; a bad one is refused.
    let (status, body) = api
        .call(
            Method::GET,
            "/api/v1/log/checkpoint?cell=2",
            Some(&user),
            None,
        )
        .await;
    assert_eq!((status, body["code"].clone()), (404, json!("NOT_FOUND")));
    let (status, body) = api
        .call(Method::GET, "/api/v1/log/key?cell=0", Some(&user), None)
        .await;
    assert_eq!((status, body["code"].clone()), (400, json!("BAD_REQUEST")));
}

/// Single answers sent at the same moment have their positions read together (one statement for
/// all that wait, `edge::receipts`): each answer still carries exactly its own transfer's
/// positions, never a neighbour's, and a GET of each gives the same receipt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tlog_concurrent_single_answers_each_carry_their_own_receipt() {
    let api = ApiStack::start().await;
    let users: Vec<u64> = (1..=24).collect();
    for user in &users {
        api.stack.deposit(*user, "USDT", "100").await;
    }
    let calls = users.iter().map(|user| {
        let (api, token) = (&api, api.token(*user, false));
        let body = json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT",
                          "amount": format!("{user}")});
        async move {
            api.call(
                Method::POST,
                "/api/v1/internal_transfer",
                Some(&token),
                Some(body),
            )
            .await
        }
    });
    let answers = futures_util::future::join_all(calls).await;
    let mut seen = std::collections::BTreeSet::new();
    for (user, (status, answer)) in users.iter().zip(answers) {
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["amount"], format!("{user}"), "{answer}");
        let req_id = answer["req_id"].as_str().unwrap().to_owned();
        let receipt = positions(&answer["log_positions"]);
        assert_eq!(receipt, stored_positions(&api, &req_id).await, "{answer}");
        assert!(
            receipt.iter().all(|p| seen.insert(*p)),
            "shared: {receipt:?}"
        );
        let (status, got) = api
            .call(
                Method::GET,
                &format!("/api/v1/internal_transfer/{req_id}"),
                Some(&api.token(*user, false)),
                None,
            )
            .await;
        assert_eq!(status, 200, "{got}");
        assert_eq!(positions(&got["log_positions"]), receipt);
    }
}

/// Lookups of one transfer at the same moment (several GETs of it, read together) each carry its
/// whole receipt: none is left without it because another lookup in the same read took it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tlog_concurrent_lookups_of_one_transfer_each_carry_its_receipt() {
    let api = ApiStack::start().await;
    api.stack.deposit(1, "USDT", "100").await;
    let token = api.token(1, false);
    let body = json!({"from": "FUNDING", "to": "SPOT", "asset": "USDT", "amount": "5"});
    let (status, created) = api
        .call(
            Method::POST,
            "/api/v1/internal_transfer",
            Some(&token),
            Some(body),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    let req_id = created["req_id"].as_str().unwrap().to_owned();
    let stored = stored_positions(&api, &req_id).await;
    let path = format!("/api/v1/internal_transfer/{req_id}");
    let gets = (0..16).map(|_| api.call(Method::GET, &path, Some(&token), None));
    for (status, got) in futures_util::future::join_all(gets).await {
        assert_eq!(status, 200, "{got}");
        assert_eq!(positions(&got["log_positions"]), stored, "{got}");
    }
}
