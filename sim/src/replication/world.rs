//! The model: three replicas, the lease oracle, connections, faults and the invariants.
//!
//! Time is in simulated milliseconds, scaled down tenfold from the product's defaults (lease
//! TTL 300 ms, renewed every 100 ms, acknowledgement timeout 300 ms, a campaign check every
//! 25 ms, a promise waited for at most 100 ms and the others 10 ms after the first), so a short
//! run sees many leaderships. Each step handles the earliest event; ties go by the order they
//! were scheduled in.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use spot_core::replica::history::{divergence, epoch_of, EpochStart, Position};
use spot_core::replica::rules::{self, Adopt};

use crate::rng::Rng;

const N: usize = 3;
const TTL: u64 = 300;
const RENEW: u64 = TTL / 3;
const ACK_TIMEOUT: u64 = 300;
const CAMPAIGN_EVERY: u64 = 25;
/// A leader's session retries a follower this long after it ended (`follow_peer`, 200 ms).
const RECONNECT: u64 = 20;
/// Each peer's promise is waited for at most this long (`take_over`: the acknowledgement
/// timeout, at most 1 s).
const PROMISE_WAIT: u64 = if ACK_TIMEOUT < 100 { ACK_TIMEOUT } else { 100 };
/// After the first promise, the others are waited for this long (100 ms).
const AFTER_FIRST_PROMISE: u64 = 10;
/// A take-over that failed otherwise (`TakeOver::Failed`) rests 1 s.
const FAILED_REST: u64 = 100;
/// A replica that lost its data checks again this long after it found no leader (1 s).
const WIPED_REST: u64 = 100;
/// A blank replica that cannot reach etcd asks again this long after (500 ms).
const ETCD_RETRY: u64 = 50;
/// Client writes come for this long; then the faults stop and the cell settles.
const BUSY: u64 = 4_000;
const SETTLE: u64 = 3_000;
/// Records per catch-up message (a journal page in the real code).
const PAGE: usize = 8;

/// A record: the client write's id, and the epoch whose leader wrote it (known to the checks
/// only; the replicas know a record's epoch from their history, as the real ones do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rec {
    id: u64,
    epoch: u64,
}

/// What survives a crash: `EPOCH`, `EPOCHS` and the segments up to the last fsync.
#[derive(Debug, Clone, Default)]
struct Disk {
    log: Vec<Rec>,
    /// Records up to here are fsynced; a crash loses the rest (only a leader writes before its
    /// fsync).
    synced: usize,
    /// Records up to here are in a snapshot only, their segments compacted away: they can no
    /// longer be read as frames (a catch-up or a fetch from them fails).
    compacted: u64,
    promised: u64,
    history: Vec<EpochStart>,
    /// `WIPED`: it lost its data in a cell that had a leader, and has not yet adopted a
    /// leader's epoch line (it neither promises nor campaigns).
    wiped: bool,
}

impl Disk {
    fn last(&self) -> u64 {
        self.log.len() as u64
    }

    fn position(&self) -> Position {
        Position {
            history: self.history.clone(),
            last_seq: self.last(),
        }
    }

    fn last_epoch(&self) -> u64 {
        self.history.last().map_or(0, |e| e.epoch)
    }

    /// `Epochs::promise`.
    fn promise(&mut self, epoch: u64) -> Result<(), String> {
        if epoch < self.promised {
            return Err(format!(
                "epoch {epoch} is older than the promised {}",
                self.promised
            ));
        }
        self.promised = epoch;
        Ok(())
    }

    /// `Epochs::adopt`: true when the line was added (spot-core then ends `WIPED`).
    fn adopt(&mut self, epoch: u64, start: u64) -> Result<bool, String> {
        if self.history.last().is_some_and(|e| e.epoch >= epoch) {
            return Ok(false);
        }
        self.promise(epoch)?;
        self.history.push(EpochStart { epoch, start });
        Ok(true)
    }

    /// `Epochs::blank`: no promise, no history.
    fn blank(&self) -> bool {
        self.promised == 0 && self.history.is_empty()
    }

    /// `Epochs::load` after a restart: lines past the log are dropped.
    fn reload(&mut self) {
        self.log.truncate(self.synced);
        let last = self.last();
        self.history.retain(|e| e.start <= last + 1);
    }
}

#[derive(Debug, Clone)]
enum Msg {
    Promise {
        epoch: u64,
    },
    Position {
        position: Position,
    },
    Fetch {
        after: u64,
        upto: u64,
    },
    Frames {
        first: u64,
        recs: Vec<Rec>,
    },
    Done,
    Join {
        epoch: u64,
        start: u64,
        leader: Position,
    },
    Joined {
        last_seq: u64,
        epoch: u64,
    },
    Rebuild,
    Files {
        epoch: u64,
        history: Vec<EpochStart>,
        log: Vec<Rec>,
        compacted: u64,
    },
    Append {
        epoch: u64,
        first: u64,
        recs: Vec<Rec>,
    },
    Ack {
        seq: u64,
        epoch: u64,
    },
    Refused {
        reason: String,
    },
}

/// A connection: opened by `from` (a leader or a replica taking over) to `to`'s replication
/// listener; in order each way, gone when either end restarts or a message on it is lost.
#[derive(Debug, Clone)]
struct Conn {
    from: usize,
    to: usize,
    incs: [u64; 2],
    open: bool,
    /// The last delivery time each way (0: from → to), so a connection stays in order.
    last_at: [u64; 2],
}

#[derive(Debug)]
enum Ev {
    Deliver {
        conn: usize,
        to: usize,
        msg: Msg,
    },
    /// The initiator of `conn` learns it is gone.
    Broken {
        conn: usize,
    },
    Restart {
        node: usize,
        inc: u64,
    },
    Campaign {
        node: usize,
        inc: u64,
    },
    KeepAlive {
        node: usize,
        inc: u64,
    },
    Synced {
        node: usize,
        inc: u64,
        upto: usize,
    },
    AckDeadline {
        node: usize,
        inc: u64,
        last: u64,
    },
    BarrierDeadline {
        node: usize,
        inc: u64,
    },
    /// A peer's promise not answered within `PROMISE_WAIT`.
    PromiseTimeout {
        node: usize,
        inc: u64,
        conn: usize,
    },
    /// `AFTER_FIRST_PROMISE` after the first promise: the take-over decides with what came.
    PromiseWindow {
        node: usize,
        inc: u64,
        epoch: u64,
    },
    Reconnect {
        node: usize,
        inc: u64,
        peer: usize,
    },
    ClientWrite,
    Fault,
}

struct Scheduled {
    at: u64,
    n: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.n) == (other.at, other.n)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.n).cmp(&(other.at, other.n))
    }
}

