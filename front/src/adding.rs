//! Adding a cell to a running deployment (ADR 0023 §1, "a cell new to a running deployment"):
//! `POST /api/v1/admin/cells` (admin). The front decides nothing of it: the process that serves
//! the cells (`ledger/src/cellular/adding.rs`) creates or reaches the cell's database and
//! spot-core, stores the map's next version with the new cell in every cell, and puts the cell
//! behind the front ([`crate::slot::Slots::add`]); the new cell owns no partition until moves
//! give it some. Under `ledger up --cells N` the body may be empty (`{}`): the new cell gets the
//! next id, a database beside the others' and a spot-core child of its own. A deployment whose
//! cells run elsewhere names them: `{"database_url": "...", "spot": "HOST:PORT",
//! "spot_token_file": "..."}`.

use std::sync::Arc;

use crate::adder::{AddRefusal, CellAdder, NewCell};
use crate::route::Front;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use domain::ErrorCode;
use edge::error::ApiError;

pub(crate) const PATH: &str = "/api/v1/admin/cells";

impl Front {
    /// Answers `POST /api/v1/admin/cells` through `adder`.
    pub fn with_adder(mut self, adder: Arc<dyn CellAdder>) -> Self {
        self.adder = Some(adder);
        self
    }

    /// Whether an admin's request is the addition of a cell.
    pub(crate) fn is_add_cell(method: &Method, path: &str) -> bool {
        method == Method::POST && path == PATH
    }

    /// An admin's `POST /api/v1/admin/cells`.
    pub(crate) async fn add_cell(&self, req: Request) -> Response {
        let Some(adder) = self.adder.clone() else {
            return ApiError::MethodNotAllowed.into_response();
        };
        let answer = async {
            let bytes = axum::body::to_bytes(req.into_body(), 4096)
                .await
                .map_err(|_| ApiError::PayloadTooLarge(4096))?;
            let asked: NewCell = if bytes.iter().all(u8::is_ascii_whitespace) {
                NewCell::default()
            } else {
                serde_json::from_slice(&bytes).map_err(|e| {
                    ApiError::BadRequest(format!(
                        "a new cell is {{\"database_url\", \"spot\", \"spot_token_file\"}}, each optional: {e}"
                    ))
                })?
            };
            let added = adder.add(asked).await.map_err(|e| match e {
                AddRefusal::Invalid(m) => ApiError::BadRequest(m),
                AddRefusal::Conflict(message) => ApiError::RefusedBecause {
                    code: ErrorCode::Conflict,
                    message,
                },
                AddRefusal::Unavailable(m) => ApiError::Unavailable(m),
            })?;
            // The new cell is behind the front now: route by the map that names it.
            self.map.reload_from(&self.slots).await;
            Ok::<_, ApiError>((StatusCode::CREATED, Json(added)).into_response())
        };
        answer.await.unwrap_or_else(IntoResponse::into_response)
    }
}
