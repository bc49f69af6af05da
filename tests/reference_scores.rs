//! Every scorer of design §3 against the plain f64 reference (tests/reference), over random
//! shapes: GQA group sizes 1, 3, 4, 8, odd and chunk-boundary N, windows covering the whole
//! cache, pooling kernel 1, every dtype (f32, f16, bf16 — the reference reads the same
//! dtype-rounded values) and every layout (head-major `[Hkv,N,d]`, llama.cpp token rows
//! `[N, Hkv·d]`, transposed V `[Hkv·d, N]`; `Wo` as `x·Wo` rows or PyTorch `o_proj.weight`).
//!
//! Tolerance: |core − reference| <= TOL · max_i |reference[kh][i]| per KV head, TOL = 1e-4
//! (the core computes in f32 from the same rounded inputs, so one tolerance serves every
//! dtype). Rankings are checked separately by the selection tests on exact scores.

mod reference;

use kvevict::*;
use reference::harness::*;
use reference::{Layer, Rng, Scores, T3};

const TOL: f64 = 1e-4;

#[derive(Clone, Copy, Debug)]
struct Case {
    hkv: usize,
    g: usize,
    n: usize,
    w: usize,
    wq: usize,
    dk: usize,
    dv: usize,
    dm: usize,
    dtype: DType,
    klay: Layout,
    vlay: Layout,
    qlay: Layout,
    wolay: Layout,
}

const GROUPS: [usize; 4] = [1, 3, 4, 8];
const NS: [usize; 12] = [1, 2, 5, 31, 33, 63, 64, 65, 97, 129, 150, 201];

/// Case `i` of a sweep: dtype, K layout, V layout and group size cycle so that every
/// combination of dtype × layout and every group size appears in any 36 consecutive cases.
fn case(rng: &mut Rng, i: usize, window: Option<usize>) -> Case {
    let dtype = DTYPES[i % 3];
    let klay = LAYOUTS[(i / 3) % 3];
    let vlay = LAYOUTS[(i / 9) % 3];
    let g = GROUPS[i % 4];
    let hkv = if g == 8 {
        rng.range(1, 2)
    } else {
        rng.range(1, 3)
    };
    let n = if rng.coin(0.5) {
        rng.pick(&NS)
    } else {
        2 * rng.range(1, 110) + 1
    };
    let w = window.unwrap_or_else(|| rng.pick(&[1, 2, 7, 16, 32, 32, 32, 64]));
    let wq = w.min(n) + rng.range(0, 2);
    Case {
        hkv,
        g,
        n,
        w,
        wq,
        dk: rng.pick(&[4, 8, 12, 16, 32, 64]),
        dv: rng.pick(&[4, 8, 16, 24]),
        dm: rng.pick(&[8, 20, 48]),
        dtype,
        klay,
        vlay,
        qlay: rng.pick(&[Layout::HeadMajor, Layout::TokenMajor]),
        wolay: rng.pick(&[Layout::HeadMajor, Layout::TorchOProj]),
    }
}

/// Random layer data: peaked attention (queries ×1.5), a few loud keys, value rows whose
/// norms vary strongly between tokens.
fn layer(rng: &mut Rng, c: &Case) -> (Layer, CoreLayer) {
    let hq = c.hkv * c.g;
    let q = T3::normal(rng, hq, c.wq, c.dk, 1.5);
    let mut k = T3::normal(rng, c.hkv, c.n, c.dk, 1.0);
    for i in 0..c.n {
        let s = if rng.coin(0.1) { 2.5 } else { 1.0 };
        for h in 0..c.hkv {
            for d in 0..c.dk {
                let x = k.at(h, i, d) * s;
                k.set(h, i, d, x);
            }
        }
    }
    let v = T3::normal_rows_spread(rng, c.hkv, c.n, c.dv, 0.8);
    let wo = T3::normal(rng, hq, c.dv, c.dm, 1.0 / (c.dv as f64).sqrt());
    let (qs, qr) = Stored::new(&q, c.dtype, c.qlay);
    let (ks, kr) = Stored::new(&k, c.dtype, c.klay);
    let (vs, vr) = Stored::new(&v, c.dtype, c.vlay);
    let (ws, wr) = Stored::new(&wo, c.dtype, c.wolay);
    (
        Layer {
            q: Some(qr),
            k: kr,
            v: Some(vr),
            wo: Some(wr),
        },
        CoreLayer {
            q: Some(qs),
            k: ks,
            v: Some(vs),
            wo: Some(ws),
        },
    )
}

