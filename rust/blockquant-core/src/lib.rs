//! blockquant-core: low-bit block quantization, in pure Rust.
//!
//! The pieces, in the order data flows through them:
//! - [`scheme`]: what a quantized tensor is (values, store, scale levels) and its rules;
//!   [`scheme_text`]: its canonical text (parsed and printed) and its `Display` form;
//! - [`layout`]: that scheme on a concrete shape: block grid, storage packing;
//! - [`calibrate`]: the amplitude of each block; [`search`]: searched (mse) scales;
//!   [`scale`]: rounding scales to their dtype;
//! - [`codec`] and [`minifloat`]: one value to its code and back; [`lookup`]: codebooks;
//! - [`quantize`] and [`pack`]: the kernels; [`bytes`]: burn's byte layout;
//! - [`pool`]: the bounded thread pool every kernel runs in;
//! - [`ggml`]: llama.cpp's block types (GGUF tensors), apart from the scheme model.

pub mod bytes;
pub mod calibrate;
pub mod codec;
pub mod error;
#[cfg(target_arch = "x86_64")]
mod fused_avx2;
#[cfg(target_arch = "x86_64")]
mod fused_narrow;
mod fused_tiles;
pub mod ggml;
pub mod input;
pub mod layout;
pub mod lookup;
pub mod minifloat;
#[cfg(target_arch = "x86_64")]
mod nvfp4_avx2;
#[cfg(target_arch = "x86_64")]
mod nvfp4_avx512;
pub mod options;
pub mod pack;
#[cfg(target_arch = "x86_64")]
mod pack2_avx2;
pub mod pool;
pub mod quantize;
pub mod scale;
pub mod scheme;
pub mod scheme_text;
pub mod search;
mod search_avx2;
mod search_cands;
mod search_lanes;
mod search_values;
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
pub use scheme::{BlockScale, QuantMode, QuantScheme, QuantStore, QuantValue, ScaleDtype};
