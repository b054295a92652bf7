//! Where the pool's workers may run (`pool::pin_plan`): one CPU each when the pool has as many
//! workers as the process has CPUs, anywhere it may otherwise. A test binary of its own: it
//! sizes the shared pool.

use blockquant_core::pool::{self, allowed_cpus, pin_plan, pin_this_thread, pinning};

/// The CPUs each worker of the current pool may run on, by worker index.
fn worker_cpus() -> Vec<Vec<usize>> {
    let mut seen = pool::install(|| rayon::broadcast(|ctx| (ctx.index(), allowed_cpus())));
    seen.sort();
    seen.into_iter().map(|(_, cpus)| cpus).collect()
}

#[test]
fn the_plan() {
    let four = || vec![0, 1, 2, 3];
    assert_eq!(pin_plan(4, four(), true), Some(four()));
    assert_eq!(pin_plan(4, four(), false), None, "turned off");
    assert_eq!(pin_plan(2, four(), true), None, "fewer workers than CPUs");
    assert_eq!(pin_plan(5, four(), true), None, "more workers than CPUs");
    assert_eq!(pin_plan(1, vec![3], true), None, "one worker");
    assert_eq!(pin_plan(2, vec![], true), None, "CPUs unknown");
    // The allowed CPUs in order, whichever they are.
    assert_eq!(pin_plan(2, vec![5, 9], true), Some(vec![5, 9]));
}

/// Whether this system lets a thread keep itself to `cpu` (a sandbox may refuse, or accept and
/// ignore it): tried on a thread of its own.
#[cfg(target_os = "linux")]
fn can_pin(cpu: usize) -> bool {
    std::thread::spawn(move || pin_this_thread(cpu) && allowed_cpus() == [cpu])
        .join()
        .unwrap()
}

#[test]
#[cfg(target_os = "linux")]
fn workers_are_pinned_one_to_a_cpu_when_they_match_the_cpus() {
    let allowed = allowed_cpus();
    assert!(!allowed.is_empty());
    if !pinning() {
        return;
    }
    let n = allowed.len();
    if n >= 2 && can_pin(allowed[n - 1]) {
        pool::set_num_threads(n);
        let cpus = worker_cpus();
        assert_eq!(cpus.len(), n);
        let each: Vec<usize> = cpus
            .iter()
            .map(|c| {
                assert_eq!(c.len(), 1, "a worker on {c:?}");
                c[0]
            })
            .collect();
        assert_eq!(each, allowed, "worker i on the i-th CPU");
    }
    // Not pinned: one more worker than CPUs, and (with two or more CPUs) one fewer.
    for threads in [n + 1, n - 1] {
        if threads == 0 {
            continue;
        }
        pool::set_num_threads(threads);
        for c in worker_cpus() {
            assert_eq!(c, allowed, "{threads} workers");
        }
    }
    // The calling thread is never pinned.
    assert_eq!(allowed_cpus(), allowed);
    pool::set_num_threads(0);
}
