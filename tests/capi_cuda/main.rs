//! The public CUDA entry points (`kve_cuda_score_layer`, `kve_cuda_select_model`) against
//! the host C API, for every scorer, allocator, granularity, dtype and layout. One module per
//! entry point: `score` (`kve_cuda_score_layer`), `select` (`kve_cuda_select_model`), `shapes`
//! (the size queries), `requirements` (the inputs each scorer reads, host and device alike),
//! `compact` (`kve_cuda_compact_batch_in_place`), `gram` (`kve_cuda_prepare_gram`,
//! `kve_cuda_score_layer_prepared`); the shared layers, tensors and configurations here.
//!
//! Runs on a GPU with `--features cuda` (skips without a device), and in CI without one
//! with `--features cuda-emu`, where the real kernels run on the CPU emulator (cuda/emu): the
//! host-side chains of launches (which launcher, which buffer, which stride) and the kernels
//! reproduce the core.
#![cfg(feature = "cuda")]
#![allow(clippy::needless_range_loop)] // tests/reference's and tests/conformance's loops

use half::{bf16, f16};
use kvevict::capi::*;
use kvevict::config::*;
use kvevict::View;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

#[path = "../capi_common/mod.rs"]
mod capi_common;
#[path = "../reference/mod.rs"]
mod reference;
#[macro_use]
#[path = "../conformance/mod.rs"]
mod conformance;

/// Device memory (cudaMalloc'd).
type Buf = conformance::DBuf<u8>;
use conformance::{have_device, select_params, Dt, Rng};

/// How a [heads, tokens, dim] tensor lies in memory.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    /// [H, N, d]
    HeadMajor,
    /// llama.cpp K rows [N][H*d]
    TokenRows,
    /// llama.cpp transposed V [H*d][N]
    Transposed,
}

fn strides(l: Layout, e: [usize; 3]) -> [usize; 3] {
    let [h, t, d] = e;
    match l {
        Layout::HeadMajor => [t * d, d, 1],
        Layout::TokenRows => [d, h * d, 1],
        Layout::Transposed => [d * t, 1, t],
    }
}

/// One tensor, host bytes and device copy, in a dtype and layout.
struct Tensor {
    dt: Dt,
    ext: [usize; 3],
    stride: [usize; 3],
    bytes: Vec<u8>,
    dev: Buf,
}

impl Tensor {
    fn new(dt: Dt, l: Layout, ext: [usize; 3], rng: &mut Rng, scale: f32) -> Tensor {
        let stride = strides(l, ext);
        let len = ext[0] * ext[1] * ext[2];
        let vals = rng.normals(len, scale);
        let bytes = dt.encode(&vals);
        let dev = Buf::bytes_of(&bytes);
        Tensor {
            dt,
            ext,
            stride,
            bytes,
            dev,
        }
    }
    fn len(&self) -> usize {
        self.ext.iter().product()
    }
    fn desc(&self, on_device: bool) -> kve_tensor {
        let data = if on_device {
            self.dev.vptr() as *const c_void
        } else {
            self.bytes.as_ptr() as *const c_void
        };
        kve_tensor {
            data,
            len: self.len() as u64,
            dtype: self.dt.code() as u32,
            pad: 0,
            extent: self.ext.map(|x| x as u64),
            stride: self.stride.map(|x| x as u64),
        }
    }
    fn view(&self) -> View<'_> {
        let n = self.len();
        unsafe {
            match self.dt {
                Dt::F32 => View::f32(
                    std::slice::from_raw_parts(self.bytes.as_ptr() as *const f32, n),
                    self.ext,
                    self.stride,
                ),
                Dt::F16 => View::f16(
                    std::slice::from_raw_parts(self.bytes.as_ptr() as *const f16, n),
                    self.ext,
                    self.stride,
                ),
                Dt::Bf16 => View::bf16(
                    std::slice::from_raw_parts(self.bytes.as_ptr() as *const bf16, n),
                    self.ext,
                    self.stride,
                ),
            }
            .unwrap()
        }
    }
}

/// A layer's tensors and the per-model LaProx / CriticalKV inputs, host and device.
struct Layer {
    hq: usize,
    hkv: usize,
    n: usize,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gram: [Vec<f32>; 2],
    forms: [Vec<f32>; 2],
    l1: Vec<f32>,
    dgram: [Buf; 2],
    dforms: [Buf; 2],
    dl1: Buf,
}

