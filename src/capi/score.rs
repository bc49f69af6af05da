//! Scoring one layer, and the per-model / per-token value terms LaProx and CriticalKV read.

use super::params::{read_ext, score_config, write_ext};
use super::{
    answer_size, check_alias, kve_score_params, kve_tensor, out_param, span_ptr, span_sized,
    to_status, to_usize, tri, Buf, Span, Tensor, KVE_MAX_HEADS, KVE_OK,
};
use crate::error::{Error, Result};
use crate::gram;
use crate::score::{LayerInputs, LayerShape};
use crate::view::View;
use core::ffi::c_void;

/// The tensors of one layer, where the engine keeps them. Fill with
/// `kve_layer_inputs_init` (every tensor absent), then set what the scorer reads:
///
/// | scorer | queries | keys | values | other |
/// |---|---|---|---|---|
/// | SnapKV, TOVA | yes | yes | | |
/// | LAVa | yes | yes | yes | |
/// | LaProx | yes | yes | yes + `gram`, or `value_forms` | |
/// | CriticalKV | yes | yes | | `value_l1` |
/// | StreamingLLM | | yes | | |
/// | KNorm | | yes | | |
/// | Uniqueness (question-agnostic) | | yes | yes | |
///
/// Every scorer that reads queries also takes the optional `row_lse` (flash attention's
/// `softmax_lse` of the window rows, or `kve_window_row_lse`): K is then read once, not
/// twice (on the device too).
///
/// A tensor with `data == NULL` is absent; a required one absent gives
/// `KVE_ERR_NULL_POINTER`. Extensible like the params structs: `struct_size` is
/// `KVE_LAYER_INPUTS_V1_SIZE` (no `row_lse`) or `KVE_LAYER_INPUTS_V2_SIZE`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kve_layer_inputs {
    /// `sizeof(kve_layer_inputs)` as the caller compiled it (set by the init function).
    pub struct_size: u32,
    /// Must be 0.
    pub reserved: u32,
    /// `[Hq, wq, dk]` post-RoPE queries of the last `wq >= min(window, N)` positions
    /// (the last `window` rows are used).
    pub queries: kve_tensor,
    /// `[Hkv, N, dk]` post-RoPE keys, `dk <= 1024`.
    pub keys: kve_tensor,
    /// `[Hkv, N, dv]` values, `dv <= 1024`.
    pub values: kve_tensor,
    /// LaProx: Gram blocks from `kve_compute_gram` (built with `cross = 1` for the exact
    /// and mean-attn GQA modes), `gram_len` floats. NULL when `value_forms` is given:
    /// both given is `KVE_ERR_INVALID_ARGUMENT` (one value term, never one ignored).
    pub gram: *const f32,
    pub gram_len: u64,
    /// LaProx: cached value forms `[Hkv][blocks][N]` from `kve_compute_value_forms`.
    pub value_forms: *const f32,
    pub value_forms_len: u64,
    /// CriticalKV: `[Hkv][N]` from `kve_compute_value_l1`.
    pub value_l1: *const f32,
    pub value_l1_len: u64,
    /// Optional (NULL, 0 when absent; since `KVE_LAYER_INPUTS_V2_SIZE`): `[Hq][w]`,
    /// `w = min(window, N)`, exactly `Hq * w` floats: the natural-log log-sum-exp of each
    /// window row's logits `q·k / sqrt(dk)` over every key it sees (causal inside the
    /// window), rows in the order of the last `w` rows of `queries` (flash attention's
    /// `softmax_lse`, or `kve_window_row_lse`). When given, the window pass skips its
    /// first pass over K (row max and denominator) and uses `A = exp(z - lse)`. NaN/Inf
    /// (`KVE_ERR_NON_FINITE`) or another length (`KVE_ERR_SHAPE_MISMATCH`) is rejected,
    /// also when there is no prefix to score (`window >= N`). Ignored by KNorm and
    /// StreamingLLM.
    pub row_lse: *const f32,
    pub row_lse_len: u64,
}