/// A replica taking over (`takeover::take_over`): it asks both peers at once, each for at most
/// `PROMISE_WAIT`, and decides when both answered or `AFTER_FIRST_PROMISE` after the first
/// promise.
#[derive(Debug)]
struct TakeOver {
    epoch: u64,
    mine: Position,
    /// The connections whose promise is still awaited.
    asking: Vec<usize>,
    /// The promises in the order they came: the peer, its connection, its log's position.
    promised: Vec<(usize, usize, Position)>,
    /// The fetch from the most advanced log, on its promise's connection, once decided.
    fetching: Option<usize>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Session {
    conn: Option<usize>,
    joined: bool,
    sent: u64,
}

#[derive(Debug)]
struct Batch {
    first: u64,
    last: u64,
    synced: bool,
}

/// A leader: the shipper, its sessions and the group commit's one batch in flight.
#[derive(Debug)]
struct Leader {
    epoch: u64,
    start: u64,
    history: Vec<EpochStart>,
    serving: bool,
    acks: [Option<(u64, u64)>; N],
    sessions: [Session; N],
    batch: Option<Batch>,
    queue: VecDeque<u64>,
}

#[derive(Debug)]
enum Role {
    Down,
    Follower,
    TakingOver(TakeOver),
    Leading(Box<Leader>),
}

struct Node {
    disk: Disk,
    role: Role,
    /// Incremented at every crash and restart: timers and connections of an earlier life are
    /// void.
    inc: u64,
    /// A join's history line waiting until the log reaches its start (`wal/follow.rs`).
    pending: Option<(u64, u64)>,
    /// With `Config::wiped_until_caught_up`: the epoch a `WIPED` replica joined and the
    /// leader's last seq then; `WIPED` ends once both are reached.
    wiped_until: Option<(u64, u64)>,
    /// The lease keeper's epoch, while it runs.
    keeper: Option<u64>,
    renewed: u64,
    /// etcd unreachable from this replica until then (its renewals fail).
    cut_off_until: u64,
    /// Lost its disk and has not restarted since (it is `WIPED` from its restart on, when the
    /// cell had a leader).
    lost: bool,
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    node: usize,
    epoch: u64,
    expires: u64,
}

/// The seed's fault rates, per mille.
#[derive(Debug, Clone, Copy)]
struct Rates {
    loss: u32,
    slow: u32,
    crash: u32,
    wipe: u32,
    expire: u32,
    slow_sync: u32,
    /// A snapshot and compaction after an fsync.
    compact: u32,
}

pub(super) struct World {
    rng: Rng,
    now: u64,
    n: u64,
    queue: BinaryHeap<Reverse<Scheduled>>,
    nodes: Vec<Node>,
    conns: Vec<Conn>,
    lease: Option<Lease>,
    /// etcd's revision: every write (a leader key created or deleted, `initialized` put, the
    /// other writes of the cell's etcd) raises it.
    revision: u64,
    /// etcd's `initialized` key: written by every leader right after it wins the key.
    initialized: bool,
    /// `Config::wiped_until_caught_up`.
    wiped_until_caught_up: bool,
    next_id: u64,
    rates: Rates,
    faults_on: bool,
    /// Every acknowledged record: seq → (id, the epoch that acknowledged it).
    acked: BTreeMap<u64, (u64, u64)>,
    logs_changed: bool,
    report: Report,
    tracing: bool,
}

fn pick_rate(rng: &mut Rng, max: u64) -> u32 {
    // A third of the runs leave a kind out.
    if rng.below(3) == 0 {
        0
    } else {
        u32::try_from(rng.between(1, max)).unwrap_or(0)
    }
}

impl World {
    pub(super) fn new(seed: u64, config: &Config) -> World {
        let mut rng = Rng::new(seed ^ 0x0020_0014_5EED_0047);
        let rates = Rates {
            loss: pick_rate(&mut rng, 25),
            slow: pick_rate(&mut rng, 120),
            crash: pick_rate(&mut rng, 120),
            wipe: pick_rate(&mut rng, 60),
            expire: pick_rate(&mut rng, 120),
            slow_sync: pick_rate(&mut rng, 200),
            compact: pick_rate(&mut rng, 100),
        };
        let nodes = (0..N)
            .map(|_| Node {
                disk: Disk::default(),
                role: Role::Follower,
                inc: 0,
                pending: None,
                wiped_until: None,
                keeper: None,
                renewed: 0,
                cut_off_until: 0,
                lost: false,
            })
            .collect();
        let mut world = World {
            rng,
            now: 0,
            n: 0,
            queue: BinaryHeap::new(),
            nodes,
            conns: Vec::new(),
            lease: None,
            revision: 1,
            initialized: false,
            wiped_until_caught_up: !config.wiped_ends_at_adopt,
            next_id: 1,
            rates,
            faults_on: true,
            acked: BTreeMap::new(),
            logs_changed: false,
            report: Report::default(),
            tracing: config.trace,
        };
        // Each replica starts blank: it promises etcd's revision, then listens a lease's time
        // before it campaigns (`replica::run`).
        for node in 0..N {
            world.fence_blank(node);
            let at = TTL + world.rng.below(CAMPAIGN_EVERY);
            world.at(at, Ev::Campaign { node, inc: 0 });
        }
        world.at(1, Ev::ClientWrite);
        world.at(10, Ev::Fault);
        world.trace(format!("rates {rates:?}"));
        world
    }

    pub(super) fn run(mut self) -> Report {
        while let Some(Reverse(s)) = self.queue.pop() {
            if s.at > BUSY + SETTLE {
                break;
            }
            if self.faults_on && s.at > BUSY {
                self.faults_on = false;
                self.trace("the faults stop; the cell settles".to_owned());
            }
            self.now = s.at;
            self.expire_lease();
            self.report.steps += 1;
            self.handle(s.ev);
            if self.logs_changed {
                self.logs_changed = false;
                self.check_logs_agree();
            }
            if !self.report.violations.is_empty() {
                return self.finish();
            }
        }
        self.check_final();
        self.finish()
    }

    fn finish(mut self) -> Report {
        for v in self.report.violations.clone() {
            self.trace(format!("VIOLATION {v}"));
        }
        self.report
    }

    fn trace(&mut self, line: String) {
        if self.tracing {
            let line = format!("{:>5} {line}", self.now);
            self.report.trace.push(line);
        }
    }

    fn violation(&mut self, what: String) {
        self.report.violations.push(what);
    }

    fn fault(&mut self, kind: &'static str) {
        *self.report.faults.entry(kind).or_insert(0) += 1;
    }

    fn event(&mut self, kind: &'static str) {
        *self.report.events.entry(kind).or_insert(0) += 1;
    }

