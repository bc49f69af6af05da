//! Scorer and selection pipelines of launchers against the CPU core (and the references
//! against the core on the CPU).

use super::*;

// --------------------------------- scorer and selection pipelines against the core --

/// Scores `[Hkv][P]` of one layer from the CPU core.
fn core_scores(
    preset: kvevict::Preset,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    gram: Option<&[f32]>,
    w: usize,
) -> Vec<f32> {
    let mut cfg = kvevict::ScoreConfig::preset(preset);
    cfg.window = w as u32;
    core_scores_with(&cfg, q, k, v, gram)
}

/// Scores `[Hkv][P]` of one layer from the CPU core under `cfg`.
fn core_scores_with(
    cfg: &kvevict::ScoreConfig,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    gram: Option<&[f32]>,
) -> Vec<f32> {
    let inputs = kvevict::LayerInputs {
        queries: Some(q.core_view()),
        keys: Some(k.core_view()),
        values: Some(v.core_view()),
        gram,
        ..Default::default()
    };
    let shape = kvevict::layer_shape(cfg, &inputs).expect("layer_shape");
    let mut out = vec![0f32; kvevict::score_len(cfg, &shape).unwrap()];
    let mut ws = vec![0u8; kvevict::score_workspace_size(cfg, &shape).unwrap()];
    kvevict::score_layer(cfg, &inputs, &mut out, &mut ws).expect("score_layer");
    out
}

/// f64 reference of the three scorer presets (design §3) on one layer:
/// LaProx (avg 7 on ||A||, times sqrt(v G vᵀ), group sum), SnapKV (max 7 on the
/// mean, group mean), LAVa (max 7 on the mean, times max_k ||V_k||_1, group max).
fn ref_scores(which: &str, q: &Tensor, k: &Tensor, v: &Tensor, gram: &[f32], w: usize) -> Vec<f64> {
    let (hq, hkv, n, dv) = (q.ext[0], k.ext[0], k.ext[1], v.ext[2]);
    let (g, p) = (hq / hkv, n - w);
    let a = window_attention(q, k, w).data;
    let mut out = vec![0f64; hkv * p];
    for hk in 0..hkv {
        let c: f64 = (0..p)
            .map(|i| (0..dv).map(|d| v.at(hk, i, d).abs()).sum::<f64>())
            .fold(0.0, f64::max);
        let mut per_head = Vec::new();
        for hh in 0..g {
            let h = hk * g + hh;
            let col = |f: &dyn Fn(f64) -> f64| -> Vec<f64> {
                (0..p)
                    .map(|i| (0..w).map(|j| f(a[(h * w + j) * n + i])).sum::<f64>())
                    .collect()
            };
            let s: Vec<f64> = match which {
                "laprox" => {
                    let l2: Vec<f64> = col(&|x| x * x).iter().map(|x| x.sqrt()).collect();
                    let pooled = ref_pool(&l2, KVE_CUDA_POOL_AVG, 7, 1.0);
                    (0..p)
                        .map(|i| {
                            let mut qf = 0f64;
                            for r in 0..dv {
                                for cc in 0..dv {
                                    qf += v.at(hk, i, r)
                                        * gram[(h * dv + r) * dv + cc] as f64
                                        * v.at(hk, i, cc);
                                }
                            }
                            pooled[i] * qf.max(0.0).sqrt()
                        })
                        .collect()
                }
                _ => {
                    let mean: Vec<f64> = col(&|x| x).iter().map(|x| x / w as f64).collect();
                    let pooled = ref_pool(&mean, KVE_CUDA_POOL_MAX, 7, 1.0);
                    if which == "lava" {
                        pooled.iter().map(|x| x * c).collect()
                    } else {
                        pooled
                    }
                }
            };
            per_head.push(s);
        }
        for i in 0..p {
            let xs: Vec<f64> = per_head.iter().map(|s| s[i]).collect();
            out[hk * p + i] = match which {
                "laprox" => gqa(KVE_CUDA_GQA_SUM, &xs),
                "lava" => gqa(KVE_CUDA_GQA_MAX, &xs),
                _ => gqa(KVE_CUDA_GQA_MEAN, &xs),
            };
        }
    }
    out
}

