//! Paged KV caches (issue 30): a layer's K or V reached through a block table, as vLLM,
//! SGLang, FlashInfer and TensorRT-LLM keep them.
//!
//! A pool holds `num_blocks` blocks of `block_size` token slots; a slot holds every KV head
//! of one token. A sequence's token `t` lives in block `table[t / block_size]`, slot
//! `t % block_size`. One descriptor, [`PagedLayout`] (a base offset and four element
//! strides: block, slot, head, dim), covers the engines' layouts ([`PagedKind`]).
//!
//! Design (why each piece is as it is):
//! - The scorers read strided [`View`]s and are not touched: a paged K or V is *gathered*
//!   per layer into caller memory (`[H, n, d]`, same dtype, raw bits) and scored as a
//!   strided view. Scores, selections and compactions are then bit-identical to the
//!   contiguous path by construction (tests/paged.rs checks it for every scorer anyway).
//!   The gather costs one read and one write of the layer's K/V; one layer at a time, so
//!   the memory is one layer's worth, reused.
//! - Compaction ([`compact_paged`]) works on the pool in place: kept tokens move to the
//!   front of the sequence's own blocks, order kept, so the trailing blocks
//!   (`table[ceil(kept / bs) ..]`) hold nothing and the engine's block manager can free
//!   them. The kept tokens' original positions are reported (an engine that applies RoPE
//!   by position must keep feeding positions from the original numbering).
//! - Every table entry a sequence uses is checked before anything is read or written:
//!   out of the pool (`OutOfBounds`), repeated (`Aliasing`: two tokens would share
//!   memory), a table shorter than the sequence (`ShapeMismatch`). Repeats are found with a
//!   bitmap of `ceil(num_blocks / 8)` bytes in the caller's workspace (no allocation; linear
//!   time).
//! - Table entries are `u32` (engines keep `int32` block ids; a `-1` padding entry read as
//!   `u32` is out of range, so it is refused, not followed). Entries past the sequence's
//!   last block are never read.

use crate::compact::validate_selection;
use crate::error::{add, mul, Error, Result};
use crate::view::{layout_overlaps, DType, View};
use crate::workspace::{Workspace, WorkspaceSize};
use core::marker::PhantomData;

/// Largest block (page) size accepted. Engines use 1..=1024 (vLLM 16 by default, larger
/// for hybrid models; TensorRT-LLM powers of two; FlashInfer any page size).
pub const MAX_BLOCK_SIZE: usize = 1 << 16;

/// The engines' pool layouts. `H` KV heads, `d` head dim, `bs` tokens per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum PagedKind {
    /// `[num_blocks, bs, H, d]`, K and V in separate tensors: vLLM's FlashAttention and
    /// FlashInfer NHD caches viewed per K or V, SGLang's per-layer `k_buffer`/`v_buffer`
    /// (`bs = 1`, token slots).
    Nhd = 0,
    /// `[num_blocks, 2, bs, H, d]`: K and V stacked inside each block (FlashInfer's NHD
    /// `paged_kv_cache`, vLLM's FlashInfer backend). `kv` picks K (0) or V (1).
    NhdKvInner = 1,
    /// `[2, num_blocks, bs, H, d]`: K and V outermost (vLLM's FlashAttention backend's
    /// per-layer `kv_cache`).
    NhdKvOuter = 2,
    /// `[num_blocks, H, bs, d]`, K and V separate (FlashInfer HND).
    Hnd = 3,
    /// `[num_blocks, 2, H, bs, d]` (FlashInfer HND `paged_kv_cache`, K/V stacked).
    HndKvInner = 4,
    /// `[num_blocks, layers, 2, H, bs, d]`: TensorRT-LLM's pool, every layer of a block
    /// in the block, HND inside; `layer` and `kv` pick the tensor.
    TrtLlm = 5,
}

impl PagedKind {
    pub const fn from_u32(v: u32) -> Result<PagedKind> {
        Ok(match v {
            0 => PagedKind::Nhd,
            1 => PagedKind::NhdKvInner,
            2 => PagedKind::NhdKvOuter,
            3 => PagedKind::Hnd,
            4 => PagedKind::HndKvInner,
            5 => PagedKind::TrtLlm,
            _ => return Err(Error::BadEnum),
        })
    }
}

