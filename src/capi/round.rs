//! One eviction round over an engine's cache as it holds it (`kve_evictor_run_round`):
//! the engine describes each layer's K/V over its whole cell stream and names the
//! sequence's cells in it; the library gathers them by index, scores every layer,
//! selects, and returns the kept cells: the round an engine otherwise runs call by call
//! (`kve_evictor_begin`, `_mark_cells`, `_score_layer` per layer, `_select`,
//! `_kept_cells`). The layers' tensors come as arrays (every layer at once) or from the
//! engine's `fill` callback, one layer at a time (a copy of one layer at a time).

use super::evictor::{kve_evictor, kve_evictor_layer, KVE_EVICTOR_LAYER_V1_SIZE, NO_LAYER};
use super::params::{extensible, read_ext};
use super::{
    check_alias, kve_tensor, out_param, span_sized, to_status, to_usize, tri, Buf, Span, Tensor,
    KVE_OK,
};
use crate::error::{Error, Result};
use crate::evictor::{Evictor, LayerViews, MarkSplit};
use core::ffi::c_void;

/// A round over an engine's cache (fill with `kve_evictor_round_init`: everything absent).
/// Layer `l`'s K is `keys[l]`, `[Hkv, S, dk]` over every cell of the engine's stream
/// (`S` cells, any dtype, strides as the engine stores them), V likewise (`[Hkv, S, dv]`,
/// transposed or not); the round's cells are `cells[0 .. n_cells]`, indices along axis 1,
/// in position order.
/// Or (`n_keys` 0, since `KVE_EVICTOR_ROUND_V2_SIZE`) the engine's `fill` gives each
/// layer's tensors when the round reaches it.
/// Each pointer is followed by its length, so the layout is the same for 32- and 64-bit
/// callers.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kve_evictor_round {
    pub struct_size: u32,
    /// Must be 0.
    pub reserved: u32,
    /// The sequence's cells in the stream, in position order (`1 ..= max_cells` of them,
    /// each below every tensor's `extent[1]`: `KVE_ERR_OUT_OF_BOUNDS`; none twice:
    /// `KVE_ERR_ALIASING`). Cells of other sequences are not read. NULL: cells `0 ..
    /// n_cells`, every tensor's `extent[1]` exactly `n_cells` (`KVE_ERR_SHAPE_MISMATCH`):
    /// K/V the engine holds (or copied) in position order, scored as they are (no gather
    /// area needed).
    pub cells: *const u32,
    pub n_cells: u64,
    /// Optional (`n_marks` 0: none): `n_cells` flags, as `kve_evictor_mark_cells`'s,
    /// with `mark_share`.
    pub marks: *const u8,
    pub n_marks: u64,
    /// Or the marks by position (`n_mark_ranges` 0: none; not with `marks`:
    /// `KVE_ERR_INVALID_ARGUMENT`): the cells' positions (`n_positions == n_cells`, else
    /// `KVE_ERR_SHAPE_MISMATCH`) and ranges `[mark_ranges[2k], mark_ranges[2k+1])` of
    /// marked positions (`n_mark_ranges` values, even, each range `p0 <= p1`, else
    /// `KVE_ERR_INVALID_ARGUMENT`): a cell is marked when a range holds its position.
    pub positions: *const i32,
    pub n_positions: u64,
    pub mark_ranges: *const i32,
    pub n_mark_ranges: u64,
    /// Layer `l`'s K, `[Hkv, S, dk]`: `n_keys` must be the context's layers
    /// (`KVE_ERR_SHAPE_MISMATCH`), or 0 with `fill`.
    pub keys: *const kve_tensor,
    pub n_keys: u64,
    /// Layer `l`'s V, `[Hkv, S, dv]`, when the method reads values (`n_values` 0: none,
    /// else the layers; not read when the method reads none).
    pub values: *const kve_tensor,
    pub n_values: u64,
    /// Layer `l`'s window queries `[Hq, wq, dk]`, as `kve_evictor_layer.queries`
    /// (`n_queries` 0: the rows `kve_evictor_observe_queries` kept, else the layers).
    pub queries: *const kve_tensor,
    pub n_queries: u64,
    /// Cells the round ends holding (as `kve_evictor_begin`'s `target`).
    pub target: u64,
    pub mark_share: f32,
    /// With marks, how the marked cells' budget is spent: `KVE_MARK_SPLIT_SHARE` (0, the
    /// default: one selection over them) or `KVE_MARK_SPLIT_SPANS` (1: split evenly over
    /// the marked spans, one selection each: by position, the cells of each range, also
    /// when the text between two ranges is evicted; by `marks`, each run of consecutive
    /// cells with the same nonzero flag); else
    /// `KVE_ERR_INVALID_ARGUMENT`. (Before issue 28's ninth pass: `pad`, which had to be 0.)
    pub mark_split: u32,
    /// Since `KVE_EVICTOR_ROUND_V2_SIZE`, optional (NULL: the arrays above): with `n_keys`,
    /// `n_values` and `n_queries` 0 (else `KVE_ERR_INVALID_ARGUMENT`), called once per
    /// layer, in layer order, when the round reaches it: `fill(user, layer, out)` writes
    /// that layer's `keys`, `values`, `queries` into `*out` (a `kve_evictor_layer` the
    /// library set absent, `KVE_EVICTOR_LAYER_V1_SIZE`; `row_lse` and `wo` stay absent, else
    /// `KVE_ERR_INVALID_ARGUMENT`), as the arrays would give them. Its tensors are read
    /// until `fill` is next called or the call returns, so one buffer can hold every
    /// layer's copy in turn. A nonzero return ends the round with `KVE_ERR_CALLBACK`.
    /// `fill` must not call the library on this context. Its tensors are checked as the
    /// arrays' are, but only when it has given them: after the round has begun.
    pub fill: kve_evictor_fill_fn,
    /// The layers `fill` gives: the context's layers (`KVE_ERR_SHAPE_MISMATCH`), 0 without
    /// `fill`.
    pub fill_layers: u64,
    /// Passed to `fill` as it is; never read by the library.
    pub user: *mut c_void,
    /// Must be 0 (keeps `user` in 8 bytes on 32-bit callers).
    pub user_pad: u64,
}

