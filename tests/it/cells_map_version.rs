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

/// A ledger whose cells' databases hold an older map than a cell's spot-core has seen is refused
/// at start-up, naming the cell and both versions, and writes nothing through it; once the
/// databases hold the newer version it serves, and the spot-cores that had seen less learn it.
#[tokio::test]
async fn cells_map_002_a_ledger_with_an_older_map_than_a_spot_core_is_refused_at_start_up() {
    let three = crate::cells::ThreeCells::start().await;
    let two = &three.cells[1];
    // Cell 2's engine has been told of version 2 (a move's switch, ADR 0023, will do this).
    let newer = SpotClient::for_cell(
        two.spot.addr.clone(),
        Duration::from_secs(5),
        Some(two.spot.token.clone()),
        liveness::TcpLiveness::default(),
        Some(2),
    )
    .with_map_version(Some(2));
    assert!(matches!(
        newer.call(&Request::Ping {}).await,
        Ok(Response::Ok { .. })
    ));
    let log = crate::procs::LedgerProcess::try_start_cells(&three.map, &[])
        .err()
        .expect("refused: its databases say map version 1");
    assert!(log.contains("cell 2"), "{log}");
    assert!(
        log.contains("map version 1") && log.contains("seen version 2"),
        "{log}"
    );
    // The operator's fix (a switch that reached every database): the ledger serves, and every
    // cell's engine now knows version 2.
    for cell in &three.cells {
        sqlx::query("UPDATE cell_identity SET map_version = 2")
            .execute(&cell.db.pool)
            .await
            .unwrap();
    }
    let ledger = crate::procs::LedgerProcess::start_cells(&three.map, &[]);
    let (status, body) =
        crate::cells::call(&ledger.base, reqwest::Method::GET, "/healthz", "", None).await;
    assert_eq!(status, 200, "{body}");
    for cell in &three.cells {
        assert_eq!(core_map_version(&cell.spot).await, 2, "cell {}", cell.id);
    }
}