/// One K or V tensor of a paged pool: element (block `b`, slot `s`, head `h`, dim `c`) is
/// at `offset + b*stride[0] + s*stride[1] + h*stride[2] + c*stride[3]` (elements of
/// `dtype` from the pool's first element).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedLayout {
    pub dtype: DType,
    pub offset: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub heads: usize,
    pub dim: usize,
    /// Element strides of (block, slot, head, dim).
    pub stride: [usize; 4],
}

impl PagedLayout {
    /// The layout of an engine's pool. `layers`/`layer` only for [`PagedKind::TrtLlm`]
    /// (else `layers = 1`, `layer = 0`); `kv` (0 = K, 1 = V) only for the stacked kinds
    /// (else 0). Checked as [`PagedLayout::validate`] checks (without a buffer length).
    pub fn new(
        kind: PagedKind,
        dtype: DType,
        num_blocks: usize,
        block_size: usize,
        heads: usize,
        dim: usize,
        layers: usize,
        layer: usize,
        kv: usize,
    ) -> Result<PagedLayout> {
        let stacked = matches!(
            kind,
            PagedKind::NhdKvInner
                | PagedKind::NhdKvOuter
                | PagedKind::HndKvInner
                | PagedKind::TrtLlm
        );
        let layered = kind == PagedKind::TrtLlm;
        if kv > 1 || (!stacked && kv != 0) || layer >= layers || (!layered && layers != 1) {
            return Err(Error::InvalidArgument);
        }
        // one token's heads (NHD) or one head's tokens (HND), then the whole block
        let tile = mul(mul(block_size, heads)?, dim)?;
        let nhd = [heads.checked_mul(dim).ok_or(Error::Overflow)?, dim, 1];
        let hnd = [dim, mul(block_size, dim)?, 1];
        let (offset, block, [slot, head, c]) = match kind {
            PagedKind::Nhd => (0, tile, nhd),
            PagedKind::NhdKvInner => (mul(kv, tile)?, mul(2, tile)?, nhd),
            PagedKind::NhdKvOuter => (mul(mul(kv, num_blocks)?, tile)?, tile, nhd),
            PagedKind::Hnd => (0, tile, hnd),
            PagedKind::HndKvInner => (mul(kv, tile)?, mul(2, tile)?, hnd),
            PagedKind::TrtLlm => (
                mul(add(mul(layer, 2)?, kv)?, tile)?,
                mul(mul(layers, 2)?, tile)?,
                hnd,
            ),
        };
        let l = PagedLayout {
            dtype,
            offset,
            num_blocks,
            block_size,
            heads,
            dim,
            stride: [block, slot, head, c],
        };
        l.required_len()?;
        Ok(l)
    }

    fn extent(&self) -> [usize; 4] {
        [self.num_blocks, self.block_size, self.heads, self.dim]
    }

    /// Elements of `dtype` the pool buffer must hold: one past the highest element the
    /// layout reaches. Checks the dimensions (each ≥ 1, `block_size <= MAX_BLOCK_SIZE`,
    /// `heads <= 65536`: `InvalidArgument`), overflow, and that no two (block, slot, head,
    /// dim) share an element (`Aliasing`). Pools of a block-quantized dtype (`Q8_0`,
    /// `Q4_0`) are not supported (`UnsupportedDtype`).
    pub fn required_len(&self) -> Result<usize> {
        let e = self.extent();
        if self.dtype.is_quantized() {
            return Err(Error::UnsupportedDtype);
        }
        if e.contains(&0)
            || self.block_size > MAX_BLOCK_SIZE
            || self.heads > crate::score::MAX_HEADS
        {
            return Err(Error::InvalidArgument);
        }
        let mut last = self.offset;
        for a in 0..4 {
            last = add(last, mul(e[a] - 1, self.stride[a])?)?;
        }
        if layout_overlaps(e, self.stride) {
            return Err(Error::Aliasing);
        }
        mul(add(last, 1)?, self.dtype.size())?;
        add(last, 1)
    }

    /// Blocks a sequence of `n` tokens occupies: `ceil(n / block_size)`.
    pub fn blocks_for(&self, n: usize) -> usize {
        n.div_ceil(self.block_size)
    }
}

