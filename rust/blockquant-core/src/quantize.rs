//! Quantize and dequantize (SPEC §3–§7): scales from α, then every value against its block's
//! stored (or effective) scale, written straight into the caller's storage.

use rayon::prelude::*;

use crate::calibrate::{amplitudes, run_amplitude, Calibration, MIN_TASK_ELEMS};
use crate::codec::{
    float_table, minifloat, E2M1Code, Encode, FloatCode, IntDecode, IntHalfAway, IntHalfEven,
    Rounding, TableDecode,
};
use crate::error::{QuantError, Result};
use crate::input::{Input, Window};
use crate::layout::Layout;
use crate::pack::{
    encode_range, encode_words_last_axis, BF16Bits, F16Bits, OutElem, ScaleSlice, Segments,
    Storage, StorageMut, Word,
};
use crate::scale::{check_scales, ScaleRounding};
use crate::scheme::{QuantValue, ScaleDtype};
use crate::simd::avx2_dispatch;

/// Evaluates `$body` with `$codec` bound to the encoder of `$value` under `$rounding`: each
/// (value, rounding) pair gets its own monomorphized kernel.
macro_rules! with_codec {
    ($value:expr, $rounding:expr, |$codec:ident| $body:expr) => {{
        let value: QuantValue = $value;
        let (qmin, qmax) = value.range();
        match (minifloat(value), $rounding) {
            (Some(_), _) if value == QuantValue::E2M1 => {
                let $codec = E2M1Code;
                $body
            }
            (Some(fmt), _) => {
                let $codec = FloatCode(fmt);
                $body
            }
            (None, Rounding::HalfAway) => {
                let $codec = IntHalfAway { qmin, qmax };
                $body
            }
            (None, Rounding::HalfEven) => {
                let $codec = IntHalfEven { qmin, qmax };
                $body
            }
        }
    }};
}

/// Options of a quantize call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuantizeOptions {
    pub calibration: Calibration,
    pub rounding: Rounding,
    pub scale_rounding: ScaleRounding,
}

/// Scales the caller gives instead of calibrating (SPEC §3, "explicit").
#[derive(Debug, Clone, Copy, Default)]
pub struct ExplicitScales<'a> {
    /// The scale grid in row-major order (one value for per-tensor); two-level: the block
    /// scales b_i in block-dtype units. `None`: calibrate them.
    pub scales: Option<&'a [f32]>,
    /// A two-level scheme's per-tensor scale g. `None`: derive it (only when calibrating).
    pub global: Option<f32>,
}

/// The scales a quantized tensor stores, and the ones its values were quantized against.
#[derive(Debug, Clone, PartialEq)]
pub struct Scales {
    /// Stored scales (the grid; two-level: the block scales b_i), exact in their dtype.
    pub stored: Vec<f32>,
    /// Two-level only: the per-tensor scale g, f32.
    pub global: Option<f32>,
    /// Two-level only: b_i × g. One-level values are divided by `stored` itself.
    two_level_effective: Vec<f32>,
}

impl Scales {
    /// Scales as stored; for two-level (`global` set) the effective scales are derived here.
    pub fn new(stored: Vec<f32>, global: Option<f32>) -> Self {
        let two_level_effective = match global {
            Some(g) => stored
                .par_iter()
                .with_min_len(MIN_TASK_ELEMS)
                .map(|&b| effective_scale(b, g))
                .collect(),
            None => Vec::new(),
        };
        Self {
            stored,
            global,
            two_level_effective,
        }
    }

    /// Check stored scales against `layout`, then [`Scales::new`] (after `from_bytes` /
    /// `from_parts`, or explicit scales).
    pub fn from_stored(layout: &Layout, stored: Vec<f32>, global: Option<f32>) -> Result<Self> {
        check_stored(layout, &stored, global)?;
        Ok(Self::new(stored, global))
    }

    /// What values are divided by: `stored`, or `b_i × g` for two-level.
    pub fn effective(&self) -> &[f32] {
        match self.global {
            Some(_) => &self.two_level_effective,
            None => &self.stored,
        }
    }
}

/// e = b × g (one f32 multiply). Capped at f32::MAX: only Q2 values of magnitude near f32::MAX
/// get there (b rounded up to the dtype max, times g), and an infinite scale would turn every
/// value of the block into NaN on the way back.
#[inline]
pub fn effective_scale(b: f32, g: f32) -> f32 {
    (b * g).min(f32::MAX)
}

fn scale_count_error(layout: &Layout, got: usize) -> QuantError {
    QuantError::Scale(format!(
        "expected {} scales (grid {:?}) for {} on shape {:?}, got {got}",
        layout.num_scales, layout.grid, layout.scheme, layout.shape
    ))
}

