//! Async client for spot-core, used by the coordinator's adapter, and the transport it is one of
//! (`SpotTransport`: the simulation puts an in-process engine behind the same trait).
//!
//! Its errors separate "never sent" (`Connect`) from "sent, outcome unknown" (`Timeout`,
//! `Io`, `Protocol`): only the first proves nothing happened; for the others the caller
//! must retry the same req_id or ask `lookup`.
//!
//! By job: `error.rs` (`ClientError`), `conn.rs` (one connection: its `hello`, framing, one
//! exchange or a pipelined one), `pool.rs` (`SpotClient`: the pool, the replicas of a cell and
//! the leader it follows), `moves.rs` (a partition's move: `move_out`, `move_in`,
//! `move_lookup`), `transport.rs` (`SpotTransport`). Everything is re-exported here.

mod conn;
mod error;
mod moves;
mod pool;
mod transport;

pub use error::{ClientError, HELLO_REFUSED};
pub use pool::{
    LeaderChange, ReplicaAnswer, SpotClient, MAX_IDLE_CONNECTIONS, PIPELINE_REQUESTS_MAX,
};
pub use transport::SpotTransport;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Request;
    use std::time::Duration;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn refused_connection_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let client = SpotClient::new(addr, Duration::from_secs(5));
        let err = client.call(&Request::Ping {}).await.unwrap_err();
        assert!(matches!(err, ClientError::Connect(_)), "{err:?}");
        assert!(!err.outcome_unknown());
    }

    #[tokio::test]
    async fn silent_server_is_a_timeout_and_the_connection_is_not_reused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (accepted_tx, mut accepted_rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (s, _) = listener.accept().await.unwrap();
                accepted_tx.send(s).unwrap();
            }
        });
        let client = SpotClient::new(addr, Duration::from_millis(200));
        let err = client.call(&Request::Ping {}).await.unwrap_err();
        assert_eq!(err, ClientError::Timeout);
        assert!(err.outcome_unknown());
        let first = accepted_rx.recv().await.unwrap();
        // The second call must open a new connection rather than reuse the timed-out one.
        let err = client.call(&Request::Ping {}).await.unwrap_err();
        assert_eq!(err, ClientError::Timeout);
        let second = accepted_rx.recv().await.unwrap();
        assert_ne!(first.peer_addr().unwrap(), second.peer_addr().unwrap());
    }

    #[tokio::test]
    async fn garbage_and_hangups_are_reported_as_unknown_outcomes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            // First connection answers garbage, second hangs up after reading the request.
            let (s, _) = listener.accept().await.unwrap();
            let mut s = BufReader::new(s);
            let mut req = Vec::new();
            s.read_until(b'\n', &mut req).await.unwrap();
            s.get_mut()
                .write_all(b"{\"status\":\"what\"}\n")
                .await
                .unwrap();
            let (s, _) = listener.accept().await.unwrap();
            let mut s = BufReader::new(s);
            let mut req = Vec::new();
            s.read_until(b'\n', &mut req).await.unwrap();
            drop(s);
        });
        let client = SpotClient::new(addr, Duration::from_secs(5));
        let err = client.call(&Request::Ping {}).await.unwrap_err();
        assert!(matches!(err, ClientError::Protocol(_)), "{err:?}");
        let err = client.call(&Request::Ping {}).await.unwrap_err();
        assert!(matches!(err, ClientError::Io(_)), "{err:?}");
    }

    /// A client with a map version names it in its `hello`, even without a token or a cell, and
    /// an engine's `STALE_MAP` refusal is `ClientError::StaleMap`: never sent, worded like any
    /// refused hello.
    #[tokio::test]
    async fn a_hello_refused_stale_map_is_a_stale_map_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (hello_tx, mut hello_rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let mut s = BufReader::new(s);
            let mut hello = Vec::new();
            s.read_until(b'\n', &mut hello).await.unwrap();
            hello_tx.send(hello).unwrap();
            let refusal = br#"{"status":"error","code":"STALE_MAP","message":"this client routes by map version 1; this spot-core has seen version 2: reload the map"}"#;
            s.get_mut().write_all(refusal).await.unwrap();
            s.get_mut().write_all(b"\n").await.unwrap();
        });
        let client = SpotClient::new(addr, Duration::from_secs(5)).with_map_version(Some(1));
        assert_eq!(client.map_version(), Some(1));
        let err = client.call(&Request::Ping {}).await.unwrap_err();
        assert!(
            matches!(&err, ClientError::StaleMap(m) if m.contains("seen version 2")),
            "{err:?}"
        );
        assert!(!err.outcome_unknown());
        assert!(err.to_string().starts_with(HELLO_REFUSED), "{err}");
        let hello: serde_json::Value =
            serde_json::from_slice(&hello_rx.recv().await.unwrap()).unwrap();
        assert_eq!(
            hello,
            serde_json::json!({"op": "hello", "token": "", "map_version": 1})
        );
        // No version: nothing changes (no hello without a token, a cell or traces).
        assert_eq!(
            SpotClient::new("127.0.0.1:1".into(), Duration::from_secs(1)).map_version(),
            None
        );
    }
}
