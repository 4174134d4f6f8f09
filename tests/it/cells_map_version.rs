//! A real spot-core and the cell map's version (ADR 0023 §1, ADR 0020 §4): a `hello` naming a
//! newer version than the engine has seen is recorded durably, and one naming an older version
//! is refused `STALE_MAP`, also after a SIGKILL and a restart on the same WAL.

use std::time::Duration;

use spot_core::protocol::{Request, Response};
use spot_core::{ClientError, SpotClient};

use crate::helpers::SpotProcess;

fn client(spot: &SpotProcess, map_version: Option<u64>) -> SpotClient {
    SpotClient::with_token(
        spot.addr.clone(),
        Duration::from_secs(5),
        Some(spot.token.clone()),
    )
    .with_map_version(map_version)
}

async fn ping(spot: &SpotProcess, map_version: Option<u64>) -> Result<Response, ClientError> {
    client(spot, map_version).call(&Request::Ping {}).await
}

/// The version 1 client is refused with the client's own error (never sent, not an unknown
/// outcome), naming both versions.
async fn assert_stale(spot: &SpotProcess) {
    let err = ping(spot, Some(1)).await.unwrap_err();
    assert!(
        matches!(&err, ClientError::StaleMap(m) if m.contains("map version 1") && m.contains("seen version 2")),
        "{err:?}"
    );
    assert!(!err.outcome_unknown());
    assert!(err.to_string().contains(spot_core::client::HELLO_REFUSED));
}

async fn core_map_version(spot: &SpotProcess) -> u64 {
    match ping_status(spot).await {
        Response::Ok {
            core: Some(core), ..
        } => core.map_version,
        other => panic!("status: {other:?}"),
    }
}

async fn ping_status(spot: &SpotProcess) -> Response {
    client(spot, None)
        .call(&Request::Status {})
        .await
        .expect("status")
}

#[tokio::test]
async fn cells_map_001_an_older_map_is_refused_stale_map_across_a_sigkill() {
    let mut spot = SpotProcess::start();
    assert_eq!(core_map_version(&spot).await, 0);
    assert!(matches!(
        ping(&spot, Some(2)).await,
        Ok(Response::Ok { .. })
    ));
    assert_stale(&spot).await;
    // No map named (an old client, or a ledger without one): still accepted.
    assert!(matches!(ping(&spot, None).await, Ok(Response::Ok { .. })));
    assert_eq!(core_map_version(&spot).await, 2);

    spot.restart(); // SIGKILL, then the same data directory.
    assert_stale(&spot).await;
    assert!(matches!(
        ping(&spot, Some(2)).await,
        Ok(Response::Ok { .. })
    ));
    assert_eq!(core_map_version(&spot).await, 2);
}
