//! The event log in memory (`SimLog`), with `append`'s version check, the claim guard of a
//! creation under a client key, and the store's faults at each call.

use std::collections::BTreeSet;

use application::{Commit, CoordinatorError, TransferLog};
use async_trait::async_trait;
use cqrs_es::persist::EventStoreAggregateContext;
use cqrs_es::Aggregate;
use domain::{ReqId, Transfer, TransferEvent, TransferState};

use crate::world::{short, Stream};

use super::{store_error, Sim};

/// The event log in memory.
#[derive(Debug, Clone)]
pub struct SimLog {
    pub sim: Sim,
}

fn fold(events: &[TransferEvent]) -> Transfer {
    let mut t = Transfer::default();
    for e in events {
        t.apply(e.clone());
    }
    t
}

#[async_trait]
impl TransferLog for SimLog {
    async fn load(
        &self,
        req_id: &ReqId,
    ) -> Result<EventStoreAggregateContext<Transfer>, CoordinatorError> {
        let aggregate_id = req_id.to_string();
        let aggregate_id = aggregate_id.as_str();
        self.sim
            .store("log.load", |w| {
                let events = w
                    .log
                    .get(aggregate_id)
                    .map(|s| s.events.clone())
                    .unwrap_or_default();
                Ok(EventStoreAggregateContext {
                    aggregate_id: aggregate_id.to_owned(),
                    aggregate: fold(&events),
                    current_sequence: events.len(),
                    current_snapshot: None,
                })
            })
            .await
    }

    // long: the in-memory log's append with its fault points in the order PostgreSQL meets them.
    async fn append(&self, commit: Commit) -> Result<usize, CoordinatorError> {
        self.sim
            .store("log.append", |w| {
                let id = commit.aggregate_id.as_str();
                let len = w.log.get(id).map_or(0, |s| s.events.len());
                let no_cas = application::plant::active(application::plant::Bug::NoCas);
                if len != commit.expected_sequence && !no_cas {
                    w.note(|| {
                        format!(
                            "log {} refused: sequence {} taken (at {len})",
                            short(id),
                            commit.expected_sequence + 1
                        )
                    });
                    return Err(CoordinatorError::Conflict);
                }
                // The claim guard (migration 0020): a creation under a client key commits only
                // while the key's claim names its req_id.
                if commit.expected_sequence == 0 {
                    if let Some(TransferEvent::TransferCreated {
                        user_id,
                        cid: Some(cid),
                        ..
                    }) = commit.events.first()
                    {
                        let holds = w
                            .claims
                            .get(&(user_id.get(), cid.clone()))
                            .is_some_and(|(req_id, _)| req_id == id);
                        if !holds {
                            w.note(|| format!("log {} refused: claim of {cid} moved", short(id)));
                            return Err(CoordinatorError::Conflict);
                        }
                    }
                }
                w.check_append(id, &commit.events);
                let now = w.now_ms;
                if !w.log.contains_key(id) {
                    let Some(TransferEvent::TransferCreated {
                        user_id,
                        from,
                        to,
                        asset,
                        amount,
                        cid,
                        ..
                    }) = commit.events.first()
                    else {
                        return Err(store_error("a stream must start with TransferCreated"));
                    };
                    let stream = Stream {
                        events: Vec::new(),
                        state: None,
                        reached: BTreeSet::new(),
                        recorded_at_ms: now,
                        user: user_id.get(),
                        asset: asset.to_string(),
                        amount: amount.value(),
                        from: *from,
                        to: *to,
                        cid: cid.clone(),
                    };
                    w.log.insert(id.to_owned(), stream);
                }
                let names: Vec<String> = commit.events.iter().map(event_name).collect();
                let stream = w
                    .log
                    .get_mut(id)
                    .ok_or_else(|| store_error("stream vanished"))?;
                for e in &commit.events {
                    let next = e.resulting_state();
                    stream.state = Some(next);
                    stream.reached.insert(next.id());
                }
                stream.events.extend(commit.events.iter().cloned());
                stream.recorded_at_ms = now;
                let last = stream.events.len();
                let state = stream.state;
                w.note(|| {
                    format!(
                        "log {} +{} -> {}",
                        short(id),
                        names.join("+"),
                        state.map_or("?", TransferState::as_str)
                    )
                });
                Ok(last)
            })
            .await
    }
}

fn event_name(e: &TransferEvent) -> String {
    use cqrs_es::DomainEvent;
    e.event_type()
}