/// Bytes of the table check (a bitmap over the pool's blocks).
fn bitmap_bytes(num_blocks: usize) -> usize {
    num_blocks.div_ceil(8)
}

/// Workspace bytes the table check of a pool of `num_blocks` blocks needs (the part of
/// [`gather_workspace_size`] and [`compact_paged_workspace_size`] that finds repeats).
pub fn table_check_size(layout: &PagedLayout) -> Result<usize> {
    layout.required_len()?;
    let mut ws = WorkspaceSize::new();
    ws.add::<u8>(bitmap_bytes(layout.num_blocks))?;
    Ok(ws.total())
}

/// Workspace bytes the table check of a sequence of `n` tokens needs at least: the
/// bitmap ([`table_check_size`]) or, when smaller, a sorted copy of the sequence's
/// `ceil(n / block_size)` table entries (8 bytes each). Any scratch of this size (or
/// more) checks the table; a larger pool does not grow it (what a context sized once per
/// model, the evictor's, relies on).
pub fn table_check_size_for(layout: &PagedLayout, n: usize) -> Result<usize> {
    let bitmap = table_check_size(layout)?;
    let mut ws = WorkspaceSize::new();
    ws.add::<u64>(layout.blocks_for(n))?;
    Ok(bitmap.min(ws.total()))
}

/// Check the table entries a sequence of `n` tokens uses: enough of them, each inside the
/// pool, none repeated; the first entry in table order that is out of the pool
/// (`OutOfBounds`) or repeats an earlier one (`Aliasing`) decides. `scratch` holds the
/// bitmap, or (when it is too short for one) a sorted copy of the entries. (Public for the
/// device forms, which check a host table before uploading it.)
pub fn check_table(
    layout: &PagedLayout,
    table: &[u32],
    n: usize,
    scratch: &mut [u8],
) -> Result<()> {
    if n == 0 {
        return Err(Error::InvalidArgument);
    }
    if n > crate::error::MAX_TOKENS {
        return Err(Error::Overflow);
    }
    let used = layout.blocks_for(n);
    if table.len() < used {
        return Err(Error::ShapeMismatch);
    }
    if scratch.len() < table_check_size_for(layout, n)? {
        return Err(Error::WorkspaceTooSmall);
    }
    let table = &table[..used];
    let nb = layout.num_blocks;
    let first_out = table.iter().position(|&b| b as usize >= nb);
    if scratch.len() < table_check_size(layout)? {
        // (entry, index) sorted: a repeat is a neighbour; the first repeat in table
        // order is the smallest second index of an equal run
        let sorted = Workspace::new(scratch).take_dirty::<u64>(used)?;
        for (i, (s, &b)) in sorted.iter_mut().zip(table).enumerate() {
            *s = (b as u64) << 32 | i as u64;
        }
        sorted.sort_unstable();
        let first_repeat = sorted
            .windows(2)
            .filter(|w| w[0] >> 32 == w[1] >> 32 && ((w[0] >> 32) as usize) < nb)
            .map(|w| (w[1] & 0xffff_ffff) as usize)
            .min();
        return match (first_out, first_repeat) {
            (Some(o), Some(r)) if r < o => Err(Error::Aliasing),
            (Some(_), _) => Err(Error::OutOfBounds),
            (None, Some(_)) => Err(Error::Aliasing),
            (None, None) => Ok(()),
        };
    }
    let seen = Workspace::new(scratch).take::<u8>(bitmap_bytes(nb))?;
    for &b in table {
        let b = b as usize;
        if b >= nb {
            return Err(Error::OutOfBounds);
        }
        let (byte, bit) = (b / 8, 1u8 << (b % 8));
        if seen[byte] & bit != 0 {
            return Err(Error::Aliasing);
        }
        seen[byte] |= bit;
    }
    Ok(())
}

/// The checked parts shared by the read and the write view.
#[derive(Clone, Copy, Debug)]
struct Pool<'a> {
    ptr: *mut u8,
    layout: PagedLayout,
    table: &'a [u32],
    n: usize,
}

