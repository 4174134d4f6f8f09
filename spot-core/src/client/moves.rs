//! `SpotClient`'s typed calls of a partition's move (ADR 0023 §4): `move_out`, `move_in` and
//! `move_lookup`, each answered with the move as spot-core recorded it.

use super::error::ClientError;
use super::pool::SpotClient;
use crate::protocol::{ErrorCode, MoveAnswer, MovePayload, Request, Response};

impl SpotClient {
    /// Takes partition `partition`'s accounts out of this engine and answers them with its
    /// users' records (the payload the target's [`SpotClient::move_in`] takes). Idempotent by
    /// `move_id`: a retry, also after a crash of either side, gets the same answer. A timeout
    /// or a broken connection is an unknown outcome: retry, or ask [`SpotClient::move_lookup`].
    pub async fn move_out(&self, move_id: &str, partition: u8) -> Result<MoveAnswer, ClientError> {
        let request = Request::MoveOut {
            move_id: move_id.to_owned(),
            partition,
        };
        one_move(self.call(&request).await?)
    }

    /// Credits `payload` (a `move_out`'s) into this engine and installs its records; clears a
    /// moved-out mark of `partition` here. Idempotent by `move_id`.
    pub async fn move_in(
        &self,
        move_id: &str,
        partition: u8,
        payload: &MovePayload,
    ) -> Result<MoveAnswer, ClientError> {
        let request = Request::MoveIn {
            move_id: move_id.to_owned(),
            partition,
            payload: payload.clone(),
        };
        one_move(self.call(&request).await?)
    }

    /// The move recorded under `move_id`, if this engine recorded one.
    pub async fn move_lookup(&self, move_id: &str) -> Result<Option<MoveAnswer>, ClientError> {
        let request = Request::MoveLookup {
            move_id: move_id.to_owned(),
        };
        match moves_of(self.call(&request).await?)? {
            moves if moves.len() <= 1 => Ok(moves.into_iter().next()),
            moves => Err(ClientError::Protocol(format!(
                "{} moves under one move_id",
                moves.len()
            ))),
        }
    }
}

/// The one move an answer to `move_out` or `move_in` carries.
fn one_move(answer: Response) -> Result<MoveAnswer, ClientError> {
    let mut moves = moves_of(answer)?;
    match moves.pop() {
        Some(one) if moves.is_empty() => Ok(one),
        _ => Err(ClientError::Protocol(
            "a move answered with other than one move".into(),
        )),
    }
}

fn moves_of(answer: Response) -> Result<Vec<MoveAnswer>, ClientError> {
    match answer {
        Response::Ok {
            moves: Some(moves), ..
        } => Ok(*moves),
        Response::Error {
            code: ErrorCode::MoveRefused,
            message,
        } => Err(ClientError::MoveRefused(message)),
        other => Err(ClientError::Protocol(format!(
            "unexpected answer: {other:?}"
        ))),
    }
}
