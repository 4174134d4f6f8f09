//! spot-core's side of the idempotency horizon: moving it forward (`advance_horizon`) and
//! reading the engine's counters (`status`). The ledger computes the horizon
//! (`application::horizon`); this only says it to spot-core and reads back what it holds.

use spot_core::protocol::{CoreStatus, Request, Response};

use super::{SpotAdapter, SpotError};

impl SpotAdapter {
    /// Asks spot-core to forget every `(req_id, op)` whose ULID time is before `before_ms` (Unix
    /// milliseconds) and to refuse those `req_id`s with `REQ_ID_EXPIRED` from then on. spot-core
    /// never moves its horizon backwards: an older value is answered `ok` and changes nothing.
    /// Returns spot-core's status after the request (its `horizon_ms` is the horizon in force).
    pub async fn advance_horizon(&self, before_ms: u64) -> Result<CoreStatus, SpotError> {
        self.core_call(&Request::AdvanceHorizon { before_ms }).await
    }

    /// spot-core's counters: last seq, horizon, remembered records, snapshot and WAL sizes.
    pub async fn core_status(&self) -> Result<CoreStatus, SpotError> {
        self.core_call(&Request::Status {}).await
    }

    async fn core_call(&self, request: &Request) -> Result<CoreStatus, SpotError> {
        match self.client.call(request).await? {
            Response::Ok {
                core: Some(core), ..
            } => Ok(core),
            Response::Error { code, message } => Err(SpotError::Unexpected(format!(
                "{request:?} answered {code:?}: {message}"
            ))),
            other => Err(SpotError::Unexpected(format!(
                "{request:?} answered {other:?}"
            ))),
        }
    }
}
