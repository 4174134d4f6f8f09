//! The application's front door: one value holding the coordinator, the account systems, the
//! asset settings and the gates, with every command an edge calls: request a transfer, audit fund
//! conservation, lift a halt, read a transfer's log. Built once from explicit arguments (the
//! edge's settings); it starts no background task (the edge's start-up runs the periodic ones).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use domain::{
    AccountPort, AccountType, Amount, AssetRegistry, AssetSymbol, ErrorCode, ReqId, TransferData,
    UserId,
};
use tracing::Instrument;

use crate::assets::AssetSettings;
use crate::audit::history::AuditHistory;
use crate::audit::{self, CheckError, InvariantReport, Mode};
use crate::books::{AccountStatus, DepositReceipt, FundingBook, FundingError, SpotBook, SpotError};
use crate::bulk::{cid_slots, Slot};
use crate::coordinator::{Coordinator, CoordinatorError, NewTransfer, Ports};
use crate::daily::DailyLimits;
use crate::error::StoreError;
use crate::failpoint::FailPoints;
use crate::halt::HaltCache;
use crate::request::{depends_on_settings, TransferRequest};
use crate::stores::{
    AlertLog, AssetStore, EventReads, HaltFlag, LogError, LoggedEvent, OpenTransfers, RepairRecords,
};

/// The per-second limit on transfer requests, kept by the edge (in this process's memory).
pub trait RateGate: Send + Sync {
    /// Counts one request of `user` now; RATE_LIMIT_EXCEEDED past the limit.
    fn admit(&self, user: UserId) -> Result<(), ErrorCode>;
}

/// No per-second limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unlimited;

impl RateGate for Unlimited {
    fn admit(&self, _user: UserId) -> Result<(), ErrorCode> {
        Ok(())
    }
}