fn any_pool(rng: &mut Rng) -> Pool {
    match rng.range(0, 5) {
        0 => Pool::NONE,
        1 => Pool::avg(rng.pick(&[1, 3, 5, 7])),
        2 => Pool::max(rng.pick(&[1, 3, 7])),
        3 => Pool::forward(rng.pick(&[1, 2, 8]), rng.pick(&[0.9, 1.0, 0.5])),
        4 => Pool::avg(1),
        _ => Pool::max(1),
    }
}

/// Compare per KV head within TOL of the head's largest |reference| score.
fn compare(
    label: &str,
    core: &[f32],
    r: &[Vec<f64>],
    p: usize,
    skip: &dyn Fn(usize, usize) -> bool,
) {
    assert_eq!(core.len(), r.len() * p, "{label}: output length");
    for (kh, rs) in r.iter().enumerate() {
        let m = rs
            .iter()
            .enumerate()
            .filter(|&(i, _)| !skip(kh, i))
            .map(|(_, x)| x.abs())
            .fold(0.0, f64::max);
        for i in 0..p {
            if skip(kh, i) {
                continue;
            }
            let (a, b) = (core[kh * p + i] as f64, rs[i]);
            assert!(
                (a - b).abs() <= TOL * m,
                "{label}: head {kh} token {i}: core {a:e} reference {b:e} (head max {m:e})"
            );
        }
    }
}

/// Run one case through core and reference and compare.
fn check(cfg: &ScoreConfig, x: &Layer, cx: &CoreLayer, path: ValuePath, label: &str) {
    let core =
        core_score(cfg, cx, path).unwrap_or_else(|e| panic!("{label}: core rejected: {e:?}"));
    let r: Scores = reference::score_layer(cfg, x);
    let n = x.k.b;
    let p = n - (cfg.window as usize).min(n);
    if cfg.scorer == ScorerKind::CriticalKv && p > 0 {
        check_critical(cfg, &core, &r, p, label);
        return;
    }
    compare(label, &core, &r.s, p, &|_, _| false);
}

/// CriticalKV: the forced set (reported as f32::MAX) is the base score's top
/// `critical_first_stage`; a position may differ from the reference only where its base
/// score is within TOL of the cut (a near tie). The rest compare as usual.
fn check_critical(cfg: &ScoreConfig, core: &[f32], r: &Scores, p: usize, label: &str) {
    let k = (cfg.critical_first_stage as usize).min(p);
    for kh in 0..r.s.len() {
        let forced_core: Vec<bool> = (0..p).map(|i| core[kh * p + i] == f32::MAX).collect();
        assert_eq!(
            forced_core.iter().filter(|&&f| f).count(),
            k,
            "{label}: head {kh}: forced count"
        );
        let base = &r.base[kh];
        let m = base.iter().cloned().fold(0.0, f64::max);
        let mut sorted = base.clone();
        sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
        let cut = if k > 0 { sorted[k - 1] } else { f64::INFINITY };
        for i in 0..p {
            if forced_core[i] != r.forced[kh][i] {
                assert!(
                    (base[i] - cut).abs() <= TOL * m,
                    "{label}: head {kh} token {i}: forced {} but reference {} (base {:e}, cut {cut:e})",
                    forced_core[i],
                    r.forced[kh][i],
                    base[i]
                );
            }
        }
    }
    let skip = |kh: usize, i: usize| core[kh * p + i] == f32::MAX || r.forced[kh][i];
    compare(label, core, &r.s, p, &skip);
}

