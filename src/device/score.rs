//! One layer's scores on the device: every scorer of design §3 as a chain of launches on
//! the caller's stream, the same formulas in the same order as the core (src/math/score), so
//! the device scores match the host's to float tolerance.

use super::gram_split::GramSplit;
use super::limits::{
    MAX_DIM, MAX_GRID, MAX_GROUP, MAX_GROUP_CROSS, MAX_UNIQUENESS_TOKENS, MAX_WINDOW,
};
use super::{check_workspace, ck, elem_size, span_of, Carve, Floats, Tensor};
use crate::config::{LaproxGqa, Pool, PoolKind, PoolPlacement, ScoreConfig, ScorerKind};
use crate::cuda as cu;
use crate::error::{Error, Result};
use crate::gram;
use crate::score::requirements::{requirements, ValueInput};
use crate::score::LayerShape;
use crate::span::{check_alias, Span};
use core::ffi::{c_int, c_void};
use core::ptr::{null, null_mut};

/// The tensors of one layer on the device (`None`: absent), each checked on the host
/// when given (the caller converts them with the host's tensor checks).
#[derive(Clone, Copy, Debug)]
pub struct LayerInputs {
    pub queries: Option<Tensor>,
    pub keys: Option<Tensor>,
    pub values: Option<Tensor>,
    pub gram: Floats,
    pub value_forms: Floats,
    pub value_l1: Floats,
    pub row_lse: Floats,
}

#[derive(Clone, Copy)]
struct Shape {
    hq: usize,
    hkv: usize,
    n: usize,
    w: usize,
    p: usize,
    dk: usize,
    dv: usize,
    /// LaProx's value forms are computed from the Gram (in the workspace). The size query
    /// assumes so; a call given cached `value_forms` needs neither those parts nor `dv`.
    gram: bool,
    /// The Gram comes split by the caller ([`GramSplit`]): no split parts in the workspace.
    presplit: bool,
}

impl Shape {
    fn g(&self) -> usize {
        self.hq / self.hkv
    }
    fn pairs(&self) -> usize {
        self.g() * (self.g() + 1) / 2
    }
}

/// The workspace, carved in one order for the size query and the call.
struct Parts {
    win: *mut u8,
    win_bytes: usize,
    a: *mut f32,
    b: *mut f32,
    t: *mut f32,
    forms: *mut f32,
    gram_hi: *mut u16,
    gram_lo: *mut u16,
    factor: *mut f32,
    sel: *mut u8,
    sel_bytes: usize,
    counts: *mut i32,
    idx: *mut i32,
    /// Uniqueness's unit rows and maxima.
    uniq: *mut u8,
    uniq_bytes: usize,
    total: usize,
}

fn layout(cfg: &ScoreConfig, s: &Shape, base: *mut c_void) -> Result<Parts> {
    let mul = crate::error::mul;
    let mut c = Carve::new(base);
    let req = requirements(cfg.scorer);
    let cross = cfg.needs_cross();
    let (hq, hkv, p) = (s.hq, s.hkv, s.p);
    let win_bytes = if req.queries {
        // SAFETY: a pure host function.
        unsafe { cu::kve_cuda_window_workspace_size(hq as i64, s.w as i64, s.n as i64, hkv as i64) }
    } else {
        0
    };
    let win = c.take::<u8>(win_bytes)?;
    let rows = if cross { mul(hkv, s.pairs())? } else { hq };
    let a = c.take::<f32>(if req.queries { mul(rows, p)? } else { 0 })?;
    let b = c.take::<f32>(if req.queries { mul(hq, p)? } else { 0 })?;
    // the group's attention term, value term and their product (LaProx exact, mean-attn)
    let t = c.take::<f32>(if cross { mul(3 * hkv, p)? } else { 0 })?;
    let gram_path = req.values == ValueInput::ValuesOrForms && s.gram;
    let forms = c.take::<f32>(if gram_path { mul(rows, p)? } else { 0 })?;
    let gram_elems = if gram_path && !s.presplit {
        mul(rows, mul(s.dv, s.dv)?)?
    } else {
        0
    };
    let gram_hi = c.take::<u16>(gram_elems)?;
    let gram_lo = c.take::<u16>(gram_elems)?;
    let factor = c.take::<f32>(if req.head_factors { hkv } else { 0 })?;
    let critical = req.first_stage;
    let sel_bytes = if critical {
        // SAFETY: a pure host function.
        unsafe { cu::kve_cuda_select_workspace_size(hkv as i64) }
    } else {
        0
    };
    let sel = c.take::<u8>(sel_bytes)?;
    let counts = c.take::<i32>(if critical { hkv } else { 0 })?;
    let idx = c.take::<i32>(if critical { mul(hkv, p)? } else { 0 })?;
    let uniq_bytes = if req.unit_rows {
        // SAFETY: a pure host function.
        unsafe {
            cu::kve_cuda_uniqueness_workspace_size(hkv as i64, s.n as i64, s.dk as i64, s.dv as i64)
        }
    } else {
        0
    };
    let uniq = c.take::<u8>(uniq_bytes)?;
    Ok(Parts {
        win,
        win_bytes,
        a,
        b,
        t,
        forms,
        gram_hi,
        gram_lo,
        factor,
        sel,
        sel_bytes,
        counts,
        idx,
        uniq,
        uniq_bytes,
        total: c.bytes(),
    })
}

