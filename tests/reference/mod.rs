//! A deliberately plain f64 reference of design §2–§4, written from the design and **not** by
//! calling the core: no chunking, no Gram matrices, no histograms, no 128-bit keys — full
//! softmax rows, `v·Wo_h` formed explicitly, selections by a full sort.
//!
//! It reads the core's configuration structs (`ScoreConfig`, `SelectConfig`, `Pool`) only
//! as plain data, so the tests describe a case once. Where the design is silent the reference
//! follows the decision the core documents; every such place is marked `CORE DECISION`.
//!
//! `harness` (a sibling file) is the glue that stores tensors in a dtype and layout and
//! calls the core; `mod.rs` itself uses nothing of `kvevict` but its config nouns.
#![allow(dead_code)]

pub mod harness;

use kvevict::{
    AllocatorKind, GqaReduce, Granularity, LaproxGqa, Normalize, Pool, PoolKind, PoolPlacement,
    ScoreConfig, ScorerKind, SelectConfig,
};
use std::cmp::Ordering;

// ------------------------------------------------------------------------------ PRNG --

/// SplitMix64: small, deterministic, good enough for test data.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform integer in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.range(0, xs.len() - 1)]
    }
    pub fn coin(&mut self, p: f64) -> bool {
        self.uniform() < p
    }
    /// `len` f32 values uniform in [-scale, scale).
    pub fn uniforms(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len)
            .map(|_| ((2.0 * self.uniform() - 1.0) * scale as f64) as f32)
            .collect()
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

// --------------------------------------------------------------------------- tensors --

/// A logical row-major 3-D tensor `[a, b, c]` of f64.
#[derive(Clone, Debug)]
pub struct T3 {
    pub a: usize,
    pub b: usize,
    pub c: usize,
    pub data: Vec<f64>,
}

impl T3 {
    pub fn zeros(a: usize, b: usize, c: usize) -> T3 {
        T3 {
            a,
            b,
            c,
            data: vec![0.0; a * b * c],
        }
    }
    pub fn normal(rng: &mut Rng, a: usize, b: usize, c: usize, scale: f64) -> T3 {
        let mut t = T3::zeros(a, b, c);
        for x in t.data.iter_mut() {
            *x = rng.normal() * scale;
        }
        t
    }
    /// [`T3::normal`] (unit scale), then each row `(i, j)` times `exp(spread · N(0, 1))`,
    /// drawn row after row: rows of log-normally spread norms (values with a few strong
    /// tokens).
    pub fn normal_rows_spread(rng: &mut Rng, a: usize, b: usize, c: usize, spread: f64) -> T3 {
        let mut t = T3::normal(rng, a, b, c, 1.0);
        for i in 0..a {
            for j in 0..b {
                let s = (rng.normal() * spread).exp();
                for k in 0..c {
                    let x = t.at(i, j, k) * s;
                    t.set(i, j, k, x);
                }
            }
        }
        t
    }
    #[inline]
    pub fn at(&self, i: usize, j: usize, k: usize) -> f64 {
        self.data[(i * self.b + j) * self.c + k]
    }
    #[inline]
    pub fn set(&mut self, i: usize, j: usize, k: usize, v: f64) {
        self.data[(i * self.b + j) * self.c + k] = v;
    }
    pub fn row(&self, i: usize, j: usize) -> &[f64] {
        &self.data[(i * self.b + j) * self.c..(i * self.b + j + 1) * self.c]
    }
    pub fn map(&self, f: impl Fn(f64) -> f64) -> T3 {
        T3 {
            data: self.data.iter().map(|&x| f(x)).collect(),
            ..*self
        }
    }
    /// The values rounded to f32 (exact where they came from f32).
    pub fn f32s(&self) -> Vec<f32> {
        self.data.iter().map(|&x| x as f32).collect()
    }
}

// ------------------------------------------------------------------------- pooling --