impl<'a> Pool<'a> {
    /// # Safety
    /// `ptr` points to `len` elements of `layout.dtype` valid for `'a`.
    unsafe fn new(
        ptr: *mut u8,
        len: usize,
        layout: PagedLayout,
        table: &'a [u32],
        n: usize,
        scratch: &mut [u8],
    ) -> Result<Pool<'a>> {
        if ptr.is_null() {
            return Err(Error::NullPointer);
        }
        if ptr as usize % layout.dtype.size() != 0 {
            return Err(Error::Misaligned);
        }
        mul(len, layout.dtype.size())?;
        if layout.required_len()? > len {
            return Err(Error::OutOfBounds);
        }
        check_table(&layout, table, n, scratch)?;
        Ok(Pool {
            ptr,
            layout,
            table,
            n,
        })
    }

    /// Element offset of (token `t`, head `h`, dim 0).
    #[inline(always)]
    fn row(&self, t: usize, h: usize) -> usize {
        let l = &self.layout;
        let bs = l.block_size;
        l.offset
            + self.table[t / bs] as usize * l.stride[0]
            + (t % bs) * l.stride[1]
            + h * l.stride[2]
    }

    /// Copy `dim` elements (raw bits) from element `from` (stride `sf`) of `src` to
    /// element `to` (stride `st`) of `dst`.
    ///
    /// # Safety
    /// Both rows lie inside their buffers; they are the same row or do not overlap.
    #[inline(always)]
    unsafe fn copy_row(
        src: *const u8,
        from: usize,
        sf: usize,
        dst: *mut u8,
        to: usize,
        st: usize,
        dim: usize,
        es: usize,
    ) {
        // SAFETY: the caller's contract: both rows are in bounds and do not overlap.
        unsafe {
            if sf == 1 && st == 1 {
                core::ptr::copy(src.add(from * es), dst.add(to * es), dim * es);
            } else {
                for c in 0..dim {
                    core::ptr::copy_nonoverlapping(
                        src.add((from + c * sf) * es),
                        dst.add((to + c * st) * es),
                        es,
                    );
                }
            }
        }
    }
}

/// The element types a pool can hold from a typed slice (`f32`, `half::f16`, `half::bf16`).
pub trait PoolElement: sealed::Sealed {
    const DTYPE: DType;
}
mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}
impl PoolElement for f32 {
    const DTYPE: DType = DType::F32;
}
impl PoolElement for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl PoolElement for half::bf16 {
    const DTYPE: DType = DType::BF16;
}

/// `layout.dtype` must be the slice's (`ShapeMismatch`).
fn typed<T: PoolElement>(layout: &PagedLayout) -> Result<()> {
    if layout.dtype != T::DTYPE {
        return Err(Error::ShapeMismatch);
    }
    Ok(())
}

/// `from_raw` and `new` of [`PagedView`] (`*const u8`, `&'a [T]`, `as_ptr`) and of
/// [`PagedViewMut`] (`*mut u8`, `&'a mut [T]`, `as_mut_ptr`): `Pool::new` checks the pool,
/// `new` a typed slice's element type against the layout's dtype.
macro_rules! paged_constructors {
    ($(#[$doc:meta])* $ptr:ty, $slice:ty, $as_ptr:ident) => {
        $(#[$doc])*
        pub unsafe fn from_raw(
            ptr: $ptr,
            len: usize,
            layout: PagedLayout,
            table: &'a [u32],
            n: usize,
            scratch: &mut [u8],
        ) -> Result<Self> {
            Ok(Self {
                // SAFETY: the caller's contract; `Pool::new` checks everything else.
                pool: unsafe { Pool::new(ptr as *mut u8, len, layout, table, n, scratch)? },
                _life: PhantomData,
            })
        }
        /// Over a typed slice (`f32`, `f16`, `bf16`: the layout's dtype).
        pub fn new<T: PoolElement>(
            data: $slice,
            layout: PagedLayout,
            table: &'a [u32],
            n: usize,
            scratch: &mut [u8],
        ) -> Result<Self> {
            typed::<T>(&layout)?;
            let (ptr, len) = (data.$as_ptr() as $ptr, data.len());
            // SAFETY: a borrowed slice is valid for its length and lifetime (exclusively, for
            // a mutable one).
            unsafe { Self::from_raw(ptr, len, layout, table, n, scratch) }
        }
    };
}

/// A sequence's K or V in a paged pool, read-only. Construction checks the layout against
/// the buffer and the table entries the sequence uses (`scratch`: [`table_check_size`]
/// bytes, or [`table_check_size_for`] the sequence), so every access stays inside the pool.
#[derive(Clone, Copy, Debug)]
pub struct PagedView<'a> {
    pool: Pool<'a>,
    _life: PhantomData<&'a [u8]>,
}

impl<'a> PagedView<'a> {
    paged_constructors!(
        /// # Safety
        /// `ptr` points to `len` readable elements of `layout.dtype`, unmodified for `'a`.
        *const u8,
        &'a [T],
        as_ptr
    );
    pub fn layout(&self) -> &PagedLayout {
        &self.pool.layout
    }
    /// Tokens of the sequence.
    pub fn len(&self) -> usize {
        self.pool.n
    }
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// A sequence's K or V in a paged pool, writable (compaction). Checked as [`PagedView`].
#[derive(Debug)]
pub struct PagedViewMut<'a> {
    pool: Pool<'a>,
    _life: PhantomData<&'a mut [u8]>,
}

impl<'a> PagedViewMut<'a> {
    paged_constructors!(
        /// # Safety
        /// `ptr` points to `len` writable elements of `layout.dtype`, exclusively borrowed for
        /// `'a`.
        *mut u8,
        &'a mut [T],
        as_mut_ptr
    );
    /// A read-only view of the same sequence.
    pub fn as_view(&self) -> PagedView<'_> {
        PagedView {
            pool: self.pool,
            _life: PhantomData,
        }
    }
}