fn sweep(
    seed: u64,
    cases: usize,
    mut make: impl FnMut(&mut Rng, usize) -> (ScoreConfig, ValuePath),
) {
    let mut rng = Rng::new(seed);
    for i in 0..cases {
        let (cfg, path) = make(&mut rng, i);
        let window = if cfg.scorer == ScorerKind::Tova {
            Some(1)
        } else {
            Some(cfg.window as usize)
        };
        let c = case(&mut rng, i, window);
        let (x, cx) = layer(&mut rng, &c);
        let label = format!("case {i} {c:?} {cfg:?} {path:?}");
        check(&cfg, &x, &cx, path, &label);
    }
}

#[test]
fn snapkv_presets() {
    sweep(1, 72, |rng, i| {
        let mut cfg = ScoreConfig::preset(if i % 2 == 0 {
            Preset::SnapKv
        } else {
            Preset::SnapKvKvpress
        });
        if rng.coin(0.3) {
            cfg.window = rng.pick(&[1, 5, 16]);
        }
        (cfg, ValuePath::Gram)
    });
}

#[test]
fn snapkv_options() {
    sweep(2, 72, |rng, i| {
        let mut cfg = ScoreConfig::preset(Preset::SnapKv);
        cfg.pool = any_pool(rng);
        cfg.gqa = [GqaReduce::Mean, GqaReduce::Max, GqaReduce::Sum][i % 3];
        cfg.reduce_before_pool = rng.coin(0.5);
        cfg.window = rng.pick(&[1, 8, 32]);
        (cfg, ValuePath::Gram)
    });
}

#[test]
fn lava() {
    sweep(3, 72, |rng, _| {
        let mut cfg = ScoreConfig::preset(Preset::Lava);
        if rng.coin(0.5) {
            cfg.pool = any_pool(rng);
            cfg.window = rng.pick(&[1, 8, 32]);
        }
        // ignored by LAVa (always max after pooling): must not change anything
        cfg.gqa = rng.pick(&[GqaReduce::Mean, GqaReduce::Sum, GqaReduce::Max]);
        cfg.reduce_before_pool = rng.coin(0.5);
        (cfg, ValuePath::Gram)
    });
}

#[test]
fn laprox_every_mode() {
    let gqas = [LaproxGqa::Sum, LaproxGqa::Exact, LaproxGqa::MeanAttn];
    let places = [PoolPlacement::Attention, PoolPlacement::Product];
    sweep(4, 108, |rng, i| {
        let mut cfg = ScoreConfig::preset(if rng.coin(0.5) {
            Preset::LaProx
        } else {
            Preset::LaProxSpan
        });
        cfg.laprox_gqa = gqas[i % 3];
        cfg.placement = places[(i / 3) % 2];
        if rng.coin(0.5) {
            cfg.pool = any_pool(rng);
        }
        cfg.window = rng.pick(&[1, 8, 32, 32]);
        // the presets give 1 (laprox) and 3 (laprox-span); some cases square instead
        if i % 5 == 4 {
            cfg.power = 2;
        }
        let path = if (i / 6) % 2 == 0 {
            ValuePath::Gram
        } else {
            ValuePath::Forms
        };
        (cfg, path)
    });
}

#[test]
fn criticalkv() {
    sweep(5, 72, |rng, i| {
        let mut cfg = ScoreConfig::preset(Preset::CriticalKv);
        cfg.critical_first_stage = rng.pick(&[0, 1, 3, 10, 40, 1000]);
        // the forced tokens stay FLT_MAX under a power (saturation)
        cfg.power = [1, 3][i % 2];
        if rng.coin(0.4) {
            cfg.pool = any_pool(rng);
            cfg.gqa = rng.pick(&[GqaReduce::Mean, GqaReduce::Sum, GqaReduce::Max]);
            cfg.reduce_before_pool = rng.coin(0.5);
            cfg.window = rng.pick(&[1, 8, 32]);
        }
        (cfg, ValuePath::Gram)
    });
}

#[test]
fn baselines() {
    sweep(6, 108, |rng, i| {
        let mut cfg =
            ScoreConfig::preset([Preset::StreamingLlm, Preset::KNorm, Preset::Tova][i % 3]);
        if cfg.scorer == ScorerKind::StreamingLlm {
            cfg.sinks = rng.pick(&[0, 1, 4, 100]);
        }
        if cfg.scorer != ScorerKind::Tova && rng.coin(0.5) {
            cfg.window = rng.pick(&[1, 8, 32]);
        }
        // KNorm's negative scores keep their sign under an even power too
        cfg.power = [1, 2, 3, 5][(i / 3) % 4];
        (cfg, ValuePath::Gram)
    });
}

