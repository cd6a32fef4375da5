//! A persistent worker pool built for per-token inference.
//!
//! One `run` call is one dispatch: the caller publishes a job, every thread
//! (the caller included) claims chunk indices from a shared atomic counter
//! until none are left. There is no per-chunk task allocation and no
//! fork/join tree.
//!
//! Workers *join* a dispatch rather than being counted into it. One atomic
//! word holds the dispatch's generation, a CLOSED bit and the number of
//! workers that joined and have not yet left. A worker joins by a
//! compare-and-swap that succeeds only while the dispatch it saw is still
//! open, and reads the job only after joining. The caller, once it finds no
//! chunk left to claim, closes the dispatch and waits only for the workers
//! that joined; a worker the scheduler kept off a core until then simply
//! misses that dispatch. On a machine whose cores are shared with other
//! processes this is what keeps one descheduled thread from stalling every
//! dispatch for a whole scheduler slice.
//!
//! Every wait spins briefly (dispatches of one token come microseconds
//! apart on a quiet machine), then yields the core to whoever else wants
//! it, then sleeps, so an idle engine costs no CPU and a busy neighbour is
//! not starved by our spinning.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod owned;
mod share;
use owned::Claim;
pub use owned::{ChunkWork, OwnedJob, Slot};
use share::Seat;

/// How long an idle worker spins for the next job: long enough to cover the
/// gap between the dispatches of one decode step on a quiet machine.
const WORKER_SPIN: Duration = Duration::from_micros(50);
/// Until this long after its last job an idle worker yields its core between
/// checks (cheap to resume from, and free for any other runnable thread);
/// after that it sleeps until a dispatch wakes it.
const WORKER_YIELD_UNTIL: Duration = Duration::from_millis(2);
/// The caller, out of chunks, spins this long for the workers that joined:
/// normally they are finishing their last chunk, a few microseconds away.
const CALLER_SPIN: Duration = Duration::from_micros(20);
/// Then yields until this long; a worker still not done by then was most
/// likely preempted mid-chunk, and sleeping frees our core for it.
const CALLER_YIELD_UNTIL: Duration = Duration::from_micros(100);

/// Layout of `Shared::state`: generation in the high 32 bits, then the
/// CLOSED bit, then the count of workers inside the dispatch.
const GEN_ONE: u64 = 1 << 32;
const CLOSED: u64 = 1 << 31;
const JOINED_MASK: u64 = CLOSED - 1;

fn generation(state: u64) -> u64 {
    state >> 32
}

fn joined(state: u64) -> u64 {
    state & JOINED_MASK
}

fn is_open(state: u64) -> bool {
    state & CLOSED == 0
}

/// Fault injection for the tests of panic handling: when set, the next
/// worker thread to take part in a dispatch panics (one relaxed load per
/// dispatch and worker when unset).
static PANIC_NEXT_WORKER: AtomicBool = AtomicBool::new(false);

/// Makes the next worker thread that joins a dispatch, of any pool, panic
/// there (for tests: it exercises the path a real bug in a kernel takes).
pub fn arm_worker_panic() {
    PANIC_NEXT_WORKER.store(true, Ordering::SeqCst);
}

/// Whether an armed worker panic is still waiting for a dispatch.
pub fn worker_panic_armed() -> bool {
    PANIC_NEXT_WORKER.load(Ordering::SeqCst)
}

type JobFn<'a> = dyn Fn(usize) + Sync + 'a;

struct Job {
    /// Erased to 'static; see the SAFETY note in `dispatch`.
    f: Option<*const JobFn<'static>>,
    /// Or a job a worker takes a share of (`run_owned`).
    owned: Option<Arc<dyn Claim>>,
    n_chunks: usize,
}

struct Shared {
    /// Generation, CLOSED bit and joined count (see the constants above).
    /// A closed state is the resting state between dispatches.
    state: AtomicU64,
    job: UnsafeCell<Job>,
    next_chunk: AtomicUsize,
    panicked: AtomicBool,
    /// The first worker panic's message of the current dispatch, re-raised
    /// on the caller so the report names the real failure.
    panic_message: Mutex<Option<String>>,
    shutdown: AtomicBool,
    /// Idle workers sleep here; `sleepers` counts them so a dispatch makes
    /// the wake-up system call only when someone is asleep.
    sleep_lock: Mutex<()>,
    wake: Condvar,
    sleepers: AtomicUsize,
    /// Workers 1..=`allowed` take part in dispatches; the others, above the
    /// pool's share of the cores while other processes use them too
    /// (`share`), park here until the share grows again.
    allowed: AtomicUsize,
    park_lock: Mutex<()>,
    unpark: Condvar,
    /// The caller sleeps here for joined workers; the last one out wakes it
    /// when `caller_asleep` says it may be sleeping.
    done_lock: Mutex<()>,
    done: Condvar,
    caller_asleep: AtomicBool,
    /// Dispatches, their wall time on the caller, and the time every
    /// thread spent running their chunks (see `PoolStats`).
    dispatches: AtomicU64,
    dispatch_ns: AtomicU64,
    work_ns: AtomicU64,
    /// Test hook: a worker takes this lock between seeing a dispatch and
    /// trying to join it, so a test holding it plays a descheduled worker.
    #[cfg(test)]
    join_gate: Mutex<()>,
    /// Test probe: how many times a worker joined a dispatch.
    #[cfg(test)]
    joins: AtomicUsize,
}

