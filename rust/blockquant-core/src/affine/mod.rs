//! Affine values (format.md "Affine values (offsets)"): unsigned codes with one offset per
//! scale, a zero point (x̂ = (q − z) × s) or a bias (x̂ = q × s + b).
//!
//! Three passes, each in the pool: every block's scale and offset (its range, or the `mse`
//! search over shrunken ranges, `search`), every value's code into an f32 buffer, then that
//! buffer packed by the store's own kernels (`crate::pack`) through a codec that passes the
//! code through. Dequantizing unpacks the codes the same way and applies each block's scale and
//! offset. The arithmetic of one block is `params`'.

use rayon::prelude::*;

use crate::alloc::{try_collect, try_zeroed};
use crate::calibrate::{for_each_row_in_grid_row, Calibration, MIN_TASK_ELEMS};
use crate::codec::{Decode, Encode, Rounding};
use crate::error::{QuantError, Result};
use crate::input::{Input, Window};
use crate::kernels::piece::first_non_finite;
use crate::layout::Layout;
use crate::options::QuantizeOptions;
use crate::pack::storage::{Effective, OutElem, Segments, Storage, StorageMut};
use crate::pool;
use crate::quantize::scales::Scales;
use crate::scheme::{Offset, QuantScheme};

pub mod params;
pub mod search;

