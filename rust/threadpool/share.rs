//! Sharing the cores with the other oxillama processes on the machine.
//!
//! Two processes that each run a pool as wide as the machine, on the same
//! cores, run twice as many threads as there are cores. Every dispatch of
//! either then waits on threads that the scheduler keeps behind the other
//! process's, and both slow down far more than fair sharing would cost
//! (issue 35 measured 13x where 2x is fair). Like make's jobserver, the
//! processes agree on a split instead: each pool that is computing writes
//! a heartbeat and its width into a small board in shared memory, and while
//! pools of other processes on overlapping CPUs are active, a pool lets
//! only its share of the cores take part in its dispatches.
//!
//! Only which threads run a dispatch's chunks changes, never the chunks,
//! so a logit's bits do not depend on the neighbours. A pool of a process
//! that cannot open the board (no shared memory, no permission) keeps its
//! full width, as it did before there was a board. The board is per user:
//! processes of other users are not asked to step aside for ours.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Slots on the board, one per pool; a cache line each, so one process's
/// heartbeats do not invalidate the line another process scans.
const SLOTS: usize = 64;
const SLOT_WORDS: usize = 8;
const BOARD_BYTES: usize = SLOTS * SLOT_WORDS * 8;
/// The words of a slot: who holds it (0: free), its last heartbeat (µs of
/// CLOCK_MONOTONIC), the threads its pool was made with, and its CPUs (the
/// affinity mask folded to 64 bits).
const OWNER: usize = 0;
const BEAT: usize = 1;
const THREADS: usize = 2;
const CPUS: usize = 3;

/// A pool beats (and reads the board) at most this often: a decode step
/// is a hundred-odd dispatches a few microseconds apart.
const BEAT_EVERY_US: u64 = 1_000;
/// A pool whose last beat is older than this is idle and not counted: long
/// enough to cover the gap between the steps of a session that samples,
/// detokenizes and answers HTTP between them, short enough that a
/// neighbour that stopped hands its cores back within a blink.
const ACTIVE_US: u64 = 50_000;
/// A slot that has not beaten for this long may be taken by a new pool
/// (its process most likely exited without releasing it).
const STALE_US: u64 = 10_000_000;
/// A slot's thread count is trusted up to this (the board is writable by
/// every process of the user; a wild value must not starve us).
const MAX_THREADS: u64 = 4096;

/// Microseconds of CLOCK_MONOTONIC, which every process of the machine
/// reads alike (unlike `Instant`, which cannot be shared).
#[cfg(unix)]
pub(super) fn now_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on
    // every Linux and macOS this builds for. On failure `ts` stays zero.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000)
        .saturating_add(ts.tv_nsec as u64 / 1_000)
}

/// Elsewhere no board is opened (`process_board`), so no clock is shared.
#[cfg(not(unix))]
pub(super) fn now_us() -> u64 {
    0
}

/// How many threads a pool made with `mine` may run while active pools of
/// other processes on the same CPUs ask for `others`, on `cores` cores: all
/// of them while everyone fits, else its proportional share (at least one).
pub fn share(mine: usize, others: usize, cores: usize) -> usize {
    let mine = mine.max(1);
    if others == 0 || mine.saturating_add(others) <= cores {
        return mine;
    }
    let total = mine.saturating_add(others);
    (cores.saturating_mul(mine) / total).clamp(1, mine)
}

/// The board: a page of slots in a file in shared memory, mapped by every
/// oxillama process of the user.
pub struct Board {
    map: memmap2::MmapMut,
    /// This process's cores and CPUs, as the slots' counts are read against.
    cores: usize,
    cpus: u64,
}