// SAFETY: `job` is written only by the dispatching thread (one at a time,
// under `ThreadPool::dispatch`) while the state is closed with no worker
// joined, and is read by a worker only while it is counted as joined to the
// open dispatch that published it (see `run` and `worker_loop`); every other
// field is atomic or a lock.
unsafe impl Sync for Shared {}
// SAFETY: the raw job pointer is only dereferenced under the protocol above.
unsafe impl Send for Shared {}

/// Whether pools count their dispatches and work (`set_counting`).
static COUNTING: AtomicBool = AtomicBool::new(false);

/// Turns the counters of every pool on or off (`oxillama bench
/// --pool-stats`); they count only while on.
pub fn set_counting(on: bool) {
    COUNTING.store(on, Ordering::Relaxed);
}

/// What a pool has done while counting was on: `dispatches` calls of `run`
/// (or of anything built on it), `dispatch_secs` of wall time inside them
/// on the calling thread, and `work_secs` of chunks run, summed over every
/// thread. `work_secs / (dispatch_secs * threads)` is how busy the threads
/// were while a dispatch was open: below 1 by the chunks' imbalance and
/// the time workers take to wake and join. A pass's time outside
/// `dispatch_secs` is work the caller did alone.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PoolStats {
    pub dispatches: u64,
    pub dispatch_secs: f64,
    pub work_secs: f64,
    pub threads: usize,
}

impl Shared {
    fn add_work(&self, d: Duration) {
        self.work_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// One dispatch that began at `start`, `caller_work` of it the caller's chunks.
    fn count_dispatch(&self, start: Instant, caller_work: Duration) {
        self.dispatches.fetch_add(1, Ordering::Relaxed);
        self.dispatch_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.add_work(caller_work);
    }
}

/// Below this many elements `for_rows` runs on the caller: waking the pool
/// costs more than splitting saves.
const PAR_ROWS_MIN_ELEMS: usize = 1 << 16;

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// This pool's place on the board of the user's oxillama processes
    /// (None: sharing is off, or the board could not be opened).
    seat: Option<Seat>,
    /// Serializes dispatches from different callers (two engines on two
    /// Python threads may share one pool).
    dispatch: Mutex<()>,
    n_threads: usize,
}

impl ThreadPool {
    /// A pool that runs jobs on `n_threads` threads, the caller included,
    /// or on its share of the cores while pools of the user's other
    /// oxillama processes on the same CPUs are computing too (`share`).
    pub fn new(n_threads: usize) -> Self {
        // Unit tests run many pools at once in one process; those that test
        // sharing make their own board.
        let board = if cfg!(test) {
            None
        } else {
            share::process_board()
        };
        Self::with_board(n_threads, board)
    }