use params::{bias_le_bytes, bias_read_le, bias_representable, code_of, value_of, Rule};

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The options an affine scheme takes: `scale_rounding` up or nearest (its scales are F32,
/// F16 or BF16), calibration minmax or mse.
pub fn check_options(scheme: &QuantScheme, opts: &QuantizeOptions) -> Result<()> {
    scheme.scale_dtype().check_rounding(opts.scale_rounding)?;
    match opts.calibration {
        Calibration::MinMax | Calibration::Mse => Ok(()),
        Calibration::AbsMean => Err(QuantError::Scheme(format!(
            "calibration 'absmean' does not apply to an affine scheme (its range is [min, max] of a block): use 'minmax' or 'mse', got {scheme}"
        ))),
    }
}

/// The refusal of explicit scales for an affine scheme (its offsets come from the data).
pub fn given_scales_refused(scheme: &QuantScheme) -> QuantError {
    QuantError::Scale(format!(
        "explicit scales= are not taken by an affine scheme (its offsets come from the data with its scales), got {scheme}"
    ))
}

/// A code passed through: the f32 code buffer to storage (`x / 1` is the code itself) and a
/// stored field back to its code.
#[derive(Clone, Copy)]
struct CodeField;

impl Encode for CodeField {
    #[inline(always)]
    fn encode(&self, xs: f32) -> u8 {
        xs as u8
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn encode8(&self, q: __m256) -> __m256i {
        _mm256_and_si256(_mm256_cvttps_epi32(q), _mm256_set1_epi32(0xFF))
    }
}

impl Decode for CodeField {
    #[inline(always)]
    fn decode(&self, field: u8) -> f32 {
        field as f32
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode8(&self, fields: __m256i) -> __m256 {
        _mm256_cvtepi32_ps(fields)
    }
}

/// Quantize `x` with an affine scheme: codes into `out`, each block's stored scale into
/// `scales` and offset into `offsets` (the grid's size, C order; a zero point as an f32
/// integer). Runs in the bounded pool.
pub fn quantize(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    out: StorageMut<'_>,
    scales: &mut [f32],
    offsets: &mut [f32],
) -> Result<()> {
    check_options(&layout.scheme, opts)?;
    assert_eq!(scales.len(), layout.num_scales, "scale count");
    assert_eq!(offsets.len(), layout.num_scales, "offset count");
    assert_eq!(x.len(), layout.num_elements, "input length");
    let qmax = layout.scheme.value.range().1;
    pool::install_sized(layout.num_elements, || {
        quantize_in_pool(x, layout, opts, qmax, out, scales, offsets)
    })
}

/// [`quantize`] into a `U8` layout with codes of `bits` bits only (1..=8): every code in
/// [0, 2^bits − 1], the range, search and rounding those of a `bits`-bit value. The codes of
/// formats whose widths blockquant's values do not have (MLX's 3, 5 and 6 bits), packed by
/// their writers; the stored tensor is a valid `U8` one.
pub fn quantize_narrow(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    bits: u32,
    out: StorageMut<'_>,
    scales: &mut [f32],
    offsets: &mut [f32],
) -> Result<()> {
    if layout.scheme.value != crate::scheme::QuantValue::U8 || !(1..=8).contains(&bits) {
        return Err(QuantError::Scheme(format!(
            "narrow codes take a U8 scheme and 1 to 8 bits, got {} and {bits} bits",
            layout.scheme
        )));
    }
    check_options(&layout.scheme, opts)?;
    assert_eq!(scales.len(), layout.num_scales, "scale count");
    assert_eq!(offsets.len(), layout.num_scales, "offset count");
    assert_eq!(x.len(), layout.num_elements, "input length");
    let qmax = ((1u32 << bits) - 1) as f32;
    pool::install_sized(layout.num_elements, || {
        quantize_in_pool(x, layout, opts, qmax, out, scales, offsets)
    })
}

fn quantize_in_pool(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    qmax: f32,
    out: StorageMut<'_>,
    scales: &mut [f32],
    offsets: &mut [f32],
) -> Result<()> {
    let n = layout.num_elements;
    let owned: Vec<f32>;
    let xs: &[f32] = match x {
        Input::F32(s) => s,
        _ => {
            let mut v = try_zeroed(n)?;
            v.par_chunks_mut(MIN_TASK_ELEMS)
                .enumerate()
                .for_each(|(i, c)| x.convert(i * MIN_TASK_ELEMS, c));
            owned = v;
            &owned
        }
    };
    let finite = |c: &[f32]| c.iter().fold(true, |a, v| a & v.is_finite());
    if !xs.par_chunks(MIN_TASK_ELEMS).all(finite) {
        return Err(first_non_finite(x));
    }
    let rule = Rule {
        qmax,
        ..Rule::new(&layout.scheme, opts.scale_rounding, opts.rounding)
    };
    block_params(
        xs,
        layout,
        &rule,
        opts.calibration == Calibration::Mse,
        scales,
        offsets,
    );
    if n == 0 {
        return Ok(());
    }
    let mut codes: Vec<f32> = try_zeroed(n)?;
    codes
        .par_chunks_mut(MIN_TASK_ELEMS)
        .enumerate()
        .for_each(|(ci, c)| {
            let start = ci * MIN_TASK_ELEMS;
            for (pos, len, s) in Segments::new(layout, start, c.len()) {
                let o = pos - start;
                code_run(
                    &rule,
                    &xs[pos..pos + len],
                    scales[s],
                    offsets[s],
                    &mut c[o..o + len],
                );
            }
        });
    let ones = try_collect(std::iter::repeat_n(1.0f32, layout.num_scales))?;
    let window = Window::all(Input::F32(&codes));
    let bad = crate::pack::encode_into(CodeField, window, layout, &ones, out)?;
    debug_assert!(!bad, "codes are finite");
    Ok(())
}

/// The codes of one run of a block, one loop per offset kind and rounding.
#[inline]
fn code_run(rule: &Rule, xs: &[f32], s: f32, off: f32, out: &mut [f32]) {
    #[inline(always)]
    fn run(xs: &[f32], out: &mut [f32], f: impl Fn(f32) -> f32) {
        for (o, &x) in out.iter_mut().zip(xs) {
            *o = f(x);
        }
    }
    let q = rule.qmax;
    let bias = Offset::Bias(rule.dtype);
    match (rule.offset, rule.rounding == Rounding::HalfEven) {
        (Offset::Zero, false) => run(xs, out, |x| code_of(Offset::Zero, false, q, x, s, off)),
        (Offset::Zero, true) => run(xs, out, |x| code_of(Offset::Zero, true, q, x, s, off)),
        (Offset::Bias(_), false) => run(xs, out, |x| code_of(bias, false, q, x, s, off)),
        (Offset::Bias(_), true) => run(xs, out, |x| code_of(bias, true, q, x, s, off)),
    }
}

/// [min, max] of finite values, eight lanes at a time; [0, 0] for none.
fn range(xs: &[f32]) -> (f32, f32) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let mut lo = [f32::INFINITY; 8];
    let mut hi = [f32::NEG_INFINITY; 8];
    let chunks = xs.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            lo[i] = if c[i] < lo[i] { c[i] } else { lo[i] };
            hi[i] = if c[i] > hi[i] { c[i] } else { hi[i] };
        }
    }
    for &v in rest {
        lo[0] = if v < lo[0] { v } else { lo[0] };
        hi[0] = if v > hi[0] { v } else { hi[0] };
    }
    let lo = lo
        .into_iter()
        .fold(f32::INFINITY, |a, v| if v < a { v } else { a });
    let hi = hi
        .into_iter()
        .fold(f32::NEG_INFINITY, |a, v| if v > a { v } else { a });
    (lo, hi)
}