/// The core's kept prefix positions per (layer, head) for a global or uniform selection.
pub(crate) fn core_select(
    scores: &[f32],
    layers: usize,
    hkv: usize,
    p: usize,
    global: bool,
    budget: u64,
) -> Vec<Vec<i32>> {
    use kvevict::{AllocatorKind, Granularity, ModelScores, SelectConfig};
    let alloc = if global {
        AllocatorKind::Global
    } else {
        AllocatorKind::Uniform
    };
    let cfg = SelectConfig::new(alloc, Granularity::Head, budget);
    let window = 1; // the core appends the window's positions; we read only i < p
    let n = p + window;
    let m = ModelScores {
        scores,
        layers,
        hkv,
        n,
        window,
    };
    let (no, ni) = kvevict::select_output_len(&cfg, layers, hkv, n, window).unwrap();
    let mut off = vec![0u64; no];
    let mut idx = vec![0u32; ni];
    let mut ws = vec![0u8; kvevict::select_workspace_size(&cfg, layers, hkv, n, window).unwrap()];
    kvevict::select_model(&cfg, &m, &mut off, &mut idx, &mut ws).expect("select_model");
    (0..layers * hkv)
        .map(|u| {
            idx[off[u] as usize..off[u + 1] as usize]
                .iter()
                .filter(|&&i| (i as usize) < p)
                .map(|&i| i as i32)
                .collect()
        })
        .collect()
}

pub(crate) fn layer_sums(s: &[f32], layers: usize, per_layer: usize) -> Vec<f64> {
    (0..layers)
        .map(|l| {
            s[l * per_layer..(l + 1) * per_layer]
                .iter()
                .map(|&x| (x as f64).abs())
                .sum()
        })
        .collect()
}

/// CPU only (runs without a GPU): the f64 references of this file agree with the
/// core, so a GPU run that matches them also matches the core.
#[test]
fn references_agree_with_core_on_cpu() {
    let mut rng = Rng::new(20);
    for &(hq, hkv, w, n, d) in &[(4usize, 2usize, 6usize, 90usize, 16usize), (3, 1, 4, 50, 8)] {
        let q = Tensor::host(Dt::F32, Layout::HeadMajor, [hq, w, d], &mut || {
            2.0 * rng.normal()
        });
        let k = Tensor::host(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
            rng.normal()
        });
        let v = Tensor::host(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
            rng.normal()
        });
        let gram = core_gram(&mut rng, hq, hkv, d, 24);
        for (name, preset) in [
            ("laprox", kvevict::Preset::LaProx),
            ("snapkv", kvevict::Preset::SnapKv),
            ("lava", kvevict::Preset::Lava),
        ] {
            let core = core_scores(preset, &q, &k, &v, Some(&gram), w);
            let want = ref_scores(name, &q, &k, &v, &gram, w);
            assert_close(
                &format!("core vs f64 reference: {name} hq{hq} hkv{hkv}"),
                &core,
                &want,
                1e-4,
            );
        }
    }
    // KNorm and StreamingLLM (no attention): the references of the baseline launchers
    for &(hkv, n, d, w) in &[(2usize, 60usize, 16usize, 5usize), (3, 33, 7, 1)] {
        let (hq, p) = (hkv, n - w);
        let q = Tensor::host(Dt::F32, Layout::HeadMajor, [hq, w, d], &mut || rng.normal());
        let k = Tensor::host(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
            rng.normal()
        });
        let v = Tensor::host(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
            rng.normal()
        });
        let core = core_scores(kvevict::Preset::KNorm, &q, &k, &v, None, w);
        assert_close(
            "core vs f64 reference: knorm",
            &core,
            &ref_knorm(&k, p),
            1e-6,
        );
        assert_eq!(core, core_knorm(&k, p), "core_knorm helper");
        let core = core_scores(kvevict::Preset::StreamingLlm, &q, &k, &v, None, w);
        let sinks = kvevict::ScoreConfig::preset(kvevict::Preset::StreamingLlm).sinks as usize;
        assert_eq!(
            core,
            ref_sinks(hkv, p, sinks)
                .iter()
                .map(|&x| x as f32)
                .collect::<Vec<f32>>(),
            "core vs reference: streaming sinks"
        );
    }
    // row LSE: this file's f64 reference == the core's window_row_lse
    for &(hq, hkv, w, n, d) in &[(4usize, 2usize, 6usize, 90usize, 16usize), (3, 1, 4, 50, 8)] {
        let q = Tensor::host(Dt::F32, Layout::HeadMajor, [hq, w, d], &mut || {
            2.0 * rng.normal()
        });
        let k = Tensor::host(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
            rng.normal()
        });
        let shape = kvevict::LayerShape {
            hq,
            hkv,
            n,
            dk: d,
            dv: d,
        };
        let mut ws = vec![0u8; kvevict::window_row_lse_workspace_size(&shape, w as u32).unwrap()];
        let mut core = vec![0f32; hq * w];
        kvevict::window_row_lse(&q.core_view(), &k.core_view(), w as u32, &mut core, &mut ws)
            .expect("window_row_lse");
        assert_close(
            &format!("core vs f64 reference: row lse hq{hq} hkv{hkv}"),
            &core,
            &ref_row_lse(&q, &k, w),
            1e-6,
        );
    }
    // selection: this file's reference rule == the core's (global with layer sums, uniform)
    for &(layers, hkv, p) in &[(3usize, 2usize, 200usize), (2, 4, 31)] {
        for ties in [false, true] {
            let s: Vec<f32> = (0..layers * hkv * p)
                .map(|_| {
                    if ties {
                        rng.below(5) as f32
                    } else {
                        rng.unif()
                    }
                })
                .collect();
            let budget = 1 + rng.below(p) as u64;
            let sums = layer_sums(&s, layers, hkv * p);
            let core = core_select(&s, layers, hkv, p, true, budget);
            let want = ref_select(
                &s,
                p,
                1,
                layers * hkv,
                &[(layers * hkv) as i64 * budget as i64],
                Some((&sums, hkv)),
            );
            assert_eq!(core, want, "global select: core vs reference (ties {ties})");
            let core = core_select(&s, layers, hkv, p, false, budget);
            let ks = vec![budget as i64; layers * hkv];
            let want = ref_select(&s, p, layers * hkv, 1, &ks, None);
            assert_eq!(
                core, want,
                "uniform select: core vs reference (ties {ties})"
            );
        }
    }
}

