//! The optional per-row log-sum-exp input (`LayerInputs::row_lse`, `kve_layer_inputs.row_lse`):
//! scores with the LSE of `window_row_lse` equal the two-pass scores, the helper matches an
//! f64 reference, and a wrong-length or non-finite LSE is rejected with `out` untouched.

use half::f16;
use kvevict::capi::*;
use kvevict::*;
use std::ffi::c_void;

mod capi_common;
mod reference;
use reference::Rng;

const CANARY: u32 = 0xA5A5_A5A5;

/// One layer's inputs, f32 or rounded to f16 (views over either).
struct Case {
    hq: usize,
    hkv: usize,
    n: usize,
    d: usize,
    wq: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    q16: Vec<f16>,
    k16: Vec<f16>,
    v16: Vec<f16>,
    gram: Vec<f32>,
    forms: Vec<f32>,
    forms16: Vec<f32>,
}

fn case(hq: usize, hkv: usize, n: usize, d: usize, wq: usize, seed: u64) -> Case {
    let mut r = Rng::new(seed);
    // keys with a shared direction and queries scaled so the logits spread over a few units
    let mean = r.uniforms(d, 1.0);
    let mut k = r.uniforms(hkv * n * d, 1.5);
    for (i, x) in k.iter_mut().enumerate() {
        *x += mean[i % d];
    }
    let q = r.uniforms(hq * wq * d, 2.5);
    let v = r.uniforms(hkv * n * d, 1.0);
    let dm = hq * d;
    let wo = r.uniforms(hq * d * dm, 1.0 / (dm as f32).sqrt());
    let wov = View::f32_contiguous(&wo, [hq, d, dm]).unwrap();
    let mut gram = vec![0f32; gram_len(hq, hkv, d, false).unwrap()];
    let mut ws = vec![0u8; gram_workspace_size(d, dm).unwrap()];
    compute_gram(&wov, hkv, false, &mut gram, &mut ws).unwrap();
    let to16 = |x: &[f32]| x.iter().map(|&y| f16::from_f32(y)).collect::<Vec<_>>();
    let (q16, k16, v16) = (to16(&q), to16(&k), to16(&v));
    let mut forms = vec![0f32; value_forms_len(hq, hkv, n, false).unwrap()];
    let vv = View::f32_contiguous(&v, [hkv, n, d]).unwrap();
    compute_value_forms(&vv, &gram, hq, false, 0, n, &mut forms).unwrap();
    let mut forms16 = forms.clone();
    let vv16 = View::f16(&v16, [hkv, n, d], [n * d, d, 1]).unwrap();
    compute_value_forms(&vv16, &gram, hq, false, 0, n, &mut forms16).unwrap();
    Case {
        hq,
        hkv,
        n,
        d,
        wq,
        q,
        k,
        v,
        q16,
        k16,
        v16,
        gram,
        forms,
        forms16,
    }
}

impl Case {
    fn views(&self, f16: bool) -> (View<'_>, View<'_>, View<'_>) {
        let (hq, hkv, n, d, wq) = (self.hq, self.hkv, self.n, self.d, self.wq);
        let st = |t: usize| [t * d, d, 1];
        if f16 {
            (
                View::f16(&self.q16, [hq, wq, d], st(wq)).unwrap(),
                View::f16(&self.k16, [hkv, n, d], st(n)).unwrap(),
                View::f16(&self.v16, [hkv, n, d], st(n)).unwrap(),
            )
        } else {
            (
                View::f32(&self.q, [hq, wq, d], st(wq)).unwrap(),
                View::f32(&self.k, [hkv, n, d], st(n)).unwrap(),
                View::f32(&self.v, [hkv, n, d], st(n)).unwrap(),
            )
        }
    }
}

fn lse_of(q: &View, k: &View, window: u32) -> Vec<f32> {
    let [hq, _, _] = q.extent();
    let [hkv, n, dk] = k.extent();
    let shape = LayerShape {
        hq,
        hkv,
        n,
        dk,
        dv: dk,
    };
    let w = (window as usize).min(n);
    let mut ws = vec![0u8; window_row_lse_workspace_size(&shape, window).unwrap()];
    let mut out = vec![f32::from_bits(CANARY); hq * w + 3];
    window_row_lse(q, k, window, &mut out, &mut ws).unwrap();
    // only Hq·w floats are written
    assert!(out[hq * w..].iter().all(|x| x.to_bits() == CANARY));
    out.truncate(hq * w);
    out
}

