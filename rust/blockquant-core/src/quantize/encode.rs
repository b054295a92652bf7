//! The second pass of a two-pass quantize: every value against given effective scales
//! ([`encode_values`], which the mse search calls too), and the tie rule a rounding asks of a
//! scheme.

use crate::codec::{minifloat, E2M1Code, FloatCode, IntHalfAway, IntHalfEven, Rounding};
use crate::error::{QuantError, Result};
use crate::input::{Input, Window};
use crate::kernels::piece::first_non_finite;
use crate::kernels::with_codec::with_codec;
use crate::layout::Layout;
use crate::lookup::LookupCode;
use crate::pack::storage::StorageMut;
use crate::scheme::{QuantScheme, QuantValue};

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
    check_rounding(&layout.scheme, rounding)?;
    let bad = with_codec!(&layout.scheme, rounding, |codec| {
        crate::pack::encode_into(codec, Window::all(x), layout, effective, out)
    })?;
    if bad {
        return Err(first_non_finite(x));
    }
    Ok(())
}

/// `rounding` names how integer ties go; a codebook has its own tie rule, so asking it for
/// half-even is refused rather than silently ignored.
pub(super) fn check_rounding(scheme: &QuantScheme, rounding: Rounding) -> Result<()> {
    if scheme.codebook.is_some() && rounding == Rounding::HalfEven {
        return Err(QuantError::Scheme(format!(
            "rounding='half_even' does not apply to a Lookup scheme (a tie goes to the entry of larger magnitude), got {scheme}"
        )));
    }
    Ok(())
}
