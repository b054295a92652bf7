//! Run-time CPU feature dispatch for the kernels' AVX2 builds.
//!
//! The hot loops are written once, portably (`#[inline(always)]`), and compiled a second time
//! with AVX2 enabled; the wheel itself targets baseline x86-64, so the choice is made per call
//! (the check is one cached atomic load). Widening the vectors never changes a result: there is
//! no fast-math, so no reordering or fused multiply-add.

/// Whether this CPU runs AVX2 code.
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2")
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
