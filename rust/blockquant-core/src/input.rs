//! The tensor being quantized, in the float type the caller has: f32 is read in place; f16,
//! bf16 and f64 are converted to f32 a piece at a time (round to nearest even, as a numpy cast),
//! so no full-size f32 copy is ever made.

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

/// Input values, C order.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    F32(&'a [f32]),
    /// IEEE binary16 bit patterns.
    F16(&'a [u16]),
    /// bfloat16 bit patterns (the top half of an f32).
    BF16(&'a [u16]),
    F64(&'a [f64]),
}

impl<'a> Input<'a> {
    pub fn len(&self) -> usize {
        match self {
            Self::F32(x) => x.len(),
            Self::F16(x) | Self::BF16(x) => x.len(),
            Self::F64(x) => x.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements `[start, start + len)` as f32: borrowed for f32 input, else converted into `buf`.
    #[inline]
    pub fn read<'s>(&'s self, start: usize, len: usize, buf: &'s mut Vec<f32>) -> &'s [f32] {
        match self {
            Self::F32(x) => &x[start..start + len],
            _ => {
                buf.resize(len, 0.0);
                self.convert(start, buf);
                buf
            }
        }
    }

    /// Convert elements `[start, start + out.len())` to f32.
    pub fn convert(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            Self::F32(x) => out.copy_from_slice(&x[start..end]),
            // `half` converts with F16C when the CPU has it; the conversion is exact.
            Self::F16(x) => x[start..end]
                .reinterpret_cast::<half::f16>()
                .convert_to_f32_slice(out),
            Self::BF16(x) => {
                for (o, &b) in out.iter_mut().zip(&x[start..end]) {
                    *o = f32::from_bits((b as u32) << 16);
                }
            }
            Self::F64(x) => {
                for (o, &v) in out.iter_mut().zip(&x[start..end]) {
                    *o = v as f32; // round to nearest even; overflow gives ±inf (then rejected)
                }
            }
        }
    }
}

/// The tensor's elements from flat index `start` on: kernels address elements by their index in
/// the whole tensor, and a window lets them run on a converted piece of it.
#[derive(Debug, Clone, Copy)]
pub struct Window<'a> {
    pub input: Input<'a>,
    pub start: usize,
}

impl<'a> Window<'a> {
    /// The whole tensor.
    pub fn all(input: Input<'a>) -> Self {
        Self { input, start: 0 }
    }
}

#[cfg(test)]
#[path = "input_tests.rs"]
mod tests;