/// Device workspace bytes of [`score_layer`] for a layer of this shape: enough for
/// LaProx with the Gram, whatever the dtype.
pub fn score_workspace_size(cfg: &ScoreConfig, shape: &LayerShape) -> Result<usize> {
    cfg.validate()?;
    shape.validate()?;
    let w = (cfg.window as usize).min(shape.n);
    let s = Shape {
        hq: shape.hq,
        hkv: shape.hkv,
        n: shape.n,
        w,
        p: shape.n - w,
        dk: shape.dk,
        dv: shape.dv,
        gram: true,
        presplit: false,
    };
    Ok(layout(cfg, &s, null_mut())?.total)
}

/// What one call reads, checked on the host.
struct Inputs {
    q: Option<cu::KveCudaView>,
    k: cu::KveCudaView,
    v: Option<cu::KveCudaView>,
    gram: Option<*const f32>,
    forms: Option<*const f32>,
    l1: Option<*const f32>,
    lse: Option<*const f32>,
    /// The caller's Gram split (hi, lo or NULL), in place of `gram`.
    split: Option<(*const c_void, *const c_void)>,
    /// Every byte range the call reads (alias checks).
    reads: [Span; 8],
}

fn check_inputs(
    cfg: &ScoreConfig,
    d: &LayerInputs,
    presplit: Option<&GramSplit>,
) -> Result<(Inputs, Shape)> {
    // every input given is checked, read or not, as on the host
    let forms = d.value_forms.get()?;
    let (gram_in, l1_in, lse_in) = (d.gram.get()?, d.value_l1.get()?, d.row_lse.get()?);
    let extent = |t: &Option<Tensor>| {
        t.map(|t| [t.view.heads, t.view.tokens, t.view.dim].map(|x| x as usize))
    };
    let shape =
        LayerShape::from_extents(cfg, extent(&d.keys), extent(&d.queries), extent(&d.values))?;
    let kt = d.keys.ok_or(Error::NullPointer)?;
    let k = kt.view;
    let (hq, hkv, n, dk) = (shape.hq, shape.hkv, shape.n, shape.dk as u64);
    let w = (cfg.window as usize).min(n);
    // what the kernels take beyond the host's rules
    if hkv as u64 > MAX_GRID {
        return Err(Error::InvalidArgument);
    }
    let req = requirements(cfg.scorer);
    if req.unit_rows && n as u64 > MAX_UNIQUENESS_TOKENS {
        return Err(Error::InvalidArgument);
    }
    let mut q = None;
    if req.queries {
        let qv = d.queries.ok_or(Error::NullPointer)?.view;
        if qv.dtype != k.dtype {
            return Err(Error::ShapeMismatch);
        }
        if dk > MAX_DIM || hq as u64 > MAX_GRID || hq / hkv > MAX_GROUP || w > MAX_WINDOW {
            return Err(Error::InvalidArgument);
        }
        q = Some(qv);
    }
    let mut s = Shape {
        hq,
        hkv,
        n,
        w,
        p: n - w,
        dk: shape.dk,
        dv: shape.dv,
        gram: false,
        presplit: false,
    };
    // the split stands for the Gram: one value term, never one ignored
    if presplit.is_some() && (gram_in.is_some() || forms.is_some()) {
        return Err(Error::InvalidArgument);
    }
    let laprox = req.values == ValueInput::ValuesOrForms;
    let needs_v = req.values == ValueInput::Values || (laprox && forms.is_none());
    let mut v = None;
    if needs_v {
        let vv = d.values.ok_or(Error::NullPointer)?.view;
        if vv.dtype != k.dtype {
            return Err(Error::ShapeMismatch);
        }
        v = Some(vv);
    }
    let cross = cfg.needs_cross();
    let mut gram = None;
    let mut split = None;
    if laprox {
        if cross && s.g() > MAX_GROUP_CROSS {
            return Err(Error::InvalidArgument);
        }
        if forms.is_some() {
            if d.value_forms.len as usize != gram::value_forms_len(hq, hkv, n, cross)? {
                return Err(Error::ShapeMismatch);
            }
        } else if let Some(sp) = presplit {
            if s.dv as u64 > MAX_DIM {
                return Err(Error::InvalidArgument);
            }
            let vd = v.ok_or(Error::NullPointer)?.dtype;
            split = Some(sp.parts(gram::gram_len(hq, hkv, s.dv, cross)?, vd)?);
            s.gram = true;
            s.presplit = true;
        } else {
            let g = gram_in.ok_or(Error::NullPointer)?;
            if s.dv as u64 > MAX_DIM {
                return Err(Error::InvalidArgument);
            }
            if d.gram.len as usize != gram::gram_len(hq, hkv, s.dv, cross)? {
                return Err(Error::ShapeMismatch);
            }
            gram = Some(g);
            s.gram = true;
        }
    }
    let mut l1 = None;
    if req.value_l1 {
        let p = l1_in.ok_or(Error::NullPointer)?;
        if (d.value_l1.len as u128) < (hkv as u128) * (n as u128) {
            return Err(Error::ShapeMismatch);
        }
        l1 = Some(p);
    }
    let mut lse = None;
    if req.queries {
        lse = lse_in;
        if lse.is_some() && d.row_lse.len as u128 != (hq as u128) * (w as u128) {
            return Err(Error::ShapeMismatch);
        }
    }
    let floats_span = |p: Option<*const f32>, len: u64| match p {
        Some(p) => span_of(p, len as usize),
        None => Ok(Span::EMPTY),
    };
    let reads = [
        match (q, d.queries) {
            (Some(_), Some(t)) => t.span(),
            _ => Span::EMPTY,
        },
        kt.span(),
        match (v, d.values) {
            (Some(_), Some(t)) => t.span(),
            _ => Span::EMPTY,
        },
        floats_span(gram, d.gram.len)?,
        floats_span(if laprox { forms } else { None }, d.value_forms.len)?,
        floats_span(l1, d.value_l1.len)?,
        floats_span(lse, d.row_lse.len)?,
        match (split, presplit) {
            (Some(_), Some(sp)) => span_of(sp.ptr as *const u8, sp.bytes as usize)?,
            _ => Span::EMPTY,
        },
    ];
    Ok((
        Inputs {
            q,
            k,
            v,
            gram,
            forms,
            l1,
            lse,
            split,
            reads,
        },
        s,
    ))
}