/// Check that stored scales fit `layout`: count, representable in the dtype, global presence.
pub fn check_stored(layout: &Layout, stored: &[f32], global: Option<f32>) -> Result<()> {
    if stored.len() != layout.num_scales {
        return Err(scale_count_error(layout, stored.len()));
    }
    let scheme = &layout.scheme;
    let dtype = scheme.scale_dtype();
    if let Some((i, s)) = stored
        .iter()
        .enumerate()
        .find(|(_, s)| !dtype.is_representable(**s))
    {
        return Err(QuantError::Scale(format!(
            "scale {s} at index {i} is not a value of {dtype} (scales must be finite, >= 0 and exactly representable)"
        )));
    }
    match (scheme.is_two_level(), global) {
        (true, None) => Err(QuantError::MissingGlobalScale {
            scheme: scheme.to_string(),
        }),
        (false, Some(_)) => Err(QuantError::GlobalScaleNotTaken {
            scheme: scheme.to_string(),
        }),
        (true, Some(g)) => check_scales(&[g], "the per-tensor scale"),
        (false, None) => Ok(()),
    }
}

/// Work out the scales of `x` (calibrated, or explicit and rounded to their dtype).
pub fn compute_scales(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    explicit: Option<ExplicitScales<'_>>,
) -> Result<Scales> {
    let scheme = &layout.scheme;
    let dtype = scheme.scale_dtype();
    let mode = opts.scale_rounding;
    let ex = explicit.unwrap_or_default();
    match (ex.global, scheme.is_two_level()) {
        (Some(_), false) => {
            return Err(QuantError::UnexpectedGlobalScale {
                scheme: scheme.to_string(),
            })
        }
        (Some(g), true) => check_scales(&[g], "the per-tensor scale")?,
        (None, _) => {}
    }
    if let Some(given) = ex.scales {
        if given.len() != layout.num_scales {
            return Err(scale_count_error(layout, given.len()));
        }
        check_scales(given, "scales")?;
        // A two-level scheme without its per-tensor scale is reported by `from_stored`.
        let stored: Vec<f32> = given
            .par_iter()
            .with_min_len(MIN_TASK_ELEMS)
            .map(|&s| dtype.round(s, mode))
            .collect();
        return Scales::from_stored(layout, stored, ex.global);
    }

    let half_range = scheme.value.half_range();
    let alpha = amplitudes(x, layout, opts.calibration);
    // One pass from α to the stored scale: s_raw = α / half_range, then the dtype's rounding,
    // where `to_block` maps s_raw to the block dtype's units (two-level: ÷ g).
    let round_all = |to_block: fn(f32, f32) -> f32, g: f32| -> Vec<f32> {
        alpha
            .par_iter()
            .with_min_len(MIN_TASK_ELEMS)
            .map(|&a| dtype.round(to_block(a / half_range, g), mode))
            .collect()
    };
    if !scheme.is_two_level() {
        return Ok(Scales::new(round_all(|s, _| s, 1.0), None));
    }
    // g maps the largest raw block scale onto the block dtype's largest value.
    let max_raw = alpha.iter().fold(0.0f32, |m, &a| m.max(a)) / half_range;
    let g = match ex.global {
        Some(g) => g,
        None if max_raw == 0.0 => 1.0,
        None => max_raw / dtype.max_value(),
    };
    // A caller's g of 0 leaves nothing to normalize by: every block quantizes to 0.
    let stored = round_all(|s, g| if g == 0.0 { 0.0 } else { s / g }, g);
    Ok(Scales::new(stored, Some(g)))
}

/// Quantize `x` (C order, `layout.num_elements` values) against `effective` scales into `out`.
/// On a non-finite input returns `NonFinite` naming the first one; `out` is then unspecified
/// (callers hand in fresh storage and drop it on error).
pub fn encode_values(
    x: Input<'_>,
    layout: &Layout,
    effective: &[f32],
    rounding: Rounding,
    out: StorageMut<'_>,
) -> Result<()> {
    assert_eq!(x.len(), layout.num_elements, "input length");
    assert_eq!(effective.len(), layout.num_scales, "scale count");
    let value = layout.scheme.value;
    let bad = with_codec!(value, rounding, |codec| {
        crate::pack::encode_into(codec, Window::all(x), layout, effective, out)
    });
    if bad {
        return Err(first_non_finite(x));
    }
    Ok(())
}

