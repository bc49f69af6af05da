//! Conformance with NVIDIA kvpress 0.5.5 on real SmolLM2 tensors (../shared/conformance/
//! kvpress-smollm2, README there): the `snapkv-kvpress` preset and `criticalkv` reproduce
//! kvpress's scores (relative difference <= 1e-5 of the head's largest score) and kept sets.
//! Fails when the vectors are missing.

mod npy;

use kvevict::*;
use std::path::PathBuf;

fn dir() -> PathBuf {
    let d = std::env::var("KVEVICT_CONFORMANCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/kvpress-smollm2")
        });
    assert!(
        d.join("README.md").exists(),
        "conformance vectors missing at {}",
        d.display()
    );
    d
}

struct Layer {
    keys: Vec<f32>,
    values: Vec<f32>,
    queries: Vec<f32>,
    o_proj: Vec<f32>,
    t: usize,
}

fn load(l: &str) -> Layer {
    let d = dir();
    let k = npy::read(&d.join(format!("{l}_keys.npy")));
    assert_eq!(k.shape, vec![1, 3, k.shape[2], 64]);
    Layer {
        t: k.shape[2],
        keys: k.f32,
        values: npy::read(&d.join(format!("{l}_values.npy"))).f32,
        queries: npy::read(&d.join(format!("{l}_window_queries_postrope.npy"))).f32,
        o_proj: npy::read(&d.join(format!("{l}_o_proj_weight.npy"))).f32,
    }
}

const LAYERS: [&str; 3] = ["L00", "L10", "L29"];
const W: usize = 64;

fn score(cfg: &ScoreConfig, x: &Layer, value_l1: Option<&[f32]>) -> Vec<f32> {
    let keys = View::f32_contiguous(&x.keys, [3, x.t, 64]).unwrap();
    let values = View::f32_contiguous(&x.values, [3, x.t, 64]).unwrap();
    let queries = View::f32_contiguous(&x.queries, [9, W, 64]).unwrap();
    let inputs = LayerInputs {
        queries: Some(queries),
        keys: Some(keys),
        values: Some(values),
        value_l1,
        ..Default::default()
    };
    let shape = layer_shape(cfg, &inputs).unwrap();
    let mut ws = vec![0u8; score_workspace_size(cfg, &shape).unwrap()];
    let mut out = vec![0f32; score_len(cfg, &shape).unwrap()];
    score_layer(cfg, &inputs, &mut out, &mut ws).unwrap();
    out
}

/// Largest relative difference over the prefix, relative to each head's max |score|.
fn compare(ours: &[f32], ours_stride: usize, theirs: &[f32], t: usize, skip_forced: bool) -> f64 {
    let p = t - W;
    let mut worst = 0f64;
    for h in 0..3 {
        let th = &theirs[h * t..h * t + p];
        let scale = th
            .iter()
            .filter(|v| !skip_forced || **v < f32::MAX)
            .fold(0f32, |a, &b| a.max(b.abs())) as f64;
        for i in 0..p {
            let (a, b) = (ours[h * ours_stride + i], th[i]);
            if skip_forced && (a == f32::MAX || b == f32::MAX) {
                assert_eq!(a, b, "forced sets differ at head {h} token {i}");
                continue;
            }
            worst = worst.max(((a - b) as f64).abs() / scale);
        }
    }
    worst
}

/// kvpress keeps n = max(1, int(T(1-r))) per head, the window first (its score is max+1).
fn kept_sets(cfg: &ScoreConfig, scores: &[f32], t: usize, r: f64, window: usize) -> Vec<Vec<u32>> {
    let n_keep = ((t as f64 * (1.0 - r)) as u64).max(1);
    let b = n_keep.saturating_sub(window as u64);
    let sel = SelectConfig::new(AllocatorKind::Uniform, Granularity::Head, b);
    let m = ModelScores {
        scores,
        layers: 1,
        hkv: 3,
        n: t,
        window,
    };
    let (no, ni) = select_output_len(&sel, 1, 3, t, window).unwrap();
    let mut off = vec![0u64; no];
    let mut idx = vec![0u32; ni];
    let mut ws = vec![0u8; select_workspace_size(&sel, 1, 3, t, window).unwrap()];
    select_model(&sel, &m, &mut off, &mut idx, &mut ws).unwrap();
    let _ = cfg;
    (0..3)
        .map(|h| idx[off[h] as usize..off[h + 1] as usize].to_vec())
        .collect()
}

