//! Element types of the caller's tensors and their conversion to f32 (f16 8 at a time,
//! with F16C where the CPU has it), including ggml's block-quantized `q8_0` and `q4_0`
//! (dequantized as ggml does: the block's f16 scale to f32, times the integer).
//!
//! A tensor of a block type is addressed in values, as every other: `len`, extents and
//! strides count values; value `e` lies in block `e / 32`, at byte `(e / 32) ·
//! block_bytes` of the buffer. Views of such a type have whole-block rows (row length and
//! outer strides multiples of 32, unit value stride), checked at construction (`view`).

use crate::numerics::dispatch;

crate::config::c_enum! {
    /// Element type of a view.
    #[allow(non_camel_case_types)]
    DType => "KVE_DTYPE_" {
        F32 = 0 => "F32",
        F16 = 1 => "F16",
        BF16 = 2 => "BF16",
        /// ggml's `block_q8_0`: 32 values per 34-byte block `{f16 d; i8 qs[32]}`,
        /// value `i` = `d · qs[i]`.
        Q8_0 = 3 => "Q8_0",
        /// ggml's `block_q4_0`: 32 values per 18-byte block `{f16 d; u8 qs[16]}`, value
        /// `j` = `d · ((qs[j] & 0xF) − 8)` and value `j + 16` = `d · ((qs[j] >> 4) − 8)`
        /// for `j < 16`.
        Q4_0 = 4 => "Q4_0",
    }
}

/// Values per block of the block-quantized dtypes (ggml's `QK8_0` and `QK4_0`).
pub const QK: usize = 32;

impl DType {
    /// Bytes per element of `F32`, `F16` and `BF16`. A block type has no whole number of
    /// bytes per value: for `Q8_0` and `Q4_0` this is 2, the size (and alignment) of
    /// their f16 scale; their byte sizes come from [`DType::bytes`].
    pub const fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 | DType::Q8_0 | DType::Q4_0 => 2,
        }
    }
    /// Alignment a pointer to this dtype must have (a block type: its f16 scale's).
    pub const fn align(self) -> usize {
        self.size()
    }
    /// Values per block: 1, or [`QK`] for the block-quantized dtypes.
    pub const fn block_len(self) -> usize {
        if self.is_quantized() {
            QK
        } else {
            1
        }
    }
    /// Bytes per block (of [`DType::block_len`] values).
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::Q8_0 => 2 + QK,
            DType::Q4_0 => 2 + QK / 2,
            _ => self.size(),
        }
    }
    /// `Q8_0` or `Q4_0`: a view of it moves and loads whole blocks.
    pub const fn is_quantized(self) -> bool {
        matches!(self, DType::Q8_0 | DType::Q4_0)
    }
    /// Byte offset of value `e` (for a block type, of the block holding it), which is also
    /// the bytes of `e` values when `e` is whole blocks; `None` on overflow.
    pub const fn bytes(self, e: usize) -> Option<usize> {
        (e / self.block_len()).checked_mul(self.block_bytes())
    }
}

/// The f32 scale of a ggml block: its first two bytes, f16 little-endian.
#[inline(always)]
fn block_scale(b: &[u8]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// Value `j` (< 32) of the ggml block `b` of `dtype` (`Q8_0` or `Q4_0`), as
/// `dequantize_row_q8_0` / `dequantize_row_q4_0` compute it.
#[inline(always)]
pub(crate) fn block_value(dtype: DType, b: &[u8], j: usize) -> f32 {
    let d = block_scale(b);
    let q = if dtype == DType::Q8_0 {
        b[2 + j] as i8 as i32
    } else {
        let x = b[2 + j % 16];
        (if j < 16 { x & 0xF } else { x >> 4 }) as i32 - 8
    };
    q as f32 * d
}

/// `out[i]` = value `i` of the ggml blocks `src` of `dtype` (`Q8_0` or `Q4_0`;
/// `out.len()` a multiple of 32, `src` that many values' blocks), bit-identical to ggml's
/// `dequantize_row_q8_0` / `dequantize_row_q4_0` (the int → f32 conversions are exact and
/// each value is one f32 product, whatever the build vectorises them to).
#[inline]
pub(crate) fn dequantize(dtype: DType, src: &[u8], out: &mut [f32]) {
    // compiled for AVX2 where the CPU has it, so the loops vectorise: every key row of a
    // Llama-3-8B layer at N = 8192 loads in 3.9 ms (q8_0) and 2.4 ms (q4_0) instead of 13.1
    // and 17.8 (f16: 1.6; examples/bench_quantized.rs, AVX-512 machine)
    dispatch!(fn(dtype: DType, src: &[u8], out: &mut [f32]) -> (), S => {
        let bb = dtype.block_bytes();
        for (b, o) in src.chunks_exact(bb).zip(out.chunks_exact_mut(QK)) {
            let d = block_scale(b);
            let o: &mut [f32; QK] = o.try_into().unwrap_or_else(|_| unreachable!());
            if dtype == DType::Q8_0 {
                let q: &[u8; QK] = b[2..].try_into().unwrap_or_else(|_| unreachable!());
                for (o, &q) in o.iter_mut().zip(q) {
                    *o = (q as i8) as f32 * d;
                }
            } else {
                let q: &[u8; QK / 2] = b[2..].try_into().unwrap_or_else(|_| unreachable!());
                let (lo, hi) = o.split_at_mut(QK / 2);
                for ((l, h), &q) in lo.iter_mut().zip(hi).zip(q) {
                    *l = ((q & 0xF) as i32 - 8) as f32 * d;
                    *h = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
    })
}

/// `out[i] = f32(src[i])` for IEEE binary16 bits `src`, 8 at a time (F16C where the CPU
/// has it); bit-identical to `half::f16::to_f32` (NaN payloads included).
#[inline]
pub(crate) fn f16_to_f32(src: &[u16], out: &mut [f32]) {
    dispatch!(fn(src: &[u16], out: &mut [f32]) -> (), S => {
        let n = src.len().min(out.len());
        let (src, out) = (&src[..n], &mut out[..n]);
        let n8 = n / 8 * 8;
        let mut c = 0;
        while c < n8 {
            // SAFETY: c + 8 <= n8 <= n, the length of both slices.
            unsafe { S::store(out.as_mut_ptr().add(c), S::load_f16(src.as_ptr().add(c))) };
            c += 8;
        }
        for c in n8..n {
            out[c] = half::f16::from_bits(src[c]).to_f32();
        }
    })
}

/// `out[i] = f32(src[i])` for bfloat16 bits `src`, branch-free (vectorises); bit-identical
/// to `half::bf16::to_f32` (which sets the quiet bit of a NaN).
#[inline]
pub(crate) fn bf16_to_f32(src: &[u16], out: &mut [f32]) {
    for (o, &b) in out.iter_mut().zip(src) {
        let nan = ((b & 0x7FFF) > 0x7F80) as u32;
        *o = f32::from_bits((b as u32 | nan << 6) << 16);
    }
}