/// `sizeof(kve_layer_inputs)` of the first release (without `row_lse`; still accepted).
pub const KVE_LAYER_INPUTS_V1_SIZE: u32 = 272;
/// `sizeof(kve_layer_inputs)` with `row_lse`.
pub const KVE_LAYER_INPUTS_V2_SIZE: u32 = 288;
super::params::extensible!(kve_layer_inputs: [KVE_LAYER_INPUTS_V1_SIZE, KVE_LAYER_INPUTS_V2_SIZE]);

pub(crate) const NO_INPUTS: kve_layer_inputs = kve_layer_inputs {
    struct_size: KVE_LAYER_INPUTS_V2_SIZE,
    reserved: 0,
    queries: kve_tensor::NONE,
    keys: kve_tensor::NONE,
    values: kve_tensor::NONE,
    gram: core::ptr::null(),
    gram_len: 0,
    value_forms: core::ptr::null(),
    value_forms_len: 0,
    value_l1: core::ptr::null(),
    value_l1_len: 0,
    row_lse: core::ptr::null(),
    row_lse_len: 0,
};

/// Set every tensor of `inputs` absent and its `struct_size` (pass
/// `sizeof(kve_layer_inputs)`). Writes only `inputs`.
#[no_mangle]
pub unsafe extern "C" fn kve_layer_inputs_init(
    inputs: *mut kve_layer_inputs,
    struct_size: u32,
) -> i32 {
    // SAFETY: the caller passes NULL or `struct_size` writable bytes; write_ext checks the rest.
    to_status(unsafe { write_ext(inputs, struct_size, KVE_LAYER_INPUTS_V1_SIZE, NO_INPUTS) })
}

/// An optional `const float*` input: absent when NULL with length 0.
pub(crate) fn opt_floats(ptr: *const f32, len: u64) -> Result<Option<Buf<f32>>> {
    if ptr.is_null() && len == 0 {
        return Ok(None);
    }
    Buf::new(ptr, len).map(Some)
}

fn span_opt(b: &Option<Buf<f32>>) -> Span {
    b.as_ref().map_or(Span::EMPTY, |b| b.span)
}

fn head_count(v: u64) -> Result<usize> {
    if v > KVE_MAX_HEADS {
        return Err(Error::InvalidArgument);
    }
    to_usize(v)
}

/// A float count whose byte size a buffer can have (`len * 4 <= PTRDIFF_MAX`, as every
/// buffer argument is checked), else `Overflow`.
fn float_count(len: usize) -> Result<usize> {
    match len.checked_mul(4) {
        Some(b) if b <= isize::MAX as usize => Ok(len),
        _ => Err(Error::Overflow),
    }
}

fn write_u64(out: &mut Buf<u64>, v: usize) {
    // SAFETY: out_param checked non-NULL and aligned; one element.
    unsafe { out.slice_mut()[0] = v as u64 };
}

/// Workspace bytes `kve_score_layer` needs for a layer of this shape: `hq` query heads,
/// `hkv` KV heads, `n` cached tokens (window included), key and value dims `dk`, `dv`
/// (pass `dv = dk` when the scorer reads no values). Writes only `*out_bytes`.
#[no_mangle]
pub unsafe extern "C" fn kve_score_workspace_size(
    params: *const kve_score_params,
    hq: u64,
    hkv: u64,
    n: u64,
    dk: u64,
    dv: u64,
    out_bytes: *mut u64,
) -> i32 {
    let mut out = tri!(out_param(out_bytes));
    // SAFETY: NULL or the caller's params; score_config checks NULL, alignment, struct_size.
    let cfg = tri!(unsafe { score_config(params) });
    tri!(check_alias(&[out.span], &[span_ptr(params)]));
    let shape = tri!(LayerShape::from_dims(hq, hkv, n, dk, dv));
    let bytes = tri!(staged_workspace_size(&cfg, &shape));
    write_u64(&mut out, bytes);
    KVE_OK
}