    fn at(&mut self, after: u64, ev: Ev) {
        self.n += 1;
        self.queue.push(Reverse(Scheduled {
            at: self.now + after,
            n: self.n,
            ev,
        }));
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver { conn, to, msg } => self.deliver(conn, to, msg),
            Ev::Broken { conn } => self.broken(conn),
            Ev::Restart { node, inc } => {
                if self.nodes[node].inc == inc {
                    self.restart(node);
                }
            }
            Ev::Campaign { node, inc } => {
                if self.nodes[node].inc == inc {
                    self.campaign_check(node);
                }
            }
            Ev::KeepAlive { node, inc } => {
                if self.nodes[node].inc == inc {
                    self.keep_alive(node);
                }
            }
            Ev::Synced { node, inc, upto } => {
                if self.nodes[node].inc == inc {
                    self.synced(node, upto);
                }
            }
            Ev::AckDeadline { node, inc, last } => {
                let waiting = matches!(&self.nodes[node].role,
                    Role::Leading(l) if l.batch.as_ref().is_some_and(|b| b.last == last));
                if self.nodes[node].inc == inc && waiting {
                    self.give_back_lease(node);
                    self.crash(
                        node,
                        format!(
                            "no follower acknowledged seq {last}: gives its lease back, steps down"
                        ),
                    );
                }
            }
            Ev::BarrierDeadline { node, inc } => {
                let waiting = matches!(&self.nodes[node].role, Role::Leading(l) if !l.serving);
                if self.nodes[node].inc == inc && waiting {
                    self.give_back_lease(node);
                    self.crash(
                        node,
                        "no follower joined its epoch: gives its lease back, aborts".to_owned(),
                    );
                }
            }
            Ev::PromiseTimeout { node, inc, conn } => {
                if self.nodes[node].inc == inc {
                    self.promise_timeout(node, conn);
                }
            }
            Ev::PromiseWindow { node, inc, epoch } => {
                if self.nodes[node].inc == inc {
                    self.promise_window(node, epoch);
                }
            }
            Ev::Reconnect { node, inc, peer } => {
                if self.nodes[node].inc == inc {
                    self.connect_session(node, peer);
                }
            }
            Ev::ClientWrite => self.client_write(),
            Ev::Fault => self.inject_fault(),
        }
    }

    // ---- connections ----

    fn open(&mut self, from: usize, to: usize) -> usize {
        let id = self.conns.len();
        let up = !matches!(self.nodes[to].role, Role::Down);
        self.conns.push(Conn {
            from,
            to,
            incs: [self.nodes[from].inc, self.nodes[to].inc],
            open: up,
            last_at: [0, 0],
        });
        if !up {
            // Connection refused.
            let after = self.rng.between(1, 3);
            self.at(after, Ev::Broken { conn: id });
        }
        id
    }

    fn valid(&self, conn: usize) -> bool {
        let c = &self.conns[conn];
        c.open && self.nodes[c.from].inc == c.incs[0] && self.nodes[c.to].inc == c.incs[1]
    }

    /// Breaks `conn`: its initiator learns it (a reset) a little later.
    fn break_conn(&mut self, conn: usize) {
        if self.conns[conn].open {
            self.conns[conn].open = false;
            let after = self.rng.between(1, 10);
            self.at(after, Ev::Broken { conn });
        }
    }

    fn send(&mut self, conn: usize, from: usize, msg: Msg) {
        if !self.valid(conn) {
            return;
        }
        let c = &self.conns[conn];
        let (to, way) = if from == c.from {
            (c.to, 0)
        } else {
            (c.from, 1)
        };
        if self.faults_on && self.rng.chance(self.rates.loss) {
            self.fault("message-lost");
            self.trace(format!("FAULT lost {from}->{to} {}", brief(&msg)));
            self.break_conn(conn);
            return;
        }
        let delay = if self.faults_on && self.rng.chance(self.rates.slow) {
            self.fault("message-delayed");
            self.rng.between(20, 250)
        } else {
            self.rng.between(1, 8)
        };
        let at = (self.now + delay).max(self.conns[conn].last_at[way]);
        self.conns[conn].last_at[way] = at;
        self.n += 1;
        self.queue.push(Reverse(Scheduled {
            at,
            n: self.n,
            ev: Ev::Deliver { conn, to, msg },
        }));
    }

    fn deliver(&mut self, conn: usize, to: usize, msg: Msg) {
        if !self.valid(conn) {
            return;
        }
        if to == self.conns[conn].to {
            self.listener(conn, to, msg);
        } else {
            self.initiator(conn, to, msg);
        }
    }

    // ---- the replication listener (`follower.rs`, the engine thread's `wal/follow.rs`) ----

    // long: one match over the messages a replica's listener takes, as follower.rs's read_requests, arm for arm.
    fn listener(&mut self, conn: usize, me: usize, msg: Msg) {
        if let Msg::Fetch { after, upto } = msg {
            // Served from the segments, whatever the engine thread is doing.
            if after < self.nodes[me].disk.compacted {
                self.trace(format!(
                    "r{me} cannot serve fetch({after}, {upto}): compacted"
                ));
                self.break_conn(conn);
                return;
            }
            let upto = upto.min(self.nodes[me].disk.last());
            let mut sent = after;
            while sent < upto {
                let last = upto.min(sent + PAGE as u64);
                let recs = self.nodes[me].disk.log[sent as usize..last as usize].to_vec();
                self.send(
                    conn,
                    me,
                    Msg::Frames {
                        first: sent + 1,
                        recs,
                    },
                );
                sent = last;
            }
            self.send(conn, me, Msg::Done);
            return;
        }
        if let Msg::Files {
            epoch,
            history,
            log,
            compacted,
        } = msg
        {
            self.rebuilt(me, epoch, history, log, compacted);
            return;
        }
        if matches!(self.nodes[me].role, Role::Leading(_)) {
            let reason = "this replica leads".to_owned();
            self.send(conn, me, Msg::Refused { reason });
            self.break_conn(conn);
            return;
        }
        let answer = match msg {
            Msg::Promise { epoch } => self.promise(me, epoch).map(|position| {
                self.trace(format!("r{me} promises epoch {epoch}"));
                Msg::Position { position }
            }),
            Msg::Join {
                epoch,
                start,
                leader,
            } => self.join(me, epoch, start, &leader),
            Msg::Append { epoch, first, recs } => self.append(me, epoch, first, &recs).map(|()| {
                let d = &self.nodes[me].disk;
                Msg::Ack {
                    seq: d.last(),
                    epoch: d.last_epoch(),
                }
            }),
            other => Err(format!("unexpected {}", brief(&other))),
        };
        match answer {
            Ok(reply) => self.send(conn, me, reply),
            Err(reason) => {
                self.trace(format!("r{me} refuses: {reason}"));
                self.send(conn, me, Msg::Refused { reason });
                self.break_conn(conn);
            }
        }
    }

    /// `FollowJob::Promise`: refused while `WIPED` (an empty log must not count toward a
    /// quorum).
    fn promise(&mut self, me: usize, epoch: u64) -> Result<Position, String> {
        let node = &mut self.nodes[me];
        if node.disk.wiped {
            self.event("promise-refused-wiped");
            return Err(format!(
                "epoch {epoch} not promised: this replica lost its data and has not caught up yet"
            ));
        }
        node.disk.promise(epoch)?;
        if node.pending.is_some_and(|(e, _)| e < epoch) {
            node.pending = None;
        }
        Ok(node.disk.position())
    }

    /// `FollowJob::Join` (`join` and the pending line).
    fn join(
        &mut self,
        me: usize,
        epoch: u64,
        start: u64,
        leader: &Position,
    ) -> Result<Msg, String> {
        let node = &mut self.nodes[me];
        node.disk.promise(epoch)?;
        let mine = node.disk.position();
        let rebuild = divergence(&mine, leader) < mine.last_seq
            || mine
                .history
                .iter()
                .any(|l| l.epoch == epoch && l.start != start);
        if rebuild {
            self.trace(format!("r{me} joins epoch {epoch}: not a prefix, rebuilds"));
            return Ok(Msg::Rebuild);
        }
        node.pending = Some((epoch, start));
        if node.disk.wiped && self.wiped_until_caught_up {
            node.wiped_until = Some((epoch, leader.last_seq));
        }
        self.adopt_pending(me)?;
        let d = &self.nodes[me].disk;
        let (last_seq, line) = (d.last(), d.last_epoch());
        self.trace(format!(
            "r{me} joins epoch {epoch} from {last_seq} (its history ends in {line})"
        ));
        Ok(Msg::Joined {
            last_seq,
            epoch: line,
        })
    }

