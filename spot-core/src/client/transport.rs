//! `SpotTransport`: one request, one answer, the way the adapter reaches spot-core.

use super::error::ClientError;
use super::pool::SpotClient;
use crate::protocol::{Request, Response};

/// One request, one answer: how the adapter reaches spot-core. `SpotClient` is the TCP one; the
/// simulation (`ledger-sim`) answers from an in-process `Engine` with faults of its own.
/// Errors keep `ClientError`'s meaning: only `Connect` proves the request was never sent.
#[async_trait::async_trait]
pub trait SpotTransport: Send + Sync {
    /// Sends one request and waits for its answer.
    async fn call(&self, req: &Request) -> Result<Response, ClientError>;

    /// Sends many requests and waits for their answers, one per request in order, each with
    /// `call`'s meaning. This default sends them one by one; the TCP client pipelines them on
    /// one connection, so spot-core's WAL group-commits them under one fsync.
    async fn call_many(&self, reqs: &[Request]) -> Vec<Result<Response, ClientError>> {
        let mut answers = Vec::with_capacity(reqs.len());
        for req in reqs {
            answers.push(self.call(req).await);
        }
        answers
    }

    /// The TCP client behind this transport, when it is one (the leadership it observed, its
    /// replicas' addresses); `None` for any other (the simulation's).
    fn tcp_client(&self) -> Option<&SpotClient> {
        None
    }
}

#[async_trait::async_trait]
impl SpotTransport for SpotClient {
    async fn call(&self, req: &Request) -> Result<Response, ClientError> {
        SpotClient::call(self, req).await
    }

    fn tcp_client(&self) -> Option<&SpotClient> {
        Some(self)
    }

    async fn call_many(&self, reqs: &[Request]) -> Vec<Result<Response, ClientError>> {
        SpotClient::call_many(self, reqs).await
    }
}
