//! The public CUDA entry points (`kve_cuda_score_layer`, `kve_cuda_select_model`) against
//! the host C API, for every scorer, allocator, granularity, dtype and layout.
//!
//! Runs on a GPU with `--features cuda` (skips without a device), and in CI without one
//! with `--features cuda-mock`, where the launchers are the plain-Rust test double of
//! src/cuda/mock.rs: that proves the host-side chains of launches (which launcher, which
//! buffer, which stride) reproduce the core, whatever the kernels do.
#![cfg(any(feature = "cuda", feature = "cuda-mock"))]
#![allow(clippy::needless_range_loop)] // tests/reference's and tests/conformance's loops

use half::{bf16, f16};
use kvevict::capi::*;
use kvevict::config::*;
use kvevict::View;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

mod reference;
#[macro_use]
mod conformance;

/// Device memory (cudaMalloc'd with the kernels, host memory with the mock).
type Buf = conformance::DBuf<u8>;
use conformance::{have_device, Dt, Rng};

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
    unsafe {
        let mut p = std::mem::zeroed::<kve_score_params>();
        assert_eq!(
            kve_score_params_init(
                &mut p,
                std::mem::size_of::<kve_score_params>() as u32,
                preset as u32
            ),
            KVE_OK
        );
        f(&mut p);
        p
    }
}