    fn adopt_pending(&mut self, me: usize) -> Result<(), String> {
        let node = &mut self.nodes[me];
        let mut ended = false;
        if let Some((epoch, start)) = node.pending {
            if node.disk.last() + 1 >= start {
                let added = node.disk.adopt(epoch, start)?;
                node.pending = None;
                self.logs_changed = true;
                // spot-core: `Epochs::adopt` ends `WIPED` with the line.
                ended = added && node.disk.wiped && !self.wiped_until_caught_up;
            }
        }
        // The proposed fix: only once the log holds what the leader had when it joined.
        if let Some((epoch, upto)) = node.wiped_until {
            if node.disk.last_epoch() == epoch && node.disk.last() >= upto {
                node.wiped_until = None;
                ended = node.disk.wiped;
            }
        }
        if ended {
            node.disk.wiped = false;
            let (last, line) = (node.disk.last(), node.disk.last_epoch());
            self.trace(format!(
                "r{me} is no longer WIPED: {last} records, its history ends in {line}"
            ));
        }
        Ok(())
    }

    /// `FollowJob::Append`: checked, written, fsynced.
    fn append(&mut self, me: usize, epoch: u64, first: u64, recs: &[Rec]) -> Result<(), String> {
        let disk = &mut self.nodes[me].disk;
        if !rules::accepts_frames(disk.promised, epoch) {
            return Err(format!(
                "frames of epoch {epoch} refused: promised {}",
                disk.promised
            ));
        }
        if first != disk.last() + 1 || recs.is_empty() {
            return Err(format!("frames from {first} do not follow {}", disk.last()));
        }
        disk.log.extend_from_slice(recs);
        disk.synced = disk.log.len();
        self.logs_changed = true;
        self.maybe_compact(me);
        self.adopt_pending(me)
    }

    /// The leader's files, received whole: the process restarts, and `swap_in_rebuild` takes
    /// them unless this replica promised an epoch above the sender's meanwhile.
    fn rebuilt(
        &mut self,
        me: usize,
        epoch: u64,
        history: Vec<EpochStart>,
        log: Vec<Rec>,
        compacted: u64,
    ) {
        let node = &mut self.nodes[me];
        if node.disk.promised > epoch {
            let promised = node.disk.promised;
            self.trace(format!(
                "r{me} discards the rebuild from epoch {epoch}: it promised {promised} since; restarts"
            ));
            self.event("rebuild-discarded");
            self.crash_quiet(me);
            self.restart(me);
            return;
        }
        // The data directory is replaced: no `WIPED` in the leader's files.
        node.disk = Disk {
            synced: log.len(),
            log,
            compacted,
            promised: epoch,
            history,
            wiped: false,
        };
        self.logs_changed = true;
        let last = self.nodes[me].disk.last();
        self.trace(format!(
            "r{me} rebuilt from the leader's files (epoch {epoch}, {last} records); restarts"
        ));
        self.crash_quiet(me);
        self.restart(me);
    }

    // ---- the initiator's side: a take-over, or a leader's sessions ----

    fn initiator(&mut self, conn: usize, me: usize, msg: Msg) {
        match msg {
            Msg::Position { position } => self.promised(me, conn, Some(position)),
            Msg::Frames { first, recs } => self.fetched(me, conn, first, &recs),
            Msg::Done => self.fetch_done(me, conn),
            Msg::Joined { last_seq, epoch } => self.joined(me, conn, last_seq, epoch),
            Msg::Rebuild => self.send_files(me, conn),
            Msg::Ack { seq, epoch } => {
                let peer = self.conns[conn].to;
                if let Role::Leading(l) = &mut self.nodes[me].role {
                    if l.sessions[peer].conn == Some(conn) {
                        l.acks[peer] = Some((seq, epoch));
                        self.progress(me);
                    }
                }
            }
            Msg::Refused { .. } => self.broken(conn),
            other => {
                let what = brief(&other);
                self.trace(format!("r{me} ignores {what}"));
            }
        }
    }

    /// A connection's initiator learns it is gone.
    fn broken(&mut self, conn: usize) {
        self.conns[conn].open = false;
        let (me, peer) = (self.conns[conn].from, self.conns[conn].to);
        if self.nodes[me].inc != self.conns[conn].incs[0] {
            return;
        }
        let mut asking = false;
        let mut fetching = false;
        let mut session = false;
        match &mut self.nodes[me].role {
            Role::TakingOver(t) => {
                asking = t.asking.contains(&conn);
                fetching = t.fetching == Some(conn);
            }
            Role::Leading(l) if l.sessions[peer].conn == Some(conn) => {
                l.sessions[peer] = Session::default();
                session = true;
            }
            _ => {}
        }
        if asking {
            self.promised(me, conn, None);
        } else if fetching {
            self.take_over_failed(me, "fetching the most advanced log failed", FAILED_REST);
        } else if session {
            let inc = self.nodes[me].inc;
            self.at(
                RECONNECT,
                Ev::Reconnect {
                    node: me,
                    inc,
                    peer,
                },
            );
        }
    }

    // ---- leadership: the campaign loop and the lease (`replica/mod.rs`, `lease.rs`) ----

    fn lease_holder(&self) -> Option<Lease> {
        self.lease.filter(|l| self.now < l.expires)
    }

    /// etcd deletes the key of a lease that ran out (a write: the revision grows).
    fn expire_lease(&mut self) {
        if self.lease.is_some_and(|l| self.now >= l.expires) {
            self.end_lease();
        }
    }

    fn end_lease(&mut self) {
        if self.lease.take().is_some() {
            self.revision += 1;
        }
    }

    /// `Etcd::revoke` of `me`'s lease, when etcd is within its reach.
    fn give_back_lease(&mut self, me: usize) {
        let Some(epoch) = self.nodes[me].keeper else {
            return;
        };
        if self.now >= self.nodes[me].cut_off_until
            && self.lease.is_some_and(|l| l.node == me && l.epoch == epoch)
        {
            self.trace(format!("r{me} revokes its lease (epoch {epoch})"));
            self.end_lease();
        }
    }

    /// `fence_blank` at start: a replica with no records, no promise and no history asks etcd
    /// whether the cell has had a leader (then it is `WIPED`) and promises the current epoch
    /// (the leader key's create revision, or etcd's revision when none leads). False while etcd
    /// is out of its reach (it waits).
    fn fence_blank(&mut self, me: usize) -> bool {
        let disk = &self.nodes[me].disk;
        if disk.last() != 0 || !disk.blank() {
            return true;
        }
        if self.now < self.nodes[me].cut_off_until {
            return false;
        }
        let epoch = self.lease_holder().map_or(self.revision, |l| l.epoch);
        let initialized = self.initialized;
        let disk = &mut self.nodes[me].disk;
        disk.wiped = initialized;
        disk.promised = epoch;
        if initialized {
            self.event("started-wiped");
        }
        self.trace(format!(
            "r{me} starts blank: promises epoch {epoch}{}",
            if initialized {
                "; the cell had a leader: WIPED"
            } else {
                ""
            }
        ));
        true
    }

