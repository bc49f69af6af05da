//! Paged KV caches (vLLM, SGLang, FlashInfer, TensorRT-LLM): a layer's K or V in a block
//! pool reached through a sequence's block table. Converts and checks only; the core is
//! `crate::paged`.
//!
//! Flow: `kve_paged_layout_init` once per pool tensor (or fill `kve_paged_layout` by hand
//! for another layout); per layer `kve_paged_gather` K and V into caller memory
//! (`kve_paged_gather_size` bytes each) and pass the returned `kve_tensor`s to
//! `kve_score_layer` (or the stream, the evictor); after the selection,
//! `kve_paged_compact` per layer and K/V with the kept lists, and release the
//! `blocks_freed` trailing table entries to the engine's block pool.

use super::{
    check_alias, kve_tensor, out_param, span_of, span_ptr, to_usize, tri, Buf, Span, KVE_OK,
};
use crate::error::{Error, Result};
use crate::paged::{self, PagedKind, PagedLayout, PagedView, PagedViewMut};
use crate::view::DType;
use core::ffi::c_void;

/// One K or V tensor of a paged pool: element (block `b`, slot `s`, head `h`, dim `c`) is
/// at `data + (offset + b*stride[0] + s*stride[1] + h*stride[2] + c*stride[3]) *
/// sizeof(dtype)`. A sequence's token `t` is in block `table[t / block_size]`, slot
/// `t % block_size`. `kve_paged_layout_init` fills it for the engines' layouts
/// (`KVE_PAGED_*`); any other layout may be described by hand.
///
/// Checked on every use: `data` non-NULL and aligned, `pad == 0`, every extent >= 1,
/// `block_size <= KVE_MAX_BLOCK_SIZE`, `heads <= KVE_MAX_HEADS`, the highest element the
/// layout reaches below `len` (`KVE_ERR_OUT_OF_BOUNDS`), no two (block, slot, head, dim)
/// sharing an element (`KVE_ERR_ALIASING`), no overflow (`KVE_ERR_OVERFLOW`). `data` is
/// written through by `kve_paged_compact` only (writable memory there, although `const`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kve_paged_layout {
    /// The pool's first element (host memory; device memory for the
    /// `kve_cuda_evictor_*_paged` calls).
    pub data: *const c_void,
    /// Elements of `dtype` available from `data`.
    pub len: u64,
    /// `KVE_DTYPE_*`.
    pub dtype: u32,
    /// Must be 0.
    pub pad: u32,
    /// Element offset of (block 0, slot 0, head 0, dim 0): picks K or V, or a layer.
    pub offset: u64,
    /// Blocks in the pool (table entries must be below it).
    pub num_blocks: u64,
    /// Token slots per block.
    pub block_size: u64,
    /// KV heads per token.
    pub heads: u64,
    /// Head dimension.
    pub dim: u64,
    /// Element strides of (block, slot, head, dim).
    pub stride: [u64; 4],
}

/// The checked pool of a `kve_paged_layout` (its table not yet: [`Pool::view`]).
pub(crate) struct Pool {
    ptr: *mut u8,
    len: usize,
    layout: PagedLayout,
    pub span: Span,
}

impl Pool {
    /// # Safety
    /// `p` is NULL or points to a `kve_paged_layout`.
    pub unsafe fn from_ptr(p: *const kve_paged_layout) -> Result<Pool> {
        // SAFETY: NULL or the caller's struct; `arg` checks NULL and alignment.
        let c = unsafe { super::arg(p)? };
        let (dtype, len) = super::data_header(c.data, c.pad, c.dtype, c.len)?;
        if dtype.is_quantized() {
            // (the layout's own check says so too; before any size is computed from it)
            return Err(Error::UnsupportedDtype);
        }
        if (c.data as usize) % dtype.size() != 0 {
            return Err(Error::Misaligned);
        }
        let span = span_of(c.data as usize, len, dtype.size())?;
        let mut stride = [0usize; 4];
        for a in 0..4 {
            stride[a] = to_usize(c.stride[a])?;
        }
        let layout = PagedLayout {
            dtype,
            offset: to_usize(c.offset)?,
            num_blocks: to_usize(c.num_blocks)?,
            block_size: to_usize(c.block_size)?,
            heads: to_usize(c.heads)?,
            dim: to_usize(c.dim)?,
            stride,
        };
        if layout.required_len()? > len {
            return Err(Error::OutOfBounds);
        }
        Ok(Pool {
            ptr: c.data as *mut u8,
            len,
            layout,
            span,
        })
    }

