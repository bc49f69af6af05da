//! The evictor: one object runs a whole model's eviction for several sequences and holds
//! the policy (when, how much), over the stage functions (`score_layer`, `compute_gram`,
//! `accumulate_value_links`, `select_model(_linked)`, `compact_in_place`), which it
//! calls and never re-implements: its kept sets are bit-identical to those calls by hand.
//!
//! A round on one sequence: [`Evictor::plan`] (the policy's target) → [`Evictor::begin`]
//! → [`Evictor::score_layer`] for every layer, any order → [`Evictor::select`] → the
//! engine drops the evicted cells ([`Evictor::kept_cells`], [`Evictor::evicted_cells`]) or
//! lets [`Evictor::compact`] move its K/V rows → [`Evictor::commit`].
//!
//! Decisions, each with its reason:
//! - Caller memory sized by [`Evictor::memory_size`], no allocation: the crate is no_std
//!   and engines own their memory (zstd's static context).
//! - A sequence's cells are `0..n` in position order, the same `n` for every layer and
//!   head: what llama.cpp's cells and paged engines hold. A commit whose units kept
//!   different counts (per-head allocators) leaves the cache ragged: that sequence then
//!   takes no further round until [`Evictor::reset`], since one `n` no longer describes it.
//! - `begin` starts a round explicitly (the engine's own target or the plan's), so plan
//!   stays a pure question an engine may ask after every ubatch.
//! - `select` computes and `commit` records: between them the engine removes the cells,
//!   and a round it abandons (a new `begin`) changes no bookkeeping.
//! - The query ring keeps the last `w` query rows per layer as f32 (exact for f16/bf16),
//!   so an engine need not keep window queries itself; the window is always kept, so the
//!   ring stays valid across compressions.
//! - Scores are staged in the workspace and copied into the sequence's slot only once a
//!   layer passed: on any error the context is as it was (the workspace aside).
//! - CriticalKV without explicit score parameters gets kvpress's first stage for the
//!   round's budget, as `select_kept` in Python does.
//! - Under a cell budget a preset with a decode-time decay (`tova-decay`, `h2o`) ranks each cell by
//!   its round score plus the decayed score it had when last kept (`carry.rs`, design §3c);
//!   a round abandoned after `select` forgets the memory (its cells are renumbered there).
//! - Marks are given per round ([`Evictor::mark_cells`], between `begin` and `select`): the
//!   engine knows which cells hold the user's text by their positions, which compaction
//!   does not change, so the context keeps no marks across rounds (`marks.rs`).

/// What the host and device forms share word for word: each form's `slot(seq)` gives the
/// sequence's state words (its [`SeqState`]), and the policy and counters are read there.
macro_rules! seq_bookkeeping {
    () => {
        fn state(&mut self, seq: usize) -> Result<SeqState> {
            SeqState::load(self.slot(seq)?.state)
        }

        /// The cells sequence `seq` should hold now that it holds `n_cells` (`n_cells`:
        /// nothing to do). Changes nothing.
        pub fn plan(&mut self, seq: usize, n_cells: usize) -> Result<usize> {
            self.state(seq)?.plan(&self.r, n_cells)
        }

        pub fn stats(&mut self, seq: usize) -> Result<SeqStats> {
            Ok(self.state(seq)?.stats())
        }
    };
}

mod carry;
mod config;
#[cfg(feature = "cuda")]
pub mod device;
mod marks;
mod memory;
pub mod options;
pub mod policy;
pub mod presets;
pub mod qring;
mod state;

use crate::config::{Granularity, ScoreConfig};
use crate::error::{Error, Result};
use crate::paged::{self, PagedCompaction, PagedView, PagedViewMut};
use crate::score::{CarriedTwins, LayerInputs};
use crate::view::{View, ViewMut};
use crate::workspace::Workspace;
use crate::{budget::ModelScores, ValueLinks};
use config::{because, resolve, resolve_why, workspace_bytes};
pub(crate) use config::{cstr, Resolved};
pub use config::{EvictorConfig, ModelDims, Refusal};
pub use marks::{span_budgets, split_budget, MarkSplit, MARK_SHARE};
use memory::{Layout, Slot, ALIGN};
pub use policy::Budget;
pub use presets::{
    capture, decode_decay, default_select, preset_from_name, preset_name, Capture, WoUse, PRESETS,
};
use state::{Phase, SeqState};

/// A sequence's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SeqStats {
    /// Cells held after the last commit (0 before any).
    pub cells: u64,
    /// Cells the keep ratio never compresses again.
    pub protected: u64,
    pub evictions: u64,
    pub cells_evicted: u64,
    /// Whether the last commit left per-head sets of different lengths (no more rounds).
    pub ragged: bool,
}

/// What an engine captures for the configured method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Needs {
    pub capture: Capture,
    /// The observation window: the last `window` cells are always kept.
    pub window: u32,
    pub granularity: Granularity,
}