/// Score one layer into `out` (`[Hkv][P]`, device memory) on `stream`. Everything the
/// host can check is checked before anything is enqueued; nothing is written on error.
///
/// # Safety
/// Every pointer of `inputs`, `out` and `workspace` is device memory of the declared
/// size, valid until the stream has run the launches.
pub unsafe fn score_layer(
    cfg: &ScoreConfig,
    inputs: &LayerInputs,
    out: *mut f32,
    out_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> Result<()> {
    // SAFETY: this function's contract.
    unsafe {
        score_layer_split(
            cfg,
            inputs,
            None,
            out,
            out_len,
            workspace,
            workspace_bytes,
            stream,
        )
    }
}

/// [`score_layer`], with LaProx's Gram given split ([`GramSplit`], made once per model by
/// [`gram_split`](super::gram_split::gram_split)) instead of `inputs.gram`, which must then
/// be absent, as must `value_forms`. Scorers other than LaProx do not read it. The
/// workspace of [`score_workspace_size`] suffices (the call needs no split parts).
///
/// # Safety
/// As [`score_layer`]; the split is device memory of its declared bytes.
#[allow(clippy::too_many_arguments)]
pub unsafe fn score_layer_split(
    cfg: &ScoreConfig,
    inputs: &LayerInputs,
    split: Option<&GramSplit>,
    out: *mut f32,
    out_len: u64,
    workspace: *mut c_void,
    workspace_bytes: u64,
    stream: *mut c_void,
) -> Result<()> {
    let (inp, s) = check_inputs(cfg, inputs, split)?;
    if out.is_null() {
        return Err(Error::NullPointer);
    }
    if (out as usize) % 4 != 0 {
        return Err(Error::Misaligned);
    }
    if (out_len as u128) < (s.hkv as u128) * (s.p as u128) {
        return Err(Error::OutputTooSmall);
    }
    let need = layout(cfg, &s, null_mut())?.total;
    check_workspace(workspace, workspace_bytes, need)?;
    let writes = [
        span_of(out, s.hkv * s.p)?,
        span_of(workspace as *const u8, need)?,
    ];
    check_alias(&writes, &inp.reads)?;
    if s.p == 0 {
        return Ok(());
    }
    let parts = layout(cfg, &s, workspace)?;
    // SAFETY: inputs, out and the workspace parts are the caller's device buffers, their
    // sizes checked above against the shape the chain launches over.
    unsafe {
        launch(&Chain {
            cfg,
            inp: &inp,
            s: &s,
            parts: &parts,
            out,
            stream,
        })
    }
}

/// What every scorer's launch chain reads: the configuration, the checked inputs and
/// shape, the workspace's parts, the output `[Hkv][P]` and the stream.
#[derive(Clone, Copy)]
struct Chain<'a> {
    cfg: &'a ScoreConfig,
    inp: &'a Inputs,
    s: &'a Shape,
    parts: &'a Parts,
    out: *mut f32,
    stream: *mut c_void,
}

