//! Where `pool::install_sized` runs a call (`pool.rs`): small calls on the calling thread, as a
//! rayon pool of one thread of its own, with nested calls and parallel loops kept there; large
//! calls (past both sizes: the shared pool may have one thread) on the shared pool. A test
//! binary of its own: each thread that makes a small call uses up one of the process's
//! `MAX_OWN_POOLS` slots, which the crate's unit tests (a thread each) would exhaust;
//! `own_pool_limit.rs`, which exhausts them, is another.

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::{self, ThreadId};

use blockquant_core::pool::{self, INLINE_BELOW, INLINE_ONE_THREAD_BELOW};
use rayon::prelude::*;

/// `f` on a thread of its own, one that has made no call yet; its panic fails the test.
fn on_a_fresh_thread(f: impl FnOnce() + Send + 'static) {
    thread::spawn(f).join().unwrap();
}

/// The threads a parallel loop of `n` items ran on.
fn loop_threads(n: usize) -> HashSet<ThreadId> {
    (0..n)
        .into_par_iter()
        .with_max_len(1)
        .map(|_| thread::current().id())
        .collect()
}

#[test]
fn a_small_call_runs_on_the_calling_thread_with_its_loops_and_nested_calls() {
    on_a_fresh_thread(|| {
        let me = thread::current().id();
        let (here, index, loops, nested, nested_big) = pool::install_sized(1000, || {
            (
                thread::current().id(),
                rayon::current_thread_index(),
                loop_threads(64),
                pool::install_sized(10, || thread::current().id()),
                // Nested in a small call, even a call of unknown size stays.
                pool::install(|| loop_threads(64)),
            )
        });
        assert_eq!(here, me);
        assert_eq!(
            index,
            Some(0),
            "the thread is the only worker of its own pool"
        );
        assert_eq!(loops, HashSet::from([me]));
        assert_eq!(nested, me);
        assert_eq!(nested_big, HashSet::from([me]));
        // Again, on the pool made the first time.
        assert_eq!(
            pool::install_sized(INLINE_BELOW - 1, || thread::current().id()),
            me
        );
    });
}

#[test]
fn a_large_call_goes_to_the_shared_pool_from_a_thread_that_is_its_own() {
    on_a_fresh_thread(|| {
        let me = thread::current().id();
        // This thread first becomes its own pool (a small call), then hands a large call over
        // (pool.rs, hand_over_and_block), whatever the shared pool's size.
        assert_eq!(pool::install_sized(1, || thread::current().id()), me);
        let (here, loops) = pool::install_sized(INLINE_ONE_THREAD_BELOW, || {
            (thread::current().id(), loop_threads(256))
        });
        assert_ne!(here, me);
        assert!(!loops.contains(&me), "the loops stay on the pool's workers");
    });
}

#[test]
fn a_panic_in_a_small_or_a_handed_over_call_leaves_the_thread_as_it_was() {
    on_a_fresh_thread(|| {
        let me = thread::current().id();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool::install_sized(1, || {
                let _ = loop_threads(8);
                panic!("deliberate");
            })
        }));
        assert!(r.is_err());
        // Still its own pool for small calls, and a large call is still handed over (had the
        // panic left the thread marked as inside a call, it would run here).
        assert_eq!(pool::install_sized(1, || thread::current().id()), me);
        assert_ne!(pool::install(|| thread::current().id()), me);
        // A panic in a large call handed over from such a thread comes back as that panic,
        // and the thread goes on as before.
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool::install(|| {
                let _ = loop_threads(8);
                panic!("deliberate, on the pool");
            })
        }));
        let panic = r.expect_err("the pool's panic");
        assert_eq!(
            panic.downcast_ref::<&str>(),
            Some(&"deliberate, on the pool")
        );
        assert_eq!(pool::install_sized(1, || thread::current().id()), me);
        assert_ne!(pool::install(|| thread::current().id()), me);
    });
}