/// One layer's tensors for the round's `n` cells, K and V held as `KV`: [`View`]s
/// ([`Evictor::score_layer`]) or, [`PagedLayerViews`], [`PagedView`]s through the
/// sequence's block table ([`Evictor::score_layer_paged`]).
#[derive(Clone, Copy, Debug)]
pub struct LayerViews<'a, KV = View<'a>> {
    /// `[Hkv, n, dk]` (paged: `Hkv` heads of `dk`, the round's `n` tokens).
    pub keys: KV,
    /// `[Hkv, n, dv]` when [`Capture::values`] (else not read).
    pub values: Option<KV>,
    /// `[Hq, wq, dk]`, the last `wq >= min(w, n)` positions; `None`: the query ring.
    pub queries: Option<View<'a>>,
    /// Optional `[Hq][min(w, n)]` window row log-sum-exp (see [`LayerInputs::row_lse`]).
    pub row_lse: Option<&'a [f32]>,
    /// `[Hq, dv, D]` when [`Capture::wo`] is `EveryRound`.
    pub wo: Option<View<'a>>,
}

/// One layer's tensors with K and V in a paged pool ([`Evictor::score_layer_paged`]).
pub type PagedLayerViews<'a> = LayerViews<'a, PagedView<'a>>;

/// The kept set of a selected round: per (layer, KV head) `indices[offsets[u]..offsets[u +
/// 1]]`, ascending cells (the selection's CSR, protected cells included).
#[derive(Clone, Copy, Debug)]
pub struct Kept<'a> {
    pub offsets: &'a [u64],
    pub indices: &'a [u32],
}

const MAGIC: u64 = 0x6b76_6576_6963_7431; // "kvevict1"

/// What the block's first bytes hold.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct Header {
    magic: u64,
    r: Resolved,
    lay: Layout,
}

/// The context's layout for a resolved configuration.
fn layout(r: &Resolved) -> Result<Layout> {
    Layout::new(r, core::mem::size_of::<Header>(), workspace_bytes(r)?)
}

/// A whole model's eviction over caller memory.
pub struct Evictor<'a> {
    r: Resolved,
    lay: Layout,
    block: &'a mut [u8],
}

impl<'a> Evictor<'a> {
    /// Bytes of memory [`Evictor::init`] needs (alignment slack included).
    pub fn memory_size(cfg: &EvictorConfig) -> Result<usize> {
        let r = resolve(cfg)?;
        Ok(layout(&r)?.total + ALIGN - 1)
    }

    /// What [`Evictor::memory_size`] and [`Evictor::init`] check, without memory: the
    /// method's requirements ([`Evictor::needs`]) for an accepted configuration, else why
    /// it is refused (the status those calls return and a sentence naming what to change).
    pub fn check(cfg: &EvictorConfig) -> core::result::Result<Needs, Refusal> {
        let r = resolve_why(cfg)?;
        because(
            layout(&r),
            cstr!("the context's memory for this shape and max_cells overflows"),
        )?;
        Ok(r.needs())
    }

    /// An evictor in `mem` (any alignment: it starts at the first 64-byte boundary).
    /// Nothing is written on error.
    pub fn init(mem: &'a mut [u8], cfg: &EvictorConfig) -> Result<Evictor<'a>> {
        let r = resolve(cfg)?;
        let lay = layout(&r)?;
        if mem.len() < lay.total + ALIGN - 1 {
            return Err(Error::WorkspaceTooSmall);
        }
        let off = mem.as_ptr().align_offset(ALIGN);
        let block = &mut mem[off..off + lay.total];
        let h = Header {
            magic: MAGIC,
            r,
            lay,
        };
        // SAFETY: the block starts 64-byte aligned and is longer than a Header (its first
        // region); a Header is plain data.
        unsafe { core::ptr::write(block.as_mut_ptr() as *mut Header, h) };
        let mut ev = Evictor { r, lay, block };
        memory::carve_model(ev.model_bytes(), &r)?.gram_set.fill(0);
        for s in 0..r.max_seqs {
            let slot = ev.slot(s)?;
            SeqState::default().store(slot.state);
            slot.ring_rows.fill(0);
        }
        Ok(ev)
    }

    /// The evictor whose block starts at `ptr` (as `init` left it; C's `kve_evictor*`).
    ///
    /// # Safety
    /// `ptr` is NULL, or 8-byte aligned and readable for 8 bytes; when those hold the
    /// magic, `ptr` is the start of a block `init` wrote, owned by the caller for `'a`
    /// and not otherwise borrowed.
    pub unsafe fn from_block(ptr: *mut u8) -> Result<Evictor<'a>> {
        if ptr.is_null() {
            return Err(Error::NullPointer);
        }
        if ptr as usize % ALIGN != 0 {
            return Err(Error::Misaligned);
        }
        // SAFETY: the caller's contract: 8 readable, aligned bytes.
        if unsafe { *(ptr as *const u64) } != MAGIC {
            return Err(Error::InvalidArgument);
        }
        // SAFETY: the magic says `init` wrote a Header here (the caller's contract).
        let h = unsafe { core::ptr::read(ptr as *const Header) };
        // SAFETY: `init` made the block `lay.total` bytes long; the caller owns it for 'a.
        let block = unsafe { core::slice::from_raw_parts_mut(ptr, h.lay.total) };
        Ok(Evictor {
            r: h.r,
            lay: h.lay,
            block,
        })
    }

    /// The block's start (C's `kve_evictor*`).
    pub fn as_ptr(&mut self) -> *mut u8 {
        self.block.as_mut_ptr()
    }

    /// The configured layers.
    pub fn layers(&self) -> usize {
        self.r.m.layers
    }