/// design §3 pooling along tokens, straight from the definitions:
/// avg counts pads (k/2 each side) as zeros and divides by k; max pads with -inf;
/// forward `s'[i] = max_{0<=j<k, j<=i} decay^j s[i-j]`. `PoolKind::None` is the identity.
pub fn pool(p: &Pool, s: &[f64]) -> Vec<f64> {
    let n = s.len() as isize;
    let k = p.kernel as isize;
    let h = k / 2;
    (0..n)
        .map(|i| match p.kind {
            PoolKind::None => s[i as usize],
            PoolKind::Avg => {
                let mut t = 0.0;
                for j in i - h..=i + h {
                    if j >= 0 && j < n {
                        t += s[j as usize];
                    } // pads add 0
                }
                t / k as f64
            }
            PoolKind::Max => {
                let mut m = f64::NEG_INFINITY;
                for j in i - h..=i + h {
                    if j >= 0 && j < n {
                        m = m.max(s[j as usize]);
                    }
                }
                m
            }
            PoolKind::Forward => {
                let decay = p.decay as f64;
                let mut m = f64::NEG_INFINITY;
                for j in 0..k {
                    if i - j >= 0 {
                        m = m.max(decay.powi(j as i32) * s[(i - j) as usize]);
                    }
                }
                m
            }
        })
        .collect()
}

// ------------------------------------------------------------- window attention §2 --

/// `A[h][j][i]` (`[Hq, w, N]`) of the last `w` query rows of `q` (`[Hq, wq, dk]`) over
/// keys `k` (`[Hkv, N, dk]`): full softmax per row in f64 with max subtraction, causal
/// inside the window (query `j` sits at `N-w+j` and sees keys `i <= N-w+j`; others 0).
pub fn window_attention(q: &T3, k: &T3, w: usize) -> T3 {
    let (hq, wq, dk) = (q.a, q.b, q.c);
    let (hkv, n) = (k.a, k.b);
    assert!(w <= n && w <= wq && hq % hkv == 0 && k.c == dk);
    let g = hq / hkv;
    let mut a = T3::zeros(hq, w, n);
    for h in 0..hq {
        for j in 0..w {
            let last = n - w + j; // visible keys 0..=last
            let (p, _) = softmax_row(q.row(h, wq - w + j), k, h / g, last);
            for (i, &x) in p.iter().enumerate() {
                a.set(h, j, i, x);
            }
        }
    }
    a
}

/// One query row `qr` over keys `0..=last` of KV head `kh` of `k`: the softmax of
/// `qr·k_i / sqrt(dk)` in f64 with max subtraction, and its natural-log log-sum-exp.
pub fn softmax_row(qr: &[f64], k: &T3, kh: usize, last: usize) -> (Vec<f64>, f64) {
    let scale = 1.0 / (k.c as f64).sqrt();
    let z: Vec<f64> = (0..=last)
        .map(|i| qr.iter().zip(k.row(kh, i)).map(|(x, y)| x * y).sum::<f64>() * scale)
        .collect();
    let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|x| (x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    (e.iter().map(|x| x / s).collect(), m + s.ln())
}

/// `v_i · Wo_h` (`[D]`): the value of token `i` of KV head `kh` through query head `h`'s
/// rows of the output projection (`wo` is `[Hq, dv, D]`). Formed explicitly on purpose.
pub fn value_out(v: &T3, wo: &T3, kh: usize, h: usize, i: usize) -> Vec<f64> {
    let (dv, dm) = (wo.b, wo.c);
    assert_eq!(v.c, dv);
    let mut y = vec![0.0; dm];
    for r in 0..dv {
        let vr = v.at(kh, i, r);
        for c in 0..dm {
            y[c] += vr * wo.at(h, r, c);
        }
    }
    y
}

fn norm2(x: &[f64]) -> f64 {
    x.iter().map(|v| v * v).sum::<f64>().sqrt()
}
fn norm1(x: &[f64]) -> f64 {
    x.iter().map(|v| v.abs()).sum()
}

/// CriticalKV's value term `mean_{h in group} ||v_i Wo_h||_1`, `[Hkv][N]`.
pub fn value_l1(v: &T3, wo: &T3) -> Vec<Vec<f64>> {
    let (hkv, n) = (v.a, v.b);
    let g = wo.a / hkv;
    (0..hkv)
        .map(|kh| {
            (0..n)
                .map(|i| {
                    (0..g)
                        .map(|a| norm1(&value_out(v, wo, kh, kh * g + a, i)))
                        .sum::<f64>()
                        / g as f64
                })
                .collect()
        })
        .collect()
}

// -------------------------------------------------------------------- scorers §3 --

/// The tensors of one layer, logical shapes, f64 (already rounded to the tested dtype).
pub struct Layer {
    /// `[Hq, wq, dk]`
    pub q: Option<T3>,
    /// `[Hkv, N, dk]`
    pub k: T3,
    /// `[Hkv, N, dv]`
    pub v: Option<T3>,
    /// `[Hq, dv, D]`
    pub wo: Option<T3>,
}

/// Reference output of one layer: `s[kh][i]` for prefix tokens `i < P`.
/// CriticalKV also reports its base (SnapKV) score and which tokens the first stage forced.
#[derive(Clone, Debug, Default)]
pub struct Scores {
    pub s: Vec<Vec<f64>>,
    pub base: Vec<Vec<f64>>,
    pub forced: Vec<Vec<bool>>,
}

pub fn reduce(kind: GqaReduce, rows: &[Vec<f64>]) -> Vec<f64> {
    let p = rows[0].len();
    (0..p)
        .map(|i| {
            let it = rows.iter().map(|r| r[i]);
            match kind {
                GqaReduce::Mean => it.sum::<f64>() / rows.len() as f64,
                GqaReduce::Sum => it.sum(),
                GqaReduce::Max => it.fold(f64::NEG_INFINITY, f64::max),
            }
        })
        .collect()
}

/// `mean_j A[h,j,i]` for the prefix tokens of query head `h`.
fn mean_attention(a: &T3, h: usize, p: usize) -> Vec<f64> {
    (0..p)
        .map(|i| (0..a.b).map(|j| a.at(h, j, i)).sum::<f64>() / a.b as f64)
        .collect()
}

/// SnapKV-style statistic of KV group `kh`: pooled mean window attention reduced over the
/// group (pool per head then reduce, or reduce then pool).
fn snapkv_group(
    a: &T3,
    kh: usize,
    g: usize,
    p: usize,
    pl: &Pool,
    gqa: GqaReduce,
    before: bool,
) -> Vec<f64> {
    let rows: Vec<Vec<f64>> = (0..g).map(|x| mean_attention(a, kh * g + x, p)).collect();
    if before {
        pool(pl, &reduce(gqa, &rows))
    } else {
        let pooled: Vec<Vec<f64>> = rows.iter().map(|r| pool(pl, r)).collect();
        reduce(gqa, &pooled)
    }
}

/// Indices of the top `k` of `s` by (score desc, position desc) — design §4's tie rule.
pub fn top_positions(s: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..s.len()).collect();
    idx.sort_by(|&x, &y| s[y].partial_cmp(&s[x]).unwrap().then(y.cmp(&x)));
    idx.truncate(k);
    idx
}