/// Pooling on the device (`in` and `out` must not overlap).
unsafe fn pool(
    p: &Pool,
    input: *const f32,
    out: *mut f32,
    rows: usize,
    n: usize,
    stream: *mut c_void,
) -> Result<()> {
    // SAFETY: the pointers are device memory of the sizes checked by the public caller;
    // the launchers only enqueue work on `stream`.
    unsafe {
        let (mode, decay) = match p.kind {
            PoolKind::None | PoolKind::Avg => (cu::KVE_CUDA_POOL_AVG, 1.0),
            PoolKind::Max => (cu::KVE_CUDA_POOL_MAX, 1.0),
            PoolKind::Forward => (cu::KVE_CUDA_POOL_FORWARD, p.decay),
        };
        let k = if p.kind == PoolKind::None {
            1
        } else {
            p.kernel as c_int
        };
        let n = n as i64;
        ck(cu::kve_cuda_pool(
            input,
            n,
            out,
            n,
            rows as i64,
            n,
            mode,
            k,
            decay,
            stream,
        ))
    }
}

/// Pool `src` into `dst`, or hand `src` back when the pool changes nothing.
unsafe fn pooled(
    p: &Pool,
    src: *mut f32,
    dst: *mut f32,
    rows: usize,
    n: usize,
    stream: *mut c_void,
) -> Result<*mut f32> {
    // SAFETY: the pointers are device memory of the sizes checked by the public caller;
    // the launchers only enqueue work on `stream`.
    unsafe {
        if p.is_identity() {
            return Ok(src);
        }
        pool(p, src, dst, rows, n, stream)?;
        Ok(dst)
    }
}

/// `out[hk] = gqa over the group of a·f(b)·scale` (kve_cuda_head_reduce), rows stride `p`.
#[allow(clippy::too_many_arguments)]
unsafe fn reduce(
    a: *const f32,
    b: *const f32,
    ld_b: usize,
    b_mode: c_int,
    scale: *const f32,
    out: *mut f32,
    hq: usize,
    hkv: usize,
    p: usize,
    op: c_int,
    stream: *mut c_void,
) -> Result<()> {
    // SAFETY: the pointers are device memory of the sizes checked by the public caller;
    // the launchers only enqueue work on `stream`.
    unsafe {
        let pi = p as i64;
        ck(cu::kve_cuda_head_reduce(
            a,
            pi,
            b,
            ld_b.max(p) as i64,
            b_mode,
            scale,
            out,
            pi,
            hq as i64,
            hkv as i64,
            pi,
            op,
            stream,
        ))
    }
}