/// The core's workspace plus room to stage the scores: the core checks its computed
/// scores for overflow to NaN/Inf after computing them, so the C layer scores into the
/// workspace and copies to `out` only on success (nothing written on error).
fn staged_workspace_size(cfg: &crate::ScoreConfig, shape: &LayerShape) -> Result<usize> {
    let core = crate::score_workspace_size(cfg, shape)?;
    let stage = crate::score_len(cfg, shape)?
        .checked_mul(4)
        .and_then(|b| b.checked_add(4))
        .ok_or(Error::Overflow)?;
    core.checked_add(stage).ok_or(Error::Overflow)
}

/// Floats `kve_score_layer` writes: `hkv * P` with `P = n - min(window, n)` prefix
/// tokens. Writes only `*out_len`.
#[no_mangle]
pub unsafe extern "C" fn kve_score_output_len(
    params: *const kve_score_params,
    hkv: u64,
    n: u64,
    out_len: *mut u64,
) -> i32 {
    let mut out = tri!(out_param(out_len));
    // SAFETY: NULL or the caller's params; score_config checks NULL, alignment, struct_size.
    let cfg = tri!(unsafe { score_config(params) });
    tri!(check_alias(&[out.span], &[span_ptr(params)]));
    let hkv = tri!(head_count(hkv));
    let n = tri!(to_usize(n));
    let shape = LayerShape {
        hq: hkv,
        hkv,
        n,
        dk: 1,
        dv: 1,
    };
    let len = tri!(float_count(tri!(crate::score_len(&cfg, &shape))));
    write_u64(&mut out, len);
    KVE_OK
}

