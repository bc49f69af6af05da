//! One eviction round over an engine's cache as it holds it (`kve_evictor_run_round`):
//! the engine describes each layer's K/V over its whole cell stream and names the
//! sequence's cells in it; the library gathers them by index, scores every layer,
//! selects, and returns the kept cells: the round an engine otherwise runs call by call
//! (`kve_evictor_begin`, `_mark_cells`, `_score_layer` per layer, `_select`,
//! `_kept_cells`).

use super::evictor::kve_evictor;
use super::params::{read_ext, Extensible};
use super::{
    check_alias, kve_tensor, out_param, span_sized, to_status, to_usize, tri, Buf, Span, Tensor,
    KVE_OK,
};
use crate::error::{Error, Result};
use crate::evictor::{Evictor, LayerViews};

/// A round over an engine's cache (fill with `kve_evictor_round_init`: everything absent).
/// Layer `l`'s K is `keys[l]`, `[Hkv, S, dk]` over every cell of the engine's stream
/// (`S` cells, any dtype, strides as the engine stores them), V likewise (`[Hkv, S, dv]`,
/// transposed or not); the round's cells are `cells[0 .. n_cells]`, indices along axis 1,
/// in position order.
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
    /// (`KVE_ERR_SHAPE_MISMATCH`).
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
    /// Must be 0.
    pub pad: u32,
}

/// `sizeof(kve_evictor_round)` of the first release.
pub const KVE_EVICTOR_ROUND_V1_SIZE: u32 = 136;
const _: () =
    assert!(core::mem::size_of::<kve_evictor_round>() == KVE_EVICTOR_ROUND_V1_SIZE as usize);
impl Extensible for kve_evictor_round {
    const SIZES: &'static [u32] = &[KVE_EVICTOR_ROUND_V1_SIZE];
}

const NO_ROUND: kve_evictor_round = kve_evictor_round {
    struct_size: KVE_EVICTOR_ROUND_V1_SIZE,
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
    pad: 0,
};

/// Set everything in `round` absent and its `struct_size` (`KVE_EVICTOR_ROUND_V1_SIZE`).
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

