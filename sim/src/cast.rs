//! The run's fixed cast, shared by its script (`run.rs`) and its actors (`actors.rs`): the
//! processes, the users and assets, and a ledger process's coordinator.

use application::Coordinator;
use domain::Amount;

use crate::exec::ProcId;

/// The process of the users, the operator and the admin (never crashed).
pub(crate) const OUTSIDE: ProcId = 1;
/// The two ledger processes.
pub(crate) const LEDGERS: [ProcId; 2] = [2, 3];
/// The users, 1 to `USERS`.
pub(crate) const USERS: u64 = 3;
/// The assets they move.
pub(crate) const ASSETS: [&str; 2] = ["USDT", "BTC"];

pub(crate) fn amount(text: &str) -> Amount {
    Amount::parse(text).unwrap_or_else(|_| unreachable!("the simulation's amounts are valid"))
}

/// One ledger process: its coordinator, and whether it runs the tightest recovery settings.
pub(crate) struct Ledger {
    pub(crate) coordinator: Coordinator,
    pub(crate) tight: bool,
}
