//! The client's errors: "never sent" apart from "sent, outcome unknown".

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The deadline passed after the request may have been sent; outcome unknown.
    #[error("spot-core did not answer before the deadline; outcome unknown")]
    Timeout,
    /// No connection could be made; the request was never sent.
    #[error("could not connect to spot-core: {0}")]
    Connect(String),
    /// The connection broke after the request may have been sent; outcome unknown.
    #[error("connection to spot-core failed: {0}; outcome unknown")]
    Io(String),
    /// The answer could not be understood; outcome unknown.
    #[error("unintelligible answer from spot-core: {0}")]
    Protocol(String),
    /// spot-core refused the `hello` `STALE_MAP` (ADR 0023 §1): it has seen a newer cell map
    /// than the one this client routes by. The request was never sent, and retrying cannot
    /// help: the process must reload the map (a misconfiguration, like another cell's engine).
    #[error("{HELLO_REFUSED}: STALE_MAP: {0}")]
    StaleMap(String),
    /// spot-core answered `MOVED` (ADR 0023 §4): the user's partition moved out of this engine,
    /// and nothing was done here. Not a refusal of the movement: the caller treats it as an
    /// unknown outcome and routes it again under the new map.
    #[error("spot-core: MOVED: {0}")]
    Moved(String),
    /// spot-core refused a `move_out` or `move_in` (`MOVE_REFUSED`): nothing was done, and the
    /// same move is refused again until what the message names changes.
    #[error("spot-core refused the move: {0}")]
    MoveRefused(String),
}

impl ClientError {
    /// True unless the request provably never reached spot-core.
    pub fn outcome_unknown(&self) -> bool {
        !matches!(
            self,
            ClientError::Connect(_) | ClientError::StaleMap(_) | ClientError::MoveRefused(_)
        )
    }

    /// An answer the caller sees as an error: `MOVED` is [`ClientError::Moved`]; everything else
    /// is the answer.
    pub(super) fn surfaced(
        answer: crate::protocol::Response,
    ) -> Result<crate::protocol::Response, Self> {
        match answer {
            crate::protocol::Response::Error {
                code: crate::protocol::ErrorCode::Moved,
                message,
            } => Err(ClientError::Moved(message)),
            other => Ok(other),
        }
    }
}

/// How a `Connect` error says the engine answered the `hello` with a refusal (a wrong token,
/// another cell): a misconfiguration rather than an engine that is not up yet.
pub const HELLO_REFUSED: &str = "spot-core refused the hello";