fn inputs_init() -> kve_layer_inputs {
    unsafe {
        let mut i = std::mem::zeroed::<kve_layer_inputs>();
        assert_eq!(
            kve_layer_inputs_init(&mut i, std::mem::size_of::<kve_layer_inputs>() as u32),
            KVE_OK
        );
        i
    }
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

fn host_scores(
    l: &Layer,
    p: &kve_score_params,
    vals: Vals,
    lse: Option<(&[f32], &Buf)>,
) -> Vec<f32> {
    let d = l.k.ext[2] as u64;
    let mut bytes = 0u64;
    unsafe {
        assert_eq!(
            kve_score_workspace_size(p, l.hq as u64, l.hkv as u64, l.n as u64, d, d, &mut bytes),
            KVE_OK
        );
        let mut ws = vec![0u8; bytes as usize];
        let w = (p.window as usize).min(l.n);
        let mut out = vec![0f32; l.hkv * (l.n - w)];
        let inp = inputs(l, p, vals, lse, false);
        let st = kve_score_layer(
            p,
            &inp,
            out.as_mut_ptr(),
            out.len() as u64,
            ws.as_mut_ptr() as *mut c_void,
            bytes,
        );
        assert_eq!(st, KVE_OK, "host score");
        out
    }
}

fn device_scores(
    l: &Layer,
    p: &kve_score_params,
    vals: Vals,
    lse: Option<(&[f32], &Buf)>,
) -> Vec<f32> {
    let inp = inputs(l, p, vals, lse, true);
    let (st, out) = device_call(l, p, |out, len, ws, bytes| unsafe {
        kve_cuda_score_layer(p, &inp, out, len, ws, bytes, null_mut())
    });
    assert_eq!(st, KVE_OK, "device score");
    out
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

/// CriticalKV's forced sets: a near-tie may fall the other way on a GPU (one per head);
/// the mock reproduces the host's base scores, so none there.
fn allowed_forced_mismatch(heads: usize) -> usize {
    if cfg!(feature = "cuda") {
        heads
    } else {
        0
    }
}

/// Tolerance of device scores against the host: the mock differs only in summation
/// order; tensor cores add 16-bit rounding of the Gram (hi + lo) and another order.
fn tolerance(dt: Dt) -> f64 {
    if cfg!(feature = "cuda") && dt != Dt::F32 {
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

#[test]
fn device_scores_match_host_for_every_scorer() {
    if !have_device() {
        return;
    }
    let cases = SCORE_CASES;
    let mut worst_all = 0f64;
    for (ci, &(dt, kl, vl, hq, hkv, n, d)) in cases.iter().enumerate() {
        let l = layer(dt, kl, vl, hq, hkv, n, d, ci as u64 + 1);
        for (name, p) in configs() {
            for vals in [Vals::Gram, Vals::Forms] {
                if vals == Vals::Forms && p.scorer != ScorerKind::LaProx as u32 {
                    continue;
                }
                let host = host_scores(&l, &p, vals, None);
                let devs = device_scores(&l, &p, vals, None);
                let what =
                    format!("{name} {vals:?} {dt:?} {kl:?}/{vl:?} hq={hq} hkv={hkv} n={n} d={d}");
                if p.scorer == ScorerKind::CriticalKv as u32 {
                    let (m, e) = critical_diff(&devs, &host);
                    assert!(
                        m <= allowed_forced_mismatch(hkv),
                        "{what}: {m} forced entries differ"
                    );
                    assert!(e <= tolerance(dt), "{what}: {e:e}");
                    continue;
                }
                let e = worst_rel(&devs, &host, hkv);
                worst_all = worst_all.max(e);
                assert!(
                    e <= tolerance(dt),
                    "{what}: worst relative difference {e:e}"
                );
            }
        }
    }
    println!("worst relative difference, every scorer: {worst_all:.2e}");
}

#[test]
fn device_scores_with_row_lse_match_host() {
    if !have_device() {
        return;
    }
    let l = layer(
        Dt::Bf16,
        Layout::TokenRows,
        Layout::Transposed,
        8,
        2,
        260,
        64,
        7,
    );
    for (name, p) in configs() {
        if matches!(p.scorer, x if x == ScorerKind::KNorm as u32 || x == ScorerKind::StreamingLlm as u32)
        {
            continue;
        }
        let w = (p.window as usize).min(l.n);
        // the LSE from the host helper, on both sides
        let mut lse = vec![0f32; l.hq * w];
        let mut bytes = 0u64;
        unsafe {
            let d = l.k.ext[2] as u64;
            assert_eq!(
                kve_window_row_lse_workspace_size(
                    l.hq as u64,
                    l.hkv as u64,
                    l.n as u64,
                    d,
                    p.window,
                    &mut bytes
                ),
                KVE_OK
            );
            let mut ws = vec![0u8; bytes as usize];
            let (qt, kt) = (l.q.desc(false), l.k.desc(false));
            assert_eq!(
                kve_window_row_lse(
                    &qt,
                    &kt,
                    p.window,
                    lse.as_mut_ptr(),
                    lse.len() as u64,
                    ws.as_mut_ptr() as *mut c_void,
                    bytes
                ),
                KVE_OK
            );
        }
        let dl = Buf::bytes_of(&lse);
        let host = host_scores(&l, &p, Vals::Gram, Some((&lse, &dl)));
        let devs = device_scores(&l, &p, Vals::Gram, Some((&lse, &dl)));
        if p.scorer == ScorerKind::CriticalKv as u32 {
            let (m, e) = critical_diff(&devs, &host);
            assert!(
                m <= allowed_forced_mismatch(l.hkv) && e <= tolerance(Dt::Bf16),
                "{name}"
            );
            continue;
        }
        let e = worst_rel(&devs, &host, l.hkv);
        assert!(e <= tolerance(Dt::Bf16), "{name} with row_lse: {e:e}");
    }
}

#[test]
fn device_score_rejects_bad_input_before_launching() {
    if !have_device() {
        return;
    }
    let l = layer(
        Dt::F16,
        Layout::HeadMajor,
        Layout::HeadMajor,
        8,
        2,
        120,
        32,
        3,
    );
    let p = score_params(|_| {}, Preset::LaProx);
    let d = 32u64;
    let mut bytes = 0u64;
    unsafe {
        assert_eq!(
            kve_cuda_score_workspace_size(&p, 8, 2, l.n as u64, d, d, &mut bytes),
            KVE_OK
        );
        let ws = Buf::new(bytes as usize);
        let len = 2 * (l.n - 32);
        let out = Buf::new(len * 4);
        let canary = vec![0xA5A5_A5A5u32; len];
        let check = |inp: &kve_layer_inputs, wsb: u64, out_len: u64, want: i32, what: &str| {
            out.upload_as(&canary);
            let st =
                kve_cuda_score_layer(&p, inp, out.ptr_as(), out_len, ws.ptr_as(), wsb, null_mut());
            assert_eq!(st, want, "{what}");
            assert!(out.download_as::<u32>(len) == canary, "{what}: out written");
        };
        let good = inputs(&l, &p, Vals::Gram, None, true);
        check(
            &good,
            bytes - 1,
            len as u64,
            KVE_ERR_WORKSPACE_TOO_SMALL,
            "short workspace",
        );
        check(
            &good,
            bytes,
            len as u64 - 1,
            KVE_ERR_OUTPUT_TOO_SMALL,
            "short out",
        );
        let mut x = good;
        x.gram = null();
        x.gram_len = 0;
        check(&x, bytes, len as u64, KVE_ERR_NULL_POINTER, "no gram");
        let mut x = good;
        x.gram_len -= 1;
        check(&x, bytes, len as u64, KVE_ERR_SHAPE_MISMATCH, "gram length");
        let mut x = good;
        x.keys.data = null();
        check(&x, bytes, len as u64, KVE_ERR_NULL_POINTER, "no keys");
        let mut x = good;
        x.keys.dtype = 9;
        check(&x, bytes, len as u64, KVE_ERR_BAD_ENUM, "dtype");
        let mut x = good;
        x.values.extent[1] -= 1;
        check(
            &x,
            bytes,
            len as u64,
            KVE_ERR_SHAPE_MISMATCH,
            "values tokens",
        );
        let mut x = good;
        x.keys.len -= 1;
        check(&x, bytes, len as u64, KVE_ERR_OUT_OF_BOUNDS, "keys length");
        let mut x = good;
        x.row_lse = l.dl1.ptr_as();
        x.row_lse_len = 3;
        check(
            &x,
            bytes,
            len as u64,
            KVE_ERR_SHAPE_MISMATCH,
            "row_lse length",
        );
        let st = kve_cuda_score_layer(
            &p,
            &good,
            null_mut(),
            len as u64,
            ws.ptr_as(),
            bytes,
            null_mut(),
        );
        assert_eq!(st, KVE_ERR_NULL_POINTER);
        // outputs over inputs: refused, the input untouched
        let keys_before = l.k.dev.download_as::<u8>(l.k.bytes.len());
        let st = kve_cuda_score_layer(
            &p,
            &good,
            l.k.dev.ptr_as(),
            len as u64,
            ws.ptr_as(),
            bytes,
            null_mut(),
        );
        assert_eq!(st, KVE_ERR_ALIASING);
        let st = kve_cuda_score_layer(
            &p,
            &good,
            out.ptr_as(),
            len as u64,
            l.dgram[0].ptr_as(),
            bytes,
            null_mut(),
        );
        assert_ne!(st, KVE_OK);
        assert!(l.k.dev.download_as::<u8>(l.k.bytes.len()) == keys_before);
        // the whole cache is window: nothing to score, nothing written
        let mut big = p;
        big.window = 4096;
        big.scorer = ScorerKind::KNorm as u32; // reads no queries: any window is valid
        out.upload_as(&canary);
        let st = kve_cuda_score_layer(&big, &good, out.ptr_as(), 0, ws.ptr_as(), bytes, null_mut());
        assert_eq!(st, KVE_OK);
        assert!(out.download_as::<u32>(len) == canary);
    }
}

/// Found by fuzz/fuzz_targets/capi.rs: LaProx given cached value forms sized its Gram
/// parts with `dk` instead of the queried `dv`, so a workspace of the size
/// `kve_cuda_score_workspace_size` gave for the call's shape (`dv < dk`) was refused.
#[test]
fn device_score_with_value_forms_fits_the_queried_workspace() {
    if !have_device() {
        return;
    }
    let l = layer(
        Dt::F16,
        Layout::HeadMajor,
        Layout::HeadMajor,
        8,
        2,
        120,
        32,
        5,
    );
    for gqa in [LaproxGqa::Sum, LaproxGqa::Exact, LaproxGqa::MeanAttn] {
        let p = score_params(|p| p.laprox_gqa = gqa as u32, Preset::LaProx);
        let host = host_scores(&l, &p, Vals::Forms, None);
        for dv in [1u64, 16] {
            let mut bytes = 0u64;
            unsafe {
                assert_eq!(
                    kve_cuda_score_workspace_size(&p, 8, 2, l.n as u64, 32, dv, &mut bytes),
                    KVE_OK
                );
                let ws = Buf::new(bytes as usize);
                let len = host.len();
                let out = Buf::new(len * 4);
                let inp = inputs(&l, &p, Vals::Forms, None, true);
                let st = kve_cuda_score_layer(
                    &p,
                    &inp,
                    out.ptr_as(),
                    len as u64,
                    ws.ptr_as(),
                    bytes,
                    null_mut(),
                );
                assert_eq!(st, KVE_OK, "{gqa:?} dv {dv}");
                let d = out.download_as::<f32>(len);
                assert!(
                    worst_rel(&d, &host, 2) < tolerance(Dt::F16),
                    "{gqa:?} dv {dv}"
                );
            }
        }
    }
}

/// Found by fuzz/fuzz_targets/capi.rs: shapes the C layer accepted and a launcher then
/// refused (`KVE_ERR_CUDA`): more than 128 query heads per KV head (window), 65536 heads
/// (the kernels' grid limit is 65535). Now `KVE_ERR_INVALID_ARGUMENT`, nothing written.
#[test]
fn device_score_rejects_shapes_beyond_the_kernels() {
    if !have_device() {
        return;
    }
    let (w, n, d) = (2u64, 6u64, 4u64);
    let buf = Buf::bytes_of(&vec![0.25f32; (n * d) as usize]);
    // `heads` heads sharing one [n, d] block (head stride 0)
    let t = |heads: u64, tokens: u64| kve_tensor {
        data: buf.vptr() as *const c_void,
        len: tokens * d,
        dtype: Dt::F32.code() as u32,
        pad: 0,
        extent: [heads, tokens, d],
        stride: [0, d, 1],
    };
    let cases = [
        (Preset::SnapKv, 129, 1, KVE_ERR_INVALID_ARGUMENT),
        (Preset::SnapKv, 128, 1, KVE_OK),
        (Preset::SnapKv, 65536, 1, KVE_ERR_INVALID_ARGUMENT),
        (Preset::Tova, 256, 1, KVE_ERR_INVALID_ARGUMENT),
        (Preset::KNorm, 65536, 65536, KVE_ERR_INVALID_ARGUMENT),
        (Preset::SnapKv, 65536, 65536, KVE_ERR_INVALID_ARGUMENT),
    ];
    for (preset, hq, hkv, want) in cases {
        let w = if preset == Preset::Tova { 1 } else { w };
        let p = score_params(|p| p.window = w as u32, preset);
        let mut inp = inputs_init();
        inp.queries = t(hq, w);
        inp.keys = t(hkv, n);
        let mut bytes = 0u64;
        unsafe {
            assert_eq!(
                kve_cuda_score_workspace_size(&p, hq, hkv, n, d, d, &mut bytes),
                KVE_OK
            );
            let ws = Buf::new(bytes as usize);
            let len = (hkv * (n - w)) as usize;
            let out = Buf::new(len * 4);
            let canary = vec![0xA5A5_A5A5u32; len];
            out.upload_as(&canary);
            let st = kve_cuda_score_layer(
                &p,
                &inp,
                out.ptr_as(),
                len as u64,
                ws.ptr_as(),
                bytes,
                null_mut(),
            );
            assert_eq!(st, want, "{preset:?} hq {hq} hkv {hkv}");
            if want != KVE_OK {
                assert!(
                    out.download_as::<u32>(len) == canary,
                    "{preset:?}: out written"
                );
            }
        }
    }
}

// ------------------------------------------------------------------------- selection

fn select_params(alloc: AllocatorKind, gran: Granularity, budget: u64) -> kve_select_params {
    unsafe {
        let mut p = std::mem::zeroed::<kve_select_params>();
        assert_eq!(
            kve_select_params_init(
                &mut p,
                std::mem::size_of::<kve_select_params>() as u32,
                alloc as u32,
                gran as u32,
                budget
            ),
            KVE_OK
        );
        p
    }
}

/// Host selection as per-unit prefix lists (the window dropped).
fn host_select(
    p: &kve_select_params,
    scores: &[f32],
    layers: usize,
    hkv: usize,
    n: usize,
    w: usize,
) -> Vec<Vec<u32>> {
    let m = kve_model_scores {
        scores: scores.as_ptr(),
        len: scores.len() as u64,
        layers: layers as u64,
        hkv: hkv as u64,
        n: n as u64,
        window: w as u64,
    };
    let (st, off, idx) = host_select_call(p, &m);
    assert_eq!(st, KVE_OK);
    (0..layers * hkv)
        .map(|u| idx[off[u] as usize..off[u + 1] as usize].to_vec())
        .collect()
}

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

fn device_select(
    p: &kve_select_params,
    scores: &Buf,
    len: usize,
    layers: usize,
    hkv: usize,
    n: usize,
    w: usize,
) -> Vec<Vec<u32>> {
    let m = kve_model_scores {
        scores: scores.ptr_as(),
        len: len as u64,
        layers: layers as u64,
        hkv: hkv as u64,
        n: n as u64,
        window: w as u64,
    };
    let units = layers * hkv;
    let ld = n + 3;
    unsafe {
        let mut bytes = 0u64;
        assert_eq!(
            kve_cuda_select_model_workspace_size(
                p,
                layers as u64,
                hkv as u64,
                n as u64,
                w as u64,
                &mut bytes
            ),
            KVE_OK
        );
        let ws = Buf::new(bytes as usize);
        let counts = Buf::new(units * 4);
        let idx = Buf::new(units * ld * 4);
        let st = kve_cuda_select_model(
            p,
            &m,
            counts.ptr_as(),
            units as u64,
            idx.ptr_as(),
            ld as u64,
            (units * ld) as u64,
            ws.ptr_as(),
            bytes,
            null_mut(),
        );
        assert_eq!(st, KVE_OK, "device select");
        let c = counts.download_as::<i32>(units);
        let x = idx.download_as::<i32>(units * ld);
        (0..units)
            .map(|u| {
                x[u * ld..u * ld + c[u] as usize]
                    .iter()
                    .map(|&i| i as u32)
                    .collect()
            })
            .collect()
    }
}

#[test]
fn device_selection_equals_host_for_every_allocator_and_granularity() {
    if !have_device() {
        return;
    }
    let mut rng = Rng::new(77);
    let (layers, hkv, n, w) = (5, 3, 230, 30);
    let p = n - w;
    // non-negative scores of different scales per layer, with exact ties
    let mut scores = vec![0f32; layers * hkv * p];
    for (e, s) in scores.iter_mut().enumerate() {
        let l = e / (hkv * p);
        *s = rng.unif() * (1.0 + l as f32);
        if e % 17 == 0 {
            *s = 0.5;
        }
    }
    let d = Buf::bytes_of(&scores);
    let mut checked = 0;
    for alloc in [
        AllocatorKind::Uniform,
        AllocatorKind::Ada,
        AllocatorKind::Pyramid,
        AllocatorKind::Lava,
        AllocatorKind::Global,
    ] {
        for gran in [Granularity::Head, Granularity::Layer, Granularity::Token] {
            for budget in [0u64, 7, 40, 1000] {
                for (norm, pool, sinks) in [
                    (Normalize::LayerSum, Pool::NONE, 0),
                    (Normalize::None, Pool::NONE, 2),
                    (Normalize::LayerSum, Pool::forward(8, 0.9), 0),
                    (Normalize::LayerSum, Pool::forward(9, 1.0), 1),
                    (Normalize::LayerSum, Pool::max(3), 0),
                    (Normalize::None, Pool::avg(5), 5),
                    (Normalize::LayerSum, Pool::forward(3, 0.5), u32::MAX),
                ] {
                    let mut sp = select_params(alloc, gran, budget);
                    sp.normalize = norm as u32;
                    sp.post_pool_kind = pool.kind as u32;
                    sp.post_pool_kernel = pool.kernel;
                    sp.post_pool_decay = pool.decay;
                    sp.post_pool_sinks = sinks;
                    sp.alpha = 0.3;
                    let host = host_select(&sp, &scores, layers, hkv, n, w);
                    let devs = device_select(&sp, &d, scores.len(), layers, hkv, n, w);
                    assert_eq!(
                        devs, host,
                        "{alloc:?} {gran:?} budget {budget} {norm:?} {pool:?} sinks {sinks}"
                    );
                    checked += 1;
                }
            }
        }
    }
    // LaProx-span's selection, and a cache that is all window
    let sp = unsafe {
        let mut p = std::mem::zeroed::<kve_select_params>();
        kve_select_params_init_laprox_span(
            &mut p,
            std::mem::size_of::<kve_select_params>() as u32,
            20,
        );
        p
    };
    assert_eq!(
        device_select(&sp, &d, scores.len(), layers, hkv, n, w),
        host_select(&sp, &scores, layers, hkv, n, w)
    );
    // a cache that is all window: every list is the whole cache
    // (no prefix: the scores' length is 0, `layers * hkv * P`)
    let all_window = device_select(&sp, &d, 0, layers, hkv, 20, 30);
    assert_eq!(all_window, host_select(&sp, &[], layers, hkv, 20, 30));
    assert!(all_window
        .iter()
        .all(|l| *l == (0..20).collect::<Vec<u32>>()));
    println!("{checked} selections equal to the host's");
}

#[test]
fn device_select_rejects_bad_input_before_launching() {
    if !have_device() {
        return;
    }
    let (layers, hkv, n, w) = (2usize, 2usize, 50usize, 10usize);
    let p = n - w;
    let d = Buf::bytes_of(&vec![1f32; layers * hkv * p]);
    let sp = select_params(AllocatorKind::Lava, Granularity::Head, 5);
    let mut m = kve_model_scores {
        scores: d.ptr_as(),
        len: (layers * hkv * p) as u64,
        layers: layers as u64,
        hkv: hkv as u64,
        n: n as u64,
        window: w as u64,
    };
    unsafe {
        let mut bytes = 0u64;
        assert_eq!(
            kve_cuda_select_model_workspace_size(&sp, 2, 2, n as u64, w as u64, &mut bytes),
            KVE_OK
        );
        let ws = Buf::new(bytes as usize);
        let units = layers * hkv;
        let counts = Buf::new(units * 4);
        let idx = Buf::new(units * n * 4);
        let canary = vec![-7i32; units];
        let run = |m: &kve_model_scores, ld: u64, wsb: u64| {
            counts.upload_as(&canary);
            let st = kve_cuda_select_model(
                &sp,
                m,
                counts.ptr_as(),
                units as u64,
                idx.ptr_as(),
                ld,
                (units * n) as u64,
                ws.ptr_as(),
                wsb,
                null_mut(),
            );
            let untouched = counts.download_as::<i32>(units) == canary;
            (st, untouched)
        };
        assert_eq!(
            run(&m, n as u64, bytes - 1),
            (KVE_ERR_WORKSPACE_TOO_SMALL, true)
        );
        assert_eq!(
            run(&m, n as u64 - 1, bytes),
            (KVE_ERR_OUTPUT_TOO_SMALL, true)
        );
        m.len -= 1;
        assert_eq!(run(&m, n as u64, bytes), (KVE_ERR_SHAPE_MISMATCH, true));
        m.len += 1;
        m.layers = 0;
        assert_eq!(run(&m, n as u64, bytes), (KVE_ERR_INVALID_ARGUMENT, true));
        m.layers = 2;
        m.scores = null();
        assert_eq!(run(&m, n as u64, bytes), (KVE_ERR_NULL_POINTER, true));
        m.scores = d.ptr_as();
        // the kept lists over the scores
        let st = kve_cuda_select_model(
            &sp,
            &m,
            counts.ptr_as(),
            units as u64,
            d.ptr_as(),
            n as u64,
            (units * n) as u64,
            ws.ptr_as(),
            bytes,
            null_mut(),
        );
        assert_eq!(st, KVE_ERR_ALIASING);
        let (st, _) = run(&m, n as u64, bytes);
        assert_eq!(st, KVE_OK);
    }
}

/// Shapes past the select path's kernel limits (grid dimensions over layers or pooled
/// rows; a select group of 2^32 entries or more) are refused before any launch with
/// `KVE_ERR_INVALID_ARGUMENT`, not `KVE_ERR_CUDA` from a launcher. Found by reading the
/// launch chain against the launchers' checks (the fuzz target's arena is too small).
#[test]
fn device_select_rejects_shapes_beyond_the_kernels() {
    if !have_device() {
        return;
    }
    // (allocator, granularity, normalize, layers, hkv, n, window)
    let cases = [
        // layer_stats over 65536 layers
        (
            AllocatorKind::Lava,
            Granularity::Head,
            Normalize::None,
            65536,
            1,
            2,
            1,
        ),
        // the layer reduce over 65536 layers
        (
            AllocatorKind::Uniform,
            Granularity::Layer,
            Normalize::None,
            65536,
            1,
            2,
            1,
        ),
        // the safeguard's copy: a pool over 65536 rows
        (
            AllocatorKind::Ada,
            Granularity::Head,
            Normalize::None,
            4,
            16384,
            2,
            1,
        ),
        // one global group of 3·(2^31 - 1) entries
        (
            AllocatorKind::Global,
            Granularity::Head,
            Normalize::None,
            1,
            3,
            (1 << 31) - 1,
            0,
        ),
    ];
    let d = Buf::bytes_of(&vec![1f32; 64]);
    let small = Buf::new(1024);
    let counts = Buf::new(64);
    let idx = Buf::new(64);
    for (alloc, gran, norm, layers, hkv, n, w) in cases {
        let mut sp = select_params(alloc, gran, 1);
        sp.normalize = norm as u32;
        let (units, p) = (layers * hkv, n - w);
        // descriptors only: nothing is read or written once the shape is refused
        let m = kve_model_scores {
            scores: d.ptr_as(),
            len: units * p,
            layers,
            hkv,
            n,
            window: w,
        };
        unsafe {
            let st = kve_cuda_select_model(
                &sp,
                &m,
                counts.ptr_as(),
                units,
                idx.ptr_as(),
                n,
                u64::MAX,
                small.ptr_as(),
                1024,
                null_mut(),
            );
            assert_eq!(
                st, KVE_ERR_INVALID_ARGUMENT,
                "{alloc:?} {gran:?} {layers}x{hkv} n {n}"
            );
        }
    }
}

// ------------------------------------------------------------------- one shape check

/// Dimensions at and past every limit: the host and device size queries build the same
/// checked shape (`LayerShape::from_dims`, `ModelShape::new`), so they answer the same
/// status for each. They used to disagree (N > 2^31 was OVERFLOW on the host and
/// INVALID_ARGUMENT on the device; 0 heads, dk > 1024).
#[test]
fn host_and_device_size_queries_agree_on_bad_shapes() {
    let edges = [0u64, 1, 3, 1 << 20, (1 << 20) + 1, (1 << 31) - 1, 1 << 31];
    let edges = [&edges[..], &[(1 << 31) + 1, 1 << 32, u64::MAX]].concat();
    let sp = select_params(AllocatorKind::Ada, Granularity::Head, 8);
    let (mut checked, mut refused) = (0, 0);
    for &layers in &edges {
        for &hkv in &edges {
            for &n in &edges {
                // two prefix tokens: valid shapes need small workspaces on both sides
                let w = n.saturating_sub(2);
                let (mut a, mut b) = (0u64, 0u64);
                let (host, device) = unsafe {
                    (
                        kve_select_workspace_size(&sp, layers, hkv, n, w, &mut a),
                        kve_cuda_select_model_workspace_size(&sp, layers, hkv, n, w, &mut b),
                    )
                };
                assert_eq!(host, device, "select layers {layers} hkv {hkv} n {n}");
                let (mut o, mut i) = (0u64, 0u64);
                let lens = unsafe { kve_select_output_len(&sp, layers, hkv, n, w, &mut o, &mut i) };
                assert_eq!(
                    lens, host,
                    "output lengths, layers {layers} hkv {hkv} n {n}"
                );
                checked += 1;
                refused += (host != KVE_OK) as usize;
            }
        }
    }
    let heads = [0u64, 1, 2, 3, 65536, 65537, 1 << 32];
    let tokens = [0u64, 1, 1 << 31, (1 << 31) + 1, u64::MAX];
    let dims = [0u64, 1, 1024, 1025, u64::MAX];
    for preset in [Preset::SnapKv, Preset::LaProx, Preset::KNorm] {
        let p = score_params(|_| {}, preset);
        for &hq in &heads {
            for &hkv in &heads {
                for &n in &tokens {
                    for &dk in &dims {
                        for &dv in &dims {
                            let (mut a, mut b) = (0u64, 0u64);
                            let (host, device) = unsafe {
                                (
                                    kve_score_workspace_size(&p, hq, hkv, n, dk, dv, &mut a),
                                    kve_cuda_score_workspace_size(&p, hq, hkv, n, dk, dv, &mut b),
                                )
                            };
                            assert_eq!(
                                host, device,
                                "{preset:?} hq {hq} hkv {hkv} n {n} dk {dk} dv {dv}"
                            );
                            checked += 1;
                            refused += (host != KVE_OK) as usize;
                        }
                    }
                }
            }
        }
    }
    // a null out-parameter is refused first by both
    unsafe {
        assert_eq!(
            kve_cuda_select_model_workspace_size(&sp, 0, 0, 0, 0, null_mut()),
            kve_select_workspace_size(&sp, 0, 0, 0, 0, null_mut())
        );
    }
    println!("shape grid: {checked} shapes, {refused} refused, host == device for each");
    assert!(refused > checked / 2 && refused < checked);
}

// ------------------------------------------------------------- the requirements table

/// A change to a layer's input descriptors.
type Edit = dyn Fn(&mut kve_layer_inputs);

/// A small f32 layer (4 query heads, 2 KV heads, 80 tokens, dim 16) for status checks.
fn small_layer(seed: u64) -> Layer {
    layer(
        Dt::F32,
        Layout::HeadMajor,
        Layout::HeadMajor,
        4,
        2,
        80,
        16,
        seed,
    )
}

/// `kve_score_layer` and `kve_cuda_score_layer` on one layer's inputs changed by `edit`
/// (the same change to the host and the device descriptors): their two statuses.
fn host_and_device_status(l: &Layer, p: &kve_score_params, edit: &Edit) -> (i32, i32) {
    let d = l.k.ext[2] as u64;
    let (hq, hkv, n) = (l.hq as u64, l.hkv as u64, l.n as u64);
    let (mut hb, mut db) = (0u64, 0u64);
    unsafe {
        assert_eq!(
            kve_score_workspace_size(p, hq, hkv, n, d, d, &mut hb),
            KVE_OK
        );
        assert_eq!(
            kve_cuda_score_workspace_size(p, hq, hkv, n, d, d, &mut db),
            KVE_OK
        );
        let len = l.hkv * l.n;
        let mut hin = inputs(l, p, Vals::Gram, None, false);
        let mut din = inputs(l, p, Vals::Gram, None, true);
        edit(&mut hin);
        edit(&mut din);
        let mut out = vec![0f32; len];
        let mut ws = vec![0u8; hb as usize];
        let host = kve_score_layer(
            p,
            &hin,
            out.as_mut_ptr(),
            len as u64,
            ws.as_mut_ptr() as *mut c_void,
            hb,
        );
        let (dout, dws) = (Buf::new(len * 4), Buf::new(db as usize));
        let device = kve_cuda_score_layer(
            p,
            &din,
            dout.ptr_as(),
            len as u64,
            dws.ptr_as(),
            db,
            null_mut(),
        );
        (host, device)
    }
}

/// Each scorer's row of `kvevict::score::requirements` is what the host and the device
/// read: without an input the row names, both refuse with `KVE_ERR_NULL_POINTER`; without
/// one it does not name, both score. So the table, the host checks and the device checks
/// cannot drift apart unseen.
#[test]
fn requirements_table_is_what_host_and_device_read() {
    use kvevict::score::requirements::{requirements, ValueInput};
    if !have_device() {
        return;
    }
    let l = small_layer(11);
    let statuses = |p: &kve_score_params, edit: &Edit| host_and_device_status(&l, p, edit);
    let presets = [
        Preset::SnapKv,
        Preset::Lava,
        Preset::LaProx,
        Preset::CriticalKv,
        Preset::StreamingLlm,
        Preset::KNorm,
        Preset::Tova,
    ];
    let mut cases = 0;
    for preset in presets {
        let p = score_params(|_| {}, preset);
        let req = requirements(ScorerKind::from_u32(p.scorer).unwrap());
        let want = |needed: bool| if needed { KVE_ERR_NULL_POINTER } else { KVE_OK };
        let removals: [(&str, i32, &Edit); 5] = [
            ("nothing", KVE_OK, &|_| {}),
            ("queries", want(req.queries), &|i| {
                i.queries = kve_tensor::NONE
            }),
            ("values", want(req.values != ValueInput::None), &|i| {
                i.values = kve_tensor::NONE
            }),
            (
                "gram",
                want(req.values == ValueInput::ValuesOrForms),
                &|i| {
                    i.gram = null();
                    i.gram_len = 0;
                },
            ),
            ("value_l1", want(req.value_l1), &|i| {
                i.value_l1 = null();
                i.value_l1_len = 0;
            }),
        ];
        for (what, expected, edit) in removals {
            let (host, device) = statuses(&p, edit);
            assert_eq!(host, expected, "{preset:?} without {what}: host");
            assert_eq!(device, expected, "{preset:?} without {what}: device");
            cases += 1;
        }
    }
    println!("requirements: {cases} cases, host == device == the table for each");
}

/// The same bad descriptor gives the same status on the host and on the device: both
/// check tensors with one function (`Tensor::new` of the C layer) and shapes with the
/// same rules, so a caller's error handling does not depend on where it scores.
#[test]
fn host_and_device_refuse_bad_inputs_alike() {
    if !have_device() {
        return;
    }
    let l = small_layer(13);
    let lse = [0f32; 3];
    let lse_ptr = lse.as_ptr() as usize;
    let edits: [(&str, &Edit); 16] = [
        ("keys dtype", &|i| i.keys.dtype = 9),
        ("keys pad", &|i| i.keys.pad = 1),
        ("keys len", &|i| i.keys.len -= 1),
        ("keys misaligned", &|i| {
            i.keys.data = (i.keys.data as *const u8).wrapping_add(2) as *const c_void
        }),
        ("keys heads 0", &|i| i.keys.extent[0] = 0),
        ("keys tokens past 2^31", &|i| {
            i.keys.extent[1] = (1 << 31) + 1
        }),
        ("queries dim", &|i| i.queries.extent[2] -= 1),
        ("queries rows", &|i| i.queries.extent[1] = 1),
        ("queries heads", &|i| i.queries.extent[0] = 3),
        ("queries absent", &|i| i.queries = kve_tensor::NONE),
        ("values tokens", &|i| i.values.extent[1] -= 1),
        ("values heads", &|i| i.values.extent[0] = 1),
        ("reserved", &|i| i.reserved = 1),
        ("struct size", &|i| i.struct_size = 7),
        ("row_lse length", &move |i| {
            i.row_lse = lse_ptr as *const f32;
            i.row_lse_len = 3;
        }),
        ("value_l1 short", &|i| i.value_l1_len = 3),
    ];
    let mut cases = 0;
    for preset in [
        Preset::SnapKv,
        Preset::Lava,
        Preset::LaProx,
        Preset::CriticalKv,
        Preset::KNorm,
    ] {
        let p = score_params(|_| {}, preset);
        for (what, edit) in edits {
            let (host, device) = host_and_device_status(&l, &p, edit);
            assert_eq!(
                host, device,
                "{preset:?}, {what}: host {host}, device {device}"
            );
            cases += 1;
        }
    }
    println!("bad inputs: {cases} cases, the same status on host and device");
}

/// The same bad scores descriptor gives the same status to `kve_select_model` and
/// `kve_cuda_select_model` (one `ModelShape` check, the same length rule): every output
/// is sized by its own size queries, so only the descriptor differs from a valid call.
#[test]
fn host_and_device_select_refuse_bad_scores_alike() {
    type ScoresEdit = dyn Fn(&mut kve_model_scores);
    if !have_device() {
        return;
    }
    let (layers, hkv, n, w) = (2u64, 2u64, 40u64, 8u64);
    let len = (layers * hkv * (n - w)) as usize;
    let vals: Vec<f32> = (0..len).map(|i| ((i * 37) % 11) as f32).collect();
    let dscores = Buf::bytes_of(&vals);
    let statuses = |p: &kve_select_params, edit: &ScoresEdit| unsafe {
        let mut hm = kve_model_scores {
            scores: vals.as_ptr(),
            len: len as u64,
            layers,
            hkv,
            n,
            window: w,
        };
        let mut dm = kve_model_scores {
            scores: dscores.ptr_as(),
            ..hm
        };
        edit(&mut hm);
        edit(&mut dm);
        let host = host_select_call(p, &hm).0;
        // device outputs and workspace as its size query gives them for the edited shape
        let (l, h, nn, ww) = (dm.layers, dm.hkv, dm.n, dm.window);
        let mut db = 0u64;
        kve_cuda_select_model_workspace_size(p, l, h, nn, ww, &mut db);
        let units = (l * h).min(64) as usize;
        let ld = (nn as usize).clamp(1, 64);
        let (counts, idx) = (Buf::new(units * 4), Buf::new(units * ld * 4));
        let dws = Buf::new(db as usize);
        let device = kve_cuda_select_model(
            p,
            &dm,
            counts.ptr_as(),
            units as u64,
            idx.ptr_as(),
            ld as u64,
            (units * ld) as u64,
            dws.ptr_as(),
            db,
            null_mut(),
        );
        (host, device)
    };
    let edits: [(&str, &ScoresEdit); 12] = [
        ("nothing", &|_| {}),
        ("scores null", &|m| m.scores = null()),
        ("scores misaligned", &|m| {
            m.scores = (m.scores as *const u8).wrapping_add(2) as *const f32
        }),
        ("len short", &|m| m.len -= 1),
        ("len 0", &|m| m.len = 0),
        ("layers 0", &|m| m.layers = 0),
        ("hkv 0", &|m| m.hkv = 0),
        ("n 0", &|m| m.n = 0),
        ("n past 2^31", &|m| m.n = (1 << 31) + 1),
        ("layers past 2^20", &|m| m.layers = (1 << 20) + 1),
        ("window past n", &|m| m.window = 1000),
        ("window 0", &|m| m.window = 0),
    ];
    let mut cases = 0;
    for (alloc, gran) in [
        (AllocatorKind::Uniform, Granularity::Head),
        (AllocatorKind::Ada, Granularity::Head),
        (AllocatorKind::Global, Granularity::Layer),
    ] {
        let p = select_params(alloc, gran, 8);
        for (what, edit) in edits {
            let (host, device) = statuses(&p, edit);
            assert_eq!(
                host, device,
                "{alloc:?} {gran:?}, {what}: host {host}, device {device}"
            );
            // (window past n leaves P = 0: the exact-length contract then wants len 0)
            let valid = matches!(what, "nothing");
            assert_eq!(
                host == KVE_OK,
                valid,
                "{alloc:?} {gran:?}, {what}: status {host}"
            );
            cases += 1;
        }
    }
    println!("bad scores: {cases} cases, the same status on host and device");
}

// ------------------------------------------------- batched in-place compaction --

/// One tensor of a compaction batch: its device copy, host copy and list rows.
struct Compacted {
    t: Tensor,
    /// First list row (unit) of the tensor's heads; `None`: one shared list (kept_ld 0).
    unit: Option<usize>,
}

/// The host C API's compaction of `t` with the lists `lists[unit ..]` (or `shared`).
fn host_compacted(c: &Compacted, lists: &[Vec<u32>], shared: &[u32]) -> Vec<u8> {
    let mut bytes = c.t.bytes.clone();
    let heads = c.t.ext[0];
    let (mut off, mut idx) = (vec![0u64], Vec::new());
    for h in 0..heads {
        let l: &[u32] = match c.unit {
            Some(u) => &lists[u + h],
            None => shared,
        };
        idx.extend_from_slice(l);
        off.push(idx.len() as u64);
    }
    let mut d = c.t.desc(false);
    d.data = bytes.as_mut_ptr() as *const c_void;
    let st = unsafe {
        kve_compact_in_place(
            &d,
            off.as_ptr(),
            off.len() as u64,
            idx.as_ptr(),
            idx.len() as u64,
            null_mut(),
            0,
        )
    };
    assert_eq!(st, KVE_OK, "host compaction");
    bytes
}

/// `kve_cuda_compact_batch_in_place` over 37 tensors (two launch pairs), every dtype and
/// layout, K and V of a layer sharing lists and one tensor with a list shared by its heads,
/// equals the host C API's compaction of each tensor; refused calls write nothing.
#[test]
fn compact_batch_in_place_matches_host_compaction() {
    if !have_device() {
        return;
    }
    let (hkv, n, d, layers) = (3usize, 61usize, 8usize, 18usize);
    let mut rng = Rng::new(77);
    let ld = n + 5;
    let units = layers * hkv;
    let mut lists: Vec<Vec<u32>> = Vec::new();
    for u in 0..units {
        // some heads keep everything, one nothing, the rest a random ascending subset
        let keep = match u % 7 {
            0 => n,
            3 => 0,
            _ => 1 + rng.below(n - 1),
        };
        let mut all: Vec<u32> = (0..n as u32).collect();
        for i in 0..n {
            let j = i + rng.below(n - i);
            all.swap(i, j);
        }
        let mut l = all[..keep].to_vec();
        l.sort_unstable();
        lists.push(l);
    }
    let shared: Vec<u32> = (0..n as u32).filter(|i| i % 3 != 1).collect();
    let mut idx = vec![-1i32; units * ld];
    let mut counts = vec![0i32; units];
    for (u, l) in lists.iter().enumerate() {
        counts[u] = l.len() as i32;
        for (t, &i) in l.iter().enumerate() {
            idx[u * ld + t] = i as i32;
        }
    }
    let didx = Buf::bytes_of(&idx);
    let dcounts = Buf::bytes_of(&counts);
    let dshared = Buf::bytes_of(&shared.iter().map(|&i| i as i32).collect::<Vec<_>>());
    let dshared_count = Buf::bytes_of(&[shared.len() as i32]);
    let dts = [Dt::F16, Dt::Bf16, Dt::F32];
    let lays = [Layout::HeadMajor, Layout::TokenRows, Layout::Transposed];
    let mut ts = Vec::new();
    for l in 0..layers {
        for kv in 0..2 {
            let (dt, lay) = (dts[(l + kv) % 3], lays[(l + 2 * kv) % 3]);
            let t = Tensor::new(dt, lay, [hkv, n, d], &mut rng, 1.0);
            ts.push(Compacted {
                t,
                unit: Some(l * hkv),
            });
        }
    }
    // llama.cpp token rows viewed as one head of width hkv*d, one shared list
    ts.push(Compacted {
        t: Tensor::new(Dt::Bf16, Layout::HeadMajor, [1, n, hkv * d], &mut rng, 1.0),
        unit: None,
    });
    let item = |c: &Compacted| kve_compact_item {
        kv: c.t.desc(true),
        kept: match c.unit {
            Some(u) => unsafe { didx.ptr_as::<i32>().add(u * ld) },
            None => dshared.ptr_as(),
        },
        kept_ld: if c.unit.is_some() { ld as u64 } else { 0 },
        counts: match c.unit {
            Some(u) => unsafe { dcounts.ptr_as::<i32>().add(u) },
            None => dshared_count.ptr_as(),
        },
    };
    let items: Vec<kve_compact_item> = ts.iter().map(item).collect();
    assert!(items.len() > 32, "two launch pairs");
    let max_keep = n as u64;
    let mut bytes = 0u64;
    unsafe {
        assert_eq!(
            kve_cuda_compact_batch_in_place_workspace_size(
                items.as_ptr(),
                items.len() as u64,
                max_keep,
                &mut bytes
            ),
            KVE_OK
        );
    }
    assert!(bytes > 0);
    let ws = Buf::new(bytes as usize + 512);
    let call = |its: &[kve_compact_item], ws: *mut c_void, wsb: u64| unsafe {
        kve_cuda_compact_batch_in_place(
            its.as_ptr(),
            its.len() as u64,
            max_keep,
            ws,
            wsb,
            null_mut(),
        )
    };
    let untouched = |what: &str| {
        for c in &ts {
            assert!(
                c.t.dev.download_as::<u8>(c.t.bytes.len()) == c.t.bytes,
                "{what}: a tensor was written"
            );
        }
    };
    // refusals first: nothing may move
    let wsp = ws.ptr_as::<c_void>();
    let mut bad = items.clone();
    bad[33].kv.dtype = 9;
    assert_eq!(call(&bad, wsp, bytes), KVE_ERR_BAD_ENUM);
    let mut bad = items.clone();
    bad[35].kept = null();
    assert_eq!(call(&bad, wsp, bytes), KVE_ERR_NULL_POINTER);
    let mut bad = items.clone();
    bad[34].kept = unsafe { (bad[34].kept as *const u8).add(2) as *const i32 };
    assert_eq!(call(&bad, wsp, bytes), KVE_ERR_MISALIGNED);
    let mut bad = items.clone();
    bad[34].kept_ld = (n - 1) as u64; // below min(max_keep, N)
    assert_eq!(call(&bad, wsp, bytes), KVE_ERR_INVALID_ARGUMENT);
    let mut bad = items.clone();
    bad[36] = bad[2]; // the same tensor twice
    assert_eq!(call(&bad, wsp, bytes), KVE_ERR_ALIASING);
    let mut bad = items.clone();
    bad[30].kept = bad[1].kv.data as *const i32; // a list inside another tensor
    assert_eq!(call(&bad, wsp, bytes), KVE_ERR_ALIASING);
    assert_eq!(
        call(&items, items[5].kv.data as *mut c_void, bytes),
        KVE_ERR_ALIASING
    );
    assert_eq!(call(&items, wsp, bytes - 1), KVE_ERR_WORKSPACE_TOO_SMALL);
    assert_eq!(
        call(
            &items,
            unsafe { (wsp as *mut u8).add(16) } as *mut c_void,
            bytes
        ),
        KVE_ERR_MISALIGNED
    );
    assert_eq!(
        call(&vec![items[0]; 1025], wsp, bytes),
        KVE_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { kve_cuda_compact_batch_in_place(null(), 3, max_keep, wsp, bytes, null_mut()) },
        KVE_ERR_NULL_POINTER
    );
    untouched("refused call");
    assert_eq!(call(&[], null_mut(), 0), KVE_OK);
    assert_eq!(call(&items, wsp, bytes), KVE_OK);
    for (i, c) in ts.iter().enumerate() {
        let want = host_compacted(c, &lists, &shared);
        let got = c.t.dev.download_as::<u8>(c.t.bytes.len());
        assert!(
            got == want,
            "tensor {i} ({:?} {:?}) differs from the host",
            c.t.dt,
            c.t.stride
        );
    }
}

// ----------------------------------------------------- the Gram split per model --

/// The Gram of `l` split once (`kve_cuda_prepare_gram`), on the device.
fn prepared_gram(l: &Layer, p: &kve_score_params, with_lo: u32) -> (Buf, u64) {
    let c = (p.laprox_gqa != LaproxGqa::Sum as u32) as usize;
    let dtype = l.v.dt.code() as u32;
    let mut bytes = 0u64;
    unsafe {
        let len = l.gram[c].len() as u64;
        assert_eq!(
            kve_cuda_prepare_gram_size(len, dtype, with_lo, &mut bytes),
            KVE_OK
        );
        let b = Buf::new(bytes as usize);
        let st = kve_cuda_prepare_gram(
            l.dgram[c].ptr_as(),
            len,
            dtype,
            with_lo,
            b.ptr_as(),
            bytes,
            null_mut(),
        );
        assert_eq!(st, KVE_OK, "prepare gram");
        (b, bytes)
    }
}

/// `kve_cuda_score_layer_prepared`'s status and `out` (canary-filled before the call).
fn prepared_scores(
    l: &Layer,
    p: &kve_score_params,
    inp: &kve_layer_inputs,
    split: (*const c_void, u64),
    with_lo: u32,
) -> (i32, Vec<f32>) {
    device_call(l, p, |out, len, ws, bytes| unsafe {
        kve_cuda_score_layer_prepared(
            p,
            inp,
            split.0,
            split.1,
            with_lo,
            out,
            len,
            ws,
            bytes,
            null_mut(),
        )
    })
}

/// LaProx with the Gram split once per model equals the call that re-splits it on every
/// call, bit for bit (with the lo half; f32: always); without the lo half (16-bit values)
/// the value term sees G to 8 / 11 bits: other scores, near the host's. Refusals write
/// nothing.
#[test]
fn prepared_gram_scores_equal_the_recomputed_split() {
    if !have_device() {
        return;
    }
    let cases = SCORE_CASES;
    let laprox: Vec<_> = configs()
        .into_iter()
        .filter(|(_, p)| p.scorer == ScorerKind::LaProx as u32)
        .collect();
    for (ci, &(dt, kl, vl, hq, hkv, n, d)) in cases.iter().enumerate() {
        let l = layer(dt, kl, vl, hq, hkv, n, d, ci as u64 + 40);
        for (name, p) in &laprox {
            let what = format!("{name} {dt:?} hq={hq} hkv={hkv} n={n} d={d}");
            let old = device_scores(&l, p, Vals::Gram, None);
            let mut inp = inputs(&l, p, Vals::Gram, None, true);
            inp.gram = null();
            inp.gram_len = 0;
            let (s1, b1) = prepared_gram(&l, p, 1);
            let (st, with_lo) = prepared_scores(&l, p, &inp, (s1.ptr_as(), b1), 1);
            assert_eq!(st, KVE_OK, "{what}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(&with_lo) == bits(&old),
                "{what}: prepared (hi + lo) != re-split"
            );
            let (s0, b0) = prepared_gram(&l, p, 0);
            let (st, hi_only) = prepared_scores(&l, p, &inp, (s0.ptr_as(), b0), 0);
            assert_eq!(st, KVE_OK, "{what}");
            let host = host_scores(&l, p, Vals::Gram, None);
            let e = worst_rel(&hi_only, &host, hkv);
            if dt == Dt::F32 {
                assert!(bits(&hi_only) == bits(&old), "{what}: f32 has no lo half");
            } else {
                assert!(
                    bits(&hi_only) != bits(&old),
                    "{what}: the hi half alone changes nothing"
                );
                let tol = if dt == Dt::Bf16 { 2e-2 } else { 3e-3 };
                assert!(e <= tol, "{what}: hi only, worst relative difference {e:e}");
            }
            if dt != Dt::F32 && *name == "laprox" {
                println!("hi-only Gram, {dt:?} values: worst relative difference {e:.2e}");
            }
        }
    }
    // refusals: nothing written to `out`
    let l = layer(
        Dt::Bf16,
        Layout::HeadMajor,
        Layout::HeadMajor,
        4,
        2,
        90,
        32,
        9,
    );
    let p = &laprox[0].1;
    let (s1, b1) = prepared_gram(&l, p, 1);
    let base = {
        let mut i = inputs(&l, p, Vals::Gram, None, true);
        i.gram = null();
        i.gram_len = 0;
        i
    };
    let sp = (s1.ptr_as::<c_void>() as *const c_void, b1);
    let canary = |r: (i32, Vec<f32>), want: i32, what: &str| {
        assert_eq!(r.0, want, "{what}");
        assert!(r.1.iter().all(|&x| x == -7.5), "{what}: out written");
    };
    canary(
        prepared_scores(&l, p, &inputs(&l, p, Vals::Gram, None, true), sp, 1),
        KVE_ERR_INVALID_ARGUMENT,
        "gram and split",
    );
    let mut f = inputs(&l, p, Vals::Forms, None, true);
    f.values = base.values;
    canary(
        prepared_scores(&l, p, &f, sp, 1),
        KVE_ERR_INVALID_ARGUMENT,
        "forms and split",
    );
    canary(
        prepared_scores(&l, p, &base, sp, 0),
        KVE_ERR_SHAPE_MISMATCH,
        "with_lo differs",
    );
    canary(
        prepared_scores(&l, p, &base, (sp.0, b1 - 2), 1),
        KVE_ERR_SHAPE_MISMATCH,
        "bytes",
    );
    canary(
        prepared_scores(&l, p, &base, sp, 2),
        KVE_ERR_INVALID_ARGUMENT,
        "with_lo 2",
    );
    canary(
        prepared_scores(&l, p, &base, (null(), b1), 1),
        KVE_ERR_NULL_POINTER,
        "NULL split",
    );
    let exact = score_params(|q| q.laprox_gqa = LaproxGqa::Exact as u32, Preset::LaProx);
    canary(
        prepared_scores(&l, &exact, &base, sp, 1),
        KVE_ERR_SHAPE_MISMATCH,
        "cross Gram",
    );
    unsafe {
        let mut b = 0u64;
        assert_eq!(
            kve_cuda_prepare_gram_size(10, 7, 1, &mut b),
            KVE_ERR_BAD_ENUM
        );
        assert_eq!(
            kve_cuda_prepare_gram_size(10, 1, 3, &mut b),
            KVE_ERR_INVALID_ARGUMENT
        );
        let len = l.gram[0].len() as u64;
        let g = l.dgram[0].ptr_as::<f32>();
        let before = s1.download_as::<u8>(b1 as usize);
        for (bytes, dst, want) in [
            (b1 - 1, s1.ptr_as::<u8>(), KVE_ERR_OUTPUT_TOO_SMALL),
            (b1, s1.ptr_as::<u8>().add(16), KVE_ERR_MISALIGNED),
            (b1, null_mut(), KVE_ERR_NULL_POINTER),
        ] {
            let st = kve_cuda_prepare_gram(g, len, 2, 1, dst as *mut c_void, bytes, null_mut());
            assert_eq!(st, want);
        }
        assert!(
            s1.download_as::<u8>(b1 as usize) == before,
            "refused split wrote"
        );
    }
}
