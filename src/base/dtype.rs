//! Element types of the caller's tensors and their conversion to f32 (f16 8 at a time,
//! with F16C where the CPU has it).

use crate::numerics::dispatch;

crate::config::c_enum! {
    /// Element type of a view.
    DType => "KVE_DTYPE_" { F32 = 0 => "F32", F16 = 1 => "F16", BF16 = 2 => "BF16" }
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }
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