fn run(cfg: &ScoreConfig, inputs: &LayerInputs) -> Result<Vec<f32>> {
    let shape = layer_shape(cfg, inputs)?;
    let mut ws = vec![0u8; score_workspace_size(cfg, &shape)?];
    let mut out = vec![0f32; score_len(cfg, &shape)?];
    score_layer(cfg, inputs, &mut out, &mut ws)?;
    Ok(out)
}

/// Largest |a - b| / |b| over the scores (|b| floored at 1e-30).
fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).abs() / (y as f64).abs().max(1e-30))
        .fold(0.0, f64::max)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Values {
    None,
    Gram,
    Forms,
}

fn scorers() -> Vec<(&'static str, ScoreConfig, Values)> {
    let cached = ScoreConfig::preset(Preset::LaProx);
    vec![
        ("snapkv", ScoreConfig::preset(Preset::SnapKv), Values::None),
        (
            "snapkv-kvpress",
            ScoreConfig::preset(Preset::SnapKvKvpress),
            Values::None,
        ),
        ("lava", ScoreConfig::preset(Preset::Lava), Values::None),
        ("laprox", ScoreConfig::preset(Preset::LaProx), Values::Gram),
        ("laprox-cached", cached, Values::Forms),
        ("tova", ScoreConfig::preset(Preset::Tova), Values::None),
    ]
}

fn inputs<'a>(c: &'a Case, f16: bool, vals: Values, lse: Option<&'a [f32]>) -> LayerInputs<'a> {
    let (q, k, v) = c.views(f16);
    LayerInputs {
        queries: Some(q),
        keys: Some(k),
        values: if vals == Values::Forms { None } else { Some(v) },
        gram: if vals == Values::Gram {
            Some(&c.gram)
        } else {
            None
        },
        value_forms: if vals == Values::Forms {
            Some(if f16 { &c.forms16 } else { &c.forms })
        } else {
            None
        },
        value_l1: None,
        row_lse: lse,
    }
}

#[test]
fn scores_with_lse_equal_two_pass() {
    // GQA g=4 with N not a multiple of the key chunk, and MHA with an odd head dim
    for (i, c) in [
        case(8, 2, 333, 64, 64, 7),
        case(3, 3, 150, 36, 70, 11),
        case(4, 1, 40, 16, 64, 5), // a short prefix (and none at window 64)
    ]
    .iter()
    .enumerate()
    {
        for f16 in [false, true] {
            for (name, cfg, vals) in scorers() {
                let (q, k, _) = c.views(f16);
                let lse = lse_of(&q, &k, cfg.window);
                let base = run(&cfg, &inputs(c, f16, vals, None)).unwrap();
                let with = run(&cfg, &inputs(c, f16, vals, Some(&lse))).unwrap();
                let e = max_rel(&with, &base);
                assert!(
                    e <= 1e-6,
                    "case {i} f16={f16} {name}: max rel diff {e:.2e} with row_lse"
                );
            }
        }
    }
}

