//! blockquant-core: low-bit block quantization, in pure Rust.
//!
//! The pieces, in the order data flows through them:
//! - [`scheme`]: what a quantized tensor is (values, store, scale levels) and its rules;
//!   [`scheme_text`]: its canonical text (parsed and printed) and its `Display` form;
//! - [`layout`]: that scheme on a concrete shape: block grid, storage packing;
//! - [`calibrate`]: the amplitude of each block; [`search`]: searched (mse) scales;
//!   [`scale`]: rounding scales to their dtype, and a block's α to its stored scale;
//! - [`codec`] and [`minifloat`]: one value to its code and back; [`lookup`]: codebooks
//!   (the [`Codebook`] value itself is `codebook`'s, low, so the scheme needs no encoder);
//! - [`quantize`] and [`pack`]: the dispatchers (a path, then a kernel for it); [`bytes`]:
//!   burn's byte layout; [`affine`]: unsigned values with offsets (zero points, biases);
//! - `kernels`: the kernel wing the dispatchers call (the one-pass pieces and scale rule low,
//!   the AVX2 kernels above them), `simd`: CPU feature checks and the AVX2 primitives; neither
//!   imports a dispatcher;
//! - [`pool`]: the bounded thread pool every kernel runs in;
//! - [`ggml`]: llama.cpp's block types (GGUF tensors), apart from the scheme model;
//! - [`alloc`]: fallible allocation of every input-sized buffer (out of memory is an error).
//!
//! Inside the crate, items are imported from the module that defines them (never through the
//! re-exports below, which are the public face), so the module graph stays one-way.

pub mod affine;
pub mod alloc;
pub mod bytes;
pub mod calibrate;
mod codebook;
pub mod codec;
pub mod error;
mod exact_sum;
pub mod ggml;
pub mod input;
mod kernels;
pub mod layout;
pub mod lookup;
pub mod minifloat;
pub mod options;
pub mod pack;
pub mod pool;
pub mod quantize;
pub mod scale;
pub mod scheme;
pub mod scheme_text;
pub mod search;
mod simd;

pub use calibrate::Calibration;
pub use codec::Rounding;
pub use error::{QuantError, Result};
pub use input::Input;
pub use layout::Layout;
pub use lookup::Codebook;
pub use options::OptionName;
pub use pack::{BF16Bits, F16Bits, Storage, StorageMut};
pub use quantize::{ExplicitScales, Output, QuantizeOptions, Scales};
pub use scale::ScaleRounding;
pub use scheme::{BlockScale, Offset, QuantMode, QuantScheme, QuantStore, QuantValue, ScaleDtype};
