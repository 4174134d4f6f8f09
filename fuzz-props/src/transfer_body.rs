//! A transfer request body through the route's own steps: `routes::json_object` (the body
//! extractor), `routes::transfer_request` (authorization and shape) and
//! `TransferRequest::parse` (the values, against the shipped assets), which is what
//! `POST /internal_transfer` runs before any gate. Properties: `routes::parse_transfer` agrees
//! with the steps; a refusal is one of the route's own kinds, and a body naming another user is
//! FORBIDDEN before anything else; an accepted body names only known fields, is the caller's,
//! and becomes exactly the transfer its fields say (supported and different account types, a
//! known transferable asset, the amount's canonical value within the asset's bounds, the cid as
//! sent); and that transfer written back as a canonical body parses to itself.

use std::sync::OnceLock;

use application::{NewTransfer, TransferRequest};
use command_api::body::json_object;
use command_api::routes::{parse_transfer, transfer_request};
use domain::{Amount, AssetRegistry, ErrorCode, UserId};
use edge::error::ApiError;
use serde_json::{json, Map, Value};

/// The authenticated caller of every fuzzed body.
pub const CALLER: u64 = 7;

const FIELDS: [&str; 6] = ["user_id", "from", "to", "asset", "amount", "cid"];

fn assets() -> &'static AssetRegistry {
    static ASSETS: OnceLock<AssetRegistry> = OnceLock::new();
    ASSETS.get_or_init(AssetRegistry::default_assets)
}

fn caller() -> UserId {
    UserId::new(CALLER).expect("a valid user id")
}

/// The route's steps, in its order.
fn route(body: Map<String, Value>) -> Result<NewTransfer, ApiError> {
    let request: TransferRequest = transfer_request(body, caller())?;
    request.parse(assets()).map_err(ApiError::Refused)
}

pub fn check(data: &[u8]) {
    let body = match json_object(data) {
        Ok(body) => body,
        Err(e) => {
            assert!(matches!(e, ApiError::BadRequest(_)), "{e:?}");
            return;
        }
    };
    let result = route(body.clone());
    assert_eq!(
        parse_transfer(body.clone(), caller(), assets()),
        result,
        "parse_transfer agrees with the route's steps"
    );
    match result {
        Ok(transfer) => accepted(&body, &transfer),
        Err(e) => refused(&body, &e),
    }
}

fn refused(body: &Map<String, Value>, e: &ApiError) {
    let other_user = body
        .get("user_id")
        .is_some_and(|v| !v.is_null() && *v != json!(CALLER) && *v != json!("7"));
    if other_user {
        assert_eq!(*e, ApiError::Forbidden, "another user's body: {body:?}");
        return;
    }
    match e {
        ApiError::BadRequest(_) => {}
        ApiError::Refused(code) => assert!(
            matches!(
                code,
                ErrorCode::InvalidAccountType
                    | ErrorCode::SameAccount
                    | ErrorCode::UnsupportedAccountType
                    | ErrorCode::InvalidAsset
                    | ErrorCode::AssetSuspended
                    | ErrorCode::TransferNotAllowed
                    | ErrorCode::InvalidAmount
                    | ErrorCode::PrecisionOverflow
                    | ErrorCode::Overflow
                    | ErrorCode::AmountTooSmall
                    | ErrorCode::AmountTooLarge
            ),
            "unexpected refusal {code:?} for {body:?}"
        ),
        other => panic!("unexpected error {other:?} for {body:?}"),
    }
}

fn accepted(body: &Map<String, Value>, t: &NewTransfer) {
    assert!(
        body.keys().all(|k| FIELDS.contains(&k.as_str())),
        "{body:?}"
    );
    assert_eq!(t.user_id, caller());
    let text = |name: &str| body.get(name).and_then(Value::as_str);
    assert_eq!(text("from"), Some(t.from.as_str()));
    assert_eq!(text("to"), Some(t.to.as_str()));
    assert_eq!(text("asset"), Some(t.asset.as_str()));
    assert_eq!(t.cid.as_deref(), text("cid"));
    assert!(t.from != t.to && t.from.is_supported() && t.to.is_supported());
    let sent = text("amount").expect("an accepted amount arrived as text");
    assert_eq!(Amount::parse(sent), Ok(t.amount));
    let config = assets().get(t.asset.as_str()).expect("a known asset");
    assert_eq!(config.check_transferable(), Ok(()));
    assert_eq!(config.check_amount(t.amount), Ok(()));
    let mut canonical = json!({
        "from": t.from.as_str(), "to": t.to.as_str(), "asset": t.asset.as_str(),
        "amount": t.amount.to_string(), "user_id": CALLER,
    });
    if let Some(cid) = &t.cid {
        canonical["cid"] = json!(cid);
    }
    let bytes = serde_json::to_vec(&canonical).expect("serializes");
    let again = json_object(&bytes).and_then(route);
    assert_eq!(
        again.as_ref(),
        Ok(t),
        "the canonical body parses to the same transfer"
    );
}
