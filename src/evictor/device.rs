//! The evictor's device form: the same object as [`super::Evictor`] (configuration,
//! policy, rounds, per-sequence state), its tensors and its working memory on the device,
//! every stage enqueued on the engine's stream through the device pipeline
//! (`crate::device`, `cuda/`).
//!
//! Decisions, each with its reason:
//! - Two blocks: the context (configuration, per-sequence bookkeeping: what the policy
//!   reads) in caller HOST memory, and a caller DEVICE block (`DeviceEvictor::memory_size`)
//!   for what the kernels read and write: Gram blocks per layer, per sequence its scores
//!   `[L][Hkv][max_cells]`, its kept lists (`counts [L·Hkv]`, `idx [L·Hkv][max_cells]`,
//!   int32) and its query ring, then one workspace for the largest stage call. The
//!   policy never needs a number from the device, so a round reads nothing back.
//! - A round (`begin`, `score_layer` × L, `select`, `compact`, `commit`) allocates
//!   nothing, synchronises nothing and reads no device memory from the host: it is
//!   capturable in a CUDA graph (the round's `n`, target and span are kernel arguments,
//!   so a graph holds one round shape). Setup calls may synchronise
//!   (`set_output_projection` uploads the Gram blocks).
//! - The keep ratio's rounds after the first select over the cells new since the last
//!   compression: `kve_cuda_span_rows` packs those columns of the scores, the selection
//!   runs on them, `kve_cuda_shift_lists` prepends the protected cells and shifts the
//!   rest, as the host form does on the host.
//! - The query ring is mirrored (`kve_cuda_ring_put`): the last `w` rows are always one
//!   strided view, in the queries' dtype (the device scorers take one dtype for Q, K, V).
//! - The kept count of a round is known on the host only for a rectangular selection
//!   (token granularity, or the uniform allocator): every unit keeps the round's target.
//!   Other allocators leave per-unit counts on the device; `commit` then marks the
//!   sequence ragged (no further round until `reset`), as the host form does when it
//!   sees different counts.
//! - Paged views (`EvictorConfig::paged`, issue 30): `score_layer_paged` gathers K (and
//!   V) through the sequence's block table into the front of the device workspace
//!   (`cuda/paged.cu`) and scores them as strided views, so scores and kept lists are
//!   the contiguous path's bit for bit; `compact_paged` compacts in the pool through the
//!   table. The table is HOST memory (where the engines' block managers keep it): it is
//!   checked on the host with the core's check (`crate::paged::check_table`: the host
//!   form's statuses, by construction, and nothing enqueued on error; a device-side check
//!   could only report through device memory, after the call returned OK) and its used
//!   entries are copied to the workspace on the stream (`cudaMemcpyAsync`: a paged round
//!   is not graph-capturable from pageable memory). The kernels skip any entry past the
//!   pool, so a table changed after the check cannot move an access out of the pool.
//! - Value links (`link_threshold`): each layer's `cos(v[i], v[i-1])` sums accumulate into
//!   the sequence's `links [max_cells]` in the device block (zeroed on the stream by the
//!   round's first scored layer: `begin` enqueues nothing), and the selection carries its
//!   forward post-pool through them (`crate::device::select_model_linked`), as the host
//!   form does.
//! - Not on the device (yet): methods that read `Wo` every round (CriticalKV):
//!   `memory_size` and `init` refuse them (`InvalidArgument`).

use super::config::{resolve, Resolved};
use super::memory::STATE_WORDS;
use super::policy;
use super::state::{Phase, SeqState};
use super::{EvictorConfig, Needs, SeqStats, WoUse};
use crate::config::{AllocatorKind, Granularity};
use crate::cuda as cu;
use crate::device::{self, select::KeptLists, Floats, Tensor};
use crate::error::{mul, Error, Result};
use crate::paged::{self, PagedCompaction, PagedLayout};
use crate::score::LayerShape;
use crate::shape::ModelShape;
use crate::span::{check_alias, Span};
use crate::view::View;
use crate::workspace::{DeviceCarve, Workspace, WorkspaceSize};
use core::ffi::c_void;

const MAGIC: u64 = 0x6b76_6465_7669_6331; // "kvdevic1"

/// Bytes of the two blocks an evictor's device form lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSizes {
    /// Host memory (any alignment: the context starts at its first 64-byte boundary).
    pub host: usize,
    /// Device memory, 256-byte aligned (cudaMalloc's).
    pub device: usize,
}

/// One layer's device tensors for the round's `n` cells (every pointer a device one).
#[derive(Clone, Copy, Debug)]
pub struct DeviceLayerViews {
    /// `[Hkv, n, dk]`.
    pub keys: Tensor,
    /// `[Hkv, n, dv]` when the method reads values.
    pub values: Option<Tensor>,
    /// `[Hq, wq, dk]`, the last `wq >= min(w, n)` positions; `None`: the query ring.
    pub queries: Option<Tensor>,
    /// Optional `[Hq][min(w, n)]` window row log-sum-exp (device floats).
    pub row_lse: Floats,
}

/// One K or V tensor of a paged pool in DEVICE memory: `len` elements of `layout.dtype`
/// from `data` (checked as the host form's pools: non-NULL, aligned, the layout inside).
#[derive(Clone, Copy, Debug)]
pub struct DevicePool {
    pub data: *mut c_void,
    pub len: usize,
    pub layout: PagedLayout,
}

impl DevicePool {
    /// The checks of the host form's pool (`NullPointer`, `Misaligned`, the layout's, the
    /// layout past `len`: `OutOfBounds`); the pool's byte span.
    fn check(&self) -> Result<Span> {
        if self.data.is_null() {
            return Err(Error::NullPointer);
        }
        let es = self.layout.dtype.size();
        if self.data as usize % es != 0 {
            return Err(Error::Misaligned);
        }
        let span = crate::span::span_of(self.data as usize, self.len, es)?;
        if self.layout.required_len()? > self.len {
            return Err(Error::OutOfBounds);
        }
        Ok(span)
    }

    /// The launchers' descriptor (`kve_cuda_paged`) of the pool.
    pub fn cuda(&self) -> cu::KveCudaPaged {
        let l = &self.layout;
        cu::KveCudaPaged {
            data: self.data,
            dtype: l.dtype as i32,
            reserved: 0,
            offset: l.offset as i64,
            num_blocks: l.num_blocks as i64,
            block_size: l.block_size as i64,
            heads: l.heads as i64,
            dim: l.dim as i64,
            stride_block: l.stride[0] as i64,
            stride_slot: l.stride[1] as i64,
            stride_head: l.stride[2] as i64,
            stride_dim: l.stride[3] as i64,
        }
    }
}

/// One layer's tensors for the round's `n` cells with K and V in a paged pool (device)
/// reached through the sequence's block table (HOST memory, K and V share it).
#[derive(Clone, Copy, Debug)]
pub struct DevicePagedLayerViews<'t> {
    /// `heads == Hkv`, `dim == dk`.
    pub keys: DevicePool,
    /// `dim == dv`, when the method reads values (not read otherwise).
    pub values: Option<DevicePool>,
    /// At least `ceil(n / block_size)` entries below `num_blocks`, none repeated.
    pub table: &'t [u32],
    /// As [`DeviceLayerViews`]'s.
    pub queries: Option<Tensor>,
    pub row_lse: Floats,
}