    fn with_board(n_threads: usize, board: Option<Arc<share::Board>>) -> Self {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            state: AtomicU64::new(CLOSED),
            job: UnsafeCell::new(Job {
                f: None,
                owned: None,
                n_chunks: 0,
            }),
            next_chunk: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            panic_message: Mutex::new(None),
            shutdown: AtomicBool::new(false),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            allowed: AtomicUsize::new(n_threads - 1),
            park_lock: Mutex::new(()),
            unpark: Condvar::new(),
            done_lock: Mutex::new(()),
            done: Condvar::new(),
            caller_asleep: AtomicBool::new(false),
            dispatches: AtomicU64::new(0),
            dispatch_ns: AtomicU64::new(0),
            work_ns: AtomicU64::new(0),
            #[cfg(test)]
            join_gate: Mutex::new(()),
            #[cfg(test)]
            joins: AtomicUsize::new(0),
        });
        let workers = (1..n_threads)
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("oxillama-worker-{i}"))
                    .spawn(move || worker_loop(&s, i))
                    .expect("cannot spawn oxillama worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            seat: board.map(|b| Seat::new(b, n_threads)),
            dispatch: Mutex::new(()),
            n_threads,
        }
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// The threads that took part in the last dispatch's share: `n_threads`,
    /// or fewer while other processes' pools share the cores.
    pub fn threads_in_use(&self) -> usize {
        self.seat.as_ref().map_or(self.n_threads, Seat::last_share)
    }

    /// How many workers may help with the dispatch about to start (the
    /// pool's share of the cores, less the caller); parks or wakes workers
    /// when that changed since the last dispatch.
    fn helpers(&self) -> usize {
        let Some(seat) = &self.seat else {
            return self.workers.len();
        };
        let n = seat.threads_now().min(self.n_threads) - 1;
        let s = &*self.shared;
        let was = s.allowed.swap(n, Ordering::SeqCst);
        if n > was {
            // Under the lock, so a worker between its check and its wait
            // cannot miss this (see `wait_for_dispatch`).
            drop(s.park_lock.lock().unwrap_or_else(|p| p.into_inner()));
            s.unpark.notify_all();
        }
        n
    }

    /// The counters so far (`PoolStats`); differences between two reads
    /// describe the work in between, when no other engine shares the pool.
    pub fn stats(&self) -> PoolStats {
        let s = &*self.shared;
        PoolStats {
            dispatches: s.dispatches.load(Ordering::Relaxed),
            dispatch_secs: s.dispatch_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            work_secs: s.work_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            threads: self.n_threads,
        }
    }

    /// Calls `f(first_row, block)` on disjoint blocks of whole rows of `data`
    /// (`row_len` elements each), spread over the pool when there are enough
    /// elements to pay for a dispatch, on this thread otherwise (a decode
    /// step's few rows). Each row goes to exactly one call, so a row-wise
    /// operation gives the same bits either way.
    ///
    /// The norms, residual adds and rotary embedding a layer applies between
    /// its products were serial: the worker of a 2-thread pp512 of the
    /// synthetic 1.7B sat idle 3% of the pass (0.5% with them spread), and
    /// Amdahl's law makes that a fifth of a 16-thread pass.
    pub fn for_rows<T: Send, F: Fn(usize, &mut [T]) + Sync>(
        &self,
        data: &mut [T],
        row_len: usize,
        f: F,
    ) {
        let row_len = row_len.max(1);
        assert_eq!(data.len() % row_len, 0, "for_rows: a partial row");
        let n_rows = data.len() / row_len;
        if data.len() < PAR_ROWS_MIN_ELEMS || n_rows < 2 || self.helpers() == 0 {
            return f(0, data);
        }
        // Two blocks a thread: a thread that is preempted leaves one block
        // for the others to claim.
        let per = n_rows.div_ceil(2 * self.n_threads);
        let shared = SharedMut::new(data);
        self.run(n_rows.div_ceil(per), |c| {
            let (r0, r1) = (c * per, ((c + 1) * per).min(n_rows));
            // SAFETY: block c alone covers rows r0..r1; blocks do not overlap.
            let block = unsafe { shared.slice(r0 * row_len, (r1 - r0) * row_len) };
            f(r0, block);
        });
    }

    /// Runs `f(i)` for every `i in 0..n_chunks`, spread over the pool.
    /// Returns when every call has finished. A panic in `f` is re-raised here.
    pub fn run<F: Fn(usize) + Sync>(&self, n_chunks: usize, f: F) {
        if n_chunks == 0 {
            return;
        }
        // Clock reads and shared atomic adds on every dispatch cost a
        // SmolLM2 decode step up to 1%, so only when asked for.
        let start = COUNTING.load(Ordering::Relaxed).then(Instant::now);
        if n_chunks == 1 || self.helpers() == 0 {
            (0..n_chunks).for_each(f);
            if let Some(t) = start {
                self.shared.count_dispatch(t, t.elapsed());
            }
            return;
        }
        let f_ref: &JobFn<'_> = &f;
        // SAFETY (of the erasure): `dispatch` does not return before it has
        // closed the dispatch and seen every worker that joined it leave,
        // and a worker calls the closure only while joined, so the closure
        // outlives every use of the pointer.
        let f_static =
            unsafe { std::mem::transmute::<*const JobFn<'_>, *const JobFn<'static>>(f_ref) };
        let s = &*self.shared;
        let caller_work = self.dispatch(
            Job {
                f: Some(f_static),
                owned: None,
                n_chunks,
            },
            || {
                let t = start.map(|_| Instant::now());
                claim_chunks(s, f_ref, n_chunks);
                t.map(|t| t.elapsed())
            },
        );
        if let (Some(t), Some(w)) = (start, caller_work) {
            s.count_dispatch(t, w);
        }
    }

    /// Runs every chunk of `job` over the pool and returns once each has
    /// been computed, by a worker into the job or by this thread into its
    /// output (`OwnedJob::slot` says which). Unlike `run`, it does not wait
    /// for a worker that holds a chunk for long (preempted): this thread
    /// redoes the chunk, and the worker finishes later into the job, whose
    /// `Arc` it holds until then. A panic in a chunk is re-raised here.
    pub fn run_owned<W: ChunkWork>(&self, job: &Arc<OwnedJob<W>>) {
        let n_chunks = job.n_chunks();
        if n_chunks == 0 {
            return;
        }
        let s = &*self.shared;
        let start = COUNTING.load(Ordering::Relaxed).then(Instant::now);
        let (ran, took) = if n_chunks == 1 || self.helpers() == 0 {
            job.caller_claims()
        } else {
            let owned: Arc<dyn Claim> = job.clone();
            self.dispatch(
                Job {
                    f: None,
                    owned: Some(owned),
                    n_chunks,
                },
                || job.caller_claims(),
            )
        };
        job.caller_finishes(owned::patience(ran, took));
        if let Some(t) = start {
            s.count_dispatch(t, took);
        }
    }

    /// One dispatch: publishes `job`, runs `caller` (this thread's share),
    /// closes the dispatch and waits for the workers that joined it, then
    /// re-raises a panic of the caller's share or of a worker.
    fn dispatch<R>(&self, job: Job, caller: impl FnOnce() -> R) -> R {
        let s = &*self.shared;
        let _guard = self.dispatch.lock().unwrap_or_else(|p| p.into_inner());
        let before = s.state.load(Ordering::Acquire);
        debug_assert!(!is_open(before) && joined(before) == 0);
        // SAFETY: no worker reads `job` now: the previous dispatch (if any)
        // is closed and every worker that joined it has left (the previous
        // call waited for that, and `dispatch` keeps us alone), and none can
        // join before the store that opens this dispatch below.
        unsafe {
            *s.job.get() = job;
        }
        s.next_chunk.store(0, Ordering::Relaxed);
        // Open: the next generation, no one joined. Release publishes `job`
        // and `next_chunk` to the worker whose join reads this value; SeqCst
        // orders it against the `sleepers` load (a worker going to sleep
        // increments `sleepers` before its last look at `state`).
        s.state.store(
            (before & !(CLOSED | JOINED_MASK)).wrapping_add(GEN_ONE),
            Ordering::SeqCst,
        );
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            drop(s.sleep_lock.lock().unwrap_or_else(|p| p.into_inner()));
            s.wake.notify_all();
        }

        let ran = catch_unwind(AssertUnwindSafe(caller));

        // No chunk is left to claim: close the dispatch so no further worker
        // joins, then wait for those inside.
        let closed = s.state.fetch_or(CLOSED, Ordering::AcqRel);
        if joined(closed) != 0 {
            wait_for_joined(s);
        }
        // SAFETY: closed with no worker joined, as above; dropping the
        // owned job's `Arc` here lets its owner reuse it once late workers
        // are done with it.
        unsafe {
            *s.job.get() = Job {
                f: None,
                owned: None,
                n_chunks: 0,
            };
        }
        let out = match ran {
            Ok(out) => out,
            Err(p) => std::panic::resume_unwind(p),
        };
        if s.panicked.swap(false, Ordering::Acquire) {
            owned::reraise_worker_panic(&s.panic_message);
        }
        out
    }
}