    /// The block's byte range, for the C layer's alias checks.
    pub fn byte_range(&self) -> (usize, usize) {
        let s = self.block.as_ptr() as usize;
        (s, s + self.block.len())
    }

    /// The block without its workspace: everything an error leaves as it was (the
    /// workspace's contents are unspecified after any call).
    pub fn context_bytes(&self) -> &[u8] {
        &self.block[..self.lay.workspace]
    }

    /// What the engine captures, the window and the granularity.
    pub fn needs(&self) -> Needs {
        self.r.needs()
    }

    fn model_bytes(&mut self) -> &mut [u8] {
        memory::split(self.block, &self.lay, 0).0
    }

    fn slot(&mut self, seq: usize) -> Result<Slot<'_>> {
        if seq >= self.r.max_seqs {
            return Err(Error::InvalidArgument);
        }
        memory::carve_slot(memory::split(self.block, &self.lay, seq).1, &self.r)
    }

    seq_bookkeeping!();

    /// Set `layer`'s output projection `wo` `[Hq, dv, D]` (methods with [`WoUse::Once`]):
    /// its Gram blocks go into the context, the engine may drop `wo` after.
    pub fn set_output_projection(&mut self, layer: usize, wo: &View) -> Result<()> {
        self.r.check_layer(layer)?;
        if self.r.capture.wo != WoUse::Once {
            return Err(Error::InvalidArgument);
        }
        if wo.extent() != [self.r.m.hq, self.r.m.dv, self.r.m.d_model] {
            return Err(Error::ShapeMismatch);
        }
        let (r, lay) = (self.r, self.lay);
        let (model, _, ws) = memory::split(self.block, &lay, 0);
        let model = memory::carve_model(model, &r)?;
        let g = &mut model.gram[layer * r.gram_len..(layer + 1) * r.gram_len];
        crate::compute_gram(wo, r.m.hkv, r.score.needs_cross(), g, ws)?;
        model.gram_set[layer] = 1;
        Ok(())
    }

    /// Keep the last `w` of the query rows `q` `[Hq, c, dk]` (the ubatch's rows of
    /// sequence `seq`, in position order) in `layer`'s ring. Methods without queries:
    /// `InvalidArgument`. NaN/Inf rows are taken as they are (scoring rejects them).
    pub fn observe_queries(&mut self, seq: usize, layer: usize, q: &View) -> Result<()> {
        let [hq, c, dk] = q.extent();
        self.r.check_observe(layer, hq, dk)?;
        let (w, r) = (self.r.score.window as usize, self.r);
        let slot = self.slot(seq)?;
        let ring = &mut slot.ring[layer * r.m.hq * w * dk..(layer + 1) * r.m.hq * w * dk];
        let seen = slot.ring_rows[layer];
        for j in c.saturating_sub(w)..c {
            let at = ((seen + j as u64) % w as u64) as usize;
            for h in 0..hq {
                q.load_row(h, j, &mut ring[(h * w + at) * dk..(h * w + at + 1) * dk]);
            }
        }
        slot.ring_rows[layer] = seen.saturating_add(c as u64);
        Ok(())
    }

    /// Start a round on `seq`'s `n_cells` cells (`1..=max_cells`) that ends holding
    /// `target` cells (raised to what a selection keeps anyway: the cells the ratio
    /// protects and the window). A round in progress is abandoned.
    pub fn begin(&mut self, seq: usize, n_cells: usize, target: usize) -> Result<()> {
        let r = self.r;
        let slot = self.slot(seq)?;
        SeqState::begin_slot(&r, slot.state, slot.scored, n_cells, target)?;
        slot.links.iter_mut().take(n_cells).for_each(|x| *x = 0.0);
        Ok(())
    }

    /// Mark cells of `seq`'s begun round (before `select`): `flags[i] != 0` marks cell `i`
    /// (`flags.len()` the round's cells, else `ShapeMismatch`), text the engine was given
    /// (user turns, a system prompt) rather than text the model wrote; `share` in [0, 1]
    /// (else `InvalidArgument`) is the part of each unit's prefix budget reserved for
    /// marked cells (`marks.rs`: the rule; [`MARK_SHARE`] the tuned default). A later call
    /// in the same round replaces the marks; `begin` forgets them.
    pub fn mark_cells(&mut self, seq: usize, flags: &[u8], share: f32) -> Result<()> {
        self.mark_each(seq, flags.len(), share, MarkSplit::Share, |i| flags[i])
    }

    /// [`Evictor::mark_cells`] with the marked cells' budget spent as `split` says
    /// ([`MarkSplit::Spans`]: evenly over the marked spans, `marks.rs`: each run of
    /// consecutive cells with the same nonzero flag, so an engine that gives neighbouring
    /// turns different flags keeps them apart).
    pub fn mark_cells_split(
        &mut self,
        seq: usize,
        flags: &[u8],
        share: f32,
        split: MarkSplit,
    ) -> Result<()> {
        self.mark_each(seq, flags.len(), share, split, |i| flags[i])
    }

    /// How the marks of `seq`'s begun round spend their budget (after a mark call, before
    /// `select`; else `InvalidArgument`): [`Evictor::mark_cells_split`]'s `split` for marks
    /// given another way (by position).
    pub fn set_mark_split(&mut self, seq: usize, split: MarkSplit) -> Result<()> {
        let mut st = self.state(seq)?;
        if st.phase != Phase::Scoring || st.mark_share.is_none() {
            return Err(Error::InvalidArgument);
        }
        st.mark_split = split;
        let slot = self.slot(seq)?;
        st.store(slot.state);
        Ok(())
    }

    /// [`Evictor::mark_cells`] by position: cell `i` (at `positions[i]`, one per cell of
    /// the round, else `ShapeMismatch`) is marked when a range `[ranges[2k],
    /// ranges[2k+1])` holds it (`ranges.len()` even and every range `p0 <= p1`, else
    /// `InvalidArgument`): what an engine keeps of its marked text, as positions. Each
    /// range is a span of its own for [`MarkSplit::Spans`] (the cells of range `k`, the
    /// first range that holds them, are flagged `k % 255 + 1`), also when the text between
    /// two ranges is all evicted.
    pub fn mark_positions(
        &mut self,
        seq: usize,
        positions: &[i32],
        ranges: &[i32],
        share: f32,
    ) -> Result<()> {
        check_ranges(ranges)?;
        let pairs = ranges.chunks_exact(2);
        self.mark_each(seq, positions.len(), share, MarkSplit::Share, |i| {
            let k = pairs
                .clone()
                .position(|r| (r[0]..r[1]).contains(&positions[i]));
            k.map_or(0, |k| (k % 255) as u8 + 1)
        })
    }

    /// The marks of `seq`'s begun round: cell `i` of `n` (the round's, else
    /// `ShapeMismatch`) marked when `marked(i)` is nonzero (its value names its span),
    /// with `share` (in [0, 1]).
    fn mark_each(
        &mut self,
        seq: usize,
        n: usize,
        share: f32,
        split: MarkSplit,
        marked: impl Fn(usize) -> u8,
    ) -> Result<()> {
        if !(0.0..=1.0).contains(&share) {
            return Err(Error::InvalidArgument);
        }
        let mut st = self.state(seq)?;
        if st.phase != Phase::Scoring {
            return Err(Error::InvalidArgument);
        }
        if n != st.n as usize {
            return Err(Error::ShapeMismatch);
        }
        let slot = self.slot(seq)?;
        for (i, m) in slot.marks.iter_mut().take(n).enumerate() {
            *m = marked(i);
        }
        st.mark_share = Some(share);
        st.mark_split = split;
        st.store(slot.state);
        Ok(())
    }

    /// The cells of `seq`'s round in progress (begun or selected; `InvalidArgument`
    /// without one).
    pub fn round_cells(&mut self, seq: usize) -> Result<usize> {
        let st = self.state(seq)?;
        match st.phase {
            Phase::Scoring | Phase::Selected => Ok(st.n as usize),
            _ => Err(Error::InvalidArgument),
        }
    }

    /// Score `layer` of `seq`'s round from `v` (each layer once per round).
    pub fn score_layer(&mut self, seq: usize, layer: usize, v: &LayerViews) -> Result<()> {
        self.r.check_layer(layer)?;
        let st = self.state(seq)?;
        let (r, lay) = (self.r, self.lay);
        let (model, slot, ws) = memory::split(self.block, &lay, seq);
        score_into(&r, &st, layer, v, model, slot, ws)
    }

    /// [`Evictor::score_layer`] from K (and V) in a paged pool (the sequence's block table
    /// inside each view; `keys.len()` the round's cells): each is gathered into the
    /// workspace (config [`EvictorConfig::paged`]: its element type at most, else
    /// `InvalidArgument`) and scored as a strided view, so kept sets are bit-identical to
    /// the same K/V given contiguous.
    pub fn score_layer_paged(
        &mut self,
        seq: usize,
        layer: usize,
        v: &PagedLayerViews,
    ) -> Result<()> {
        let size = |p: &PagedView| p.layout().dtype.size();
        let st = self.gather_round(seq, layer, size(&v.keys), v.values.as_ref().map(size))?;
        let r = self.r;
        let n = st.n as usize;
        let same = |p: &PagedView, d: usize| {
            let l = p.layout();
            p.len() == n && l.heads == r.m.hkv && l.dim == d
        };
        if !same(&v.keys, r.m.dk) || !v.values.as_ref().map_or(true, |p| same(p, r.m.dv)) {
            return Err(Error::ShapeMismatch);
        }
        self.score_gathered(seq, layer, &st, v, |p, buf| paged::gather(p, buf))
    }

    /// [`Evictor::score_layer`] from K (and V) of an engine's whole cell stream (`[Hkv, S,
    /// d]`, any dtype a view takes, V transposed or not): the round's cells, `cells[i]`
    /// its `i`-th in position order (`cells.len()` the round's, else `ShapeMismatch`;
    /// each below `S`), are gathered into the workspace (config [`EvictorConfig::paged`]
    /// at least their element size, else `InvalidArgument`) and scored, so scores are
    /// bit-identical to those of the same rows given as a strided view.
    pub fn score_layer_cells(
        &mut self,
        seq: usize,
        layer: usize,
        v: &LayerViews,
        cells: &[u32],
    ) -> Result<()> {
        let r = self.r;
        let values = v.values.as_ref().filter(|_| r.capture.values);
        let size = |x: &View| x.dtype().size();
        let st = self.gather_round(seq, layer, size(&v.keys), values.map(size))?;
        let same = |x: &View, d: usize| {
            let [h, _, dd] = x.extent();
            h == r.m.hkv && dd == d
        };
        if cells.len() != st.n as usize
            || !same(&v.keys, r.m.dk)
            || !values.map_or(true, |x| same(x, r.m.dv))
        {
            return Err(Error::ShapeMismatch);
        }
        self.score_gathered(seq, layer, &st, v, |x, buf| x.gather_rows(cells, buf))
    }

    /// The checks [`Evictor::score_layer_paged`] and [`Evictor::score_layer_cells`] make
    /// before their shapes, in order: `layer`, `seq`, a configured gather element type
    /// ([`EvictorConfig::paged`]) that the keys' and values' element sizes fit, a round
    /// being scored (`InvalidArgument` for the last three). Returns `seq`'s state.
    fn gather_round(
        &mut self,
        seq: usize,
        layer: usize,
        keys: usize,
        values: Option<usize>,
    ) -> Result<SeqState> {
        self.r.check_layer(layer)?;
        let st = self.state(seq)?;
        let Some(dt) = self.r.paged else {
            return Err(Error::InvalidArgument);
        };
        if keys > dt.size() || values.is_some_and(|s| s > dt.size()) {
            return Err(Error::InvalidArgument);
        }
        if st.phase != Phase::Scoring {
            return Err(Error::InvalidArgument);
        }
        Ok(st)
    }

    /// Score `layer` of `seq`'s round `st` from `v`'s K (and V, when the method reads
    /// values) gathered by `gather` into the block's gather area: the checked tail of
    /// [`Evictor::score_layer_paged`] and [`Evictor::score_layer_cells`].
    fn score_gathered<KV>(
        &mut self,
        seq: usize,
        layer: usize,
        st: &SeqState,
        v: &LayerViews<'_, KV>,
        gather: impl for<'b> Fn(&KV, &'b mut [u8]) -> Result<View<'b>>,
    ) -> Result<()> {
        let (r, lay) = (self.r, self.lay);
        let [model, slot, kg, vg, ws] = gather_split(self.block, &r, &lay, seq)?;
        let keys = gather(&v.keys, kg)?;
        // values the method does not read are not gathered (nor read)
        let values = match v.values.as_ref().filter(|_| r.capture.values) {
            Some(x) => Some(gather(x, vg)?),
            None => None,
        };
        let lv = LayerViews {
            keys,
            values,
            queries: v.queries,
            row_lse: v.row_lse,
            wo: v.wo,
        };
        score_into(&r, st, layer, &lv, model, slot, ws)
    }

    /// `cells` (a round's, at most `max_cells`: else `ShapeMismatch`) name no cell twice
    /// (`Aliasing`): checked on a sorted copy in the workspace (its contents unspecified
    /// after).
    pub fn check_distinct(&mut self, cells: &[u32]) -> Result<()> {
        let max = self.r.max_cells;
        distinct_cells(cells, max, self.scratch())
    }

    /// Select the round's kept set once every layer is scored: over all cells, or (keep
    /// ratio) over the cells since the protected ones, which are kept.
    pub fn select(&mut self, seq: usize) -> Result<Kept<'_>> {
        let mut st = self.state(seq)?;
        let (r, lay) = (self.r, self.lay);
        let (_, slot, ws) = memory::split(self.block, &lay, seq);
        let slot = memory::carve_slot(slot, &r)?;
        if st.phase != Phase::Scoring || slot.scored.contains(&0) {
            return Err(Error::InvalidArgument);
        }
        let (n, start) = (st.n as usize, st.start as usize);
        let window = r.score.window as usize;
        let units = r.m.layers * r.m.hkv;
        let p = n - window.min(n); // the scores' prefix
        let m = n - start; // the cells selected over
        let ps = m - window.min(m);
        let mut cfg = r.select;
        cfg.budget = policy::span_budget(st.start, st.n, window as u64, st.target);
        let (no, ni) = crate::select_output_len(&cfg, r.m.layers, r.m.hkv, m, window)?;
        // two parts' budgets may round to more than one pyramid's
        let ni = if st.mark_share.is_some() {
            ni.max(units * m)
        } else {
            ni
        };
        let mut ws = Workspace::new(ws);
        let span = ws.take_dirty::<f32>(if start > 0 { units * ps } else { 0 })?;
        let offsets = ws.take_dirty::<u64>(no)?;
        let indices = ws.take_dirty::<u32>(ni)?;
        let rest = ws.into_rest();
        let scores = memory::floats(slot.words);
        // the span's scores, contiguous per unit as the selection reads them
        let scores: &[f32] = if start > 0 {
            for u in 0..units {
                span[u * ps..(u + 1) * ps]
                    .copy_from_slice(&scores[u * p + start..u * p + start + ps]);
            }
            span
        } else {
            &scores[..units * p]
        };
        let ms = ModelScores {
            scores,
            layers: r.m.layers,
            hkv: r.m.hkv,
            n: m,
            window,
        };
        let links = r.links.map(|threshold| ValueLinks {
            sums: &slot.links[start..n],
            threshold,
        });
        let marked = match st.mark_share {
            Some(share) => {
                let flags = &slot.marks[start..n];
                let split = st.mark_split;
                marks::select_marked(
                    &cfg, &ms, links, flags, share, split, offsets, indices, rest,
                )?
            }
            None => false,
        };
        match links {
            _ if marked => {}
            Some(links) => crate::select_model_linked(&cfg, &ms, links, offsets, indices, rest)?,
            None => crate::select_model(&cfg, &ms, offsets, indices, rest)?,
        }
        if r.decay > 0.0 && start == 0 {
            // the kept cells' scores, for the next round (the old carry is spent)
            carry::keep_carried(slot.carry, scores, offsets, indices, units, r.max_cells, p);
            st.carried = 0;
        }
        if r.carries_twins(st.start, st.n) {
            // each unit's lists follow its kept cells to the front (`twins.rs`)
            let words = r.twins * crate::score::TWIN_WORDS;
            for u in 0..units {
                let kept = &indices[offsets[u] as usize..offsets[u + 1] as usize];
                crate::score::remap_twins(&mut slot.twins[u * words..(u + 1) * words], kept);
            }
            st.carried = 0;
        }
        // every unit's list: the protected cells, then the span's, shifted back
        let kept = memory::cells(slot.words);
        let mut o = 0usize;
        for u in 0..units {
            slot.offsets[u] = o as u64;
            for c in 0..start as u32 {
                kept[o] = c;
                o += 1;
            }
            for &i in &indices[offsets[u] as usize..offsets[u + 1] as usize] {
                kept[o] = i + start as u32;
                o += 1;
            }
        }
        slot.offsets[units] = o as u64;
        st.phase = Phase::Selected;
        st.kept_total = o as u64;
        st.store(slot.state);
        self.kept(seq)
    }

    /// The kept set of `seq`'s selected round.
    pub fn kept(&mut self, seq: usize) -> Result<Kept<'_>> {
        let st = self.state(seq)?;
        if st.phase != Phase::Selected {
            return Err(Error::InvalidArgument);
        }
        let (r, lay) = (self.r, self.lay);
        let slot = memory::carve_slot(memory::split(self.block, &lay, seq).1, &r)?;
        let Slot { words, offsets, .. } = slot;
        let total = st.kept_total as usize;
        let indices = Workspace::new(words).take_dirty::<u32>(total)?;
        Ok(Kept { offsets, indices })
    }

    /// Marks of the cells some unit keeps, in the workspace (`[n]`, 1 = kept); with the
    /// round's cell count.
    fn kept_marks(&mut self, seq: usize) -> Result<(&mut [u8], usize)> {
        let st = self.state(seq)?;
        if st.phase != Phase::Selected {
            return Err(Error::InvalidArgument);
        }
        let n = st.n as usize;
        let (r, lay) = (self.r, self.lay);
        let (_, slot, ws) = memory::split(self.block, &lay, seq);
        let slot = memory::carve_slot(slot, &r)?;
        let marks = Workspace::new(ws).take::<u8>(n)?;
        // a token-granular set is every unit's: its first unit says it all
        let end = match r.select.granularity {
            Granularity::Token => slot.offsets[1],
            _ => st.kept_total,
        };
        for &c in &memory::cells(slot.words)[..end as usize] {
            marks[c as usize] = 1;
        }
        Ok((marks, n))
    }

    /// How many cells some unit keeps (what [`Evictor::kept_cells`] writes).
    pub fn kept_cell_count(&mut self, seq: usize) -> Result<usize> {
        let (marks, n) = self.kept_marks(seq)?;
        Ok(marks[..n].iter().filter(|&&m| m == 1).count())
    }

    /// The cells some unit keeps (all of a token-granular set), ascending, into `out`;
    /// returns their count (`OutputTooSmall` when `out` is shorter, nothing written).
    pub fn kept_cells(&mut self, seq: usize, out: &mut [u32]) -> Result<usize> {
        let (marks, n) = self.kept_marks(seq)?;
        write_cells(marks, n, 1, out)
    }

    /// The cells no unit keeps (what an engine of shared cells removes), ascending.
    pub fn evicted_cells(&mut self, seq: usize, out: &mut [u32]) -> Result<usize> {
        let (marks, n) = self.kept_marks(seq)?;
        write_cells(marks, n, 0, out)
    }

    /// Move `layer`'s kept rows of `kv` (`[Hkv, n, d]`, K or V) to the front of each head,
    /// in place (see [`crate::compact::compact_in_place`]).
    pub fn compact(&mut self, seq: usize, layer: usize, kv: &mut ViewMut) -> Result<()> {
        self.r.check_layer(layer)?;
        let n = self.state(seq)?.n as usize;
        let hkv = self.r.m.hkv;
        let kept = self.kept(seq)?;
        let [h, c, _] = kv.extent();
        if h != hkv || c != n {
            return Err(Error::ShapeMismatch);
        }
        let offsets = &kept.offsets[layer * hkv..=(layer + 1) * hkv];
        crate::compact::compact_in_place(kv, offsets, kept.indices, None)
    }

    /// Compact `layer`'s K or V of `seq` in its paged pool, in place: each head's kept
    /// tokens move to the front of the sequence's own blocks (order kept; see
    /// [`crate::paged::compact_paged`]). Returns how many of the sequence's trailing
    /// blocks now hold nothing (the same for every layer, K and V, at token granularity;
    /// the most any head needs otherwise): the engine releases `table[blocks_kept ..]`.
    pub fn compact_paged(
        &mut self,
        seq: usize,
        layer: usize,
        kv: &mut PagedViewMut,
    ) -> Result<PagedCompaction> {
        self.r.check_layer(layer)?;
        let n = self.state(seq)?.n as usize;
        let hkv = self.r.m.hkv;
        let kept = self.kept(seq)?;
        let v = kv.as_view();
        if v.layout().heads != hkv || v.len() != n {
            return Err(Error::ShapeMismatch);
        }
        let offsets = &kept.offsets[layer * hkv..=(layer + 1) * hkv];
        paged::compact_paged(kv, offsets, kept.indices, None, None, None)
    }

    /// The workspace as scratch for the table check of a paged view of a round
    /// ([`PagedView::new`], [`PagedViewMut::new`]): at least
    /// [`crate::paged::table_check_size_for`] `max_cells` tokens, whatever the pool's
    /// size. Its contents are unspecified after any call.
    pub fn scratch(&mut self) -> &mut [u8] {
        let lay = self.lay;
        memory::split(self.block, &lay, 0).2
    }

    /// Record that `seq` now holds the kept cells of its selected round: they are all
    /// protected from the keep ratio.
    pub fn commit(&mut self, seq: usize) -> Result<()> {
        let mut st = self.state(seq)?;
        if st.phase != Phase::Selected {
            return Err(Error::InvalidArgument);
        }
        let units = self.r.m.layers * self.r.m.hkv;
        let decay = self.r.decay;
        let twins = self.r.carries_twins(st.start, st.n);
        let slot = self.slot(seq)?;
        let len = |u: usize| slot.offsets[u + 1] - slot.offsets[u];
        let held = (0..units).map(len).max().unwrap_or(0);
        st.commit(held, (0..units).any(|u| len(u) != held))?;
        st.carried = if (decay > 0.0 || twins) && !st.ragged {
            held
        } else {
            0
        };
        st.store(slot.state);
        Ok(())
    }

    /// Forget `seq` (ended or cleared): counters, protection, round and query ring.
    pub fn reset(&mut self, seq: usize) -> Result<()> {
        let slot = self.slot(seq)?;
        SeqState::default().store(slot.state);
        slot.ring_rows.fill(0);
        Ok(())
    }

    /// The engine changed `seq`'s cells itself (removed or rewound some, or copied others
    /// in): forget its protection (the keep ratio takes every cell as new), its round and
    /// raggedness; keep its query ring (the window's queries still precede what comes
    /// next) and its counters. [`Evictor::reset`] forgets everything.
    pub fn unprotect(&mut self, seq: usize) -> Result<()> {
        let st = self.state(seq)?;
        st.unprotect().store(self.slot(seq)?.state);
        Ok(())
    }
}

