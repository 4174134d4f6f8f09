//! A batch's creation: each own item's cid claimed and daily limits charged, then every
//! transfer created (its `TransferCreated` and `SourceWithdrawStarted`) in one append, either in
//! the same durable write as its claim and charge (`TransferLog::create_many`, ADR 0022) or
//! after them in separate steps.

use domain::invariant;

use super::{Lane, Slot};
use crate::coordinator::{Context, Coordinator, CoordinatorError, NewTransfer};
use crate::funded::Routed;
use crate::ports::{CidClaim, Creation, CreationOutcome, FundedOutcome};
use crate::submit::{CidKey, Created};
use domain::TransferData;

/// A copy of a context (it holds no snapshot).
fn copy(ctx: &Context) -> Context {
    Context {
        aggregate_id: ctx.aggregate_id.clone(),
        aggregate: ctx.aggregate.clone(),
        current_sequence: ctx.current_sequence,
        current_snapshot: None,
    }
}

/// A staged creation (its item's index, its req_id, its context) with what its write came to.
type Staged = (
    (usize, domain::ReqId, Context),
    Result<CreationOutcome, CoordinatorError>,
);

impl Coordinator {
    /// Creates the own items of a batch, each in the same durable write as its cid's claim and
    /// its daily charge (`TransferLog::create_many`, ADR 0022): the created ones as lanes, the
    /// others answered in `answers`. An item whose key someone claimed first takes the separate
    /// steps alone (the claim found: a repeat, a reused key or an orphan claim). `None` when
    /// the log cannot create that way; nothing was written then.
    pub(super) async fn create_together(
        &self,
        requests: &[NewTransfer],
        slots: &[Slot],
        answers: &mut [Option<Result<TransferData, CoordinatorError>>],
    ) -> Option<Vec<Lane>> {
        let day = crate::daily::day_of(self.clock.now());
        let (staged, creations) = self.stage_creations(requests, slots, answers).await;
        invariant!(
            staged.len() == creations.len(),
            "{} creations staged for {} items",
            creations.len(),
            staged.len()
        );
        let indices: Vec<usize> = staged.iter().map(|(i, _, _)| *i).collect();
        let Some(written) = self.write_creations(staged, creations, day).await? else {
            for i in indices {
                answers[i] = Some(Err(CoordinatorError::invariant("the log lost an answer")));
            }
            return Some(Vec::new());
        };
        let mut lanes = Vec::with_capacity(written.len());
        let mut alone = Vec::new();
        for ((i, req_id, ctx), outcome) in written {
            let created = match outcome {
                Ok(CreationOutcome::Appended(current_sequence)) => Ok(Context {
                    current_sequence,
                    ..ctx
                }),
                Ok(CreationOutcome::KeyTaken) => {
                    alone.push(i);
                    continue;
                }
                Ok(CreationOutcome::Refused(code)) => {
                    answers[i] = Some(Err(CoordinatorError::Refused(code)));
                    continue;
                }
                Err(e) => Err(e),
            };
            // Nothing was charged apart from the creation, so there is no charge to give back.
            match self
                .settle_creation(&requests[i], req_id, None, created)
                .await
            {
                Ok(Created::New(ctx)) => lanes.push(Lane { index: i, ctx }),
                Ok(Created::Answered(existing)) => answers[i] = Some(Ok(existing)),
                Ok(Created::ClaimMoved) => alone.push(i),
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        for i in alone {
            answers[i] = Some(self.create_and_drive_alone(requests[i].clone()).await);
        }
        Some(lanes)
    }

    /// Writes the staged creations with their claims and charges (`create_many`), a FUNDING
    /// source's with its withdraw and its outcome too (`commit_funded`, ADR 0024), both at
    /// once: each staged creation with what it came to (a funded one's context advanced past
    /// its recorded outcome). `None` when the log cannot create that way (nothing written);
    /// `Some(None)` when it answered short.
    async fn write_creations(
        &self,
        staged: Vec<(usize, domain::ReqId, Context)>,
        creations: Vec<Creation>,
        day: chrono::NaiveDate,
    ) -> Option<Option<Vec<Staged>>> {
        let mut plain = Vec::new();
        let mut plain_creations = Vec::new();
        let mut funded = Vec::new();
        let mut items = Vec::new();
        for (at, creation) in staged.into_iter().zip(creations) {
            match self.funded(&at.2, creation) {
                Routed::Funded(item) => {
                    funded.push(at);
                    items.push(item);
                }
                Routed::Plain(creation) => {
                    plain.push(at);
                    plain_creations.push(creation);
                }
            }
        }
        let (written, made) = futures_util::future::join(
            async {
                match plain_creations.is_empty() {
                    true => Some(Vec::new()),
                    false => {
                        self.log
                            .create_many(plain_creations, &self.daily, day)
                            .await
                    }
                }
            },
            async {
                match items.is_empty() {
                    true => Some(Vec::new()),
                    false => self.log.commit_funded(&items, &self.daily, day).await,
                }
            },
        )
        .await;
        let (written, made) = (written?, made?);
        if written.len() != plain.len() || made.len() != funded.len() {
            return Some(None);
        }
        let mut all: Vec<Staged> = plain.into_iter().zip(written).collect();
        for (((i, req_id, ctx), item), outcome) in funded.into_iter().zip(&items).zip(made) {
            let outcome = match outcome {
                Ok(FundedOutcome::KeyTaken) => Ok(CreationOutcome::KeyTaken),
                Ok(FundedOutcome::Refused(code)) => Ok(CreationOutcome::Refused(code)),
                Ok(outcome) => match Self::settle_funded(copy(&ctx), item, &outcome) {
                    Some(Ok(settled)) => {
                        let sequence = settled.current_sequence;
                        all.push((
                            (i, req_id, settled),
                            Ok(CreationOutcome::Appended(sequence)),
                        ));
                        continue;
                    }
                    Some(Err(e)) => Err(e),
                    None => Err(CoordinatorError::invariant("a funded creation unanswered")),
                },
                Err(e) => Err(e),
            };
            all.push(((i, req_id, ctx), outcome));
        }
        all.sort_by_key(|((i, _, _), _)| *i);
        Some(Some(all))
    }

    /// Each own item's creation staged on the empty aggregate, with its claim and its charge:
    /// (index, req_id, context) and the creations to write, in the same order; an item the
    /// aggregate refuses is answered in `answers`.
    async fn stage_creations(
        &self,
        requests: &[NewTransfer],
        slots: &[Slot],
        answers: &mut [Option<Result<TransferData, CoordinatorError>>],
    ) -> (Vec<(usize, domain::ReqId, Context)>, Vec<Creation>) {
        let charged = !self.daily.is_unlimited();
        let mut staged = Vec::new();
        let mut creations = Vec::new();
        for i in (0..requests.len()).filter(|&i| slots[i] == Slot::Own) {
            let request = &requests[i];
            // Generated as late as possible (`horizon.rs`): just before the write.
            let req_id = self.clock.req_id();
            let (ctx, command) = self.creation(req_id, request);
            match self.stage_steps(ctx, command, true).await {
                Ok((ctx, commit)) => {
                    let claim = request.cid.clone().map(|cid| CidClaim {
                        user: request.user_id,
                        cid,
                        req_id,
                        fingerprint: request.fingerprint(),
                    });
                    let charge = charged.then(|| request.charge());
                    creations.push(Creation {
                        commit,
                        claim,
                        charge,
                    });
                    staged.push((i, req_id, ctx));
                }
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        (staged, creations)
    }

    /// Claims each own item's cid and charges its daily limits: the creations to make (index,
    /// req_id, day charged); the others answered (a repeat found, a refusal) in `answers`.
    pub(super) async fn claim_and_charge(
        &self,
        requests: &[NewTransfer],
        slots: &[Slot],
        answers: &mut [Option<Result<TransferData, CoordinatorError>>],
    ) -> Vec<(usize, domain::ReqId, Option<chrono::NaiveDate>)> {
        // The cid claims together, in one statement: each key is its own (a key used twice in
        // the batch is one slot).
        let own: Vec<usize> = (0..requests.len())
            .filter(|&i| slots[i] == Slot::Own)
            .collect();
        let keyed = own.iter().copied().zip(self.cid_keys(requests, &own).await);
        // Then the charges, all at once and in request order, so a daily limit running out
        // refuses the batch's last items, as the same requests one after another would be.
        let mut claimed = Vec::new();
        for (i, keyed) in keyed {
            match keyed {
                Ok(CidKey::Answered(existing)) => answers[i] = Some(Ok(existing)),
                Ok(CidKey::Key(key)) => claimed.push((i, key)),
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        let indices: Vec<usize> = claimed.iter().map(|&(i, _)| i).collect();
        let charged = self.reserve_daily_many(requests, &indices).await;
        let mut creations = Vec::new();
        for ((i, key), charge) in claimed.into_iter().zip(charged) {
            match charge {
                // Generated as late as possible (`horizon.rs`): after the claims and charges.
                Ok(reservation) => {
                    let req_id = key.unwrap_or_else(|| self.clock.req_id());
                    creations.push((i, req_id, reservation));
                }
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        creations
    }

    /// Creates the prepared transfers in one append; the created ones are returned as lanes, the
    /// others answered (a repeat found, a refusal) in `answers`. A creation whose cid claim was
    /// re-keyed meanwhile (rare: it took half a retention) takes the single path alone.
    pub(super) async fn create_many(
        &self,
        requests: &[NewTransfer],
        creations: Vec<(usize, domain::ReqId, Option<chrono::NaiveDate>)>,
        answers: &mut [Option<Result<TransferData, CoordinatorError>>],
    ) -> Vec<Lane> {
        let steps = creations
            .iter()
            .map(|&(i, req_id, _)| {
                let (ctx, command) = self.creation(req_id, &requests[i]);
                (ctx, command, true)
            })
            .collect();
        let created = self.commit_many(steps).await;
        invariant!(
            created.len() == creations.len(),
            "{} creations appended, {} answered",
            creations.len(),
            created.len()
        );
        let mut lanes = Vec::with_capacity(created.len());
        for ((i, req_id, reservation), created) in creations.into_iter().zip(created) {
            let request = &requests[i];
            match self
                .settle_creation(request, req_id, reservation, created)
                .await
            {
                Ok(Created::New(ctx)) => lanes.push(Lane { index: i, ctx }),
                Ok(Created::Answered(existing)) => answers[i] = Some(Ok(existing)),
                Ok(Created::ClaimMoved) => {
                    answers[i] = Some(self.create_and_drive_alone(request.clone()).await);
                }
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        lanes
    }
}