/// The device pipeline (`kvevict::device::score_layer`, the chain of launches the C entry
/// point enqueues) against the core's score_layer on the same inputs, for SnapKV (and
/// kvpress's reduce-before-pool), LAVa and LaProx (sum, product placement, exact GQA and
/// mean-attention, with cross Gram blocks): within 2e-3 of the core. Shapes: one per dtype with K token-major and V transposed
/// (llama.cpp), and four f32 head-major ones.
#[test]
fn device_scores_match_core() {
    use kvevict::{LaproxGqa, PoolPlacement, Preset, ScoreConfig};
    let mut rng = device_rng!(21);
    let mut cases: Vec<(Dt, [usize; 5], Layout, Layout)> = DTYPES
        .into_iter()
        .map(|dt| {
            (
                dt,
                [8, 2, 400, 12, 64],
                Layout::TokenMajor,
                Layout::Transposed,
            )
        })
        .collect();
    for sh in [
        [4, 2, 90, 10, 16],
        [6, 3, 130, 24, 32],
        [2, 2, 50, 7, 8],
        [8, 2, 77, 4, 24],
    ] {
        cases.push((Dt::F32, sh, Layout::HeadMajor, Layout::HeadMajor));
    }
    let laprox = ScoreConfig::preset(Preset::LaProx);
    let exact = ScoreConfig {
        laprox_gqa: LaproxGqa::Exact,
        ..laprox
    };
    let mean_attn = ScoreConfig {
        laprox_gqa: LaproxGqa::MeanAttn,
        ..laprox
    };
    let configs: [(&str, ScoreConfig); 9] = [
        // cubed after the chain (kve_cuda_score_power)
        ("laprox-span", ScoreConfig::preset(Preset::LaProxSpan)),
        ("snapkv", ScoreConfig::preset(Preset::SnapKv)),
        (
            "snapkv reduce-before-pool",
            ScoreConfig {
                reduce_before_pool: true,
                ..ScoreConfig::preset(Preset::SnapKvKvpress)
            },
        ),
        ("lava", ScoreConfig::preset(Preset::Lava)),
        ("laprox sum", laprox),
        (
            "laprox product",
            ScoreConfig {
                placement: PoolPlacement::Product,
                ..laprox
            },
        ),
        ("laprox exact", exact),
        ("laprox mean-attn", mean_attn),
        (
            "laprox mean-attn product",
            ScoreConfig {
                placement: PoolPlacement::Product,
                ..mean_attn
            },
        ),
    ];
    for (dt, [hq, hkv, n, w, d], kl, vl) in cases {
        let p = n - w;
        let q = Tensor::new(dt, Layout::HeadMajor, [hq, w, d], &mut || {
            2.0 * rng.normal()
        });
        let k = Tensor::normal(&mut rng, dt, kl, [hkv, n, d]);
        let v = Tensor::normal(&mut rng, dt, vl, [hkv, n, d]);
        let grams = [
            core_gram_of(&mut rng, hq, hkv, d, 48, false),
            core_gram_of(&mut rng, hq, hkv, d, 48, true),
        ];
        let gds = [DBuf::from(&grams[0]), DBuf::from(&grams[1])];
        for (name, cfg) in &configs {
            let cfg = ScoreConfig {
                window: w as u32,
                ..*cfg
            };
            let cross = cfg.laprox_gqa != LaproxGqa::Sum;
            let (gram, gd) = (&grams[cross as usize], &gds[cross as usize]);
            let ws = score_workspace(&cfg, [hq, hkv, n, d, d]);
            let inputs = gram_inputs(&q, &k, &v, gd);
            let out = poisoned(hkv * p);
            let tag = format!("device vs core: {name} {dt:?} hq{hq} hkv{hkv} n{n} w{w} d{d}");
            // SAFETY: device tensors and buffers of the declared sizes.
            unsafe { score_layer_into(&cfg, &inputs, &out, &ws, null_mut()) }
                .unwrap_or_else(|e| panic!("{tag}: {e:?}"));
            let core = core_scores_with(&cfg, &q, &k, &v, Some(gram));
            let got = out.download();
            let want: Vec<f64> = core.iter().map(|&x| x as f64).collect();
            assert_close(&tag, &got, &want, 2e-3);
        }
    }
}

