//! Run-time CPU feature dispatch for the kernels' AVX2 builds.
//!
//! The hot loops are written once, portably (`#[inline(always)]`), and compiled a second time
//! with AVX2 enabled; the wheel itself targets baseline x86-64, so the choice is made per call
//! (the check is one cached atomic load). Widening the vectors never changes a result: there is
//! no fast-math, so no reordering or fused multiply-add.
//!
//! The bottom of the kernel wing: the feature checks and [`avx2_dispatch!`] here, the AVX2
//! primitives in `x86`, the runs built on them in `x86_runs`; they import only `codec`.

/// Whether this CPU runs AVX2 code.
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2")
}

/// Whether this CPU converts float16 in hardware (F16C; every AVX2 CPU so far has it).
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn has_f16c() -> bool {
    std::is_x86_feature_detected!("f16c")
}

/// Whether this CPU runs the AVX-512 kernels (AVX-512 F and BW: 512-bit float, dword and byte
/// work; every such CPU has AVX2 and F16C too).
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn has_avx512() -> bool {
    std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
}

/// Whether this CPU runs the AVX-512 kernels that look bytes up in 64-entry tables (VBMI's
/// `vpermb`, besides F and BW: Ice Lake, Zen 4 and later).
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn has_avx512_vbmi() -> bool {
    has_avx512() && std::is_x86_feature_detected!("avx512vbmi")
}

/// `fn NAME[GENERICS](ARGS) -> RET => PORTABLE;` defines `NAME`, which calls `PORTABLE` compiled
/// with AVX2 when the CPU has it, and as it is otherwise.
macro_rules! avx2_dispatch {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident [$($gen:tt)*] ($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? => $portable:ident;
    ) => {
        $(#[$meta])*
        #[inline]
        $vis fn $name<$($gen)*>($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                unsafe fn avx2<$($gen)*>($($arg: $ty),*) $(-> $ret)? {
                    $portable($($arg),*)
                }
                if $crate::simd::has_avx2() {
                    // SAFETY: the CPU supports AVX2, checked at run time just above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $portable($($arg),*)
        }
    };
}

pub(crate) use avx2_dispatch;

/// The reciprocal of a scale when multiplying by it gives the bits of dividing by it: `e` a
/// power of two 2^k with k in -126..=127. Then 2^-k is an f32 (2^-127 a subnormal one), and x / e
/// and x · 2^-k are both the correctly rounded value of the same real number, so they are equal
/// for every x. UE8M0 scales are all such powers but 2^-127; other scales often are.
#[inline(always)]
pub(crate) fn exact_reciprocal(e: f32) -> Option<f32> {
    let b = e.to_bits();
    let exp = (b >> 23) & 0xFF;
    (b & 0x807F_FFFF == 0 && (1..=254).contains(&exp)).then(|| 1.0 / e)
}

/// The reciprocal of a scale for the checked multiply of integer codes
/// ([`x86::int_codes8_recip`]): `e` positive, normal and below 2^125, so that 1 / e is a normal
/// f32 (within 2^-24 of its value, relatively) and no product by it loses more than that.
#[inline(always)]
pub(crate) fn checked_reciprocal(e: f32) -> Option<f32> {
    (0x0080_0000..0x7E00_0000)
        .contains(&e.to_bits())
        .then(|| 1.0 / e)
}

/// max |x| of a slice (NaNs passed over): the AVX2 kernel when the CPU has it.
pub(crate) fn max_abs(xs: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2(xs: &[f32]) -> f32 {
            crate::simd::x86::max_abs_prefetching(xs)
        }
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { avx2(xs) };
    }
    max_abs_portable(xs)
}

/// Written so it compiles to packed max instructions: 8 independent lanes.
#[inline(always)]
pub(crate) fn max_abs_portable(xs: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            let a = c[i].abs();
            lanes[i] = if a > lanes[i] { a } else { lanes[i] };
        }
    }
    let mut m = 0.0f32;
    for &a in lanes.iter() {
        m = if a > m { a } else { m };
    }
    for v in chunks.remainder() {
        let a = v.abs();
        m = if a > m { a } else { m };
    }
    m
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_runs;

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