/// Run a whole round on sequence `seq` of a context configured with `paged = 1`
/// (`paged_dtype` at least the K/V element size; `KVE_ERR_INVALID_ARGUMENT` otherwise;
/// any context for `cells` NULL):
/// begin it over `round`'s cells, mark them, gather and score every layer, select, and
/// write the kept cells (indices into `round->cells`, ascending: position order) to
/// `kept` (`len` at least `n_cells`, room for every cell, else `KVE_ERR_OUTPUT_TOO_SMALL`
/// before the round begins) and their count to `*count`. Kept sets and scores are bit-identical to the step-by-step
/// calls over the same cells given as strided views. The engine then drops the other
/// cells (or moves the kept ones) and calls `kve_evictor_commit`. Host memory only; per
/// layer `Wo` (`KVE_WO_EVERY_ROUND`) and row log-sum-exp are not taken (the step-by-step
/// calls take them). Every argument above is checked before the round begins: such an
/// error writes nothing. An error only a layer's scoring finds (queries the scorer
/// refuses, too few window queries observed, `Wo` not given) leaves the round begun and
/// partly scored, as the step-by-step calls would; `kept`/`count` are written only on
/// success, and the next round (or `kve_evictor_seq_reset`) starts clean.
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
    // SAFETY: NULL or the caller's struct; read_ext checks NULL, alignment, struct_size.
    let r = tri!(unsafe { read_ext(round, KVE_EVICTOR_ROUND_V1_SIZE, NO_ROUND) });
    if r.reserved != 0 || r.pad != 0 {
        return to_status(Err(Error::InvalidArgument));
    }
    let layers = ev.layers();
    let dense = r.cells.is_null();
    let n = tri!(to_usize(r.n_cells));
    let cells = tri!(Buf::new(r.cells, if dense { 0 } else { r.n_cells }));
    if n == 0 {
        return to_status(Err(Error::InvalidArgument));
    }
    // room for every cell, so that a short `kept` is refused before the round begins
    if len < r.n_cells {
        return to_status(Err(Error::OutputTooSmall));
    }
    let marks = match r.n_marks {
        0 => None,
        m if m != r.n_cells => return to_status(Err(Error::ShapeMismatch)),
        m => Some(tri!(Buf::new(r.marks, m))),
    };
    // the marks by position: ranges, and the cells' positions
    let ranges = tri!(Buf::new(r.mark_ranges, r.n_mark_ranges));
    let positions = match (ranges.len(), r.n_positions) {
        (0, _) => tri!(Buf::new(r.positions, 0)),
        _ if marks.is_some() => return to_status(Err(Error::InvalidArgument)),
        (_, p) if p != r.n_cells => return to_status(Err(Error::ShapeMismatch)),
        (_, p) => tri!(Buf::new(r.positions, p)),
    };
    let keys = tri!(per_layer(r.keys, r.n_keys, layers, true)).expect("required");
    let values = tri!(per_layer(r.values, r.n_values, layers, false));
    let queries = tri!(per_layer(r.queries, r.n_queries, layers, false));
    let span = |b: &Option<Buf<kve_tensor>>| b.as_ref().map_or(Span::EMPTY, |b| b.span);
    let inputs = [
        span_sized(round, r.struct_size),
        cells.span,
        marks.as_ref().map_or(Span::EMPTY, |m| m.span),
        ranges.span,
        positions.span,
        keys.span,
        span(&values),
        span(&queries),
    ];
    tri!(check_alias(&[c.span, o.span, ctx], &inputs));
    // SAFETY: Buf::new checked them; check_alias: no output (the context, `kept`, `count`)
    // overlaps them.
    let (cells, keys) = unsafe { (cells.slice(), keys.slice()) };
    // SAFETY: as above.
    let [values, queries] = [values, queries].map(|b| b.map(|b| unsafe { b.slice() }));
    tri!(ev.check_distinct(cells));
    // SAFETY: as above.
    let (positions, ranges) = unsafe { (positions.slice(), ranges.slice()) };
    tri!(crate::evictor::check_ranges(ranges));
    // the marks' share, checked here so that the round never begins on a bad one
    if (marks.is_some() || !ranges.is_empty()) && !(0.0..=1.0).contains(&r.mark_share) {
        return to_status(Err(Error::InvalidArgument));
    }
    let top = cells.iter().copied().max().unwrap_or(0) as usize;
    // every cell inside K and V (dense: exactly the round's cells)
    let fits = |x: &Tensor| match dense {
        true if x.extent[1] != n => Err(Error::ShapeMismatch),
        false if x.extent[1] <= top => Err(Error::OutOfBounds),
        _ => Ok(()),
    };
    // layer l's tensors, checked (descriptor, bounds, no overlap with an output, every
    // cell inside): all of them before the round begins
    let tensors = |l: usize| -> Result<[Option<Tensor>; 3]> {
        let t = [
            Some(Tensor::new(&keys[l])?),
            values.map_or(Ok(None), |v| Tensor::optional(&v[l]))?,
            queries.map_or(Ok(None), |q| Tensor::optional(&q[l]))?,
        ];
        let spans = [
            Tensor::span(&t[0]),
            Tensor::span(&t[1]),
            Tensor::span(&t[2]),
        ];
        check_alias(&[o.span, c.span, ctx], &spans)?;
        t[..2].iter().flatten().try_for_each(fits)?;
        Ok(t)
    };
    for l in 0..layers {
        tri!(tensors(l));
    }
    let s = tri!(to_usize(seq));
    tri!(ev.begin(s, n, tri!(to_usize(r.target))));
    if let Some(m) = marks {
        // SAFETY: as above.
        tri!(ev.mark_cells(s, unsafe { m.slice() }, r.mark_share));
    } else if !ranges.is_empty() {
        tri!(ev.mark_positions(s, positions, ranges, r.mark_share));
    }
    for l in 0..layers {
        let [k, v, q] = tri!(tensors(l));
        let view = |t: &Option<Tensor>| {
            // SAFETY: checked by Tensor::new; no output overlaps it.
            t.as_ref().map(|t| unsafe { t.view() }).transpose()
        };
        let lv = LayerViews {
            keys: tri!(view(&k)).expect("required"),
            values: tri!(view(&v)),
            queries: tri!(view(&q)),
            row_lse: None,
            wo: None,
        };
        tri!(match dense {
            true => ev.score_layer(s, l, &lv),
            false => ev.score_layer_cells(s, l, &lv, cells),
        });
    }
    tri!(ev.select(s).map(|_| ()));
    // SAFETY: Buf::new checked it; check_alias: it overlaps nothing else.
    let n = tri!(ev.kept_cells(s, unsafe { o.slice_mut() }));
    // SAFETY: out_param checked it; one element.
    unsafe { c.slice_mut()[0] = n as u64 };
    KVE_OK
}