/// Score one layer (design §3). `cfg.window` is clamped to `N`; `P = N - min(w, N)`.
pub fn score_layer(cfg: &ScoreConfig, x: &Layer) -> Scores {
    let (hkv, n) = (x.k.a, x.k.b);
    let w = (cfg.window as usize).min(n);
    let p = n - w;
    let mut out = Scores::default();
    if p == 0 {
        out.s = vec![vec![]; hkv];
        return out;
    }
    let hq = x.q.as_ref().map_or(hkv, |q| q.a);
    let g = hq / hkv;
    let att = match cfg.scorer {
        ScorerKind::StreamingLlm | ScorerKind::KNorm | ScorerKind::Uniqueness => None,
        _ => Some(window_attention(x.q.as_ref().unwrap(), &x.k, w)),
    };
    for kh in 0..hkv {
        let s: Vec<f64> = match cfg.scorer {
            ScorerKind::SnapKv => {
                let a = att.as_ref().unwrap();
                snapkv_group(a, kh, g, p, &cfg.pool, cfg.gqa, cfg.reduce_before_pool)
            }
            ScorerKind::Lava => {
                // CORE DECISION: LAVa always reduces the group by max after pooling
                // (design: LAVa's gqa_support path); cfg.gqa / reduce_before_pool are ignored.
                let a = att.as_ref().unwrap();
                let v = x.v.as_ref().unwrap();
                let c = (0..p).map(|t| norm1(v.row(kh, t))).fold(0.0, f64::max);
                snapkv_group(a, kh, g, p, &cfg.pool, GqaReduce::Max, false)
                    .iter()
                    .map(|s| s * c)
                    .collect()
            }
            ScorerKind::LaProx => laprox_group(cfg, att.as_ref().unwrap(), x, kh, g, p),
            ScorerKind::CriticalKv => {
                let a = att.as_ref().unwrap();
                let base = snapkv_group(a, kh, g, p, &cfg.pool, cfg.gqa, cfg.reduce_before_pool);
                // CORE DECISION: `critical_first_stage` is a count of prefix tokens per KV
                // head (the caller passes ratio·budget); the forced ones are picked by the
                // base score with the usual tie rule and reported as f32::MAX.
                let mut forced = vec![false; p];
                for i in top_positions(&base, (cfg.critical_first_stage as usize).min(p)) {
                    forced[i] = true;
                }
                let l1 = value_l1(x.v.as_ref().unwrap(), x.wo.as_ref().unwrap());
                let s = (0..p)
                    .map(|i| {
                        if forced[i] {
                            f32::MAX as f64
                        } else {
                            (base[i] + 1e-4) * l1[kh][i]
                        }
                    })
                    .collect();
                out.base.push(base);
                out.forced.push(forced);
                s
            }
            // CORE DECISION: sinks score 1, the rest 0; the tie rule (later position first)
            // then keeps the most recent tokens.
            ScorerKind::StreamingLlm => (0..p)
                .map(|i| if i < cfg.sinks as usize { 1.0 } else { 0.0 })
                .collect(),
            ScorerKind::KNorm => (0..p).map(|i| -norm2(x.k.row(kh, i))).collect(),
            ScorerKind::Uniqueness => {
                // (1 - r_i)^8, r_i the 4th largest min(cos k, cos v) over every other cached
                // token (−1 where fewer exist), design §3b
                let v = x.v.as_ref().unwrap();
                let cos = |a: &[f64], b: &[f64]| {
                    let (na, nb) = (norm2(a), norm2(b));
                    if na == 0.0 || nb == 0.0 {
                        0.0
                    } else {
                        a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>() / (na * nb)
                    }
                };
                let u: Vec<f64> = (0..p)
                    .map(|i| {
                        let mut sims: Vec<f64> = (0..n)
                            .filter(|&j| j != i)
                            .map(|j| {
                                cos(x.k.row(kh, i), x.k.row(kh, j))
                                    .min(cos(v.row(kh, i), v.row(kh, j)))
                            })
                            .collect();
                        sims.sort_by(|a, b| b.total_cmp(a));
                        let r = sims.get(3).copied().unwrap_or(-1.0);
                        // nothing at or past the cutoff (0.5)
                        if r >= 0.5 {
                            0.0
                        } else {
                            (1.0 - r).max(0.0).powi(24)
                        }
                    })
                    .collect();
                // a unique token lends its score to the 6 tokens before it, then 0.729^(j - 6) of
                // it to the j-th before, j <= 10
                let decay = 0.729f32 as f64;
                (0..p)
                    .map(|i| {
                        (0..=10)
                            .filter(|j| i + j < p)
                            .map(|j| decay.powi((j as i32 - 6).max(0)) * u[i + j])
                            .fold(0.0, f64::max)
                    })
                    .collect()
            }
            ScorerKind::Tova => {
                // w = 1; mean over every query head of the layer, same for all KV heads.
                let a = att.as_ref().unwrap();
                (0..p)
                    .map(|i| (0..hq).map(|h| a.at(h, 0, i)).sum::<f64>() / hq as f64)
                    .collect()
            }
        };
        // CORE DECISION (kve_score_params.power): sign(s)·|s|^power
        let pw = cfg.power as i32;
        out.s
            .push(s.iter().map(|&x| x.signum() * x.abs().powi(pw)).collect());
    }
    out
}

