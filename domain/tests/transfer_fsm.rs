//! Given/when/then tests of the Transfer aggregate: every legal transition and every refusal.

use chrono::{DateTime, TimeZone, Utc};
use cqrs_es::test::TestFramework;
use domain::{
    manual_resolution_target, AccountType, Amount, AssetSymbol, ReqId, Resolution, StepOutcome,
    Transfer, TransferCommand, TransferError, TransferEvent, TransferState, UserId,
};

type Fw = TestFramework<Transfer>;

fn t(s: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap()
}

fn req() -> ReqId {
    ReqId::parse("01JFVQ2X8Z0Y1M3N4P5R6S7T8V").unwrap()
}

fn created() -> TransferEvent {
    TransferEvent::TransferCreated {
        req_id: req(),
        user_id: UserId::new(7).unwrap(),
        from: AccountType::Funding,
        to: AccountType::Spot,
        asset: AssetSymbol::parse("USDT").unwrap(),
        amount: Amount::parse("10.5").unwrap(),
        cid: None,
        at: t(0),
    }
}

fn create_cmd(from: AccountType, to: AccountType) -> TransferCommand {
    TransferCommand::Create {
        req_id: req(),
        user_id: UserId::new(7).unwrap(),
        from,
        to,
        asset: AssetSymbol::parse("USDT").unwrap(),
        amount: Amount::parse("10.5").unwrap(),
        cid: None,
        at: t(0),
    }
}

fn refused() -> StepOutcome {
    StepOutcome::Refused {
        code: "INSUFFICIENT_BALANCE".into(),
        message: "no".into(),
    }
}

fn history_to(state: TransferState) -> Vec<TransferEvent> {
    let mut h = vec![created()];
    let steps: Vec<TransferEvent> = match state {
        TransferState::Init => vec![],
        TransferState::SourcePending => vec![TransferEvent::SourceWithdrawStarted { at: t(1) }],
        TransferState::SourceDone => vec![
            TransferEvent::SourceWithdrawStarted { at: t(1) },
            TransferEvent::SourceWithdrawn { at: t(2) },
        ],
        TransferState::TargetPending => vec![
            TransferEvent::SourceWithdrawStarted { at: t(1) },
            TransferEvent::SourceWithdrawn { at: t(2) },
            TransferEvent::TargetDepositStarted { at: t(3) },
        ],
        TransferState::Committed => vec![
            TransferEvent::SourceWithdrawStarted { at: t(1) },
            TransferEvent::SourceWithdrawn { at: t(2) },
            TransferEvent::TargetDepositStarted { at: t(3) },
            TransferEvent::TransferCommitted { at: t(4) },
        ],
        TransferState::Failed => vec![
            TransferEvent::SourceWithdrawStarted { at: t(1) },
            TransferEvent::TransferFailed {
                code: "INSUFFICIENT_BALANCE".into(),
                message: "no".into(),
                at: t(2),
            },
        ],
        TransferState::Compensating => vec![
            TransferEvent::SourceWithdrawStarted { at: t(1) },
            TransferEvent::SourceWithdrawn { at: t(2) },
            TransferEvent::TargetDepositStarted { at: t(3) },
            TransferEvent::CompensationStarted {
                code: "ACCOUNT_DISABLED".into(),
                message: "no".into(),
                at: t(4),
            },
        ],
        TransferState::RolledBack => vec![
            TransferEvent::SourceWithdrawStarted { at: t(1) },
            TransferEvent::SourceWithdrawn { at: t(2) },
            TransferEvent::TargetDepositStarted { at: t(3) },
            TransferEvent::CompensationStarted {
                code: "ACCOUNT_DISABLED".into(),
                message: "no".into(),
                at: t(4),
            },
            TransferEvent::TransferRolledBack { at: t(5) },
        ],
    };
    h.extend(steps);
    h
}

fn all_commands() -> Vec<TransferCommand> {
    vec![
        create_cmd(AccountType::Funding, AccountType::Spot),
        TransferCommand::StartSourceWithdraw { at: t(9) },
        TransferCommand::RecordSourceOutcome {
            outcome: StepOutcome::Succeeded,
            at: t(9),
        },
        TransferCommand::RecordSourceOutcome {
            outcome: refused(),
            at: t(9),
        },
        TransferCommand::StartTargetDeposit { at: t(9) },
        TransferCommand::RecordTargetOutcome {
            outcome: StepOutcome::Succeeded,
            at: t(9),
        },
        TransferCommand::RecordTargetOutcome {
            outcome: refused(),
            at: t(9),
        },
        TransferCommand::RecordRefund { at: t(9) },
        resolve_cmd(Resolution::Applied),
        resolve_cmd(Resolution::NotApplied),
    ]
}

fn resolve_cmd(resolution: Resolution) -> TransferCommand {
    TransferCommand::ManuallyResolve {
        resolution,
        operator: "admin:1".into(),
        reason: "confirmed with the spot-core journal".into(),
        at: t(9),
    }
}