/// The scoring of the round: kvpress's CriticalKV first stage for its budget.
fn round_score(r: &Resolved, st: &SeqState) -> ScoreConfig {
    let mut cfg = r.score;
    if r.critical_default {
        let w = (cfg.window as u64).min(st.n);
        let b = policy::span_budget(st.start, st.n, cfg.window as u64, st.target);
        let total = b + w;
        cfg.critical_first_stage = ((total / 2).max(1).saturating_sub(w)) as u32;
    }
    cfg
}

/// Ranges `[r[2k], r[2k+1])` of marked positions ([`Evictor::mark_positions`]): an even
/// count, each `p0 <= p1` (else `InvalidArgument`).
/// `cells` (a round's, at most `max`: else `ShapeMismatch`) name no cell twice
/// (`Aliasing`): checked on a sorted copy in `scratch` (its contents unspecified after).
pub(crate) fn distinct_cells(cells: &[u32], max: usize, scratch: &mut [u8]) -> Result<()> {
    if cells.len() > max {
        return Err(Error::ShapeMismatch);
    }
    let copy = Workspace::new(scratch).take_dirty::<u32>(cells.len())?;
    copy.copy_from_slice(cells);
    copy.sort_unstable();
    match copy.windows(2).any(|w| w[0] == w[1]) {
        true => Err(Error::Aliasing),
        false => Ok(()),
    }
}