fn first_non_finite(x: Input<'_>) -> QuantError {
    let mut buf = Vec::new();
    for start in (0..x.len()).step_by(MIN_TASK_ELEMS) {
        let len = MIN_TASK_ELEMS.min(x.len() - start);
        let chunk = x.read(start, len, &mut buf);
        if let Some(i) = chunk.iter().position(|v| !v.is_finite()) {
            return QuantError::NonFinite {
                index: start + i,
                value: chunk[i],
            };
        }
    }
    unreachable!("a non-finite value was seen")
}

/// Calibrate, then quantize: the whole of `bq.quantize` for f32 input.
pub fn quantize(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    explicit: Option<ExplicitScales<'_>>,
    out: StorageMut<'_>,
) -> Result<Scales> {
    let calibrating = explicit.is_none_or(|e| e.scales.is_none() && e.global.is_none());
    if calibrating && fusable(layout) {
        return quantize_fused(x, layout, opts, out);
    }
    let scales = compute_scales(x, layout, opts, explicit)?;
    encode_values(x, layout, scales.effective(), opts.rounding, out)?;
    Ok(scales)
}

/// Elements per piece of the one-pass kernel: 64 KiB of f32 stays in L2 between measuring a
/// piece's blocks and quantizing them.
const PIECE: usize = 1 << 14;

/// One-level block schemes whose blocks are runs along the last axis (and stores that pack along
/// it) are quantized in one pass over memory: each piece's scales are computed, then its values,
/// while the piece is still in cache. Same arithmetic as the two-pass path, so the same bits.
fn fusable(layout: &Layout) -> bool {
    !layout.per_tensor
        && !layout.scheme.is_two_level()
        && layout.rows_map_directly()
        // Native, or packed along the last axis (`inner == 1` alone also holds when the dims
        // after an outer packed axis are all 1).
        && layout.packing.axis + 1 == layout.rank()
        && layout.num_elements > 0
}

/// A piece of the tensor for the one-pass kernel: elements, and the scales and storage words
/// they own (all three contiguous, because pieces are whole rows or block- and word-aligned
/// parts of one row).
#[derive(Debug, Clone, Copy)]
struct Piece {
    start: usize,
    len: usize,
    scale0: usize,
    scales: usize,
    /// Global index of the first storage word, and the count.
    word0: usize,
    words: usize,
}

fn pieces(layout: &Layout) -> Vec<Piece> {
    let n = layout.row_len();
    let (bc, gc) = (layout.block_cols(), layout.grid_cols());
    let (per, nw) = (layout.packing.per, layout.packing.words_axis);
    let rows = layout.num_rows();
    let mut out = Vec::new();
    if n <= PIECE {
        let step = (PIECE / n).max(1);
        for r0 in (0..rows).step_by(step) {
            let r1 = (r0 + step).min(rows);
            out.push(Piece {
                start: r0 * n,
                len: (r1 - r0) * n,
                scale0: r0 * gc,
                scales: (r1 - r0) * gc,
                word0: r0 * nw,
                words: (r1 - r0) * nw,
            });
        }
    } else {
        let unit = lcm(bc, per);
        let plen = (PIECE / unit).max(1) * unit;
        for r in 0..rows {
            for c0 in (0..n).step_by(plen) {
                let c1 = (c0 + plen).min(n);
                out.push(Piece {
                    start: r * n + c0,
                    len: c1 - c0,
                    scale0: r * gc + c0 / bc,
                    scales: c1.div_ceil(bc) - c0 / bc,
                    word0: r * nw + c0 / per,
                    words: c1.div_ceil(per) - c0 / per,
                });
            }
        }
    }
    out
}

fn lcm(a: usize, b: usize) -> usize {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}

fn quantize_fused(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    out: StorageMut<'_>,
) -> Result<Scales> {
    let (stored, bad) = with_codec!(layout.scheme.value, opts.rounding, |codec| {
        fused_with(codec, x, layout, opts, out)
    });
    if bad {
        return Err(first_non_finite(x));
    }
    Ok(Scales::new(stored, None))
}

fn fused_with<C: Encode>(
    codec: C,
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    out: StorageMut<'_>,
) -> (Vec<f32>, bool) {
    let mut stored = vec![0.0f32; layout.num_scales];
    let pieces = pieces(layout);
    let bad = match out {
        StorageMut::U8(bytes) if layout.packing.per == 1 => fused_pieces(
            x,
            layout,
            opts,
            &pieces,
            &mut stored,
            bytes,
            |p, xs, sc, out| encode_range(codec, xs, layout, sc, p.start, out),
        ),
        StorageMut::U8(words) => fused_pieces(
            x,
            layout,
            opts,
            &pieces,
            &mut stored,
            words,
            |p, xs, sc, out| encode_words_last_axis(codec, xs, layout, sc, p.word0, out),
        ),
        StorageMut::U32(words) => fused_pieces(
            x,
            layout,
            opts,
            &pieces,
            &mut stored,
            words,
            |p, xs, sc, out| encode_words_last_axis(codec, xs, layout, sc, p.word0, out),
        ),
    };
    (stored, bad)
}

