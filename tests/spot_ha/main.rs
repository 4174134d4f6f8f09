//! spot-core replicated (docs/adr/0020-high-availability.md §3), with real processes: an etcd
//! cluster of three (`ha::etcd`), three spot-core replicas (`ha::spot`) and the ledger's own
//! client (`SpotClient` over every replica's address, the way a ledger reaches a replicated
//! cell). Every fault is injected for real: SIGKILL, a deleted data directory.
//!
//! - The leader killed and its disk wiped under load: another replica leads within seconds,
//!   every acknowledged SPOT movement is there, the wiped replica rebuilds from a live one and
//!   counts toward acknowledgement again (the next leader kill needs it).
//! - A replica lost: the cell goes on with two; with a second one lost, nothing is acknowledged.
//! - The cell map's version a `hello` named survives the leader's SIGKILL: the next leader still
//!   refuses an older one.
//! - A partition's `move_out` survives the leader's SIGKILL: the next leader still answers its
//!   users `MOVED` and the move's retry the same.
//!
//! Its own test binary: it runs etcd and spot-core processes of its own, one test at a time.

#[path = "../it/fd_census.rs"]
#[allow(dead_code)]
mod fd_census;
#[path = "../it/helpers.rs"]
#[allow(dead_code)]
mod helpers;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ha::etcd::EtcdCluster;
use ha::spot::SpotReplicas;
use helpers::bin;
use rust_decimal::Decimal;
use spot_core::protocol::{Request, Response};
use spot_core::{ClientError, SpotClient};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const CELL: u16 = 1;

/// A directory for the cell's processes: on tmpfs when there is one (etcd and three WALs
/// fsyncing on a shared disk make spurious lease losses likely on 2 cores).
fn workdir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    let builder = tempfile::Builder::new()
        .prefix("spot-ha-")
        .tempdir_in(if shm.is_dir() {
            shm
        } else {
            std::path::Path::new("/tmp")
        });
    let mut dir = builder.expect("a working directory");
    eprintln!("the cell's processes work in {}", dir.path().display());
    dir.disable_cleanup(std::env::var_os("SPOT_HA_KEEP").is_some());
    dir
}

struct Cell {
    /// Kept, with the processes' logs, when SPOT_HA_KEEP is set (to read after a failure).
    _dir: tempfile::TempDir,
    _etcd: EtcdCluster,
    spot: SpotReplicas,
}

async fn start_cell() -> Cell {
    start_cell_on(["127.0.0.1"; 3]).await
}

async fn start_cell_on(hosts: [&str; 3]) -> Cell {
    let dir = workdir();
    let etcd = EtcdCluster::start(&dir.path().join("etcd"), 3)
        .await
        .expect("etcd starts");
    let spot = SpotReplicas::start_on(
        &bin("spot-core"),
        &dir.path().join("spot"),
        &etcd.endpoints(),
        CELL,
        &[
            ("RUST_LOG", "info"),
            ("SPOT_CORE_SNAPSHOT_EVERY_RECORDS", "500"),
            ("SPOT_CORE_SEGMENT_BYTES", "65536"),
        ],
        &[],
        hosts,
    )
    .expect("three replicas start");
    Cell {
        _dir: dir,
        _etcd: etcd,
        spot,
    }
}

fn client(addrs: &str) -> SpotClient {
    SpotClient::for_cell(
        addrs.to_owned(),
        Duration::from_secs(5),
        None,
        liveness::TcpLiveness::DEFAULT,
        Some(CELL),
    )
}