/// The question-agnostic uniqueness scorer (design §3b) over dtypes, layouts, windows; and
/// with planted twins (rows of the first quarter copied, with a little noise, to other
/// positions) so that the 4th similarity is near 1 for some tokens and the sharpened score
/// spans decades.
#[test]
fn uniqueness() {
    sweep(9, 48, |rng, i| {
        let mut cfg = ScoreConfig::preset(Preset::Uniqueness);
        if i % 3 == 1 {
            cfg.window = rng.pick(&[1, 32]);
        }
        (cfg, ValuePath::Gram)
    });
    let mut rng = Rng::new(10);
    for i in 0..24 {
        let cfg = ScoreConfig::preset(Preset::Uniqueness);
        let c = case(&mut rng, i, Some(8));
        let (mut x, _) = layer(&mut rng, &c);
        let v = x.v.as_mut().unwrap();
        // clusters of five (a row and 4 noisy copies): a token is redundant from its 4th twin
        for _ in 0..c.n / 6 * 4 {
            let (a, b) = (rng.range(0, c.n / 4), rng.range(0, c.n - 1));
            for h in 0..c.hkv {
                for d in 0..c.dk {
                    let e = x.k.at(h, a, d) * (1.0 + 0.01 * rng.normal());
                    x.k.set(h, b, d, e);
                }
                for d in 0..c.dv {
                    let e = v.at(h, a, d) * (1.0 + 0.01 * rng.normal());
                    v.set(h, b, d, e);
                }
            }
        }
        let cx = CoreLayer {
            q: None,
            k: Stored::new(&x.k, c.dtype, c.klay).0,
            v: Some(Stored::new(x.v.as_ref().unwrap(), c.dtype, c.vlay).0),
            wo: None,
        };
        let x = Layer {
            q: None,
            k: Stored::new(&x.k, c.dtype, c.klay).1,
            v: Some(Stored::new(x.v.as_ref().unwrap(), c.dtype, c.vlay).1),
            wo: None,
        };
        check(&cfg, &x, &cx, ValuePath::Gram, &format!("twins {i} {c:?}"));
    }
}

/// `value_l1` and the value forms of the Gram path against the explicit `v·Wo_h`.
#[test]
fn value_terms() {
    let mut rng = Rng::new(7);
    for i in 0..36 {
        let c = case(&mut rng, i, Some(8));
        let (x, cx) = layer(&mut rng, &c);
        let (v, wo) = (x.v.as_ref().unwrap(), x.wo.as_ref().unwrap());
        let hq = c.hkv * c.g;
        // L1
        let r = reference::value_l1(v, wo);
        let vv = cx.v.as_ref().unwrap().view();
        let wv = cx.wo.as_ref().unwrap().view();
        let mut out = vec![0f32; c.hkv * c.n];
        let mut ws = vec![0u8; kvevict::gram::value_l1_workspace_size(c.dv, c.dm).unwrap()];
        compute_value_l1(&vv, &wv, &mut out, &mut ws).unwrap();
        compare(&format!("value_l1 {c:?}"), &out, &r, c.n, &|_, _| false);
        // forms: diagonal ||v Wo_h||², cross (v Wo_a)·(v Wo_b), layout [Hkv][blocks][N]
        for cross in [false, true] {
            let gm = core_gram(cx.wo.as_ref().unwrap(), c.hkv, cross);
            let mut f = vec![0f32; value_forms_len(hq, c.hkv, c.n, cross).unwrap()];
            compute_value_forms(&vv, &gm, hq, cross, 0, c.n, &mut f).unwrap();
            let mut pairs = (0..c.g).map(|a| (a, a)).collect::<Vec<_>>();
            if cross {
                for a in 0..c.g {
                    for b in a + 1..c.g {
                        pairs.push((a, b));
                    }
                }
            }
            for kh in 0..c.hkv {
                let rows: Vec<Vec<f64>> = pairs
                    .iter()
                    .map(|&(a, b)| {
                        (0..c.n)
                            .map(|t| {
                                let ya = reference::value_out(v, wo, kh, kh * c.g + a, t);
                                let yb = reference::value_out(v, wo, kh, kh * c.g + b, t);
                                ya.iter().zip(&yb).map(|(p, q)| p * q).sum()
                            })
                            .collect()
                    })
                    .collect();
                let nb = pairs.len();
                // tolerance per block row relative to the diagonal scale of the group
                let scale = rows[..c.g].iter().flatten().cloned().fold(0.0, f64::max);
                for (k, row) in rows.iter().enumerate() {
                    for t in 0..c.n {
                        let a = f[(kh * nb + k) * c.n + t] as f64;
                        assert!(
                            (a - row[t]).abs() <= TOL * scale,
                            "forms {c:?} cross {cross} head {kh} block {k} token {t}: {a:e} vs {:e}",
                            row[t]
                        );
                    }
                }
            }
        }
    }
}

