//! One process-wide pool of compute threads with a cheap fork/join.
//!
//! A forward pass runs a handful of parallel regions per layer, each a few tens of
//! microseconds long, so the hand-off must cost about a microsecond: workers spin on an
//! epoch counter for a while after each region and only then sleep on a condition variable.
//! The caller takes part as worker 0. Regions from different threads (a verifier and a
//! drafter in one process) take turns; a region started from inside a region runs inline.

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it sleeps.
const SPIN: Duration = Duration::from_micros(300);

/// The environment variable that sets the pool's thread count.
pub const THREADS_ENV: &str = "SPECD_THREADS";

type Job = dyn Fn(usize) + Sync;

struct Shared {
    epoch: AtomicUsize,
    /// The current region's job; written only while no worker runs one.
    job: Mutex<Option<&'static Job>>,
    running: AtomicUsize,
    sleepers: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    panicked: AtomicBool,
}

pub struct ThreadPool {
    threads: usize,
    shared: Arc<Shared>,
    callers: Mutex<()>,
    handles: Vec<JoinHandle<()>>,
}

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

impl ThreadPool {
    /// A pool of `threads` (at least 1) compute threads, the caller included.
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: Mutex::new(None),
            running: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
        });
        let handles = (1..threads)
            .map(|index| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("specd-cpu-{index}"))
                    .spawn(move || worker(&shared, index))
                    .expect("spawning a compute thread")
            })
            .collect();
        Self {
            threads,
            shared,
            callers: Mutex::new(()),
            handles,
        }
    }

    /// The process-wide pool: `SPECD_THREADS` threads, or one per available core.
    pub fn global() -> &'static ThreadPool {
        static POOL: OnceLock<ThreadPool> = OnceLock::new();
        POOL.get_or_init(|| ThreadPool::new(default_threads()))
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(worker)` once on every worker (`0..threads`) and returns when all are done,
    /// with how long the region took from its start (not counting a wait for another
    /// caller's region to end).
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) -> Duration {
        if self.threads == 1 || INSIDE.with(Cell::get) {
            let started = Instant::now();
            for worker in 0..self.threads {
                f(worker);
            }
            return started.elapsed();
        }
        let _turn = self.callers.lock().unwrap_or_else(|e| e.into_inner());
        let started = Instant::now();
        // SAFETY: the job is only called until `running` drops to 0 below, before `f`'s
        // borrow ends; the slot is cleared before returning.
        let job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync + '_), &'static Job>(f) };
        *self.shared.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        self.shared.panicked.store(false, Ordering::Relaxed);
        self.shared
            .running
            .store(self.threads - 1, Ordering::SeqCst);
        self.shared.epoch.fetch_add(1, Ordering::SeqCst);
        if self.shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _lock = self
                .shared
                .sleep_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        INSIDE.with(|c| c.set(true));
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        INSIDE.with(|c| c.set(false));
        let mut spins = 0u32;
        while self.shared.running.load(Ordering::Acquire) != 0 {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1 << 12) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        *self.shared.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Err(panic) = mine {
            resume_unwind(panic);
        }
        if self.shared.panicked.load(Ordering::Relaxed) {
            panic!("a compute thread panicked");
        }
        started.elapsed()
    }
}

impl ThreadPool {
    /// Runs `f(i)` for every `i` in `0..count`, each index on one worker (claimed in turn, so
    /// a slow worker takes fewer); on the calling thread alone when `inline`.
    pub fn for_each_index(&self, count: usize, inline: bool, f: impl Fn(usize) + Sync) {
        let next = AtomicUsize::new(0);
        let work = |_| loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= count {
                break;
            }
            f(i);
        };
        if inline || count <= 1 {
            work(0);
        } else {
            self.run(&work);
        }
    }

    /// Runs `f(i, chunk)` for every `chunk`-long piece of `data` (the last may be shorter),
    /// each piece on one worker; on the calling thread alone when `inline`.
    pub fn for_each_chunk_mut<T: Send>(
        &self,
        data: &mut [T],
        chunk: usize,
        inline: bool,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        let chunk = chunk.max(1);
        let (len, pieces) = (data.len(), data.len().div_ceil(chunk));
        let base = SendPtr(data.as_mut_ptr());
        self.for_each_index(pieces, inline, |i| {
            let start = i * chunk;
            // SAFETY: piece `i` is claimed by one worker alone and lies inside `data`.
            let piece =
                unsafe { std::slice::from_raw_parts_mut(base.at(start), chunk.min(len - start)) };
            f(i, piece);
        });
    }
}

struct SendPtr<T>(*mut T);
// SAFETY: used only to hand disjoint pieces of one slice to workers.
unsafe impl<T: Send> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    fn at(&self, offset: usize) -> *mut T {
        // SAFETY: callers stay within the slice the pointer came from.
        unsafe { self.0.add(offset) }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.epoch.fetch_add(1, Ordering::SeqCst);
        {
            let _lock = self
                .shared
                .sleep_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

fn default_threads() -> usize {
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    match std::env::var(THREADS_ENV)
        .ok()
        .map(|v| v.trim().parse::<usize>())
    {
        Some(Ok(n)) if n >= 1 => n,
        Some(_) => {
            tracing::warn!(
                variable = THREADS_ENV,
                "not a positive thread count; using one thread per core"
            );
            available
        }
        None => available,
    }
}

fn worker(shared: &Shared, index: usize) {
    let mut seen = 0usize;
    loop {
        let started = Instant::now();
        let mut spins = 0u32;
        loop {
            if shared.epoch.load(Ordering::Acquire) != seen {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && started.elapsed() > SPIN {
                let mut lock = shared.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
                shared.sleepers.fetch_add(1, Ordering::SeqCst);
                while shared.epoch.load(Ordering::SeqCst) == seen {
                    lock = shared.wake.wait(lock).unwrap_or_else(|e| e.into_inner());
                }
                shared.sleepers.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            std::hint::spin_loop();
        }
        seen = shared.epoch.load(Ordering::Acquire);
        if shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let job = *shared.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = job {
            INSIDE.with(|c| c.set(true));
            if catch_unwind(AssertUnwindSafe(|| job(index))).is_err() {
                shared.panicked.store(true, Ordering::Relaxed);
            }
            INSIDE.with(|c| c.set(false));
        }
        shared.running.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_worker_runs_once_per_region() {
        for threads in 1..=3 {
            let pool = ThreadPool::new(threads);
            for _ in 0..200 {
                let hits: Vec<AtomicUsize> = (0..threads).map(|_| AtomicUsize::new(0)).collect();
                pool.run(&|w| {
                    hits[w].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn a_region_reports_at_least_the_time_its_workers_took() {
        for threads in 1..=2 {
            let pool = ThreadPool::new(threads);
            let took = pool.run(&|w| {
                if w == threads - 1 {
                    std::thread::sleep(Duration::from_millis(3));
                }
            });
            assert!(took >= Duration::from_millis(3), "{took:?}");
        }
    }

    #[test]
    fn chunks_cover_the_slice_once() {
        let pool = ThreadPool::new(3);
        for inline in [false, true] {
            let mut data = vec![0usize; 103];
            pool.for_each_chunk_mut(&mut data, 10, inline, |i, piece| {
                for (k, v) in piece.iter_mut().enumerate() {
                    *v += i * 10 + k + 1;
                }
            });
            assert!(data.iter().enumerate().all(|(k, v)| *v == k + 1));
        }
    }

    #[test]
    fn sleeping_workers_wake_up() {
        let pool = ThreadPool::new(2);
        let count = AtomicUsize::new(0);
        for _ in 0..3 {
            std::thread::sleep(SPIN * 4);
            pool.run(&|_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
        }
        assert_eq!(count.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn nested_regions_run_inline() {
        let pool = ThreadPool::new(2);
        let count = AtomicUsize::new(0);
        pool.run(&|_| {
            pool.run(&|_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(count.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_panicking_job_panics_the_caller_and_the_pool_survives() {
        let pool = ThreadPool::new(2);
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|w| {
                if w == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(result.is_err());
        let count = AtomicUsize::new(0);
        pool.run(&|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }
}