/// Which column aggregates of the window pass to write (null: not computed).
#[derive(Clone, Copy)]
struct Aggregates {
    mean: *mut f32,
    l2: *mut f32,
    cross: *mut f32,
    group: *mut f32,
}

impl Aggregates {
    const NONE: Aggregates = Aggregates {
        mean: core::ptr::null_mut(),
        l2: core::ptr::null_mut(),
        cross: core::ptr::null_mut(),
        group: core::ptr::null_mut(),
    };
    fn mean(p: *mut f32) -> Self {
        Aggregates {
            mean: p,
            ..Self::NONE
        }
    }
}

/// The window pass with the requested aggregates (queries: the last `w` rows given).
unsafe fn window(
    inp: &Inputs,
    s: &Shape,
    parts: &Parts,
    agg: Aggregates,
    gqa: c_int,
    stream: *mut c_void,
) -> Result<()> {
    // SAFETY: the pointers are device memory of the sizes checked by the public caller;
    // the launchers only enqueue work on `stream`.
    unsafe {
        let mut q = inp.q.ok_or(Error::InvalidArgument)?;
        let skip = q.tokens - s.w as i64;
        let bytes = skip * q.stride_token * elem_size(q.dtype) as i64;
        q.data = (q.data as *mut u8).wrapping_add(bytes as usize) as *mut c_void;
        q.tokens = s.w as i64;
        ck(cu::kve_cuda_window(
            &q,
            &inp.k,
            s.w as i64,
            agg.mean,
            agg.l2,
            agg.cross,
            agg.group,
            gqa,
            inp.lse.unwrap_or(null()),
            parts.win as *mut c_void,
            parts.win_bytes,
            stream,
        ))
    }
}

/// SnapKV's pooled, group-reduced mean attention into the chain's output.
unsafe fn snapkv(c: &Chain) -> Result<()> {
    let (cfg, inp, s, parts, dst, stream) = (c.cfg, c.inp, c.s, c.parts, c.out, c.stream);
    // SAFETY: the pointers are device memory of the sizes checked by the public caller;
    // the launchers only enqueue work on `stream`.
    unsafe {
        let gqa = cfg.gqa as c_int;
        if cfg.reduce_before_pool {
            if cfg.pool.is_identity() {
                return window(
                    inp,
                    s,
                    parts,
                    Aggregates {
                        group: dst,
                        ..Aggregates::NONE
                    },
                    gqa,
                    stream,
                );
            }
            window(
                inp,
                s,
                parts,
                Aggregates {
                    group: parts.a,
                    ..Aggregates::NONE
                },
                gqa,
                stream,
            )?;
            return pool(&cfg.pool, parts.a, dst, s.hkv, s.p, stream);
        }
        window(inp, s, parts, Aggregates::mean(parts.a), gqa, stream)?;
        let x = pooled(&cfg.pool, parts.a, parts.b, s.hq, s.p, stream)?;
        reduce(x, null(), 0, 0, null(), dst, s.hq, s.hkv, s.p, gqa, stream)
    }
}