    fn campaign_check(&mut self, me: usize) {
        if !matches!(self.nodes[me].role, Role::Follower) {
            return;
        }
        let inc = self.nodes[me].inc;
        let cut_off = self.now < self.nodes[me].cut_off_until;
        if cut_off || self.lease_holder().is_some() || self.nodes[me].keeper.is_some() {
            let jitter = self.rng.below(5);
            self.at(CAMPAIGN_EVERY + jitter, Ev::Campaign { node: me, inc });
            return;
        }
        if self.nodes[me].disk.wiped {
            // No leader, and this replica lost its data: it waits to be rebuilt.
            self.event("campaign-skipped-wiped");
            self.at(WIPED_REST, Ev::Campaign { node: me, inc });
            return;
        }
        // etcd: the key is free; this replica's transaction creates it.
        self.revision += 1 + self.rng.below(3);
        let epoch = self.revision;
        self.lease = Some(Lease {
            node: me,
            epoch,
            expires: self.now + TTL,
        });
        // `mark_initialized`, before the take-over: a put, the revision grows.
        self.initialized = true;
        self.revision += 1;
        let node = &mut self.nodes[me];
        node.keeper = Some(epoch);
        node.renewed = self.now;
        self.at(RENEW, Ev::KeepAlive { node: me, inc });
        self.trace(format!(
            "r{me} wins the leader key: epoch {epoch}; takes over"
        ));
        // The own promise, through the engine thread.
        let mine = match self.promise(me, epoch) {
            Ok(p) => p,
            Err(e) => {
                self.take_over_failed(me, &e, FAILED_REST);
                return;
            }
        };
        self.nodes[me].role = Role::TakingOver(TakeOver {
            epoch,
            mine,
            asking: Vec::new(),
            promised: Vec::new(),
            fetching: None,
        });
        // Both peers asked at once, each answer waited for at most `PROMISE_WAIT`.
        for peer in (0..N).filter(|&p| p != me) {
            let conn = self.open(me, peer);
            if let Role::TakingOver(t) = &mut self.nodes[me].role {
                t.asking.push(conn);
            }
            self.send(conn, me, Msg::Promise { epoch });
            self.at(
                PROMISE_WAIT,
                Ev::PromiseTimeout {
                    node: me,
                    inc,
                    conn,
                },
            );
        }
    }

    /// A peer's answer to the promise asked on `conn` (`None`: refused, or the connection
    /// failed).
    fn promised(&mut self, me: usize, conn: usize, position: Option<Position>) {
        let peer = self.conns[conn].to;
        let Role::TakingOver(t) = &mut self.nodes[me].role else {
            return;
        };
        if !t.asking.contains(&conn) {
            return;
        }
        t.asking.retain(|&c| c != conn);
        let epoch = t.epoch;
        match position {
            Some(p) => {
                let first = t.promised.is_empty();
                t.promised.push((peer, conn, p));
                if first {
                    let inc = self.nodes[me].inc;
                    self.at(
                        AFTER_FIRST_PROMISE,
                        Ev::PromiseWindow {
                            node: me,
                            inc,
                            epoch,
                        },
                    );
                }
            }
            None => self.trace(format!("r{me}: no promise from r{peer}")),
        }
        self.decide_when_answered(me);
    }

    fn promise_timeout(&mut self, me: usize, conn: usize) {
        let Role::TakingOver(t) = &mut self.nodes[me].role else {
            return;
        };
        if !t.asking.contains(&conn) {
            return;
        }
        t.asking.retain(|&c| c != conn);
        let peer = self.conns[conn].to;
        self.trace(format!("r{me}: no promise from r{peer} in time"));
        // The answer's future is dropped: its connection closes.
        self.break_conn(conn);
        self.decide_when_answered(me);
    }

    /// Both peers answered (or failed to): decide now.
    fn decide_when_answered(&mut self, me: usize) {
        if matches!(&self.nodes[me].role, Role::TakingOver(t) if t.asking.is_empty()) {
            self.decide(me);
        }
    }

    /// `AFTER_FIRST_PROMISE` after the first promise: decide with the promises that came.
    fn promise_window(&mut self, me: usize, epoch: u64) {
        let Role::TakingOver(t) = &mut self.nodes[me].role else {
            return;
        };
        if t.epoch != epoch || t.fetching.is_some() {
            return;
        }
        self.decide(me);
    }

    /// Step 2: the most advanced log among the promises, adopted through `rules::adopt`.
    fn decide(&mut self, me: usize) {
        let Role::TakingOver(t) = &mut self.nodes[me].role else {
            return;
        };
        if t.fetching.is_some() {
            return;
        }
        // The promises still awaited are dropped with their connections.
        let dropped = std::mem::take(&mut t.asking);
        // `max_by` keeps the last of equals, as the real take-over's does.
        let best = t
            .promised
            .iter()
            .max_by(|a, b| (a.2.last_epoch(), a.2.last_seq).cmp(&(b.2.last_epoch(), b.2.last_seq)))
            .cloned();
        let mine = t.mine.clone();
        for conn in dropped {
            self.break_conn(conn);
        }
        let Some((best, conn, position)) = best else {
            // Cut off, or alone: let a replica that can reach the others win next.
            self.take_over_failed(me, "no other replica promised", 2 * TTL);
            return;
        };
        match rules::adopt(&mine, &position) {
            Adopt::Lead => self.lead(me),
            Adopt::Diverged => {
                self.take_over_failed(me, "this log has a tail the others lack", 3 * TTL);
            }
            Adopt::Fetch { after, upto } => {
                if !self.valid(conn) {
                    self.take_over_failed(me, "fetching the most advanced log failed", FAILED_REST);
                    return;
                }
                self.trace(format!("r{me} fetches {}..={upto} from r{best}", after + 1));
                if let Role::TakingOver(t) = &mut self.nodes[me].role {
                    t.fetching = Some(conn);
                }
                // On the promise's own connection, as the real take-over does.
                self.send(conn, me, Msg::Fetch { after, upto });
            }
        }
    }

    fn fetched(&mut self, me: usize, conn: usize, first: u64, recs: &[Rec]) {
        let epoch = match &self.nodes[me].role {
            Role::TakingOver(t) if t.fetching == Some(conn) => t.epoch,
            _ => return,
        };
        if let Err(e) = self.append(me, epoch, first, recs) {
            self.take_over_failed(me, &e, 100);
        }
    }

    fn fetch_done(&mut self, me: usize, conn: usize) {
        if matches!(&self.nodes[me].role, Role::TakingOver(t) if t.fetching == Some(conn)) {
            self.lead(me);
        }
    }

    /// `TakeOver` errors: the keeper stops, the lease is revoked (when etcd is within reach),
    /// the replica rests and follows again (the campaign loop's check comes after the rest).
    fn take_over_failed(&mut self, me: usize, why: &str, rest: u64) {
        self.trace(format!("r{me}: take-over failed: {why}; not leading"));
        self.give_back_lease(me);
        let node = &mut self.nodes[me];
        node.keeper = None;
        node.role = Role::Follower;
        node.inc += 1;
        let inc = node.inc;
        self.reattach(me);
        self.at(rest + CAMPAIGN_EVERY, Ev::Campaign { node: me, inc });
    }

