//! The shared in-memory event log (`application::testkit::MemLog`), under the simulation's
//! hook, keeps `TransferLog`'s contract: the version check, the claim guard, and `append_many`
//! answering each commit on its own.

use std::sync::{Arc, Mutex};

use application::testkit::MemLog;
use application::{ClientKey, Commit, CoordinatorError, TransferLog};
use chrono::DateTime;
use domain::{AccountType, Amount, AssetSymbol, ReqId, TransferEvent, UserId};
use sim::exec::{Executor, Role, Rt, Step};
use sim::ports::Sim;
use sim::world::World;
use spot_core::assets::{Assets, DEFAULT_ASSETS_JSON};
use spot_core::engine::Engine;

fn creation(id: &ReqId, cid: Option<&str>) -> Commit {
    let at = DateTime::from_timestamp_millis(0).unwrap();
    Commit {
        aggregate_id: id.to_string(),
        expected_sequence: 0,
        events: vec![
            TransferEvent::TransferCreated {
                req_id: *id,
                user_id: UserId::new(1).unwrap(),
                from: AccountType::Funding,
                to: AccountType::Spot,
                asset: AssetSymbol::parse("USDT").unwrap(),
                amount: Amount::parse("1").unwrap(),
                cid: cid.map(str::to_owned),
                at,
            },
            TransferEvent::SourceWithdrawStarted { at },
        ],
        owner: Some(UserId::new(1).unwrap()),
    }
}

type Answers = Arc<Mutex<Vec<Result<usize, CoordinatorError>>>>;

fn appended(
    commits: Vec<Commit>,
    claims: &[(&str, &ReqId)],
) -> Vec<Result<usize, CoordinatorError>> {
    let rt = Rt::new(0, 1_000);
    let engine = Engine::new(Assets::parse(DEFAULT_ASSETS_JSON).unwrap());
    let world = World::new(engine, 1_000);
    for (cid, id) in claims {
        let claim = ClientKey {
            req_id: **id,
            fingerprint: "fp".to_owned(),
        };
        let key = (UserId::new(1).unwrap(), (*cid).to_owned());
        world.rows.lock().claims.insert(key, claim);
    }
    let sim = Sim::new(rt.clone(), world);
    let log = MemLog(sim.store.clone());
    let answers: Answers = Arc::default();
    let out = answers.clone();
    rt.spawn(1, Role::System, async move {
        *out.lock().unwrap() = log.append_many(commits).await;
    });
    let mut exec = Executor::new(rt);
    while exec.step() != Step::Idle {}
    let answers = answers.lock().unwrap().clone();
    answers
}

#[test]
fn append_many_answers_each_commit_and_a_conflict_refuses_only_its_own() {
    let (a, b) = (ReqId::from_parts(1, 1), ReqId::from_parts(1, 2));
    let answers = appended(
        vec![creation(&a, None), creation(&b, None), creation(&a, None)],
        &[],
    );
    assert_eq!(answers, [Ok(2), Ok(2), Err(CoordinatorError::Conflict)]);
}

#[test]
fn a_creation_under_a_cid_commits_only_while_the_claim_names_it() {
    let (a, b) = (ReqId::from_parts(1, 1), ReqId::from_parts(1, 2));
    let answers = appended(
        vec![creation(&a, Some("k")), creation(&b, Some("k"))],
        &[("k", &b)],
    );
    assert_eq!(answers, [Err(CoordinatorError::Conflict), Ok(2)]);
}