avx2_dispatch! {
    /// The stored scale of every block of a piece (`x` holds just the piece).
    fn measure_piece[](
        x: &[f32],
        layout: &Layout,
        p: &Piece,
        sc: &mut [f32],
        opts: &QuantizeOptions,
        dtype: ScaleDtype,
        half_range: f32,
    ) => measure_piece_portable;
}

#[inline(always)]
fn measure_piece_portable(
    x: &[f32],
    layout: &Layout,
    p: &Piece,
    sc: &mut [f32],
    opts: &QuantizeOptions,
    dtype: ScaleDtype,
    half_range: f32,
) {
    for (pos, len, s) in Segments::new(layout, p.start, p.len) {
        let i = pos - p.start; // x holds just this piece
        let alpha = run_amplitude(&x[i..i + len], opts.calibration);
        sc[s - p.scale0] = dtype.round(alpha / half_range, opts.scale_rounding);
    }
}

fn fused_pieces<W: Word>(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    pieces: &[Piece],
    stored: &mut [f32],
    words: &mut [W],
    encode_piece: impl Fn(&Piece, Window<'_>, ScaleSlice<'_>, &mut [W]) -> bool + Sync,
) -> bool {
    // Hand each piece its own scales and words (disjoint, in order).
    let mut work = Vec::with_capacity(pieces.len());
    let (mut sc_rest, mut w_rest) = (stored, words);
    for &p in pieces {
        let (sc, sr) = std::mem::take(&mut sc_rest).split_at_mut(p.scales);
        let (w, wr) = std::mem::take(&mut w_rest).split_at_mut(p.words);
        sc_rest = sr;
        w_rest = wr;
        work.push((p, sc, w));
    }
    let dtype = layout.scheme.scale_dtype();
    let half_range = layout.scheme.value.half_range();
    work.into_par_iter()
        .map_init(Vec::new, |buf, (p, sc, w)| {
            // Read (or convert) the piece once; measure its blocks, then quantize them while
            // they are in cache.
            let xs = x.read(p.start, p.len, buf);
            measure_piece(xs, layout, &p, sc, opts, dtype, half_range);
            let slice = ScaleSlice {
                scales: sc,
                base: p.scale0,
            };
            let window = Window {
                input: Input::F32(xs),
                start: p.start,
            };
            encode_piece(&p, window, slice, w)
        })
        .reduce(|| false, |a, b| a | b)
}

/// Where dequantize writes: x̂ as f32, or converted from that f32 (SPEC §7).
#[derive(Debug)]
pub enum Output<'a> {
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
    F16(&'a mut [F16Bits]),
    BF16(&'a mut [BF16Bits]),
}

/// x̂ = f32(decode(q)) × e into `out` (C order), converted to the output's type element by
/// element (no full-size f32 temporary).
pub fn dequantize(layout: &Layout, storage: Storage<'_>, effective: &[f32], out: Output<'_>) {
    match out {
        Output::F32(o) => dequantize_into(layout, storage, effective, o),
        Output::F64(o) => dequantize_into(layout, storage, effective, o),
        Output::F16(o) => dequantize_into(layout, storage, effective, o),
        Output::BF16(o) => dequantize_into(layout, storage, effective, o),
    }
}

fn dequantize_into<O: OutElem>(
    layout: &Layout,
    storage: Storage<'_>,
    effective: &[f32],
    out: &mut [O],
) {
    assert_eq!(out.len(), layout.num_elements, "output length");
    assert_eq!(effective.len(), layout.num_scales, "scale count");
    match minifloat(layout.scheme.value) {
        Some(fmt) => {
            let table = float_table(&fmt);
            crate::pack::decode_into(TableDecode(&table), layout, storage, effective, out);
        }
        None => {
            let dec = IntDecode::new(&layout.packing);
            crate::pack::decode_into(dec, layout, storage, effective, out);
        }
    }
}

/// Round an array of scales to `dtype` (`bq.round_scale`).
pub fn round_scales(
    scales: &[f32],
    dtype: ScaleDtype,
    mode: ScaleRounding,
    out: &mut [f32],
) -> Result<()> {
    check_scales(scales, "scales")?;
    out.par_iter_mut()
        .with_min_len(MIN_TASK_ELEMS)
        .zip(scales.par_iter())
        .for_each(|(o, &s)| *o = dtype.round(s, mode));
    Ok(())
}