    /// The checked pointer, length (elements) and layout (the device evictor's pools,
    /// whose memory is not the host's).
    #[cfg(feature = "cuda")]
    pub(crate) fn parts(&self) -> (*mut u8, usize, PagedLayout) {
        (self.ptr, self.len, self.layout)
    }

    /// The sequence of `n` tokens through `table`, read-only (`scratch`: the table check).
    ///
    /// # Safety
    /// The pool's `len` elements are readable and unmodified for `'a`.
    pub unsafe fn view<'a>(
        &self,
        table: &'a [u32],
        n: usize,
        scratch: &mut [u8],
    ) -> Result<PagedView<'a>> {
        // SAFETY: the caller's contract; from_raw checks the rest.
        unsafe { PagedView::from_raw(self.ptr, self.len, self.layout, table, n, scratch) }
    }

    /// The same, writable.
    ///
    /// # Safety
    /// The pool's `len` elements are writable and not otherwise borrowed for `'a`.
    pub unsafe fn view_mut<'a>(
        &self,
        table: &'a [u32],
        n: usize,
        scratch: &mut [u8],
    ) -> Result<PagedViewMut<'a>> {
        // SAFETY: the caller's contract; from_raw checks the rest.
        unsafe { PagedViewMut::from_raw(self.ptr, self.len, self.layout, table, n, scratch) }
    }
}

pub(crate) use Pool as PagedPool;

/// Fill `*out` with the layout of one K or V tensor of an engine's pool:
/// `kind` a `KVE_PAGED_*` value, `data`/`len`/`dtype` the pool buffer (as `kve_tensor`),
/// `num_blocks`, `block_size` (tokens per block), `heads` (KV heads), `dim`.
/// `layers`/`layer` only for `KVE_PAGED_TRTLLM` (else 1 and 0); `kv` 0 (K) or 1 (V) only
/// for the stacked kinds (else 0): `KVE_ERR_INVALID_ARGUMENT` otherwise. The layout is
/// checked against the buffer as every paged call checks it; `*out` is written on success
/// only.
#[no_mangle]
pub unsafe extern "C" fn kve_paged_layout_init(
    out: *mut kve_paged_layout,
    kind: u32,
    data: *const c_void,
    len: u64,
    dtype: u32,
    num_blocks: u64,
    block_size: u64,
    heads: u64,
    dim: u64,
    layers: u64,
    layer: u64,
    kv: u32,
) -> i32 {
    let mut o = tri!(out_param(out));
    let kind = tri!(PagedKind::from_u32(kind));
    let dt = tri!(DType::from_u32(dtype));
    let l = tri!(PagedLayout::new(
        kind,
        dt,
        tri!(to_usize(num_blocks)),
        tri!(to_usize(block_size)),
        tri!(to_usize(heads)),
        tri!(to_usize(dim)),
        tri!(to_usize(layers)),
        tri!(to_usize(layer)),
        kv as usize,
    ));
    let c = kve_paged_layout {
        data,
        len,
        dtype,
        pad: 0,
        offset: l.offset as u64,
        num_blocks,
        block_size,
        heads,
        dim,
        stride: l.stride.map(|s| s as u64),
    };
    // the same checks as every use (NULL, alignment, buffer length)
    // SAFETY: `c` is a local struct.
    tri!(unsafe { Pool::from_ptr(&c) });
    // SAFETY: out_param checked `out` non-NULL and aligned.
    unsafe { o.slice_mut()[0] = c };
    KVE_OK
}

/// `*bytes = size(layout)`, a size query on a pool's layout (checked as every paged call
/// checks it); `*bytes` is written on success only.
///
/// # Safety
/// `layout` NULL or a `kve_paged_layout`; `bytes` NULL or writable.
unsafe fn layout_size(
    layout: *const kve_paged_layout,
    bytes: *mut u64,
    size: impl FnOnce(&PagedLayout) -> Result<usize>,
) -> i32 {
    // SAFETY: the caller's contract; from_ptr checks NULL, alignment and the layout.
    let p = tri!(unsafe { Pool::from_ptr(layout) });
    let mut b = tri!(out_param(bytes));
    let s = tri!(size(&p.layout));
    tri!(check_alias(&[b.span], &[span_ptr(layout)]));
    // SAFETY: out_param checked `bytes`.
    unsafe { b.slice_mut()[0] = s as u64 };
    KVE_OK
}

