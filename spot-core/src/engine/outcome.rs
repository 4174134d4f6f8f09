//! The compact number a remembered record (and a snapshot) keeps for its outcome and refusal
//! code.

use crate::protocol::{Outcome, RefusalCode};

/// `Remembered::outcome` of an applied movement.
pub(crate) const APPLIED: u8 = 0;

/// Every refusal code that can be recorded, by its stored number (`index + 1`). Append only:
/// snapshots store these numbers.
const RECORDED_CODES: [RefusalCode; 14] = [
    RefusalCode::InvalidReqId,
    RefusalCode::InvalidUserId,
    RefusalCode::InvalidAsset,
    RefusalCode::InvalidAmount,
    RefusalCode::PrecisionOverflow,
    RefusalCode::Overflow,
    RefusalCode::ReqIdConflict,
    RefusalCode::SourceAccountNotFound,
    RefusalCode::AccountFrozen,
    RefusalCode::AccountDisabled,
    RefusalCode::InsufficientBalance,
    RefusalCode::NoMatchingWithdraw,
    RefusalCode::Cancelled,
    RefusalCode::ReqIdExpired,
];

pub(crate) fn encode_outcome(code: Option<RefusalCode>) -> u8 {
    match code {
        None => APPLIED,
        Some(code) => {
            let i = RECORDED_CODES
                .iter()
                .position(|c| *c == code)
                .expect("every refusal code is listed");
            u8::try_from(i + 1).expect("fewer than 255 codes")
        }
    }
}

/// The outcome and code of a stored number; `None` for a number no version wrote.
pub(crate) fn try_decode_outcome(n: u8) -> Option<(Outcome, Option<RefusalCode>)> {
    if n == APPLIED {
        return Some((Outcome::Applied, None));
    }
    let code = *RECORDED_CODES.get(usize::from(n) - 1)?;
    Some((Outcome::Refused, Some(code)))
}

pub(super) fn decode_outcome(n: u8) -> (Outcome, Option<RefusalCode>) {
    try_decode_outcome(n).expect("outcome numbers are validated when stored")
}
