//! The bounded thread pool every kernel runs in.
//!
//! Sized by `set_num_threads`, else `BLOCKQUANT_NUM_THREADS`, else the machine's parallelism.
//! Fork safety: a pool built before `fork()` has no threads in the child, so the pool remembers
//! the process id that built it and a child builds its own (the parent's is leaked, never
//! joined). The lock around the pool is held across `fork()` by a `pthread_atfork` handler, so a
//! child never inherits it locked by a thread that does not exist there.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};

use parking_lot::Mutex;
use rayon::{ThreadPool, ThreadPoolBuilder};

struct PoolState {
    pool: Arc<ThreadPool>,
    pid: u32,
}

static POOL: Mutex<Option<PoolState>> = Mutex::new(None);
/// Threads asked for by `set_num_threads` (0: none asked).
static REQUESTED: AtomicUsize = AtomicUsize::new(0);
static ATFORK: Once = Once::new();

/// The most threads the pool is ever given: far past any core count, short of what would make
/// building the pool itself take minutes.
pub const MAX_THREADS: usize = 1024;

/// Threads the pool will use.
pub fn default_threads() -> usize {
    match REQUESTED.load(Ordering::Relaxed) {
        0 => std::env::var("BLOCKQUANT_NUM_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0 && n <= MAX_THREADS)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        n => n,
    }
}

/// Bound the pool to `n` threads (0: back to the default).
pub fn set_num_threads(n: usize) {
    REQUESTED.store(n, Ordering::Relaxed);
    // Dropping a pool only signals its threads; they finish their work and exit. Calls running
    // in it keep it alive through their own `Arc`.
    drop(POOL.lock().take());
}

/// The number of threads kernels run on.
pub fn num_threads() -> usize {
    current().current_num_threads()
}

fn current() -> Arc<ThreadPool> {
    register_atfork();
    let pid = std::process::id();
    let mut state = POOL.lock();
    if let Some(s) = state.as_ref().filter(|s| s.pid == pid) {
        return s.pool.clone();
    }
    if let Some(stale) = state.take() {
        // Forked child: the parent's worker threads do not exist here, and dropping the pool
        // would wait on them.
        std::mem::forget(stale);
    }
    let pool = Arc::new(
        ThreadPoolBuilder::new()
            .num_threads(default_threads())
            .thread_name(|i| format!("blockquant-{i}"))
            .build()
            .expect("building the thread pool"),
    );
    *state = Some(PoolState {
        pool: pool.clone(),
        pid,
    });
    pool
}

#[cfg(unix)]
fn register_atfork() {
    extern "C" fn prepare() {
        // Take the lock and keep it over the fork; both sides release it below.
        std::mem::forget(POOL.lock());
    }
    extern "C" fn release() {
        // SAFETY: `prepare` locked POOL in this thread just before fork() and leaked the guard;
        // parent and child each own that locked state and release it exactly once.
        unsafe { POOL.force_unlock() };
    }
    ATFORK.call_once(|| {
        // SAFETY: the handlers are plain functions that only lock/unlock a static mutex.
        unsafe {
            libc::pthread_atfork(Some(prepare), Some(release), Some(release));
        }
    });
}

#[cfg(not(unix))]
fn register_atfork() {
    ATFORK.call_once(|| {});
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