/// The device selection (`kvevict::device::select_model`: layer sums, budgets, top-K as
/// the C entry point enqueues them) against the core's select_model (global with layer
/// sums; uniform): the same kept counts and at least 99.9 % of the kept sets; overlap printed.
#[test]
fn device_select_matches_core() {
    let mut rng = device_rng!(22);
    let (layers, hkv, p) = (6usize, 4usize, 3000usize);
    let rows = layers * hkv;
    // one window token per unit: the device lists end with it, the comparison reads i < p
    let n = p + 1;
    for global in [true, false] {
        let s: Vec<f32> = (0..rows * p).map(|_| rng.unif() * rng.unif()).collect();
        let budget = 1 + rng.below(p / 3) as u64;
        let core = core_select(&s, layers, hkv, p, global, budget);
        let alloc = if global {
            kvevict::AllocatorKind::Global
        } else {
            kvevict::AllocatorKind::Uniform
        };
        let cfg = kvevict::SelectConfig::new(alloc, kvevict::Granularity::Head, budget);
        // the prefix part of each list
        let lists = device_lists(&cfg, &model(&s, layers, hkv, n, 1));
        let (mut both, mut total, mut kept) = (0usize, 0usize, 0usize);
        let mut exact = true;
        for r in 0..rows {
            let prefix: Vec<i32> = lists[r]
                .iter()
                .cloned()
                .filter(|&i| (i as usize) < p)
                .collect();
            kept += prefix.len();
            let got: std::collections::BTreeSet<i32> = prefix.into_iter().collect();
            let want: std::collections::BTreeSet<i32> = core[r].iter().cloned().collect();
            both += got.intersection(&want).count();
            total += want.len();
            exact &= got == want;
        }
        let overlap = both as f64 / total.max(1) as f64;
        println!("device vs core select (global {global}, budget {budget}): overlap {overlap:.6}, exact {exact}");
        assert_eq!(kept, total, "kept count");
        assert!(overlap >= 0.999, "overlap {overlap}");
    }
}

/// Host scores `s` of the shape `(layers, hkv, n, w)` (as the core takes them).
fn model(s: &[f32], layers: usize, hkv: usize, n: usize, w: usize) -> kvevict::ModelScores<'_> {
    kvevict::ModelScores {
        scores: s,
        layers,
        hkv,
        n,
        window: w,
    }
}

/// The core's kept lists of every (layer, head) unit, window positions included.
fn core_lists(cfg: &kvevict::SelectConfig, m: &kvevict::ModelScores) -> Vec<Vec<i32>> {
    let (layers, hkv, n, w) = (m.layers, m.hkv, m.n, m.window);
    let (no, ni) = kvevict::select_output_len(cfg, layers, hkv, n, w).unwrap();
    let (mut off, mut idx) = (vec![0u64; no], vec![0u32; ni]);
    let mut ws = vec![0u8; kvevict::select_workspace_size(cfg, layers, hkv, n, w).unwrap()];
    kvevict::select_model(cfg, m, &mut off, &mut idx, &mut ws).expect("select_model");
    (0..layers * hkv)
        .map(|u| {
            idx[off[u] as usize..off[u + 1] as usize]
                .iter()
                .map(|&i| i as i32)
                .collect()
        })
        .collect()
}

