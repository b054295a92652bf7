//! Fallible allocation for every buffer whose size comes from the input (values, scales, rows,
//! bytes): a failure is [`QuantError::OutOfMemory`], which the binding raises as Python's
//! `MemoryError`, where `vec!`, `Vec::with_capacity` and `collect` would abort the process.
//! Each helper does the work of the infallible call it replaces (no extra pass); buffers of a
//! fixed small size (a scheme's dims, a kernel's per-piece scratch) need none of this.

use std::alloc::Layout as AllocLayout;

use rayon::prelude::*;

use crate::error::{QuantError, Result};

/// The error for `n` values of `T` that could not be had (or whose size overflows).
fn out_of_memory<T>(n: usize) -> QuantError {
    QuantError::OutOfMemory {
        bytes: n.saturating_mul(size_of::<T>()),
    }
}

/// An empty vector with room for exactly `n` values.
pub fn try_with_capacity<T>(n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| out_of_memory::<T>(n))?;
    Ok(v)
}

/// `vec![value; n]`, fallibly. For a zero of a plain number, [`try_zeroed`] is cheaper.
pub fn try_vec<T: Clone>(n: usize, value: T) -> Result<Vec<T>> {
    let mut v = try_with_capacity(n)?;
    v.resize(n, value);
    Ok(v)
}

/// A slice's copy, fallibly (`s.to_vec()`).
pub fn try_to_vec<T: Clone>(s: &[T]) -> Result<Vec<T>> {
    let mut v = try_with_capacity(s.len())?;
    v.extend_from_slice(s);
    Ok(v)
}

/// An exact-size iterator collected, fallibly: one allocation of its length, then the values.
pub fn try_collect<I: ExactSizeIterator>(iter: I) -> Result<Vec<I::Item>> {
    let mut v = try_with_capacity(iter.len())?;
    v.extend(iter);
    Ok(v)
}

/// An indexed parallel iterator collected, fallibly: rayon's `collect_into_vec` writes the
/// values in place into room reserved here (it reserves nothing more when there is enough).
pub fn try_par_collect<I>(iter: I) -> Result<Vec<I::Item>>
where
    I: IndexedParallelIterator,
{
    let mut v = try_with_capacity(iter.len())?;
    iter.collect_into_vec(&mut v);
    Ok(v)
}

/// Numbers whose all-zero bit pattern is their zero.
///
/// # Safety
/// Every bit pattern of zeros must be a valid value of the type.
pub unsafe trait Zeroed: Copy {}

// SAFETY: all zero bits are 0 (or +0.0) in each of these.
unsafe impl Zeroed for u8 {}
// SAFETY: as above.
unsafe impl Zeroed for u16 {}
// SAFETY: as above.
unsafe impl Zeroed for u32 {}
// SAFETY: as above.
unsafe impl Zeroed for u64 {}
// SAFETY: as above.
unsafe impl Zeroed for usize {}
// SAFETY: as above.
unsafe impl Zeroed for i32 {}
// SAFETY: as above.
unsafe impl Zeroed for f32 {}
// SAFETY: as above.
unsafe impl Zeroed for f64 {}

/// `vec![0; n]`, fallibly, and as `vec!` makes it: zeroed by the allocator (fresh pages come
/// zero from the kernel, never touched, so never faulted in until written).
pub fn try_zeroed<T: Zeroed>(n: usize) -> Result<Vec<T>> {
    if n == 0 || size_of::<T>() == 0 {
        return Ok(Vec::new());
    }
    let layout = AllocLayout::array::<T>(n).map_err(|_| out_of_memory::<T>(n))?;
    // SAFETY: the layout's size is non-zero (n > 0, T not zero-sized).
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if p.is_null() {
        return Err(out_of_memory::<T>(n));
    }
    // SAFETY: `p` comes from the global allocator with `Layout::array::<T>(n)`, which is the
    // layout a `Vec<T>` of capacity n frees with; its n values are zero bits, valid by `Zeroed`.
    Ok(unsafe { Vec::from_raw_parts(p, n, n) })
}

#[cfg(test)]
#[path = "alloc_tests.rs"]
mod tests;
