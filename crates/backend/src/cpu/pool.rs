//! A fixed pool of worker threads that run one parallel loop at a time.
//!
//! A decode step runs a few hundred short parallel loops (tens of microseconds each), so the pool
//! is built for low latency and no allocation per loop: the caller publishes a borrowed closure,
//! workers spin briefly before sleeping, the caller takes part in the work, and returns only after
//! every worker has finished with the closure.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins on the job counter before it sleeps. Long enough to bridge the
/// gap between the ops of one forward pass, short enough not to burn a core between requests.
const SPIN: Duration = Duration::from_micros(200);

/// A loop body: called with the index of the thread running it (0 is the caller, workers are
/// `1..threads`) and a range of items.
type Job<'a> = dyn Fn(usize, Range<usize>) + Sync + 'a;

struct Shared {
    /// Bumped by the caller for every new loop; workers run each generation once.
    generation: AtomicU64,
    /// The loop being run; readable by a worker only while it is active in an open loop.
    job: UnsafeCell<Option<&'static Job<'static>>>,
    /// The next unclaimed item and the loop's length and grain.
    next: AtomicUsize,
    len: AtomicUsize,
    grain: AtomicUsize,
    /// Workers inside a loop: they joined it and have not yet left.
    active: AtomicU64,
    /// The last generation whose loop is closed to late joiners: every range has been claimed,
    /// so a worker that arrives now has nothing to do and must not touch `job`.
    closed: AtomicU64,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    sleep_lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the caller of `ThreadPool::for_each` while no worker can read
// it: before the generation is published, and after the loop is closed and no worker is active.
// Workers read it only after joining an open loop (see `worker`). All other fields are atomics
// or locks.
unsafe impl Sync for Shared {}

/// A pool of `threads - 1` workers; the calling thread is the remaining one.
pub(crate) struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises callers: one parallel loop at a time.
    caller: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("threads", &self.threads())
            .finish()
    }
}