    /// Keeps the connections a role change must not close (the replica did not restart): a
    /// new incarnation voids its timers, so its open connections move to it.
    fn reattach(&mut self, me: usize) {
        let inc = self.nodes[me].inc;
        for c in &mut self.conns {
            if c.open && c.to == me && c.incs[1] + 1 == inc {
                c.incs[1] = inc;
            }
        }
    }

    /// Step 3: `FollowJob::Lead`, then the shipper and the barrier.
    fn lead(&mut self, me: usize) {
        let Role::TakingOver(t) = &self.nodes[me].role else {
            return;
        };
        let epoch = t.epoch;
        let disk = &mut self.nodes[me].disk;
        let start = disk.last() + 1;
        if epoch != disk.promised {
            // The campaign ends in an error; the lease's keeper stays and ends the process
            // once the key is gone (it is: a higher epoch was promised).
            let promised = disk.promised;
            self.trace(format!(
                "r{me}: epoch {epoch} is not the promised {promised}"
            ));
            let node = &mut self.nodes[me];
            node.role = Role::Follower;
            node.inc += 1;
            let inc = node.inc;
            self.reattach(me);
            if self.nodes[me].keeper.is_some() {
                self.at(RENEW, Ev::KeepAlive { node: me, inc });
            }
            return;
        }
        if let Err(e) = disk.adopt(epoch, start) {
            self.take_over_failed(me, &e, FAILED_REST);
            return;
        }
        self.logs_changed = true;
        let history = self.nodes[me].disk.history.clone();
        self.trace(format!(
            "r{me} leads epoch {epoch} from seq {start}; history {}",
            show_history(&history)
        ));
        // The listener refuses everything from now on; connections it answered close.
        for c in 0..self.conns.len() {
            if self.conns[c].to == me && self.valid(c) {
                self.break_conn(c);
            }
        }
        self.nodes[me].role = Role::Leading(Box::new(Leader {
            epoch,
            start,
            history,
            serving: false,
            acks: [None; N],
            sessions: [Session::default(); N],
            batch: None,
            queue: VecDeque::new(),
        }));
        let inc = self.nodes[me].inc;
        self.at(ACK_TIMEOUT, Ev::BarrierDeadline { node: me, inc });
        for peer in 0..N {
            if peer != me {
                self.connect_session(me, peer);
            }
        }
    }

    fn keep_alive(&mut self, me: usize) {
        let Some(epoch) = self.nodes[me].keeper else {
            return;
        };
        let inc = self.nodes[me].inc;
        if self.now < self.nodes[me].cut_off_until {
            // etcd unreachable: the leader stops once a renewal is a lease's time late.
            if self.now - self.nodes[me].renewed + RENEW >= TTL {
                self.crash(me, "the lease could not be renewed: steps down".to_owned());
            } else {
                self.at(RENEW, Ev::KeepAlive { node: me, inc });
            }
            return;
        }
        match self.lease_holder() {
            Some(l) if l.node == me && l.epoch == epoch => {
                self.lease = Some(Lease {
                    expires: self.now + TTL,
                    ..l
                });
                self.nodes[me].renewed = self.now;
                self.at(RENEW, Ev::KeepAlive { node: me, inc });
            }
            _ => self.crash(me, "etcd says the lease is gone: steps down".to_owned()),
        }
    }

    // ---- leading: sessions, batches, acknowledgements (`leader.rs`, `wal/commit.rs`) ----

    fn connect_session(&mut self, me: usize, peer: usize) {
        let (epoch, start, history) = match &self.nodes[me].role {
            Role::Leading(l) if l.sessions[peer].conn.is_none() => {
                (l.epoch, l.start, l.history.clone())
            }
            _ => return,
        };
        let conn = self.open(me, peer);
        let leader = Position {
            history,
            last_seq: self.nodes[me].disk.last(),
        };
        if let Role::Leading(l) = &mut self.nodes[me].role {
            l.sessions[peer] = Session {
                conn: Some(conn),
                joined: false,
                sent: 0,
            };
        }
        self.send(
            conn,
            me,
            Msg::Join {
                epoch,
                start,
                leader,
            },
        );
    }

    fn joined(&mut self, me: usize, conn: usize, last_seq: u64, epoch: u64) {
        let peer = self.conns[conn].to;
        let Role::Leading(l) = &mut self.nodes[me].role else {
            return;
        };
        if l.sessions[peer].conn != Some(conn) {
            return;
        }
        if self.nodes[me].disk.compacted > last_seq {
            // What it lacks was compacted here: it rebuilds from this leader's files.
            self.trace(format!(
                "r{me}: r{peer} is behind the compacted log ({last_seq}): rebuilding it"
            ));
            self.event("rebuild-behind-compaction");
            self.send_files(me, conn);
            return;
        }
        let Role::Leading(l) = &mut self.nodes[me].role else {
            return;
        };
        l.acks[peer] = Some((last_seq, epoch));
        l.sessions[peer].joined = true;
        l.sessions[peer].sent = last_seq;
        self.ship(me, peer);
        self.progress(me);
    }

    /// Sends `peer` what it lacks: the catch-up from the segments, then each batch.
    fn ship(&mut self, me: usize, peer: usize) {
        let (conn, sent, epoch) = match &self.nodes[me].role {
            Role::Leading(l) if l.sessions[peer].joined => {
                (l.sessions[peer].conn, l.sessions[peer].sent, l.epoch)
            }
            _ => return,
        };
        let Some(conn) = conn else { return };
        if sent < self.nodes[me].disk.compacted {
            // The catch-up cannot read them: the session ends, and the next one's join finds
            // the follower behind the compacted log.
            self.trace(format!(
                "r{me}: the catch-up of r{peer} from {sent} is compacted"
            ));
            self.break_conn(conn);
            return;
        }
        let written = self.nodes[me].disk.last();
        let mut sent = sent;
        while sent < written {
            let last = written.min(sent + PAGE as u64);
            let recs = self.nodes[me].disk.log[sent as usize..last as usize].to_vec();
            self.send(
                conn,
                me,
                Msg::Append {
                    epoch,
                    first: sent + 1,
                    recs,
                },
            );
            sent = last;
        }
        if let Role::Leading(l) = &mut self.nodes[me].role {
            l.sessions[peer].sent = sent;
        }
    }

    fn send_files(&mut self, me: usize, conn: usize) {
        let peer = self.conns[conn].to;
        let (epoch, history) = match &self.nodes[me].role {
            Role::Leading(l) if l.sessions[peer].conn == Some(conn) => (l.epoch, l.history.clone()),
            _ => return,
        };
        let log = self.nodes[me].disk.log.clone();
        let compacted = self.nodes[me].disk.compacted;
        self.send(
            conn,
            me,
            Msg::Files {
                epoch,
                history,
                log,
                compacted,
            },
        );
    }

    fn client_write(&mut self) {
        if self.now >= BUSY {
            return;
        }
        let after = self.rng.between(2, 12);
        self.at(after, Ev::ClientWrite);
        let serving: Vec<usize> = (0..N)
            .filter(|&i| matches!(&self.nodes[i].role, Role::Leading(l) if l.serving))
            .collect();
        if serving.is_empty() {
            return;
        }
        let me = serving[self.rng.index(serving.len())];
        let id = self.next_id;
        self.next_id += 1;
        if let Role::Leading(l) = &mut self.nodes[me].role {
            l.queue.push_back(id);
        }
        self.next_batch(me);
    }