/// Every block's stored scale and offset: per tensor, the range of all values (the search
/// over them all in order); per block, grid rows in parallel and their blocks in column ranges.
fn block_params(
    xs: &[f32],
    layout: &Layout,
    rule: &Rule,
    mse: bool,
    scales: &mut [f32],
    offsets: &mut [f32],
) {
    let one = |vals: &[f32], lo: f32, hi: f32| match mse && !vals.is_empty() {
        true => search::search(rule, vals, lo, hi),
        false => rule.params(lo, hi),
    };
    if layout.per_tensor {
        let (lo, hi) = xs
            .par_chunks(MIN_TASK_ELEMS)
            .map(range)
            .reduce_with(|a, b| (a.0.min(b.0), a.1.max(b.1)))
            .unwrap_or((0.0, 0.0));
        (scales[0], offsets[0]) = one(xs, lo, hi);
        return;
    }
    let gc = layout.grid_cols();
    if layout.num_elements == 0 || gc == 0 {
        return;
    }
    let (n, bc) = (layout.row_len(), layout.block_cols());
    let rows_per_block: usize = layout.block[..layout.rank() - 1].iter().product();
    let blocks_per_task = (MIN_TASK_ELEMS / (rows_per_block * bc).max(1)).max(1);
    let grid_rows_per_task = (MIN_TASK_ELEMS / (rows_per_block * n).max(1)).max(1);
    scales
        .par_chunks_mut(gc)
        .zip(offsets.par_chunks_mut(gc))
        .with_min_len(grid_rows_per_task)
        .enumerate()
        .for_each(|(g, (srow, orow))| {
            let mut rows = Vec::with_capacity(rows_per_block);
            for_each_row_in_grid_row(layout, g, |r| rows.push(r));
            let task = |ci: usize, sc: &mut [f32], oc: &mut [f32]| {
                let mut buf = Vec::new();
                for (kk, (s, o)) in sc.iter_mut().zip(oc.iter_mut()).enumerate() {
                    let c0 = (ci * blocks_per_task + kk) * bc;
                    let c1 = (c0 + bc).min(n);
                    let vals: &[f32] = if rows.len() == 1 {
                        &xs[rows[0] * n + c0..rows[0] * n + c1]
                    } else {
                        buf.clear();
                        for &r in &rows {
                            buf.extend_from_slice(&xs[r * n + c0..r * n + c1]);
                        }
                        &buf
                    };
                    let (lo, hi) = range(vals);
                    (*s, *o) = one(vals, lo, hi);
                }
            };
            if srow.len() <= blocks_per_task {
                task(0, srow, orow);
            } else {
                srow.par_chunks_mut(blocks_per_task)
                    .zip(orow.par_chunks_mut(blocks_per_task))
                    .enumerate()
                    .for_each(|(ci, (sc, oc))| task(ci, sc, oc));
            }
        });
}

