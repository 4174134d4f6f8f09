//! spot-core behind a simulated transport (`SimSpot`): the real engine, in process, and the
//! network's faults on each request.

use std::time::Duration;

use adapters::spot::operation_of;
use async_trait::async_trait;
use domain::Operation;
use spot_core::client::{ClientError, SpotTransport};
use spot_core::protocol::{JournalRecord, Outcome, Request, Response};

use crate::exec::Role;
use crate::world::{short, System, World};

use super::{Fate, Sim, NETWORK};

/// spot-core's transport over the simulated network to the in-process engine (the real
/// `Engine::apply_at`); the real `SpotAdapter` maps its answers.
#[derive(Debug, Clone)]
pub struct SimSpot {
    pub sim: Sim,
}

/// Applies one request to the engine as it arrives, with the arrival checks for movements.
pub fn spot_apply(w: &mut World, req: &Request) -> Response {
    if let Some((op, m)) = req.as_movement() {
        w.check_arrival(System::Spot, &m.req_id, operation_of(op));
    }
    let effect = w.engine_apply(req);
    if let Some(
        JournalRecord::Withdraw(record)
        | JournalRecord::Deposit(record)
        | JournalRecord::Refund(record),
    ) = &effect.record
    {
        if record.outcome == Outcome::Applied {
            if let Some((op, _)) = req.as_movement() {
                w.count_applied(System::Spot, &record.req_id, operation_of(op));
            }
        }
        let (id, outcome) = (record.req_id.clone(), record.outcome);
        if matches!(req, Request::Refund(_)) && outcome == Outcome::Refused {
            w.violation(format!(
                "spot refused the refund of {id}: {:?}",
                record.code
            ));
        }
        w.note(|| {
            format!(
                "spot recorded {req_name} of {}: {outcome:?}",
                short(&id),
                req_name = request_name(req)
            )
        });
    }
    effect.response
}

fn request_name(req: &Request) -> &'static str {
    if let Some((op, _)) = req.as_movement() {
        return operation_of(op).as_str();
    }
    match req {
        Request::Lookup { .. } => "lookup",
        Request::Cancel { .. } => "cancel",
        Request::SetStatus { .. } => "set_status",
        _ => "other",
    }
}

#[async_trait]
impl SpotTransport for SimSpot {
    async fn call(&self, req: &Request) -> Result<Response, ClientError> {
        let name = format!("spot.{}", request_name(req));
        {
            let mut w = self.sim.world();
            match req {
                Request::Lookup { req_id } => {
                    for op in Operation::ALL {
                        w.track_lookup(System::Spot, req_id, op);
                    }
                }
                Request::Cancel {
                    req_id, movement, ..
                } => w.track_lookup(System::Spot, req_id, operation_of(*movement)),
                _ => {
                    if let Some((op, m)) = req.as_movement() {
                        w.track_call(System::Spot, &m.req_id, operation_of(op));
                    }
                }
            }
        }
        let fate = self.sim.fate(&name).await;
        match fate {
            Fate::Unsent => return Err(ClientError::Connect("sim: connection refused".into())),
            Fate::Late => {
                if let Some(ms) = self.sim.late_delivery() {
                    self.deliver_later(req, ms);
                }
                return Err(ClientError::Timeout);
            }
            Fate::AnswerLost | Fate::Delivered => {}
        }
        let response = spot_apply(&mut self.sim.world(), req);
        if let Some(ms) = self.sim.maybe_duplicate(&name) {
            self.deliver_later(req, ms);
        }
        if fate == Fate::AnswerLost {
            return Err(ClientError::Io(
                "sim: connection reset after the request".into(),
            ));
        }
        Ok(response)
    }
}

impl SimSpot {
    fn deliver_later(&self, req: &Request, ms: u64) {
        let sim = self.sim.clone();
        let req = req.clone();
        self.sim.rt.spawn(NETWORK, Role::Network, async move {
            sim.rt.sleep(Duration::from_millis(ms)).await;
            let mut w = sim.world();
            w.note(|| format!("late copy of spot {} arrives", request_name(&req)));
            spot_apply(&mut w, &req);
        });
    }
}