/// Kept sets must agree. When kvpress keeps fewer than the window (n < 64 at r = 0.9) it
/// picks among the window's equal scores by torch's tie order; we always keep the whole
/// window (design §1), so there both must keep no prefix token.
fn assert_same_kept(ours: &[Vec<u32>], theirs: &[Vec<u32>], t: usize, what: &str) {
    let p = (t - W) as u32;
    if theirs[0].len() < W {
        for (o, th) in ours.iter().zip(theirs) {
            assert!(
                th.iter().all(|&i| i >= p),
                "{what}: kvpress kept a prefix token"
            );
            assert!(o.iter().all(|&i| i >= p), "{what}: we kept a prefix token");
        }
    } else {
        assert_eq!(ours, theirs, "{what}");
    }
}

fn theirs_kept(l: &str, what: &str, r: &str) -> Vec<Vec<u32>> {
    let k = npy::read(&dir().join(format!("{l}_{what}_kept_idx_r{r}.npy")));
    let n = k.shape[2];
    (0..3)
        .map(|h| {
            let mut v: Vec<u32> = k.i64[h * n..(h + 1) * n]
                .iter()
                .map(|&x| x as u32)
                .collect();
            v.sort();
            v
        })
        .collect()
}

#[test]
fn snapkv_kvpress_scores_and_kept_sets() {
    let cfg = ScoreConfig::preset(Preset::SnapKvKvpress);
    for l in LAYERS {
        let x = load(l);
        let ours = score(&cfg, &x, None);
        let theirs = npy::read(&dir().join(format!("{l}_snapkv_scores.npy"))).f32;
        let err = compare(&ours, x.t - W, &theirs, x.t, false);
        println!("{l} snapkv-kvpress: max relative score difference {err:.2e}");
        assert!(err <= 1e-5, "{l}: {err}");
        for r in ["0.5", "0.9"] {
            let ours_k = kept_sets(&cfg, &ours, x.t, r.parse().unwrap(), W);
            assert_same_kept(
                &ours_k,
                &theirs_kept(l, "snapkv", r),
                x.t,
                &format!("{l} snapkv r={r}"),
            );
        }
    }
}

#[test]
fn criticalkv_scores_and_kept_sets() {
    for l in LAYERS {
        let x = load(l);
        // value L1 norms through Wo (PyTorch o_proj.weight is [D, Hq*dv]: strides [dv, 1, Hq*dv])
        let values = View::f32_contiguous(&x.values, [3, x.t, 64]).unwrap();
        let wo = View::f32(&x.o_proj, [9, 64, 576], [64, 1, 576]).unwrap();
        let mut l1 = vec![0f32; 3 * x.t];
        let mut ws = vec![0u8; gram::value_l1_workspace_size(64, 576).unwrap()];
        compute_value_l1(&values, &wo, &mut l1, &mut ws).unwrap();
        let theirs_l1 = npy::read(&dir().join(format!("{l}_criticalkv_vwl1norm.npy"))).f32;
        let err = compare(&l1, x.t, &theirs_l1, x.t, false);
        println!("{l} value L1 norms: max relative difference {err:.2e}");
        assert!(err <= 1e-5, "{l}: {err}");
        for r in ["0.5", "0.9"] {
            let rf: f64 = r.parse().unwrap();
            let budget1 = (((1.0 - rf) * x.t as f64 * 0.5) as u64).max(1);
            let mut cfg = ScoreConfig::preset(Preset::CriticalKv);
            cfg.critical_first_stage = budget1.saturating_sub(W as u64) as u32;
            let ours = score(&cfg, &x, Some(&l1));
            let theirs = npy::read(&dir().join(format!("{l}_criticalkv_scores_r{r}.npy"))).f32;
            let err = compare(&ours, x.t - W, &theirs, x.t, true);
            println!("{l} criticalkv r={r}: max relative score difference {err:.2e}");
            assert!(err <= 1e-5, "{l} r={r}: {err}");
            let ours_k = kept_sets(&cfg, &ours, x.t, rf, W);
            assert_same_kept(
                &ours_k,
                &theirs_kept(l, "criticalkv", r),
                x.t,
                &format!("{l} criticalkv r={r}"),
            );
        }
    }
}
