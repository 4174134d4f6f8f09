//! The spot-core adapter: the coordinator's view of the SPOT account system, over spot-core's
//! TCP protocol. It tells an explicit refusal apart from everything else; anything it cannot be
//! sure of is reported as unknown, never as a refusal.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use domain::{
    AccountPort, AccountType, AdapterOutcome, AssetSymbol, Movement, Operation, Recorded, ReqId,
    UserId,
};
use spot_core::client::{ClientError, SpotClient, SpotTransport};
use spot_core::protocol::{self, MovementOp, RefusalCode, Request, Response};

use crate::funding::AccountStatus;
use crate::traced;
use tracing::Instrument;

mod audit;
mod horizon;
pub mod moves;
pub mod repair;

pub use application::books::{SpotBalance, SpotError};

/// Adapter over a spot-core transport (the TCP client in production). Cheap to clone.
#[derive(Clone)]
pub struct SpotAdapter {
    client: Arc<dyn SpotTransport>,
}

impl SpotAdapter {
    /// Without a token: for a spot-core on loopback that has none.
    pub fn new(addr: String, timeout: Duration) -> Self {
        Self::with_token(addr, timeout, None)
    }

    /// With `Some(token)`, every connection authenticates with spot-core's `hello` first.
    pub fn with_token(addr: String, timeout: Duration, token: Option<String>) -> Self {
        Self::over(Arc::new(SpotClient::with_token(addr, timeout, token)))
    }

    /// Like `with_token`, with the TCP keepalive and `TCP_USER_TIMEOUT` of every connection.
    pub fn with_liveness(
        addr: String,
        timeout: Duration,
        token: Option<String>,
        liveness: liveness::TcpLiveness,
    ) -> Self {
        Self::over(Arc::new(SpotClient::with_liveness(
            addr, timeout, token, liveness,
        )))
    }

    /// Like `with_liveness`, for the engine of `cell` (ADR 0017): each connection's `hello` names
    /// the cell, and an engine that is another cell refuses it.
    pub fn for_cell(
        addr: String,
        timeout: Duration,
        token: Option<String>,
        liveness: liveness::TcpLiveness,
        cell: u16,
    ) -> Self {
        Self::over(Arc::new(SpotClient::for_cell(
            addr,
            timeout,
            token,
            liveness,
            Some(cell),
        )))
    }

    /// Over any transport: the simulation's in-process engine runs the same mapping.
    pub fn over(transport: Arc<dyn SpotTransport>) -> Self {
        Self { client: transport }
    }

    /// The transport every request goes through.
    pub fn client(&self) -> &dyn SpotTransport {
        self.client.as_ref()
    }