/// Bytes of caller memory `kve_paged_gather` needs for a sequence of `n` tokens: the
/// table check (a bitmap over the pool's blocks) and the gathered `[heads, n, dim]` tensor.
/// Writes `*bytes` on success only.
#[no_mangle]
pub unsafe extern "C" fn kve_paged_gather_size(
    layout: *const kve_paged_layout,
    n: u64,
    bytes: *mut u64,
) -> i32 {
    // SAFETY: the caller passes NULL or a `kve_paged_layout`, and `bytes`.
    unsafe {
        layout_size(layout, bytes, |l| {
            let (n, check) = (to_usize(n)?, paged::table_check_size(l)?);
            let gather = paged::gather_workspace_size(l, n)?;
            check.checked_add(gather).ok_or(Error::Overflow)
        })
    }
}

/// Gather the first `n` tokens of a sequence (block table `table`, `table_len >=
/// ceil(n / block_size)` entries; entries past the sequence are not read) into `dst`
/// (`dst_bytes >= kve_paged_gather_size`), head-major `[heads, n, dim]` in the pool's
/// dtype (raw bits), and describe it in `*out`: a `kve_tensor` (strides `{n*dim, dim,
/// 1}`) to pass as `keys`/`values` to `kve_score_layer` and every other call that reads
/// K or V. Scores are bit-identical to the same data in any strided layout.
/// Table errors: an entry `>= num_blocks` `KVE_ERR_OUT_OF_BOUNDS`, a repeated entry
/// `KVE_ERR_ALIASING`, a table shorter than the sequence `KVE_ERR_SHAPE_MISMATCH`; `n = 0`
/// `KVE_ERR_INVALID_ARGUMENT`. `dst` and `out` must not overlap the pool, the table, the
/// layout or each other. `*out` is written on success only (`dst` is scratch on error).
#[no_mangle]
pub unsafe extern "C" fn kve_paged_gather(
    layout: *const kve_paged_layout,
    table: *const u32,
    table_len: u64,
    n: u64,
    dst: *mut c_void,
    dst_bytes: u64,
    out: *mut kve_tensor,
) -> i32 {
    // SAFETY: the caller passes NULL or a `kve_paged_layout`.
    let p = tri!(unsafe { Pool::from_ptr(layout) });
    let t = tri!(Buf::new(table, table_len));
    let n = tri!(to_usize(n));
    let mut d = tri!(Buf::new(dst as *const u8, dst_bytes));
    let mut o = tri!(out_param(out));
    tri!(check_alias(
        &[d.span, o.span],
        &[p.span, t.span, span_ptr(layout)]
    ));
    let check = tri!(paged::table_check_size(&p.layout));
    // SAFETY: Buf::new checked `dst`; check_alias: it overlaps no input nor `out`.
    let ws = unsafe { d.slice_mut() };
    if ws.len() < check {
        return super::status_of(Error::WorkspaceTooSmall);
    }
    let (scratch, rest) = ws.split_at_mut(check);
    // SAFETY: Buf::new checked the table; check_alias: no output overlaps it.
    let table = unsafe { t.slice() };
    // SAFETY: Pool::from_ptr checked the pool's pointer, alignment and span; the caller
    // vouches for `len` readable elements; no output overlaps it.
    let v = tri!(unsafe { PagedView::from_raw(p.ptr, p.len, p.layout, table, n, scratch) });
    let g = tri!(paged::gather(&v, rest));
    let (start, _) = g.byte_range();
    let e = g.extent();
    let s = g.stride();
    let desc = kve_tensor {
        data: start as *const c_void,
        len: (e[0] * e[1] * e[2]) as u64,
        dtype: p.layout.dtype as u32,
        pad: 0,
        extent: e.map(|x| x as u64),
        stride: s.map(|x| x as u64),
    };
    // SAFETY: out_param checked `out`; check_alias: it overlaps no input nor `dst`.
    unsafe { o.slice_mut()[0] = desc };
    KVE_OK
}