/// x̂ of every value into `out` (C order): the codes unpacked by the store's kernels, then
/// each block's scale and offset applied (format.md "Dequantizing"), converted to the output's
/// type from that f32. `scales` and `offsets` must have been checked ([`check_offsets`] and
/// `quantize::check_stored`). Runs in the bounded pool.
pub fn dequantize<O: OutElem>(
    layout: &Layout,
    storage: Storage<'_>,
    scales: &[f32],
    offsets: &[f32],
    out: &mut [O],
) -> Result<()> {
    assert_eq!(out.len(), layout.num_elements, "output length");
    assert_eq!(scales.len(), layout.num_scales, "scale count");
    assert_eq!(offsets.len(), layout.num_scales, "offset count");
    let zero = matches!(layout.scheme.offset, Some(Offset::Zero));
    pool::install_sized(layout.num_elements, || {
        let ones = try_collect(std::iter::repeat_n(1.0f32, layout.num_scales))?;
        let eff = Effective::new(&ones, None);
        if let Some(o) = O::as_f32(out) {
            crate::pack::decode_into(CodeField, layout, storage, eff, o)?;
            apply(layout, zero, scales, offsets, o);
            return Ok(());
        }
        let mut tmp: Vec<f32> = try_zeroed(layout.num_elements)?;
        crate::pack::decode_into(CodeField, layout, storage, eff, &mut tmp)?;
        apply(layout, zero, scales, offsets, &mut tmp);
        out.par_chunks_mut(MIN_TASK_ELEMS)
            .zip(tmp.par_chunks(MIN_TASK_ELEMS))
            .for_each(|(o, t)| o.iter_mut().zip(t).for_each(|(o, &v)| *o = O::from_f32(v)));
        Ok(())
    })
}

/// Codes (as f32) to values in place, block by block.
fn apply(layout: &Layout, zero: bool, scales: &[f32], offsets: &[f32], vals: &mut [f32]) {
    vals.par_chunks_mut(MIN_TASK_ELEMS)
        .enumerate()
        .for_each(|(ci, c)| {
            let start = ci * MIN_TASK_ELEMS;
            for (pos, len, s) in Segments::new(layout, start, c.len()) {
                let (sc, off) = (scales[s], offsets[s]);
                let run = &mut c[pos - start..pos - start + len];
                if zero {
                    run.iter_mut()
                        .for_each(|v| *v = value_of(true, *v, sc, off));
                } else {
                    run.iter_mut()
                        .for_each(|v| *v = value_of(false, *v, sc, off));
                }
            }
        });
}

/// Offsets taken from a caller (`QTensor.from_parts`): one a scale; a zero point an integer
/// from 0 to qmax, a bias a finite value of its dtype. A bad one is a `ScaleError` naming the
/// first.
pub fn check_offsets(layout: &Layout, offsets: &[f32]) -> Result<()> {
    let scheme = &layout.scheme;
    if offsets.len() != layout.num_scales {
        return Err(QuantError::Scale(format!(
            "expected {} offsets (grid {:?}) for {scheme} on shape {:?}, got {}",
            layout.num_scales,
            layout.grid,
            layout.shape,
            offsets.len()
        )));
    }
    let qmax = scheme.value.range().1;
    let bad = match scheme.offset {
        Some(Offset::Zero) => offsets
            .iter()
            .position(|&z| !(z.is_finite() && z.fract() == 0.0 && (0.0..=qmax).contains(&z))),
        Some(Offset::Bias(d)) => offsets.iter().position(|&b| !bias_representable(b, d)),
        None => None,
    };
    match (bad, scheme.offset) {
        (Some(i), Some(Offset::Zero)) => Err(QuantError::Scale(format!(
            "offset {} at index {i} is not a zero point of {} (an integer from 0 to {qmax})",
            offsets[i], scheme.value
        ))),
        (Some(i), Some(Offset::Bias(d))) => Err(QuantError::Scale(format!(
            "offset {} at index {i} is not a bias of {d} (biases must be finite and exactly representable)",
            offsets[i]
        ))),
        _ => Ok(()),
    }
}