#[allow(clippy::too_many_arguments)]
fn layer(
    dt: Dt,
    kl: Layout,
    vl: Layout,
    hq: usize,
    hkv: usize,
    n: usize,
    d: usize,
    seed: u64,
) -> Layer {
    let mut rng = Rng::new(seed);
    let wq = 70;
    let dm = 48;
    let q = Tensor::new(dt, Layout::HeadMajor, [hq, wq, d], &mut rng, 1.0);
    let k = Tensor::new(dt, kl, [hkv, n, d], &mut rng, 1.0);
    let v = Tensor::new(dt, vl, [hkv, n, d], &mut rng, 1.0);
    let wo_vals = rng.normals(hq * d * dm, 0.2);
    let wo = View::f32(&wo_vals, [hq, d, dm], [d * dm, dm, 1]).unwrap();
    let mut gram: [Vec<f32>; 2] = Default::default();
    let mut forms: [Vec<f32>; 2] = Default::default();
    for (c, cross) in [false, true].into_iter().enumerate() {
        let mut g = vec![0f32; kvevict::gram::gram_len(hq, hkv, d, cross).unwrap()];
        let mut ws = vec![0u8; kvevict::gram::gram_workspace_size(d, dm).unwrap()];
        kvevict::compute_gram(&wo, hkv, cross, &mut g, &mut ws).unwrap();
        let mut f = vec![0f32; kvevict::gram::value_forms_len(hq, hkv, n, cross).unwrap()];
        kvevict::compute_value_forms(&v.view(), &g, hq, cross, 0, n, &mut f).unwrap();
        gram[c] = g;
        forms[c] = f;
    }
    let mut l1 = vec![0f32; hkv * n];
    let mut ws = vec![0u8; kvevict::gram::value_l1_workspace_size(d, dm).unwrap()];
    kvevict::compute_value_l1(&v.view(), &wo, &mut l1, &mut ws).unwrap();
    Layer {
        hq,
        hkv,
        n,
        dgram: [Buf::bytes_of(&gram[0]), Buf::bytes_of(&gram[1])],
        dforms: [Buf::bytes_of(&forms[0]), Buf::bytes_of(&forms[1])],
        dl1: Buf::bytes_of(&l1),
        q,
        k,
        v,
        gram,
        forms,
        l1,
    }
}

fn score_params(f: impl FnOnce(&mut kve_score_params), preset: Preset) -> kve_score_params {
    // SAFETY: a writable struct of the size passed.
    let init = |p, size| unsafe { kve_score_params_init(p, size, preset as u32) };
    let mut p = capi_common::init_struct(init);
    f(&mut p);
    p
}

fn inputs_init() -> kve_layer_inputs {
    // SAFETY: a writable struct of the size passed.
    capi_common::init_struct(|p, size| unsafe { kve_layer_inputs_init(p, size) })
}

/// How the LaProx value term reaches the scorer.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Vals {
    Gram,
    Forms,
}

fn inputs(
    l: &Layer,
    p: &kve_score_params,
    vals: Vals,
    lse: Option<(&[f32], &Buf)>,
    on_device: bool,
) -> kve_layer_inputs {
    let mut i = inputs_init();
    i.queries = l.q.desc(on_device);
    i.keys = l.k.desc(on_device);
    i.values = l.v.desc(on_device);
    let c =
        (p.scorer == ScorerKind::LaProx as u32 && p.laprox_gqa != LaproxGqa::Sum as u32) as usize;
    if p.scorer == ScorerKind::LaProx as u32 {
        match vals {
            Vals::Gram => {
                i.gram = if on_device {
                    l.dgram[c].ptr_as()
                } else {
                    l.gram[c].as_ptr()
                };
                i.gram_len = l.gram[c].len() as u64;
            }
            Vals::Forms => {
                i.values = kve_tensor::NONE;
                i.value_forms = if on_device {
                    l.dforms[c].ptr_as()
                } else {
                    l.forms[c].as_ptr()
                };
                i.value_forms_len = l.forms[c].len() as u64;
            }
        }
    }
    i.value_l1 = if on_device {
        l.dl1.ptr_as()
    } else {
        l.l1.as_ptr()
    };
    i.value_l1_len = l.l1.len() as u64;
    if let Some((h, d)) = lse {
        i.row_lse = if on_device { d.ptr_as() } else { h.as_ptr() };
        i.row_lse_len = h.len() as u64;
    }
    i
}