/// Waits (spin, then yield, then sleep) until every worker that joined the
/// closed dispatch has left it. The Acquire loads pair with the workers'
/// leaving decrements, so their writes to the job's outputs are visible.
fn wait_for_joined(s: &Shared) {
    let start = Instant::now();
    loop {
        if joined(s.state.load(Ordering::Acquire)) == 0 {
            return;
        }
        let waited = start.elapsed();
        if waited < CALLER_SPIN {
            std::hint::spin_loop();
        } else if waited < CALLER_YIELD_UNTIL {
            std::thread::yield_now();
        } else {
            break;
        }
    }
    let mut l = s.done_lock.lock().unwrap_or_else(|p| p.into_inner());
    // SeqCst pairs with the leaving worker's SeqCst decrement and load of
    // `caller_asleep`: either it sees us asleep and notifies under the lock,
    // or we see its decrement here.
    s.caller_asleep.store(true, Ordering::SeqCst);
    while joined(s.state.load(Ordering::SeqCst)) != 0 {
        l = s.done.wait(l).unwrap_or_else(|p| p.into_inner());
    }
    s.caller_asleep.store(false, Ordering::Relaxed);
}

fn claim_chunks(s: &Shared, f: &JobFn<'_>, n_chunks: usize) {
    loop {
        let i = s.next_chunk.fetch_add(1, Ordering::Relaxed);
        if i >= n_chunks {
            break;
        }
        f(i);
    }
}

