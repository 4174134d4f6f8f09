//! The admin views' query parameters, checked one by one so that every bad value is refused with
//! the contract's BAD_REQUEST and a message naming it; and the listing's opaque cursor.

use application::reads::{AdminFilter, PageCursor, StateFilter, TransferRow, ADMIN_PAGE_SIZE_MAX};
use chrono::{DateTime, Utc};
use domain::{AssetSymbol, ReqId, TransferState};
use serde::Deserialize;
use utoipa::IntoParams;

use edge::error::ApiError;

/// Rows a listing page has when `limit` is not given.
pub const PAGE_SIZE_DEFAULT: i64 = 50;

/// Checks a run history shows when `limit` is not given.
pub const HISTORY_SIZE_DEFAULT: i64 = 50;

/// `GET /api/v1/admin/transfers`' query.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TransfersParams {
    /// A state name (INIT, SOURCE_PENDING, SOURCE_DONE, TARGET_PENDING, COMMITTED, FAILED,
    /// COMPENSATING, ROLLED_BACK) or OPEN (any non-terminal state).
    #[param(schema_with = state_filter)]
    pub state: Option<String>,
    /// The owner.
    #[param(minimum = 1)]
    pub user_id: Option<i64>,
    #[param(pattern = "^[A-Z0-9]{1,16}$")]
    pub asset: Option<String>,
    /// Only transfers whose last change is at least this old (the stuck filter); at most about
    /// 100 years.
    #[param(minimum = 0, maximum = 3_155_760_000_000_i64)]
    pub older_than_ms: Option<i64>,
    /// One transfer by its id.
    #[param(pattern = "^[0-7][0-9A-HJKMNP-TV-Z]{25}$")]
    pub req_id: Option<String>,
    /// The client's idempotency key (per user: give `user_id` too to pin it to one).
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub cid: Option<String>,
    /// The `next` of the previous page (opaque; a value no page gave may name no row).
    #[param(pattern = "^-?[0-9]{1,16}_[0-7][0-9A-HJKMNP-TV-Z]{25}$")]
    pub after: Option<String>,
    /// Rows per page: 1 to 500, default 50.
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
}

/// The `state` filter's values: the states' names and OPEN.
fn state_filter() -> utoipa::openapi::schema::Object {
    let names = TransferState::ALL
        .iter()
        .map(|s| s.as_str())
        .chain(["OPEN"]);
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(names))
        .description(Some("a state name, or OPEN (any non-terminal state)"))
        .build()
}

fn bad(message: &str) -> ApiError {
    ApiError::BadRequest(message.to_owned())
}

impl TransfersParams {
    /// The filter, the cursor and the page size, or the first bad value's refusal.
    pub fn parse(self) -> Result<(AdminFilter, Option<PageCursor>, i64), ApiError> {
        let state = match self.state.as_deref() {
            None => None,
            Some("OPEN") => Some(StateFilter::Open),
            Some(name) => Some(StateFilter::One(
                TransferState::parse(name)
                    .ok_or_else(|| bad("`state` must be a transfer state name or OPEN"))?,
            )),
        };
        if self.user_id.is_some_and(|u| u < 1) {
            return Err(bad("`user_id` must be a positive integer"));
        }
        if let Some(asset) = &self.asset {
            AssetSymbol::parse(asset).map_err(|_| bad("`asset` is not an asset symbol"))?;
        }
        if self.older_than_ms.is_some_and(|ms| ms < 0) {
            return Err(bad("`older_than_ms` must not be negative"));
        }
        if self
            .older_than_ms
            .is_some_and(|ms| ms.unsigned_abs() > crate::stuck::STUCK_OLDER_THAN_MS_MAX)
        {
            return Err(bad(
                "`older_than_ms` must be at most 3155760000000 (about 100 years)",
            ));
        }
        if let Some(req_id) = &self.req_id {
            ReqId::parse(req_id).map_err(|_| bad("`req_id` is not a req_id"))?;
        }
        if let Some(cid) = &self.cid {
            let plain = cid
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if cid.is_empty() || cid.len() > 64 || !plain {
                return Err(bad("`cid` must be 1 to 64 characters [A-Za-z0-9_-]"));
            }
        }
        let after = match self.after.as_deref() {
            None => None,
            Some(text) => Some(decode_cursor(text).ok_or_else(|| bad("`after` is not a cursor"))?),
        };
        let limit = self.limit.unwrap_or(PAGE_SIZE_DEFAULT);
        if !(1..=ADMIN_PAGE_SIZE_MAX).contains(&limit) {
            return Err(bad("`limit` must be 1 to 500"));
        }
        let filter = AdminFilter {
            state,
            user_id: self.user_id,
            asset: self.asset,
            older_than_ms: self.older_than_ms,
            req_id: self.req_id,
            cid: self.cid,
        };
        Ok((filter, after, limit))
    }
}

