//! The limit on threads made pools of their own (`pool::MAX_OWN_POOLS`): a test binary of its
//! own, since it uses up the process's slots.

use std::thread;

use blockquant_core::pool::{self, MAX_OWN_POOLS};
use rayon::prelude::*;

#[test]
fn threads_past_the_limit_hand_their_calls_over_and_get_the_same_results() {
    // Each of these threads makes one small call; past MAX_OWN_POOLS of them in the process
    // , calls are handed to the shared pool instead.
    let sum = |v: &Vec<u64>| v.par_iter().sum::<u64>();
    let data: Vec<u64> = (0..10_000).collect();
    let want: u64 = data.iter().sum();
    let mut on_caller = 0;
    for _ in 0..MAX_OWN_POOLS + 8 {
        let data = data.clone();
        let (same_thread, got) = thread::spawn(move || {
            let me = thread::current().id();
            pool::install_sized(data.len(), || (thread::current().id() == me, sum(&data)))
        })
        .join()
        .unwrap();
        assert_eq!(got, want);
        on_caller += usize::from(same_thread);
    }
    assert!(
        on_caller <= MAX_OWN_POOLS,
        "{on_caller} threads were made pools of their own"
    );
    assert!(
        on_caller >= MAX_OWN_POOLS - 8,
        "only {on_caller} threads ran their call inline"
    );
    // And past the limit a small call really is handed over (to the pool's worker, whatever
    // its size).
    let handed = thread::spawn(|| {
        let me = thread::current().id();
        pool::install_sized(1, || thread::current().id()) != me
    })
    .join()
    .unwrap();
    assert!(handed);
}
