//! Run-time CPU feature checks for the kernels' AVX2 builds.
//!
//! The hot loops are written once, portably, and compiled a second time with AVX2 enabled; the
//! wheel itself targets baseline x86-64, so the choice is made per call (the check is one cached
//! atomic load).

/// Whether this CPU runs AVX2 code.
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2")
}