/// Elements of a gathered sequence: `heads · n · dim`.
pub fn gather_len(layout: &PagedLayout, n: usize) -> Result<usize> {
    layout.required_len()?;
    mul(mul(layout.heads, n)?, layout.dim)
}

/// Bytes [`gather`] needs: the gathered `[H, n, d]` tensor (64-byte aligned).
pub fn gather_workspace_size(layout: &PagedLayout, n: usize) -> Result<usize> {
    let mut ws = WorkspaceSize::new();
    ws.add::<u8>(mul(gather_len(layout, n)?, layout.dtype.size())?)?;
    Ok(ws.total())
}

/// Gather a sequence's tokens into `workspace` as a head-major `[H, n, d]` tensor of the
/// same dtype (raw bits), and return the view of it that every scorer, the query stream
/// and compaction accept (strides `(n·d, d, 1)`).
pub fn gather<'w>(src: &PagedView, workspace: &'w mut [u8]) -> Result<View<'w>> {
    let p = &src.pool;
    let l = &p.layout;
    let (h, n, d) = (l.heads, p.n, l.dim);
    let len = gather_len(l, n)?;
    let es = l.dtype.size();
    if workspace.len() < gather_workspace_size(l, n)? {
        return Err(Error::WorkspaceTooSmall);
    }
    let dst = Workspace::new(workspace).take_dirty::<u8>(len * es)?;
    let out = dst.as_mut_ptr();
    let [_, ss, sh, sd] = l.stride;
    let bs = l.block_size;
    if sd == 1 && ss == d {
        // a head's slots are contiguous in a block (HND), as a head's tokens are in the
        // output: one copy per (block, head)
        for b in 0..n.div_ceil(bs) {
            let (t0, cnt) = (b * bs, bs.min(n - b * bs));
            for hh in 0..h {
                // SAFETY: Pool::new proved every (table entry, slot, head, dim) of the
                // sequence inside the pool, so slots t0 .. t0+cnt of head hh (contiguous:
                // slot stride d, dim stride 1) are; the destination run is inside `dst`
                // (`len` elements), a distinct buffer (an exclusive borrow).
                unsafe {
                    Pool::copy_row(
                        p.ptr,
                        p.row(t0, hh),
                        1,
                        out,
                        (hh * n + t0) * d,
                        1,
                        cnt * d,
                        es,
                    );
                }
            }
        }
    } else {
        // row by row, the pool read in its own order (heads inner when a token's heads are
        // closer than its slots, NHD)
        let heads_inner = sh < ss;
        for i in 0..h * n {
            let (hh, t) = if heads_inner {
                (i % h, i / h)
            } else {
                (i / n, i % n)
            };
            // SAFETY: as above, for one row of `d` elements.
            unsafe { Pool::copy_row(p.ptr, p.row(t, hh), sd, out, (hh * n + t) * d, 1, d, es) };
        }
    }
    // SAFETY: `dst` holds `len` elements of the dtype, 64-byte aligned, borrowed for 'w.
    unsafe { View::from_raw(dst.as_ptr(), len, l.dtype, [h, n, d], [n * d, d, 1]) }
}