/// Waits (spin, then yield, then sleep) for an open dispatch whose
/// generation differs from `seen`; returns its state, or None on shutdown.
/// Worker `index` parks instead while the pool's share leaves it out.
fn wait_for_dispatch(s: &Shared, seen: u64, index: usize) -> Option<u64> {
    let fresh = |st: u64| is_open(st) && generation(st) != seen;
    let mut start = Instant::now();
    loop {
        if s.shutdown.load(Ordering::Relaxed) {
            return None;
        }
        if index > s.allowed.load(Ordering::Relaxed) {
            let mut l = s.park_lock.lock().unwrap_or_else(|p| p.into_inner());
            // Checked under the lock that `helpers` takes before it wakes
            // us, so a growing share cannot slip between check and wait.
            while index > s.allowed.load(Ordering::SeqCst) && !s.shutdown.load(Ordering::SeqCst) {
                l = s.unpark.wait(l).unwrap_or_else(|p| p.into_inner());
            }
            drop(l);
            start = Instant::now();
            continue;
        }
        let st = s.state.load(Ordering::Acquire);
        if fresh(st) {
            return Some(st);
        }
        let idle = start.elapsed();
        if idle < WORKER_SPIN {
            std::hint::spin_loop();
        } else if idle < WORKER_YIELD_UNTIL {
            std::thread::yield_now();
        } else {
            let mut l = s.sleep_lock.lock().unwrap_or_else(|p| p.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            // Last look after announcing ourselves (pairs with the SeqCst
            // store that opens a dispatch and its `sleepers` load).
            while !fresh(s.state.load(Ordering::SeqCst)) && !s.shutdown.load(Ordering::SeqCst) {
                l = s.wake.wait(l).unwrap_or_else(|p| p.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn worker_loop(s: &Shared, index: usize) {
    // Pools start closed at generation 0; a worker that starts late still
    // joins the first dispatch if it is open.
    let mut seen = 0;
    while let Some(st) = wait_for_dispatch(s, seen, index) {
        seen = generation(st);
        #[cfg(test)]
        drop(s.join_gate.lock().unwrap_or_else(|p| p.into_inner()));
        // Join only the dispatch we saw, and only while it is open; if it
        // closed meanwhile (the caller ran out of chunks) we skip it, and its
        // job, whose closure may already be gone, is never read.
        let mut cur = s.state.load(Ordering::Acquire);
        let joined_it = loop {
            if generation(cur) != seen || !is_open(cur) {
                break false;
            }
            match s
                .state
                .compare_exchange_weak(cur, cur + 1, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => break true,
                Err(now) => cur = now,
            }
        };
        if !joined_it {
            continue;
        }
        #[cfg(test)]
        s.joins.fetch_add(1, Ordering::Relaxed);
        // SAFETY: we are counted as joined to the open dispatch of generation
        // `seen`, whose caller wrote `job` before the Release store that
        // opened it (our Acquire CAS read that store's value or a later
        // read-modify-write of it). The caller neither rewrites `job` nor
        // returns (so the closure lives) until our decrement below.
        let (f, owned, n_chunks) = unsafe {
            let job = &*s.job.get();
            match job.f {
                Some(f) => (&*f, None, job.n_chunks),
                None => (&(|_| {}) as &JobFn<'static>, job.owned.clone(), 0),
            }
        };
        let ran = catch_unwind(AssertUnwindSafe(|| {
            if PANIC_NEXT_WORKER.load(Ordering::Relaxed)
                && PANIC_NEXT_WORKER.swap(false, Ordering::SeqCst)
            {
                panic!("test panic injected in a worker thread");
            }
            let start = COUNTING.load(Ordering::Relaxed).then(Instant::now);
            claim_chunks(s, f, n_chunks);
            if let Some(t) = start {
                s.add_work(t.elapsed());
            }
        }));
        let ran = match ran {
            Ok(()) => true,
            Err(payload) => {
                let what = crate::error::panic_text(&*payload);
                let mut first = s.panic_message.lock().unwrap_or_else(|p| p.into_inner());
                first.get_or_insert(what);
                drop(first);
                s.panicked.store(true, Ordering::Release);
                false
            }
        };
        // Leave: from here on we must not touch the job. Release publishes
        // our chunks' writes to the caller; SeqCst orders it against the
        // `caller_asleep` load (see `wait_for_joined`).
        let before = s.state.fetch_sub(1, Ordering::SeqCst);
        if joined(before) == 1 && s.caller_asleep.load(Ordering::SeqCst) {
            drop(s.done_lock.lock().unwrap_or_else(|p| p.into_inner()));
            s.done.notify_one();
        }
        // An owned job is ours through its `Arc`: we take our share after
        // leaving, so the caller never waits for us (it redoes a chunk we
        // hold too long), and the job lives until we are done with it.
        if let Some(job) = owned.filter(|_| ran) {
            let start = COUNTING.load(Ordering::Relaxed).then(Instant::now);
            job.worker_claims();
            if let Some(t) = start {
                s.add_work(t.elapsed());
            }
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        {
            let _l = self
                .shared
                .sleep_lock
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            self.shared.shutdown.store(true, Ordering::SeqCst);
        }
        self.shared.wake.notify_all();
        drop(
            self.shared
                .park_lock
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        self.shared.unpark.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The default thread count: the cores this process can really use. SMT
/// siblings count once (they share the execution units these kernels
/// saturate, so they add contention, not speed), and the count is capped by
/// the affinity mask (`available_parallelism` honours `sched_getaffinity`)
/// and by a cgroup CPU quota (a container limited to 2 CPUs on a 64-core
/// host should not run 64 threads that the quota then throttles).
pub fn physical_cores() -> usize {
    let mut n = std::thread::available_parallelism().map_or(1, |n| n.get());
    #[cfg(target_os = "linux")]
    {
        if let Some(cores) = linux_physical_cores() {
            n = n.min(cores);
        }
        if let Some(quota) = cgroup_cpu_limit() {
            n = n.min(quota);
        }
    }
    n.max(1)
}

#[cfg(target_os = "linux")]
fn linux_physical_cores() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mut cores = std::collections::HashSet::new();
    let (mut phys, mut core) = (None, None);
    for line in text.lines().chain(std::iter::once("")) {
        if line.trim().is_empty() {
            if let (Some(p), Some(c)) = (phys.take(), core.take()) {
                cores.insert((p, c));
            }
            continue;
        }
        let mut kv = line.splitn(2, ':');
        let (k, v) = (kv.next()?.trim(), kv.next().unwrap_or("").trim());
        match k {
            "physical id" => phys = v.parse::<u32>().ok(),
            "core id" => core = v.parse::<u32>().ok(),
            _ => {}
        }
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// Whole CPUs a CFS quota grants, rounded down (at least one): our dispatches
/// run in lockstep, so a thread the quota throttles for the rest of a period
/// stalls all the others; 1.5 CPUs run better on one thread than on two.
fn quota_cpus(quota_us: u64, period_us: u64) -> Option<usize> {
    if period_us == 0 {
        return None;
    }
    Some(
        usize::try_from(quota_us / period_us)
            .unwrap_or(usize::MAX)
            .max(1),
    )
}

/// Parses cgroup v2 `cpu.max` ("max 100000" when unlimited, else
/// "<quota> <period>").
fn parse_cpu_max(text: &str) -> Option<usize> {
    let mut it = text.split_whitespace();
    let quota = it.next()?.parse::<u64>().ok()?;
    let period = it.next().map_or(Some(100_000), |p| p.parse::<u64>().ok())?;
    quota_cpus(quota, period)
}

/// Parses cgroup v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us` (a quota of
/// -1 means unlimited).
fn parse_cfs(quota: &str, period: &str) -> Option<usize> {
    let quota = quota.trim().parse::<i64>().ok()?;
    let period = period.trim().parse::<u64>().ok()?;
    quota_cpus(u64::try_from(quota).ok()?, period)
}

/// Which cgroup controls our CPU time, from `/proc/self/cgroup`.
#[derive(Debug, PartialEq, Eq)]
enum CpuCgroup {
    /// The unified (v2) hierarchy, at this path.
    V2(String),
    /// A v1 hierarchy whose controllers include `cpu`, at this path.
    V1(String),
}

/// The lines of `/proc/self/cgroup` that can carry a CPU quota: the v2
/// entry ("0::/path") and the v1 `cpu` controller ("4:cpu,cpuacct:/path").
/// A hybrid host lists both; the quota lives with whichever owns `cpu`.
fn cpu_cgroups(proc_self_cgroup: &str) -> Vec<CpuCgroup> {
    proc_self_cgroup
        .lines()
        .filter_map(|line| {
            let mut f = line.splitn(3, ':');
            let (id, controllers, path) = (f.next()?, f.next()?, f.next()?);
            if id == "0" && controllers.is_empty() {
                Some(CpuCgroup::V2(path.to_string()))
            } else if controllers.split(',').any(|c| c == "cpu") {
                Some(CpuCgroup::V1(path.to_string()))
            } else {
                None
            }
        })
        .collect()
}

/// `dir` followed by each of its ancestors up to `/`: a quota set on any
/// ancestor limits us too, and inside a container the path from
/// `/proc/self/cgroup` may name the host's view, whose deeper parts do not
/// exist in the container's mount (its own cgroup is then the mount root).
fn self_and_ancestors(path: &str) -> Vec<String> {
    let mut out = vec![];
    let mut p = path.trim_end_matches('/').to_string();
    loop {
        out.push(if p.is_empty() {
            "/".to_string()
        } else {
            p.clone()
        });
        match p.rfind('/') {
            Some(i) => p.truncate(i),
            None => break,
        }
        if out.last().is_some_and(|l| l == "/") {
            break;
        }
    }
    out
}

/// The CPU quota of our cgroups (v2 `cpu.max`, v1 CFS quota), in whole
/// CPUs; the tightest along the hierarchy, None when unlimited or unknown.
#[cfg(target_os = "linux")]
fn cgroup_cpu_limit() -> Option<usize> {
    let read = |p: String| std::fs::read_to_string(p).ok();
    let text = read("/proc/self/cgroup".into())?;
    let mut limit: Option<usize> = None;
    let mut tighten = |n: Option<usize>| {
        if let Some(n) = n {
            limit = Some(limit.map_or(n, |l| l.min(n)));
        }
    };
    for cg in cpu_cgroups(&text) {
        match cg {
            CpuCgroup::V2(path) => {
                for dir in self_and_ancestors(&path) {
                    let dir = dir.trim_end_matches('/');
                    tighten(
                        read(format!("/sys/fs/cgroup{dir}/cpu.max"))
                            .and_then(|t| parse_cpu_max(&t)),
                    );
                }
            }
            CpuCgroup::V1(path) => {
                for mount in ["cpu", "cpu,cpuacct", "cpuacct,cpu"] {
                    for dir in self_and_ancestors(&path) {
                        let base = format!("/sys/fs/cgroup/{mount}{}", dir.trim_end_matches('/'));
                        if let (Some(q), Some(p)) = (
                            read(format!("{base}/cpu.cfs_quota_us")),
                            read(format!("{base}/cpu.cfs_period_us")),
                        ) {
                            tighten(parse_cfs(&q, &p));
                        }
                    }
                }
            }
        }
    }
    limit
}

/// The process keeps one pool per thread count, created on first use, so
/// engines with the same setting share workers instead of multiplying them.
pub fn shared_pool(n_threads: usize) -> Arc<ThreadPool> {
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<ThreadPool>>>> = OnceLock::new();
    let pools = POOLS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = pools.lock().unwrap_or_else(|p| p.into_inner());
    Arc::clone(
        map.entry(n_threads.max(1))
            .or_insert_with(|| Arc::new(ThreadPool::new(n_threads))),
    )
}

/// Lets disjoint chunks of one output buffer be written from several pool
/// threads. Each user must guarantee the index ranges it writes per chunk
/// do not overlap.
#[derive(Clone, Copy)]
pub struct SharedMut<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: only disjoint regions are handed out (caller's contract on `slice`).
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub fn new(s: &mut [T]) -> Self {
        SharedMut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }

    /// # Safety
    /// No two live slices obtained from this value may overlap, and the
    /// original buffer must outlive them (it does for the span of one `run`).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        assert!(
            start <= self.len && len <= self.len - start,
            "SharedMut range out of bounds"
        );
        // SAFETY: in bounds (checked above); disjointness is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_count_dispatches_and_the_work_in_them() {
        let pool = ThreadPool::new(2);
        set_counting(true);
        let before = pool.stats();
        for _ in 0..3 {
            pool.run(4, |_| std::thread::sleep(Duration::from_millis(2)));
        }
        let after = pool.stats();
        set_counting(false);
        assert_eq!(
            (after.dispatches - before.dispatches, after.threads),
            (3, 2)
        );
        // Twelve chunks of at least 2 ms each, on two threads.
        let (inside, work) = (
            after.dispatch_secs - before.dispatch_secs,
            after.work_secs - before.work_secs,
        );
        assert!(
            work >= 0.024 && work <= 2.0 * inside + 1e-3,
            "{work} s in {inside} s"
        );
    }

    #[test]
    fn for_rows_hands_out_every_row_once_in_whole_rows() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            // Below and above the size that is worth a dispatch.
            for (n_rows, row_len) in [(3, 5), (7, PAR_ROWS_MIN_ELEMS / 4), (1, PAR_ROWS_MIN_ELEMS)]
            {
                let mut data = vec![0u32; n_rows * row_len];
                let calls = AtomicUsize::new(0);
                pool.for_rows(&mut data, row_len, |r0, block| {
                    assert_eq!(block.len() % row_len, 0, "a block of partial rows");
                    calls.fetch_add(1, Ordering::Relaxed);
                    for (i, row) in block.chunks_exact_mut(row_len).enumerate() {
                        row.iter_mut().for_each(|x| *x += (r0 + i) as u32 + 1);
                    }
                });
                let want: Vec<u32> = (0..n_rows)
                    .flat_map(|r| std::iter::repeat_n(r as u32 + 1, row_len))
                    .collect();
                assert_eq!(data, want, "{threads} threads, {n_rows} rows of {row_len}");
                let parallel = threads > 1 && n_rows > 1 && data.len() >= PAR_ROWS_MIN_ELEMS;
                let n = calls.load(Ordering::Relaxed);
                assert!(if parallel { n > 1 } else { n == 1 }, "{n} calls");
            }
        }
    }

    #[test]
    fn every_chunk_runs_once() {
        let pool = ThreadPool::new(3);
        for n in [0usize, 1, 2, 7, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn many_dispatches_in_a_row() {
        let pool = ThreadPool::new(2);
        let total = AtomicUsize::new(0);
        for _ in 0..10_000 {
            pool.run(4, |i| {
                total.fetch_add(i, Ordering::Relaxed);
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 10_000 * 6);
    }

    #[test]
    fn pools_of_two_processes_split_the_cores_and_keep_every_chunk() {
        let path =
            std::env::temp_dir().join(format!("oxillama-pool-board-test-{}", std::process::id()));
        let board = || Some(Arc::new(share::Board::open(&path, 2, 0b11).unwrap()));
        // Two pools on one board play two processes on two cores.
        let (a, b) = (
            ThreadPool::with_board(2, board()),
            ThreadPool::with_board(2, board()),
        );
        let joins = |p: &ThreadPool| p.shared.joins.load(Ordering::Relaxed);
        let slow = |_: usize| std::thread::sleep(Duration::from_millis(2));
        a.run(4, slow);
        assert_eq!(a.threads_in_use(), 2, "alone, the whole width");
        b.run(4, slow);
        assert_eq!(b.threads_in_use(), 1, "a is active");
        std::thread::sleep(Duration::from_millis(2));
        let before = joins(&a);
        let hits: Vec<AtomicUsize> = (0..8).map(|_| AtomicUsize::new(0)).collect();
        a.run(8, |i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
            slow(i);
        });
        assert_eq!(a.threads_in_use(), 1, "b is active");
        assert_eq!(joins(&a), before, "a's worker is parked");
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        // b goes idle: a takes both cores again, and its worker wakes.
        std::thread::sleep(Duration::from_millis(60));
        a.run(8, slow);
        assert_eq!(a.threads_in_use(), 2);
        assert!(joins(&a) > before, "a's worker took part again");
        drop((a, b));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn disjoint_writes() {
        let pool = ThreadPool::new(2);
        let mut out = vec![0usize; 100];
        let w = SharedMut::new(&mut out);
        pool.run(10, |c| {
            // SAFETY: chunk c owns indices c*10..c*10+10.
            let s = unsafe { w.slice(c * 10, 10) };
            for (j, v) in s.iter_mut().enumerate() {
                *v = c * 10 + j;
            }
        });
        assert_eq!(out, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn worker_panic_is_reported() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(64, |i| {
                if i == 40 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        // The pool still works afterwards.
        let n = AtomicUsize::new(0);
        pool.run(8, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 8);
    }

    /// Runs `n` dispatches of 1..=20 chunks and checks each chunk ran once.
    fn stress(pool: &ThreadPool, n: usize) {
        let hits: Vec<AtomicUsize> = (0..20).map(|_| AtomicUsize::new(0)).collect();
        for k in 0..n {
            let chunks = 1 + k % 20;
            pool.run(chunks, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            for (i, h) in hits.iter().enumerate() {
                let want = usize::from(i < chunks);
                assert_eq!(h.swap(0, Ordering::Relaxed), want, "dispatch {k} chunk {i}");
            }
        }
    }

    #[test]
    fn thousands_of_dispatches_at_any_thread_count() {
        // 4 and 8 threads oversubscribe a small machine; every dispatch must
        // still finish and run each chunk exactly once.
        for threads in [1, 2, 4, 8] {
            let pool = ThreadPool::new(threads);
            stress(&pool, 3000);
        }
    }

    #[test]
    fn a_late_worker_does_not_delay_run() {
        let pool = ThreadPool::new(2);
        // Warm up so the worker is spinning, not asleep, when the gate shuts.
        stress(&pool, 10);
        let joins_before = pool.shared.joins.load(Ordering::Relaxed);
        let gate = pool.shared.join_gate.lock().unwrap();
        // The worker sees the next dispatch but cannot join it: the caller
        // must finish every dispatch alone and promptly.
        let started = Instant::now();
        let caller = std::thread::current().id();
        let on_caller = AtomicUsize::new(0);
        for _ in 0..1000 {
            pool.run(16, |_| {
                if std::thread::current().id() == caller {
                    on_caller.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        assert_eq!(on_caller.load(Ordering::Relaxed), 16 * 1000);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "run waited for a worker that never joined: {:?}",
            started.elapsed()
        );
        // Let the worker arrive late: the dispatch it saw is closed (and its
        // closure gone), so it must not join it.
        drop(gate);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(pool.shared.joins.load(Ordering::Relaxed), joins_before);
        // It joins later dispatches again: this one's chunks wait for it.
        let deadline = Instant::now() + Duration::from_secs(10);
        let worker_ran = AtomicBool::new(false);
        pool.run(2, |_| {
            if std::thread::current().id() != caller {
                worker_ran.store(true, Ordering::SeqCst);
            }
            while !worker_ran.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::yield_now();
            }
        });
        assert!(
            worker_ran.load(Ordering::SeqCst),
            "the worker never rejoined"
        );
        stress(&pool, 100);
    }

    #[test]
    fn caller_sleeps_until_a_slow_worker_leaves() {
        // A joined worker that takes far longer than the caller's spin and
        // yield phases: the caller must sleep and be woken, not miss it.
        let pool = ThreadPool::new(2);
        let caller = std::thread::current().id();
        for _ in 0..5 {
            let slow_done = AtomicBool::new(false);
            let worker_in = AtomicBool::new(false);
            let deadline = Instant::now() + Duration::from_secs(10);
            pool.run(2, |_| {
                if std::thread::current().id() != caller {
                    worker_in.store(true, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                    slow_done.store(true, Ordering::SeqCst);
                } else {
                    while !worker_in.load(Ordering::SeqCst) && Instant::now() < deadline {
                        std::thread::yield_now();
                    }
                }
            });
            assert!(
                slow_done.load(Ordering::SeqCst),
                "run returned before its worker"
            );
        }
    }

    #[test]
    fn worker_panic_is_reraised_with_its_message() {
        // A panic on a worker thread (not the armed fault injection, whose
        // flag is global and would fire in whichever test's pool came next).
        let pool = ThreadPool::new(3);
        let caller = std::thread::current().id();
        for _ in 0..3 {
            let deadline = Instant::now() + Duration::from_secs(10);
            let worker_failed = AtomicBool::new(false);
            let r = catch_unwind(AssertUnwindSafe(|| {
                pool.run(4, |_| {
                    if std::thread::current().id() != caller {
                        worker_failed.store(true, Ordering::SeqCst);
                        panic!("kernel bug on a worker");
                    }
                    // Hold the caller's chunks until a worker has failed.
                    while !worker_failed.load(Ordering::SeqCst) && Instant::now() < deadline {
                        std::thread::yield_now();
                    }
                })
            }));
            assert!(worker_failed.load(Ordering::SeqCst), "no worker joined");
            let payload = r.expect_err("the worker panic was not re-raised");
            let text = crate::error::panic_text(&*payload);
            assert!(
                text.contains("worker thread panicked: kernel bug on a worker"),
                "{text}"
            );
            stress(&pool, 100);
        }
    }

    #[test]
    fn dropping_the_pool_joins_its_threads() {
        for threads in [2, 4, 8] {
            let pool = ThreadPool::new(threads);
            stress(&pool, 50);
            let shared = Arc::downgrade(&pool.shared);
            drop(pool);
            // Every worker owned a reference; all are gone once drop returns.
            assert!(
                shared.upgrade().is_none(),
                "{threads}-thread pool left workers"
            );
        }
        // Also once the workers have gone to sleep.
        let pool = ThreadPool::new(3);
        stress(&pool, 5);
        std::thread::sleep(WORKER_YIELD_UNTIL * 3);
        let shared = Arc::downgrade(&pool.shared);
        drop(pool);
        assert!(shared.upgrade().is_none());
    }

    #[test]
    fn sleeping_workers_wake_for_the_next_dispatch() {
        let pool = ThreadPool::new(2);
        let caller = std::thread::current().id();
        for _ in 0..3 {
            std::thread::sleep(WORKER_YIELD_UNTIL * 3);
            let deadline = Instant::now() + Duration::from_secs(10);
            let worker_ran = AtomicBool::new(false);
            pool.run(2, |_| {
                if std::thread::current().id() != caller {
                    worker_ran.store(true, Ordering::SeqCst);
                }
                while !worker_ran.load(Ordering::SeqCst) && Instant::now() < deadline {
                    std::thread::yield_now();
                }
            });
            assert!(
                worker_ran.load(Ordering::SeqCst),
                "a sleeping worker was not woken"
            );
        }
    }

    #[test]
    fn cgroup_v2_cpu_max() {
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("200000 100000\n"), Some(2));
        assert_eq!(parse_cpu_max("150000 100000"), Some(1));
        assert_eq!(parse_cpu_max("50000 100000"), Some(1));
        assert_eq!(parse_cpu_max("400000 50000"), Some(8));
        assert_eq!(parse_cpu_max("300000"), Some(3));
        assert_eq!(parse_cpu_max("100000 0"), None);
        assert_eq!(parse_cpu_max(""), None);
        assert_eq!(parse_cpu_max("garbage 100000"), None);
    }

    #[test]
    fn cgroup_v1_cfs_quota() {
        assert_eq!(parse_cfs("-1\n", "100000\n"), None);
        assert_eq!(parse_cfs("200000\n", "100000\n"), Some(2));
        assert_eq!(parse_cfs("250000", "100000"), Some(2));
        assert_eq!(parse_cfs("10000", "100000"), Some(1));
        assert_eq!(parse_cfs("", "100000"), None);
        assert_eq!(parse_cfs("200000", "0"), None);
    }

    #[test]
    fn cgroup_membership() {
        let hybrid =
            "9:name=systemd:/\n4:memory:/x/y\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/docker/abc\n0::/\n";
        assert_eq!(
            cpu_cgroups(hybrid),
            [
                CpuCgroup::V1("/docker/abc".into()),
                CpuCgroup::V2("/".into())
            ]
        );
        assert_eq!(
            cpu_cgroups("5:cpu,cpuacct:/kubepods/pod1\n"),
            [CpuCgroup::V1("/kubepods/pod1".into())]
        );
        assert_eq!(
            cpu_cgroups("0::/user.slice/session-1.scope\n"),
            [CpuCgroup::V2("/user.slice/session-1.scope".into())]
        );
        assert_eq!(cpu_cgroups("3:cpuset:/\n2:cpuacct:/\n"), []);
        assert_eq!(self_and_ancestors("/a/b"), ["/a/b", "/a", "/"]);
        assert_eq!(self_and_ancestors("/a/b/"), ["/a/b", "/a", "/"]);
        assert_eq!(self_and_ancestors("/"), ["/"]);
    }

    #[test]
    fn default_threads_are_within_the_machine() {
        let n = physical_cores();
        let avail = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(n >= 1 && n <= avail, "{n} threads of {avail}");
    }
}
