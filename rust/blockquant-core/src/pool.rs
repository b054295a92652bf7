//! The bounded thread pool every kernel runs in.
//!
//! Sized by `set_num_threads`, else `BLOCKQUANT_NUM_THREADS`, else the machine's parallelism.
//! Fork safety: a pool built before `fork()` has no threads in the child, so the pool remembers
//! the process id that built it and a child builds its own (the parent's is leaked, never
//! joined). The lock around the pool is held across `fork()` by a `pthread_atfork` handler, so a
//! child never inherits it locked by a thread that does not exist there.
//!
//! Waking: a rayon worker with nothing to do sleeps after a few microseconds, and waking a
//! sleeping worker on another core can take milliseconds: 3-4 ms on the 2-core VMs this is
//! built on once the other core has idled for a few milliseconds, against 10-100 µs for a
//! polling worker (`probe::wake_latency`). A call of a few milliseconds then runs on one core
//! until the other wakes, if it wakes in time: the bimodal two-thread times of issue 13. With
//! `BLOCKQUANT_SPIN_MS=N` ([`spin_time`]; 0, the default, is off) the workers of a pool of two
//! or more keep polling for work for N ms after each call that took at least [`LINGER_AFTER`],
//! and after the pool is built, as OpenMP runtimes do: the next call of a loop finds them
//! awake. They stop at once when a call starts or the pool is replaced, take any pending work
//! meanwhile, and yield their core to any other runnable thread. Off by default: in a loop
//! that also does its own work between calls, the calls got faster (16 MiB int8_block32, two
//! threads: median 2.0-2.15 ms -> 1.26-2.0 ms) but the loop as a whole did not, on this VM.
//!
//! Placing: each worker of a pool that has exactly as many workers as the CPUs the process may
//! run on (two or more) is pinned to one of them, the i-th worker to the i-th CPU
//! ([`pin_plan`]; `BLOCKQUANT_PIN_THREADS=0` turns it off). Unpinned, a worker woken by another
//! was often queued on its waker's busy core while the other core stayed idle, and the two
//! took turns on one core for the whole call: on the 2-core VM about half the two-thread calls
//! of the benchmark ran at 1.0 CPU/wall (21 of 45 samples; 0 of 45 pinned), and the two-thread
//! speed-up of int8_block32 went from 1.29 to 1.74, of NVFP4 from 1.09 to 1.88. A pool of another
//! size (a bound below the CPU count, a CPU quota) is not pinned: which CPUs to take would be
//! a guess, and pools of many processes would pile onto the first ones. The calling thread is
//! never pinned.
//!
//! Small calls skip the hand-over: handing a call to a sleeping worker and being woken when it
//! is done costs two wake-ups, 50-250 µs a call on these VMs (a quantize of 32 values took
//! 127 µs on one thread), more than the work of any call below a few hundred thousand values
//! (a few million with a pool of one thread). Such a call runs on the calling thread itself,
//! made once (on its first such call) a rayon pool of one thread of its own
//! ([`install_sized`]), so that the parallel loops inside run there, one after another, and
//! never reach rayon's global pool. Larger calls from such a thread are handed over with the
//! thread blocked at once ([`hand_over_and_block`]).
//!
//! The floating-point environment: every kernel's arithmetic is format.md's, IEEE round to nearest
//! with subnormals kept, which on x86-64 is what MXCSR says. A caller may have changed it (a
//! library loaded with flush-to-zero, `fesetround`), so the workers set the default when they
//! start, and a call run on the calling thread sets it for its length and puts the caller's
//! back after ([`FpEnv`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Once, OnceLock};
use std::time::{Duration, Instant};

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
/// Bumped when a call starts and when the pool is replaced: polling workers stop.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Calls shorter than this leave the workers to sleep: they did not need the second core.
pub const LINGER_AFTER: Duration = Duration::from_micros(100);
/// The default of [`spin_time`].
pub const DEFAULT_SPIN_MS: u64 = 0;
/// The most `BLOCKQUANT_SPIN_MS` may ask for.
pub const MAX_SPIN_MS: u64 = 1000;