/// The kept lists of a selected round, in the device block: unit `u = l·Hkv + h` keeps
/// `idx[u·idx_ld .. + counts[u]]`, ascending (int32, device memory).
#[derive(Clone, Copy, Debug)]
pub struct DeviceKept {
    pub counts: *const i32,
    pub idx: *const i32,
    pub idx_ld: usize,
}

/// Byte sizes of the device block's parts.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct DevLayout {
    model: usize,
    slot: usize,
    ws: usize,
    total: usize,
}

/// What the context's first bytes hold.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct Header {
    magic: u64,
    r: Resolved,
    dl: DevLayout,
    dev: usize,
    host_total: usize,
}

/// A sequence's device parts.
struct DevSlot {
    scores: *mut f32,
    counts: *mut i32,
    idx: *mut i32,
    ring: *mut u8,
    /// `[max_cells]` value-link sums (none without links).
    links: *mut f32,
}

/// A sequence's host parts.
struct HostSlot<'a> {
    state: &'a mut [u64],
    scored: &'a mut [u8],
    ring_rows: &'a mut [u64],
    /// The ring's dtype + 1 (0: nothing observed).
    ring_dtype: &'a mut [u8],
}

fn units(r: &Resolved) -> Result<usize> {
    mul(r.m.layers, r.m.hkv)
}

fn ring_bytes(r: &Resolved) -> Result<usize> {
    if !r.capture.queries {
        return Ok(0);
    }
    let w2 = 2 * r.score.window as usize;
    mul(mul(mul(r.m.layers, r.m.hq)?, mul(w2, r.m.dk)?)?, 4)
}

fn carve_slot(c: &mut DeviceCarve, r: &Resolved) -> Result<DevSlot> {
    let u = units(r)?;
    Ok(DevSlot {
        scores: c.take::<f32>(mul(u, r.max_cells)?)?,
        counts: c.take::<i32>(u)?,
        idx: c.take::<i32>(mul(u, r.max_cells)?)?,
        ring: c.take::<u8>(ring_bytes(r)?)?,
        links: c.take::<f32>(if r.links.is_some() { r.max_cells } else { 0 })?,
    })
}

/// The device block's parts for `r`: model, one slot, the workspace.
fn dev_layout(r: &Resolved) -> Result<DevLayout> {
    let mut m = DeviceCarve::new(core::ptr::null_mut());
    m.take::<f32>(mul(r.m.layers, r.gram_len)?)?;
    let mut s = DeviceCarve::new(core::ptr::null_mut());
    carve_slot(&mut s, r)?;
    let mut w = DeviceCarve::new(core::ptr::null_mut());
    w.take::<u8>(dev_workspace(r)?)?;
    let (model, slot, ws) = (m.bytes(), s.bytes(), w.bytes());
    let total = mul(slot, r.max_seqs)?
        .checked_add(model)
        .and_then(|t| t.checked_add(ws))
        .ok_or(Error::Overflow)?;
    Ok(DevLayout {
        model,
        slot,
        ws,
        total,
    })
}

/// Device workspace: the largest stage call at `max_cells`.
fn dev_workspace(r: &Resolved) -> Result<usize> {
    let n = r.max_cells;
    let w = (r.score.window as usize).min(n);
    let u = units(r)?;
    let shape = LayerShape {
        hq: r.m.hq,
        hkv: r.m.hkv,
        n,
        dk: r.m.dk,
        dv: r.m.dv,
    };
    let mut score = device::score_workspace_size(&r.score, &shape)?;
    if r.links.is_some() {
        // the links run after the layer's scores, in the same workspace
        score = score.max(device::value_links_workspace_size(
            r.m.hkv as u64,
            n as u64,
        )?);
    }
    let m = ModelShape::new(r.m.layers as u64, r.m.hkv as u64, n as u64, w as u64)?;
    let mut sel = DeviceCarve::new(core::ptr::null_mut());
    sel.take::<f32>(mul(u, n - w)?)?; // the span's scores
    sel.take::<i32>(u)?; // its lists
    sel.take::<i32>(mul(u, n)?)?;
    sel.take::<u8>(device::select_workspace_size(&r.select, &m)?)?;
    let view = cu::KveCudaView {
        data: core::ptr::null_mut(),
        dtype: cu::KVE_CUDA_F32,
        reserved: 0,
        stride_head: 0,
        stride_token: 0,
        stride_dim: 1,
        heads: r.m.hkv as i64,
        tokens: n as i64,
        dim: r.m.dk.max(r.m.dv) as i64,
    };
    let compact = device::compact_workspace_size(&view, n as u64)?;
    let score = score.checked_add(round_front(r)?).ok_or(Error::Overflow)?;
    Ok(score
        .max(sel.bytes())
        .max(compact)
        .max(paged_compact_carve(r)?.bytes()))
}

/// The paged element size (0 without paged views).
fn paged_es(r: &Resolved) -> usize {
    r.paged.map_or(0, |d| d.size())
}

/// The workspace's front while a paged layer is scored: the table (`u32 × max_cells`:
/// a block holds at least one cell), K `[Hkv, max_cells, dk]` and V (when read) gathered,
/// at the paged element size. Empty without paged views.
fn paged_front(r: &Resolved) -> Result<DeviceCarve> {
    let mut c = DeviceCarve::new(core::ptr::null_mut());
    let es = paged_es(r);
    if es > 0 {
        c.take::<u32>(r.max_cells)?;
        c.take::<u8>(mul(mul(r.m.hkv, r.max_cells)?, mul(r.m.dk, es)?)?)?;
        if r.capture.values {
            c.take::<u8>(mul(mul(r.m.hkv, r.max_cells)?, mul(r.m.dv, es)?)?)?;
        }
    }
    Ok(c)
}

/// The workspace of a paged compaction: the table, then the staged rows.
/// Bytes of a round's window queries uploaded from host memory (`run_round`'s; f32 at
/// most): `[Hq, w, dk]`, none for a method that reads no queries.
fn query_upload_bytes(r: &Resolved) -> Result<usize> {
    match r.capture.queries {
        true => mul(
            mul(r.m.hq, (r.score.window as usize).min(r.max_cells))?,
            mul(r.m.dk, 4)?,
        ),
        false => Ok(0),
    }
}

/// The workspace's front a scored layer leaves alone: the paged gathers, then the
/// uploaded queries (256-byte aligned).
fn round_front(r: &Resolved) -> Result<usize> {
    let mut c = paged_front(r)?;
    c.take::<u8>(query_upload_bytes(r)?)?;
    Ok(c.bytes())
}