/// `kve_evictor_round.fill`: write layer `layer`'s tensors into `*out`; 0, or any other
/// value to end the round (`KVE_ERR_CALLBACK`).
pub type kve_evictor_fill_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, layer: u64, out: *mut kve_evictor_layer) -> i32>;

/// `sizeof(kve_evictor_round)` of the first release.
pub const KVE_EVICTOR_ROUND_V1_SIZE: u32 = 136;
/// With `fill`, `fill_layers`, `user`, `user_pad`.
pub const KVE_EVICTOR_ROUND_V2_SIZE: u32 = 168;
extensible!(kve_evictor_round: [KVE_EVICTOR_ROUND_V1_SIZE, KVE_EVICTOR_ROUND_V2_SIZE]);

const NO_ROUND: kve_evictor_round = kve_evictor_round {
    struct_size: KVE_EVICTOR_ROUND_V2_SIZE,
    reserved: 0,
    cells: core::ptr::null(),
    n_cells: 0,
    marks: core::ptr::null(),
    n_marks: 0,
    positions: core::ptr::null(),
    n_positions: 0,
    mark_ranges: core::ptr::null(),
    n_mark_ranges: 0,
    keys: core::ptr::null(),
    n_keys: 0,
    values: core::ptr::null(),
    n_values: 0,
    queries: core::ptr::null(),
    n_queries: 0,
    target: 0,
    mark_share: 0.0,
    mark_split: 0,
    fill: None,
    fill_layers: 0,
    user: core::ptr::null_mut(),
    user_pad: 0,
};