pub fn check_ranges(ranges: &[i32]) -> Result<()> {
    let pairs = ranges.chunks_exact(2);
    match !pairs.remainder().is_empty() || pairs.clone().any(|r| r[0] > r[1]) {
        true => Err(Error::InvalidArgument),
        false => Ok(()),
    }
}

/// `seq`'s parts of the block for a layer scored from gathered K/V: the model, its slot,
/// the K and V gather areas and the rest of the workspace.
fn gather_split<'b>(
    block: &'b mut [u8],
    r: &Resolved,
    lay: &Layout,
    seq: usize,
) -> Result<[&'b mut [u8]; 5]> {
    let (model, slot, ws) = memory::split(block, lay, seq);
    let (gathered, ws) = ws.split_at_mut(config::gather_bytes(r)?.min(ws.len()));
    let kpart = config::gather_part(r, r.m.dk)?.min(gathered.len());
    let (kg, vg) = gathered.split_at_mut(kpart);
    Ok([model, slot, kg, vg, ws])
}

/// Score `layer` of the round `st` from `v` into the sequence's slot (`model`, `slot`:
/// the block's parts; `ws`: the workspace), staged so that an error writes nothing.
fn score_into(
    r: &Resolved,
    st: &SeqState,
    layer: usize,
    v: &LayerViews,
    model: &mut [u8],
    slot: &mut [u8],
    ws: &mut [u8],
) -> Result<()> {
    let cfg = round_score(r, st);
    let n = st.n as usize;
    let w = (cfg.window as usize).min(n);
    let p = n - w;
    let model = memory::carve_model(model, r)?;
    let slot = memory::carve_slot(slot, r)?;
    if st.phase != Phase::Scoring || slot.scored[layer] != 0 {
        return Err(Error::InvalidArgument);
    }
    if v.keys.extent() != [r.m.hkv, n, r.m.dk] {
        return Err(Error::ShapeMismatch);
    }
    let values = match v.values {
        Some(val) if val.extent() != [r.m.hkv, n, r.m.dv] => return Err(Error::ShapeMismatch),
        Some(val) => Some(val),
        None if r.capture.values => return Err(Error::NullPointer),
        None => None,
    };
    let mut ws = Workspace::new(ws);
    let stage = ws.take_dirty::<f32>(r.m.hkv * p)?;
    let ring_q = ws.take_dirty::<f32>(if r.capture.queries {
        r.m.hq * w * r.m.dk
    } else {
        0
    })?;
    let l1 = ws.take_dirty::<f32>(if r.capture.wo == WoUse::EveryRound {
        r.m.hkv * n
    } else {
        0
    })?;
    let rest = ws.into_rest();
    let mut inputs = LayerInputs {
        keys: Some(v.keys),
        values,
        row_lse: v.row_lse,
        ..LayerInputs::default()
    };
    let ring_view;
    if r.capture.queries {
        inputs.queries = match v.queries {
            Some(q) => Some(q),
            None => {
                ring_view = ring_window(r, slot.ring, slot.ring_rows[layer], layer, w, ring_q)?;
                Some(ring_view)
            }
        };
    }
    if r.capture.wo == WoUse::Once {
        if model.gram_set[layer] == 0 {
            return Err(Error::InvalidArgument);
        }
        inputs.gram = Some(&model.gram[layer * r.gram_len..(layer + 1) * r.gram_len]);
    }
    if r.capture.wo == WoUse::EveryRound {
        let wo = v.wo.as_ref().ok_or(Error::NullPointer)?;
        let values = values.as_ref().ok_or(Error::NullPointer)?;
        if wo.extent() != [r.m.hq, r.m.dv, r.m.d_model] {
            return Err(Error::ShapeMismatch);
        }
        crate::compute_value_l1(values, wo, l1, rest)?;
        inputs.value_l1 = Some(l1);
    }
    // uniqueness under a cell budget: the twin lists of the cells the last round kept
    // (`score/uniqueness/twins.rs`). They change only inside the head loop, after every
    // check that can reject the input (finite unit rows give finite scores).
    let words = r.m.hkv * r.twins * crate::score::TWIN_WORDS;
    let twins = r.carries_twins(st.start, st.n).then(|| CarriedTwins {
        lists: &mut slot.twins[layer * words..(layer + 1) * words],
        cap: r.twins,
        held: st.carried as usize,
    });
    crate::score::score_layer_carried(&cfg, &inputs, stage, rest, twins)?;
    if r.decay > 0.0 {
        let (carried, hkv) = (st.carried as usize, r.m.hkv);
        carry::add_carried(
            stage,
            slot.carry,
            layer,
            hkv,
            r.max_cells,
            p,
            carried,
            r.decay,
        );
    }
    if r.links.is_some() {
        let values = values.as_ref().ok_or(Error::NullPointer)?;
        crate::accumulate_value_links(values, &mut slot.links[..n], rest)?;
    }
    memory::floats(slot.words)[layer * r.m.hkv * p..(layer + 1) * r.m.hkv * p]
        .copy_from_slice(stage);
    slot.scored[layer] = 1;
    Ok(())
}

