//! Read models built from the event log. A projection reads events and writes its own tables;
//! it never writes the event table.

pub mod transfers;

pub use transfers::{TransferRow, TransferView};
