//! The geometry a scheme takes on a given shape: the block grid (format.md "Blocks and the scale grid") and the storage
//! packing (format.md "Stores and packing"). Every tensor-dependent rule of the scheme is checked here, once.

use crate::alloc::try_with_capacity;
use crate::error::{QuantError, Result};
use crate::scheme::{QuantScheme, QuantStore, QuantValue};

/// How values sit in storage words: burn's layout (format.md "Stores and packing" to "The byte layout").
///
/// Storage is a set of lines, each packed on its own into `words_axis` words and padded with
/// zeros: the lines run along the packed axis. Packed along the last axis, the lines are the
/// tensor's rows. Packed along an outer axis, burn stores the tensor with that axis *swapped*
/// with the last one (the axes between keep their places) and packs the rows of that; the
/// block scales are then stored in the same swapped order (see [`Layout::scale_byte_order`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packing {
    /// 8 (int8/uint8 storage) or 32 (uint32 storage).
    pub word_bits: u32,
    /// Values per word: 1 for Native and for PackedNative of anything but E2M1.
    pub per: usize,
    /// Bits of one field: 8 for Native (sign-extended ints), else the value's bits (a code is
    /// masked to them: PackedNative Q4 −1 is the byte 0x0F).
    pub field_bits: u32,
    /// The packed axis, counted from the outermost (the last axis for Native).
    pub axis: usize,
    /// Elements before, along and after the packed axis (natural order).
    pub outer: usize,
    pub n_axis: usize,
    pub inner: usize,
    /// Words per line: `ceil(n_axis / per)`.
    pub words_axis: usize,
    /// Packed along an outer axis: storage is the tensor with `axis` swapped to the last place.
    pub swapped: bool,
    /// The Native store: ints are kept as int8, not uint8 (PackedNative of 8-bit values has the
    /// same bytes, typed uint8).
    pub native: bool,
}

impl Packing {
    pub fn num_words(&self) -> usize {
        self.outer * self.words_axis * self.inner
    }
    pub fn word_bytes(&self) -> usize {
        self.word_bits as usize / 8
    }
    pub fn field_mask(&self) -> u32 {
        if self.field_bits == 32 {
            u32::MAX
        } else {
            (1u32 << self.field_bits) - 1
        }
    }
    /// Codes must be masked to their field (sub-byte ints stored one a byte).
    pub fn masks_bytes(&self) -> bool {
        self.per == 1 && self.field_bits < 8
    }
}

/// A scheme applied to a shape: grid, scales and storage sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub scheme: QuantScheme,
    /// The caller's shape (may be 0-d).
    pub shape: Vec<usize>,
    /// The shape the kernels see: a 0-d tensor is `[1]`.
    pub dims: Vec<usize>,
    pub num_elements: usize,
    /// Block extent on every axis (per-tensor: the whole tensor, at least 1 per axis).
    pub block: Vec<usize>,
    /// Scale grid shape (per-tensor: `[1]`).
    pub grid: Vec<usize>,
    pub num_scales: usize,
    pub per_tensor: bool,
    pub packing: Packing,
}