    /// The TCP client, when the transport is one (`SpotTransport::tcp_client`).
    pub fn tcp_client(&self) -> Option<&SpotClient> {
        self.client.tcp_client()
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

    /// Everything spot-core recorded under `req_id` (one entry per movement op), as it answers
    /// `lookup`: for operators, who read it whole; the coordinator reads one op through
    /// `AccountPort::lookup`. An expired req_id (below the idempotency horizon) is `Unexpected`.
    pub async fn lookup_records(
        &self,
        req_id: &ReqId,
    ) -> Result<Vec<protocol::LookupOp>, SpotError> {
        let request = Request::Lookup {
            req_id: req_id.to_string(),
        };
        match self.client.call(&request).await? {
            Response::Ok { ops: Some(ops), .. } => Ok(ops),
            Response::Refused { code, .. } => Err(SpotError::Unexpected(format!(
                "lookup refused: {}",
                code.as_str()
            ))),
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

    /// Settle (`req_id`, `operation`) for good. If spot-core has recorded nothing under that key,
    /// it durably records a `CANCELLED` refusal, which every later copy of the movement gets as
    /// a duplicate; the answer is then `Refused { code: "CANCELLED" }`, exactly what `lookup`
    /// reports from now on. If something is recorded already, it is reported unchanged, read
    /// the same way `lookup` reads it (`Applied`, `Refused`, or `Mismatch` for other details).
    /// `Unavailable` means nothing is settled: no answer (retrying is safe, `cancel` is
    /// idempotent) or the cancel itself was refused as invalid.
    pub async fn cancel(&self, m: &Movement, operation: Operation) -> Recorded {
        let op = movement_op(operation);
        let request = Request::Cancel {
            req_id: m.req_id.to_string(),
            movement: op,
            user_id: m.user_id.get(),
            asset: m.asset.as_str().to_owned(),
            amount: protocol::canonical_amount(m.amount.value()),
        };
        match self.client.call(&request).await {
            Ok(Response::Ok { ops: Some(ops), .. }) => match ops.as_slice() {
                [found] if found.op == op => recorded(found, m),
                _ => Recorded::Unavailable(format!("unexpected cancel answer: {ops:?}")),
            },
            Ok(Response::Refused {
                code: RefusalCode::ReqIdExpired,
                message,
                ..
            }) => Recorded::Unavailable(expired(&m.req_id, "cancel", &message)),
            Ok(Response::Refused { code, message, .. }) => Recorded::Unavailable(format!(
                "cancel refused, nothing settled: {code}: {message}"
            )),
            Ok(other) => Recorded::Unavailable(format!("unexpected answer: {other:?}")),
            Err(e) => Recorded::Unavailable(e.to_string()),
        }
    }

    async fn movement(&self, op: MovementOp, m: &Movement) -> AdapterOutcome {
        let span = traced::spot_call(operation_of(op), std::slice::from_ref(m));
        let answer = self
            .client
            .call(&movement_request(op, m))
            .instrument(span)
            .await;
        movement_outcome(op, m, answer)
    }

    /// Many movements of one kind, pipelined on one connection (`SpotTransport::call_many`):
    /// one WAL sync in spot-core for the lot, each answer read as a single movement's.
    async fn movements_pipelined(&self, op: MovementOp, ms: &[Movement]) -> Vec<AdapterOutcome> {
        let requests: Vec<Request> = ms.iter().map(|m| movement_request(op, m)).collect();
        let span = traced::spot_call(operation_of(op), ms);
        let answers = self.client.call_many(&requests).instrument(span).await;
        if answers.len() != ms.len() {
            // A transport that lost count: nothing can be said about any of them.
            let why = format!("{} answers to {} requests", answers.len(), ms.len());
            return vec![AdapterOutcome::Unknown(why); ms.len()];
        }
        ms.iter()
            .zip(answers)
            .map(|(m, answer)| movement_outcome(op, m, answer))
            .collect()
    }
}

fn movement_request(op: MovementOp, m: &Movement) -> Request {
    Request::movement(
        op,
        m.req_id.to_string(),
        m.user_id.get(),
        m.asset.as_str(),
        m.amount.value(),
    )
}

/// What spot-core's answer (or the lack of one) to a movement says about it.
fn movement_outcome(
    op: MovementOp,
    m: &Movement,
    answer: Result<Response, ClientError>,
) -> AdapterOutcome {
    match answer {
        Ok(Response::Applied { .. }) => AdapterOutcome::Success,
        // A used req_id with other details is a bug or an attack, not a clean refusal:
        // compensating on it could move money that was never taken.
        Ok(Response::Refused {
            code: RefusalCode::ReqIdConflict,
            message,
            ..
        }) => AdapterOutcome::Mismatch(format!("REQ_ID_CONFLICT: {message}")),
        // Not a refusal: it says nothing about whether the movement was applied before the
        // horizon passed its req_id (its record is forgotten). The transfer stays open.
        Ok(Response::Refused {
            code: RefusalCode::ReqIdExpired,
            message,
            ..
        }) => AdapterOutcome::Unknown(expired(&m.req_id, operation_of(op).as_str(), &message)),
        Ok(Response::Refused { code, message, .. }) => AdapterOutcome::ExplicitFail {
            code: code.as_str().to_owned(),
            message,
        },
        Ok(other) => AdapterOutcome::Unknown(format!("unexpected answer: {other:?}")),
        Err(ClientError::Timeout) => AdapterOutcome::Timeout,
        Err(ClientError::Connect(e)) | Err(ClientError::Io(e)) => AdapterOutcome::NetworkError(e),
        Err(ClientError::Protocol(e)) => AdapterOutcome::Unknown(e),
        // Never sent (spot-core has seen a newer cell map): not a refusal of the movement.
        Err(e @ ClientError::StaleMap(_)) => AdapterOutcome::Unknown(e.to_string()),
        // The user's partition moved to another cell (ADR 0023 §4): nothing was done here, and
        // the movement is to be retried under the new map, never taken for a refusal.
        Err(e @ (ClientError::Moved(_) | ClientError::MoveRefused(_))) => {
            AdapterOutcome::Unknown(e.to_string())
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

    async fn movements(&self, operation: Operation, ms: &[Movement]) -> Vec<AdapterOutcome> {
        self.movements_pipelined(movement_op(operation), ms).await
    }

    /// spot-core answers `lookup` from the records it rebuilt from its WAL, after the same sync
    /// as any movement, so "never seen" covers everything it ever acknowledged.
    async fn lookup(&self, m: &Movement, operation: Operation) -> Recorded {
        let op = movement_op(operation);
        let request = Request::Lookup {
            req_id: m.req_id.to_string(),
        };
        let ops = match self.client.call(&request).await {
            Ok(Response::Ok { ops: Some(ops), .. }) => ops,
            // Never "not seen": the record may have been forgotten, not absent.
            Ok(Response::Refused {
                code: RefusalCode::ReqIdExpired,
                message,
                ..
            }) => return Recorded::Unavailable(expired(&m.req_id, "lookup", &message)),
            Ok(other) => return Recorded::Unavailable(format!("unexpected answer: {other:?}")),
            Err(e) => return Recorded::Unavailable(e.to_string()),
        };
        let Some(found) = ops.into_iter().find(|o| o.op == op) else {
            return Recorded::NotSeen;
        };
        recorded(&found, m)
    }

    async fn cancel(&self, m: &Movement, operation: Operation) -> Recorded {
        SpotAdapter::cancel(self, m, operation).await
    }
}

/// `REQ_ID_EXPIRED` for a movement, cancel or lookup of a transfer the ledger still drives: the
/// horizon passed a transfer that is not terminal. The horizon is never set past the oldest open
/// transfer, so this is a broken assumption (a clock far off, a retention shorter than a
/// transfer's creation took, another ledger sharing this spot-core): nothing can be concluded
/// about the movement, which stays unknown (the transfer open) until an operator looks. Logged
/// at error level; returns the reason.
fn expired(req_id: &ReqId, what: &str, message: &str) -> String {
    tracing::error!(
        alert = "CRITICAL",
        code = "REQ_ID_EXPIRED",
        %req_id,
        what,
        "spot-core's idempotency horizon passed an open transfer; its outcome stays unknown"
    );
    format!("REQ_ID_EXPIRED on {what}, outcome unknown: {message}")
}

/// The domain's operation as spot-core's protocol names it (spot-core depends on no crate of
/// ours, so it has its own enum; this and [`operation_of`] are the one mapping between them).
pub fn movement_op(operation: Operation) -> MovementOp {
    match operation {
        Operation::Withdraw => MovementOp::Withdraw,
        Operation::Deposit => MovementOp::Deposit,
        Operation::Refund => MovementOp::Refund,
    }
}

/// spot-core's movement as the domain's operation: the inverse of [`movement_op`].
pub fn operation_of(op: MovementOp) -> Operation {
    match op {
        MovementOp::Withdraw => Operation::Withdraw,
        MovementOp::Deposit => Operation::Deposit,
        MovementOp::Refund => Operation::Refund,
    }
}

/// What spot-core's record of (`req_id`, op) says about `m`; shared by `lookup` and `cancel` so
/// both read a record the same way.
fn recorded(found: &protocol::LookupOp, m: &Movement) -> Recorded {
    if found.user_id != m.user_id.get()
        || found.asset != m.asset.as_str()
        || found.amount != m.amount.value()
    {
        return Recorded::Mismatch(format!(
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

#[cfg(test)]
mod tests {
    use super::*;
    use domain::{Amount, ReqId};
    use rust_decimal::Decimal;
    use std::error::Error as _;

    #[test]
    fn a_transport_error_keeps_the_client_error_and_whether_the_request_may_have_arrived() {
        let never_sent = SpotError::from(ClientError::Connect("refused".into()));
        assert!(!never_sent.outcome_unknown());
        assert_eq!(
            never_sent.to_string(),
            "spot-core unreachable or failed: could not connect to spot-core: refused"
        );
        let source = never_sent
            .source()
            .and_then(|s| s.downcast_ref::<ClientError>());
        assert_eq!(source, Some(&ClientError::Connect("refused".into())));
        assert!(SpotError::from(ClientError::Timeout).outcome_unknown());
        assert!(SpotError::from(ClientError::Io("reset".into())).outcome_unknown());
        assert!(SpotError::Unexpected("odd".into()).outcome_unknown());
    }

    /// A spot-core served in this process on loopback, with its own data dir.
    struct Spot {
        addr: String,
        dir: std::path::PathBuf,
        server: tokio::task::JoinHandle<()>,
    }

    impl Spot {
        async fn start(token: Option<&str>) -> Spot {
            // Unique per start: the tests run in parallel threads of one process, and two of them
            // once read the same clock value and shared a data dir (its LOCK refused the second).
            static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            let dir = std::env::temp_dir()
                .join(format!("adapters-spot-{}-{n}-{nanos}", std::process::id()));
            let token_file = token.map(|t| {
                std::fs::create_dir_all(&dir).unwrap();
                let path = dir.join("spot.token");
                std::fs::write(&path, t).unwrap();
                path
            });
            // Parsed like the binary's command line, so every storage option keeps its default.
            let data_dir = dir.join("spot");
            let mut argv = vec![
                "spot-core".to_owned(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--data-dir".into(),
                data_dir.display().to_string(),
            ];
            if let Some(path) = &token_file {
                argv.extend(["--token-file".to_owned(), path.display().to_string()]);
            }
            let args = <spot_core::Args as clap::Parser>::try_parse_from(argv).unwrap();
            let bound = spot_core::bind(&args).await.unwrap();
            let addr = bound.local_addr.to_string();
            let server = tokio::spawn(async move {
                let _ = bound.serve().await;
            });
            Spot { addr, dir, server }
        }
    }

    impl Drop for Spot {
        fn drop(&mut self) {
            self.server.abort();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn movement(user: u64, amount: &str) -> Movement {
        Movement {
            req_id: ReqId::generate(),
            user_id: UserId::new(user).unwrap(),
            asset: AssetSymbol::parse("USDT").unwrap(),
            amount: Amount::parse(amount).unwrap(),
        }
    }

    /// A user whose partition moved out of spot-core (ADR 0023 §4) is answered `MOVED`: every
    /// movement is an unknown outcome and every lookup or cancel unavailable, never a refusal
    /// nor "not seen", so the transfer waits to be sent again under the new map.
    #[tokio::test]
    async fn a_moved_users_movements_are_unknown_never_refused() {
        let spot = Spot::start(None).await;
        let a = SpotAdapter::new(spot.addr.clone(), Duration::from_secs(5));
        let user = (1u64..)
            .find(|u| spot_core::partition::partition_of(*u) == 9)
            .unwrap();
        let m = movement(user, "25");
        assert_eq!(a.deposit(&m).await, AdapterOutcome::Success);
        let client = spot_core::SpotClient::new(spot.addr.clone(), Duration::from_secs(5));
        let out = client.move_out("adapter-move", 9).await.unwrap();
        assert_eq!(out.accounts, 1);
        let later = movement(user, "1");
        for outcome in [
            a.deposit(&later).await,
            a.withdraw(&m).await,
            a.refund(&m).await,
        ] {
            assert!(
                matches!(&outcome, AdapterOutcome::Unknown(e) if e.contains("MOVED")),
                "{outcome:?}"
            );
        }
        assert!(matches!(
            a.lookup(&m, Operation::Deposit).await,
            Recorded::Unavailable(_)
        ));
        assert!(matches!(
            a.cancel(&later, Operation::Deposit).await,
            Recorded::Unavailable(_)
        ));
    }

    #[tokio::test]
    async fn cancel_settles_an_unseen_movement_as_refused_for_good() {
        let spot = Spot::start(None).await;
        let a = SpotAdapter::new(spot.addr.clone(), Duration::from_secs(5));
        let m = movement(1, "25");
        assert_eq!(a.lookup(&m, Operation::Deposit).await, Recorded::NotSeen);
        let cancelled = Recorded::Refused {
            code: "CANCELLED".into(),
            message: RefusalCode::Cancelled.message().into(),
        };
        assert_eq!(a.cancel(&m, Operation::Deposit).await, cancelled);
        // Through the port as well, and idempotent.
        let port: &dyn AccountPort = &a;
        assert_eq!(port.cancel(&m, Operation::Deposit).await, cancelled);
        // lookup now says the same thing, and a late copy of the deposit is refused.
        assert_eq!(a.lookup(&m, Operation::Deposit).await, cancelled);
        assert_eq!(
            a.deposit(&m).await,
            AdapterOutcome::ExplicitFail {
                code: "CANCELLED".into(),
                message: RefusalCode::Cancelled.message().into(),
            }
        );
        assert!(a.balances(m.user_id).await.unwrap().is_empty());
        // Only (req_id, deposit) is settled.
        assert_eq!(a.lookup(&m, Operation::Withdraw).await, Recorded::NotSeen);
    }

    #[tokio::test]
    async fn cancel_of_a_recorded_movement_reports_it_like_lookup() {
        let spot = Spot::start(None).await;
        let a = SpotAdapter::new(spot.addr.clone(), Duration::from_secs(5));
        let m = movement(2, "10");
        assert_eq!(a.deposit(&m).await, AdapterOutcome::Success);
        assert_eq!(a.cancel(&m, Operation::Deposit).await, Recorded::Applied);
        let w = movement(2, "1000");
        assert!(matches!(
            a.withdraw(&w).await,
            AdapterOutcome::ExplicitFail { .. }
        ));
        assert_eq!(
            a.cancel(&w, Operation::Withdraw).await,
            a.lookup(&w, Operation::Withdraw).await
        );
        assert!(matches!(
            a.cancel(&w, Operation::Withdraw).await,
            Recorded::Refused { code, .. } if code == "INSUFFICIENT_BALANCE"
        ));
        // The same key with other details: a mismatch, nothing recorded.
        let other = Movement {
            amount: Amount::parse("11").unwrap(),
            ..m.clone()
        };
        assert!(matches!(
            a.cancel(&other, Operation::Deposit).await,
            Recorded::Mismatch(_)
        ));
        assert_eq!(a.lookup(&m, Operation::Deposit).await, Recorded::Applied);
        // An invalid cancel settles nothing.
        let bad = Movement {
            asset: AssetSymbol::parse("DOGE").unwrap(),
            ..movement(2, "1")
        };
        assert!(matches!(
            a.cancel(&bad, Operation::Deposit).await,
            Recorded::Unavailable(_)
        ));
        assert_eq!(a.lookup(&bad, Operation::Deposit).await, Recorded::NotSeen);
    }

    #[tokio::test]
    async fn movements_are_pipelined_and_each_answered_as_alone() {
        let spot = Spot::start(None).await;
        let a = SpotAdapter::new(spot.addr.clone(), Duration::from_secs(5));
        let deposits: Vec<Movement> = (0..600).map(|_| movement(4, "1")).collect();
        let port: &dyn AccountPort = &a;
        let answered = port.movements(Operation::Deposit, &deposits).await;
        assert_eq!(
            answered.len(),
            600,
            "one answer per movement, past one pipeline"
        );
        assert!(answered.iter().all(|o| *o == AdapterOutcome::Success));
        // A refusal, a repeat (its first answer) and a mismatch, each answered for itself.
        let too_much = movement(4, "1000");
        let other = Movement {
            amount: Amount::parse("2").unwrap(),
            ..deposits[0].clone()
        };
        let mixed = [too_much, deposits[1].clone(), other];
        let answered = port.movements(Operation::Withdraw, &mixed[..1]).await;
        assert!(
            matches!(&answered[0], AdapterOutcome::ExplicitFail { code, .. } if code == "INSUFFICIENT_BALANCE")
        );
        let answered = port.movements(Operation::Deposit, &mixed[1..]).await;
        assert_eq!(answered[0], AdapterOutcome::Success);
        assert!(matches!(answered[1], AdapterOutcome::Mismatch(_)));
        let balances = a.balances(UserId::new(4).unwrap()).await.unwrap();
        assert_eq!(balances[0].available, Decimal::from(600));
    }

    #[tokio::test]
    async fn a_token_is_sent_on_every_connection() {
        let spot = Spot::start(Some("adapter-token")).await;
        let good = SpotAdapter::with_token(
            spot.addr.clone(),
            Duration::from_secs(5),
            Some("adapter-token".into()),
        );
        good.ping().await.unwrap();
        let m = movement(3, "5");
        assert_eq!(good.deposit(&m).await, AdapterOutcome::Success);
        for bad in [
            SpotAdapter::new(spot.addr.clone(), Duration::from_secs(5)),
            SpotAdapter::with_token(spot.addr.clone(), Duration::from_secs(5), Some("x".into())),
        ] {
            assert!(bad.ping().await.is_err());
            assert!(matches!(
                bad.lookup(&m, Operation::Deposit).await,
                Recorded::Unavailable(_)
            ));
        }
    }
}