/// Why a transfer request was not answered with a transfer.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Refused with this contract code; nothing was created.
    #[error("refused: {0}")]
    Refused(ErrorCode),
    /// The halt flag could not be read: the request is refused (fail closed), as unavailable.
    #[error("halt flag unreadable")]
    HaltUnknown(#[source] StoreError),
    /// The FUNDING target's existence could not be checked.
    #[error("funding ledger")]
    Funding(#[source] FundingError),
    /// The task driving the transfer ended abnormally (a panic).
    #[error("transfer task ended abnormally")]
    Task(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
}

/// What a request's gates came to.
enum Gated {
    /// A cid repeat: its original transfer.
    Answered(TransferData),
    /// To be created.
    Accepted(NewTransfer),
}

/// A cid repeat inside a batch gets the first item's answer.
fn same_answer(
    first: Option<&Result<TransferData, RequestError>>,
    first_index: usize,
) -> Result<TransferData, RequestError> {
    match first {
        Some(Ok(data)) => Ok(data.clone()),
        Some(Err(RequestError::Refused(code))) => Err(RequestError::Refused(*code)),
        Some(Err(RequestError::Coordinator(e))) => Err(RequestError::Coordinator(e.clone())),
        Some(Err(other)) => Err(RequestError::Coordinator(
            CoordinatorError::outcome_unknown(format!("as item {first_index}: {other}")),
        )),
        None => Err(RequestError::Coordinator(CoordinatorError::invariant(
            "bulk answer missing",
        ))),
    }
}

/// One of each record port (`stores.rs`, and the conservation check's own): what `Ledger` and
/// `Queries` are wired with. `adapters::pg::stores(pool)` makes PostgreSQL's,
/// `testkit::MemRecords::stores` the in-memory ones.
#[derive(Clone)]
pub struct Stores {
    pub halt: Arc<dyn HaltFlag>,
    pub alerts: Arc<dyn AlertLog>,
    pub assets: Arc<dyn AssetStore>,
    pub events: Arc<dyn EventReads>,
    pub checkpoints: Arc<dyn audit::Checkpoints>,
    pub history: Arc<dyn AuditHistory>,
    pub open: Arc<dyn OpenTransfers>,
    pub repairs: Arc<dyn RepairRecords>,
}

/// The application. Cheap to clone: every field is a handle.
#[derive(Clone)]
pub struct Ledger {
    pub(crate) coordinator: Coordinator,
    pub(crate) funding: Arc<dyn FundingBook>,
    pub(crate) spot: Arc<dyn SpotBook>,
    pub(crate) stores: Stores,
    assets: AssetSettings,
    halt: Arc<HaltCache>,
    rate: Arc<dyn RateGate>,
    /// The most transfers one bulk request may carry.
    bulk_max: usize,
}

impl Ledger {
    /// Wires a coordinator over `ports` and the two account systems, with the core's records
    /// in `stores` and the asset list (every check's registry). No limits until
    /// [`Ledger::with_limits`]. `adapters::pg::ledger` wires PostgreSQL's.
    pub fn new(
        ports: Ports,
        stores: Stores,
        funding: Arc<dyn FundingBook>,
        spot: Arc<dyn SpotBook>,
        registry: Arc<RwLock<AssetRegistry>>,
    ) -> Self {
        let coordinator = Coordinator::with_ports(
            ports,
            funding.clone() as Arc<dyn AccountPort>,
            spot.clone() as Arc<dyn AccountPort>,
            registry.clone(),
        );
        Self::from_parts(coordinator, stores, funding, spot, registry)
    }

    /// Over a coordinator the caller wired itself over `funding` and `spot` and `registry`, so
    /// the start-up's background work runs over the same.
    pub fn from_parts(
        coordinator: Coordinator,
        stores: Stores,
        funding: Arc<dyn FundingBook>,
        spot: Arc<dyn SpotBook>,
        registry: Arc<RwLock<AssetRegistry>>,
    ) -> Self {
        Self {
            coordinator,
            funding,
            spot,
            assets: AssetSettings::new(stores.assets.clone(), registry),
            stores,
            halt: Arc::new(HaltCache::default()),
            rate: Arc::new(Unlimited),
            bulk_max: crate::bulk::TRANSFERS_PER_REQUEST_MAX_DEFAULT,
        }
    }

    /// The most transfers one bulk request may carry (at least 1).
    pub fn with_bulk_max(mut self, transfers_max: usize) -> Self {
        self.bulk_max = transfers_max.max(1);
        self
    }

    /// The most transfers one bulk request may carry; the edge refuses a larger batch whole.
    pub fn bulk_max(&self) -> usize {
        self.bulk_max
    }

    /// The rounds of single requests this process's coordinator ran so far (ADR 0019): how
    /// well concurrent single requests share each durable step. This process's own counts,
    /// from its start.
    pub fn round_stats(&self) -> crate::round::RoundStats {
        self.coordinator.round_stats()
    }

    /// Applies the per-second gate and the daily limits to new transfer requests.
    pub fn with_limits(mut self, rate: Arc<dyn RateGate>, daily: DailyLimits) -> Self {
        self.rate = rate;
        self.coordinator = self.coordinator.with_daily_limits(daily);
        self
    }

    /// Arms a fail point (crash tests only).
    pub fn with_failpoints(mut self, failpoints: FailPoints) -> Self {
        self.coordinator = self.coordinator.with_failpoints(failpoints);
        self
    }

    /// The idempotency horizon's retention, for re-keying old orphan client-key claims.
    pub fn with_idempotency_retention(mut self, retention: Duration) -> Self {
        self.coordinator = self.coordinator.with_idempotency_retention(retention);
        self
    }

    pub fn assets(&self) -> &AssetSettings {
        &self.assets
    }

    /// The core's records this ledger was wired with.
    pub fn stores(&self) -> &Stores {
        &self.stores
    }

    /// The coordinator every command runs on.
    pub fn coordinator(&self) -> &Coordinator {
        &self.coordinator
    }

    /// `POST /internal_transfer`'s command: the values checked in contract §5.5's order (a cid repeat
    /// refused only because an asset setting changed since still gets its original transfer),
    /// then a cid repeat answered with its original transfer whatever else changed (rate,
    /// halt), the per-second gate, the halt (MON-003), the FUNDING target's existence, and the
    /// coordinator's own create (daily limits) and drive.
    pub async fn request_transfer(
        &self,
        request: TransferRequest,
    ) -> Result<TransferData, RequestError> {
        let parsed = {
            let registry = self
                .assets
                .registry()
                .read()
                .unwrap_or_else(|e| e.into_inner());
            request.parse(&registry)
        };
        let transfer = match parsed {
            Ok(transfer) => transfer,
            Err(code) => return self.refused_values(&request, code).await,
        };
        let transfer = match self.gate(transfer).await? {
            Gated::Answered(existing) => return Ok(existing),
            Gated::Accepted(transfer) => transfer,
        };
        let coordinator = self.coordinator.clone();
        // The drive runs in its own task so a caller hanging up cannot cancel it between a
        // step's commit and its adapter call; the transfer then ends as soon as possible rather
        // than at the recovery worker's next pass. The task ends with the drive.
        // In the request's span: its trace follows the drive (docs/adr/0018-traces.md).
        let created = tokio::spawn(
            async move {
                coordinator.validate(&transfer)?;
                coordinator.create_and_drive(transfer).await
            }
            .in_current_span(),
        )
        .await
        .map_err(RequestError::Task)??;
        Ok(created)
    }

    /// `POST /internal_transfers`' command: many transfer requests, each checked exactly as
    /// `request_transfer` checks one (values in contract §5.5's order, cid repeat, the per-second gate
    /// counting each item, the halt, the FUNDING target), then the batch's creation and drive
    /// (`Coordinator::create_and_drive_many`: each step for the whole batch at once) in a task a
    /// hung-up client cannot cancel. One answer per request, in order; a refused item does not
    /// stop the others. Each item is its own transfer: a batch is not one transaction.
    pub async fn request_transfers(
        &self,
        requests: Vec<TransferRequest>,
    ) -> Vec<Result<TransferData, RequestError>> {
        let parsed: Vec<Result<NewTransfer, ErrorCode>> = {
            let registry = self
                .assets
                .registry()
                .read()
                .unwrap_or_else(|e| e.into_inner());
            requests.iter().map(|r| r.parse(&registry)).collect()
        };
        let keys: Vec<_> = parsed
            .iter()
            .map(|p| {
                p.as_ref()
                    .ok()
                    .map(|t| (t.user_id, t.cid.as_deref(), t.fingerprint()))
            })
            .collect();
        let slots = cid_slots(&keys);
        let mut answers: Vec<Option<Result<TransferData, RequestError>>> =
            requests.iter().map(|_| None).collect();
        let repeats = self.cid_repeats(&parsed, &slots).await;
        let mut accepted = Vec::new();
        for (i, ((request, parsed), repeat)) in requests.iter().zip(parsed).zip(repeats).enumerate()
        {
            let gated = match (parsed, slots[i], repeat) {
                (Err(code), _, _) => self
                    .refused_values(request, code)
                    .await
                    .map(Gated::Answered),
                (Ok(_), Slot::SameAs(_), _) => continue,
                (Ok(_), Slot::Reused, _) => {
                    Err(RequestError::Refused(ErrorCode::IdempotencyKeyReused))
                }
                (Ok(_), Slot::Own, Some(Ok(Some(existing)))) => Ok(Gated::Answered(existing)),
                (Ok(_), Slot::Own, Some(Err(e))) => Err(RequestError::Coordinator(e)),
                (Ok(transfer), Slot::Own, _) => self.admit(transfer).await,
            };
            match gated {
                Ok(Gated::Answered(existing)) => answers[i] = Some(Ok(existing)),
                Ok(Gated::Accepted(transfer)) => accepted.push((i, transfer)),
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        for (i, answer) in self.create_accepted(accepted).await {
            answers[i] = Some(answer);
        }
        for (i, slot) in slots.iter().enumerate() {
            if let Slot::SameAs(j) = *slot {
                answers[i] = Some(same_answer(answers[j].as_ref(), j));
            }
        }
        answers
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| {
                    Err(RequestError::Coordinator(CoordinatorError::invariant(
                        "bulk answer missing",
                    )))
                })
            })
            .collect()
    }

    /// The cid repeats of a batch's own items, looked up together (independent reads); the
    /// gates after them run in request order, so the per-second gate counts items in order.
    async fn cid_repeats(
        &self,
        parsed: &[Result<NewTransfer, ErrorCode>],
        slots: &[Slot],
    ) -> Vec<Option<Result<Option<TransferData>, CoordinatorError>>> {
        futures_util::future::join_all(parsed.iter().zip(slots).map(|(parsed, slot)| async move {
            match (parsed, slot) {
                (Ok(transfer), Slot::Own) => {
                    Some(self.coordinator.existing_for_cid(transfer).await)
                }
                _ => None,
            }
        }))
        .await
    }

    /// The accepted items of a batch (index, transfer) created and driven together, in a task a
    /// hung-up client cannot cancel (between a step's commit and its calls): each index with
    /// its answer.
    async fn create_accepted(
        &self,
        accepted: Vec<(usize, NewTransfer)>,
    ) -> Vec<(usize, Result<TransferData, RequestError>)> {
        let (positions, transfers): (Vec<usize>, Vec<NewTransfer>) = accepted.into_iter().unzip();
        let coordinator = self.coordinator.clone();
        let driven = tokio::spawn(
            async move {
                let mut checked = Vec::with_capacity(transfers.len());
                let mut refused = Vec::new();
                for (k, transfer) in transfers.into_iter().enumerate() {
                    match coordinator.validate(&transfer) {
                        Ok(()) => checked.push(transfer),
                        Err(e) => refused.push((k, e)),
                    }
                }
                let mut driven = coordinator
                    .create_and_drive_many(checked, crate::bulk::Route::Batch)
                    .await;
                // Ascending, so each refusal goes back to its own position.
                for (k, e) in refused {
                    driven.insert(k, Err(e));
                }
                driven
            }
            .in_current_span(),
        )
        .await;
        match driven {
            Ok(driven) => positions
                .into_iter()
                .zip(driven)
                .map(|(i, answer)| (i, answer.map_err(RequestError::Coordinator)))
                .collect(),
            Err(e) => {
                let cause = CoordinatorError::outcome_unknown(format!("bulk transfer task: {e}"));
                positions
                    .into_iter()
                    .map(|i| (i, Err(RequestError::Coordinator(cause.clone()))))
                    .collect()
            }
        }
    }

    /// A request refused for its values: its original transfer when it is a cid repeat refused
    /// only for a changed asset setting, else the refusal.
    async fn refused_values(
        &self,
        request: &TransferRequest,
        code: ErrorCode,
    ) -> Result<TransferData, RequestError> {
        if depends_on_settings(code) {
            if let Some(existing) = self.repeat_of_earlier(request).await {
                return Ok(existing);
            }
        }
        Err(RequestError::Refused(code))
    }

    /// The gates after a request's values, in contract §5.5's order (steps 7 to 10): a cid repeat answered with its
    /// original transfer whatever else changed (rate, halt), the per-second gate (one transfer
    /// counted), the halt (MON-003), the FUNDING target's existence.
    async fn gate(&self, transfer: NewTransfer) -> Result<Gated, RequestError> {
        if let Some(existing) = self.coordinator.existing_for_cid(&transfer).await? {
            return Ok(Gated::Answered(existing));
        }
        self.admit(transfer).await
    }

    /// The gates after the cid repeat: the per-second gate, the halt, the FUNDING target.
    async fn admit(&self, transfer: NewTransfer) -> Result<Gated, RequestError> {
        // Contract §5.5, step 8: counted only for requests that passed the checks
        // before it.
        self.rate
            .admit(transfer.user_id)
            .map_err(RequestError::Refused)?;
        // Checked after the request's own checks, so a bad request gets its own code.
        if self
            .halt
            .is_halted(self.stores.halt.as_ref())
            .await
            .map_err(RequestError::HaltUnknown)?
        {
            return Err(RequestError::Refused(ErrorCode::ServiceHalted));
        }
        // A FUNDING target must exist (SPOT is created lazily). Checked before anything is
        // created, so the refusal costs no withdraw and refund; the funding adapter still
        // refuses on its own if the account is missing when the deposit runs.
        if transfer.to == AccountType::Funding {
            let exists = self
                .funding
                .account_exists(transfer.user_id, &transfer.asset)
                .await
                .map_err(RequestError::Funding)?;
            if !exists {
                return Err(RequestError::Refused(ErrorCode::TargetAccountNotFound));
            }
        }
        Ok(Gated::Accepted(transfer))
    }

    /// The original transfer of a cid repeat with the same body; `None` in every other case.
    async fn repeat_of_earlier(&self, request: &TransferRequest) -> Option<TransferData> {
        let repeat = request.as_repeat()?;
        self.coordinator
            .existing_for_cid(&repeat)
            .await
            .ok()
            .flatten()
    }

    /// Runs the conservation check (`Mode::Incremental`: from the stored checkpoint, which
    /// it advances; `Mode::Full`: from the start of history), records it, and on a violation
    /// raises the CRITICAL alert and halts new transfers. Returns the report and whether
    /// transfers are halted now.
    pub async fn audit(&self, mode: Mode) -> Result<(InvariantReport, bool), CheckError> {
        let checked = self.audit_and_enforce(mode).await;
        self.halt.invalidate();
        checked
    }

    async fn audit_and_enforce(&self, mode: Mode) -> Result<(InvariantReport, bool), CheckError> {
        let records = self.stores.history.as_ref();
        let started = std::time::Instant::now();
        let report = match mode {
            Mode::Incremental => audit::check_incremental(self.audit_sources()).await?,
            Mode::Full => audit::check_full(self.audit_sources()).await?,
        };
        let took = started.elapsed();
        let report_id = records.store_report(&report).await?;
        if let Err(e) = records.record_run(&report, took, Some(report_id)).await {
            tracing::warn!(error = %e, "could not record the check in the run history");
        }
        if !report.ok {
            tracing::error!(
                alert = "CRITICAL",
                code = "FUND_CONSERVATION_VIOLATED",
                report = %serde_json::to_value(&report).unwrap_or_default(),
                "CRITICAL: fund conservation violated; new transfers are halted until an admin clears it"
            );
            for d in &report.disagreements {
                tracing::error!(
                    alert = "CRITICAL",
                    code = "RECORDS_DISAGREE",
                    req_id = %d.req_id,
                    state = d.state.as_deref().unwrap_or("none"),
                    problem = %d.problem,
                    "CRITICAL RECORDS_DISAGREE: req_id {}: {}",
                    d.req_id,
                    d.problem
                );
            }
            self.stores.halt.halt("fund conservation violated").await?;
        }
        let halted = self.stores.halt.is_halted().await?;
        Ok((report, halted))
    }

    /// What the conservation check reads, as this ledger is wired.
    pub fn audit_sources(&self) -> audit::Sources<'_> {
        audit::Sources {
            log: self.stores.events.as_ref(),
            funding: self.funding.as_ref(),
            spot: self.spot.as_ref(),
            checkpoints: self.stores.checkpoints.as_ref(),
        }
    }

    /// Runs the incremental check every `interval` forever; the edge's start-up runs this. A
    /// check that cannot decide (spot-core down, checkpoint unreadable, PostgreSQL gone) never
    /// halts, but it is an alert, not only a log line: `CRITICAL AUDIT_UNAVAILABLE` once per
    /// episode (a warning at each further failure), and `audit_status` (the `/metrics` figures
    /// `ledger_audit_up`, `ledger_audit_failures_total`) records every run.
    pub async fn audit_periodically(self, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick fires at once; skip it so a process starting up is not checked
        // half-wired.
        ticker.tick().await;
        let mut unavailable = false;
        loop {
            ticker.tick().await;
            let started = std::time::Instant::now();
            let outcome = self.audit(Mode::Incremental).await;
            let took = started.elapsed();
            let recorded = match &outcome {
                Ok((report, _)) => {
                    if report.ok {
                        tracing::debug!(seconds = took.as_secs_f64(), "fund conservation holds");
                    }
                    if unavailable {
                        tracing::info!("the periodic fund-conservation check runs again");
                        unavailable = false;
                    }
                    self.stores.history.record_decided(took).await
                }
                Err(e) => {
                    let detail = crate::error_chain(e);
                    if unavailable {
                        tracing::warn!(error = %detail, "fund-conservation check still cannot run");
                    } else {
                        tracing::error!(
                            alert = "CRITICAL",
                            code = "AUDIT_UNAVAILABLE",
                            error = %detail,
                            "CRITICAL AUDIT_UNAVAILABLE: the periodic fund-conservation check cannot run; money is not being checked"
                        );
                        unavailable = true;
                    }
                    self.stores.history.record_failed(took, &detail).await
                }
            };
            if let Err(e) = recorded {
                tracing::warn!(error = %e, "could not record the audit's status");
            }
        }
    }

    /// Whether new transfers are halted now, and why (read from the store, not cached).
    pub async fn halt_status(&self) -> Result<(bool, Option<String>), StoreError> {
        self.stores.halt.status().await
    }

    /// An admin lifts the halt (after looking into the cause).
    pub async fn clear_halt(&self, admin: UserId) -> Result<(), StoreError> {
        let cleared = self.stores.halt.clear(admin).await;
        self.halt.invalidate();
        cleared?;
        tracing::warn!(%admin, "transfer halt cleared by an admin");
        Ok(())
    }

    /// Credits FUNDING from outside, once per `external_id`.
    pub async fn external_deposit(
        &self,
        external_id: &str,
        user: UserId,
        asset: &AssetSymbol,
        amount: Amount,
    ) -> Result<DepositReceipt, FundingError> {
        self.funding
            .external_deposit(external_id, user, asset, amount)
            .await
    }

    /// Sets an existing FUNDING account's status.
    pub async fn set_funding_status(
        &self,
        user: UserId,
        asset: &AssetSymbol,
        status: AccountStatus,
    ) -> Result<(), FundingError> {
        self.funding.set_status(user, asset, status).await
    }

    /// Sets a SPOT account's status in spot-core.
    pub async fn set_spot_status(
        &self,
        user: UserId,
        asset: &AssetSymbol,
        status: AccountStatus,
    ) -> Result<(), SpotError> {
        self.spot.set_status(user, asset, status).await
    }

    /// One transfer's events, in order, from the event log itself.
    pub async fn transfer_events(&self, req_id: &ReqId) -> Result<Vec<LoggedEvent>, LogError> {
        self.stores.events.transfer_events(req_id).await
    }
}