fn resolved(resolution: Resolution, from: TransferState, to: TransferState) -> TransferEvent {
    TransferEvent::TransferManuallyResolved {
        resolution,
        from_state: from,
        to_state: to,
        operator: "admin:1".into(),
        reason: "confirmed with the spot-core journal".into(),
        at: t(9),
    }
}

/// Each manual resolution the table allows, given/when/then: the event records who and why and
/// moves exactly to the state the confirmed fact proves.
#[test]
fn manual_resolutions_move_to_the_state_the_confirmed_fact_proves() {
    use Resolution::{Applied, NotApplied};
    use TransferState as S;
    let cases = [
        (S::SourcePending, Applied, S::SourceDone),
        (S::SourcePending, NotApplied, S::Failed),
        (S::TargetPending, Applied, S::Committed),
        (S::TargetPending, NotApplied, S::Compensating),
        (S::Compensating, Applied, S::RolledBack),
    ];
    for (from, resolution, to) in cases {
        Fw::with(())
            .given(history_to(from))
            .when(resolve_cmd(resolution))
            .then_expect_events(vec![resolved(resolution, from, to)]);
        assert_eq!(manual_resolution_target(from, resolution), Some(to));
    }
}

#[test]
fn manual_resolution_is_refused_where_nothing_is_pending_or_the_fact_proves_nothing() {
    use TransferState as S;
    for (state, resolution) in [
        (S::Init, Resolution::Applied),
        (S::Init, Resolution::NotApplied),
        (S::SourceDone, Resolution::Applied),
        (S::SourceDone, Resolution::NotApplied),
        (S::Compensating, Resolution::NotApplied),
    ] {
        Fw::with(())
            .given(history_to(state))
            .when(resolve_cmd(resolution))
            .then_expect_error(TransferError::IllegalTransition {
                state,
                command: "ManuallyResolve",
            });
    }
    for state in [S::Committed, S::Failed, S::RolledBack] {
        Fw::with(())
            .given(history_to(state))
            .when(resolve_cmd(Resolution::Applied))
            .then_expect_error(TransferError::Terminal { state });
    }
}

#[test]
fn manual_resolution_needs_an_operator_and_a_reason() {
    Fw::with(())
        .given(history_to(TransferState::TargetPending))
        .when(TransferCommand::ManuallyResolve {
            resolution: Resolution::Applied,
            operator: "admin:1".into(),
            reason: "  ".into(),
            at: t(9),
        })
        .then_expect_error(TransferError::Invalid(domain::ErrorCode::BadRequest));
    Fw::with(())
        .given(history_to(TransferState::TargetPending))
        .when(TransferCommand::ManuallyResolve {
            resolution: Resolution::Applied,
            operator: String::new(),
            reason: "seen in the journal".into(),
            at: t(9),
        })
        .then_expect_error(TransferError::Invalid(domain::ErrorCode::BadRequest));
}

/// A manual FAILED carries the operator's reason as its cause, and the folded state follows the
/// event's `to_state`.
#[test]
fn a_manual_resolution_folds_into_state_and_cause() {
    use cqrs_es::Aggregate;
    let mut transfer = Transfer::default();
    for e in history_to(TransferState::SourcePending) {
        transfer.apply(e);
    }
    transfer.apply(resolved(
        Resolution::NotApplied,
        TransferState::SourcePending,
        TransferState::Failed,
    ));
    let data = transfer.data.expect("created");
    assert_eq!(data.state, TransferState::Failed);
    assert_eq!(
        data.failure,
        Some((
            "MANUALLY_RESOLVED".to_owned(),
            "confirmed with the spot-core journal".to_owned()
        ))
    );
}

#[test]
fn create_from_nothing_is_init() {
    Fw::with(())
        .given_no_previous_events()
        .when(create_cmd(AccountType::Funding, AccountType::Spot))
        .then_expect_events(vec![created()]);
}

#[test]
fn create_refuses_same_account_and_unsupported_types() {
    Fw::with(())
        .given_no_previous_events()
        .when(create_cmd(AccountType::Spot, AccountType::Spot))
        .then_expect_error(TransferError::Invalid(domain::ErrorCode::SameAccount));
    Fw::with(())
        .given_no_previous_events()
        .when(create_cmd(AccountType::Funding, AccountType::Future))
        .then_expect_error(TransferError::Invalid(
            domain::ErrorCode::UnsupportedAccountType,
        ));
}

#[test]
fn commands_before_create_are_refused() {
    Fw::with(())
        .given_no_previous_events()
        .when(TransferCommand::StartSourceWithdraw { at: t(1) })
        .then_expect_error(TransferError::NotCreated);
}

#[test]
fn init_to_source_pending() {
    Fw::with(())
        .given(history_to(TransferState::Init))
        .when(TransferCommand::StartSourceWithdraw { at: t(1) })
        .then_expect_events(vec![TransferEvent::SourceWithdrawStarted { at: t(1) }]);
}

