//! The simulation's executor: one thread, no runtime, every ordering decided by the run's seeded
//! `Rng`. Tasks belong to a simulated process (a crash drops all of a process's tasks, as a killed
//! process loses everything it held in memory); the one ready task to poll next is drawn at
//! random; when none is ready, simulated time jumps to the next timer. Every port call of the
//! simulation yields here first, so any await point can be interleaved with any other task's.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use crate::rng::Rng;

pub type TaskId = u64;
/// A simulated process: its tasks live and die together.
pub type ProcId = u32;

/// What a task stands for; the checks read it (only a resuming task must look up first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// A client's request, driving its own new transfer.
    Request,
    /// A recovery worker's pass.
    Worker,
    /// An operator's manual resolution.
    Operator,
    /// An admin freezing accounts or suspending assets.
    Admin,
    /// The simulated users submitting requests.
    Client,
    /// A message the network still carries (a delayed or duplicated copy).
    Network,
    /// Restarts and the like.
    System,
}

type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

struct Spawned {
    id: TaskId,
    proc: ProcId,
    role: Role,
    future: BoxFuture,
}

struct State {
    now_ms: u64,
    timers: BTreeMap<(u64, u64), Waker>,
    timer_seq: u64,
    rng: Rng,
    spawned: Vec<Spawned>,
    next_task: TaskId,
    current: Option<(TaskId, ProcId, Role)>,
    ready: BTreeSet<TaskId>,
}

/// The runtime state every task and port shares: simulated time, timers, the seeded random
/// source, the spawn queue.
pub struct Rt {
    state: Mutex<State>,
}

impl std::fmt::Debug for Rt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rt").finish_non_exhaustive()
    }
}

impl Rt {
    pub fn new(seed: u64, start_ms: u64) -> Arc<Rt> {
        Arc::new(Rt {
            state: Mutex::new(State {
                now_ms: start_ms,
                timers: BTreeMap::new(),
                timer_seq: 0,
                rng: Rng::new(seed),
                spawned: Vec::new(),
                next_task: 1,
                current: None,
                ready: BTreeSet::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // One thread: a poisoned lock only means a task panicked, which ends the run anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn now_ms(&self) -> u64 {
        self.lock().now_ms
    }

    /// Jumps the clock forward (a fault: a stepped system clock, or a long stall).
    pub fn jump(&self, by_ms: u64) {
        self.lock().now_ms += by_ms;
    }

    /// Draws from the run's random source.
    pub fn with_rng<T>(&self, f: impl FnOnce(&mut Rng) -> T) -> T {
        f(&mut self.lock().rng)
    }

    /// The task being polled: (task, process, role).
    pub fn current(&self) -> Option<(TaskId, ProcId, Role)> {
        self.lock().current
    }

    /// Starts a task in process `proc`; it runs when the scheduler draws it.
    pub fn spawn(
        &self,
        proc: ProcId,
        role: Role,
        future: impl Future<Output = ()> + Send + 'static,
    ) -> TaskId {
        let mut s = self.lock();
        let id = s.next_task;
        s.next_task += 1;
        s.spawned.push(Spawned {
            id,
            proc,
            role,
            future: Box::pin(future),
        });
        s.ready.insert(id);
        id
    }

    /// Waits `duration` of simulated time.
    pub fn sleep(self: &Arc<Self>, duration: Duration) -> Sleep {
        let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        let deadline = self.now_ms().saturating_add(ms);
        Sleep {
            rt: self.clone(),
            deadline,
            key: None,
        }
    }

    /// One scheduling point: lets the scheduler run any other ready task first.
    pub fn yield_now(&self) -> YieldNow {
        YieldNow { yielded: false }
    }
}

/// `Rt::sleep`'s future.
pub struct Sleep {
    rt: Arc<Rt>,
    deadline: u64,
    key: Option<(u64, u64)>,
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let rt = self.rt.clone();
        let mut s = rt.lock();
        if s.now_ms >= self.deadline {
            if let Some(key) = self.key.take() {
                s.timers.remove(&key);
            }
            return Poll::Ready(());
        }
        let key = match self.key {
            Some(key) => key,
            None => {
                s.timer_seq += 1;
                let key = (self.deadline, s.timer_seq);
                self.key = Some(key);
                key
            }
        };
        s.timers.insert(key, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.rt.lock().timers.remove(&key);
        }
    }
}

/// `Rt::yield_now`'s future.
pub struct YieldNow {
    yielded: bool,
}

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

struct TaskWaker {
    id: TaskId,
    rt: Arc<Rt>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.rt.lock().ready.insert(self.id);
    }
}

struct Entry {
    future: BoxFuture,
    proc: ProcId,
    role: Role,
    waker: Waker,
}

/// Owns the tasks and polls them.
pub struct Executor {
    pub rt: Arc<Rt>,
    tasks: BTreeMap<TaskId, Entry>,
    /// Polls so far.
    pub steps: u64,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("tasks", &self.tasks.len())
            .field("steps", &self.steps)
            .finish()
    }
}

/// What one scheduling step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Polled a task.
    Ran,
    /// No task was ready; time moved to the next timer.
    Advanced,
    /// Nothing is ready and no timer is set: every task is done or waits forever.
    Idle,
}

impl Executor {
    pub fn new(rt: Arc<Rt>) -> Self {
        Self {
            rt,
            tasks: BTreeMap::new(),
            steps: 0,
        }
    }