impl Layout {
    /// Check `scheme` against `shape` and work out the geometry.
    pub fn new(scheme: &QuantScheme, shape: &[usize]) -> Result<Self> {
        scheme.validate()?;
        let dims: Vec<usize> = if shape.is_empty() {
            vec![1]
        } else {
            shape.to_vec()
        };
        let rank = dims.len();
        // Also with a 0 dim: numpy refuses shapes whose other dims overflow, and so do we.
        let nonzero: Vec<usize> = dims.iter().map(|&d| d.max(1)).collect();
        checked_product(&nonzero).ok_or_else(|| {
            QuantError::Layout(format!(
                "shape {shape:?} has more elements than fit in memory"
            ))
        })?;
        let num_elements = dims.iter().product();
        let (block, grid, per_tensor) = match &scheme.block {
            None => (dims.iter().map(|&d| d.max(1)).collect(), vec![1], true),
            Some(b) => {
                let size = b.size();
                if size.len() > rank {
                    return Err(QuantError::Scheme(format!(
                        "block {size:?} has {} dimensions, more than the tensor's shape {shape:?} ({} after treating 0-d as (1,))",
                        size.len(),
                        rank
                    )));
                }
                let mut block = vec![1; rank - size.len()];
                block.extend_from_slice(size);
                // A block wider than its axis covers the axis: clamping changes no grid, no
                // block count and no result, and keeps every index product far from overflow
                // whatever size a crafted scheme carries.
                for (b, &d) in block.iter_mut().zip(&dims) {
                    *b = (*b).min(d.max(1));
                }
                let grid = dims
                    .iter()
                    .zip(&block)
                    .map(|(&d, &b)| d.div_ceil(b))
                    .collect();
                (block, grid, false)
            }
        };
        let num_scales = grid.iter().product();
        let packing = packing_for(scheme, &dims)?;
        checked_product(&[packing.num_words(), packing.word_bytes()]).ok_or_else(|| {
            QuantError::Layout(format!(
                "shape {shape:?} has more elements than fit in memory"
            ))
        })?;
        Ok(Self {
            scheme: *scheme,
            shape: shape.to_vec(),
            dims,
            num_elements,
            block,
            grid,
            num_scales,
            per_tensor,
            packing,
        })
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Length of the last axis (a "row").
    pub fn row_len(&self) -> usize {
        *self.dims.last().unwrap()
    }

    pub fn num_rows(&self) -> usize {
        if self.row_len() == 0 {
            0
        } else {
            self.num_elements / self.row_len()
        }
    }

    /// Block extent along the last axis.
    pub fn block_cols(&self) -> usize {
        *self.block.last().unwrap()
    }

    /// Grid extent along the last axis.
    pub fn grid_cols(&self) -> usize {
        *self.grid.last().unwrap()
    }

    /// True when every block is one row segment (1-D blocks, or per-tensor on a 1-D tensor): the
    /// grid row of tensor row `r` is then `r` itself.
    pub fn rows_map_directly(&self) -> bool {
        self.block[..self.rank() - 1].iter().all(|&b| b == 1)
    }

    /// Offset into the scale grid of the first block of tensor row `row`.
    pub fn grid_row_offset(&self, row: usize) -> usize {
        if self.per_tensor {
            return 0;
        }
        let gc = self.grid_cols();
        if self.rows_map_directly() {
            return row * gc;
        }
        let rank = self.rank();
        let mut rem = row;
        let mut offset = 0;
        let mut grid_stride = gc;
        for ax in (0..rank - 1).rev() {
            let i = rem % self.dims[ax];
            rem /= self.dims[ax];
            offset += (i / self.block[ax]) * grid_stride;
            grid_stride *= self.grid[ax];
        }
        offset
    }

    /// This layout with its u32 words seen as their bytes, when that changes no byte: words of
    /// four 8-bit fields (8-bit values in `PackedU32`, burn's default store for Q8S) on lines
    /// of whole words, so no padding. Little-endian words hold field k in byte k (format.md "Stores and packing"), so
    /// the words' memory is exactly the one-code-a-byte storage, and the byte kernels (one
    /// store a code) take the call instead of squeezing codes into words, 2.5 times as fast.
    pub fn bytewise(&self) -> Option<Layout> {
        let p = &self.packing;
        let whole = p.word_bits == 32 && p.field_bits == 8 && p.n_axis.is_multiple_of(p.per);
        (cfg!(target_endian = "little") && whole).then(|| Layout {
            packing: Packing {
                word_bits: 8,
                per: 1,
                words_axis: p.n_axis,
                ..p.clone()
            },
            ..self.clone()
        })
    }

    /// Storage shape (format.md "Stores and packing"): packed, the packed axis swapped to the last place (burn's
    /// order) and shrunk to `ceil(n / per)` words.
    pub fn storage_shape(&self) -> Vec<usize> {
        let p = &self.packing;
        let mut s = self.dims.clone();
        if !p.native {
            let last = s.len() - 1;
            s.swap(p.axis, last);
            s[last] = p.words_axis;
        }
        s
    }

    /// Natural offset of element `k` of storage line `line` (the inverse of burn's swapped
    /// order; for lines along the last axis this is `line * n_axis + k`).
    #[inline]
    pub fn line_element(&self, line: usize, k: usize) -> usize {
        let p = &self.packing;
        if !p.swapped {
            return line * p.n_axis + k;
        }
        // `line` runs row-major over the swapped dims but the last: the tensor's dims with the
        // packed axis holding the last axis's index.
        let (rank, a) = (self.rank(), p.axis);
        let mut rem = line;
        let mut off = k * p.inner;
        let mut stride = 1; // the natural stride of axis j: the product of the dims after it
        for j in (0..rank - 1).rev() {
            stride *= self.dims[j + 1];
            let (len, st) = if j == a {
                (self.dims[rank - 1], 1)
            } else {
                (self.dims[j], stride)
            };
            off += (rem % len) * st;
            rem /= len;
        }
        off
    }

    /// Whether burn stores the block scales in the values' swapped order (a block scheme packed
    /// along an outer axis).
    pub fn scales_swapped(&self) -> bool {
        self.packing.swapped && !self.per_tensor
    }

    /// For a block scheme packed along an outer axis, burn stores the scale grid in the values'
    /// swapped order: byte position `i` holds grid index `order[i]`. `None`: row-major.
    /// Only call it with scales in hand: it allocates one index per scale (out of memory is
    /// the one error).
    pub fn scale_byte_order(&self) -> Result<Option<Vec<usize>>> {
        if !self.scales_swapped() {
            return Ok(None);
        }
        let (rank, a) = (self.rank(), self.packing.axis);
        let mut swapped = self.grid.clone();
        swapped.swap(a, rank - 1);
        // The natural grid's strides, in swapped order: axis j of the swapped grid is natural
        // axis a or the last one swapped back.
        let mut strides = vec![0usize; rank];
        let mut s = 1;
        for j in (0..rank).rev() {
            strides[j] = s;
            s *= self.grid[j];
        }
        strides.swap(a, rank - 1);
        let mut order = try_with_capacity(self.num_scales)?;
        // idx: the swapped grid's multi-index, counted up in C order; at: its natural offset.
        let mut idx = vec![0usize; rank];
        let mut at = 0;
        for _ in 0..self.num_scales {
            order.push(at);
            for j in (0..rank).rev() {
                idx[j] += 1;
                at += strides[j];
                if idx[j] < swapped[j] {
                    break;
                }
                at -= idx[j] * strides[j];
                idx[j] = 0;
            }
        }
        Ok(Some(order))
    }

    /// Bytes of the value storage.
    pub fn storage_bytes(&self) -> usize {
        self.packing.num_words() * self.packing.word_bytes()
    }

    /// Bytes of the whole `to_bytes()` layout (format.md "The byte layout").
    pub fn total_bytes(&self) -> usize {
        self.storage_bytes()
            + self.num_scales * self.scheme.scale_dtype().size_bytes()
            + if self.scheme.is_two_level() { 4 } else { 0 }
            + self.offsets_bytes()
    }

    /// Bytes of an affine scheme's offsets, after the scales (0 without an offset).
    pub fn offsets_bytes(&self) -> usize {
        self.scheme
            .offset
            .map_or(0, |o| self.num_scales * o.size_bytes())
    }

    /// Number of elements in block `k` of the grid (partial edge blocks are smaller).
    pub fn block_count(&self, grid_index: usize) -> usize {
        if self.per_tensor {
            return self.num_elements;
        }
        let mut rem = grid_index;
        let mut count = 1;
        for ax in (0..self.rank()).rev() {
            let g = rem % self.grid[ax];
            rem /= self.grid[ax];
            let start = g * self.block[ax];
            count *= self.block[ax].min(self.dims[ax] - start);
        }
        count
    }
}

fn checked_product(xs: &[usize]) -> Option<usize> {
    let n = xs.iter().try_fold(1usize, |acc, &x| acc.checked_mul(x))?;
    // Keep byte counts of f32 data addressable too.
    n.checked_mul(4).map(|_| n)
}

fn packing_for(scheme: &QuantScheme, dims: &[usize]) -> Result<Packing> {
    let bits = scheme.value.bits();
    let rank = dims.len();
    let (word_bits, dim) = match scheme.store {
        QuantStore::Native => {
            return Ok(Packing {
                word_bits: 8,
                per: 1,
                field_bits: 8,
                axis: rank - 1,
                outer: dims[..rank - 1].iter().product(),
                n_axis: dims[rank - 1],
                inner: 1,
                words_axis: dims[rank - 1],
                swapped: false,
                native: true,
            })
        }
        QuantStore::PackedU32(d) => (32, d),
        QuantStore::PackedNative(d) => (8, d),
    };
    if dim >= rank {
        return Err(QuantError::Scheme(format!(
            "packing dim {dim} counts from the innermost axis and must be < the tensor's rank {rank}"
        )));
    }
    let axis = rank - 1 - dim;
    // PackedU32 fills a word; burn's PackedNative packs only E2M1 (two a byte) and keeps every
    // other value one a byte.
    let per = if word_bits == 32 || scheme.value == QuantValue::E2M1 {
        (word_bits / bits) as usize
    } else {
        1
    };
    Ok(Packing {
        word_bits,
        per,
        field_bits: bits,
        axis,
        outer: dims[..axis].iter().product(),
        n_axis: dims[axis],
        inner: dims[axis + 1..].iter().product(),
        words_axis: dims[axis].div_ceil(per),
        swapped: axis + 1 != rank,
        native: false,
    })
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