/// How long the workers poll for work after a call: `BLOCKQUANT_SPIN_MS` (0 to 1000; 0 turns
/// polling off), read once; otherwise, or for a value that is not such a number,
/// [`DEFAULT_SPIN_MS`] (off).
pub fn spin_time() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| {
        let ms = std::env::var("BLOCKQUANT_SPIN_MS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&ms| ms <= MAX_SPIN_MS)
            .unwrap_or(DEFAULT_SPIN_MS);
        Duration::from_millis(ms)
    })
}

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
    // The old pool's polling workers stop, and it can wind down.
    GENERATION.fetch_add(1, Ordering::SeqCst);
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
    let threads = default_threads();
    let pins = pin_plan(threads, allowed_cpus(), pinning());
    let pool = Arc::new(
        ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("blockquant-{i}"))
            .start_handler(move |i| {
                // A worker inherits the MXCSR of the thread that built the pool.
                FpEnv::set_default();
                if let Some(&cpu) = pins.as_ref().and_then(|p| p.get(i)) {
                    // Refused: the worker runs unpinned.
                    let _ = pin_this_thread(cpu);
                }
            })
            .build()
            .expect("building the thread pool"),
    );
    *state = Some(PoolState {
        pool: pool.clone(),
        pid,
    });
    drop(state);
    if polls(&pool) {
        // Every worker started (each runs this once), then polling: the first call finds
        // them awake.
        pool.broadcast(|_| ());
        linger(&pool);
    }
    pool
}

/// Whether pools pin their workers ([`pin_plan`]): `BLOCKQUANT_PIN_THREADS`, `0` off, `1` (or
/// unset, or any other value) on. Read at each pool's build, like the thread count.
pub fn pinning() -> bool {
    std::env::var("BLOCKQUANT_PIN_THREADS").map_or(true, |v| v.trim() != "0")
}

/// The CPU each worker of a pool of `threads` is pinned to, worker i to `allowed[i]`: when
/// `on`, `threads` is two or more, and the process may run on exactly that many CPUs
/// (`allowed`, in order); otherwise none is pinned.
pub fn pin_plan(threads: usize, allowed: Vec<usize>, on: bool) -> Option<Vec<usize>> {
    (on && threads >= 2 && allowed.len() == threads).then_some(allowed)
}

/// The CPUs the calling thread may run on, in order (empty where that cannot be known: then no
/// pool is pinned).
pub fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sched_getaffinity fills the zeroed set it is given, of the size it is told.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
            // More CPUs than a cpu_set_t holds, say.
            return Vec::new();
        }
        // SAFETY: CPU_ISSET reads the set within its size.
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect()
    }
    #[cfg(not(target_os = "linux"))]
    Vec::new()
}

/// Keep the calling thread (a worker, at its start) on `cpu`; returns whether the system took
/// the request. A refusal (a sandbox that forbids it) leaves the thread where it was.
pub fn pin_this_thread(cpu: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        if cpu >= libc::CPU_SETSIZE as usize {
            return false;
        }
        // SAFETY: CPU_SET writes within the zeroed set, and sched_setaffinity reads it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        unsafe {
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpu;
        false
    }
}

/// Whether `pool`'s workers poll for work after a call: two or more of them, and a
/// [`spin_time`].
fn polls(pool: &ThreadPool) -> bool {
    pool.current_num_threads() > 1 && !spin_time().is_zero()
}

/// Each worker of `pool` (one that [`polls`]) polls for work for [`spin_time`], until a call
/// starts or the pool is replaced: rayon's `yield_now` runs any pending job of the pool (a
/// concurrent call's work too), and between polls the core goes to any other runnable thread.
fn linger(pool: &ThreadPool) {
    let gen = GENERATION.load(Ordering::SeqCst);
    let end = Instant::now() + spin_time();
    // One job on each worker (a plain spawn could let one worker take two, nested, while
    // another sleeps).
    pool.spawn_broadcast(move |_| {
        while GENERATION.load(Ordering::Relaxed) == gen && Instant::now() < end {
            if rayon::yield_now() != Some(rayon::Yield::Executed) {
                std::thread::yield_now();
            }
        }
    });
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

/// Run `f` inside the pool (a call of unknown size: [`install_sized`]).
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    install_sized(usize::MAX, f)
}

/// Calls that touch fewer elements than this run on the calling thread: handing a call to the
/// workers costs their wake-ups, more than a second core saves on a call this small. Measured
/// on the 2-core VM (median µs of int8_block32 quantize into `out=`, two threads handed over
/// against one inline): 128 Ki values 203 against 62, 256 Ki 174 against 99, 512 Ki 144
/// against 170. On a machine that wakes its threads faster the crossover is lower.
pub const INLINE_BELOW: usize = 1 << 18;