/// The last `w` observed query rows of `layer`, oldest first, as a `[Hq, w, dk]` view of
/// `dst`; fewer than `w` observed is `InvalidArgument`.
fn ring_window<'d>(
    r: &Resolved,
    ring: &[f32],
    rows: u64,
    layer: usize,
    w: usize,
    dst: &'d mut [f32],
) -> Result<View<'d>> {
    let (cap, dk) = (r.score.window as usize, r.m.dk);
    if rows < w as u64 {
        return Err(Error::InvalidArgument);
    }
    let ring = &ring[layer * r.m.hq * cap * dk..(layer + 1) * r.m.hq * cap * dk];
    for j in 0..w {
        let at = ((rows - w as u64 + j as u64) % cap as u64) as usize;
        for h in 0..r.m.hq {
            let src = &ring[(h * cap + at) * dk..(h * cap + at + 1) * dk];
            dst[(h * w + j) * dk..(h * w + j + 1) * dk].copy_from_slice(src);
        }
    }
    View::f32_contiguous(dst, [r.m.hq, w, dk])
}

/// The cells `c < n` whose mark is `want`, ascending, into `out`; their count.
fn write_cells(marks: &[u8], n: usize, want: u8, out: &mut [u32]) -> Result<usize> {
    let count = marks[..n].iter().filter(|&&m| m == want).count();
    if out.len() < count {
        return Err(Error::OutputTooSmall);
    }
    let cells = (0..n as u32).filter(|&c| marks[c as usize] == want);
    for (o, c) in out.iter_mut().zip(cells) {
        *o = c;
    }
    Ok(count)
}
