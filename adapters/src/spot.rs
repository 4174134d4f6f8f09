//! The spot-core adapter: the coordinator's view of the SPOT account system, over spot-core's
//! TCP protocol. It tells an explicit refusal apart from everything else; anything it cannot be
//! sure of is reported as unknown, never as a refusal.

use std::time::Duration;

use async_trait::async_trait;
use domain::{
    AccountPort, AccountType, AdapterOutcome, AssetSymbol, Movement, Operation, Recorded, UserId,
};
use rust_decimal::Decimal;
use spot_core::client::{ClientError, SpotClient};
use spot_core::protocol::{self, MovementOp, RefusalCode, Request, Response};

use crate::funding::AccountStatus;

/// One SPOT balance as spot-core reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpotBalance {
    pub asset: String,
    pub available: Decimal,
    pub status: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SpotError {
    #[error("spot-core unreachable or failed: {0}")]
    Transport(String),
    #[error("spot-core answered unexpectedly: {0}")]
    Unexpected(String),
}

impl From<ClientError> for SpotError {
    fn from(e: ClientError) -> Self {
        Self::Transport(e.to_string())
    }
}

/// Adapter over a spot-core client. Cheap to clone.
#[derive(Clone)]
pub struct SpotAdapter {
    client: SpotClient,
}

impl SpotAdapter {
    pub fn new(addr: String, timeout: Duration) -> Self {
        Self {
            client: SpotClient::new(addr, timeout),
        }
    }

    pub fn client(&self) -> &SpotClient {
        &self.client
    }

    pub async fn ping(&self) -> Result<(), SpotError> {
        match self.client.call(&Request::Ping {}).await? {
            Response::Ok { .. } => Ok(()),
            other => Err(SpotError::Unexpected(format!("{other:?}"))),
        }
    }

    pub async fn balances(&self, user_id: UserId) -> Result<Vec<SpotBalance>, SpotError> {
        let request = Request::Balances {
            user_id: user_id.get(),
        };
        match self.client.call(&request).await? {
            Response::Ok {
                balances: Some(list),
                ..
            } => Ok(list
                .into_iter()
                .map(|b| SpotBalance {
                    asset: b.asset,
                    available: b.available.normalize(),
                    status: status_name(b.status).to_owned(),
                })
                .collect()),
            other => Err(SpotError::Unexpected(format!("{other:?}"))),
        }
    }

    pub async fn set_status(
        &self,
        user_id: UserId,
        asset: &AssetSymbol,
        status: AccountStatus,
    ) -> Result<(), SpotError> {
        let status = match status {
            AccountStatus::Active => protocol::AccountStatus::Active,
            AccountStatus::Frozen => protocol::AccountStatus::Frozen,
            AccountStatus::Disabled => protocol::AccountStatus::Disabled,
        };
        let request = Request::SetStatus {
            user_id: user_id.get(),
            asset: asset.to_string(),
            status,
        };
        match self.client.call(&request).await? {
            Response::Ok { .. } => Ok(()),
            other => Err(SpotError::Unexpected(format!("{other:?}"))),
        }
    }

    async fn movement(&self, op: MovementOp, m: &Movement) -> AdapterOutcome {
        let request = Request::movement(
            op,
            m.req_id.to_string(),
            m.user_id.get(),
            m.asset.as_str(),
            m.amount.value(),
        );
        match self.client.call(&request).await {
            Ok(Response::Applied { .. }) => AdapterOutcome::Success,
            // A used req_id with other details is a bug or an attack, not a clean refusal:
            // compensating on it could move money that was never taken.
            Ok(Response::Refused {
                code: RefusalCode::ReqIdConflict,
                message,
                ..
            }) => AdapterOutcome::Unknown(format!("REQ_ID_CONFLICT: {message}")),
            Ok(Response::Refused { code, message, .. }) => AdapterOutcome::ExplicitFail {
                code: code.as_str().to_owned(),
                message,
            },
            Ok(other) => AdapterOutcome::Unknown(format!("unexpected answer: {other:?}")),
            Err(ClientError::Timeout) => AdapterOutcome::Timeout,
            Err(ClientError::Connect(e)) | Err(ClientError::Io(e)) => {
                AdapterOutcome::NetworkError(e)
            }
            Err(ClientError::Protocol(e)) => AdapterOutcome::Unknown(e),
        }
    }
}

fn status_name(status: protocol::AccountStatus) -> &'static str {
    match status {
        protocol::AccountStatus::Active => "ACTIVE",
        protocol::AccountStatus::Frozen => "FROZEN",
        protocol::AccountStatus::Disabled => "DISABLED",
    }
}

#[async_trait]
impl AccountPort for SpotAdapter {
    fn account_type(&self) -> AccountType {
        AccountType::Spot
    }

    async fn withdraw(&self, m: &Movement) -> AdapterOutcome {
        self.movement(MovementOp::Withdraw, m).await
    }

    async fn deposit(&self, m: &Movement) -> AdapterOutcome {
        self.movement(MovementOp::Deposit, m).await
    }

    async fn refund(&self, m: &Movement) -> AdapterOutcome {
        self.movement(MovementOp::Refund, m).await
    }

    /// spot-core answers `lookup` from the records it rebuilt from its WAL, after the same sync
    /// as any movement, so "never seen" covers everything it ever acknowledged.
    async fn lookup(&self, m: &Movement, operation: Operation) -> Recorded {
        let op = match operation {
            Operation::Withdraw => MovementOp::Withdraw,
            Operation::Deposit => MovementOp::Deposit,
            Operation::Refund => MovementOp::Refund,
        };
        let request = Request::Lookup {
            req_id: m.req_id.to_string(),
        };
        let ops = match self.client.call(&request).await {
            Ok(Response::Ok { ops: Some(ops), .. }) => ops,
            Ok(other) => return Recorded::Unavailable(format!("unexpected answer: {other:?}")),
            Err(e) => return Recorded::Unavailable(e.to_string()),
        };
        let Some(found) = ops.into_iter().find(|o| o.op == op) else {
            return Recorded::NotSeen;
        };
        if found.user_id != m.user_id.get()
            || found.asset != m.asset.as_str()
            || found.amount != m.amount.value()
        {
            return Recorded::Unavailable(format!(
                "req_id {} recorded for a different movement",
                m.req_id
            ));
        }
        match (found.outcome, found.code) {
            (protocol::Outcome::Applied, _) => Recorded::Applied,
            (_, Some(code)) => Recorded::Refused {
                code: code.as_str().to_owned(),
                message: code.message().to_owned(),
            },
            (_, None) => Recorded::Unavailable("refusal recorded without a code".to_owned()),
        }
    }
}