/// Score one layer: one f32 score per (KV head, prefix token), written to
/// `out[kh * P + i]` for `kh < Hkv`, `i < P = N - min(window, N)` (window tokens are
/// always kept and get no score). Larger = more worth keeping.
///
/// `out_len` (floats) must be at least `kve_score_output_len`, `workspace_bytes` at least
/// `kve_score_workspace_size` (which includes room to stage the scores, so that `out` is
/// written only on success); the workspace is scratch (any alignment; its contents
/// after the call are unspecified). Reads the tensors of `inputs` only; writes `out`
/// (first `Hkv*P` floats) and the workspace. NaN/Inf in what the scorer reads gives
/// `KVE_ERR_NON_FINITE`; a window longer than the queries supplied,
/// `KVE_ERR_INVALID_ARGUMENT`.
///
/// CriticalKV scores the `critical_first_stage` tokens its first stage forces as
/// `FLT_MAX` (kvpress's convention), the others `(s + 1e-4) * value_l1`: the forced ones
/// rank first in `kve_select_model`. Compare or select such scores as they are; scaling
/// them up overflows, and summing heads (layer granularity) saturates forced tokens to
/// +INF, which still ranks them first.
#[no_mangle]
pub unsafe extern "C" fn kve_score_layer(
    params: *const kve_score_params,
    inputs: *const kve_layer_inputs,
    out: *mut f32,
    out_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    // SAFETY: NULL or the caller's params; score_config checks NULL, alignment, struct_size.
    let cfg = tri!(unsafe { score_config(params) });
    // SAFETY: NULL or the caller's struct; read_ext checks NULL, alignment, struct_size.
    let inp = tri!(unsafe { read_ext(inputs, KVE_LAYER_INPUTS_V1_SIZE, NO_INPUTS) });
    if inp.reserved != 0 {
        return super::KVE_ERR_INVALID_ARGUMENT;
    }
    let q = tri!(Tensor::optional(&inp.queries));
    let k = tri!(Tensor::optional(&inp.keys));
    let v = tri!(Tensor::optional(&inp.values));
    let g = tri!(opt_floats(inp.gram, inp.gram_len));
    let f = tri!(opt_floats(inp.value_forms, inp.value_forms_len));
    let l1 = tri!(opt_floats(inp.value_l1, inp.value_l1_len));
    let lse = tri!(opt_floats(inp.row_lse, inp.row_lse_len));
    let mut o = tri!(Buf::new(out, out_len));
    let mut ws = tri!(Buf::new(workspace as *const u8, workspace_bytes));
    let inputs_span = span_sized(inputs, inp.struct_size);
    tri!(check_alias(
        &[o.span, ws.span],
        &[
            span_ptr(params),
            inputs_span,
            Tensor::span(&q),
            Tensor::span(&k),
            Tensor::span(&v),
            span_opt(&g),
            span_opt(&f),
            span_opt(&l1),
            span_opt(&lse),
        ],
    ));
    let li = LayerInputs {
        queries: match &q {
            // SAFETY: Tensor::new checked the tensor; check_alias: no output overlaps it.
            Some(t) => Some(tri!(unsafe { t.view() })),
            None => None,
        },
        keys: match &k {
            // SAFETY: Tensor::new checked the tensor; check_alias: no output overlaps it.
            Some(t) => Some(tri!(unsafe { t.view() })),
            None => None,
        },
        values: match &v {
            // SAFETY: Tensor::new checked the tensor; check_alias: no output overlaps it.
            Some(t) => Some(tri!(unsafe { t.view() })),
            None => None,
        },
        // SAFETY: Buf::new checked the buffer; check_alias: no output overlaps it.
        gram: g.as_ref().map(|b| unsafe { b.slice() }),
        // SAFETY: Buf::new checked the buffer; check_alias: no output overlaps it.
        value_forms: f.as_ref().map(|b| unsafe { b.slice() }),
        // SAFETY: Buf::new checked the buffer; check_alias: no output overlaps it.
        value_l1: l1.as_ref().map(|b| unsafe { b.slice() }),
        // SAFETY: Buf::new checked the buffer; check_alias: no output overlaps it.
        row_lse: lse.as_ref().map(|b| unsafe { b.slice() }),
    };
    let shape = tri!(crate::layer_shape(&cfg, &li));
    let need = tri!(crate::score_len(&cfg, &shape));
    if o.len() < need {
        return super::KVE_ERR_OUTPUT_TOO_SMALL;
    }
    if ws.len() < tri!(staged_workspace_size(&cfg, &shape)) {
        return super::KVE_ERR_WORKSPACE_TOO_SMALL;
    }
    // stage: the first 4-aligned `need` floats of the workspace, the core gets the rest
    // SAFETY: Buf::new checked the workspace; check_alias: it overlaps no input nor `out`.
    let wsb = unsafe { ws.slice_mut() };
    let pad = wsb.as_ptr().align_offset(4).min(4);
    let (head, rest) = wsb.split_at_mut(pad + need * 4);
    // SAFETY: `head[pad..]` is 4-aligned and holds `need` f32 (any bit pattern is valid).
    let stage =
        unsafe { core::slice::from_raw_parts_mut(head.as_mut_ptr().add(pad) as *mut f32, need) };
    tri!(crate::score_layer(&cfg, &li, stage, rest));
    // SAFETY: Buf::new checked `out` (`need` <= its length, checked above); check_alias: unaliased.
    let o = unsafe { o.slice_mut() };
    o[..need].copy_from_slice(stage);
    KVE_OK
}

/// Workspace bytes `kve_window_row_lse` needs: `hq` query heads, `hkv` KV heads, `n`
/// cached tokens, key dim `dk`, observation window `window` (>= 1). Writes only
/// `*out_bytes`.
#[no_mangle]
pub unsafe extern "C" fn kve_window_row_lse_workspace_size(
    hq: u64,
    hkv: u64,
    n: u64,
    dk: u64,
    window: u32,
    out_bytes: *mut u64,
) -> i32 {
    answer_size(out_bytes, || {
        let shape = LayerShape {
            hq: head_count(hq)?,
            hkv: head_count(hkv)?,
            n: to_usize(n)?,
            dk: to_usize(dk)?,
            dv: 1,
        };
        crate::window_row_lse_workspace_size(&shape, window)
    })
}