/// LaProx for KV group `kh` (design §3), every quantity formed directly:
/// `||A[h,:,i]||_2`, `||v_i Wo_h||_2`, and for `exact` the Frobenius norm of the g-term
/// outer-product sum `Σ_h A[h,:,i] ⊗ (v_i Wo_h)` (`[w, D]`).
fn laprox_group(cfg: &ScoreConfig, a: &T3, x: &Layer, kh: usize, g: usize, p: usize) -> Vec<f64> {
    let v = x.v.as_ref().unwrap();
    let wo = x.wo.as_ref().unwrap();
    let w = a.b;
    let heads: Vec<usize> = (0..g).map(|t| kh * g + t).collect();
    // y[t][i] = v_i Wo_h
    let y: Vec<Vec<Vec<f64>>> = heads
        .iter()
        .map(|&h| (0..p).map(|i| value_out(v, wo, kh, h, i)).collect())
        .collect();
    let col = |h: usize, i: usize| -> Vec<f64> { (0..w).map(|j| a.at(h, j, i)).collect() };
    let place = |att: &[f64], val: &[f64]| -> Vec<f64> {
        match cfg.placement {
            PoolPlacement::Attention => pool(&cfg.pool, att)
                .iter()
                .zip(val)
                .map(|(x, y)| x * y)
                .collect(),
            PoolPlacement::Product => pool(
                &cfg.pool,
                &att.iter().zip(val).map(|(x, y)| x * y).collect::<Vec<_>>(),
            ),
        }
    };
    match cfg.laprox_gqa {
        LaproxGqa::Sum => {
            let mut s = vec![0.0; p];
            for (t, &h) in heads.iter().enumerate() {
                let an: Vec<f64> = (0..p).map(|i| norm2(&col(h, i))).collect();
                let vn: Vec<f64> = (0..p).map(|i| norm2(&y[t][i])).collect();
                for (o, z) in s.iter_mut().zip(place(&an, &vn)) {
                    *o += z;
                }
            }
            s
        }
        LaproxGqa::Exact => {
            let dm = wo.c;
            let e: Vec<f64> = (0..p)
                .map(|i| {
                    let mut f = 0.0;
                    for j in 0..w {
                        for c in 0..dm {
                            let m: f64 = heads
                                .iter()
                                .enumerate()
                                .map(|(t, &h)| a.at(h, j, i) * y[t][i][c])
                                .sum();
                            f += m * m;
                        }
                    }
                    f.sqrt()
                })
                .collect();
            // CORE DECISION: attention and value terms do not factor here, so the pool
            // applies to the product whatever `placement` says.
            pool(&cfg.pool, &e)
        }
        LaproxGqa::MeanAttn => {
            let an: Vec<f64> = (0..p)
                .map(|i| {
                    let sum: Vec<f64> = (0..w)
                        .map(|j| heads.iter().map(|&h| a.at(h, j, i)).sum())
                        .collect();
                    norm2(&sum)
                })
                .collect();
            let vn: Vec<f64> = (0..p)
                .map(|i| (0..g).map(|t| norm2(&y[t][i])).sum::<f64>() / g as f64)
                .collect();
            place(&an, &vn)
        }
    }
}

