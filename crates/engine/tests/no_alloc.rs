//! Steady-state decoding allocates nothing: feeding a token and sampling the next reuse buffers
//! sized on the first steps. Counted with a global allocator wrapper, so every thread's
//! allocations count, the CPU backend's workers included. The backend runs more threads than
//! SmolLM2 has KV heads, so a thread may first get attention work after the warm-up: its
//! working space must already exist by then.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use lucebox_engine::{Sampler, SamplingParams, Session, SessionConfig};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Well above SmolLM2's 3 KV heads, the attention work items of one decode step.
const THREADS: usize = 12;

#[test]
#[ignore = "needs fetched models; run by tests/run-all"]
fn decode_steps_do_not_allocate() {
    let (_, model) = common::load_on_threads("smollm2-135m-instruct-q4_1", Some(THREADS));
    let mut session = Session::new(
        model,
        SessionConfig {
            context: 256,
            ..SessionConfig::default()
        },
    )
    .unwrap();
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.05,
        repetition_penalty: 1.1,
        presence_penalty: 0.1,
        frequency_penalty: 0.1,
        seed: Some(3),
        ..SamplingParams::default()
    };
    let mut sampler = Sampler::new(params);
    session.feed(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    let mut token = session.sample(&mut sampler).unwrap();
    // Warm-up: the first decode steps size the scratch buffers of every thread.
    for _ in 0..8 {
        session.feed(&[token]).unwrap();
        token = session.sample(&mut sampler).unwrap();
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..32 {
        session.feed(&[token]).unwrap();
        token = session.sample(&mut sampler).unwrap();
    }
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(
        allocations, 0,
        "32 decode steps allocated {allocations} times"
    );
}