/// The window rows' log-sum-exp, the `row_lse` input of `kve_layer_inputs`:
/// `out[h * w + j] = ln sum_{i visible} exp(q_{h,j} . k_{h/g,i} / sqrt(dk))` for query
/// heads `h < Hq` and the last `w = min(window, N)` rows `j` of `queries` (`[Hq, wq, dk]`,
/// `wq >= w`); `keys` `[Hkv, N, dk]`; keys `i <= N - w + j` are visible. The first of
/// the two passes over K that `kve_score_layer` makes without it, for engines that do not
/// get `softmax_lse` from flash attention. `out_len` >= `Hq * w` (only those are
/// written), `workspace_bytes` >= `kve_window_row_lse_workspace_size`. Rejects NaN/Inf in
/// the queries or keys before writing `out`.
#[no_mangle]
pub unsafe extern "C" fn kve_window_row_lse(
    queries: *const kve_tensor,
    keys: *const kve_tensor,
    window: u32,
    out: *mut f32,
    out_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    let outs = (out, out_len, workspace, workspace_bytes);
    // SAFETY: the caller's pointers, passed on; `two_tensors_into` checks each.
    unsafe {
        two_tensors_into([queries, keys], outs, |qv, kv, o, ws| {
            crate::window_row_lse(qv, kv, window, o, ws)
        })
    }
}

/// A call that reads two tensors and writes `out` and the workspace
/// (`kve_window_row_lse`, `kve_compute_value_l1`): the descriptors and buffers checked, no
/// output over an input or over the other output, then `f(a, b, out, workspace)`.
///
/// # Safety
/// Each tensor pointer is NULL or the caller's `kve_tensor`; `outs` = (out, its floats,
/// workspace, its bytes), each NULL or the caller's buffer of that length.
unsafe fn two_tensors_into(
    [a, b]: [*const kve_tensor; 2],
    (out, out_len, workspace, workspace_bytes): (*mut f32, u64, *mut c_void, u64),
    f: impl FnOnce(&View, &View, &mut [f32], &mut [u8]) -> Result<()>,
) -> i32 {
    // SAFETY: NULL or the caller's `kve_tensor`s; from_ptr checks NULL and alignment.
    let (ta, tb) = (
        tri!(unsafe { Tensor::from_ptr(a) }),
        tri!(unsafe { Tensor::from_ptr(b) }),
    );
    let mut o = tri!(Buf::new(out, out_len));
    let mut ws = tri!(Buf::new(workspace as *const u8, workspace_bytes));
    tri!(check_alias(
        &[o.span, ws.span],
        &[ta.span, tb.span, span_ptr(a), span_ptr(b)]
    ));
    // SAFETY: Tensor::new checked the tensors; check_alias: no output overlaps them.
    let (va, vb) = (tri!(unsafe { ta.view() }), tri!(unsafe { tb.view() }));
    // SAFETY: Buf::new checked both; check_alias: they overlap no input nor each other.
    let (o, ws) = unsafe { (o.slice_mut(), ws.slice_mut()) };
    to_status(f(&va, &vb, o, ws))
}

fn cross_flag(cross: u32) -> Result<bool> {
    match cross {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Error::InvalidArgument),
    }
}

/// Floats of the Gram output `[Hkv][blocks][dv][dv]`: `blocks = g` (`cross = 0`, for
/// LaProx's default sum GQA) or `g + g(g-1)/2` (`cross = 1`, for exact / mean-attn),
/// `g = hq / hkv`. `KVE_ERR_OVERFLOW` when their byte size does not fit `PTRDIFF_MAX`.
/// Writes only `*out_len`.
#[no_mangle]
pub unsafe extern "C" fn kve_gram_len(
    hq: u64,
    hkv: u64,
    dv: u64,
    cross: u32,
    out_len: *mut u64,
) -> i32 {
    answer_size(out_len, || {
        float_count(gram::gram_len(
            head_count(hq)?,
            head_count(hkv)?,
            to_usize(dv)?,
            cross_flag(cross)?,
        )?)
    })
}