// ----------------------------------------------------------------- budgets §4 --

/// PyramidKV: `min = B//beta`, `max = 2B - min`, `B_l = max - l·(max-min)//(L-1)`, in exact
/// integers (a budget near u64::MAX means "keep everything"; the result saturates).
pub fn pyramid(b: u64, beta: u64, l: u64, layers: u64) -> u64 {
    if layers <= 1 {
        return b;
    }
    let (b, beta, l, layers) = (b as u128, beta as u128, l as u128, layers as u128);
    let min = b / beta;
    let max = 2 * b - min;
    (max - l * (max - min) / (layers - 1)).min(u64::MAX as u128) as u64
}

/// LAVa's layer entropy: `p = |s| / Σ|s|` over the layer (all heads, prefix), `-Σ p ln p`.
/// CORE DECISION: |s| (the design writes s; scores are non-negative except KNorm's).
pub fn entropy(s: &[f64]) -> f64 {
    let t: f64 = s.iter().map(|x| x.abs()).sum();
    if t <= 0.0 {
        return 0.0;
    }
    -s.iter()
        .map(|x| x.abs() / t)
        .filter(|&q| q > 0.0)
        .map(|q| q * q.ln())
        .sum::<f64>()
}

/// Split `total` over layers in proportion to `weights` (all zero: equally), rounded by
/// largest remainder (ties to the lower layer), clamped to `caps`, the excess handed again
/// to the layers below their cap until nothing is left or every layer is full.
pub fn lava_budgets(weights: &[f64], total: u64, caps: &[u64]) -> Vec<u64> {
    let n = weights.len();
    let mut out = vec![0u64; n];
    let mut left = total;
    while left > 0 {
        let open: Vec<usize> = (0..n).filter(|&l| out[l] < caps[l]).collect();
        if open.is_empty() {
            break;
        }
        let wsum: f64 = open.iter().map(|&l| weights[l].max(0.0)).sum();
        let share = |l: usize| {
            if wsum > 0.0 {
                weights[l].max(0.0) / wsum * left as f64
            } else {
                left as f64 / open.len() as f64
            }
        };
        let mut given = 0;
        for &l in &open {
            let f = share(l).floor() as u64;
            out[l] += f;
            given += f;
        }
        let mut rem = open.clone();
        rem.sort_by(|&x, &y| {
            let (fx, fy) = (share(x) - share(x).floor(), share(y) - share(y).floor());
            fy.partial_cmp(&fx).unwrap().then(x.cmp(&y))
        });
        for &l in rem.iter().take((left - given) as usize) {
            out[l] += 1;
        }
        let mut excess = 0;
        for l in 0..n {
            if out[l] > caps[l] {
                excess += out[l] - caps[l];
                out[l] = caps[l];
            }
        }
        if excess == left {
            break;
        }
        left = excess;
    }
    out
}