fn paged_compact_carve(r: &Resolved) -> Result<DeviceCarve> {
    let mut c = DeviceCarve::new(core::ptr::null_mut());
    let es = paged_es(r);
    if es > 0 {
        c.take::<u32>(r.max_cells)?;
        c.take::<u8>(mul(
            mul(r.m.hkv, r.max_cells)?,
            mul(r.m.dk.max(r.m.dv), es)?,
        )?)?;
    }
    Ok(c)
}

/// Host bytes of the table check's scratch (a sorted copy of up to `max_cells` entries).
fn table_scratch_bytes(r: &Resolved) -> Result<usize> {
    match r.paged {
        Some(_) => mul(r.max_cells, 8),
        None => Ok(0),
    }
}

/// Host bytes after the header: gram flags, slots, the Gram scratch, the queries' staging copy, the
/// table check's scratch.
fn host_parts(r: &Resolved) -> Result<WorkspaceSize> {
    let mut s = WorkspaceSize::new();
    s.add::<u8>(r.m.layers)?;
    // each part is padded on its own, so every slot is the same size: one slot times max_seqs
    // (a loop over a hostile max_seqs ran for minutes before the sum overflowed)
    let mut slot = WorkspaceSize::new();
    slot.add::<u64>(STATE_WORDS)?;
    slot.add::<u8>(r.m.layers)?;
    slot.add::<u64>(r.m.layers)?;
    slot.add::<u8>(r.m.layers)?;
    s.0 = mul(slot.0, r.max_seqs)?
        .checked_add(s.0)
        .ok_or(Error::Overflow)?;
    s.add::<f32>(r.gram_len)?;
    s.add::<u8>(gram_ws(r)?)?;
    // the queries' staging copy, then the table check's scratch last (tests leave the
    // context's tail out of their "nothing written" comparisons)
    s.add::<u8>(query_upload_bytes(r)?)?;
    s.add::<u8>(table_scratch_bytes(r)?)?;
    Ok(s)
}

fn gram_ws(r: &Resolved) -> Result<usize> {
    match r.capture.wo {
        WoUse::Once => crate::gram_workspace_size(r.m.dv, r.m.d_model),
        _ => Ok(0),
    }
}

fn resolve_device(cfg: &EvictorConfig) -> Result<Resolved> {
    let mut r = resolve(cfg)?;
    r.decay = 0.0; // the device path carries no decode-time scores (design §3c)
    r.twins = 0; // nor twin lists
    if r.capture.wo == WoUse::EveryRound {
        return Err(Error::InvalidArgument);
    }
    Ok(r)
}

/// The model selection of a round over `m.n` cells, linked through `links` (the
/// sequence's sums from the span's first cell) when the configuration has value links.
///
/// # Safety
/// Device pointers of the declared sizes (`links`: `m.n` floats when linked).
#[allow(clippy::too_many_arguments)]
unsafe fn select_on(
    r: &Resolved,
    cfg: &crate::config::SelectConfig,
    m: &ModelShape,
    scores: *const f32,
    scores_len: u64,
    links: *const f32,
    lists: &KeptLists,
    ws: *mut c_void,
    wsb: u64,
    stream: *mut c_void,
) -> Result<()> {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match r.links {
            Some(t) => device::select_model_linked(
                cfg, m, scores, scores_len, links, m.n as u64, t, lists, ws, wsb, stream,
            ),
            None => device::select_model(cfg, m, scores, scores_len, lists, ws, wsb, stream),
        }
    }
}

/// Whether every unit of a selection keeps the same count (the round's target).
fn rectangular(r: &Resolved) -> bool {
    r.select.granularity == Granularity::Token || r.select.allocator == AllocatorKind::Uniform
}

/// An evictor whose tensors live on the device: a context in host memory over a device
/// block. See the module's documentation.
pub struct DeviceEvictor<'a> {
    r: Resolved,
    dl: DevLayout,
    dev: *mut u8,
    block: &'a mut [u8],
}

impl<'a> DeviceEvictor<'a> {
    /// Bytes of the context (host) and of the device block for `cfg`.
    pub fn memory_size(cfg: &EvictorConfig) -> Result<DeviceSizes> {
        let r = resolve_device(cfg)?;
        let dl = dev_layout(&r)?;
        let host = host_parts(&r)?.total() + core::mem::size_of::<Header>() + 64;
        Ok(DeviceSizes {
            host,
            device: dl.total,
        })
    }

