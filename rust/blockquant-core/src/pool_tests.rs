use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long the second worker of a pool of two takes to start on a call's second task,
/// after the pool has been idle for 0 to 100 ms: without polling (the default) and with
/// (`BLOCKQUANT_SPIN_MS=20`, say). A measurement, not a check:
/// `cargo test --release -p blockquant-core -- --ignored --nocapture wake_latency`.
#[test]
#[ignore]
fn wake_latency() {
    super::set_num_threads(2);
    let base = Instant::now();
    let now = || base.elapsed().as_nanos() as u64;
    println!("spin time {:?}", super::spin_time());
    for idle_ms in [0u64, 1, 2, 5, 20, 100] {
        let mut us = Vec::new();
        for _ in 0..15 {
            std::thread::sleep(Duration::from_millis(idle_ms));
            let started = AtomicU64::new(0);
            let t0 = now();
            super::install(|| {
                rayon::join(
                    // Wait (up to 20 ms) for the other task to start on the other worker,
                    // so that this one cannot run it itself.
                    || {
                        while started.load(Ordering::Acquire) == 0 && now() - t0 < 20_000_000 {
                            std::hint::spin_loop();
                        }
                    },
                    || started.store(now(), Ordering::Release),
                );
                // Long enough for the pool to poll afterwards (LINGER_AFTER).
                std::thread::sleep(Duration::from_micros(200));
            });
            us.push(started.load(Ordering::Acquire).saturating_sub(t0) / 1000);
        }
        us.sort_unstable();
        println!("idle {idle_ms:>3} ms: second worker after {us:?} µs");
    }
}
