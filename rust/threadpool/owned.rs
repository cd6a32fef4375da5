//! Dispatches whose state outlives them, so the caller never waits for a
//! preempted worker.
//!
//! A `run` job borrows the caller's stack, so the caller must wait for
//! every worker inside it: on cores shared with another process, a worker
//! the scheduler takes off its core mid-chunk holds the whole step for the
//! rest of the neighbour's slice (milliseconds, against a chunk's
//! microseconds). An `OwnedJob` owns everything its chunks read and write
//! (or holds what owns it), and records per chunk who computed it. Once
//! no chunk is left to claim, the caller redoes any chunk a worker still
//! holds after a short patience into its own output, and returns; the
//! late worker finishes into the job's buffer, sees the chunk taken, and
//! its result is never read. Every chunk gives the same bits whoever
//! computes it, so the outputs do not depend on who was preempted. The
//! caller copies each chunk a worker finished into its output as soon as
//! it sees it done, while it waits for the others.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where a chunk's computation writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The job's own buffer: a worker's claim, read only if the chunk
    /// ends up computed by that worker.
    Job,
    /// The caller's output, which lives for the span of the dispatch:
    /// only the dispatching thread (never late) writes there.
    Out,
}

/// The chunks of an owned job.
///
/// # Contract
/// `compute(i, slot)` runs at most once per chunk and slot in a dispatch,
/// possibly for both slots at once on two threads, and a worker's
/// `Slot::Job` call may still be running after the dispatch returned (and
/// until the job's last `Arc` is dropped). So it must read only what the
/// job owns or keeps alive, write only chunk `i`'s region of the slot, and
/// touch `Slot::Out` memory only when called with `Slot::Out`.
///
/// `collect(i)` copies chunk `i`'s result from the job's buffer to the
/// caller's output. The dispatching thread calls it once per chunk a
/// worker finished, during the dispatch, after that worker published
/// the chunk and stopped writing it.
pub trait ChunkWork: Send + Sync + 'static {
    fn compute(&self, chunk: usize, slot: Slot);
    fn collect(&self, chunk: usize);
}

/// A chunk's state. FREE -> CLAIMED (a worker) -> DONE_JOB -> COLLECTED
/// (the caller copied it out), unless the caller takes it first (FREE or
/// CLAIMED -> TAKEN -> DONE_OUT); the caller's own claims go FREE -> TAKEN
/// -> DONE_OUT.
const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const TAKEN: u8 = 2;
const DONE_JOB: u8 = 3;
const DONE_OUT: u8 = 4;
/// A worker's computation panicked; the caller re-raises it.
const FAILED: u8 = 5;
const COLLECTED: u8 = 6;

/// The least time the caller gives a worker's claimed chunk before
/// redoing it, and the multiple of its own chunks' mean time it gives
/// when that is longer: a worker on a core of its own finishes its last
/// chunk within about one chunk of the caller; a preempted one is gone
/// for a scheduler slice, a thousand times that.
const PATIENCE_MIN: Duration = Duration::from_micros(10);
const PATIENCE_CHUNKS: u32 = 3;

pub struct OwnedJob<W> {
    pub work: W,
    next: AtomicUsize,
    states: Vec<AtomicU8>,
    panic_message: Mutex<Option<String>>,
}

impl<W: ChunkWork> OwnedJob<W> {
    pub fn new(work: W) -> Self {
        OwnedJob {
            work,
            next: AtomicUsize::new(0),
            states: Vec::new(),
            panic_message: Mutex::new(None),
        }
    }

    /// Readies the job for a dispatch of `n` chunks (through `Arc::get_mut`,
    /// so no late worker can be inside it).
    pub fn reset(&mut self, n: usize) {
        self.next.store(0, Ordering::Relaxed);
        self.states.clear();
        self.states.resize_with(n, || AtomicU8::new(FREE));
        *self
            .panic_message
            .get_mut()
            .unwrap_or_else(|p| p.into_inner()) = None;
    }

    pub fn n_chunks(&self) -> usize {
        self.states.len()
    }

    /// Where chunk `i` was computed, once the dispatch has returned: by a
    /// worker into the job (and collected into the output since), or by
    /// the caller into the output. Either way the output holds it.
    pub fn slot(&self, i: usize) -> Slot {
        match self.states[i].load(Ordering::Acquire) {
            COLLECTED => Slot::Job,
            DONE_OUT => Slot::Out,
            s => unreachable!("chunk {i} in state {s} after its dispatch"),
        }
    }