    /// The group commit: one batch at a time, written, shipped, fsynced, then acknowledged.
    fn next_batch(&mut self, me: usize) {
        let take = self.rng.between(1, 3) as usize;
        let node = &mut self.nodes[me];
        let Role::Leading(l) = &mut node.role else {
            return;
        };
        if !l.serving || l.batch.is_some() || l.queue.is_empty() {
            return;
        }
        let first = node.disk.last() + 1;
        let epoch = l.epoch;
        for _ in 0..take {
            let Some(id) = l.queue.pop_front() else { break };
            node.disk.log.push(Rec { id, epoch });
        }
        let last = node.disk.last();
        l.batch = Some(Batch {
            first,
            last,
            synced: false,
        });
        self.logs_changed = true;
        for peer in 0..N {
            if peer != me {
                self.ship(me, peer);
            }
        }
        let inc = self.nodes[me].inc;
        let sync = if self.faults_on && self.rng.chance(self.rates.slow_sync) {
            self.rng.between(5, 60)
        } else {
            self.rng.between(0, 3)
        };
        let upto = last as usize;
        self.at(
            sync,
            Ev::Synced {
                node: me,
                inc,
                upto,
            },
        );
        self.at(
            sync + ACK_TIMEOUT,
            Ev::AckDeadline {
                node: me,
                inc,
                last,
            },
        );
    }

    /// A snapshot, and the segments below it compacted (on a leader and on a follower alike,
    /// of fsynced records only).
    fn maybe_compact(&mut self, me: usize) {
        if !self.rng.chance(self.rates.compact) {
            return;
        }
        let keep = self.rng.below(3 * PAGE as u64);
        let disk = &mut self.nodes[me].disk;
        let upto = (disk.synced as u64).saturating_sub(keep);
        disk.compacted = disk.compacted.max(upto);
    }

    fn synced(&mut self, me: usize, upto: usize) {
        self.maybe_compact(me);
        let node = &mut self.nodes[me];
        node.disk.synced = node.disk.synced.max(upto.min(node.disk.log.len()));
        if let Role::Leading(l) = &mut node.role {
            if let Some(b) = &mut l.batch {
                if b.last as usize <= upto {
                    b.synced = true;
                }
            }
        }
        self.progress(me);
    }

    /// After an acknowledgement or an fsync: the barrier, or the batch in flight.
    fn progress(&mut self, me: usize) {
        let Role::Leading(l) = &self.nodes[me].role else {
            return;
        };
        let acks = l.acks.iter().flatten().copied();
        if !l.serving {
            if rules::may_acknowledge(acks, l.start - 1, l.epoch) {
                self.begin_serving(me);
            }
            return;
        }
        let Some(b) = &l.batch else { return };
        if b.synced && rules::may_acknowledge(acks, b.last, l.epoch) {
            let (first, last, epoch) = (b.first, b.last, l.epoch);
            self.acknowledge(me, epoch, first, last);
            if let Role::Leading(l) = &mut self.nodes[me].role {
                l.batch = None;
            }
            self.next_batch(me);
        }
    }

    fn begin_serving(&mut self, me: usize) {
        let Role::Leading(l) = &mut self.nodes[me].role else {
            return;
        };
        l.serving = true;
        let epoch = l.epoch;
        self.report.leaderships += 1;
        self.trace(format!("r{me} serves epoch {epoch}"));
        // Invariant 1: every write acknowledged in an earlier epoch is in the log of a leader
        // that begins serving. (A deposed leader's barrier may pass late, on a follower's
        // answer from before the next promise; fenced, it acknowledges nothing after.)
        if let Some(v) = self.missing_acked(me, u64::MAX, epoch) {
            self.violation(format!("r{me} begins serving epoch {epoch} without {v}"));
        }
        self.next_batch(me);
    }

    /// The first record acknowledged up to `upto` by an epoch below `before` that `me`'s log
    /// lacks or holds differently.
    fn missing_acked(&self, me: usize, upto: u64, before: u64) -> Option<String> {
        let log = &self.nodes[me].disk.log;
        self.acked.range(..=upto).find_map(|(&seq, &(id, by))| {
            if by >= before {
                return None;
            }
            let here = log.get(seq as usize - 1);
            (here.map(|r| r.id) != Some(id)).then(|| {
                format!(
                    "acknowledged seq {seq} = write {id} (epoch {by}); its log has {}",
                    here.map_or("nothing".to_owned(), |r| format!(
                        "write {} of epoch {}",
                        r.id, r.epoch
                    ))
                )
            })
        })
    }

    fn acknowledge(&mut self, me: usize, epoch: u64, first: u64, last: u64) {
        let recs = self.nodes[me].disk.log[first as usize - 1..last as usize].to_vec();
        self.trace(format!(
            "r{me} acknowledges {first}..={last} in epoch {epoch}"
        ));
        // Invariant 2: an acknowledgement never contradicts an earlier one: the leader
        // acknowledging up to `last` holds every record acknowledged up to there. (A deposed
        // leader may still acknowledge a batch a follower held before it promised the next
        // epoch: the records are on two replicas, and the next leader adopted them.)
        if let Some(v) = self.missing_acked(me, last, u64::MAX) {
            self.violation(format!(
                "r{me} acknowledges {first}..={last} in epoch {epoch} but lacks {v}"
            ));
        }
        for (i, rec) in recs.iter().enumerate() {
            let seq = first + i as u64;
            if let Some(&(id, by)) = self.acked.get(&seq) {
                if id != rec.id {
                    self.violation(format!(
                        "seq {seq} acknowledged twice: write {id} in epoch {by}, write {} in epoch {epoch}",
                        rec.id
                    ));
                }
            }
            self.acked.insert(seq, (rec.id, epoch));
            self.report.acknowledged += 1;
        }
    }

    // ---- faults ----

    fn crash_quiet(&mut self, me: usize) {
        let node = &mut self.nodes[me];
        node.inc += 1;
        node.role = Role::Down;
        node.keeper = None;
        node.pending = None;
        node.wiped_until = None;
        node.disk.reload();
        self.logs_changed = true;
        for c in 0..self.conns.len() {
            let conn = &self.conns[c];
            if conn.open && (conn.from == me || conn.to == me) {
                self.break_conn(c);
            }
        }
    }

    fn crash(&mut self, me: usize, why: String) {
        if matches!(self.nodes[me].role, Role::Down) {
            return;
        }
        self.trace(format!("r{me} {why}"));
        self.crash_quiet(me);
        let inc = self.nodes[me].inc;
        let after = self.rng.between(20, 400);
        self.at(after, Ev::Restart { node: me, inc });
    }

