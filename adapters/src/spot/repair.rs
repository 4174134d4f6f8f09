//! What spot-core applied under one req_id, for the repair of a transfer a PostgreSQL failover
//! lost (`application::repair`): the applied movements of its `lookup`, in the audit's form, and
//! the whole answer as JSON for the repair's record.

use domain::AccountType;
use spot_core::protocol::{Outcome, RefusalCode, Request, Response};

use super::{SpotAdapter, SpotError};
use crate::applied::AppliedMovement;

pub use application::books::SpotRecord;

impl SpotAdapter {
    /// What spot-core recorded under `req_id`. An expired req_id (below the idempotency
    /// horizon) is an error: its record may have been forgotten, never "nothing applied".
    pub async fn record_of(&self, req_id: &str) -> Result<SpotRecord, SpotError> {
        let request = Request::Lookup {
            req_id: req_id.to_owned(),
        };
        let ops = match self.client.call(&request).await? {
            Response::Ok { ops: Some(ops), .. } => ops,
            Response::Refused {
                code: RefusalCode::ReqIdExpired,
                message,
                ..
            } => return Err(SpotError::Unexpected(format!("REQ_ID_EXPIRED: {message}"))),
            other => return Err(SpotError::Unexpected(format!("{other:?}"))),
        };
        let raw = serde_json::to_value(&ops).unwrap_or(serde_json::Value::Null);
        let applied = ops
            .into_iter()
            .filter(|o| o.outcome == Outcome::Applied)
            .map(|o| AppliedMovement {
                req_id: req_id.to_owned(),
                system: AccountType::Spot,
                operation: super::operation_of(o.op),
                user_id: i64::try_from(o.user_id).unwrap_or(i64::MAX),
                asset: o.asset,
                amount: o.amount,
            })
            .collect();
        Ok(SpotRecord { applied, raw })
    }
}