/// With a pool of one thread, calls below this many elements run on the calling thread too (a
/// hand-over to the one worker costs 100-250 µs on the 2-core VM). Larger ones are handed over:
/// run on the calling thread, a 16 Mi-value call left the next two-thread call (of a loop that
/// alternated one and two threads) on one core about half the time.
pub const INLINE_ONE_THREAD_BELOW: usize = 1 << 22;

/// The most threads made pools of their own: each stays one for the life of the process (rayon
/// cannot undo it: a few KiB each), so a program that calls from ever-new threads stops making
/// them here, and its later threads hand their calls over as before.
pub const MAX_OWN_POOLS: usize = 64;
static OWN_POOLS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread as a pool of one thread, once made.
    static OWN: Cell<Option<&'static ThreadPool>> = const { Cell::new(None) };
    /// Whether making it was tried (it is tried once a thread).
    static OWN_TRIED: Cell<bool> = const { Cell::new(false) };
    /// Whether this thread is running a call on its own pool now: a call nested inside stays.
    static INLINE: Cell<bool> = const { Cell::new(false) };
}

/// This thread's pool of one thread: made on first use, unless it is already a rayon worker
/// (of the shared pool, say, in a nested call) or [`MAX_OWN_POOLS`] threads have one.
fn own_pool() -> Option<&'static ThreadPool> {
    if let Some(p) = OWN.get() {
        return Some(p);
    }
    if OWN_TRIED.replace(true)
        || rayon::current_thread_index().is_some()
        || OWN_POOLS.fetch_add(1, Ordering::Relaxed) >= MAX_OWN_POOLS
    {
        return None;
    }
    // No thread is started: the calling thread becomes the pool's only worker, and it keeps
    // no state that a fork could leave broken (a child's copy of this thread is still it).
    let pool = ThreadPoolBuilder::new()
        .num_threads(1)
        .use_current_thread()
        .build()
        .ok()?;
    let pool: &'static ThreadPool = Box::leak(Box::new(pool));
    OWN.set(Some(pool));
    Some(pool)
}

/// Run `f`, which touches about `work` elements, inside the pool; on the calling thread when
/// that is cheaper than handing it over: a call below [`INLINE_BELOW`] elements (below
/// [`INLINE_ONE_THREAD_BELOW`] when the pool has one thread), and any call nested in one.
///
/// The calling thread then becomes a rayon worker of a one-thread pool of its own, for good: a
/// parallel iterator it runs later outside blockquant stays on it too (in the same build of
/// rayon: another extension module links its own).
pub fn install_sized<R: Send>(work: usize, f: impl FnOnce() -> R + Send) -> R {
    if INLINE.get() {
        return f();
    }
    // A small call neither builds the shared pool nor wakes it: a process that makes only
    // small calls starts no thread.
    if work < INLINE_BELOW {
        if let Some(own) = own_pool() {
            return run_inline(own, f);
        }
    }
    let pool = current();
    if pool.current_num_threads() == 1 && work < INLINE_ONE_THREAD_BELOW {
        if let Some(own) = own_pool() {
            return run_inline(own, f);
        }
    }
    // Polling workers stop polling and take this call's work.
    GENERATION.fetch_add(1, Ordering::SeqCst);
    let start = Instant::now();
    let r = if OWN.get().is_some() {
        hand_over_and_block(&pool, f)
    } else {
        pool.install(f)
    };
    if polls(&pool) && start.elapsed() >= LINGER_AFTER {
        linger(&pool);
    }
    r
}