    fn restart(&mut self, me: usize) {
        self.nodes[me].disk.reload();
        // A blank replica answers nothing before etcd told it the epoch to promise.
        if !self.fence_blank(me) {
            let inc = self.nodes[me].inc;
            self.at(ETCD_RETRY, Ev::Restart { node: me, inc });
            return;
        }
        let node = &mut self.nodes[me];
        node.inc += 1;
        node.role = Role::Follower;
        node.pending = None;
        node.keeper = None;
        node.lost = false;
        let inc = node.inc;
        let (last, promised) = (node.disk.last(), node.disk.promised);
        let history = show_history(&node.disk.history);
        let wiped = if node.disk.wiped { ", WIPED" } else { "" };
        self.trace(format!(
            "r{me} restarts: {last} records, promised {promised}, history {history}{wiped}"
        ));
        // It listens a lease's time before it campaigns (`replica::run`).
        let after = TTL + self.rng.below(CAMPAIGN_EVERY);
        self.at(after, Ev::Campaign { node: me, inc });
    }

    fn inject_fault(&mut self) {
        if !self.faults_on {
            return;
        }
        let after = self.rng.between(5, 40);
        self.at(after, Ev::Fault);
        let me = self.rng.index(N);
        let r = self.rates;
        if self.rng.chance(r.crash) {
            if !matches!(self.nodes[me].role, Role::Down) {
                self.fault("crash");
                self.crash(me, "FAULT crash".to_owned());
            }
        } else if self.rng.chance(r.wipe) {
            // Any one disk, at any time: never while another replica's loss is not yet made
            // good (it has not restarted, or is still `WIPED`).
            let one_at_a_time =
                (0..N).all(|i| i == me || !(self.nodes[i].lost || self.nodes[i].disk.wiped));
            if one_at_a_time {
                self.fault("disk-lost");
                self.trace(format!("FAULT r{me} loses its disk"));
                self.crash(me, "FAULT crash (disk lost)".to_owned());
                self.nodes[me].disk = Disk::default();
                self.nodes[me].lost = true;
                self.logs_changed = true;
            }
        } else if self.rng.chance(r.expire) {
            if let Some(l) = self.lease_holder() {
                self.fault("lease-expired");
                let cut = self.rng.between(0, 2 * RENEW);
                self.trace(format!(
                    "FAULT the lease of r{} (epoch {}) ends; it is cut off from etcd for {cut} ms",
                    l.node, l.epoch
                ));
                self.end_lease();
                self.nodes[l.node].cut_off_until = self.now + cut;
            }
        }
    }

    // ---- invariants ----

    /// Invariant 3: two logs whose histories name the same epoch at a seq hold the same
    /// record there.
    fn check_logs_agree(&mut self) {
        for a in 0..N {
            for b in a + 1..N {
                if let Some(v) = disagreement(&self.nodes[a].disk, &self.nodes[b].disk) {
                    self.violation(format!("r{a} and r{b}: {v}"));
                    return;
                }
            }
        }
    }

    /// At the end: the leader of the highest epoch that serves holds every acknowledged write.
    fn check_final(&mut self) {
        let leader = (0..N)
            .filter_map(|i| match &self.nodes[i].role {
                Role::Leading(l) if l.serving => Some((l.epoch, i)),
                _ => None,
            })
            .max();
        match leader {
            Some((epoch, me)) => {
                self.trace(format!("the end: r{me} serves epoch {epoch}"));
                if let Some(v) = self.missing_acked(me, u64::MAX, u64::MAX) {
                    self.violation(format!("the final leader r{me} (epoch {epoch}) lacks {v}"));
                }
            }
            None => self.trace("the end: no leader serves".to_owned()),
        }
    }
}

/// The first seq where both logs' histories name the same epoch but the records differ.
fn disagreement(a: &Disk, b: &Disk) -> Option<String> {
    let upto = a.log.len().min(b.log.len());
    // Seqs where either history changes epoch: between them, each side names one epoch.
    let mut cuts: Vec<u64> = a
        .history
        .iter()
        .chain(&b.history)
        .map(|e| e.start)
        .filter(|&s| s >= 1 && s as usize <= upto)
        .collect();
    cuts.push(1);
    cuts.sort_unstable();
    cuts.dedup();
    for (i, &from) in cuts.iter().enumerate() {
        let to = cuts.get(i + 1).map_or(upto as u64, |&n| n - 1);
        if to < from {
            continue;
        }
        let (ea, eb) = (epoch_of(&a.history, from), epoch_of(&b.history, from));
        if ea != eb {
            continue;
        }
        let range = from as usize - 1..to as usize;
        if a.log[range.clone()] != b.log[range.clone()] {
            let at = range
                .clone()
                .find(|&s| a.log[s] != b.log[s])
                .unwrap_or(range.start);
            return Some(format!(
                "both name epoch {ea} at seq {} but hold write {} (epoch {}) and write {} (epoch {})",
                at + 1,
                a.log[at].id,
                a.log[at].epoch,
                b.log[at].id,
                b.log[at].epoch
            ));
        }
    }
    None
}

fn show_history(history: &[EpochStart]) -> String {
    let lines: Vec<String> = history
        .iter()
        .map(|e| format!("{}@{}", e.epoch, e.start))
        .collect();
    format!("[{}]", lines.join(" "))
}

fn brief(msg: &Msg) -> String {
    match msg {
        Msg::Promise { epoch } => format!("promise({epoch})"),
        Msg::Position { position } => format!(
            "position({}, {})",
            show_history(&position.history),
            position.last_seq
        ),
        Msg::Fetch { after, upto } => format!("fetch({after}, {upto})"),
        Msg::Frames { first, recs } => format!("frames({first}+{})", recs.len()),
        Msg::Done => "done".to_owned(),
        Msg::Join { epoch, start, .. } => format!("join({epoch}, {start})"),
        Msg::Joined { last_seq, epoch } => format!("joined({last_seq}, {epoch})"),
        Msg::Rebuild => "rebuild".to_owned(),
        Msg::Files {
            epoch,
            log,
            compacted,
            ..
        } => format!("files({epoch}, {}, compacted {compacted})", log.len()),
        Msg::Append { epoch, first, recs } => {
            format!(
                "append({epoch}, {first}..={})",
                first + recs.len() as u64 - 1
            )
        }
        Msg::Ack { seq, epoch } => format!("ack({seq}, {epoch})"),
        Msg::Refused { reason } => format!("refused({reason})"),
    }
}

#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The planted bug to switch on (on this thread, for this run).
    pub plant: Option<spot_core::replica::rules::plant::Bug>,
    /// Keep the whole trace.
    pub trace: bool,
    /// Model spot-core as it was before the fix of seed 14592 (docs/adr/0014-simulation.md,
    /// "Replication"): a `WIPED` replica ended `WIPED` as soon as the epoch's line was adopted
    /// (at once when that epoch began at seq 1). Without it (the code today) `WIPED` ends only
    /// once its log holds every record the leader it joined had written then.
    pub wiped_ends_at_adopt: bool,
}

/// What one seed's run did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub violations: Vec<String>,
    pub trace: Vec<String>,
    /// Events handled.
    pub steps: u64,
    /// Client writes acknowledged.
    pub acknowledged: u64,
    /// Leaderships that began serving.
    pub leaderships: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// What the fixes of bb72cd88 did, by kind (a rebuild discarded at swap-in, a replica that
    /// started `WIPED`, a promise it refused, a campaign it skipped, a follower behind the
    /// compacted log rebuilt): evidence that the runs take those paths.
    pub events: BTreeMap<&'static str, u64>,
}
