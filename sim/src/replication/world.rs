//! The model: three replicas, the lease oracle, connections, faults and the invariants.
//!
//! Time is in simulated milliseconds, scaled down tenfold from the product's defaults (lease
//! TTL 300 ms, renewed every 100 ms, acknowledgement timeout 300 ms, a campaign check every
//! 25 ms), so a short run sees many leaderships. Each step handles the earliest event; ties go
//! by the order they were scheduled in.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use spot_core::replica::history::{divergence, epoch_of, EpochStart, Position};
use spot_core::replica::rules::{self, Adopt};

use super::{Config, Report};
use crate::rng::Rng;

const N: usize = 3;
const TTL: u64 = 300;
const RENEW: u64 = TTL / 3;
const ACK_TIMEOUT: u64 = 300;
const CAMPAIGN_EVERY: u64 = 25;
const RECONNECT: u64 = 20;
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
    promised: u64,
    history: Vec<EpochStart>,
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

    /// `Epochs::adopt`.
    fn adopt(&mut self, epoch: u64, start: u64) -> Result<(), String> {
        if self.history.last().is_some_and(|e| e.epoch >= epoch) {
            return Ok(());
        }
        self.promise(epoch)?;
        self.history.push(EpochStart { epoch, start });
        Ok(())
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
    TakeOverDeadline {
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

/// A replica taking over (`leader::take_over`): it asks its peers one after the other, within
/// one deadline.
#[derive(Debug)]
struct TakeOver {
    epoch: u64,
    mine: Position,
    peers: [usize; 2],
    next: usize,
    asking: Option<usize>,
    promised: Vec<(usize, Position)>,
    deadline: u64,
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
    /// The lease keeper's epoch, while it runs.
    keeper: Option<u64>,
    renewed: u64,
    /// etcd unreachable from this replica until then (its renewals fail).
    cut_off_until: u64,
    /// Lost its disk and has not been rebuilt since (for the trace).
    wiped: bool,
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
}

pub(super) struct World {
    rng: Rng,
    now: u64,
    n: u64,
    queue: BinaryHeap<Reverse<Scheduled>>,
    nodes: Vec<Node>,
    conns: Vec<Conn>,
    lease: Option<Lease>,
    revision: u64,
    next_id: u64,
    rates: Rates,
    faults_on: bool,
    any_disk_loss: bool,
    fenced_rebuild: bool,
    fenced_wipe: bool,
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
        };
        let nodes = (0..N)
            .map(|_| Node {
                disk: Disk::default(),
                role: Role::Follower,
                inc: 0,
                pending: None,
                keeper: None,
                renewed: 0,
                cut_off_until: 0,
                wiped: false,
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
            next_id: 1,
            rates,
            faults_on: true,
            any_disk_loss: config.any_disk_loss,
            fenced_rebuild: config.fenced_rebuild,
            fenced_wipe: config.fenced_wipe,
            acked: BTreeMap::new(),
            logs_changed: false,
            report: Report::default(),
            tracing: config.trace,
        };
        for node in 0..N {
            let at = world.rng.below(CAMPAIGN_EVERY);
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
                    self.crash(
                        node,
                        format!("no follower acknowledged seq {last}: steps down"),
                    );
                }
            }
            Ev::BarrierDeadline { node, inc } => {
                let waiting = matches!(&self.nodes[node].role, Role::Leading(l) if !l.serving);
                if self.nodes[node].inc == inc && waiting {
                    self.crash(node, "no follower joined its epoch: aborts".to_owned());
                }
            }
            Ev::TakeOverDeadline { node, inc, epoch } => {
                if self.nodes[node].inc == inc {
                    self.take_over_deadline(node, epoch);
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

    fn listener(&mut self, conn: usize, me: usize, msg: Msg) {
        if let Msg::Fetch { after, upto } = msg {
            // Served from the segments, whatever the engine thread is doing.
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
        } = msg
        {
            self.rebuilt(me, epoch, history, log);
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

    /// `FollowJob::Promise`.
    fn promise(&mut self, me: usize, epoch: u64) -> Result<Position, String> {
        let node = &mut self.nodes[me];
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
        if let Some((epoch, start)) = node.pending {
            if node.disk.last() + 1 >= start {
                node.disk.adopt(epoch, start)?;
                node.pending = None;
                self.logs_changed = true;
            }
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
        self.adopt_pending(me)
    }

    /// The leader's files, received whole: the process restarts on them.
    fn rebuilt(&mut self, me: usize, epoch: u64, history: Vec<EpochStart>, log: Vec<Rec>) {
        let node = &mut self.nodes[me];
        if self.fenced_rebuild && node.disk.promised > epoch {
            let promised = node.disk.promised;
            self.trace(format!(
                "r{me} discards the rebuild from epoch {epoch}: it promised {promised} since"
            ));
            return;
        }
        node.disk = Disk {
            synced: log.len(),
            log,
            promised: epoch,
            history,
        };
        node.wiped = false;
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
                asking = t.asking == Some(conn);
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
            self.take_over_failed(me, "fetching the most advanced log failed", 10);
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

    fn campaign_check(&mut self, me: usize) {
        if !matches!(self.nodes[me].role, Role::Follower) {
            return;
        }
        let inc = self.nodes[me].inc;
        let jitter = self.rng.below(5);
        self.at(CAMPAIGN_EVERY + jitter, Ev::Campaign { node: me, inc });
        let cut_off = self.now < self.nodes[me].cut_off_until;
        if cut_off || self.lease_holder().is_some() || self.nodes[me].keeper.is_some() {
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
                self.take_over_failed(me, &e, 10);
                return;
            }
        };
        let peers = match me {
            0 => [1, 2],
            1 => [0, 2],
            _ => [0, 1],
        };
        self.nodes[me].role = Role::TakingOver(TakeOver {
            epoch,
            mine,
            peers,
            next: 0,
            asking: None,
            promised: Vec::new(),
            deadline: self.now + ACK_TIMEOUT,
            fetching: None,
        });
        self.at(
            ACK_TIMEOUT,
            Ev::TakeOverDeadline {
                node: me,
                inc,
                epoch,
            },
        );
        self.ask_next(me);
    }

    /// Asks the next peer for its promise, or decides when both were asked.
    fn ask_next(&mut self, me: usize) {
        let Role::TakingOver(t) = &mut self.nodes[me].role else {
            return;
        };
        if t.next < 2 && self.now < t.deadline {
            let (peer, epoch) = (t.peers[t.next], t.epoch);
            t.next += 1;
            let conn = self.open(me, peer);
            if let Role::TakingOver(t) = &mut self.nodes[me].role {
                t.asking = Some(conn);
            }
            self.send(conn, me, Msg::Promise { epoch });
            return;
        }
        t.next = 2;
        self.decide(me);
    }

    fn promised(&mut self, me: usize, conn: usize, position: Option<Position>) {
        let peer = self.conns[conn].to;
        let Role::TakingOver(t) = &mut self.nodes[me].role else {
            return;
        };
        if t.asking != Some(conn) {
            return;
        }
        t.asking = None;
        match position {
            Some(p) => t.promised.push((peer, p)),
            None => self.trace(format!("r{me}: no promise from r{peer}")),
        }
        self.ask_next(me);
    }

    fn take_over_deadline(&mut self, me: usize, epoch: u64) {
        let Role::TakingOver(t) = &mut self.nodes[me].role else {
            return;
        };
        if t.epoch != epoch || t.fetching.is_some() || t.next == 2 && t.asking.is_none() {
            return;
        }
        t.asking = None;
        t.next = 2;
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
        // `max_by` keeps the last of equals, as the real take-over's does.
        let Some((best, position)) = t
            .promised
            .iter()
            .max_by(|a, b| (a.1.last_epoch(), a.1.last_seq).cmp(&(b.1.last_epoch(), b.1.last_seq)))
            .cloned()
        else {
            self.take_over_failed(me, "no other replica promised", 100);
            return;
        };
        match rules::adopt(&t.mine, &position) {
            Adopt::Lead => self.lead(me),
            Adopt::Diverged => {
                self.take_over_failed(me, "this log has a tail the others lack", 3 * TTL);
            }
            Adopt::Fetch { after, upto } => {
                self.trace(format!("r{me} fetches {}..={upto} from r{best}", after + 1));
                let conn = self.open(me, best);
                if let Role::TakingOver(t) = &mut self.nodes[me].role {
                    t.fetching = Some(conn);
                }
                // The real take-over fetches on the promise's own connection; a new one
                // behaves the same here (in order, lost with either end).
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

    /// `TakeOver` errors: the lease is revoked, the replica rests and follows again.
    fn take_over_failed(&mut self, me: usize, why: &str, rest: u64) {
        self.trace(format!("r{me}: take-over failed: {why}; not leading"));
        let node = &mut self.nodes[me];
        if let Some(epoch) = node.keeper.take() {
            if self.lease.is_some_and(|l| l.node == me && l.epoch == epoch) {
                self.lease = None;
            }
        }
        node.role = Role::Follower;
        node.inc += 1;
        let inc = node.inc;
        self.reattach(me);
        self.at(rest, Ev::Campaign { node: me, inc });
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
            self.take_over_failed(me, &e, 100);
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
        self.send(
            conn,
            me,
            Msg::Files {
                epoch,
                history,
                log,
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

    fn synced(&mut self, me: usize, upto: usize) {
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
        // etcd's revision: at least the epoch of every leader key it ever created.
        let floor = self.revision;
        let node = &mut self.nodes[me];
        node.inc += 1;
        node.role = Role::Follower;
        node.pending = None;
        node.keeper = None;
        node.disk.reload();
        if self.fenced_wipe && node.wiped {
            // The proposed fix: a replica without its EPOCH file promises etcd's revision (the
            // leader key's create revision, or the store's when there is no key) before it
            // answers anything, so no deposed leader gets its frames.
            node.disk.promised = node.disk.promised.max(floor);
        }
        let inc = node.inc;
        let (last, promised) = (node.disk.last(), node.disk.promised);
        let history = show_history(&node.disk.history);
        self.trace(format!(
            "r{me} restarts: {last} records, promised {promised}, history {history}"
        ));
        let after = self.rng.below(CAMPAIGN_EVERY);
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
            let one_at_a_time = (0..N).all(|i| i == me || !self.nodes[i].wiped);
            let allowed = if self.any_disk_loss {
                one_at_a_time
            } else {
                self.others_hold_everything_acked(me)
            };
            if allowed {
                self.fault("disk-lost");
                self.trace(format!("FAULT r{me} loses its disk"));
                self.crash(me, "FAULT crash (disk lost)".to_owned());
                self.nodes[me].disk = Disk::default();
                self.nodes[me].wiped = true;
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
                self.lease = None;
                self.nodes[l.node].cut_off_until = self.now + cut;
            }
        }
    }

    /// A disk may be lost (in the default fault model) only while both other replicas hold
    /// every acknowledged record and every record this one holds, durably: its loss takes no
    /// copy an acknowledgement counted, or may still count (an acknowledgement in flight).
    fn others_hold_everything_acked(&self, me: usize) -> bool {
        let mine = &self.nodes[me].disk.log;
        (0..N).filter(|&i| i != me).all(|i| {
            let d = &self.nodes[i].disk;
            !self.nodes[i].wiped
                && d.synced >= mine.len()
                && d.log[..mine.len()] == mine[..]
                && self.acked.iter().all(|(&seq, &(id, _))| {
                    d.log[..d.synced].get(seq as usize - 1).map(|r| r.id) == Some(id)
                })
        })
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
        Msg::Files { epoch, log, .. } => format!("files({epoch}, {})", log.len()),
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