/// Workspace bytes of `kve_paged_compact` (the table check: a bitmap over the blocks).
#[no_mangle]
pub unsafe extern "C" fn kve_paged_compact_workspace_size(
    layout: *const kve_paged_layout,
    bytes: *mut u64,
) -> i32 {
    // SAFETY: the caller passes NULL or a `kve_paged_layout`, and `bytes`.
    unsafe { layout_size(layout, bytes, paged::compact_paged_workspace_size) }
}

/// Block-aligned compaction in place: the sequence's kept tokens move to the front of its
/// own blocks (tokens `0 .. count`, order kept), so its table entries
/// `table[ceil(max count / block_size) .. ceil(n / block_size)]` hold nothing any more:
/// `*blocks_freed` of them, for the engine's block manager to release.
///
/// Kept lists as `kve_compact_in_place`'s (ascending, `< n`, offsets absolute into
/// `indices`): `offsets_len = heads + 1` (one list per head: `kve_select_model`'s
/// `offsets + l*hkv`), or `offsets_len = 2`: one list for every head (token granularity,
/// the one that frees blocks where a block holds every head). `positions` (NULL with 0, or
/// `n` entries: the tokens' original positions; NULL means token `i` is at position `i`)
/// and `kept_positions` (NULL with 0, or as many entries as the lists hold: receives the
/// kept tokens' positions in list order, for RoPE/position bookkeeping); `lengths` (NULL
/// with 0, or `heads` entries: the new lengths). Call it for K and V of every layer with
/// the same lists. Everything is checked before the first byte moves; on error nothing is
/// written (pool, outputs, `*blocks_freed`).
#[no_mangle]
pub unsafe extern "C" fn kve_paged_compact(
    layout: *const kve_paged_layout,
    table: *const u32,
    table_len: u64,
    n: u64,
    offsets: *const u64,
    offsets_len: u64,
    indices: *const u32,
    indices_len: u64,
    positions: *const u32,
    positions_len: u64,
    kept_positions: *mut u32,
    kept_positions_len: u64,
    lengths: *mut u32,
    lengths_len: u64,
    blocks_freed: *mut u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    // SAFETY: the caller passes NULL or a `kve_paged_layout`.
    let p = tri!(unsafe { Pool::from_ptr(layout) });
    let t = tri!(Buf::new(table, table_len));
    let n = tri!(to_usize(n));
    let o = tri!(Buf::new(offsets, offsets_len));
    let i = tri!(Buf::new(indices, indices_len));
    let pos = tri!(Buf::new(positions, positions_len));
    let mut kp = tri!(Buf::new(kept_positions as *const u32, kept_positions_len));
    let mut ln = tri!(Buf::new(lengths as *const u32, lengths_len));
    let mut bf = tri!(out_param(blocks_freed));
    let mut ws = tri!(Buf::new(workspace as *const u8, workspace_bytes));
    tri!(check_alias(
        &[p.span, kp.span, ln.span, bf.span, ws.span],
        &[t.span, o.span, i.span, pos.span, span_ptr(layout)]
    ));
    // SAFETY: Buf::new checked the inputs; check_alias: no output overlaps them.
    let (table, offs, idx) = unsafe { (t.slice(), o.slice(), i.slice()) };
    // SAFETY: as above.
    let positions = (!positions.is_null()).then(|| unsafe { pos.slice() });
    // SAFETY: Buf::new checked the workspace; check_alias: it overlaps nothing else.
    let scratch = unsafe { ws.slice_mut() };
    // SAFETY: Pool::from_ptr checked the pool; the caller vouches for `len` writable
    // elements; check_alias: no other argument overlaps it.
    let mut v = tri!(unsafe { PagedViewMut::from_raw(p.ptr, p.len, p.layout, table, n, scratch) });
    // SAFETY: Buf::new checked the outputs; check_alias: they overlap nothing else.
    let kept = (!kept_positions.is_null()).then(|| unsafe { kp.slice_mut() });
    // SAFETY: as above.
    let lens = (!lengths.is_null()).then(|| unsafe { ln.slice_mut() });
    let r = tri!(paged::compact_paged(
        &mut v, offs, idx, positions, kept, lens
    ));
    // SAFETY: out_param checked `blocks_freed`; it overlaps no other argument.
    unsafe { bf.slice_mut()[0] = r.blocks_freed as u64 };
    KVE_OK
}
