//! Value links (`crate::links`): accumulated per layer, consumed by
//! `kve_select_model_linked`.

use super::{check_alias, kve_tensor, span_ptr, to_status, to_usize, tri, Buf, Tensor};
use crate::links;
use core::ffi::c_void;

/// Workspace bytes of `kve_accumulate_value_links` for `n` tokens of dimension `dv`:
/// `n` in 1 .. 2^31 and `dv >= 1` (else `KVE_ERR_INVALID_ARGUMENT`). Writes only
/// `*out_bytes`.
#[no_mangle]
pub unsafe extern "C" fn kve_value_links_workspace_size(
    n: u64,
    dv: u64,
    out_bytes: *mut u64,
) -> i32 {
    super::answer_size(out_bytes, || {
        links::value_links_workspace_size(to_usize(n)?, to_usize(dv)?)
    })
}

/// Add `sum over the Hkv heads of cos(v[h, i], v[h, i-1])` to `links[i]` for
/// `1 <= i < N` (`links[0]` untouched; a zero vector links nothing), `values`
/// `[Hkv, N, dv]` of one layer, any dtype and strides (V transposed included). Zero
/// `links` (`links_len >= N`), then call once per layer; pass the sums to
/// `kve_select_model_linked`. NaN/Inf in `values` or in `links[0..N]`, or a row whose
/// squared norm overflows f32, give `KVE_ERR_NON_FINITE`. Writes `links` and the
/// workspace; nothing on error.
#[no_mangle]
pub unsafe extern "C" fn kve_accumulate_value_links(
    values: *const kve_tensor,
    links: *mut f32,
    links_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    // SAFETY: NULL or the caller's `kve_tensor`; from_ptr checks NULL and alignment.
    let v = tri!(unsafe { Tensor::from_ptr(values) });
    let mut o = tri!(Buf::new(links, links_len));
    let mut ws = tri!(Buf::new(workspace as *const u8, workspace_bytes));
    tri!(check_alias(&[o.span, ws.span], &[v.span, span_ptr(values)]));
    // SAFETY: Tensor::from_ptr checked the tensor; check_alias: no output overlaps it.
    let vv = tri!(unsafe { v.view() });
    // SAFETY: Buf::new checked both; check_alias: they overlap no input nor each other.
    let (o, ws) = unsafe { (o.slice_mut(), ws.slice_mut()) };
    to_status(links::accumulate_value_links(&vv, o, ws))
}

/// `x <- H x` on each block of `block` consecutive floats of `x` (`len` of them), in place:
/// H the orthonormal Walsh–Hadamard matrix (`ggml_gen_hadamard`'s; symmetric, `H H = I`).
/// An engine whose quantized cache stores K (or V) rows rotated so (llama.cpp's
/// `attn_rot_k`, `attn_rot_v`) rotates the window queries (or `Wo`'s inputs) before it
/// hands them to the evictor: the scores are those of the unrotated rows. `block` a power
/// of two and `len` a multiple of it (else `KVE_ERR_INVALID_ARGUMENT`). Results are
/// bit-identical to the plain f32 butterflies scaled by `1.0f / sqrtf(block)`. Writes `x`.
#[no_mangle]
pub unsafe extern "C" fn kve_hadamard_blocks(x: *mut f32, len: u64, block: u64) -> i32 {
    let mut b = tri!(Buf::new(x, len));
    let block = tri!(to_usize(block));
    // SAFETY: Buf::new checked it; the one buffer.
    to_status(crate::rotate::hadamard_blocks(
        unsafe { b.slice_mut() },
        block,
    ))
}