#[test]
fn source_pending_to_source_done_on_success() {
    Fw::with(())
        .given(history_to(TransferState::SourcePending))
        .when(TransferCommand::RecordSourceOutcome {
            outcome: StepOutcome::Succeeded,
            at: t(2),
        })
        .then_expect_events(vec![TransferEvent::SourceWithdrawn { at: t(2) }]);
}

#[test]
fn source_pending_to_failed_on_explicit_refusal() {
    Fw::with(())
        .given(history_to(TransferState::SourcePending))
        .when(TransferCommand::RecordSourceOutcome {
            outcome: refused(),
            at: t(2),
        })
        .then_expect_events(vec![TransferEvent::TransferFailed {
            code: "INSUFFICIENT_BALANCE".into(),
            message: "no".into(),
            at: t(2),
        }]);
}

#[test]
fn source_done_to_target_pending() {
    Fw::with(())
        .given(history_to(TransferState::SourceDone))
        .when(TransferCommand::StartTargetDeposit { at: t(3) })
        .then_expect_events(vec![TransferEvent::TargetDepositStarted { at: t(3) }]);
}

#[test]
fn target_pending_to_committed_on_success() {
    Fw::with(())
        .given(history_to(TransferState::TargetPending))
        .when(TransferCommand::RecordTargetOutcome {
            outcome: StepOutcome::Succeeded,
            at: t(4),
        })
        .then_expect_events(vec![TransferEvent::TransferCommitted { at: t(4) }]);
}

#[test]
fn target_pending_to_compensating_on_explicit_refusal() {
    Fw::with(())
        .given(history_to(TransferState::TargetPending))
        .when(TransferCommand::RecordTargetOutcome {
            outcome: refused(),
            at: t(4),
        })
        .then_expect_events(vec![TransferEvent::CompensationStarted {
            code: "INSUFFICIENT_BALANCE".into(),
            message: "no".into(),
            at: t(4),
        }]);
}

#[test]
fn compensating_to_rolled_back_on_refund() {
    Fw::with(())
        .given(history_to(TransferState::Compensating))
        .when(TransferCommand::RecordRefund { at: t(5) })
        .then_expect_events(vec![TransferEvent::TransferRolledBack { at: t(5) }]);
}

/// The whole table: every (state, command) pair not listed as legal above is refused, and a
/// terminal state refuses everything.
#[test]
fn every_other_pair_is_refused_and_terminal_states_never_change() {
    let legal: &[(TransferState, &str)] = &[
        (TransferState::Init, "StartSourceWithdraw"),
        (TransferState::SourcePending, "RecordSourceOutcome"),
        (TransferState::SourceDone, "StartTargetDeposit"),
        (TransferState::TargetPending, "RecordTargetOutcome"),
        (TransferState::Compensating, "RecordRefund"),
    ];
    for state in TransferState::ALL {
        for command in all_commands() {
            let name = command.name();
            let manual_ok = match &command {
                TransferCommand::ManuallyResolve { resolution, .. } => {
                    manual_resolution_target(state, *resolution).is_some()
                }
                _ => false,
            };
            let result = Fw::with(())
                .given(history_to(state))
                .when(command)
                .inspect_result();
            if legal.contains(&(state, name)) || manual_ok {
                assert!(result.is_ok(), "{state} {name} should be legal");
                continue;
            }
            let err = result.expect_err("illegal pair must be refused");
            let expected = if state.is_terminal() {
                TransferError::Terminal { state }
            } else if name == "Create" {
                TransferError::AlreadyExists
            } else {
                TransferError::IllegalTransition {
                    state,
                    command: name,
                }
            };
            assert_eq!(err, expected, "{state} {name}");
        }
    }
}

#[test]
fn state_ids_match_the_specification() {
    let ids: Vec<i16> = TransferState::ALL.iter().map(|s| s.id()).collect();
    assert_eq!(ids, vec![0, 10, 20, 30, 40, -10, -20, -30]);
    for s in TransferState::ALL {
        assert_eq!(TransferState::from_id(s.id()), Some(s));
        assert_eq!(TransferState::parse(s.as_str()), Some(s));
    }
}

/// The call-free steps the coordinator commits together with the event before them: only INIT
/// and SOURCE_DONE have one, each is the legal announcement of the next call, and it leads to a
/// state that waits on that call (so at most two events ever share such a commit).
#[test]
fn call_free_steps_announce_the_next_call_and_never_chain() {
    for state in TransferState::ALL {
        let Some(command) = TransferCommand::call_free_step(state, t(9)) else {
            assert!(
                !matches!(state, TransferState::Init | TransferState::SourceDone),
                "{state} must have a call-free step"
            );
            continue;
        };
        let expected = match state {
            TransferState::Init => TransferEvent::SourceWithdrawStarted { at: t(9) },
            TransferState::SourceDone => TransferEvent::TargetDepositStarted { at: t(9) },
            other => panic!("{other} waits on a call or is terminal"),
        };
        Fw::with(())
            .given(history_to(state))
            .when(command)
            .then_expect_events(vec![expected.clone()]);
        assert!(TransferCommand::call_free_step(expected.resulting_state(), t(9)).is_none());
    }
}