/// LaProx's value-output terms: `(forms, row stride)`, from the caller's cached value
/// forms or from the Gram matrices on tensor cores.
unsafe fn value_forms(
    cfg: &ScoreConfig,
    inp: &Inputs,
    s: &Shape,
    parts: &Parts,
    stream: *mut c_void,
) -> Result<(*const f32, usize)> {
    // SAFETY: the pointers are device memory of the sizes checked by the public caller;
    // the launchers only enqueue work on `stream`.
    unsafe {
        if let Some(f) = inp.forms {
            return Ok((f, s.n));
        }
        let v = inp.v.ok_or(Error::InvalidArgument)?;
        let n_gram = if cfg.needs_cross() {
            s.hkv * s.pairs()
        } else {
            s.hq
        };
        let (hi, lo): (*const c_void, *const c_void) = if let Some(parts) = inp.split {
            parts // the caller's split, made once per model
        } else if v.dtype == cu::KVE_CUDA_F32 {
            let g = inp.gram.ok_or(Error::InvalidArgument)?;
            (g as *const c_void, null())
        } else {
            let g = inp.gram.ok_or(Error::InvalidArgument)?;
            // hi + lo in V's dtype: ~f32-accurate G on 16-bit tensor cores
            ck(cu::kve_cuda_gram_split(
                g,
                (n_gram * s.dv * s.dv) as i64,
                v.dtype,
                parts.gram_hi as *mut c_void,
                parts.gram_lo as *mut c_void,
                stream,
            ))?;
            (
                parts.gram_hi as *const c_void,
                parts.gram_lo as *const c_void,
            )
        };
        ck(cu::kve_cuda_vonorm(
            &v,
            s.p as i64,
            hi,
            lo,
            n_gram as i64,
            0,
            parts.forms,
            stream,
        ))?;
        Ok((parts.forms, s.p))
    }
}

unsafe fn laprox(c: &Chain) -> Result<()> {
    let (cfg, inp, s, parts, out, stream) = (c.cfg, c.inp, c.s, c.parts, c.out, c.stream);
    // SAFETY: the pointers are device memory of the sizes checked by the public caller;
    // the launchers only enqueue work on `stream`.
    unsafe {
        let (hq, hkv, p) = (s.hq, s.hkv, s.p);
        let sum = cu::KVE_CUDA_GQA_SUM;
        // the window pass first: it is the launch a device can refuse (shared memory), and
        // then nothing else has been enqueued
        let cross = cfg.laprox_gqa != LaproxGqa::Sum;
        let (l2, pairs) = if cross {
            (null_mut(), parts.a)
        } else {
            (parts.a, null_mut())
        };
        window(
            inp,
            s,
            parts,
            Aggregates {
                l2,
                cross: pairs,
                ..Aggregates::NONE
            },
            sum,
            stream,
        )?;
        let (forms, ldf) = value_forms(cfg, inp, s, parts, stream)?;
        match cfg.laprox_gqa {
            LaproxGqa::Sum => match cfg.placement {
                PoolPlacement::Attention => {
                    let x = pooled(&cfg.pool, parts.a, parts.b, hq, p, stream)?;
                    reduce(x, forms, ldf, 1, null(), out, hq, hkv, p, sum, stream)
                }
                PoolPlacement::Product => {
                    reduce(
                        parts.a,
                        forms,
                        ldf,
                        1,
                        null(),
                        parts.b,
                        hq,
                        hq,
                        p,
                        sum,
                        stream,
                    )?;
                    let x = pooled(&cfg.pool, parts.b, parts.a, hq, p, stream)?;
                    reduce(x, null(), 0, 0, null(), out, hq, hkv, p, sum, stream)
                }
            },
            LaproxGqa::Exact | LaproxGqa::MeanAttn => {
                let (g, pi) = (s.g() as i64, p as i64);
                let np_row = |t: *mut f32, k: usize| t.wrapping_add(k * hkv * p);
                let (t1, t2, t3) = (np_row(parts.t, 0), np_row(parts.t, 1), np_row(parts.t, 2));
                let exact = |c: *const f32, f: *const f32, o: *mut f32, mode: c_int| {
                    ck(cu::kve_cuda_laprox_exact(
                        c,
                        if c.is_null() { 0 } else { pi },
                        f,
                        if f.is_null() { 0 } else { ldf as i64 },
                        o,
                        pi,
                        hkv as i64,
                        g,
                        pi,
                        mode,
                        stream,
                    ))
                };
                if cfg.laprox_gqa == LaproxGqa::Exact {
                    // the pool applies to the product whatever the placement (core: laprox.rs)
                    if cfg.pool.is_identity() {
                        return exact(parts.a, forms, out, cu::KVE_CUDA_LAPROX_EXACT);
                    }
                    exact(parts.a, forms, t1, cu::KVE_CUDA_LAPROX_EXACT)?;
                    return pool(&cfg.pool, t1, out, hkv, p, stream);
                }
                exact(parts.a, null(), t1, cu::KVE_CUDA_LAPROX_ATTN_TERM)?;
                exact(null(), forms, t2, cu::KVE_CUDA_LAPROX_VALUE_TERM)?;
                match cfg.placement {
                    PoolPlacement::Attention => {
                        let x = pooled(&cfg.pool, t1, t3, hkv, p, stream)?;
                        reduce(x, t2, p, 2, null(), out, hkv, hkv, p, sum, stream)
                    }
                    PoolPlacement::Product => {
                        if cfg.pool.is_identity() {
                            return reduce(t1, t2, p, 2, null(), out, hkv, hkv, p, sum, stream);
                        }
                        reduce(t1, t2, p, 2, null(), t3, hkv, hkv, p, sum, stream)?;
                        pool(&cfg.pool, t3, out, hkv, p, stream)
                    }
                }
            }
        }
    }
}