    /// An evictor with its context in `mem` (host, any alignment) over the device block
    /// `dev` (`dev_bytes`, 256-byte aligned, not read or written here). Nothing is
    /// written on error.
    ///
    /// # Safety
    /// `dev` is device memory of `dev_bytes` bytes the caller keeps for the evictor's life.
    pub unsafe fn init(
        mem: &'a mut [u8],
        dev: *mut c_void,
        dev_bytes: u64,
        cfg: &EvictorConfig,
    ) -> Result<DeviceEvictor<'a>> {
        let sizes = Self::memory_size(cfg)?;
        let r = resolve_device(cfg)?;
        let dl = dev_layout(&r)?;
        if dev.is_null() {
            return Err(Error::NullPointer);
        }
        if dev as usize % DeviceCarve::ALIGN != 0 {
            return Err(Error::Misaligned);
        }
        if (dev_bytes as u128) < sizes.device as u128 || mem.len() < sizes.host {
            return Err(Error::WorkspaceTooSmall);
        }
        let dev_span = crate::span::span_of(dev as usize, sizes.device, 1)?;
        let host = Span(mem.as_ptr() as usize, mem.as_ptr() as usize + mem.len());
        check_alias(&[host], &[dev_span])?;
        let off = mem.as_ptr().align_offset(64);
        let total = sizes.host - 64;
        let block = &mut mem[off..off + total];
        let h = Header {
            magic: MAGIC,
            r,
            dl,
            dev: dev as usize,
            host_total: total,
        };
        // SAFETY: the block starts 64-byte aligned and is longer than a Header; plain data.
        unsafe { core::ptr::write(block.as_mut_ptr() as *mut Header, h) };
        let mut ev = DeviceEvictor {
            r,
            dl,
            dev: dev as *mut u8,
            block,
        };
        ev.gram_set()?.fill(0);
        for s in 0..r.max_seqs {
            ev.reset(s)?;
        }
        Ok(ev)
    }

    /// The evictor whose context starts at `ptr` (as `init` left it).
    ///
    /// # Safety
    /// As [`super::Evictor::from_block`].
    pub unsafe fn from_block(ptr: *mut u8) -> Result<DeviceEvictor<'a>> {
        if ptr.is_null() {
            return Err(Error::NullPointer);
        }
        if ptr as usize % 64 != 0 {
            return Err(Error::Misaligned);
        }
        // SAFETY: the caller's contract: 8 readable, aligned bytes.
        if unsafe { *(ptr as *const u64) } != MAGIC {
            return Err(Error::InvalidArgument);
        }
        // SAFETY: the magic says `init` wrote a Header here.
        let h = unsafe { core::ptr::read(ptr as *const Header) };
        // SAFETY: `init` made the block `host_total` bytes long; the caller owns it.
        let block = unsafe { core::slice::from_raw_parts_mut(ptr, h.host_total) };
        Ok(DeviceEvictor {
            r: h.r,
            dl: h.dl,
            dev: h.dev as *mut u8,
            block,
        })
    }

    /// The context's start (C's `kve_cuda_evictor*`).
    pub fn as_ptr(&mut self) -> *mut u8 {
        self.block.as_mut_ptr()
    }

    /// The context's byte range (host) and the device block's.
    pub(crate) fn spans(&self) -> (Span, Span) {
        let s = self.block.as_ptr() as usize;
        let d = self.dev as usize;
        (Span(s, s + self.block.len()), Span(d, d + self.dl.total))
    }

    pub fn needs(&self) -> Needs {
        self.r.needs()
    }

    fn host(&mut self) -> Workspace<'_> {
        let hs = core::mem::size_of::<Header>();
        Workspace::new(&mut self.block[hs..])
    }

    fn gram_set(&mut self) -> Result<&mut [u8]> {
        let l = self.r.m.layers;
        self.host().take_dirty::<u8>(l)
    }

    /// The host parts: sequence `seq`'s slot (`max_seqs`: none), then the Gram scratch,
    /// then the table check's scratch.
    #[allow(clippy::type_complexity)]
    fn parts(
        &mut self,
        seq: usize,
    ) -> Result<(
        Option<HostSlot<'_>>,
        &mut [f32],
        &mut [u8],
        &mut [u8],
        &mut [u8],
    )> {
        let (l, seqs, gl, gw, tb, qb) = (
            self.r.m.layers,
            self.r.max_seqs,
            self.r.gram_len,
            gram_ws(&self.r)?,
            table_scratch_bytes(&self.r)?,
            query_upload_bytes(&self.r)?,
        );
        let mut ws = self.host();
        ws.take_dirty::<u8>(l)?;
        let mut found = None;
        for s in 0..seqs {
            let slot = HostSlot {
                state: ws.take_dirty::<u64>(STATE_WORDS)?,
                scored: ws.take_dirty::<u8>(l)?,
                ring_rows: ws.take_dirty::<u64>(l)?,
                ring_dtype: ws.take_dirty::<u8>(l)?,
            };
            if s == seq {
                found = Some(slot);
            }
        }
        let g = ws.take_dirty::<f32>(gl)?;
        let gws = ws.take_dirty::<u8>(gw)?;
        let stage = ws.take_dirty::<u8>(qb)?;
        Ok((found, g, gws, ws.take_dirty::<u8>(tb)?, stage))
    }

    fn slot(&mut self, seq: usize) -> Result<HostSlot<'_>> {
        self.parts(seq)?.0.ok_or(Error::InvalidArgument)
    }

    /// The Gram scratch (host): `gram_len` floats and the Gram's workspace.
    fn gram_scratch(&mut self) -> Result<(&mut [f32], &mut [u8])> {
        let seqs = self.r.max_seqs;
        let (_, g, ws, _, _) = self.parts(seqs)?;
        Ok((g, ws))
    }

    /// The table check's scratch (host).
    fn table_scratch(&mut self) -> Result<&mut [u8]> {
        let seqs = self.r.max_seqs;
        Ok(self.parts(seqs)?.3)
    }

    fn query_staging(&mut self) -> Result<&mut [u8]> {
        let seqs = self.r.max_seqs;
        Ok(self.parts(seqs)?.4)
    }

    seq_bookkeeping!();

    fn dev_gram(&self, layer: usize) -> *mut f32 {
        (self.dev as *mut f32).wrapping_add(layer * self.r.gram_len)
    }

    fn dev_slot(&self, seq: usize) -> Result<DevSlot> {
        // before the offset is computed: a hostile seq would overflow it
        if seq >= self.r.max_seqs {
            return Err(Error::InvalidArgument);
        }
        let base = self.dev.wrapping_add(self.dl.model + seq * self.dl.slot);
        carve_slot(&mut DeviceCarve::new(base as *mut c_void), &self.r)
    }

    /// The device workspace and its size.
    fn dev_ws(&self) -> (*mut c_void, u64) {
        let at = self.dl.model + self.r.max_seqs * self.dl.slot;
        (self.dev.wrapping_add(at) as *mut c_void, self.dl.ws as u64)
    }

    /// Inputs must not overlap the device block.
    fn unaliased(&self, spans: &[Span]) -> Result<()> {
        check_alias(&[self.spans().1], spans)
    }

    /// Set `layer`'s output projection `wo` `[Hq, dv, D]` (host memory; methods with
    /// [`WoUse::Once`]): its Gram blocks are computed on the host and uploaded to the
    /// device block on `stream`, which is then synchronised (a setup call).
    ///
    /// # Safety
    /// `stream` is NULL or a valid CUDA stream.
    pub unsafe fn set_output_projection(
        &mut self,
        layer: usize,
        wo: &View,
        stream: *mut c_void,
    ) -> Result<()> {
        self.r.check_layer(layer)?;
        if self.r.capture.wo != WoUse::Once {
            return Err(Error::InvalidArgument);
        }
        if wo.extent() != [self.r.m.hq, self.r.m.dv, self.r.m.d_model] {
            return Err(Error::ShapeMismatch);
        }
        let (hkv, cross, gl) = (self.r.m.hkv, self.r.score.needs_cross(), self.r.gram_len);
        let dst = self.dev_gram(layer);
        let (g, ws) = self.gram_scratch()?;
        crate::compute_gram(wo, hkv, cross, g, ws)?;
        // SAFETY: dst is the layer's gram_len floats in the device block; g is host memory.
        let st =
            unsafe { cu::kve_cuda_upload(dst as *mut c_void, g.as_ptr() as _, gl * 4, stream) };
        if st != 0 {
            return Err(Error::Cuda);
        }
        self.gram_set()?[layer] = 1;
        Ok(())
    }

    /// Keep the last `w` of the query rows `q` (device, `[Hq, c, dk]`, this ubatch's rows
    /// of `seq` at `layer` in position order) in the sequence's ring, on `stream`. Every
    /// observation of a (sequence, layer) takes one dtype (another: `ShapeMismatch`,
    /// until `reset`).
    ///
    /// # Safety
    /// `q` describes device memory; `stream` is NULL or a valid CUDA stream.
    pub unsafe fn observe_queries(
        &mut self,
        seq: usize,
        layer: usize,
        q: &Tensor,
        stream: *mut c_void,
    ) -> Result<()> {
        let v = &q.view;
        self.r
            .check_observe(layer, v.heads as usize, v.dim as usize)?;
        self.unaliased(&[q.span()])?;
        let (w, hq, dk) = (self.r.score.window as usize, self.r.m.hq, self.r.m.dk);
        let ring = self.dev_slot(seq)?.ring;
        let slot = self.slot(seq)?;
        let dt = v.dtype as u8 + 1;
        if slot.ring_dtype[layer] != 0 && slot.ring_dtype[layer] != dt {
            return Err(Error::ShapeMismatch);
        }
        let c = v.tokens as usize;
        let k = c.min(w);
        let seen = slot.ring_rows[layer];
        let at = ring.wrapping_add(layer * hq * 2 * w * dk * 4);
        let first_seen = seen.saturating_add((c - k) as u64);
        if first_seen > i64::MAX as u64 {
            return Err(Error::Overflow);
        }
        // SAFETY: the view was checked on the host; `at` is this layer's ring in the
        // device block (Hq·2w·dk elements of at most 4 bytes).
        let st = unsafe {
            cu::kve_cuda_ring_put(
                v,
                (c - k) as i64,
                k as i64,
                at as *mut c_void,
                w as i64,
                first_seen as i64,
                stream,
            )
        };
        if st != 0 {
            return Err(Error::Cuda);
        }
        slot.ring_dtype[layer] = dt;
        slot.ring_rows[layer] = seen.saturating_add(c as u64);
        Ok(())
    }

    /// As [`super::Evictor::begin`] (host bookkeeping only: nothing enqueued).
    pub fn begin(&mut self, seq: usize, n_cells: usize, target: usize) -> Result<()> {
        let r = self.r;
        let slot = self.slot(seq)?;
        SeqState::begin_slot(&r, slot.state, slot.scored, n_cells, target)
    }

    /// Score `layer` of `seq`'s round from `v` (device tensors), on `stream`.
    ///
    /// # Safety
    /// The tensors describe device memory; `stream` is NULL or a valid CUDA stream.
    pub unsafe fn score_layer(
        &mut self,
        seq: usize,
        layer: usize,
        v: &DeviceLayerViews,
        stream: *mut c_void,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.score_inner(seq, layer, v, 0, stream) }
    }

    /// [`DeviceEvictor::score_layer`] from K (and V) in a paged pool through the
    /// sequence's block table (config [`EvictorConfig::paged`]: its element type at most,
    /// else `InvalidArgument`): the table is checked on the host (the host form's
    /// statuses: `ShapeMismatch` short, `OutOfBounds` an entry past the pool, `Aliasing` a
    /// repeat; nothing enqueued on error), its used entries copied to the device
    /// workspace, K (and V) gathered there and scored as strided views: kept lists
    /// bit-identical to the same K/V given contiguous. The table check's scratch, the
    /// context's last part, is unspecified after the call (as the host form's workspace);
    /// the rest of the context and the device block are not written on error.
    ///
    /// # Safety
    /// The pools describe device memory; the table's used entries stay unchanged until
    /// `stream` has passed the call (an asynchronous copy's source); `stream` is NULL or a
    /// valid CUDA stream.
    pub unsafe fn score_layer_paged(
        &mut self,
        seq: usize,
        layer: usize,
        v: &DevicePagedLayerViews,
        stream: *mut c_void,
    ) -> Result<()> {
        self.r.check_layer(layer)?;
        let st = self.state(seq)?;
        let r = self.r;
        let Some(dt) = r.paged else {
            return Err(Error::InvalidArgument);
        };
        let fits = |p: &DevicePool| p.layout.dtype.size() <= dt.size();
        if !fits(&v.keys) || !v.values.as_ref().map_or(true, fits) {
            return Err(Error::InvalidArgument);
        }
        let kspan = v.keys.check()?;
        let vspan = match v.values.as_ref() {
            Some(p) => p.check()?,
            None => Span::EMPTY,
        };
        let gram_ok = r.capture.wo != WoUse::Once || self.gram_set()?[layer] != 0;
        if st.phase != Phase::Scoring || self.slot(seq)?.scored[layer] != 0 || !gram_ok {
            return Err(Error::InvalidArgument);
        }
        let n = st.n as usize;
        let same = |p: &DevicePool, d: usize| p.layout.heads == r.m.hkv && p.layout.dim == d;
        if !same(&v.keys, r.m.dk) || !v.values.as_ref().map_or(true, |p| same(p, r.m.dv)) {
            return Err(Error::ShapeMismatch);
        }
        let values = v.values.filter(|_| r.capture.values);
        if r.capture.values && values.is_none() {
            return Err(Error::NullPointer);
        }
        self.unaliased(&[kspan, vspan])?;
        paged::check_table(&v.keys.layout, v.table, n, self.table_scratch()?)?;
        if let Some(p) = values {
            paged::check_table(&p.layout, v.table, n, self.table_scratch()?)?;
        }
        let (ws, _) = self.dev_ws();
        let mut c = DeviceCarve::new(ws);
        let table = c.take::<u32>(r.max_cells)?;
        let gather = |c: &mut DeviceCarve, p: &DevicePool, d: usize| -> Result<Tensor> {
            let es = p.layout.dtype.size();
            let dst = c.take::<u8>(mul(mul(r.m.hkv, r.max_cells)?, mul(d, es)?)?)?;
            let pool = p.cuda();
            // SAFETY: the pool was checked (device memory by the caller's contract), the
            // table's used entries are in the workspace (stream-ordered), `dst` holds
            // Hkv·max_cells·d elements in the workspace.
            let s = unsafe { cu::kve_cuda_paged_gather(&pool, table, n as i64, dst as _, stream) };
            if s != 0 {
                return Err(Error::Cuda);
            }
            let at = dst as usize;
            Ok(Tensor {
                view: cu::KveCudaView {
                    data: dst as *mut c_void,
                    dtype: p.layout.dtype as i32,
                    reserved: 0,
                    stride_head: (n * d) as i64,
                    stride_token: d as i64,
                    stride_dim: 1,
                    heads: r.m.hkv as i64,
                    tokens: n as i64,
                    dim: d as i64,
                },
                bytes: (at, at + r.m.hkv * n * d * es),
            })
        };
        let used = v.keys.layout.blocks_for(n);
        // SAFETY: `table` has max_cells >= used entries of device memory; the host table
        // holds `used` checked entries.
        let s = unsafe {
            cu::kve_cuda_upload_async(table as _, v.table.as_ptr() as _, used * 4, stream)
        };
        if s != 0 {
            return Err(Error::Cuda);
        }
        let keys = gather(&mut c, &v.keys, r.m.dk)?;
        let values = match values {
            Some(p) => Some(gather(&mut c, &p, r.m.dv)?),
            None => None,
        };
        let front = round_front(&r)?;
        let lv = DeviceLayerViews {
            keys,
            values,
            queries: v.queries,
            row_lse: v.row_lse,
        };
        // SAFETY: the gathered tensors are in the workspace's front, which the scoring
        // stages skip; the caller's queries and row_lse.
        unsafe { self.score_inner(seq, layer, &lv, front, stream) }
    }

    /// Scoring with the workspace's first `front` bytes kept (a paged layer's gathered
    /// K/V, uploaded queries: inside the device block, not alias-checked against it).
    unsafe fn score_inner(
        &mut self,
        seq: usize,
        layer: usize,
        v: &DeviceLayerViews,
        front: usize,
        stream: *mut c_void,
    ) -> Result<()> {
        self.r.check_layer(layer)?;
        let st = self.state(seq)?;
        let r = self.r;
        let n = st.n as usize;
        let w = (r.score.window as usize).min(n);
        let p = n - w;
        let dslot = self.dev_slot(seq)?;
        let gram_ok = r.capture.wo != WoUse::Once || self.gram_set()?[layer] != 0;
        let slot = self.slot(seq)?;
        if st.phase != Phase::Scoring || slot.scored[layer] != 0 || !gram_ok {
            return Err(Error::InvalidArgument);
        }
        let ext = |t: &Tensor| [t.view.heads, t.view.tokens, t.view.dim].map(|x| x as usize);
        if ext(&v.keys) != [r.m.hkv, n, r.m.dk] {
            return Err(Error::ShapeMismatch);
        }
        match v.values {
            Some(val) if ext(&val) != [r.m.hkv, n, r.m.dv] => return Err(Error::ShapeMismatch),
            None if r.capture.values => return Err(Error::NullPointer),
            _ => {}
        }
        let mut queries = None;
        if r.capture.queries {
            queries = match v.queries {
                Some(q) => Some(q),
                None => {
                    let (rows, dt) = (slot.ring_rows[layer], slot.ring_dtype[layer]);
                    if rows < w as u64 || dt == 0 {
                        return Err(Error::InvalidArgument);
                    }
                    let cap = r.score.window as usize;
                    let (hq, dk) = (r.m.hq, r.m.dk);
                    let es = if dt == 1 { 4 } else { 2 };
                    let s0 = ((rows - w as u64) % cap as u64) as usize;
                    let at = dslot
                        .ring
                        .wrapping_add(layer * hq * 2 * cap * dk * 4 + s0 * dk * es);
                    let bytes = ((hq - 1) * 2 * cap * dk + w * dk) * es;
                    Some(Tensor {
                        view: cu::KveCudaView {
                            data: at as *mut c_void,
                            dtype: dt as i32 - 1,
                            reserved: 0,
                            stride_head: (2 * cap * dk) as i64,
                            stride_token: dk as i64,
                            stride_dim: 1,
                            heads: hq as i64,
                            tokens: w as i64,
                            dim: dk as i64,
                        },
                        bytes: (at as usize, at as usize + bytes),
                    })
                }
            };
        }
        let mut spans = [Span::EMPTY; 4];
        spans[0] = v.keys.span();
        if let Some(val) = v.values {
            spans[1] = val.span();
        }
        if let Some(q) = v.queries {
            spans[2] = q.span();
        }
        spans[3] = device::span_of(v.row_lse.ptr, v.row_lse.len as usize)?;
        // what the library put in the workspace's front (gathered K/V, uploaded queries)
        let ws0 = self.dev_ws().0 as usize;
        for x in spans
            .iter_mut()
            .filter(|x| x.0 >= ws0 && x.1 <= ws0 + front)
        {
            *x = Span::EMPTY;
        }
        check_alias(
            &[Span(self.dev as usize, self.dev as usize + self.dl.total)],
            &spans,
        )?;
        let gram = match r.capture.wo {
            WoUse::Once => Floats {
                ptr: self.dev_gram(layer),
                len: r.gram_len as u64,
            },
            _ => Floats::NONE,
        };
        let inputs = device::LayerInputs {
            queries,
            keys: Some(v.keys),
            values: if r.capture.values { v.values } else { None },
            gram,
            value_forms: Floats::NONE,
            value_l1: Floats::NONE,
            row_lse: v.row_lse,
        };
        let out = dslot.scores.wrapping_add(layer * r.m.hkv * p);
        let (ws, wsb) = self.dev_ws();
        let (ws, wsb) = (
            (ws as *mut u8).wrapping_add(front) as *mut c_void,
            wsb - front as u64,
        );
        // SAFETY: the caller's tensors; `out` is this layer's Hkv·P floats of the sequence's
        // scores and `ws` the device workspace, both in the caller's device block.
        unsafe {
            device::score_layer(
                &r.score,
                &inputs,
                out,
                (r.m.hkv * p) as u64,
                ws,
                wsb,
                stream,
            )?
        };
        if r.links.is_some() {
            let values = v.values.as_ref().ok_or(Error::NullPointer)?;
            if !self.slot(seq)?.scored.contains(&1) {
                // the round's first layer: the sums start from zero (`sink_scores` with no
                // sinks writes n zeros)
                // SAFETY: the sequence's links hold max_cells >= n floats (device block).
                let s = unsafe {
                    cu::kve_cuda_sink_scores(dslot.links, 1, n as i64, n as i64, 0, stream)
                };
                if s != 0 {
                    return Err(Error::Cuda);
                }
            }
            // SAFETY: the values (checked above), the sequence's links and the workspace
            // past `front`, all device memory.
            unsafe {
                device::accumulate_value_links(values, dslot.links, n as u64, ws, wsb, stream)?
            };
        }
        self.slot(seq)?.scored[layer] = 1;
        Ok(())
    }

    /// Select `seq`'s kept set once every layer is scored, on `stream`. Returns the cells
    /// every unit keeps for a rectangular selection (token granularity or the uniform
    /// allocator), `None` for the others (their counts are on the device).
    ///
    /// # Safety
    /// `stream` is NULL or a valid CUDA stream.
    pub unsafe fn select(&mut self, seq: usize, stream: *mut c_void) -> Result<Option<usize>> {
        let mut st = self.state(seq)?;
        let r = self.r;
        let slot = self.slot(seq)?;
        if st.phase != Phase::Scoring || slot.scored.contains(&0) {
            return Err(Error::InvalidArgument);
        }
        let (n, start) = (st.n as usize, st.start as usize);
        let window = r.score.window as usize;
        let u = units(&r)?;
        let p = n - window.min(n);
        let m = n - start;
        let ps = m - window.min(m);
        let mut cfg = r.select;
        cfg.budget = policy::span_budget(st.start, st.n, window as u64, st.target);
        let shape = ModelShape::new(r.m.layers as u64, r.m.hkv as u64, m as u64, window as u64)?;
        let d = self.dev_slot(seq)?;
        let (ws, wsb) = self.dev_ws();
        let ld = r.max_cells;
        let ck = |s: i32| if s == 0 { Ok(()) } else { Err(Error::Cuda) };
        if start == 0 {
            let lists = KeptLists {
                counts: d.counts,
                counts_len: u as u64,
                idx: d.idx,
                idx_ld: ld as u64,
                idx_len: (u * ld) as u64,
            };
            // SAFETY: the sequence's scores, links and lists and the workspace, in the
            // device block.
            unsafe {
                select_on(
                    &r,
                    &cfg,
                    &shape,
                    d.scores,
                    (u * p) as u64,
                    d.links,
                    &lists,
                    ws,
                    wsb,
                    stream,
                )?
            };
        } else {
            let mut c = DeviceCarve::new(ws);
            let span = c.take::<f32>(u * (n - window.min(n)))?;
            let counts = c.take::<i32>(u)?;
            let idx = c.take::<i32>(u * n)?;
            let rest = c.bytes();
            let sel_ws = (ws as *mut u8).wrapping_add(rest) as *mut c_void;
            let lists = KeptLists {
                counts,
                counts_len: u as u64,
                idx,
                idx_ld: n as u64,
                idx_len: (u * n) as u64,
            };
            // SAFETY: device pointers into the caller's block: the scores [u][p], the span
            // [u][ps] and lists carved from the workspace, the sequence's lists.
            unsafe {
                ck(cu::kve_cuda_span_rows(
                    d.scores,
                    u as i64,
                    p as i64,
                    start as i64,
                    ps as i64,
                    span,
                    stream,
                ))?;
                select_on(
                    &r,
                    &cfg,
                    &shape,
                    span,
                    (u * ps) as u64,
                    d.links.wrapping_add(start),
                    &lists,
                    sel_ws,
                    wsb - rest as u64,
                    stream,
                )?;
                ck(cu::kve_cuda_shift_lists(
                    counts,
                    idx,
                    n as i64,
                    u as i64,
                    start as i64,
                    d.counts,
                    d.idx,
                    ld as i64,
                    stream,
                ))?;
            }
        }
        st.phase = Phase::Selected;
        st.store(self.slot(seq)?.state);
        Ok(rectangular(&r).then_some(st.target as usize))
    }

    /// The kept lists of `seq`'s selected round (device pointers into the block).
    pub fn kept(&mut self, seq: usize) -> Result<DeviceKept> {
        if self.state(seq)?.phase != Phase::Selected {
            return Err(Error::InvalidArgument);
        }
        let d = self.dev_slot(seq)?;
        Ok(DeviceKept {
            counts: d.counts,
            idx: d.idx,
            idx_ld: self.r.max_cells,
        })
    }

    /// The context's layers.
    pub fn layers(&self) -> usize {
        self.r.m.layers
    }

    /// `cells` a round over a whole cell stream names ([`DeviceEvictor::score_layer_stream`]),
    /// checked before the round begins: a context with paged views (`InvalidArgument`), at
    /// most `max_cells` (`ShapeMismatch`), none twice (`Aliasing`); a selection every unit
    /// shares (token granularity: `InvalidArgument`), so that one kept list is the round's.
    pub fn check_stream_round(&mut self, cells: Option<&[u32]>) -> Result<()> {
        if self.r.select.granularity != Granularity::Token {
            return Err(Error::InvalidArgument);
        }
        let Some(cells) = cells else { return Ok(()) };
        if self.r.paged.is_none() {
            return Err(Error::InvalidArgument);
        }
        let max = self.r.max_cells;
        super::distinct_cells(cells, max, self.table_scratch()?)
    }

    /// Window queries `q` (HOST memory, `[Hq, wq, dk]`, any dtype a view takes), their
    /// last `min(wq, w)` rows converted to `dtype` (the keys') in the context's staging
    /// area and uploaded to the workspace's query area on `stream` (waited for): the
    /// device tensor.
    unsafe fn upload_queries(
        &mut self,
        q: &View,
        dtype: i32,
        stream: *mut c_void,
    ) -> Result<Tensor> {
        let r = self.r;
        let [hq, wq, dk] = q.extent();
        if hq != r.m.hq || dk != r.m.dk {
            return Err(Error::ShapeMismatch);
        }
        let rows = wq.min((r.score.window as usize).min(r.max_cells));
        let es = match dtype {
            cu::KVE_CUDA_F32 => 4,
            cu::KVE_CUDA_F16 | cu::KVE_CUDA_BF16 => 2,
            _ => return Err(Error::UnsupportedDtype),
        };
        let bytes = hq * rows * dk * es;
        let (ws, _) = self.dev_ws();
        let at = (ws as *mut u8).wrapping_add(paged_front(&r)?.bytes());
        let stage = &mut self.query_staging()?[..bytes];
        for (i, out) in stage.chunks_exact_mut(es).enumerate() {
            let x = q.get(i / (rows * dk), wq - rows + i / dk % rows, i % dk);
            match dtype {
                cu::KVE_CUDA_F32 => out.copy_from_slice(&x.to_le_bytes()),
                cu::KVE_CUDA_F16 => out.copy_from_slice(&half::f16::from_f32(x).to_le_bytes()),
                _ => out.copy_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
            }
        }
        // SAFETY: `bytes` of the staging area to the workspace's query area (round_front).
        if unsafe { cu::kve_cuda_upload(at as _, stage.as_ptr() as _, bytes, stream) } != 0 {
            return Err(Error::Cuda);
        }
        Ok(Tensor {
            view: cu::KveCudaView {
                data: at as *mut c_void,
                dtype,
                reserved: 0,
                stride_head: (rows * dk) as i64,
                stride_token: dk as i64,
                stride_dim: 1,
                heads: hq as i64,
                tokens: rows as i64,
                dim: dk as i64,
            },
            bytes: (at as usize, at as usize + bytes),
        })
    }

    /// Score `layer` of `seq`'s round from device K (and V) over a whole cell stream
    /// (`[Hkv, S, d]`, any strides: V transposed too), the round's cells `cells[i]`
    /// gathered on the device ([`DeviceEvictor::score_layer_paged`] with one cell a
    /// block), or (`cells` None) tensors holding exactly the round's cells, with the window
    /// queries from HOST memory (`queries`, uploaded in the keys' dtype; None: the ring).
    ///
    /// # Safety
    /// `keys`, `values` describe device memory; `stream` as above.
    pub unsafe fn score_layer_stream(
        &mut self,
        seq: usize,
        layer: usize,
        keys: &Tensor,
        values: Option<&Tensor>,
        queries: Option<&View>,
        cells: Option<&[u32]>,
        stream: *mut c_void,
    ) -> Result<()> {
        let r = self.r;
        self.r.check_layer(layer)?;
        let q = match queries.filter(|_| r.capture.queries) {
            // SAFETY: the caller's stream.
            Some(q) => Some(unsafe { self.upload_queries(q, keys.view.dtype, stream)? }),
            None => None,
        };
        let Some(cells) = cells else {
            let lv = DeviceLayerViews {
                keys: *keys,
                values: values.copied(),
                queries: q,
                row_lse: Floats::NONE,
            };
            // SAFETY: the caller's device tensors and stream; the queries in the front.
            return unsafe { self.score_inner(seq, layer, &lv, round_front(&r)?, stream) };
        };
        // a stream as a pool of one-cell blocks: block b is cell b
        let pool = |t: &Tensor| -> Result<DevicePool> {
            let v = &t.view;
            let dtype = crate::dtype::DType::from_u32(v.dtype as u32)?;
            let st = |x: i64| usize::try_from(x).map_err(|_| Error::InvalidArgument);
            Ok(DevicePool {
                data: v.data,
                len: (t.bytes.1 - t.bytes.0) / dtype.size(),
                layout: paged::PagedLayout {
                    dtype,
                    offset: 0,
                    num_blocks: st(v.tokens)?,
                    block_size: 1,
                    heads: st(v.heads)?,
                    dim: st(v.dim)?,
                    stride: [
                        st(v.stride_token)?,
                        1,
                        st(v.stride_head)?,
                        st(v.stride_dim)?,
                    ],
                },
            })
        };
        let pv = DevicePagedLayerViews {
            keys: pool(keys)?,
            values: values.map(pool).transpose()?,
            table: cells,
            queries: q,
            row_lse: Floats::NONE,
        };
        // SAFETY: the caller's device tensors and stream.
        unsafe { self.score_layer_paged(seq, layer, &pv, stream) }
    }

    /// The kept cells of `seq`'s round selected at token granularity (every unit keeps the
    /// same `count` cells): unit 0's list read back to `out` (ascending indices into the
    /// round's cells), waiting for `stream`.
    ///
    /// # Safety
    /// `stream` as above.
    pub unsafe fn kept_to_host(
        &mut self,
        seq: usize,
        count: usize,
        out: &mut [u32],
        stream: *mut c_void,
    ) -> Result<usize> {
        let k = self.kept(seq)?;
        if count > out.len() || count > self.state(seq)?.n as usize {
            return Err(Error::OutputTooSmall);
        }
        // SAFETY: `count` int32 of the device block's list (non-negative: the same bytes
        // as u32) to `out`, which holds them.
        let st =
            unsafe { cu::kve_cuda_download(out.as_mut_ptr() as _, k.idx as _, count * 4, stream) };
        if st != 0 {
            return Err(Error::Cuda);
        }
        Ok(count)
    }

    /// Move `layer`'s kept rows of `kv` (device, `[Hkv, n, d]`, K or V) to the front of
    /// each head, in place, on `stream`.
    ///
    /// # Safety
    /// `kv` describes device memory the caller lets us write; `stream` as above.
    pub unsafe fn compact(
        &mut self,
        seq: usize,
        layer: usize,
        kv: &Tensor,
        stream: *mut c_void,
    ) -> Result<()> {
        self.r.check_layer(layer)?;
        let n = self.state(seq)?.n as usize;
        let kept = self.kept(seq)?;
        let v = &kv.view;
        if v.heads as usize != self.r.m.hkv || v.tokens as usize != n {
            return Err(Error::ShapeMismatch);
        }
        self.unaliased(&[kv.span()])?;
        let u0 = layer * self.r.m.hkv;
        let (ws, wsb) = self.dev_ws();
        // SAFETY: the layer's lists in the device block, the caller's tensor, the workspace.
        unsafe {
            device::compact_in_place(
                v,
                kept.idx.wrapping_add(u0 * kept.idx_ld),
                kept.idx_ld as u64,
                kept.counts.wrapping_add(u0),
                n as u64,
                ws,
                wsb,
                stream,
            )
        }
    }

    /// Compact `layer`'s K or V of `seq` in its paged pool (device) in place through the
    /// sequence's block table (HOST memory, checked as in
    /// [`DeviceEvictor::score_layer_paged`], then copied to the workspace): each head's
    /// kept cells move to the front of the sequence's logical order, order kept, the rest
    /// left as it was (`cuda/paged.cu`), on `stream`. Returns what the host form's
    /// `compact_paged` returns when the selection is rectangular (token granularity or the
    /// uniform allocator: every head keeps the round's target); `None` for the others,
    /// whose counts stay on the device (the blocks then still held: `ceil(max count /
    /// block_size)`).
    ///
    /// # Safety
    /// `kv` describes device memory the caller lets us write; the table as in
    /// [`DeviceEvictor::score_layer_paged`]; `stream` is NULL or a valid CUDA stream.
    pub unsafe fn compact_paged(
        &mut self,
        seq: usize,
        layer: usize,
        kv: &DevicePool,
        table: &[u32],
        stream: *mut c_void,
    ) -> Result<Option<PagedCompaction>> {
        self.r.check_layer(layer)?;
        let st = self.state(seq)?;
        let n = st.n as usize;
        let kept = self.kept(seq)?;
        let r = self.r;
        let span = kv.check()?;
        if r.paged.is_none_or(|dt| kv.layout.dtype.size() > dt.size()) {
            return Err(Error::InvalidArgument);
        }
        if kv.layout.heads != r.m.hkv || (kv.layout.dim != r.m.dk && kv.layout.dim != r.m.dv) {
            return Err(Error::ShapeMismatch);
        }
        self.unaliased(&[span])?;
        paged::check_table(&kv.layout, table, n, self.table_scratch()?)?;
        let (ws, wsb) = self.dev_ws();
        let mut c = DeviceCarve::new(ws);
        let dtable = c.take::<u32>(r.max_cells)?;
        let stage = (ws as *mut u8).wrapping_add(c.bytes()) as *mut c_void;
        let used = kv.layout.blocks_for(n);
        let pool = kv.cuda();
        let u0 = layer * r.m.hkv;
        let ck = |s: i32| if s == 0 { Ok(()) } else { Err(Error::Cuda) };
        // SAFETY: the table's `used` checked entries into the workspace's front; the
        // layer's lists in the device block; the caller's pool (checked, device memory by
        // the contract); the staging area is the rest of the workspace.
        unsafe {
            ck(cu::kve_cuda_upload_async(
                dtable as _,
                table.as_ptr() as _,
                used * 4,
                stream,
            ))?;
            ck(cu::kve_cuda_paged_compact(
                &pool,
                dtable,
                n as i64,
                kept.idx.wrapping_add(u0 * kept.idx_ld),
                kept.idx_ld as i64,
                kept.counts.wrapping_add(u0),
                n as i64,
                stage,
                wsb as usize - c.bytes(),
                stream,
            ))?;
        }
        Ok(rectangular(&r).then(|| {
            let blocks_kept = kv.layout.blocks_for(st.target as usize);
            PagedCompaction {
                blocks_kept,
                blocks_freed: used - blocks_kept,
            }
        }))
    }

    /// Record that `seq` holds the kept cells of its selected round (host bookkeeping):
    /// the round's target for a rectangular selection; any other leaves it ragged.
    pub fn commit(&mut self, seq: usize) -> Result<()> {
        let mut st = self.state(seq)?;
        st.commit(st.target, !rectangular(&self.r))?;
        st.store(self.slot(seq)?.state);
        Ok(())
    }

    /// As [`super::Evictor::unprotect`]: protection, round and raggedness forgotten, the
    /// query ring and counters kept.
    pub fn unprotect(&mut self, seq: usize) -> Result<()> {
        let st = self.state(seq)?;
        let slot = self.slot(seq)?;
        st.unprotect().store(slot.state);
        slot.scored.fill(0);
        Ok(())
    }

    /// Forget `seq`: counters, protection, round and query ring.
    pub fn reset(&mut self, seq: usize) -> Result<()> {
        let slot = self.slot(seq)?;
        SeqState::default().store(slot.state);
        slot.scored.fill(0);
        slot.ring_rows.fill(0);
        slot.ring_dtype.fill(0);
        Ok(())
    }
}