/// The replica that answers as the leader, waiting up to `within`.
async fn leader(cell: &Cell, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        for (i, r) in cell.spot.replicas.iter().enumerate() {
            if matches!(
                client(&r.client).call(&Request::Ping {}).await,
                Ok(Response::Ok { .. })
            ) {
                return i;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no replica led within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn req_id(n: u64) -> String {
    spot_core::ulid::format(spot_core::ulid::from_parts(
        spot_core::ulid::now_ms(),
        n.into(),
    ))
}

/// Deposits by `writers` tasks until `stop`, each retried with its req_id until it is applied
/// (the ledger's rule for an unknown outcome). `acked` collects every acknowledged one, and
/// `gaps` the longest time between two acknowledgements.
struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<BTreeMap<String, (u64, Decimal)>>>,
    last_ack: Arc<Mutex<Instant>>,
    /// When the deposit acknowledged last was first sent.
    last_sent: Arc<Mutex<Instant>>,
    longest_gap: Arc<Mutex<Duration>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn start_load(addrs: &str, writers: u64) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(BTreeMap::new()));
    let last_ack = Arc::new(Mutex::new(Instant::now()));
    let longest_gap = Arc::new(Mutex::new(Duration::ZERO));
    let last_sent = Arc::new(Mutex::new(Instant::now()));
    let next = Arc::new(AtomicU64::new(1));
    let spot = client(addrs);
    let tasks = (0..writers)
        .map(|w| {
            let (stop, acked, last_ack, longest_gap, next, spot, last_sent) = (
                stop.clone(),
                acked.clone(),
                last_ack.clone(),
                longest_gap.clone(),
                next.clone(),
                spot.clone(),
                last_sent.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Acquire) {
                    let n = next.fetch_add(1, Ordering::AcqRel);
                    let id = req_id(n);
                    let user = 1 + w;
                    let amount = Decimal::from(1 + n % 7);
                    let sent = Instant::now();
                    loop {
                        match spot
                            .call(&Request::deposit(id.clone(), user, "USDT", amount))
                            .await
                        {
                            Ok(Response::Applied { .. }) => break,
                            Ok(other) => panic!("deposit {id} answered {other:?}"),
                            Err(_) if stop.load(Ordering::Acquire) => return,
                            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                        }
                    }
                    let now = Instant::now();
                    {
                        let mut last = last_ack.lock().expect("lock");
                        let gap = now - *last;
                        let mut longest = longest_gap.lock().expect("lock");
                        *longest = (*longest).max(gap);
                        *last = now;
                    }
                    acked.lock().expect("lock").insert(id, (user, amount));
                    let mut newest = last_sent.lock().expect("lock");
                    *newest = (*newest).max(sent);
                }
            })
        })
        .collect();
    Load {
        stop,
        acked,
        last_ack,
        last_sent,
        longest_gap,
        tasks,
    }
}

impl Load {
    fn count(&self) -> usize {
        self.acked.lock().expect("lock").len()
    }