/// Set everything in `round` absent and its `struct_size` (`KVE_EVICTOR_ROUND_V1_SIZE`
/// or `KVE_EVICTOR_ROUND_V2_SIZE`).
/// Writes only `round`.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_round_init(
    round: *mut kve_evictor_round,
    struct_size: u32,
) -> i32 {
    // SAFETY: the caller passes NULL or `struct_size` writable bytes; write_ext checks the rest.
    to_status(unsafe {
        super::params::write_ext(round, struct_size, KVE_EVICTOR_ROUND_V1_SIZE, NO_ROUND)
    })
}

/// `n` descriptors at `p`: none (`n` 0, unless `required`) or one per layer.
fn per_layer(
    p: *const kve_tensor,
    n: u64,
    layers: usize,
    required: bool,
) -> Result<Option<Buf<kve_tensor>>> {
    match n {
        0 if !required => Ok(None),
        _ if to_usize(n)? != layers => Err(Error::ShapeMismatch),
        _ => Buf::new(p, n).map(Some),
    }
}

/// A round's arguments as `kve_evictor_run_round` and `kve_cuda_evictor_run_round` take
/// them, read and checked (everything but the layers' tensors `fill` gives): the host and
/// device forms' common front.
pub(crate) struct RoundArgs<'a> {
    pub r: kve_evictor_round,
    /// `cells` NULL: the tensors hold the round's cells in position order.
    pub dense: bool,
    pub n: usize,
    pub cells: &'a [u32],
    pub marks: Option<&'a [u8]>,
    pub positions: &'a [i32],
    pub ranges: &'a [i32],
    keys: Option<&'a [kve_tensor]>,
    values: Option<&'a [kve_tensor]>,
    queries: Option<&'a [kve_tensor]>,
    top: usize,
    /// The call's outputs (the context, `kept`, `count`): no tensor may overlap them.
    pub outputs: [Span; 3],
}

