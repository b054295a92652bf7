//! The kernel wing: what the dispatchers (`quantize`, `pack`'s encode and decode, the search)
//! call to do the work, and nothing that calls them back.
//!
//! Low to high: `piece` (the one-pass kernels' pieces, scale rule and drivers) and
//! `with_codec` (a scheme's encoder type); `lanes` (the AVX2 lane helpers every eight-blocks
//! kernel shares); then the kernels, each importing only the files above and the ones before
//! it here: `fused_narrow` (blocks shorter than 8 or not a multiple of it), `fused_avx2`
//! (eight blocks of a multiple of 8 at a time), `fused_tiles` (blocks spanning rows),
//! `nvfp4_avx512` then `nvfp4_avx2` (NVFP4's group kernels), `pack2_avx2` (codes straight
//! into packed words). The portable per-value code is `codec::encode_run`; the AVX2 primitives
//! they all use are `simd::x86`'s.

pub(crate) mod piece;
pub(crate) mod tile_sinks;
pub(crate) mod with_codec;

#[cfg(target_arch = "x86_64")]
pub(crate) mod lanes;

#[cfg(target_arch = "x86_64")]
pub(crate) mod fused_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod fused_narrow;
pub(crate) mod fused_tiles;
#[cfg(target_arch = "x86_64")]
pub(crate) mod nvfp4_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod nvfp4_avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod pack2_avx2;