    async fn wait_for(&self, more: usize, within: Duration) {
        let target = self.count() + more;
        let deadline = Instant::now() + within;
        while self.count() < target {
            assert!(
                Instant::now() < deadline,
                "only {} of {target} deposits acknowledged within {within:?}",
                self.count()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until a deposit first sent after `t` is acknowledged; how long after `t` that was.
    async fn first_started_after(&self, t: Instant, within: Duration) -> Duration {
        loop {
            if *self.last_sent.lock().expect("lock") > t {
                return t.elapsed();
            }
            assert!(
                t.elapsed() < within,
                "no deposit sent after the fault acknowledged within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) -> (BTreeMap<String, (u64, Decimal)>, Duration) {
        self.stop.store(true, Ordering::Release);
        for t in self.tasks {
            t.await.expect("a writer panicked");
        }
        let gap = *self.longest_gap.lock().expect("lock");
        let _ = self.last_ack;
        (
            Arc::try_unwrap(self.acked)
                .expect("one owner")
                .into_inner()
                .expect("lock"),
            gap,
        )
    }
}

/// Every acknowledged deposit is applied on the current leader, and each user's balance is
/// exactly the sum of its acknowledged deposits (nothing lost, nothing applied twice).
async fn check_exact(addrs: &str, acked: &BTreeMap<String, (u64, Decimal)>) {
    let spot = client(addrs);
    let mut expected: BTreeMap<u64, Decimal> = BTreeMap::new();
    for (id, (user, amount)) in acked {
        *expected.entry(*user).or_default() += *amount;
        match spot.call(&Request::Lookup { req_id: id.clone() }).await {
            Ok(Response::Ok { ops: Some(ops), .. }) => {
                assert!(!ops.is_empty(), "acknowledged deposit {id} is missing");
            }
            other => panic!("lookup {id}: {other:?}"),
        }
    }
    for (user, total) in expected {
        let got = match spot.call(&Request::Balances { user_id: user }).await {
            Ok(Response::Ok {
                balances: Some(b), ..
            }) => b
                .iter()
                .filter(|e| e.asset == "USDT")
                .map(|e| e.available)
                .sum::<Decimal>(),
            other => panic!("balances of {user}: {other:?}"),
        };
        assert_eq!(
            got, total,
            "user {user}: SPOT balance against acknowledged deposits"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cra_ha_spot_leader_killed_and_wiped_loses_nothing_acknowledged_and_rejoins() {
    let _one = SERIAL.lock().await;
    let mut cell = start_cell().await;
    let addrs = cell.spot.client_addrs();
    let first = leader(&cell, Duration::from_secs(30)).await;
    let load = start_load(&addrs, 4);
    load.wait_for(300, Duration::from_secs(60)).await;

    // A machine and its disk lost: SIGKILL the leader, delete its data directory.
    let killed_at = Instant::now();
    cell.spot.kill(first);
    cell.spot.wipe(first).expect("wipe");
    let back = load
        .first_started_after(killed_at, Duration::from_secs(30))
        .await;
    let second = leader(&cell, Duration::from_secs(10)).await;
    assert_ne!(second, first, "another replica leads");
    eprintln!("spot-core leader killed and wiped: commits again after {back:?}");
    load.wait_for(200, Duration::from_secs(60)).await;

    // The audit consumed the journal so far: the leader compacts its segments, so the wiped
    // replica cannot be streamed what it lacks from seq 1 and must be sent the files.
    retain_all(&addrs).await;
    // The wiped replica comes back empty and rebuilds from a live one, under load.
    cell.spot.restart(first).expect("restart the wiped replica");
    load.wait_for(200, Duration::from_secs(60)).await;

    // The next leader kill leaves the rebuilt replica and one other: the cell can acknowledge
    // again only if the rebuilt one holds every acknowledged record and acknowledges.
    tokio::time::sleep(Duration::from_secs(2)).await;
    cell.spot.kill(second);
    load.wait_for(100, Duration::from_secs(30)).await;
    let third = leader(&cell, Duration::from_secs(10)).await;
    assert_ne!(third, second);
    let (acked, gap) = load.stop().await;
    eprintln!(
        "{} deposits acknowledged; longest pause {gap:?}",
        acked.len()
    );
    check_exact(&addrs, &acked).await;
    assert!(
        std::fs::read_dir(&cell.spot.replicas[first].data_dir)
            .expect("the rebuilt data dir")
            .count()
            > 1,
        "the wiped replica has files again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cra_ha_spot_one_replica_lost_goes_on_two_lost_stops_acknowledging() {
    let _one = SERIAL.lock().await;
    let mut cell = start_cell().await;
    let addrs = cell.spot.client_addrs();
    let lead = leader(&cell, Duration::from_secs(30)).await;
    let load = start_load(&addrs, 2);
    load.wait_for(100, Duration::from_secs(60)).await;
    let followers: Vec<usize> = (0..3).filter(|i| *i != lead).collect();

    cell.spot.kill(followers[0]);
    load.wait_for(100, Duration::from_secs(30)).await;

    // The second replica lost: the leader is alone and must not acknowledge anything.
    cell.spot.kill(followers[1]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = load.count();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        load.count() <= before + 2 * 2,
        "a lone leader acknowledged {} deposits",
        load.count() - before
    );
    let stalled = load.count();
    // Back to two replicas (the leader aborted when nobody acknowledged; restart everything
    // that exited): the cell serves again, and nothing acknowledged is lost.
    cell.spot.restart_exited().expect("restart");
    load.wait_for(50, Duration::from_secs(60)).await;
    let (acked, _) = load.stop().await;
    assert!(acked.len() > stalled);
    check_exact(&addrs, &acked).await;
}

/// The cell map's version (ADR 0023 §1) is a replicated record: a `hello` naming version 2 is
/// acknowledged (a follower holds it fsynced) before its `ok`, so after the leader's SIGKILL the
/// replica elected next still refuses version 1 `STALE_MAP` and accepts version 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_spot_a_new_leader_still_refuses_an_older_map() {
    let _one = SERIAL.lock().await;
    let mut cell = start_cell().await;
    let addrs = cell.spot.client_addrs();
    let first = leader(&cell, Duration::from_secs(30)).await;
    let ping = |version: u64| {
        let client = client(&addrs).with_map_version(Some(version));
        async move { client.call(&Request::Ping {}).await }
    };
    assert!(matches!(ping(2).await, Ok(Response::Ok { .. })));
    assert!(matches!(ping(1).await, Err(ClientError::StaleMap(_))));

    cell.spot.kill(first);
    let second = leader(&cell, Duration::from_secs(30)).await;
    assert_ne!(second, first, "another replica leads");
    let err = ping(1).await.unwrap_err();
    assert!(
        matches!(&err, ClientError::StaleMap(m) if m.contains("seen version 2")),
        "{err:?}"
    );
    assert!(matches!(ping(2).await, Ok(Response::Ok { .. })));
}

/// A partition's `move_out` (ADR 0023 §4) is a replicated record, acknowledged (a follower holds
/// it fsynced) before its answer: after the leader's SIGKILL the replica elected next still
/// answers the partition's users `MOVED`, a retry of the move the same answer, and serves the
/// other partitions' users, its totals less exactly the moved balances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_spot_a_new_leader_still_answers_a_moved_partitions_users_moved() {
    let _one = SERIAL.lock().await;
    let mut cell = start_cell().await;
    let addrs = cell.spot.client_addrs();
    let first = leader(&cell, Duration::from_secs(30)).await;
    let partition = 42;
    let of = |moved: bool| {
        (1u64..)
            .find(|u| (spot_core::partition::partition_of(*u) == partition) == moved)
            .expect("a user")
    };
    let (mover, stayer) = (of(true), of(false));
    let c = client(&addrs);
    for (n, user, amount) in [(1, mover, "10.5"), (2, stayer, "5")] {
        let deposit = Request::deposit(req_id(n), user, "USDT", amount.parse().unwrap());
        let answer = c.call(&deposit).await.expect("an answer");
        assert!(matches!(answer, Response::Applied { .. }), "{answer:?}");
    }
    let out = c.move_out("ha-move-1", partition).await.expect("moved out");
    assert_eq!((out.accounts, out.records), (1, 1));

    cell.spot.kill(first);
    let second = leader(&cell, Duration::from_secs(30)).await;
    assert_ne!(second, first, "another replica leads");
    let c = client(&addrs);
    let late = Request::deposit(req_id(3), mover, "USDT", Decimal::ONE);
    let moved = c.call(&late).await.unwrap_err();
    assert!(
        matches!(&moved, ClientError::Moved(m) if m.contains("ha-move-1")),
        "{moved:?}"
    );
    assert_eq!(
        c.move_out("ha-move-1", partition).await.expect("the same"),
        out
    );
    let stays = Request::deposit(req_id(4), stayer, "USDT", Decimal::ONE);
    assert!(matches!(c.call(&stays).await, Ok(Response::Applied { .. })));
    let Ok(Response::Ok {
        totals: Some(totals),
        ..
    }) = c.call(&Request::Totals {}).await
    else {
        panic!("totals");
    };
    let usdt = totals.iter().find(|t| t.asset == "USDT").expect("USDT");
    assert_eq!(usdt.sum, Decimal::from(6));
}

/// An nftables table cutting one loopback address off from others (both ways), deleted on drop.
struct Cut {
    table: String,
}

impl Cut {
    fn new(from: &str, others: &[&str]) -> Cut {
        let table = format!("spotha{}", std::process::id());
        let nft = |args: &str| {
            let status = std::process::Command::new("nft")
                .args(args.split(' '))
                .status()
                .expect("run nft (scripts/test installs nftables; root is needed)");
            assert!(status.success(), "nft {args}");
        };
        let set = others.join(", ");
        nft(&format!("add table inet {table}"));
        let script = format!(
            "add chain inet {table} out {{ type filter hook output priority 0 ; policy accept ; }}\n\
             add rule inet {table} out ip saddr {from} ip daddr {{ {set} }} drop\n\
             add rule inet {table} out ip saddr {{ {set} }} ip daddr {from} drop\n"
        );
        let mut child = std::process::Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("run nft -f -");
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(script.as_bytes())
            .expect("write the rules");
        assert!(child.wait().expect("nft").success(), "nft -f: {script}");
        Cut { table }
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        let _ = std::process::Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .status();
    }
}

/// Tells the leader the audit consumed every record (`retain`), then waits until its oldest
/// served seq moved past the first segments (compacted after the next snapshots).
async fn retain_all(addrs: &str) {
    let spot = client(addrs);
    let status = |spot: SpotClient| async move {
        match spot.call(&Request::Status {}).await {
            Ok(Response::Ok {
                core: Some(core), ..
            }) => core,
            other => panic!("status: {other:?}"),
        }
    };
    let last = status(spot.clone()).await.last_seq;
    match spot.call(&Request::Retain { after_seq: last }).await {
        Ok(Response::Ok { .. }) => {}
        other => panic!("retain: {other:?}"),
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(spot.clone()).await.first_seq <= 1 {
        assert!(Instant::now() < deadline, "the leader compacted nothing");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The leader's view of its followers (`status`), through `addrs`.
async fn acknowledging(addrs: &str) -> u32 {
    match client(addrs).call(&Request::Status {}).await {
        Ok(Response::Ok {
            core: Some(core), ..
        }) => core.replication.map_or(0, |r| r.acknowledging),
        _ => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cra_ha_spot_leader_cut_off_from_its_replicas_stops_acknowledging_and_rejoins() {
    let _one = SERIAL.lock().await;
    let hosts = ["127.0.0.11", "127.0.0.12", "127.0.0.13"];
    let mut cell = start_cell_on(hosts).await;
    let addrs = cell.spot.client_addrs();
    let old = leader(&cell, Duration::from_secs(30)).await;
    let load = start_load(&addrs, 2);
    load.wait_for(100, Duration::from_secs(60)).await;

    // The leader's machine cut off from the other replicas; the client (127.0.0.1) still
    // reaches it.
    let others: Vec<&str> = (0..3).filter(|i| *i != old).map(|i| hosts[i]).collect();
    let cut = Cut::new(hosts[old], &others);
    let cut_at = Instant::now();
    // It must stop acknowledging: with no follower's acknowledgement it steps down (exits)
    // within its acknowledgement timeout (3 s) plus a batch.
    let deadline = Instant::now() + Duration::from_secs(15);
    while cell.spot.replicas[old].kid.running() {
        assert!(
            Instant::now() < deadline,
            "the cut-off leader still runs {:?} after the cut",
            cut_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stepped_down = cut_at.elapsed();
    // It comes back (a supervisor's restart), still cut off: it must not lead.
    cell.spot.restart(old).expect("restart the old leader");
    load.wait_for(100, Duration::from_secs(30)).await;
    let new = leader(&cell, Duration::from_secs(10)).await;
    assert_ne!(
        new, old,
        "a replica that cannot reach the others must not lead"
    );
    eprintln!(
        "leader cut off: stepped down after {stepped_down:?}, serving again after {:?}",
        cut_at.elapsed()
    );

    // Healed: the old leader rejoins as a follower and catches up (the leader counts three
    // replicas acknowledging again).
    drop(cut);
    let deadline = Instant::now() + Duration::from_secs(60);
    while acknowledging(&addrs).await < 3 {
        assert!(Instant::now() < deadline, "the old leader did not rejoin");
        cell.spot.restart_exited().expect("restart");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    load.wait_for(50, Duration::from_secs(30)).await;
    let (acked, gap) = load.stop().await;
    eprintln!(
        "{} deposits acknowledged; longest pause {gap:?}",
        acked.len()
    );
    check_exact(&addrs, &acked).await;
}