/// Workspace bytes of `kve_compute_gram` for value dim `dv` and model dim `d_model`.
/// Writes only `*out_bytes`.
#[no_mangle]
pub unsafe extern "C" fn kve_gram_workspace_size(
    dv: u64,
    d_model: u64,
    out_bytes: *mut u64,
) -> i32 {
    answer_size(out_bytes, || {
        gram::gram_workspace_size(to_usize(dv)?, to_usize(d_model)?)
    })
}

/// LaProx's Gram matrices `G_ab = Wo_a Wo_bᵀ` of one layer, computed once per model
/// (f64 sums). `wo` is `[Hq, dv, D]` (head, row, col); for PyTorch's `o_proj.weight`
/// (`[D, Hq*dv]` row-major) use strides `{dv, 1, Hq*dv}`. `hkv` KV heads; `cross` 0/1 as
/// in `kve_gram_len`. Writes `out` (`kve_gram_len` floats) and the workspace; rejects
/// NaN/Inf in `wo`, and finite `wo` whose Gram entries overflow f32 (rows with
/// `|row|² > FLT_MAX`), with `KVE_ERR_NON_FINITE` before writing.
#[no_mangle]
pub unsafe extern "C" fn kve_compute_gram(
    wo: *const kve_tensor,
    hkv: u64,
    cross: u32,
    out: *mut f32,
    out_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    let wo_desc = wo;
    // SAFETY: NULL or the caller's `kve_tensor`; from_ptr checks NULL and alignment.
    let wo = tri!(unsafe { Tensor::from_ptr(wo) });
    let hkv = tri!(head_count(hkv));
    let cross = tri!(cross_flag(cross));
    let mut o = tri!(Buf::new(out, out_len));
    let mut ws = tri!(Buf::new(workspace as *const u8, workspace_bytes));
    tri!(check_alias(
        &[o.span, ws.span],
        &[wo.span, span_ptr(wo_desc)]
    ));
    // SAFETY: Tensor::new checked the tensor; check_alias: no output overlaps it.
    let view = tri!(unsafe { wo.view() });
    // SAFETY: Buf::new checked both; check_alias: they overlap no input nor each other.
    let (o, ws) = unsafe { (o.slice_mut(), ws.slice_mut()) };
    to_status(gram::compute_gram(&view, hkv, cross, o, ws))
}

/// Floats of the value-form cache `[Hkv][blocks][N]` (blocks as in `kve_gram_len`).
/// `KVE_ERR_OVERFLOW` when their byte size does not fit `PTRDIFF_MAX` (no buffer could
/// hold them). Writes only `*out_len`.
#[no_mangle]
pub unsafe extern "C" fn kve_value_forms_len(
    hq: u64,
    hkv: u64,
    n: u64,
    cross: u32,
    out_len: *mut u64,
) -> i32 {
    answer_size(out_len, || {
        float_count(gram::value_forms_len(
            head_count(hq)?,
            head_count(hkv)?,
            to_usize(n)?,
            cross_flag(cross)?,
        )?)
    })
}

