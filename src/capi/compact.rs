//! Compaction (design §5): move the kept K/V rows of one layer, order kept, positions
//! untouched.
//!
//! A layer's selection is the slice of `kve_select_model`'s output for that layer:
//! `offsets + l*hkv` with `offsets_len = hkv + 1` (absolute positions into the whole
//! `indices` array, which is passed as is). For llama.cpp-style token rows shared by
//! every head, view the rows as one head (`extent = {1, N, Hkv*d}`) and pass one unit's
//! offsets (`offsets_len = 2`).

use super::{check_alias, kve_tensor, span_ptr, to_status, tri, Buf, Tensor};

/// Head-major compaction in place: for every head `h` of `kv` (`[H, N, d]`, any strides
/// whose rows do not overlap — else `KVE_ERR_ALIASING`), the kept rows move to tokens
/// `0 .. count_h` in order; the rest of the head is left as it was. `offsets[0..=H]` and
/// `indices` describe the kept lists (ascending, `< N`, else
/// `KVE_ERR_INVALID_ARGUMENT`): head `h` keeps `indices[offsets[h] .. offsets[h+1]]`,
/// the offsets absolute into the whole `indices` array — pass `kve_select_model`'s
/// `offsets + l*hkv` (`offsets_len = hkv + 1`) with its whole `indices` for layer `l`.
/// `lengths` (may be NULL with `lengths_len = 0`) receives the new per-head lengths
/// `count_h` (`H` entries). Writes through `kv->data` (which must be writable although
/// `kve_tensor.data` is `const void*`) and `lengths`; every list is validated before the
/// first byte moves.
#[no_mangle]
pub unsafe extern "C" fn kve_compact_in_place(
    kv: *const kve_tensor,
    offsets: *const u64,
    offsets_len: u64,
    indices: *const u32,
    indices_len: u64,
    lengths: *mut u32,
    lengths_len: u64,
) -> i32 {
    // SAFETY: the caller passes NULL or a `kve_tensor`; from_ptr checks NULL and alignment.
    let t = tri!(unsafe { Tensor::from_ptr(kv) });
    let o = tri!(Buf::new(offsets, offsets_len));
    let i = tri!(Buf::new(indices, indices_len));
    let mut l = if lengths.is_null() && lengths_len == 0 {
        None
    } else {
        Some(tri!(Buf::new(lengths, lengths_len)))
    };
    let lspan = l.as_ref().map_or(super::Span::EMPTY, |b| b.span);
    tri!(check_alias(
        &[t.span, lspan],
        &[o.span, i.span, span_ptr(kv)]
    ));
    // SAFETY: Tensor::new checked kv's buffer; check_alias: no list overlaps it.
    let mut view = tri!(unsafe { t.view_mut() });
    // SAFETY: Buf::new checked the lists; check_alias: neither overlaps an output.
    let (offs, idx) = unsafe { (o.slice(), i.slice()) };
    // SAFETY: Buf::new checked `lengths`; check_alias: it overlaps no input nor kv.
    let lengths = l.as_mut().map(|b| unsafe { b.slice_mut() });
    to_status(crate::compact::compact_in_place(
        &mut view, offs, idx, lengths,
    ))
}

/// Flattened varlen compaction, out of place: the kept rows of every head of `src`
/// (`[H, N, d]`), head after head, into rows `0 ..` of `dst` (a tensor of the same dtype
/// and `d`, `extent = {1, capacity, d}`, rows not overlapping), and
/// `cu_seqlens[0..=H]` (int32, flash-attention varlen layout: head `h` owns rows
/// `cu_seqlens[h] .. cu_seqlens[h+1]`). `offsets` and `indices` as in
/// `kve_compact_in_place` (offsets absolute into the whole `indices` array). `dst` must
/// not overlap `src` or the lists. Writes through `dst->data` (writable memory, although
/// `kve_tensor.data` is `const void*`) and `cu_seqlens`.
#[no_mangle]
pub unsafe extern "C" fn kve_compact_varlen(
    src: *const kve_tensor,
    offsets: *const u64,
    offsets_len: u64,
    indices: *const u32,
    indices_len: u64,
    dst: *const kve_tensor,
    cu_seqlens: *mut i32,
    cu_seqlens_len: u64,
) -> i32 {
    // SAFETY: the caller passes NULL or `kve_tensor`s; from_ptr checks NULL and alignment.
    let s = tri!(unsafe { Tensor::from_ptr(src) });
    // SAFETY: the caller passes NULL or a `kve_tensor`; from_ptr checks NULL and alignment.
    let d = tri!(unsafe { Tensor::from_ptr(dst) });
    let o = tri!(Buf::new(offsets, offsets_len));
    let i = tri!(Buf::new(indices, indices_len));
    let mut cu = tri!(Buf::new(cu_seqlens, cu_seqlens_len));
    tri!(check_alias(
        &[d.span, cu.span],
        &[s.span, o.span, i.span, span_ptr(src), span_ptr(dst)]
    ));
    // SAFETY: Tensor::new checked src's buffer; check_alias: no output overlaps it.
    let sv = tri!(unsafe { s.view() });
    // SAFETY: Tensor::new checked dst's buffer; check_alias: it overlaps no input nor cu_seqlens.
    let mut dv = tri!(unsafe { d.view_mut() });
    // SAFETY: Buf::new checked the lists; check_alias: no output overlaps them.
    let (offs, idx) = unsafe { (o.slice(), i.slice()) };
    // SAFETY: Buf::new checked cu_seqlens; check_alias: it overlaps no input nor dst.
    let cu = unsafe { cu.slice_mut() };
    to_status(crate::compact::compact_varlen(&sv, offs, idx, &mut dv, cu))
}
