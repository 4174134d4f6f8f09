//! Two processes at once on one transfer (`Scenario::when_together`): the first pauses at a call,
//! the second runs, then the first goes on. The event log's version check lets one writer win;
//! the other stops without acting, and each movement is applied once.

use application::testkit::World;
use application::CoordinatorError;
use domain::{ReqId, TransferData, TransferState as S};

use crate::prelude::*;

/// The one transfer in the world (read when the process that needs it runs).
fn only_transfer(world: &World) -> ReqId {
    *world
        .store
        .rows()
        .streams
        .keys()
        .next()
        .expect("a transfer")
}

#[test]
fn two_resumes_at_once_apply_the_withdraw_once_and_one_stops_on_a_conflict() {
    let given = Scenario::new()
        .given_transfer_in(S::SourcePending)
        .given_fault(FUNDING, Call::Withdraw, AccountFault::Pause);
    let then = given.when_together(2, |_, c| async move {
        c.resume(&given_req_id()).await.map(|r| r.data.state)
    });
    assert_eq!(
        then.answer(),
        &[
            Some(Err(CoordinatorError::Conflict)),
            Some(Ok(S::Committed))
        ]
    );
    then.appended(&[SourceWithdrawn, TargetDepositStarted, TransferCommitted])
        .funding_calls(&[
            Call::Lookup(Operation::Withdraw),
            Call::Withdraw,
            Call::Lookup(Operation::Withdraw),
            Call::Withdraw,
        ])
        .balances("90", Some("10"));
}

#[test]
fn the_same_cid_twice_at_once_creates_one_transfer_and_both_answer_it() {
    let given =
        Scenario::new().given_store_fault(StoreCall::Append(S::SourcePending), StoreFault::Pause);
    let then = given.when_together(2, |_, c| async move { c.submit(request(Some("c1"))).await });
    let answers: Vec<_> = then
        .answer()
        .iter()
        .map(|a| {
            a.clone()
                .expect("answered")
                .map(|d: TransferData| (d.req_id, d.state))
        })
        .collect();
    let one = only_transfer(&given.world);
    assert_eq!(answers, [Ok((one, S::Committed)), Ok((one, S::Committed))]);
    then.appended(&HAPPY)
        .funding_calls(&[Call::Withdraw])
        .spot_calls(&[Call::Deposit])
        .balances("90", Some("10"));
}

#[test]
fn a_worker_finishing_a_request_s_transfer_first_is_what_the_request_answers() {
    // The request pauses at its deposit; a worker resumes the transfer (looks up, deposits,
    // commits); the request's deposit is answered from the journal and its commit conflicts: it
    // answers the state the worker committed.
    let given = Scenario::new().given_fault(SPOT, Call::Deposit, AccountFault::Pause);
    let world = given.world.clone();
    let then = given.when_together(2, |i, c| {
        let world = world.clone();
        async move {
            if i == 0 {
                c.submit(request(None)).await.map(|d| d.state)
            } else {
                let req_id = only_transfer(&world);
                c.resume(&req_id).await.map(|r| r.data.state)
            }
        }
    });
    assert_eq!(
        then.answer(),
        &[Some(Ok(S::Committed)), Some(Ok(S::Committed))]
    );
    then.appended(&HAPPY)
        .spot_calls(&[
            Call::Deposit,
            Call::Lookup(Operation::Deposit),
            Call::Deposit,
        ])
        .balances("90", Some("10"));
}
