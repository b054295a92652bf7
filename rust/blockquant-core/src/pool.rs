//! The bounded thread pool every kernel runs in.
//!
//! Sized by `set_num_threads`, else `BLOCKQUANT_NUM_THREADS`, else the machine's parallelism.
//! A pool built before `fork()` has no threads in the child: the pool remembers the process id
//! that built it and a child builds its own (the parent's is leaked, never joined).

use std::sync::{Arc, Mutex};

use rayon::{ThreadPool, ThreadPoolBuilder};

struct PoolState {
    pool: Arc<ThreadPool>,
    pid: u32,
    threads: usize,
}

static POOL: Mutex<Option<PoolState>> = Mutex::new(None);
static REQUESTED: Mutex<Option<usize>> = Mutex::new(None);

/// Threads the pool will use.
pub fn default_threads() -> usize {
    if let Some(n) = *REQUESTED.lock().unwrap_or_else(|e| e.into_inner()) {
        return n;
    }
    std::env::var("BLOCKQUANT_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Bound the pool to `n` threads (0: back to the default).
pub fn set_num_threads(n: usize) {
    *REQUESTED.lock().unwrap_or_else(|e| e.into_inner()) = (n > 0).then_some(n);
    let mut state = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(old) = state.take() {
        // Dropping a pool only signals its threads; they finish their work and exit.
        drop(old);
    }
}

/// The number of threads kernels run on.
pub fn num_threads() -> usize {
    current().current_num_threads()
}

fn current() -> Arc<ThreadPool> {
    let pid = std::process::id();
    let mut state = POOL.lock().unwrap_or_else(|e| e.into_inner());
    match state.as_ref() {
        Some(s) if s.pid == pid => s.pool.clone(),
        _ => {
            if let Some(stale) = state.take() {
                if stale.pid != pid {
                    // Forked child: the parent's worker threads do not exist here, and
                    // dropping the pool would wait on them.
                    std::mem::forget(stale);
                }
            }
            let threads = default_threads();
            let pool = Arc::new(
                ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("blockquant-{i}"))
                    .build()
                    .expect("building the thread pool"),
            );
            *state = Some(PoolState {
                pool: pool.clone(),
                pid,
                threads,
            });
            let _ = state.as_ref().map(|s| s.threads);
            pool
        }
    }
}

/// Run `f` inside the pool.
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    current().install(f)
}

/// Test hook: panic on a worker thread of the pool (the binding proves this surfaces as an
/// ordinary Python exception, not a crash).
#[doc(hidden)]
pub fn panic_in_worker() {
    install(|| {
        rayon::join(|| (), || panic!("deliberate panic from the test hook"));
    });
}