/// The device pipeline's kept lists (`kvevict::device::select_model`), row stride n.
fn device_lists(cfg: &kvevict::SelectConfig, m: &kvevict::ModelScores) -> Vec<Vec<i32>> {
    let (s, layers, hkv, n, w) = (m.scores, m.layers, m.hkv, m.n, m.window);
    let units = layers * hkv;
    let m = kvevict::ModelShape::new(layers as u64, hkv as u64, n as u64, w as u64).expect("shape");
    let sd = DBuf::from(s);
    let wsb = kvevict::device::select_workspace_size(cfg, &m).expect("workspace");
    let ws = DBuf::<u8>::new(wsb);
    let counts = DBuf::from(&vec![-1i32; units]);
    let idx = DBuf::from(&vec![-1i32; units * n]);
    let lists = kvevict::device::select::KeptLists {
        counts: counts.ptr(),
        counts_len: units as u64,
        idx: idx.ptr(),
        idx_ld: n as u64,
        idx_len: (units * n) as u64,
    };
    // SAFETY: device buffers of the declared sizes.
    unsafe {
        kvevict::device::select_model(
            cfg,
            &m,
            sd.ptr(),
            s.len() as u64,
            &lists,
            ws.vptr(),
            wsb as u64,
            null_mut(),
        )
    }
    .unwrap_or_else(|e| panic!("device select_model {cfg:?}: {e:?}"));
    let (c, x) = (counts.download(), idx.download());
    (0..units)
        .map(|u| x[u * n..u * n + c[u] as usize].to_vec())
        .collect()
}

/// Every allocator the device pipeline runs (uniform, pyramid, global with and without
/// layer-sum normalisation, AdaKV and LAVa with and without the safeguard floor, token
/// granularity with and without post-pooling) on scores with many ties, over shapes with
/// no window, a budget of 0 and one past P: the kept lists are the core's (at least 99.9 % of
/// them and the same counts).
#[test]
fn device_selections_equal_select_model() {
    use kvevict::{AllocatorKind as A, Granularity, Normalize, Pool, SelectConfig};
    let mut rng = device_rng!(101);
    for &(layers, hkv, n, w, budget) in &[
        (4usize, 2usize, 40usize, 8usize, 5u64),
        (3, 3, 17, 4, 2),
        (5, 1, 100, 4, 30),
        (2, 4, 64, 0, 64),
        (6, 2, 50, 10, 0),
        (3, 2, 30, 6, 1000),
    ] {
        let p = n - w;
        // a coarse grid: ties everywhere
        let s: Vec<f32> = (0..layers * hkv * p)
            .map(|_| (rng.unif() * 40.0).floor() / 7.0)
            .collect();
        let mut cfgs: Vec<(String, SelectConfig)> = vec![
            (
                "uniform".into(),
                SelectConfig::new(A::Uniform, Granularity::Head, budget),
            ),
            (
                "pyramid".into(),
                SelectConfig::new(A::Pyramid, Granularity::Head, budget),
            ),
        ];
        for norm in [Normalize::LayerSum, Normalize::None] {
            let mut c = SelectConfig::new(A::Global, Granularity::Head, budget);
            c.normalize = norm;
            cfgs.push((format!("global {norm:?}"), c));
        }
        for alpha in [0.0f32, 0.2, 0.5] {
            for a in [A::Ada, A::Lava] {
                let mut c = SelectConfig::new(a, Granularity::Head, budget);
                c.alpha = alpha;
                cfgs.push((format!("{a:?} alpha {alpha}"), c));
            }
        }
        for pooled in [false, true] {
            let mut c = SelectConfig::new(A::Global, Granularity::Token, budget);
            if pooled {
                c.post_pool = Pool::forward(8, 0.9);
            }
            cfgs.push((format!("token pooled {pooled}"), c));
        }
        for (name, cfg) in &cfgs {
            if p == 0 && cfg.granularity == Granularity::Token {
                continue;
            }
            let m = model(&s, layers, hkv, n, w);
            let (want, got) = (core_lists(cfg, &m), device_lists(cfg, &m));
            let tag = format!("{name}: layers {layers} hkv {hkv} n {n} w {w} budget {budget}");
            let total: usize = want.iter().map(|l| l.len()).sum();
            let same: usize = got
                .iter()
                .zip(&want)
                .map(|(g, w)| g.iter().filter(|x| w.contains(x)).count())
                .sum();
            assert_eq!(
                got.iter().map(|l| l.len()).sum::<usize>(),
                total,
                "{tag}: kept count"
            );
            let overlap = same as f64 / total.max(1) as f64;
            println!("{tag}: overlap {overlap:.6}");
            assert!(overlap >= 0.999, "{tag}: overlap {overlap}");
        }
    }
}
