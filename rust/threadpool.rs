//! A persistent worker pool built for per-token inference.
//!
//! One `run` call is one dispatch: the caller publishes a job, every thread
//! (the caller included) claims chunk indices from a shared atomic counter
//! until none are left, and the caller returns once all workers have
//! finished. There is no per-chunk task allocation and no fork/join tree.
//! Workers spin for a short while after each job so the next dispatch of the
//! same token finds them awake, then park on a condition variable so an
//! idle engine costs no CPU.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a worker keeps spinning for the next job before parking.
const SPIN_FOR: Duration = Duration::from_micros(300);

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
    /// Erased to 'static; see the SAFETY note in `run`.
    f: Option<*const JobFn<'static>>,
    n_chunks: usize,
}

struct Shared {
    /// Bumped once per dispatch; workers wait for it to change.
    generation: AtomicU64,
    job: UnsafeCell<Job>,
    next_chunk: AtomicUsize,
    /// Workers still busy with the current generation.
    active: AtomicUsize,
    panicked: AtomicBool,
    /// The first worker panic's message of the current dispatch, re-raised
    /// on the caller so the report names the real failure.
    panic_message: Mutex<Option<String>>,
    shutdown: AtomicBool,
    sleep_lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the dispatching thread while no worker
// reads it (before the generation bump, after all workers have reported
// done), and read by workers only between those two points; every other
// field is atomic or a lock.
unsafe impl Sync for Shared {}
// SAFETY: the raw job pointer is only dereferenced under the protocol above.
unsafe impl Send for Shared {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes dispatches from different callers (two engines on two
    /// Python threads may share one pool).
    dispatch: Mutex<()>,
    n_threads: usize,
}

impl ThreadPool {
    /// A pool that runs jobs on `n_threads` threads, the caller included.
    pub fn new(n_threads: usize) -> Self {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(Job {
                f: None,
                n_chunks: 0,
            }),
            next_chunk: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            panic_message: Mutex::new(None),
            shutdown: AtomicBool::new(false),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n_threads)
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("oxillama-worker-{i}"))
                    .spawn(move || worker_loop(&s))
                    .expect("cannot spawn oxillama worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            dispatch: Mutex::new(()),
            n_threads,
        }
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(i)` for every `i in 0..n_chunks`, spread over the pool.
    /// Returns when every call has finished. A panic in `f` is re-raised here.
    pub fn run<F: Fn(usize) + Sync>(&self, n_chunks: usize, f: F) {
        if n_chunks == 0 {
            return;
        }
        if self.workers.is_empty() || n_chunks == 1 {
            (0..n_chunks).for_each(f);
            return;
        }
        let _guard = self.dispatch.lock().unwrap_or_else(|p| p.into_inner());
        let s = &*self.shared;
        let f_ref: &JobFn<'_> = &f;
        // SAFETY: we erase the closure's lifetime to publish it to workers.
        // This call does not return until `active` drops to zero, i.e. until
        // every worker has stopped using the pointer, so the closure outlives
        // every use. No worker reads `job` before the generation bump below.
        unsafe {
            *s.job.get() = Job {
                f: Some(std::mem::transmute::<*const JobFn<'_>, *const JobFn<'static>>(f_ref)),
                n_chunks,
            };
        }
        s.next_chunk.store(0, Ordering::Relaxed);
        s.active.store(self.workers.len(), Ordering::Relaxed);
        {
            let _l = s.sleep_lock.lock().unwrap_or_else(|p| p.into_inner());
            s.generation.fetch_add(1, Ordering::Release);
        }
        s.wake.notify_all();

        let caller = catch_unwind(AssertUnwindSafe(|| claim_chunks(s, f_ref, n_chunks)));

        while s.active.load(Ordering::Acquire) != 0 {
            std::hint::spin_loop();
        }
        if let Err(p) = caller {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Acquire) {
            let what = s
                .panic_message
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .unwrap_or_default();
            panic!("an oxillama worker thread panicked: {what}");
        }
    }
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

fn worker_loop(s: &Shared) {
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin first, then park.
        let start = Instant::now();
        let mut gen = s.generation.load(Ordering::Acquire);
        while gen == seen && !s.shutdown.load(Ordering::Relaxed) {
            if start.elapsed() < SPIN_FOR {
                std::hint::spin_loop();
            } else {
                let l = s.sleep_lock.lock().unwrap_or_else(|p| p.into_inner());
                gen = s.generation.load(Ordering::Acquire);
                if gen == seen && !s.shutdown.load(Ordering::Relaxed) {
                    drop(s.wake.wait(l).unwrap_or_else(|p| p.into_inner()));
                }
            }
            gen = s.generation.load(Ordering::Acquire);
        }
        if s.shutdown.load(Ordering::Relaxed) {
            return;
        }
        seen = gen;
        // SAFETY: the dispatcher wrote `job` before bumping the generation
        // (Release/Acquire pair above) and will not touch it again until we
        // decrement `active`; the closure it points to outlives that moment.
        let (f, n_chunks) = unsafe {
            let job = &*s.job.get();
            match job.f {
                Some(f) => (&*f, job.n_chunks),
                None => (&(|_| {}) as &JobFn<'static>, 0),
            }
        };
        let ran = catch_unwind(AssertUnwindSafe(|| {
            if PANIC_NEXT_WORKER.load(Ordering::Relaxed)
                && PANIC_NEXT_WORKER.swap(false, Ordering::SeqCst)
            {
                panic!("test panic injected in a worker thread");
            }
            claim_chunks(s, f, n_chunks)
        }));
        if let Err(payload) = ran {
            let what = crate::error::panic_text(&*payload);
            let mut first = s.panic_message.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert(what);
            drop(first);
            s.panicked.store(true, Ordering::Release);
        }
        s.active.fetch_sub(1, Ordering::Release);
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
            self.shared.shutdown.store(true, Ordering::Relaxed);
        }
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Physical cores, the default thread count: SMT siblings share the
/// execution units these kernels saturate, so they add contention, not speed.
pub fn physical_cores() -> usize {
    #[cfg(target_os = "linux")]
    {
        if let Some(n) = linux_physical_cores() {
            return n;
        }
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
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
    let avail = std::thread::available_parallelism().map_or(1, |n| n.get());
    (!cores.is_empty()).then(|| cores.len().min(avail))
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
}
