//! The ledger's core: value types, the Transfer aggregate and its state machine, error codes and
//! the adapter port. It does no I/O, so nothing in here can fail for an outside reason (the one
//! write is a broken invariant's last word on stderr, `invariant`, on its way to abort).

pub mod assets;
pub mod codes;
pub mod invariant;
pub mod movements;
pub mod port;
pub mod state;
pub mod stored;
pub mod transfer;
pub mod values;

pub use assets::{AssetConfig, AssetRegistry, AssetStatus};
pub use codes::ErrorCode;
pub use port::{AccountPort, AdapterOutcome, Movement, Operation, Recorded, UnknownOperation};
pub use transfer::{
    manual_resolution_target, Resolution, StepOutcome, Transfer, TransferCommand, TransferData,
    TransferError, TransferEvent, TransferState, EVENT_VERSION,
};
pub use values::{AccountType, Amount, AssetSymbol, ReqId, UserId};