    /// The caller's share: claims chunks into its output until none are
    /// left; returns how many it ran and for how long.
    pub(super) fn caller_claims(&self) -> (u32, Duration) {
        let start = Instant::now();
        let mut ran = 0;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.states.len() {
                return (ran, start.elapsed());
            }
            if self.states[i]
                .compare_exchange(FREE, TAKEN, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                self.work.compute(i, Slot::Out);
                self.states[i].store(DONE_OUT, Ordering::Relaxed);
                ran += 1;
            }
        }
    }

    /// After the claims: copies each chunk a worker finished into the
    /// output as soon as it sees it done (so the copies overlap the wait
    /// for the rest), and waits for each chunk a worker still holds,
    /// redoing it once `patience` has passed (or at once when its worker
    /// has not begun it). Re-raises a worker's panic.
    pub(super) fn caller_finishes(&self, patience: Duration) {
        let start = Instant::now();
        // Every chunk before `first` is in the output.
        let mut first = 0;
        while first < self.states.len() {
            let mut unsettled = None;
            for (i, st) in self.states.iter().enumerate().skip(first) {
                let settled = match st.load(Ordering::Acquire) {
                    DONE_OUT | COLLECTED => true,
                    DONE_JOB => {
                        // The worker published the chunk (our Acquire read
                        // its Release) and never writes it again.
                        self.work.collect(i);
                        st.store(COLLECTED, Ordering::Relaxed);
                        true
                    }
                    FAILED => reraise_worker_panic(&self.panic_message),
                    s @ (FREE | CLAIMED) if s == FREE || start.elapsed() >= patience => {
                        // Fails only if the worker settled it meanwhile: the
                        // next pass sees how.
                        let took = st
                            .compare_exchange(s, TAKEN, Ordering::Acquire, Ordering::Relaxed)
                            .is_ok();
                        if took {
                            self.work.compute(i, Slot::Out);
                            st.store(DONE_OUT, Ordering::Relaxed);
                        }
                        took
                    }
                    _ => false,
                };
                if !settled {
                    unsettled.get_or_insert(i);
                }
            }
            match unsettled {
                Some(i) => {
                    first = i;
                    std::hint::spin_loop();
                }
                None => first = self.states.len(),
            }
        }
        // A worker that panicked in a chunk the caller then redid: the
        // result stands, but the failure is not hidden.
        let late = self
            .panic_message
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if late {
            reraise_worker_panic(&self.panic_message);
        }
    }
}

/// The patience `caller_finishes` gives, from the `ran` chunks the caller
/// computed in `took`.
pub(super) fn patience(ran: u32, took: Duration) -> Duration {
    if ran == 0 {
        return PATIENCE_MIN;
    }
    (took / ran * PATIENCE_CHUNKS).max(PATIENCE_MIN)
}

/// Panics on this thread with the worker panic's message kept in
/// `message` (the first one, if several).
pub(super) fn reraise_worker_panic(message: &Mutex<Option<String>>) -> ! {
    let what = message
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .unwrap_or_default();
    panic!("an oxillama worker thread panicked: {what}");
}

/// What a worker does with an owned job (object-safe, so the pool can
/// publish any job).
pub(super) trait Claim: Send + Sync {
    fn worker_claims(&self);
}