/// `GET /api/v1/admin/invariant/history`' query.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct HistoryParams {
    /// Checks to show: 1 to 1000, default 50.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// Only this cell's checks (ADR 0017). Under a cell map every cell's checks are merged
    /// without it; without a map the one cell is cell 1 (404 for a cell the ledger does not
    /// have).
    #[param(minimum = 1, maximum = 65535)]
    pub cell: Option<u16>,
}

impl HistoryParams {
    pub fn limit(&self) -> Result<i64, ApiError> {
        let limit = self.limit.unwrap_or(HISTORY_SIZE_DEFAULT);
        if (1..=application::audit::history::RUNS_READ_MAX).contains(&limit) {
            Ok(limit)
        } else {
            Err(bad("`limit` must be 1 to 1000"))
        }
    }
}

/// The path of `GET /api/v1/admin/invariant/runs/{id}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct RunPath {
    /// A run's `id`, as the check history lists it.
    pub id: i64,
}

/// The cursor after `row`: its creation time in microseconds and its req_id. Opaque to clients.
pub fn encode_cursor(row: &TransferRow) -> String {
    format!("{}_{}", row.created_at.timestamp_micros(), row.req_id)
}

fn decode_cursor(text: &str) -> Option<PageCursor> {
    let (micros, req_id) = text.split_once('_')?;
    let created_at = DateTime::<Utc>::from_timestamp_micros(micros.parse().ok()?)?;
    ReqId::parse(req_id).ok()?;
    Some(PageCursor {
        created_at,
        req_id: req_id.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(params: TransfersParams) -> Result<(AdminFilter, Option<PageCursor>, i64), ApiError> {
        params.parse()
    }

    #[test]
    fn defaults_and_open() {
        let (filter, after, limit) = parse(TransfersParams {
            state: Some("OPEN".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(filter.state, Some(StateFilter::Open));
        assert!(after.is_none());
        assert_eq!(limit, PAGE_SIZE_DEFAULT);
    }

    #[test]
    fn bad_values_are_bad_requests() {
        for params in [
            TransfersParams {
                state: Some("DONE".into()),
                ..Default::default()
            },
            TransfersParams {
                user_id: Some(0),
                ..Default::default()
            },
            TransfersParams {
                asset: Some("usdt".into()),
                ..Default::default()
            },
            TransfersParams {
                req_id: Some("x".into()),
                ..Default::default()
            },
            TransfersParams {
                cid: Some("a b".into()),
                ..Default::default()
            },
            TransfersParams {
                after: Some("garbage".into()),
                ..Default::default()
            },
            TransfersParams {
                limit: Some(501),
                ..Default::default()
            },
            TransfersParams {
                older_than_ms: Some(-1),
                ..Default::default()
            },
        ] {
            let refused = parse(params).unwrap_err();
            assert_eq!(refused.code(), "BAD_REQUEST");
        }
    }

    #[test]
    fn a_cursor_round_trips() {
        let req_id = ReqId::generate().to_string();
        let at = DateTime::<Utc>::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        let text = format!("{}_{}", at.timestamp_micros(), req_id);
        let cursor = decode_cursor(&text).unwrap();
        assert_eq!(cursor.created_at, at);
        assert_eq!(cursor.req_id, req_id);
    }
}
