//! The vocabulary every ggml block type and kernel shares: the [`Block`] trait, the run types of
//! the hand-written kernels, the group and prefetch sizes, and the integer arithmetic of codes.
//! It imports nothing of the types or of the dispatch in [`super`] (`mod.rs`).

/// Values per task: small tensors stay on one thread.
pub(super) const TASK_VALUES: usize = 1 << 16;

/// One ggml block type: `BS` values ↔ `TS` bytes.
pub(super) trait Block: Copy + Default + Send + Sync {
    const BS: usize;
    const TS: usize;
    /// Quantize one block; true when it holds a NaN or infinity (`out` is then unspecified).
    fn encode(x: &[f32], out: &mut [u8]) -> bool;
    /// Quantize [`GROUP`] blocks. A type whose per-block scale arithmetic (divisions, scale
    /// conversion) is a long dependency chain does it for the group at once, in vector lanes.
    #[inline(always)]
    fn encode_group(x: &[f32], out: &mut [u8]) -> bool {
        let mut bad = false;
        // An opaque trip count: unrolled, the blocks get vectorized across one another (one
        // lane a block, every value gathered and scattered one at a time).
        for g in 0..std::hint::black_box(GROUP) {
            let o = &mut out[g * Self::TS..(g + 1) * Self::TS];
            bad |= Self::encode(&x[g * Self::BS..(g + 1) * Self::BS], o);
        }
        bad
    }
    /// Dequantize one block.
    fn decode(b: &[u8], out: &mut [f32]);
    /// [`Block::encode`] minimizing the error weighted by `w` (one importance ≥ 0 a value), for
    /// the types whose quantizer searches; the others (the float types, Q8_0, MXFP4, the
    /// ternary types) take no weights, as ggml's own quantizers take none for them.
    #[inline(always)]
    fn encode_weighted(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
        let _ = w;
        Self::encode(x, out)
    }
    /// A hand-written run for CPUs with AVX2 and F16C, where the compiled portable run falls
    /// short of the memory's pace; the same bytes.
    #[cfg(target_arch = "x86_64")]
    const ENCODE_AVX2: Option<EncodeRun> = None;
    /// The same for dequantizing.
    #[cfg(target_arch = "x86_64")]
    const DECODE_AVX2: Option<DecodeRun> = None;
    /// Whether a large output without [`Block::DECODE_AVX2`] goes through
    /// [`super::decode_run_streamed`]: for the types it made faster (16 Mi values into `out=`, 1
    /// thread, 3 interleaved A/B runs: MXFP4 8.6-9.3 -> 6.7-7.4 ms, TQ1_0 9.8-10.5 -> 4.9-5.7,
    /// TQ2_0 8.4-9.0 -> 4.6-5.5). F32 (a copy: the buffer is an extra pass) and Q6_K came out
    /// slower, the other k-quants (bound by their arithmetic) the same. (F16 and BF16 have
    /// runs of their own now.)
    const STREAMS: bool = false;
}

/// A run of whole blocks: values in, bytes out; true when a value is a NaN or infinity.
#[cfg(target_arch = "x86_64")]
pub(super) type EncodeRun = unsafe fn(&[f32], &mut [u8]) -> bool;
#[cfg(target_arch = "x86_64")]
/// A run of whole blocks: bytes in, values out, non-temporally when asked (a large output).
#[cfg(target_arch = "x86_64")]
pub(super) type DecodeRun = unsafe fn(&[u8], &mut [f32], bool);

/// Blocks a [`Block::encode_group`] call takes: eight f32 lanes of AVX2.
pub(super) const GROUP: usize = 8;

/// How far ahead of the group being quantized its input is fetched into cache, in values.
/// The quantizers read much more than they write, and on one thread the hardware prefetcher
/// alone leaves them waiting on memory.
pub(super) const PREFETCH_AHEAD: usize = 2048;

/// Ask for the cache lines of `len` f32 values from `p` (which may lie past the end of the
/// input: a prefetch never faults).
#[inline(always)]
pub(super) fn prefetch(p: *const f32, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for i in (0..len).step_by(16) {
        // SAFETY: _mm_prefetch only hints the cache (SSE, in every x86-64 CPU); it reads
        // nothing and never faults, whatever the address. The pointer is not dereferenced.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                p.wrapping_add(i) as *const i8
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

// ---------------------------------------------------------------------------------------------
// Arithmetic shared by the block types.

/// The bits of |x| at or above this are an infinity or NaN.
pub(super) const INF_BITS: u32 = 0x7F80_0000;

/// The largest |x| of a block, as bits: for non-negative floats the order of the bits is the
/// order of the values, and an integer max sees NaN too (at or above [`INF_BITS`]).
/// Eight lanes a step, spelled out: left to itself LLVM vectorizes a group of blocks across
/// blocks (one lane a block), gathering every value with scalar inserts.
#[inline(always)]
pub(super) fn abs_max_bits(x: &[f32]) -> u32 {
    let mut acc = [0u32; 8];
    for c in x.chunks_exact(8) {
        for (a, v) in acc.iter_mut().zip(c) {
            *a = (*a).max(v.to_bits() & 0x7FFF_FFFF);
        }
    }
    acc.into_iter().fold(0, u32::max)
}

/// `v` truncated toward zero, for a `v` its caller has shown to be finite and of magnitude below
/// 2^24 (each call says why). One `cvttps2dq` per eight values, where Rust's saturating `as`
/// (which must handle NaN and overflow) becomes scalar code.
#[inline(always)]
pub(super) fn trunc_small(v: f32) -> i32 {
    debug_assert!(v.abs() < 16_777_216.0, "{v}");
    // SAFETY: callers pass finite values of magnitude < 2^24, inside i32's range, as
    // `to_int_unchecked` requires (debug builds check it above).
    unsafe { v.to_int_unchecked::<i32>() }
}

/// Round half away from zero (gguf-py's `np_roundf`, C's `roundf`) for a finite |v| < 2^23:
/// trunc(v ± 0.49999997), which equals `roundf` on every finite f32 (checked over all of them
/// when this was written; the tests check a sweep): the add rounds a true half up to the next
/// integer and anything less stays below it.
#[inline(always)]
pub(super) fn round_away(v: f32) -> i32 {
    trunc_small(v + f32::from_bits(0x3EFF_FFFF).copysign(v))
}

/// 1/d, or 0 for d = 0 (`np.where(d == 0, 0, 1 / d)`).
#[inline(always)]
pub(super) fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// Codes as the encoders compute them: i32 lanes until they are packed (narrowing early makes
/// LLVM shuffle single bytes).
pub(super) type Codes = [i32; 32];

/// Element j and j + 16 share byte j: low nibble, high nibble (bits above 4 are dropped).
#[inline(always)]
pub(super) fn pack_nibbles(q: &Codes, out: &mut [u8]) {
    let mut both = [0i32; 16];
    for (j, b) in both.iter_mut().enumerate() {
        *b = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
    }
    for (o, &b) in out.iter_mut().zip(&both) {
        *o = b as u8;
    }
}