impl<W: ChunkWork> Claim for OwnedJob<W> {
    fn worker_claims(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.states.len() {
                return;
            }
            let st = &self.states[i];
            if st
                .compare_exchange(FREE, CLAIMED, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            match catch_unwind(AssertUnwindSafe(|| self.work.compute(i, Slot::Job))) {
                // Release publishes the chunk's writes to the caller's
                // Acquire load; if the caller took the chunk meanwhile the
                // exchange fails and the result is never read.
                Ok(()) => {
                    let _ = st.compare_exchange(
                        CLAIMED,
                        DONE_JOB,
                        Ordering::Release,
                        Ordering::Relaxed,
                    );
                }
                Err(payload) => {
                    let what = crate::error::panic_text(&*payload);
                    self.panic_message
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(what);
                    let _ =
                        st.compare_exchange(CLAIMED, FAILED, Ordering::Release, Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::threadpool::{SharedMut, ThreadPool};
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// Chunk i writes `i * 10 + round` to its cell of the slot; `Slot::Job`
    /// computations can be held at a gate (a preempted worker) and counted.
    struct Cells {
        /// What `job_ptr` points into.
        _job: Vec<u64>,
        job_ptr: SharedMut<u64>,
        out_ptr: SharedMut<u64>,
        round: u64,
        /// Each `Slot::Out` computation sleeps this long (so workers join).
        caller_delay: Duration,
        gate: Mutex<()>,
        job_calls: AtomicUsize,
        panic_in_job: AtomicBool,
    }

    impl Cells {
        fn new(n: usize, out: &mut [u64], caller_delay: Duration) -> Self {
            let mut job = vec![0; n];
            let job_ptr = SharedMut::new(&mut job);
            Cells {
                _job: job,
                job_ptr,
                out_ptr: SharedMut::new(out),
                round: 0,
                caller_delay,
                gate: Mutex::new(()),
                job_calls: AtomicUsize::new(0),
                panic_in_job: AtomicBool::new(false),
            }
        }
    }

    impl ChunkWork for Cells {
        fn compute(&self, i: usize, slot: Slot) {
            let cell = match slot {
                Slot::Job => {
                    self.job_calls.fetch_add(1, Ordering::Relaxed);
                    drop(self.gate.lock().unwrap_or_else(|p| p.into_inner()));
                    if self.panic_in_job.load(Ordering::Relaxed) {
                        panic!("chunk {i} failed");
                    }
                    &self.job_ptr
                }
                Slot::Out => {
                    std::thread::sleep(self.caller_delay);
                    &self.out_ptr
                }
            };
            // SAFETY: one cell per chunk, one computation per chunk and slot.
            unsafe { cell.slice(i, 1)[0] = i as u64 * 10 + self.round };
        }

        fn collect(&self, i: usize) {
            // SAFETY: chunk i's worker is done with its cell; the caller
            // alone writes the output, one chunk's cell at a time.
            unsafe { self.out_ptr.slice(i, 1)[0] = self.job_ptr.slice(i, 1)[0] };
        }
    }

    /// Chunk i's result as the caller sees it: in the output, whoever
    /// computed it (a worker's, collected, equals its job cell).
    fn result(job: &OwnedJob<Cells>, out: &[u64], i: usize) -> u64 {
        if job.slot(i) == Slot::Job {
            // SAFETY: the chunk's worker has finished (its state said so).
            assert_eq!(unsafe { job.work.job_ptr.slice(i, 1)[0] }, out[i]);
        }
        out[i]
    }

    #[test]
    fn every_chunk_is_computed_into_the_slot_it_names() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            for n in [1usize, 2, 7, 300] {
                let mut out = vec![0u64; n];
                let mut job = Arc::new(OwnedJob::new(Cells::new(n, &mut out, Duration::ZERO)));
                for round in 0..50 {
                    // Reuse needs every late worker gone (none can be late
                    // here, but the protocol allows it).
                    let j = loop {
                        if let Some(j) = Arc::get_mut(&mut job) {
                            break j;
                        }
                        std::thread::yield_now();
                    };
                    j.reset(n);
                    j.work.round = round;
                    pool.run_owned(&job);
                    for i in 0..n {
                        assert_eq!(result(&job, &out, i), i as u64 * 10 + round);
                    }
                }
            }
        }
    }

    #[test]
    fn a_worker_held_mid_chunk_does_not_hold_the_caller() {
        let pool = ThreadPool::new(2);
        let n = 8;
        let mut out = vec![0u64; n];
        let cells = Cells::new(n, &mut out, Duration::from_millis(2));
        let mut fresh = Arc::new(OwnedJob::new(cells));
        Arc::get_mut(&mut fresh).unwrap().reset(n);
        let gate = fresh.work.gate.lock().unwrap();
        // The worker claims a chunk while the caller sleeps in its first,
        // and stays at the gate: the caller must redo that chunk and return.
        pool.run_owned(&fresh);
        let held = fresh.work.job_calls.load(Ordering::Relaxed);
        assert!(held >= 1, "the worker never claimed a chunk");
        for (i, &o) in out.iter().enumerate() {
            assert_eq!(fresh.slot(i), Slot::Out, "chunk {i}");
            assert_eq!(o, i as u64 * 10);
        }
        // The late worker still holds the job; once let go it finishes
        // into the job's buffer and drops its reference.
        assert!(Arc::strong_count(&fresh) > 1);
        drop(gate);
        let t = Instant::now();
        while Arc::strong_count(&fresh) > 1 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the late worker kept the job"
            );
            std::thread::yield_now();
        }
        assert!((0..n).all(|i| fresh.slot(i) == Slot::Out));
    }

    #[test]
    fn a_panic_in_a_workers_chunk_is_reraised_by_the_caller() {
        let pool = ThreadPool::new(2);
        let n = 8;
        let mut out = vec![0u64; n];
        // The caller's chunks are slow, so its patience outlasts the
        // panic's unwinding (a panic hook can take milliseconds).
        let slow = Duration::from_millis(20);
        let mut job = Arc::new(OwnedJob::new(Cells::new(n, &mut out, slow)));
        {
            let j = Arc::get_mut(&mut job).unwrap();
            j.reset(n);
            j.work.panic_in_job.store(true, Ordering::Relaxed);
        }
        let err = catch_unwind(AssertUnwindSafe(|| pool.run_owned(&job)))
            .expect_err("the worker's panic was lost");
        let what = crate::error::panic_text(&*err);
        assert!(what.contains("failed"), "{what}");
        // The pool still works.
        let mut out2 = vec![0u64; n];
        let mut job2 = Arc::new(OwnedJob::new(Cells::new(n, &mut out2, Duration::ZERO)));
        Arc::get_mut(&mut job2).unwrap().reset(n);
        pool.run_owned(&job2);
        assert!((0..n).all(|i| result(&job2, &out2, i) == i as u64 * 10));
    }
}