/// `f` on `pool`'s workers, from a thread that is a worker of its own pool, this thread blocked
/// until it is done. Not `pool.install(f)`: from a rayon worker that is rayon's crossing from
/// one pool into another, where the caller spins and yields for a while before it sleeps, and
/// on the 2-core VM that kept the pool's second worker off the cores for the length of a
/// few-millisecond call about half the time (two-thread int8_block32: 5.5 ms at 1.0 CPU/wall,
/// against 3.0 ms at 1.9 from a thread that blocks at once, as rayon's own callers from outside
/// a pool do).
fn hand_over_and_block<R: Send>(pool: &ThreadPool, f: impl FnOnce() -> R + Send) -> R {
    type Slot<R> = (Mutex<Option<std::thread::Result<R>>>, parking_lot::Condvar);
    let done: Arc<Slot<R>> = Arc::new((Mutex::new(None), parking_lot::Condvar::new()));
    let signal = done.clone();
    let job: Box<dyn FnOnce() + Send + '_> = Box::new(move || {
        // A panic is carried back to the caller (an escaped one would abort in a spawned job).
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let (slot, cv) = &*signal;
        *slot.lock() = Some(r);
        cv.notify_one();
    });
    // SAFETY: `spawn` wants a 'static job; this one borrows what `f` borrows, which lives until
    // this function returns, and it does not return (nor unwind: nothing below panics) before
    // the job has stored its result, after `f` and everything it borrowed are done with. The
    // shared slot is reference-counted, so the job's last touch of it is safe however late.
    let job: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(job) };
    pool.spawn(job);
    let (slot, cv) = &*done;
    let mut result = slot.lock();
    while result.is_none() {
        cv.wait(&mut result);
    }
    match result.take() {
        Some(Ok(r)) => r,
        Some(Err(panic)) => std::panic::resume_unwind(panic),
        None => unreachable!("the loop above waits for a result"),
    }
}

/// `f` on this thread, in its own pool, with nested calls kept there (also when `f` panics).
fn run_inline<R: Send>(own: &ThreadPool, f: impl FnOnce() -> R + Send) -> R {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            INLINE.set(false);
        }
    }
    INLINE.set(true);
    let _leave = Leave;
    let _env = FpEnv::enter();
    // Inline: this thread is the pool's worker.
    own.install(f)
}

/// The caller's MXCSR while a call runs on its thread with the default one: put back (status
/// flags too) when dropped, also on a panic. Not x86-64: nothing to do (other targets have no
/// such mode in the kernels' reach here).
struct FpEnv(#[cfg(target_arch = "x86_64")] Option<u32>);

impl FpEnv {
    /// Round to nearest, no flush-to-zero or denormals-are-zero, every exception masked.
    #[cfg(target_arch = "x86_64")]
    const DEFAULT: u32 = 0x1F80;
    /// The status flags (bits 0-5), kept as they are.
    #[cfg(target_arch = "x86_64")]
    const FLAGS: u32 = 0x3F;

    /// The default environment on this thread, the caller's kept to put back.
    fn enter() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let old = mxcsr();
            if old & !Self::FLAGS == Self::DEFAULT {
                return Self(None);
            }
            set_mxcsr(Self::DEFAULT | (old & Self::FLAGS));
            Self(Some(old))
        }
        #[cfg(not(target_arch = "x86_64"))]
        Self()
    }

    /// The default environment on this thread for good (a worker's, at its start).
    fn set_default() {
        #[cfg(target_arch = "x86_64")]
        set_mxcsr(Self::DEFAULT | (mxcsr() & Self::FLAGS));
    }
}

impl Drop for FpEnv {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        if let Some(old) = self.0 {
            set_mxcsr(old);
        }
    }
}

/// This thread's MXCSR. (Inline assembly: `_mm_getcsr` is deprecated.)
#[cfg(target_arch = "x86_64")]
fn mxcsr() -> u32 {
    let mut v: u32 = 0;
    // SAFETY: stmxcsr stores 4 bytes at the address of `v`, which is valid and writable.
    unsafe {
        std::arch::asm!("stmxcsr [{}]", in(reg) &mut v, options(nostack, preserves_flags));
    }
    v
}

/// Set this thread's MXCSR to `v`, which must have no reserved bit set (16-31): one read by
/// [`mxcsr`], or the default with such a one's status flags.
#[cfg(target_arch = "x86_64")]
fn set_mxcsr(v: u32) {
    debug_assert_eq!(v >> 16, 0, "reserved MXCSR bits");
    // SAFETY: ldmxcsr reads 4 bytes at the address of `v`; with the reserved bits clear it
    // cannot fault. Changing the rounding mode is this function's purpose.
    unsafe {
        std::arch::asm!("ldmxcsr [{}]", in(reg) &v, options(nostack, preserves_flags));
    }
}

/// Test hook: panic on a worker thread of the pool (the binding proves this surfaces as an
/// ordinary Python exception, not a crash).
#[doc(hidden)]
pub fn panic_in_worker() {
    install(|| {
        rayon::join(|| (), || panic!("deliberate panic from the test hook"));
    });
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod probe;