/// `w >= N`: nothing to evict. The score output is empty, nothing is written, and the
/// selection keeps every position.
#[test]
fn window_covers_cache() {
    let mut rng = Rng::new(8);
    let presets = [
        Preset::SnapKv,
        Preset::SnapKvKvpress,
        Preset::Lava,
        Preset::LaProx,
        Preset::LaProxSpan,
        Preset::CriticalKv,
        Preset::StreamingLlm,
        Preset::KNorm,
    ];
    for (i, &pr) in presets.iter().enumerate() {
        for extra in [0usize, 1, 20] {
            let mut cfg = ScoreConfig::preset(pr);
            let mut c = case(&mut rng, i, None);
            c.n = rng.range(1, 40);
            c.w = c.n + extra;
            c.wq = c.n;
            cfg.window = c.w as u32;
            let (_, cx) = layer(&mut rng, &c);
            let out = core_score(&cfg, &cx, ValuePath::Gram).unwrap();
            assert!(out.is_empty(), "{pr:?}: score output not empty");
            // and the real call leaves a canary buffer alone
            let inputs = LayerInputs {
                queries: cx.q.as_ref().map(|s| s.view()),
                keys: Some(cx.k.view()),
                values: cx.v.as_ref().map(|s| s.view()),
                gram: Some(&core_gram(cx.wo.as_ref().unwrap(), c.hkv, false)),
                value_l1: Some(&vec![1.0; c.hkv * c.n]),
                value_forms: None,
                row_lse: None,
            };
            let shape = layer_shape(&cfg, &inputs).unwrap();
            assert_eq!(score_len(&cfg, &shape).unwrap(), 0);
            let mut ws = vec![0u8; score_workspace_size(&cfg, &shape).unwrap()];
            let mut canary = vec![-7.5f32; 4];
            score_layer(&cfg, &inputs, &mut canary, &mut ws).unwrap();
            assert!(
                canary.iter().all(|&x| x == -7.5),
                "{pr:?}: wrote into an empty output"
            );
            let sel = SelectConfig::new(AllocatorKind::Uniform, Granularity::Head, 5);
            let kept = core_select(&sel, &[], 2, c.hkv, c.n, c.w).unwrap();
            for k in kept {
                assert_eq!(k, (0..c.n as u32).collect::<Vec<_>>());
            }
        }
    }
}

/// The reference's window attention is a proper causal softmax (sanity of the reference
/// itself, so that the comparisons above mean something).
#[test]
fn reference_attention_is_causal_softmax() {
    let mut rng = Rng::new(9);
    let q = T3::normal(&mut rng, 4, 6, 8, 1.0);
    let k = T3::normal(&mut rng, 2, 20, 8, 1.0);
    let a = reference::window_attention(&q, &k, 5);
    for h in 0..4 {
        for j in 0..5 {
            let s: f64 = (0..20).map(|i| a.at(h, j, i)).sum();
            assert!((s - 1.0).abs() < 1e-12);
            for i in 20 - 5 + j + 1..20 {
                assert_eq!(a.at(h, j, i), 0.0);
            }
        }
    }
}