impl Board {
    /// Opens (creating it if needed) the board at `path`.
    pub fn open(path: &Path, cores: usize, cpus: u64) -> std::io::Result<Board> {
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options.open(path)?;
        if file.metadata()?.len() < BOARD_BYTES as u64 {
            // Two processes racing here both set the same length; growing a
            // file zero-fills it, and zero is a free slot.
            file.set_len(BOARD_BYTES as u64)?;
        }
        // SAFETY: a shared mapping of a file other processes may change at
        // any time; we only ever read and write it through the atomic words
        // of `word`, and never hand out a reference to its bytes.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .len(BOARD_BYTES)
                .map_mut(&file)?
        };
        Ok(Board {
            map,
            cores: cores.max(1),
            cpus: cpus.max(1),
        })
    }

    fn word(&self, slot: usize, w: usize) -> &AtomicU64 {
        let i = slot * SLOT_WORDS + w;
        assert!(i < SLOTS * SLOT_WORDS);
        // SAFETY: the mapping is BOARD_BYTES long and page-aligned, so word
        // i is in bounds and 8-byte aligned; AtomicU64 has u64's layout, and
        // every access to the page, from any process, is atomic.
        unsafe { &*(self.map.as_ptr() as *const AtomicU64).add(i) }
    }

    /// Takes a free (or stale) slot for a pool of `threads`; None when the
    /// board is full.
    fn claim(&self, token: u64, threads: usize, now: u64) -> Option<usize> {
        for slot in 0..SLOTS {
            let owner = self.word(slot, OWNER).load(Ordering::Acquire);
            let beat = self.word(slot, BEAT).load(Ordering::Acquire);
            let free = owner == 0 || now.saturating_sub(beat) > STALE_US;
            if !free {
                continue;
            }
            // Until our beat below, a scanner may pair our token with a
            // stale slot's old beat: it then counts us idle, for a moment.
            if self
                .word(slot, OWNER)
                .compare_exchange(owner, token, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.word(slot, THREADS)
                    .store(threads as u64, Ordering::Relaxed);
                self.word(slot, CPUS).store(self.cpus, Ordering::Relaxed);
                self.word(slot, BEAT).store(now, Ordering::Release);
                return Some(slot);
            }
        }
        None
    }

    /// The threads that active pools of others on CPUs overlapping ours ask
    /// for, at `now`.
    fn others(&self, mine: usize, now: u64) -> usize {
        let mut sum: u64 = 0;
        for slot in (0..SLOTS).filter(|&s| s != mine) {
            if self.word(slot, OWNER).load(Ordering::Acquire) == 0 {
                continue;
            }
            let beat = self.word(slot, BEAT).load(Ordering::Acquire);
            if now.saturating_sub(beat) > ACTIVE_US || beat > now.saturating_add(ACTIVE_US) {
                continue;
            }
            if self.word(slot, CPUS).load(Ordering::Relaxed) & self.cpus == 0 {
                continue;
            }
            let t = self.word(slot, THREADS).load(Ordering::Relaxed);
            sum = sum.saturating_add(t.clamp(1, MAX_THREADS));
        }
        usize::try_from(sum).unwrap_or(usize::MAX)
    }
}

/// One pool's place on the board: its slot, and the share it last read.
pub struct Seat {
    board: Arc<Board>,
    token: u64,
    threads: usize,
    /// The slot held (SLOTS: none, the board was full at the last try).
    slot: AtomicUsize,
    last_beat: AtomicU64,
    share: AtomicUsize,
}

impl Seat {
    /// A seat for a pool of `threads` on `board`.
    pub fn new(board: Arc<Board>, threads: usize) -> Seat {
        static SERIAL: AtomicU64 = AtomicU64::new(1);
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff;
        let token = (u64::from(std::process::id()) << 32) | serial;
        Seat {
            board,
            token,
            threads: threads.max(1),
            slot: AtomicUsize::new(SLOTS),
            last_beat: AtomicU64::new(0),
            share: AtomicUsize::new(threads.max(1)),
        }
    }

    /// The threads the pool may run now: beats and re-reads the board when
    /// the last beat is older than `BEAT_EVERY_US`, else the share it read
    /// then. Called by the dispatching thread before each dispatch.
    pub fn threads_now(&self) -> usize {
        let now = now_us();
        if now.saturating_sub(self.last_beat.load(Ordering::Relaxed)) < BEAT_EVERY_US {
            return self.share.load(Ordering::Relaxed);
        }
        self.last_beat.store(now, Ordering::Relaxed);
        let b = &*self.board;
        let mut slot = self.slot.load(Ordering::Relaxed);
        // Our slot may have been taken as stale while we were idle.
        if slot >= SLOTS || b.word(slot, OWNER).load(Ordering::Acquire) != self.token {
            slot = b.claim(self.token, self.threads, now).unwrap_or(SLOTS);
            self.slot.store(slot, Ordering::Relaxed);
        }
        let n = if slot < SLOTS {
            b.word(slot, BEAT).store(now, Ordering::Release);
            share(self.threads, b.others(slot, now), b.cores)
        } else {
            self.threads
        };
        self.share.store(n, Ordering::Relaxed);
        n
    }

    /// The share read at the last beat (`threads` until the first).
    pub fn last_share(&self) -> usize {
        self.share.load(Ordering::Relaxed)
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let slot = *self.slot.get_mut();
        if slot < SLOTS {
            // Only if it is still ours.
            let _ = self.board.word(slot, OWNER).compare_exchange(
                self.token,
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }
}

/// Where the board lives: shared memory when the machine has it, else the
/// temporary directory; one per user.
#[cfg(unix)]
fn board_path() -> PathBuf {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("oxillama-cores-{uid}.v1"))
}

/// The CPUs this process may run on, folded to 64 bits (CPU i sets bit
/// i % 64): two processes pinned to disjoint sets do not share.
fn cpu_bits() -> u64 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity
        // writes at most its size into it, and CPU_ISSET reads within it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
                let mut bits = 0u64;
                for cpu in 0..libc::CPU_SETSIZE as usize {
                    if libc::CPU_ISSET(cpu, &set) {
                        bits |= 1 << (cpu % 64);
                    }
                }
                if bits != 0 {
                    return bits;
                }
            }
        }
    }
    u64::MAX
}