impl<'a> RoundArgs<'a> {
    /// `round` read (`KVE_EVICTOR_ROUND_V1_SIZE` or V2) and checked for a context of
    /// `layers` layers (its bytes `ctx`) writing `kept` (room for `len` cells) and `count`:
    /// the statuses `kve_evictor_run_round` documents, in its order.
    ///
    /// # Safety
    /// `round` is NULL or the caller's struct, its pointers the caller's buffers.
    pub unsafe fn read(
        round: *const kve_evictor_round,
        layers: usize,
        outputs: [Span; 3],
        len: u64,
    ) -> Result<RoundArgs<'a>> {
        // SAFETY: NULL or the caller's struct; read_ext checks NULL, alignment, struct_size.
        let r = unsafe { read_ext(round, KVE_EVICTOR_ROUND_V1_SIZE, NO_ROUND)? };
        if r.reserved != 0 || r.mark_split > 1 || r.user_pad != 0 {
            return Err(Error::InvalidArgument);
        }
        match r.fill {
            Some(_) if r.n_keys != 0 || r.n_values != 0 || r.n_queries != 0 => {
                return Err(Error::InvalidArgument)
            }
            Some(_) if to_usize(r.fill_layers)? != layers => return Err(Error::ShapeMismatch),
            None if r.fill_layers != 0 => return Err(Error::InvalidArgument),
            _ => {}
        }
        let dense = r.cells.is_null();
        let n = to_usize(r.n_cells)?;
        let cells = Buf::new(r.cells, if dense { 0 } else { r.n_cells })?;
        if n == 0 {
            return Err(Error::InvalidArgument);
        }
        // room for every cell, so that a short `kept` is refused before the round begins
        if len < r.n_cells {
            return Err(Error::OutputTooSmall);
        }
        let marks = match r.n_marks {
            0 => None,
            m if m != r.n_cells => return Err(Error::ShapeMismatch),
            m => Some(Buf::new(r.marks, m)?),
        };
        // the marks by position: ranges, and the cells' positions
        let ranges = Buf::new(r.mark_ranges, r.n_mark_ranges)?;
        let positions = match (ranges.len(), r.n_positions) {
            (0, _) => Buf::new(r.positions, 0)?,
            _ if marks.is_some() => return Err(Error::InvalidArgument),
            (_, p) if p != r.n_cells => return Err(Error::ShapeMismatch),
            (_, p) => Buf::new(r.positions, p)?,
        };
        let keys = per_layer(r.keys, r.n_keys, layers, r.fill.is_none())?;
        let values = per_layer(r.values, r.n_values, layers, false)?;
        let queries = per_layer(r.queries, r.n_queries, layers, false)?;
        let span = |b: &Option<Buf<kve_tensor>>| b.as_ref().map_or(Span::EMPTY, |b| b.span);
        let inputs = [
            span_sized(round, r.struct_size),
            cells.span,
            marks.as_ref().map_or(Span::EMPTY, |m| m.span),
            ranges.span,
            positions.span,
            span(&keys),
            span(&values),
            span(&queries),
        ];
        check_alias(&outputs, &inputs)?;
        // SAFETY: Buf::new checked them; check_alias: no output overlaps them.
        let cells = unsafe { cells.slice() };
        // SAFETY: as above.
        let [keys, values, queries] =
            [keys, values, queries].map(|b| b.map(|b| unsafe { b.slice() }));
        // SAFETY: as above.
        let (positions, ranges) = unsafe { (positions.slice(), ranges.slice()) };
        crate::evictor::check_ranges(ranges)?;
        // the marks' share, checked here so that the round never begins on a bad one
        if (marks.is_some() || !ranges.is_empty()) && !(0.0..=1.0).contains(&r.mark_share) {
            return Err(Error::InvalidArgument);
        }
        Ok(RoundArgs {
            r,
            dense,
            n,
            cells,
            // SAFETY: as above.
            marks: marks.map(|m| unsafe { m.slice() }),
            positions,
            ranges,
            keys,
            values,
            queries,
            top: cells.iter().copied().max().unwrap_or(0) as usize,
            outputs,
        })
    }

    /// Layer `l`'s K, V and queries descriptors (absent: NULL `data`), from the arrays or
    /// from the engine's `fill` (`KVE_ERR_CALLBACK` when it returns nonzero).
    pub fn layer(&self, l: usize) -> Result<[kve_tensor; 3]> {
        let absent = NO_LAYER.keys;
        let Some(fill) = self.r.fill else {
            let at = |t: Option<&[kve_tensor]>| t.map_or(absent, |t| t[l]);
            return Ok([at(self.keys), at(self.values), at(self.queries)]);
        };
        let mut out = NO_LAYER;
        // SAFETY: the caller's callback (`kve_evictor_round.fill`), given a struct of ours
        // to write and its own `user`.
        if unsafe { fill(self.r.user, l as u64, &mut out) } != 0 {
            return Err(Error::Callback);
        }
        let absent = out.row_lse.is_null() && out.row_lse_len == 0 && out.wo.data.is_null();
        if out.struct_size != KVE_EVICTOR_LAYER_V1_SIZE || out.reserved != 0 || !absent {
            return Err(Error::InvalidArgument);
        }
        Ok([out.keys, out.values, out.queries])
    }

    /// A K or V tensor's cell axis (`extent[1]`) holds every cell of the round (dense:
    /// exactly the round's cells).
    pub fn fits(&self, cells_axis: usize) -> Result<()> {
        match self.dense {
            true if cells_axis != self.n => Err(Error::ShapeMismatch),
            false if cells_axis <= self.top => Err(Error::OutOfBounds),
            _ => Ok(()),
        }
    }
}