// --------------------------------------------------------------- selection §4 --

#[derive(Clone, Copy, Debug)]
struct Cand {
    s: f64,
    pos: usize,
    unit: usize,
    forced: bool,
}

/// design §4 order: forced (safeguard) first, then score, ties to the later position, then
/// to the lower unit (unit = layer·Hkv + head, or layer, or 0).
fn cmp(a: &Cand, b: &Cand) -> Ordering {
    b.forced
        .cmp(&a.forced)
        .then(b.s.partial_cmp(&a.s).unwrap())
        .then(b.pos.cmp(&a.pos))
        .then(a.unit.cmp(&b.unit))
}

fn top(mut c: Vec<Cand>, k: usize) -> Vec<Cand> {
    c.sort_by(cmp);
    c.truncate(k);
    c
}

/// Kept positions per (layer, KV head), ascending, prefix choice then the whole window.
/// `scores` is `[L][Hkv][P]`.
pub fn select_model(
    cfg: &SelectConfig,
    scores: &[f64],
    layers: usize,
    hkv: usize,
    n: usize,
    window: usize,
) -> Vec<Vec<u32>> {
    select_model_linked(cfg, scores, None, layers, hkv, n, window)
}

/// [`select_model`] with value links `(sums [n], threshold)`: the forward post-pool (flat)
/// lends a position's score to `a+1 ..= e(a)`, `e(a) = a + k - 1` carried on while the next
/// position's mean link `sums[j] / (layers·hkv)` exceeds the threshold.
pub fn select_model_linked(
    cfg: &SelectConfig,
    scores: &[f64],
    links: Option<(&[f64], f64)>,
    layers: usize,
    hkv: usize,
    n: usize,
    window: usize,
) -> Vec<Vec<u32>> {
    let w = window.min(n);
    let p = n - w;
    let s = |l: usize, kh: usize| &scores[(l * hkv + kh) * p..(l * hkv + kh + 1) * p];
    let layer_slice = |l: usize| &scores[l * hkv * p..(l + 1) * hkv * p];
    // LaProx Alg. 2 normalisation. CORE DECISION: divide by the layer sum of |s|; a layer
    // whose sum is 0 is left as is.
    let norm: Vec<f64> = (0..layers)
        .map(|l| {
            let t: f64 = layer_slice(l).iter().map(|x| x.abs()).sum();
            if cfg.normalize == Normalize::LayerSum && t > 0.0 {
                1.0 / t
            } else {
                1.0
            }
        })
        .collect();
    // unit scores at the selection granularity, then `post_pool` on them.
    // CORE DECISION: layer granularity sums the raw head scores (the layer's normaliser is
    // one constant, applied below where layers compete); token granularity sums the
    // layer-normalised scores of every layer and head. post_pool runs on the unit scores,
    // past the first post_pool_sinks positions.
    let (nu, per_layer): (usize, usize) = match cfg.granularity {
        Granularity::Head => (layers * hkv, hkv),
        Granularity::Layer => (layers, 1),
        Granularity::Token => (1, 1),
    };
    let unit_layer = |u: usize| match cfg.granularity {
        Granularity::Head => u / hkv,
        Granularity::Layer => u,
        Granularity::Token => 0,
    };
    let us: Vec<Vec<f64>> = (0..nu)
        .map(|u| {
            let raw: Vec<f64> = match cfg.granularity {
                Granularity::Head => s(u / hkv, u % hkv).to_vec(),
                Granularity::Layer => (0..p)
                    .map(|i| (0..hkv).map(|kh| s(u, kh)[i]).sum())
                    .collect(),
                Granularity::Token => (0..p)
                    .map(|i| {
                        (0..layers)
                            .map(|l| norm[l] * (0..hkv).map(|kh| s(l, kh)[i]).sum::<f64>())
                            .sum()
                    })
                    .collect(),
            };
            // the first post_pool_sinks positions keep their own score and lend none
            let k = (cfg.post_pool_sinks as usize).min(p);
            let mut out = raw[..k].to_vec();
            match links {
                None => out.extend(pool(&cfg.post_pool, &raw[k..])),
                Some((sums, thr)) => {
                    let linked = |j: usize| sums[j] / (layers * hkv) as f64 > thr;
                    let kern = cfg.post_pool.kernel as usize;
                    let reach = |a: usize| {
                        let mut e = (a + kern - 1).min(p - 1);
                        while e + 1 < p && linked(e + 1) {
                            e += 1;
                        }
                        e
                    };
                    for j in k..p {
                        let lent = (k..j).filter(|&a| reach(a) >= j).map(|a| raw[a]);
                        out.push(lent.fold(raw[j], f64::max));
                    }
                }
            }
            out
        })
        .collect();
    // CORE DECISION: the normalisation matters only where layers compete (global).
    let global = cfg.allocator == AllocatorKind::Global && cfg.granularity != Granularity::Token;
    let eff = |u: usize| if global { norm[unit_layer(u)] } else { 1.0 };
    let cands = |u: usize| -> Vec<Cand> {
        (0..p)
            .map(|i| Cand {
                s: us[u][i] * eff(u),
                pos: i,
                unit: u,
                forced: false,
            })
            .collect()
    };
    let b = (cfg.budget as usize).min(p);
    let mut kept: Vec<Vec<bool>> = vec![vec![false; p]; nu];
    let mark = |c: &[Cand], kept: &mut Vec<Vec<bool>>| {
        for x in c {
            kept[x.unit][x.pos] = true;
        }
    };
    // AdaKV within a layer of units `l*per_layer ..`: each unit first keeps its own top
    // floor(alpha·T/units), then one top-T over the layer, safeguarded first.
    let ada = |l: usize, total: usize, kept: &mut Vec<Vec<bool>>| {
        let floor = ((cfg.alpha as f64) * (total as f64 / per_layer as f64)).floor() as usize;
        let mut all = Vec::new();
        for u in l * per_layer..(l + 1) * per_layer {
            let mut c = cands(u);
            c.sort_by(cmp);
            for (r, x) in c.iter_mut().enumerate() {
                x.forced = r < floor;
            }
            all.extend(c);
        }
        for x in top(all, total) {
            kept[x.unit][x.pos] = true;
        }
    };
    match (cfg.allocator, cfg.granularity) {
        // CORE DECISION: at token granularity every allocator is one top-B over the
        // model-wide token scores.
        (_, Granularity::Token) => mark(&top(cands(0), b), &mut kept),
        (AllocatorKind::Global, _) => {
            let all: Vec<Cand> = (0..nu).flat_map(cands).collect();
            mark(&top(all, nu * b), &mut kept)
        }
        (AllocatorKind::Uniform, _) | (AllocatorKind::Ada, Granularity::Layer) => {
            for u in 0..nu {
                mark(&top(cands(u), b), &mut kept);
            }
        }
        (AllocatorKind::Pyramid, _) => {
            for u in 0..nu {
                let bl = pyramid(
                    cfg.budget,
                    cfg.beta as u64,
                    unit_layer(u) as u64,
                    layers as u64,
                )
                .min(p as u64);
                mark(&top(cands(u), bl as usize), &mut kept);
            }
        }
        (AllocatorKind::Ada, _) => {
            for l in 0..layers {
                ada(l, per_layer * b, &mut kept);
            }
        }
        (AllocatorKind::Lava, _) => {
            // entropies of the raw layer scores (all heads), caps = what a layer has
            let e: Vec<f64> = (0..layers).map(|l| entropy(layer_slice(l))).collect();
            let caps = vec![(per_layer * p) as u64; layers];
            let bl = lava_budgets(&e, (nu * b) as u64, &caps);
            // design decision: the ada floor follows this layer's own budget
            for l in 0..layers {
                ada(l, bl[l] as usize, &mut kept);
            }
        }
    }
    let mut res = Vec::with_capacity(layers * hkv);
    for l in 0..layers {
        for kh in 0..hkv {
            let u = match cfg.granularity {
                Granularity::Head => l * hkv + kh,
                Granularity::Layer => l,
                Granularity::Token => 0,
            };
            let mut list: Vec<u32> = (0..p).filter(|&i| kept[u][i]).map(|i| i as u32).collect();
            list.extend((p..n).map(|i| i as u32));
            res.push(list);
        }
    }
    res
}