/// Fill token columns `t0 .. t1` of LaProx's value-form cache (`v G vᵀ` per token and
/// Gram block) from `values` (`[Hkv, N, dv]`) and a Gram from `kve_compute_gram` with
/// the same `hq` and `cross`. An engine can call it as tokens enter the cache; other
/// columns of `out` are not touched. Writes only those columns of `out`
/// (`kve_value_forms_len` floats). Rejects NaN/Inf in the values read and in the Gram,
/// and finite inputs whose forms overflow f32, with `KVE_ERR_NON_FINITE` before writing.
#[no_mangle]
pub unsafe extern "C" fn kve_compute_value_forms(
    values: *const kve_tensor,
    gram: *const f32,
    gram_len: u64,
    hq: u64,
    cross: u32,
    t0: u64,
    t1: u64,
    out: *mut f32,
    out_len: u64,
) -> i32 {
    // SAFETY: NULL or the caller's `kve_tensor`; from_ptr checks NULL and alignment.
    let v = tri!(unsafe { Tensor::from_ptr(values) });
    let g = tri!(Buf::new(gram, gram_len));
    let hq = tri!(head_count(hq));
    let cross = tri!(cross_flag(cross));
    let (t0, t1) = (tri!(to_usize(t0)), tri!(to_usize(t1)));
    let mut o = tri!(Buf::new(out, out_len));
    tri!(check_alias(&[o.span], &[v.span, g.span, span_ptr(values)]));
    // SAFETY: Tensor::new checked the tensor; check_alias: no output overlaps it.
    let view = tri!(unsafe { v.view() });
    // SAFETY: Buf::new checked the Gram; check_alias: `out` does not overlap it.
    let gs = unsafe { g.slice() };
    let [hkv, n, dv] = view.extent();
    if let Ok(need) = gram::gram_len(hq, hkv, dv, cross) {
        if let Some(used) = gs.get(..need) {
            if used.iter().any(|x| !x.is_finite()) {
                return super::KVE_ERR_NON_FINITE;
            }
        }
    }
    // results that overflow f32 are refused before the core writes: checked once the
    // arguments are those the core accepts (else it reports their error itself)
    let accepted = gram::gram_len(hq, hkv, dv, cross).is_ok_and(|need| gs.len() >= need)
        && gram::value_forms_len(hq, hkv, n, cross).is_ok_and(|len| o.len() >= len)
        && t0 <= t1
        && t1 <= n
        && dv <= 1024
        && gram::values_finite(&view, t0, t1);
    if accepted && !gram::value_forms_finite(&view, gs, hq, cross, t0, t1) {
        return super::KVE_ERR_NON_FINITE;
    }
    // SAFETY: Buf::new checked `out` (non-NULL, aligned, sized); check_alias: it overlaps no input.
    let o = unsafe { o.slice_mut() };
    to_status(gram::compute_value_forms(&view, gs, hq, cross, t0, t1, o))
}

/// Workspace bytes of `kve_compute_value_l1`. Writes only `*out_bytes`.
#[no_mangle]
pub unsafe extern "C" fn kve_value_l1_workspace_size(
    dv: u64,
    d_model: u64,
    out_bytes: *mut u64,
) -> i32 {
    answer_size(out_bytes, || {
        gram::value_l1_workspace_size(to_usize(dv)?, to_usize(d_model)?)
    })
}

/// CriticalKV's value term `mean_{h in group} ||v_i Wo_h||_1` for every token:
/// `out[kh * N + i]`, `Hkv * N` floats. `values` `[Hkv, N, dv]`, `wo` `[Hq, dv, D]`.
/// Writes `out` and the workspace; rejects NaN/Inf in `values` and `wo`, and finite
/// inputs whose norms overflow f32, with `KVE_ERR_NON_FINITE` before writing.
#[no_mangle]
pub unsafe extern "C" fn kve_compute_value_l1(
    values: *const kve_tensor,
    wo: *const kve_tensor,
    out: *mut f32,
    out_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
) -> i32 {
    let outs = (out, out_len, workspace, workspace_bytes);
    // SAFETY: the caller's pointers, passed on; `two_tensors_into` checks each.
    unsafe {
        two_tensors_into([values, wo], outs, |vv, wv, o, ws| {
            let [a, b, c] = wv.extent();
            // the workspace holds a head of Wo: checking its size first bounds the scan below
            if ws.len() < gram::value_l1_workspace_size(b, c)? {
                return Err(Error::WorkspaceTooSmall);
            }
            for h in 0..a {
                for r in 0..b {
                    for col in 0..c {
                        if !wv.get(h, r, col).is_finite() {
                            return Err(Error::NonFinite);
                        }
                    }
                }
            }
            gram::compute_value_l1(vv, wv, o, ws)
        })
    }
}