unsafe fn launch(c: &Chain) -> Result<()> {
    let (cfg, inp, s, parts, out, stream) = (c.cfg, c.inp, c.s, c.parts, c.out, c.stream);
    // SAFETY: the pointers are device memory of the sizes checked by the public caller;
    // the launchers only enqueue work on `stream`.
    unsafe {
        let (hq, hkv, p) = (s.hq, s.hkv, s.p);
        let pi = p as i64;
        let scored = match cfg.scorer {
            ScorerKind::SnapKv => snapkv(c),
            ScorerKind::Lava => {
                let v = inp.v.ok_or(Error::InvalidArgument)?;
                let max = cu::KVE_CUDA_GQA_MAX;
                window(inp, s, parts, Aggregates::mean(parts.a), max, stream)?;
                let x = pooled(&cfg.pool, parts.a, parts.b, hq, p, stream)?;
                ck(cu::kve_cuda_lava_factor(&v, pi, parts.factor, stream))?;
                reduce(x, null(), 0, 0, parts.factor, out, hq, hkv, p, max, stream)
            }
            ScorerKind::LaProx => laprox(c),
            ScorerKind::CriticalKv => {
                snapkv(c)?;
                let l1 = inp.l1.ok_or(Error::InvalidArgument)?;
                // first stage: each head's top `critical_first_stage` by the base score
                ck(cu::kve_cuda_select(
                    out,
                    pi,
                    pi,
                    hkv as i64,
                    1,
                    null(),
                    cfg.critical_first_stage as i64,
                    null(),
                    1,
                    parts.counts,
                    parts.idx,
                    pi,
                    parts.sel as *mut c_void,
                    parts.sel_bytes,
                    stream,
                ))?;
                ck(cu::kve_cuda_critical_combine(
                    out,
                    pi,
                    l1,
                    s.n as i64,
                    parts.counts,
                    parts.idx,
                    pi,
                    hkv as i64,
                    pi,
                    out,
                    pi,
                    stream,
                ))
            }
            ScorerKind::StreamingLlm => ck(cu::kve_cuda_sink_scores(
                out,
                hkv as i64,
                pi,
                pi,
                cfg.sinks as i64,
                stream,
            )),
            ScorerKind::KNorm => ck(cu::kve_cuda_knorm(&inp.k, pi, out, pi, stream)),
            ScorerKind::Uniqueness => ck(cu::kve_cuda_uniqueness(
                &inp.k,
                &inp.v.ok_or(Error::InvalidArgument)?,
                pi,
                out,
                pi,
                parts.uniq as *mut c_void,
                parts.uniq_bytes,
                stream,
            )),
            ScorerKind::Tova => {
                // the mean over every query head of the layer, computed once and written to
                // every KV head's row: one launch
                window(inp, s, parts, Aggregates::mean(parts.a), 0, stream)?;
                let (hq, hkv) = (hq as i64, hkv as i64);
                let mean = cu::KVE_CUDA_GQA_MEAN;
                ck(cu::kve_cuda_head_reduce_all(
                    parts.a, pi, out, pi, hq, hkv, pi, mean, stream,
                ))
            }
        };
        scored?;
        // kve_score_params.power, in place over the `hkv` rows of `p` just written
        if cfg.power > 1 {
            ck(cu::kve_cuda_score_power(
                out,
                hkv as i64,
                pi,
                pi,
                cfg.power as i32,
                stream,
            ))?;
        }
        Ok(())
    }
}