/// Run a whole round on sequence `seq` of a context configured with `paged = 1`
/// (`paged_dtype` at least the K/V element size; `KVE_ERR_INVALID_ARGUMENT` otherwise;
/// any context for `cells` NULL):
/// begin it over `round`'s cells, mark them, gather and score every layer (its tensors
/// from the arrays or from `fill`), select, and
/// write the kept cells (indices into `round->cells`, ascending: position order) to
/// `kept` (`len` at least `n_cells`, room for every cell, else `KVE_ERR_OUTPUT_TOO_SMALL`
/// before the round begins) and their count to `*count`. Kept sets and scores are bit-identical to the step-by-step
/// calls over the same cells given as strided views. The engine then drops the other
/// cells (or moves the kept ones) and calls `kve_evictor_commit`. Host memory only; per
/// layer `Wo` (`KVE_WO_EVERY_ROUND`) and row log-sum-exp are not taken (the step-by-step
/// calls take them). Every argument above is checked before the round begins: such an
/// error writes nothing. An error found once the round has begun — a layer's tensors from
/// `fill` refused, `fill` returning nonzero (`KVE_ERR_CALLBACK`: `fill` is not called
/// again), or what only a layer's scoring finds (queries the scorer refuses, too few window
/// queries observed, `Wo` not given) — leaves the round begun with the layers before it
/// scored, as the step-by-step calls would; `kept`/`count` are written only on success,
/// and the next round (or `kve_evictor_seq_reset`) starts clean.
#[no_mangle]
pub unsafe extern "C" fn kve_evictor_run_round(
    evictor: *mut kve_evictor,
    seq: u64,
    round: *const kve_evictor_round,
    kept: *mut u32,
    len: u64,
    count: *mut u64,
) -> i32 {
    let mut c = tri!(out_param(count));
    let mut o = tri!(Buf::new(kept, len));
    // SAFETY: the caller's context; from_block checks NULL, alignment and the magic.
    let mut ev = tri!(unsafe { Evictor::from_block(evictor as *mut u8) });
    let ctx = {
        let (a, b) = ev.byte_range();
        Span(a, b)
    };
    // SAFETY: NULL or the caller's struct and buffers; read checks them.
    let a = tri!(unsafe { RoundArgs::read(round, ev.layers(), [c.span, o.span, ctx], len) });
    tri!(ev.check_distinct(a.cells));
    // layer l's tensors, checked (descriptor, bounds, no overlap with an output, every
    // cell inside)
    let tensors = |l: usize| -> Result<[Option<Tensor>; 3]> {
        let [k, v, q] = a.layer(l)?;
        let t = [
            Some(Tensor::new(&k)?),
            Tensor::optional(&v)?,
            Tensor::optional(&q)?,
        ];
        check_alias(&a.outputs, &t.each_ref().map(Tensor::span))?;
        t[..2]
            .iter()
            .flatten()
            .try_for_each(|x| a.fits(x.extent[1]))?;
        Ok(t)
    };
    // the arrays' tensors, all checked before the round begins (fill's when it gives them)
    if a.r.fill.is_none() {
        for l in 0..ev.layers() {
            tri!(tensors(l));
        }
    }
    let s = tri!(to_usize(seq));
    tri!(ev.begin(s, a.n, tri!(to_usize(a.r.target))));
    let marked = a.marks.is_some() || !a.ranges.is_empty();
    if let Some(m) = a.marks {
        tri!(ev.mark_cells(s, m, a.r.mark_share));
    } else if !a.ranges.is_empty() {
        tri!(ev.mark_positions(s, a.positions, a.ranges, a.r.mark_share));
    }
    if a.r.mark_split == 1 && marked {
        tri!(ev.set_mark_split(s, MarkSplit::Spans));
    }
    for l in 0..ev.layers() {
        let [k, v, q] = tri!(tensors(l));
        let view = |t: &Option<Tensor>| {
            // SAFETY: checked by Tensor::new; no output overlaps it.
            t.as_ref().map(|t| unsafe { t.view() }).transpose()
        };
        let lv = LayerViews {
            keys: tri!(tri!(view(&k)).ok_or(Error::NullPointer)),
            values: tri!(view(&v)),
            queries: tri!(view(&q)),
            row_lse: None,
            wo: None,
        };
        tri!(match a.dense {
            true => ev.score_layer(s, l, &lv),
            false => ev.score_layer_cells(s, l, &lv, a.cells),
        });
    }
    tri!(ev.select(s).map(|_| ()));
    // SAFETY: Buf::new checked it; check_alias: it overlaps nothing else.
    let n = tri!(ev.kept_cells(s, unsafe { o.slice_mut() }));
    // SAFETY: out_param checked it; one element.
    unsafe { c.slice_mut()[0] = n as u64 };
    KVE_OK
}