/// `l`'s scores under `p` from `kve_score_layer` (host memory) or, `on_device`,
/// `kve_cuda_score_layer` (the inputs as [`inputs`] gives them), each with the workspace
/// its size query gives.
fn scores(
    l: &Layer,
    p: &kve_score_params,
    vals: Vals,
    lse: Option<(&[f32], &Buf)>,
    on_device: bool,
) -> Vec<f32> {
    let inp = inputs(l, p, vals, lse, on_device);
    if on_device {
        let (st, out) = device_call(l, p, |out, len, ws, bytes| unsafe {
            kve_cuda_score_layer(p, &inp, out, len, ws, bytes, null_mut())
        });
        assert_eq!(st, KVE_OK, "device score");
        return out;
    }
    let ([hq, hkv, n], d) = ([l.hq, l.hkv, l.n].map(|x| x as u64), l.k.ext[2] as u64);
    let w = (p.window as usize).min(l.n);
    let mut out = vec![0f32; l.hkv * (l.n - w)];
    // SAFETY: an out-parameter, then host tensors and buffers of the sizes passed.
    let st = unsafe {
        let mut ws = capi_common::workspace(|b| kve_score_workspace_size(p, hq, hkv, n, d, d, b));
        capi_common::into_out(&mut out, &mut ws, |o, len, wp, bytes| {
            kve_score_layer(p, &inp, o, len, wp, bytes)
        })
    };
    assert_eq!(st, KVE_OK, "host score");
    out
}

/// `kve_cuda_score_layer` on the default stream: `len` scores into the device buffer `out`,
/// the device workspace `ws` of `bytes`. Its status.
///
/// # Safety
/// `inp`'s tensors are device memory of their declared extents.
unsafe fn score_into(
    p: &kve_score_params,
    inp: &kve_layer_inputs,
    out: &Buf,
    len: usize,
    ws: &Buf,
    bytes: u64,
) -> i32 {
    // SAFETY: `out` and `ws` are device buffers of the sizes passed; `inp` per the contract.
    unsafe {
        kve_cuda_score_layer(
            p,
            inp,
            out.ptr_as(),
            len as u64,
            ws.ptr_as(),
            bytes,
            null_mut(),
        )
    }
}

/// A device scoring call with the queried workspace and `out` (canary-filled): its status
/// and `out` afterwards.
fn device_call(
    l: &Layer,
    p: &kve_score_params,
    call: impl FnOnce(*mut f32, u64, *mut c_void, u64) -> i32,
) -> (i32, Vec<f32>) {
    let d = l.k.ext[2] as u64;
    let mut bytes = 0u64;
    unsafe {
        assert_eq!(
            kve_cuda_score_workspace_size(
                p,
                l.hq as u64,
                l.hkv as u64,
                l.n as u64,
                d,
                d,
                &mut bytes
            ),
            KVE_OK
        );
    }
    let ws = Buf::new(bytes as usize);
    let len = l.hkv * (l.n - (p.window as usize).min(l.n));
    let out = Buf::bytes_of(&vec![-7.5f32; len]);
    let st = call(out.ptr_as(), len as u64, ws.ptr_as(), bytes);
    (st, out.download_as::<f32>(len))
}

/// Largest |a - b| per head relative to that head's largest |b|.
fn worst_rel(a: &[f32], b: &[f32], heads: usize) -> f64 {
    let p = b.len() / heads.max(1);
    let mut worst = 0f64;
    for h in 0..heads {
        let (ra, rb) = (&a[h * p..(h + 1) * p], &b[h * p..(h + 1) * p]);
        let scale = rb
            .iter()
            .fold(0f64, |m, &x| m.max((x as f64).abs()))
            .max(1e-30);
        for (&x, &y) in ra.iter().zip(rb) {
            worst = worst.max((x as f64 - y as f64).abs() / scale);
        }
    }
    worst
}

