//! The orthonormal Walsh–Hadamard rotation in blocks: the rotation a quantizing engine may
//! store its K and V rows with (llama.cpp's `attn_rot_k`/`attn_rot_v`, `ggml_gen_hadamard`)
//! so that outliers spread before quantization. An evictor scoring such rows rotates what
//! it brings from outside the cache the same way: the window queries (`q·k = (Hq)·(Hk)`,
//! H orthonormal) and `Wo`'s inputs (`v Wo = (Hv)(H Wo)`, H symmetric).

use crate::error::{Error, Result};

/// `x <- H x` on each block of `block` consecutive values of `x` (H the `block × block`
/// Sylvester–Hadamard matrix scaled by `1/sqrt(block)`: symmetric, `H H = I`), in place.
/// `block` a power of two, `x.len()` a multiple of it; else `InvalidArgument` with `x`
/// untouched. The butterflies run in f32 in the order llama.cpp's CPU path uses, and the
/// scale is `1.0f / sqrtf(block)` exactly (computed without `sqrt`: core has none).
pub fn hadamard_blocks(x: &mut [f32], block: usize) -> Result<()> {
    if !block.is_power_of_two() || x.len() % block != 0 {
        return Err(Error::InvalidArgument);
    }
    let k = block.trailing_zeros();
    // sqrtf(2^k) is 2^(k/2) for even k, else the f32 of sqrt(2) times 2^((k-1)/2): both
    // exact in f32 (a power of two scales without rounding), so this is 1/sqrtf(block)
    let root = match k % 2 {
        0 => (1u64 << (k / 2)) as f32,
        _ => core::f32::consts::SQRT_2 * (1u64 << (k / 2)) as f32,
    };
    let scale = 1.0f32 / root;
    for b in x.chunks_exact_mut(block) {
        let mut h = 1;
        while h < block {
            for i in (0..block).step_by(2 * h) {
                for j in i..i + h {
                    let (u, v) = (b[j], b[j + h]);
                    b[j] = u + v;
                    b[j + h] = u - v;
                }
            }
            h *= 2;
        }
        for v in b.iter_mut() {
            *v *= scale;
        }
    }
    Ok(())
}