impl ThreadPool {
    pub(crate) fn new(threads: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            next: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            grain: AtomicUsize::new(1),
            active: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..threads.max(1))
            .map(|i| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("lucebox-cpu-{i}"))
                    .spawn(move || worker(&shared, i))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            shared,
            workers,
            caller: Mutex::new(()),
        })
    }

    /// The number of threads that run a loop, the caller included.
    pub(crate) fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f` over `0..len` split into ranges of `grain` items (the last may be shorter), on
    /// every thread, and returns when all ranges are done. Ranges are claimed dynamically, so
    /// uneven work balances itself. `f` also gets the running thread's index, below
    /// [`threads`](Self::threads), to pick per-thread scratch space.
    pub(crate) fn for_each(&self, len: usize, grain: usize, f: &Job<'_>) {
        if len == 0 {
            return;
        }
        let grain = grain.max(1);
        if self.workers.is_empty() || len <= grain {
            f(0, 0..len);
            return;
        }
        let _one_loop_at_a_time = self.caller.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: the lifetime is erased only for the duration of this call: a worker uses `job`
        // only between joining an open loop and leaving it (`active`), this function closes the
        // loop and waits for `active` to reach zero before it returns, and clears `job` after.
        let erased: &'static Job<'static> =
            unsafe { std::mem::transmute::<&Job<'_>, &Job<'static>>(f) };
        // SAFETY: no worker can read `job` now: the previous loop was closed with no worker
        // active, and the new generation is not yet published.
        unsafe { *s.job.get() = Some(erased) };
        s.next.store(0, Ordering::Relaxed);
        s.len.store(len, Ordering::Relaxed);
        s.grain.store(grain, Ordering::Relaxed);
        let generation = {
            let _guard = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.generation.fetch_add(1, Ordering::SeqCst) + 1
        };
        s.wake.notify_all();
        // The caller must not unwind while workers still use the closure: catch, wait, rethrow.
        let caller_result = catch_unwind(AssertUnwindSafe(|| run_ranges(s, 0, f)));
        // Every range is claimed: workers that have not joined yet stay out; wait for the rest.
        s.closed.store(generation, Ordering::SeqCst);
        let mut spins = 0u32;
        while s.active.load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins < 4096 {
                std::hint::spin_loop();
            } else {
                // A worker was descheduled mid-range (another process wants the core): give it
                // the core rather than spinning away our time slice.
                std::thread::yield_now();
            }
        }
        // SAFETY: the loop is closed and no worker is active (SeqCst above).
        unsafe { *s.job.get() = None };
        if let Err(payload) = caller_result {
            s.panicked.store(false, Ordering::Relaxed);
            std::panic::resume_unwind(payload);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a CPU backend worker thread panicked");
        }
    }
}

fn run_ranges(s: &Shared, thread: usize, f: &Job<'_>) {
    let len = s.len.load(Ordering::Relaxed);
    let grain = s.grain.load(Ordering::Relaxed);
    loop {
        let start = s.next.fetch_add(grain, Ordering::Relaxed);
        if start >= len {
            break;
        }
        f(thread, start..(start + grain).min(len));
    }
}

fn worker(s: &Shared, thread: usize) {
    let mut seen = 0u64;
    loop {
        let spin_until = Instant::now() + SPIN;
        let mut generation = s.generation.load(Ordering::Acquire);
        let mut spins = 0u32;
        while generation == seen && !s.shutdown.load(Ordering::Relaxed) {
            std::hint::spin_loop();
            generation = s.generation.load(Ordering::Acquire);
            spins = spins.wrapping_add(1);
            // Reading the clock costs more than a spin: look at it now and then.
            if spins.is_multiple_of(256) && Instant::now() >= spin_until {
                break;
            }
        }
        if generation == seen {
            let mut guard = s.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                generation = s.generation.load(Ordering::Acquire);
                if generation != seen || s.shutdown.load(Ordering::Relaxed) {
                    break;
                }
                guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
        }
        if s.shutdown.load(Ordering::Relaxed) {
            return;
        }
        // Join, then look again: the loop may have been closed, or replaced by a newer one,
        // between seeing the generation and joining. Only an open loop's job may be read.
        s.active.fetch_add(1, Ordering::SeqCst);
        let current = s.generation.load(Ordering::SeqCst);
        if s.closed.load(Ordering::SeqCst) != current {
            // SAFETY: the loop `current` is open and this worker is counted in `active`, so the
            // caller keeps the closure alive and `job` set until this worker leaves below.
            let job = unsafe { *s.job.get() };
            if let Some(job) = job
                && catch_unwind(AssertUnwindSafe(|| run_ranges(s, thread, job))).is_err()
            {
                s.panicked.store(true, Ordering::Relaxed);
            }
        }
        s.active.fetch_sub(1, Ordering::SeqCst);
        seen = current;
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        {
            let _guard = self
                .shared
                .sleep_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.shared.shutdown.store(true, Ordering::Relaxed);
        }
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A raw pointer to an output buffer that several threads write in disjoint parts.
#[derive(Clone, Copy)]
pub(crate) struct DisjointMut<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: used only to hand disjoint index ranges of one exclusively borrowed slice to the pool's
// threads; see `slice`.
unsafe impl<T: Send> Send for DisjointMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for DisjointMut<T> {}

impl<T> DisjointMut<T> {
    pub(crate) fn new(slice: &mut [T]) -> Self {
        Self {
            ptr: slice.as_mut_ptr(),
            len: slice.len(),
        }
    }

    /// The elements `range` of the buffer.
    ///
    /// # Safety
    /// No two live references returned by this method may overlap, and none may outlive the
    /// exclusive borrow passed to `new`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, range: Range<usize>) -> &mut [T] {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "range {range:?} outside {}",
            self.len
        );
        // SAFETY: in bounds (checked above); disjointness and lifetime are the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_exactly_once() {
        let pool = ThreadPool::new(3).unwrap();
        for len in [0, 1, 5, 64, 1000] {
            let hits: Vec<AtomicUsize> = (0..len).map(|_| AtomicUsize::new(0)).collect();
            pool.for_each(len, 7, &|_, r| {
                for i in r {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "len {len}"
            );
        }
    }

    #[test]
    fn each_range_names_a_thread_below_the_thread_count() {
        let pool = ThreadPool::new(4).unwrap();
        let seen: Vec<AtomicUsize> = (0..pool.threads()).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..200 {
            pool.for_each(64, 1, &|thread, r| {
                seen[thread].fetch_add(r.len(), Ordering::Relaxed);
            });
        }
        let total: usize = seen.iter().map(|s| s.load(Ordering::Relaxed)).sum();
        assert_eq!(total, 200 * 64);
    }

    #[test]
    fn runs_many_loops_back_to_back_and_after_sleeping() {
        let pool = ThreadPool::new(2).unwrap();
        let total = AtomicUsize::new(0);
        for round in 0..2000 {
            if round == 1000 {
                std::thread::sleep(SPIN * 3);
            }
            pool.for_each(16, 1, &|_, r| {
                total.fetch_add(r.len(), Ordering::Relaxed);
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 2000 * 16);
    }

    #[test]
    fn late_workers_skip_closed_loops_when_threads_outnumber_cores() {
        let pool = ThreadPool::new(8).unwrap();
        let total = AtomicUsize::new(0);
        for _ in 0..5000 {
            pool.for_each(3, 1, &|_, r| {
                total.fetch_add(r.len(), Ordering::Relaxed);
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 5000 * 3);
    }

    #[test]
    fn a_panicking_job_is_reported_to_the_caller() {
        let pool = ThreadPool::new(2).unwrap();
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.for_each(100, 1, &|_, r| assert!(r.start != 77, "boom"));
        }));
        assert!(result.is_err());
        let count = AtomicUsize::new(0);
        pool.for_each(10, 1, &|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 10);
    }
}