/// The byte layout of an affine tensor into `out` (exactly `layout.total_bytes()` bytes):
/// storage and scales as `crate::bytes` writes them, then the offsets in the scales' order
/// (zero points one byte each, biases little-endian in their dtype).
pub fn write_bytes(
    layout: &Layout,
    storage: Storage<'_>,
    scales: &Scales,
    offsets: &[f32],
    out: &mut [u8],
) -> Result<()> {
    assert_eq!(out.len(), layout.total_bytes(), "output length");
    assert_eq!(offsets.len(), layout.num_scales, "offset count");
    let head = layout.total_bytes() - layout.offsets_bytes();
    let (front, tail) = out.split_at_mut(head);
    crate::bytes::write_bytes(layout, storage, scales, front)?;
    let offset = layout.scheme.offset.expect("an affine scheme");
    let mut at = 0;
    let mut put = |v: f32| match offset {
        Offset::Zero => {
            tail[at] = v as u8;
            at += 1;
        }
        Offset::Bias(d) => {
            let (b, k) = bias_le_bytes(v, d);
            tail[at..at + k].copy_from_slice(&b[..k]);
            at += k;
        }
    };
    match layout.scale_byte_order()? {
        None => offsets.iter().for_each(|&v| put(v)),
        Some(order) => order.iter().for_each(|&g| put(offsets[g])),
    }
    Ok(())
}

/// The parts of an affine tensor's bytes: storage bytes, scales, offsets (the grid's order).
#[derive(Debug, Clone, PartialEq)]
pub struct Parts<'a> {
    pub storage: &'a [u8],
    pub scales: Scales,
    pub offsets: Vec<f32>,
}

/// Split an affine tensor's bytes. The length must match exactly; scales and storage are
/// checked as `crate::bytes::from_bytes` checks them, then every offset: a zero point above
/// qmax or a bias that is not finite is a `LayoutError`.
pub fn from_bytes<'a>(layout: &Layout, data: &'a [u8]) -> Result<Parts<'a>> {
    let expected = layout.total_bytes();
    if data.len() != expected {
        return Err(QuantError::Layout(format!(
            "expected {expected} bytes for {} with shape {:?}, got {}",
            layout.scheme,
            layout.shape,
            data.len()
        )));
    }
    let head = expected - layout.offsets_bytes();
    let parts = crate::bytes::from_bytes(layout, &data[..head])?;
    let offset = layout.scheme.offset.expect("an affine scheme");
    let tail = &data[head..];
    let in_bytes: Vec<f32> = match offset {
        Offset::Zero => try_collect(tail.iter().map(|&b| b as f32))?,
        Offset::Bias(d) => try_collect(
            tail.chunks_exact(d.size_bytes())
                .map(|c| bias_read_le(c, d)),
        )?,
    };
    let qmax = layout.scheme.value.range().1;
    let bad = match offset {
        Offset::Zero => in_bytes.iter().position(|&z| z > qmax),
        Offset::Bias(_) => in_bytes.iter().position(|b| !b.is_finite()),
    };
    if let Some(i) = bad {
        return Err(QuantError::Layout(match offset {
            Offset::Zero => format!(
                "corrupt offsets: stored zero point {} at {i} is above {qmax}, the largest code of {}",
                in_bytes[i], layout.scheme.value
            ),
            Offset::Bias(_) => format!("corrupt offsets: stored bias {} at {i} is not finite", in_bytes[i]),
        }));
    }
    let offsets = match layout.scale_byte_order()? {
        None => in_bytes,
        Some(order) => {
            let mut grid = try_zeroed(in_bytes.len())?;
            for (&v, &g) in in_bytes.iter().zip(&order) {
                grid[g] = v;
            }
            grid
        }
    };
    Ok(Parts {
        storage: parts.storage,
        scales: parts.scales,
        offsets,
    })
}

#[cfg(test)]
mod tests;
