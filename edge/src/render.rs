//! How REST and GraphQL render the same things, in one place: money as plain decimal text, times
//! as RFC 3339, and a user's balances merged per asset from FUNDING, SPOT and the in-flight sums.

use std::collections::BTreeMap;

use application::books::{FundingBalance, SpotBalance};
use chrono::{DateTime, SecondsFormat, Utc};
use rust_decimal::Decimal;

/// Money as plain decimal text, never a float, without trailing zeros.
pub fn money(value: Decimal) -> String {
    value.normalize().to_string()
}

/// A time as RFC 3339 with milliseconds, in UTC (`Z`).
pub fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// One asset's balances of one user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergedBalance {
    pub asset: String,
    pub funding: Decimal,
    pub spot: Decimal,
    pub in_flight: Decimal,
}

/// FUNDING, SPOT and in-flight amounts per asset, by asset name.
pub fn merge_balances(
    funding: Vec<FundingBalance>,
    spot: Vec<SpotBalance>,
    in_flight: Vec<(String, Decimal)>,
) -> Vec<MergedBalance> {
    let mut per_asset: BTreeMap<String, [Decimal; 3]> = BTreeMap::new();
    for row in funding {
        per_asset.entry(row.asset).or_default()[0] += row.balance;
    }
    for row in spot {
        per_asset.entry(row.asset).or_default()[1] += row.available;
    }
    for (asset, amount) in in_flight {
        per_asset.entry(asset).or_default()[2] += amount;
    }
    per_asset
        .into_iter()
        .map(|(asset, [funding, spot, in_flight])| MergedBalance {
            asset,
            funding,
            spot,
            in_flight,
        })
        .collect()
}

/// One user's FUNDING, SPOT and in-flight amounts per asset: the one read behind
/// `GET /api/v1/balances`, GraphQL's `balances` and the admin user view. If spot-core cannot
/// answer, the whole read fails (503): a missing SPOT balance must never read as zero.
pub async fn user_balances(
    state: &crate::state::AppState,
    user: domain::UserId,
) -> Result<Vec<MergedBalance>, crate::error::ApiError> {
    use crate::error::ApiError;
    let (funding, spot, in_flight) = tokio::join!(
        state.queries.funding_balances(user),
        state.queries.spot_balances(user),
        state.reads.transfers().in_flight(user.as_i64()),
    );
    let funding = funding.map_err(|e| ApiError::Internal(format!("funding balances: {e}")))?;
    let spot = spot.map_err(|e| ApiError::spot("balances", e))?;
    let in_flight = in_flight.map_err(|e| ApiError::Internal(format!("in-flight sums: {e}")))?;
    Ok(merge_balances(funding, spot, in_flight))
}

/// The feed positions of each transfer's events (its entries in the tamper-evident log: the
/// receipt a transfer answer carries), by req_id, in one read; one transfer's lookup is read
/// together with the other answers' waiting at the same moment (`ReadSide::receipts`). Positions are
/// handed out when the events are appended, so every committed event has one; if the read fails
/// the answers go out without them (the transfer happened; `GET /api/v1/log/receipts/{req_id}`
/// gives them later).
pub async fn log_positions(
    state: &crate::state::AppState,
    req_ids: &[String],
) -> std::collections::HashMap<String, Vec<i64>> {
    match state.reads.receipts().positions_of(req_ids).await {
        Ok(positions) => positions,
        Err(e) => {
            tracing::warn!(error = %e, "the transfers' log positions could not be read");
            std::collections::HashMap::new()
        }
    }
}

/// Longest refusal code passed through from an account system.
const REFUSAL_CODE_CHARS_MAX: usize = 64;

/// A refusal code from an account system, passed on only if it looks like a code; anything else
/// could be internal text.
pub fn refusal_code(code: &str) -> String {
    let plausible = !code.is_empty()
        && code.len() <= REFUSAL_CODE_CHARS_MAX
        && code
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if plausible {
        code.to_owned()
    } else {
        "REFUSED".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plausible_refusal_codes_pass_through() {
        assert_eq!(refusal_code("INSUFFICIENT_BALANCE"), "INSUFFICIENT_BALANCE");
        assert_eq!(
            refusal_code("ERROR: relation \"x\" does not exist"),
            "REFUSED"
        );
        assert_eq!(refusal_code(""), "REFUSED");
    }
}