#[test]
fn window_row_lse_matches_f64_reference() {
    for (c, window) in [
        (case(8, 2, 333, 64, 64, 3), 1u32),
        (case(8, 2, 333, 64, 64, 3), 32),
        (case(8, 2, 333, 64, 64, 3), 64),
        (case(4, 1, 40, 24, 64, 3), 1000), // every row of the cache is a window row
    ] {
        for f16 in [false, true] {
            let (q, k, _) = c.views(f16);
            {
                let lse = lse_of(&q, &k, window);
                let (n, d, wq) = (c.n, c.d, c.wq);
                let w = (window as usize).min(n);
                let g = c.hq / c.hkv;
                let scale = 1.0 / (d as f64).sqrt();
                for h in 0..c.hq {
                    for j in 0..w {
                        let row = wq - w + j;
                        let z: Vec<f64> = (0..=n - w + j)
                            .map(|i| {
                                (0..d)
                                    .map(|e| q.get(h, row, e) as f64 * k.get(h / g, i, e) as f64)
                                    .sum::<f64>()
                                    * scale
                            })
                            .collect();
                        let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let want = m + z.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
                        let got = lse[h * w + j] as f64;
                        assert!(
                            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                            "f16={f16} window={window} h={h} j={j}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn bad_lse_is_rejected_before_writing() {
    let c = case(8, 2, 200, 32, 64, 9);
    for f16 in [false, true] {
        for (name, cfg, vals) in scorers() {
            let (q, k, _) = c.views(f16);
            let lse = lse_of(&q, &k, cfg.window);
            let shape = layer_shape(&cfg, &inputs(&c, f16, vals, None)).unwrap();
            let mut ws = vec![0u8; score_workspace_size(&cfg, &shape).unwrap()];
            let len = score_len(&cfg, &shape).unwrap();
            let mut bad: Vec<(Vec<f32>, Error)> = vec![
                (lse[..lse.len() - 1].to_vec(), Error::ShapeMismatch),
                ([&lse[..], &[0.0]].concat(), Error::ShapeMismatch),
                (Vec::new(), Error::ShapeMismatch),
            ];
            for x in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut l = lse.clone();
                l[lse.len() / 2] = x;
                bad.push((l, Error::NonFinite));
            }
            for (l, want) in &bad {
                let mut out = vec![f32::from_bits(CANARY); len];
                let got = score_layer(&cfg, &inputs(&c, f16, vals, Some(l)), &mut out, &mut ws);
                assert_eq!(got, Err(*want), "{name} f16={f16} len {}", l.len());
                assert!(
                    out.iter().all(|x| x.to_bits() == CANARY),
                    "{name}: out written"
                );
            }
        }
    }
}

/// `score_layer` with `row_lse` refuses `q`, `k` (one holds a NaN/Inf) with `NonFinite`,
/// its output untouched.
fn refused_non_finite(cfg: &ScoreConfig, q: View, k: View, lse: &[f32], which: &str) {
    let inp = LayerInputs {
        queries: Some(q),
        keys: Some(k),
        row_lse: Some(lse),
        ..Default::default()
    };
    let shape = layer_shape(cfg, &inp).unwrap();
    let mut ws = vec![0u8; score_workspace_size(cfg, &shape).unwrap()];
    let mut out = vec![f32::from_bits(CANARY); score_len(cfg, &shape).unwrap()];
    let got = score_layer(cfg, &inp, &mut out, &mut ws);
    assert_eq!(got, Err(Error::NonFinite), "{which}");
    assert!(out.iter().all(|x| x.to_bits() == CANARY), "{which}");
}

#[test]
fn nonfinite_keys_and_queries_still_rejected_with_lse() {
    // pass 1 is skipped: the finiteness checks it made must still run, window keys included
    let c = case(8, 2, 200, 32, 40, 13);
    let cfg = ScoreConfig::preset(Preset::SnapKv);
    let (q, k, _) = c.views(false);
    let lse = lse_of(&q, &k, cfg.window);
    for (which, idx, bad, f16) in [
        ("key prefix", 5 * 32 + 3, f32::NAN, false),
        ("key window", (200 + 190) * 32 + 1, f32::NAN, false),
        ("f16 key prefix", 5 * 32 + 3, f32::INFINITY, true),
        ("f16 key window", (200 + 190) * 32 + 31, f32::NAN, true),
        ("f16 key -inf", 7, f32::NEG_INFINITY, true),
    ] {
        let mut kk = c.k.clone();
        kk[idx] = bad;
        let kk16: Vec<f16> = kk.iter().map(|&x| f16::from_f32(x)).collect();
        let kv = if f16 {
            View::f16(&kk16, [2, 200, 32], [200 * 32, 32, 1]).unwrap()
        } else {
            View::f32_contiguous(&kk, [2, 200, 32]).unwrap()
        };
        refused_non_finite(&cfg, q, kv, &lse, which);
    }
    let mut qq = c.q.clone();
    qq[7 * 40 * 32 + 39 * 32] = f32::INFINITY; // last head, last window row
    let qv = View::f32_contiguous(&qq, [8, 40, 32]).unwrap();
    refused_non_finite(&cfg, qv, k, &lse, "query");
    // and window_row_lse rejects them too, without writing
    let shape = LayerShape {
        hq: 8,
        hkv: 2,
        n: 200,
        dk: 32,
        dv: 32,
    };
    let mut ws = vec![0u8; window_row_lse_workspace_size(&shape, 32).unwrap()];
    let mut out = vec![f32::from_bits(CANARY); 8 * 32];
    assert_eq!(
        window_row_lse(&qv, &k, 32, &mut out, &mut ws),
        Err(Error::NonFinite)
    );
    assert!(out.iter().all(|x| x.to_bits() == CANARY));
    assert_eq!(
        window_row_lse(&q, &k, 32, &mut out[..8 * 32 - 1], &mut ws),
        Err(Error::OutputTooSmall)
    );
    assert_eq!(
        window_row_lse(&q, &k, 0, &mut out, &mut ws),
        Err(Error::InvalidArgument)
    );
}

#[test]
fn knorm_and_streaming_ignore_lse() {
    let c = case(8, 2, 100, 32, 40, 17);
    let (q, k, _) = c.views(true);
    for p in [Preset::KNorm, Preset::StreamingLlm] {
        let cfg = ScoreConfig::preset(p);
        let base = run(
            &cfg,
            &LayerInputs {
                keys: Some(k),
                ..Default::default()
            },
        )
        .unwrap();
        let junk = [f32::NAN; 3];
        let with = run(
            &cfg,
            &LayerInputs {
                queries: Some(q),
                keys: Some(k),
                row_lse: Some(&junk),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(base, with, "{p:?}");
    }
}

// ------------------------------------------------------------------------------- C ABI

fn tensor(p: *const f32, len: usize, e: [usize; 3]) -> kve_tensor {
    kve_tensor {
        data: p as *const c_void,
        len: len as u64,
        dtype: KVE_DTYPE_F32_CODE,
        pad: 0,
        extent: e.map(|x| x as u64),
        stride: [(e[1] * e[2]) as u64, e[2] as u64, 1],
    }
}

const KVE_DTYPE_F32_CODE: u32 = 0;

#[test]
fn capi_row_lse() {
    let c = case(8, 2, 300, 32, 40, 21);
    let (hq, hkv, n, d, wq) = (c.hq, c.hkv, c.n, c.d, c.wq);
    let qt = tensor(c.q.as_ptr(), c.q.len(), [hq, wq, d]);
    let kt = tensor(c.k.as_ptr(), c.k.len(), [hkv, n, d]);
    unsafe {
        let params: kve_score_params =
            capi_common::init_struct(|p, size| kve_score_params_init(p, size, 0));
        let w = params.window as usize;
        // the helper
        let lse = capi_common::window_row_lse(&qt, &kt, params.window);
        let (q, k, _) = c.views(false);
        assert_eq!(lse, lse_of(&q, &k, params.window));

        // scoring: V2 struct with row_lse, and a V1-sized struct without it
        let mut sz = 0u64;
        kve_score_workspace_size(
            &params, hq as u64, hkv as u64, n as u64, d as u64, d as u64, &mut sz,
        );
        let mut ws = vec![0u8; sz as usize];
        let p = n - w;
        let score = |inp: &kve_layer_inputs, ws: &mut Vec<u8>| -> (i32, Vec<f32>) {
            let mut out = vec![f32::from_bits(CANARY); hkv * p];
            let st = kve_score_layer(
                &params,
                inp,
                out.as_mut_ptr(),
                out.len() as u64,
                ws.as_mut_ptr() as *mut c_void,
                ws.len() as u64,
            );
            (st, out)
        };
        let mut v2: kve_layer_inputs =
            capi_common::init_struct(|p, size| kve_layer_inputs_init(p, size));
        assert_eq!(v2.struct_size, KVE_LAYER_INPUTS_V2_SIZE);
        assert!(v2.row_lse.is_null() && v2.row_lse_len == 0);
        v2.queries = qt;
        v2.keys = kt;
        let (st, base) = score(&v2, &mut ws);
        assert_eq!(st, KVE_OK);
        v2.row_lse = lse.as_ptr();
        v2.row_lse_len = lse.len() as u64;
        let (st, with) = score(&v2, &mut ws);
        assert_eq!(st, KVE_OK);
        assert!(max_rel(&with, &base) <= 1e-6);
        // wrong length / NaN: rejected, out untouched
        v2.row_lse_len -= 1;
        let (st, out) = score(&v2, &mut ws);
        assert_eq!(st, KVE_ERR_SHAPE_MISMATCH);
        assert!(out.iter().all(|x| x.to_bits() == CANARY));
        let mut nan = lse.clone();
        nan[0] = f32::NAN;
        v2.row_lse = nan.as_ptr();
        v2.row_lse_len = nan.len() as u64;
        let (st, out) = score(&v2, &mut ws);
        assert_eq!(st, KVE_ERR_NON_FINITE);
        assert!(out.iter().all(|x| x.to_bits() == CANARY));
        // NULL with a length is an error, not "absent"
        v2.row_lse = std::ptr::null();
        let (st, _) = score(&v2, &mut ws);
        assert_ne!(st, KVE_OK);

        // an older caller's struct (V1 size): bytes past it are never read, whatever they hold
        let mut old = std::mem::zeroed::<kve_layer_inputs>();
        assert_eq!(
            kve_layer_inputs_init(&mut old, KVE_LAYER_INPUTS_V1_SIZE),
            KVE_OK
        );
        assert_eq!(old.struct_size, KVE_LAYER_INPUTS_V1_SIZE);
        old.queries = qt;
        old.keys = kt;
        old.row_lse = nan.as_ptr();
        old.row_lse_len = 5;
        let (st, out) = score(&old, &mut ws);
        assert_eq!(st, KVE_OK);
        assert_eq!(out, base);
    }
}