    fn absorb(&mut self) {
        let spawned = std::mem::take(&mut self.rt.lock().spawned);
        for t in spawned {
            let waker = Waker::from(Arc::new(TaskWaker {
                id: t.id,
                rt: self.rt.clone(),
            }));
            self.tasks.insert(
                t.id,
                Entry {
                    future: t.future,
                    proc: t.proc,
                    role: t.role,
                    waker,
                },
            );
        }
    }

    /// Polls one ready task drawn at random, or moves time to the next timer.
    pub fn step(&mut self) -> Step {
        loop {
            self.absorb();
            let picked = {
                let mut s = self.rt.lock();
                if s.ready.is_empty() {
                    None
                } else {
                    let n = s.ready.len();
                    let i = s.rng.index(n);
                    let id = s.ready.iter().nth(i).copied();
                    if let Some(id) = id {
                        s.ready.remove(&id);
                    }
                    id
                }
            };
            let Some(id) = picked else {
                return if self.advance() {
                    Step::Advanced
                } else {
                    Step::Idle
                };
            };
            let Some(entry) = self.tasks.get_mut(&id) else {
                // A crashed task's late wake-up.
                continue;
            };
            self.rt.lock().current = Some((id, entry.proc, entry.role));
            let waker = entry.waker.clone();
            let mut cx = Context::from_waker(&waker);
            let done = entry.future.as_mut().poll(&mut cx).is_ready();
            self.rt.lock().current = None;
            self.steps += 1;
            if done {
                self.tasks.remove(&id);
            }
            return Step::Ran;
        }
    }

    /// Moves time to the earliest timer and wakes every timer due then; false when none is set.
    fn advance(&mut self) -> bool {
        let due: Vec<Waker> = {
            let mut s = self.rt.lock();
            let Some((&(deadline, _), _)) = s.timers.iter().next() else {
                return false;
            };
            s.now_ms = s.now_ms.max(deadline);
            let now = s.now_ms;
            let keys: Vec<(u64, u64)> = s.timers.range(..(now + 1, 0)).map(|(k, _)| *k).collect();
            keys.iter().filter_map(|k| s.timers.remove(k)).collect()
        };
        for w in due {
            w.wake();
        }
        true
    }

    /// Wakes every timer due at the current time (after a clock jump).
    pub fn fire_due(&mut self) {
        let due: Vec<Waker> = {
            let mut s = self.rt.lock();
            let now = s.now_ms;
            let keys: Vec<(u64, u64)> = s.timers.range(..(now + 1, 0)).map(|(k, _)| *k).collect();
            keys.iter().filter_map(|k| s.timers.remove(k)).collect()
        };
        for w in due {
            w.wake();
        }
    }

    /// Kills process `proc`: every task of it is dropped where it stands.
    pub fn crash(&mut self, proc: ProcId) -> usize {
        self.absorb();
        let doomed: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, e)| e.proc == proc)
            .map(|(id, _)| *id)
            .collect();
        let dropped: Vec<Entry> = doomed
            .iter()
            .filter_map(|id| self.tasks.remove(id))
            .collect();
        let n = dropped.len();
        drop(dropped);
        n
    }

    /// Tasks still alive, by role.
    pub fn alive(&self, role: Role) -> usize {
        self.tasks.values().filter(|e| e.role == role).count()
    }

    /// Tasks still alive.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_all(exec: &mut Executor) {
        while exec.step() != Step::Idle {}
    }

    #[test]
    fn timers_fire_in_time_order_and_time_jumps_to_them() {
        let rt = Rt::new(1, 1_000);
        let order = Arc::new(Mutex::new(Vec::new()));
        for (name, ms) in [("late", 300u64), ("early", 100), ("middle", 200)] {
            let (rt2, order) = (rt.clone(), order.clone());
            rt.spawn(1, Role::System, async move {
                rt2.sleep(Duration::from_millis(ms)).await;
                order.lock().unwrap().push((name, rt2.now_ms()));
            });
        }
        let mut exec = Executor::new(rt.clone());
        run_all(&mut exec);
        assert_eq!(
            *order.lock().unwrap(),
            [("early", 1_100), ("middle", 1_200), ("late", 1_300)]
        );
        assert!(exec.is_empty());
    }

    #[test]
    fn a_crash_drops_every_task_of_the_process_and_no_other() {
        let rt = Rt::new(2, 0);
        let done = Arc::new(Mutex::new(Vec::new()));
        for proc in [1, 2, 1] {
            let (rt2, done) = (rt.clone(), done.clone());
            rt.spawn(proc, Role::Worker, async move {
                rt2.sleep(Duration::from_millis(50)).await;
                done.lock().unwrap().push(proc);
            });
        }
        let mut exec = Executor::new(rt.clone());
        assert_eq!(exec.crash(1), 2);
        run_all(&mut exec);
        assert_eq!(*done.lock().unwrap(), [2]);
    }

    #[test]
    fn the_seed_decides_the_interleaving() {
        let interleaving = |seed| {
            let rt = Rt::new(seed, 0);
            let log = Arc::new(Mutex::new(String::new()));
            for name in ['a', 'b', 'c'] {
                let (rt2, log) = (rt.clone(), log.clone());
                rt.spawn(1, Role::System, async move {
                    for _ in 0..4 {
                        log.lock().unwrap().push(name);
                        rt2.yield_now().await;
                    }
                });
            }
            let mut exec = Executor::new(rt);
            run_all(&mut exec);
            let s = log.lock().unwrap().clone();
            s
        };
        assert_eq!(interleaving(7), interleaving(7));
        let distinct: std::collections::BTreeSet<String> = (0..20).map(interleaving).collect();
        assert!(distinct.len() > 1, "different seeds interleave differently");
    }
}