fn configs() -> Vec<(&'static str, kve_score_params)> {
    use Preset as P;
    let mut v = vec![
        ("snapkv", score_params(|_| {}, P::SnapKv)),
        ("snapkv-kvpress", score_params(|_| {}, P::SnapKvKvpress)),
        (
            "snapkv rbp max",
            score_params(
                |p| {
                    p.reduce_before_pool = 1;
                    p.gqa = GqaReduce::Max as u32;
                },
                P::SnapKv,
            ),
        ),
        (
            "snapkv sum fwd",
            score_params(
                |p| {
                    p.gqa = GqaReduce::Sum as u32;
                    p.pool_kind = PoolKind::Forward as u32;
                    p.pool_kernel = 8;
                    p.pool_decay = 0.9;
                },
                P::SnapKv,
            ),
        ),
        ("lava", score_params(|_| {}, P::Lava)),
        ("laprox", score_params(|_| {}, P::LaProx)),
        ("laprox-span", score_params(|_| {}, P::LaProxSpan)),
        (
            "laprox product",
            score_params(|p| p.placement = PoolPlacement::Product as u32, P::LaProx),
        ),
        (
            "laprox exact",
            score_params(|p| p.laprox_gqa = LaproxGqa::Exact as u32, P::LaProx),
        ),
        (
            "laprox exact k1",
            score_params(|p| p.laprox_gqa = LaproxGqa::Exact as u32, P::LaProxSpan),
        ),
        (
            "laprox mean-attn",
            score_params(|p| p.laprox_gqa = LaproxGqa::MeanAttn as u32, P::LaProx),
        ),
        (
            "laprox mean-attn product",
            score_params(
                |p| {
                    p.laprox_gqa = LaproxGqa::MeanAttn as u32;
                    p.placement = PoolPlacement::Product as u32;
                },
                P::LaProx,
            ),
        ),
        (
            "criticalkv",
            score_params(|p| p.critical_first_stage = 20, P::CriticalKv),
        ),
        ("streamingllm", score_params(|_| {}, P::StreamingLlm)),
        ("knorm", score_params(|_| {}, P::KNorm)),
        ("tova", score_params(|_| {}, P::Tova)),
    ];
    v.push((
        "laprox mean-attn k1",
        score_params(|p| p.laprox_gqa = LaproxGqa::MeanAttn as u32, P::LaProxSpan),
    ));
    // kve_score_params.power on the device: forced FLT_MAX tokens saturate, negative
    // scores keep their sign under an even power
    v.push((
        "criticalkv cubed",
        score_params(
            |p| {
                p.critical_first_stage = 20;
                p.power = 3;
            },
            P::CriticalKv,
        ),
    ));
    v.push(("knorm squared", score_params(|p| p.power = 2, P::KNorm)));
    v
}

/// Compare CriticalKV's forced entries (f32::MAX) as sets, the rest by value.
fn critical_diff(dev: &[f32], host: &[f32]) -> (usize, f64) {
    let mismatched = dev
        .iter()
        .zip(host)
        .filter(|(a, b)| (**a == f32::MAX) != (**b == f32::MAX))
        .count();
    let (mut da, mut ha) = (Vec::new(), Vec::new());
    for (&a, &b) in dev.iter().zip(host) {
        if a != f32::MAX && b != f32::MAX {
            da.push(a);
            ha.push(b);
        }
    }
    (mismatched, worst_rel(&da, &ha, 1))
}

/// CriticalKV's forced sets: a near-tie may fall the other way on the kernels (one per head).
fn allowed_forced_mismatch(heads: usize) -> usize {
    heads
}

/// Tolerance of device scores against the host: another summation order; with 16-bit
/// inputs tensor cores add 16-bit rounding of the Gram (hi + lo).
fn tolerance(dt: Dt) -> f64 {
    if dt != Dt::F32 {
        5e-4
    } else {
        5e-5
    }
}

/// Dtypes, layouts (K / V) and shapes (hq, hkv, n, d) of the scoring tests.
const SCORE_CASES: [(Dt, Layout, Layout, usize, usize, usize, usize); 4] = [
    (Dt::F32, Layout::HeadMajor, Layout::HeadMajor, 8, 2, 300, 32),
    (
        Dt::F16,
        Layout::TokenRows,
        Layout::Transposed,
        8,
        2,
        257,
        64,
    ),
    (
        Dt::Bf16,
        Layout::HeadMajor,
        Layout::TokenRows,
        4,
        4,
        200,
        64,
    ),
    (
        Dt::F16,
        Layout::HeadMajor,
        Layout::HeadMajor,
        12,
        3,
        150,
        128,
    ),
];

/// `kve_select_model` with outputs and workspace sized by its size queries for `m`'s
/// shape (empty when a query refuses it): the status, the offsets and the indices.
fn host_select_call(p: &kve_select_params, m: &kve_model_scores) -> (i32, Vec<u64>, Vec<u32>) {
    let (mut no, mut ni, mut bytes) = (0u64, 0u64, 0u64);
    let (l, h, n, w) = (m.layers, m.hkv, m.n, m.window);
    unsafe {
        if kve_select_output_len(p, l, h, n, w, &mut no, &mut ni) != KVE_OK
            || kve_select_workspace_size(p, l, h, n, w, &mut bytes) != KVE_OK
        {
            (no, ni, bytes) = (0, 0, 0);
        }
        let mut off = vec![0u64; no as usize];
        let mut idx = vec![0u32; ni as usize];
        let mut ws = vec![0u8; bytes as usize];
        let st = kve_select_model(
            p,
            m,
            off.as_mut_ptr(),
            no,
            idx.as_mut_ptr(),
            ni,
            ws.as_mut_ptr() as *mut c_void,
            bytes,
        );
        (st, off, idx)
    }
}

mod compact;
mod evictor_paged;
mod gram;
mod requirements;
mod round;
mod score;
mod select;
mod shapes;