/// Bytes [`compact_paged`]'s table check needs (the same as [`table_check_size`]).
pub fn compact_paged_workspace_size(layout: &PagedLayout) -> Result<usize> {
    table_check_size(layout)
}

/// What [`compact_paged`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedCompaction {
    /// Blocks still holding kept tokens: `ceil(max kept / block_size)`; the sequence's
    /// table entries `table[blocks_kept .. blocks_before]` are free.
    pub blocks_kept: usize,
    /// Blocks freed: `ceil(n / block_size) - blocks_kept`.
    pub blocks_freed: usize,
}

/// Compact a sequence in place in its own blocks: for every head, the kept tokens move to
/// tokens `0 .. count` (order kept); the rest is left as it was.
///
/// The kept lists are `compact_in_place`'s (ascending, `< n`, offsets absolute into
/// `indices`), either one per head (`offsets.len() == heads + 1`) or one list shared by
/// every head (`offsets.len() == 2`: token granularity, the only one that frees blocks in
/// an engine whose blocks hold every head). `positions` (`n` entries, optional: token `i`
/// has position `i` when absent) are the tokens' original positions; `kept_positions`
/// (optional, as many entries as the lists hold, in list order) receives the kept tokens'
/// positions; `lengths` (optional, `heads` entries) the new per-head lengths. Every input
/// is checked before the first byte moves.
pub fn compact_paged(
    kv: &mut PagedViewMut,
    offsets: &[u64],
    indices: &[u32],
    positions: Option<&[u32]>,
    kept_positions: Option<&mut [u32]>,
    lengths: Option<&mut [u32]>,
) -> Result<PagedCompaction> {
    let p = kv.pool;
    let l = p.layout;
    let (heads, n) = (l.heads, p.n);
    let shared = offsets.len() == 2 && heads > 1;
    let lists = if shared { 1 } else { heads };
    if offsets.len() != lists + 1 {
        return Err(Error::ShapeMismatch);
    }
    let total = validate_selection(offsets, indices, lists, n)?;
    if positions.is_some_and(|q| q.len() < n) {
        return Err(Error::ShapeMismatch);
    }
    if kept_positions.as_ref().is_some_and(|k| k.len() < total)
        || lengths.as_ref().is_some_and(|x| x.len() < heads)
    {
        return Err(Error::OutputTooSmall);
    }
    let list = |h: usize| {
        let u = if shared { 0 } else { h };
        &indices[offsets[u] as usize..offsets[u + 1] as usize]
    };
    let es = l.dtype.size();
    let mut most = 0usize;
    for h in 0..heads {
        let kept = list(h);
        most = most.max(kept.len());
        // ascending and distinct, so token r <= kept[r]: moving forward never overwrites
        // a token still to be read; distinct tokens never share memory (checked layout,
        // distinct table entries)
        for (r, &t) in kept.iter().enumerate() {
            let (from, to) = (p.row(t as usize, h), p.row(r, h));
            if from != to {
                // SAFETY: Pool::new proved both rows inside the pool and distinct rows
                // disjoint; the pool is exclusively borrowed through `kv`.
                unsafe {
                    Pool::copy_row(p.ptr, from, l.stride[3], p.ptr, to, l.stride[3], l.dim, es)
                };
            }
        }
    }
    if let Some(k) = kept_positions {
        for (j, &t) in indices[offsets[0] as usize..offsets[lists] as usize]
            .iter()
            .enumerate()
        {
            k[j] = positions.map_or(t, |q| q[t as usize]);
        }
    }
    if let Some(x) = lengths {
        for h in 0..heads {
            x[h] = list(h).len() as u32;
        }
    }
    let blocks_kept = l.blocks_for(most);
    Ok(PagedCompaction {
        blocks_kept,
        blocks_freed: l.blocks_for(n) - blocks_kept,
    })
}