/// The process's board, opened on first use; None when sharing is off
/// (`OXILLAMA_SHARE_CORES=0`) or the board cannot be opened. Only on Unix,
/// whose clocks and shared memory it relies on.
#[cfg(not(unix))]
pub fn process_board() -> Option<Arc<Board>> {
    None
}

/// The process's board, opened on first use; None when sharing is off
/// (`OXILLAMA_SHARE_CORES=0`) or the board cannot be opened.
#[cfg(unix)]
pub fn process_board() -> Option<Arc<Board>> {
    static BOARD: OnceLock<Option<Arc<Board>>> = OnceLock::new();
    BOARD
        .get_or_init(|| {
            if !crate::env_switch::on("OXILLAMA_SHARE_CORES") {
                return None;
            }
            Board::open(&board_path(), super::physical_cores(), cpu_bits())
                .ok()
                .map(Arc::new)
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_board(cores: usize, cpus: u64) -> (PathBuf, Arc<Board>) {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "oxillama-board-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let board = Arc::new(Board::open(&path, cores, cpus).unwrap());
        (path, board)
    }

    #[test]
    fn the_share_is_everything_while_all_fit_and_proportional_after() {
        assert_eq!(share(2, 0, 2), 2);
        assert_eq!(share(4, 0, 2), 4, "alone, an explicit width stands");
        assert_eq!(share(2, 2, 2), 1);
        assert_eq!(share(16, 16, 16), 8);
        assert_eq!(share(8, 8, 16), 8, "two that fit keep their width");
        assert_eq!(share(2, 1, 2), 1);
        assert_eq!(share(1, 8, 2), 1, "never below one");
        assert_eq!(share(12, 4, 8), 6);
        assert_eq!(share(3, usize::MAX, 4), 1);
    }

    #[test]
    fn two_active_seats_split_the_cores_and_an_idle_one_gives_them_back() {
        let (path, board) = temp_board(2, 0b11);
        let a = Seat::new(Arc::clone(&board), 2);
        assert_eq!(a.threads_now(), 2, "alone on the board");
        let b = Seat::new(Arc::clone(&board), 2);
        assert_eq!(b.threads_now(), 1, "a is active");
        std::thread::sleep(std::time::Duration::from_micros(BEAT_EVERY_US + 100));
        assert_eq!(a.threads_now(), 1, "b is active");
        // b stops: once its beat is older than ACTIVE_US, a has both cores.
        std::thread::sleep(std::time::Duration::from_micros(ACTIVE_US + 1_000));
        assert_eq!(a.threads_now(), 2);
        drop((a, b));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn pools_on_other_cpus_do_not_count_and_a_dropped_seat_frees_its_slot() {
        let (path, board) = temp_board(2, 0b0011);
        let a = Seat::new(Arc::clone(&board), 2);
        a.threads_now();
        let slot = a.slot.load(Ordering::Relaxed);
        assert!(slot < SLOTS);
        // A neighbour pinned to CPUs 2-3 (another view of the same board).
        let elsewhere = Arc::new(Board::open(&path, 2, 0b1100).unwrap());
        let b = Seat::new(elsewhere, 2);
        assert_eq!(b.threads_now(), 2);
        drop(a);
        assert_eq!(board.word(slot, OWNER).load(Ordering::Relaxed), 0);
        drop(b);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn wild_words_from_another_process_neither_panic_nor_starve_us() {
        let (path, board) = temp_board(4, u64::MAX);
        let now = now_us();
        for slot in 0..SLOTS {
            board
                .word(slot, OWNER)
                .store(u64::MAX - slot as u64, Ordering::Relaxed);
            board.word(slot, BEAT).store(now, Ordering::Relaxed);
            board.word(slot, THREADS).store(u64::MAX, Ordering::Relaxed);
            board.word(slot, CPUS).store(u64::MAX, Ordering::Relaxed);
        }
        // A full board of live, absurd slots: no slot, so the full width.
        let a = Seat::new(Arc::clone(&board), 4);
        assert_eq!(a.threads_now(), 4);
        // Beats from the future are not counted as active.
        for slot in 1..SLOTS {
            board.word(slot, BEAT).store(u64::MAX, Ordering::Relaxed);
        }
        board.word(0, OWNER).store(0, Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_micros(BEAT_EVERY_US + 100));
        assert_eq!(a.threads_now(), 4);
        assert_eq!(a.slot.load(Ordering::Relaxed), 0);
        drop(a);
        std::fs::remove_file(path).unwrap();
    }
}
