//! Scoring from a query stream (`kvevict::stream`) against a plain f64 reference written
//! here from the module's contract (full softmax rows over the visible keys, every
//! statistic accumulated in f64, `v·Wo_h` formed explicitly), over dtypes f32/f16/bf16,
//! layouts (head-major, llama.cpp token rows), GQA g = 1 and 3, chunks of 1, 7 and all
//! queries, positions inside the prefix (causal) and after N. Then: chunked == at once,
//! the window pass equivalence (SnapKV and LaProx over the window == the stream fed the
//! window's queries), `row_lse`, selection with window 0, and bad input through the C ABI
//! with canaries.
//!
//! Tolerance: |core − reference| <= TOL · max_i |reference[kh][i]| per KV head.

#![allow(clippy::needless_range_loop)]

mod reference;

use kvevict::capi::*;
use kvevict::*;
use reference::harness::*;
use reference::{pool, reduce, softmax_row, value_out, Rng, T3};

const TOL: f64 = 2e-4;

// ------------------------------------------------------------------------ reference --

/// Per (query head, key): max, sum, sum of squares of the attention of every query fed,
/// and per key how many queries saw it.
struct RefStats {
    max: Vec<Vec<f64>>,
    sum: Vec<Vec<f64>>,
    sq: Vec<Vec<f64>>,
    seen: Vec<f64>,
    count: usize,
}

/// Query `j` of `q` (`[Hq, c, dk]`) at `pos[j]` sees keys `i <= min(pos[j], N-1)`.
fn ref_stats(q: &T3, pos: &[i64], k: &T3) -> RefStats {
    let (hq, c, dk) = (q.a, q.b, q.c);
    let (hkv, n) = (k.a, k.b);
    let g = hq / hkv;
    let mut r = RefStats {
        max: vec![vec![0.0; n]; hq],
        sum: vec![vec![0.0; n]; hq],
        sq: vec![vec![0.0; n]; hq],
        seen: vec![0.0; n],
        count: c,
    };
    assert_eq!(k.c, dk);
    for j in 0..c {
        let last = (pos[j] as usize).min(n - 1);
        for i in 0..=last {
            r.seen[i] += 1.0;
        }
        for h in 0..hq {
            let (p, _) = softmax_row(q.row(h, j), k, h / g, last);
            for (i, &a) in p.iter().enumerate() {
                r.max[h][i] = r.max[h][i].max(a);
                r.sum[h][i] += a;
                r.sq[h][i] += a * a;
            }
        }
    }
    r
}

/// Scores `[Hkv][N]` from the reference statistics (the stream module's contract).
fn ref_scores(r: &RefStats, cfg: &StreamScoreConfig, hkv: usize, v: &T3, wo: &T3) -> Vec<Vec<f64>> {
    let hq = r.max.len();
    let n = r.seen.len();
    let g = hq / hkv;
    (0..hkv)
        .map(|kh| {
            let rows: Vec<Vec<f64>> = (0..g)
                .map(|a| {
                    let h = kh * g + a;
                    let s: Vec<f64> = (0..n)
                        .map(|i| match cfg.stat {
                            StreamStat::Max => r.max[h][i],
                            StreamStat::Mean => r.sum[h][i] / r.count as f64,
                            StreamStat::MeanVisible => {
                                if r.seen[i] == 0.0 {
                                    0.0
                                } else {
                                    r.sum[h][i] / r.seen[i]
                                }
                            }
                            StreamStat::LaProx => r.sq[h][i].sqrt(),
                        })
                        .collect();
                    let s = pool(&cfg.pool, &s);
                    if cfg.stat == StreamStat::LaProx {
                        s.iter()
                            .enumerate()
                            .map(|(i, x)| {
                                let y = value_out(v, wo, kh, h, i);
                                x * y.iter().map(|t| t * t).sum::<f64>().sqrt()
                            })
                            .collect()
                    } else {
                        s
                    }
                })
                .collect();
            pool(&cfg.post_pool, &reduce(cfg.gqa, &rows))
        })
        .collect()
}

fn close(core: &[f32], refr: &[Vec<f64>], n: usize, what: &str) {
    for (kh, r) in refr.iter().enumerate() {
        let scale = r.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
        for i in 0..n {
            let d = (core[kh * n + i] as f64 - r[i]).abs();
            assert!(
                d <= TOL * scale,
                "{what}: kh {kh} i {i}: core {} ref {} (scale {scale})",
                core[kh * n + i],
                r[i]
            );
        }
    }
}

/// |a − b| <= tol · max |b|, element by element.
fn near(a: &[f32], b: &[f32], tol: f32, what: &str) {
    let m = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (u, v)) in a.iter().zip(b).enumerate() {
        assert!((u - v).abs() <= tol * m, "{what}: i {i}: {u} vs {v}");
    }
}

// ----------------------------------------------------------------------------- glue --

/// An 8-byte-aligned byte buffer.
struct Aligned(Vec<u64>);

impl Aligned {
    fn new(bytes: usize) -> Aligned {
        Aligned(vec![0x5A5A_5A5A_5A5A_5A5A; bytes.div_ceil(8)])
    }
    fn bytes(&mut self) -> &mut [u8] {
        let len = self.0.len() * 8;
        // SAFETY: a Vec<u64> is len*8 initialised bytes.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut u8, len) }
    }
}

struct Layer {
    hq: usize,
    hkv: usize,
    n: usize,
    dk: usize,
    k: Stored,
    kr: T3,
    v: Stored,
    vr: T3,
    wo: T3,
}

fn layer(
    rng: &mut Rng,
    hkv: usize,
    g: usize,
    n: usize,
    dk: usize,
    dt: DType,
    lay: Layout,
) -> Layer {
    let dv = 8;
    let k = T3::normal(rng, hkv, n, dk, 1.0);
    let (ks, kr) = Stored::new(&k, dt, lay);
    let v = T3::normal(rng, hkv, n, dv, 1.0);
    let (vs, vr) = Stored::new(&v, dt, lay);
    let wo = T3::normal(rng, hkv * g, dv, 12, 0.3).map(|x| x as f32 as f64);
    Layer {
        hq: hkv * g,
        hkv,
        n,
        dk,
        k: ks,
        kr,
        v: vs,
        vr,
        wo,
    }
}

impl Layer {
    fn shape(&self) -> StreamShape {
        StreamShape {
            hq: self.hq,
            hkv: self.hkv,
            n: self.n,
            dk: self.dk,
        }
    }
    fn forms(&self) -> Vec<f32> {
        let gm = self.gram();
        let mut f = vec![0f32; value_forms_len(self.hq, self.hkv, self.n, false).unwrap()];
        compute_value_forms(&self.v.view(), &gm, self.hq, false, 0, self.n, &mut f).unwrap();
        f
    }
    fn gram(&self) -> Vec<f32> {
        let wo: Vec<f32> = self.wo.data.iter().map(|&x| x as f32).collect();
        let wv = View::f32_contiguous(&wo, [self.wo.a, self.wo.b, self.wo.c]).unwrap();
        let dv = self.wo.b;
        let mut gm = vec![0f32; gram_len(self.hq, self.hkv, dv, false).unwrap()];
        let mut ws = vec![0u8; gram_workspace_size(dv, self.wo.c).unwrap()];
        compute_gram(&wv, self.hkv, false, &mut gm, &mut ws).unwrap();
        gm
    }
    /// A fresh state fed `q` (`[Hq, C, dk]`, stored) at `pos` in chunks of `chunk`.
    fn feed(&self, q: &T3, pos: &[i64], chunk: usize, dt: DType, lay: Layout) -> Aligned {
        let sh = self.shape();
        let mut st = Aligned::new(stream_state_size(&sh).unwrap());
        stream_init(&sh, st.bytes()).unwrap();
        let mut ws = vec![0u8; stream_feed_workspace_size(&sh, chunk).unwrap()];
        let mut j0 = 0;
        while j0 < q.b {
            let c = chunk.min(q.b - j0);
            let mut part = T3::zeros(q.a, c, q.c);
            for h in 0..q.a {
                for j in 0..c {
                    for d in 0..q.c {
                        part.set(h, j, d, q.at(h, j0 + j, d));
                    }
                }
            }
            let (qs, _) = Stored::new(&part, dt, lay);
            stream_feed(
                st.bytes(),
                &qs.view(),
                &pos[j0..j0 + c],
                &self.k.view(),
                None,
                &mut ws,
            )
            .unwrap();
            j0 += c;
        }
        st
    }
    fn scores(&self, st: &mut Aligned, cfg: &StreamScoreConfig, forms: &[f32]) -> Vec<f32> {
        let sh = self.shape();
        let mut out = vec![f32::NAN; stream_scores_len(&sh).unwrap()];
        let mut ws = vec![0u8; stream_scores_workspace_size(&sh).unwrap()];
        let vals = StreamValues {
            value_forms: Some(forms),
            ..Default::default()
        };
        stream_scores(st.bytes(), cfg, &vals, &mut out, &mut ws).unwrap();
        out
    }
}

/// Queries rounded to `dt` (what the core reads), `[Hq, c, dk]`.
fn queries(rng: &mut Rng, hq: usize, c: usize, dk: usize, dt: DType) -> T3 {
    T3::normal(rng, hq, c, dk, 1.5).map(|x| round(x, dt))
}

/// Non-decreasing positions: inside the prefix (causal), after N, or straddling N.
fn positions(rng: &mut Rng, c: usize, n: usize, mode: usize) -> Vec<i64> {
    let mut p: Vec<i64> = (0..c)
        .map(|_| match mode {
            0 => rng.range(0, n - 1) as i64,
            1 => (n + rng.range(0, 3 * n)) as i64,
            _ => rng.range(n / 2, n + n / 2) as i64,
        })
        .collect();
    p.sort();
    p
}

const STATS: [StreamStat; 4] = [
    StreamStat::Max,
    StreamStat::Mean,
    StreamStat::MeanVisible,
    StreamStat::LaProx,
];

// ------------------------------------------------------------------------------ tests --

#[test]
fn matches_f64_reference() {
    let mut rng = Rng::new(11);
    let mut case = 0;
    for &dt in &DTYPES {
        for lay in [Layout::HeadMajor, Layout::TokenMajor] {
            for g in [1usize, 3] {
                for (ci, chunk) in [1usize, 7, usize::MAX].into_iter().enumerate() {
                    let mode = (case + ci) % 3;
                    case += 1;
                    let hkv = 2;
                    let n = rng.pick(&[1usize, 5, 96, 97, 150]);
                    let dk = rng.pick(&[8usize, 13, 64]);
                    let c = rng.pick(&[1usize, 9, 24]);
                    let x = layer(&mut rng, hkv, g, n, dk, dt, lay);
                    let q = queries(&mut rng, x.hq, c, dk, dt);
                    let pos = positions(&mut rng, c, n, mode);
                    let mut st = x.feed(&q, &pos, chunk.min(c), dt, lay);
                    assert_eq!(stream_query_count(st.bytes()).unwrap(), c as u64);
                    let r = ref_stats(&q, &pos, &x.kr);
                    let forms = x.forms();
                    for stat in STATS {
                        let gqa = rng.pick(&[GqaReduce::Mean, GqaReduce::Max, GqaReduce::Sum]);
                        let mut cfg = StreamScoreConfig::new(stat, gqa);
                        if rng.coin(0.5) {
                            cfg.pool =
                                rng.pick(&[Pool::avg(3), Pool::max(5), Pool::forward(4, 0.9)]);
                        }
                        if rng.coin(0.5) {
                            cfg.post_pool = Pool::forward(8, 0.9);
                        }
                        let core = x.scores(&mut st, &cfg, &forms);
                        let want = ref_scores(&r, &cfg, hkv, &x.vr, &x.wo);
                        let what = format!(
                            "{dt:?} {lay:?} g{g} chunk {chunk} mode {mode} n{n} c{c} {cfg:?}"
                        );
                        close(&core, &want, n, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn values_and_gram_equal_cached_forms() {
    let mut rng = Rng::new(5);
    let x = layer(&mut rng, 2, 3, 40, 16, DType::F16, Layout::TokenMajor);
    let q = queries(&mut rng, x.hq, 10, 16, DType::F16);
    let pos = positions(&mut rng, 10, 40, 2);
    let mut st = x.feed(&q, &pos, 4, DType::F16, Layout::TokenMajor);
    let cfg = StreamScoreConfig::new(StreamStat::LaProx, GqaReduce::Sum);
    let a = x.scores(&mut st, &cfg, &x.forms());
    let gm = x.gram();
    let sh = x.shape();
    let mut b = vec![0f32; stream_scores_len(&sh).unwrap()];
    let mut ws = vec![0u8; stream_scores_workspace_size(&sh).unwrap()];
    let vals = StreamValues {
        values: Some(x.v.view()),
        gram: Some(&gm),
        value_forms: None,
    };
    stream_scores(st.bytes(), &cfg, &vals, &mut b, &mut ws).unwrap();
    assert_eq!(a, b, "value forms are the same quadratic forms");
}

#[test]
fn chunked_equals_at_once() {
    let mut rng = Rng::new(7);
    for (g, dt) in [(1, DType::F32), (3, DType::BF16)] {
        let n = 130;
        let x = layer(&mut rng, 2, g, n, 32, dt, Layout::HeadMajor);
        let c = 40;
        let q = queries(&mut rng, x.hq, c, 32, dt);
        let pos = positions(&mut rng, c, n, 2);
        let forms = x.forms();
        let mut all = x.feed(&q, &pos, c, dt, Layout::HeadMajor);
        for chunk in [1, 7, 16] {
            let mut part = x.feed(&q, &pos, chunk, dt, Layout::HeadMajor);
            for stat in STATS {
                let cfg = StreamScoreConfig::new(stat, GqaReduce::Mean);
                let (a, b) = (
                    x.scores(&mut all, &cfg, &forms),
                    x.scores(&mut part, &cfg, &forms),
                );
                if stat == StreamStat::Max {
                    // the same logits and row statistics per query, whatever the chunking
                    assert_eq!(a, b, "max, chunk {chunk}");
                } else {
                    near(&a, &b, 1e-5, &format!("{stat:?} chunk {chunk}"));
                }
            }
        }
    }
}

#[test]
fn window_queries_give_the_window_pass_statistics() {
    let mut rng = Rng::new(3);
    for (g, dt, lay, n, w) in [
        (1, DType::F32, Layout::HeadMajor, 100, 8),
        (3, DType::F16, Layout::TokenMajor, 257, 32),
        (3, DType::BF16, Layout::HeadMajor, 64, 64),
    ] {
        let x = layer(&mut rng, 2, g, n, 32, dt, lay);
        let q = queries(&mut rng, x.hq, w, 32, dt);
        let (qs, _) = Stored::new(&q, dt, lay);
        let pos: Vec<i64> = (n - w..n).map(|p| p as i64).collect();
        let p = n - w;
        let mut st = x.feed(&q, &pos, 5, dt, lay);
        let forms = x.forms();
        let inputs = LayerInputs {
            queries: Some(qs.view()),
            keys: Some(x.k.view()),
            values: Some(x.v.view()),
            value_forms: None,
            gram: None,
            value_l1: None,
            row_lse: None,
        };
        // SnapKV without pooling: mean_j A, GQA mean — the stream's Mean over the window
        let mut snap = ScoreConfig::preset(Preset::SnapKv);
        snap.window = w as u32;
        snap.pool = Pool::NONE;
        // LaProx without pooling, GQA sum: ||A[h,:,i]|| · ||v Wo_h|| summed over the group
        let mut lap = ScoreConfig::preset(Preset::LaProx);
        lap.window = w as u32;
        lap.pool = Pool::NONE;
        let gm = x.gram();
        for (cfg, stat, gqa) in [
            (snap, StreamStat::Mean, GqaReduce::Mean),
            (lap, StreamStat::LaProx, GqaReduce::Sum),
        ] {
            let li = LayerInputs {
                gram: if stat == StreamStat::LaProx {
                    Some(&gm)
                } else {
                    None
                },
                ..inputs
            };
            let shape = layer_shape(&cfg, &li).unwrap();
            let mut want = vec![0f32; score_len(&cfg, &shape).unwrap()];
            let mut ws = vec![0u8; score_workspace_size(&cfg, &shape).unwrap()];
            score_layer(&cfg, &li, &mut want, &mut ws).unwrap();
            let got = x.scores(&mut st, &StreamScoreConfig::new(stat, gqa), &forms);
            for kh in 0..x.hkv {
                let what = format!("{stat:?} g{g} {dt:?} kh {kh}: stream vs window");
                near(
                    &got[kh * n..kh * n + p],
                    &want[kh * p..(kh + 1) * p],
                    2e-5,
                    &what,
                );
            }
        }
    }
}

#[test]
fn row_lse_gives_the_same_scores() {
    let mut rng = Rng::new(9);
    let (dt, lay) = (DType::F32, Layout::TokenMajor);
    let x = layer(&mut rng, 2, 3, 77, 16, dt, lay);
    let c = 12;
    let q = queries(&mut rng, x.hq, c, 16, dt);
    let pos = positions(&mut rng, c, 77, 2);
    let forms = x.forms();
    let mut plain = x.feed(&q, &pos, c, dt, lay);
    // the rows' log-sum-exp in f64, as a flash-attention kernel would give it
    let g = 3;
    let mut lse = vec![0f32; x.hq * c];
    for h in 0..x.hq {
        for j in 0..c {
            let last = (pos[j] as usize).min(76);
            lse[h * c + j] = softmax_row(q.row(h, j), &x.kr, h / g, last).1 as f32;
        }
    }
    let sh = x.shape();
    let mut st = Aligned::new(stream_state_size(&sh).unwrap());
    stream_init(&sh, st.bytes()).unwrap();
    let mut ws = vec![0u8; stream_feed_workspace_size(&sh, c).unwrap()];
    let (qs, _) = Stored::new(&q, dt, lay);
    stream_feed(
        st.bytes(),
        &qs.view(),
        &pos,
        &x.k.view(),
        Some(&lse),
        &mut ws,
    )
    .unwrap();
    for stat in STATS {
        let cfg = StreamScoreConfig::new(stat, GqaReduce::Max);
        let (a, b) = (
            x.scores(&mut plain, &cfg, &forms),
            x.scores(&mut st, &cfg, &forms),
        );
        near(&a, &b, 1e-5, &format!("{stat:?}"));
    }
}

#[test]
fn scores_select_with_window_zero() {
    let mut rng = Rng::new(21);
    let (layers, hkv, n) = (2, 2, 60);
    let mut all = vec![];
    for _ in 0..layers {
        let x = layer(&mut rng, hkv, 3, n, 16, DType::F32, Layout::HeadMajor);
        let q = queries(&mut rng, x.hq, 8, 16, DType::F32);
        let pos: Vec<i64> = (0..8).map(|j| (n + j) as i64).collect();
        let mut st = x.feed(&q, &pos, 8, DType::F32, Layout::HeadMajor);
        all.extend(x.scores(
            &mut st,
            &StreamScoreConfig::new(StreamStat::Max, GqaReduce::Max),
            &[],
        ));
    }
    for gran in [Granularity::Head, Granularity::Layer, Granularity::Token] {
        let alloc = if gran == Granularity::Token {
            AllocatorKind::Global
        } else {
            AllocatorKind::Uniform
        };
        let cfg = SelectConfig::new(alloc, gran, 6);
        let kept = core_select(&cfg, &all, layers, hkv, n, 0).unwrap();
        assert_eq!(kept.len(), layers * hkv);
        let total: usize = kept.iter().map(|k| k.len()).sum();
        assert!(
            total > 0 && kept.iter().all(|k| k.len() < n),
            "{gran:?}: {total}"
        );
        if gran == Granularity::Head {
            // per head: exactly its 6 best keys (no window added)
            for (u, k) in kept.iter().enumerate() {
                let s = &all[u * n..(u + 1) * n];
                let mut idx: Vec<usize> = (0..n).collect();
                idx.sort_by(|&a, &b| s[b].partial_cmp(&s[a]).unwrap().then(b.cmp(&a)));
                let mut want: Vec<u32> = idx[..6].iter().map(|&i| i as u32).collect();
                want.sort();
                assert_eq!(k, &want);
            }
        }
    }
}

// --------------------------------------------------------------- bad input (C ABI) --

fn tensor<T>(data: &[T], dtype: u32, extent: [usize; 3], stride: [usize; 3]) -> kve_tensor {
    kve_tensor {
        data: data.as_ptr() as *const _,
        len: data.len() as u64,
        dtype,
        pad: 0,
        extent: extent.map(|e| e as u64),
        stride: stride.map(|s| s as u64),
    }
}

struct Abi {
    hq: usize,
    hkv: usize,
    n: usize,
    dk: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    state: Aligned,
    ws: Vec<u8>,
}

impl Abi {
    fn new(c: usize) -> Abi {
        let (hq, hkv, n, dk) = (6, 2, 20, 8);
        let mut rng = Rng::new(1);
        let q: Vec<f32> = (0..hq * c * dk).map(|_| rng.normal() as f32).collect();
        let k: Vec<f32> = (0..hkv * n * dk).map(|_| rng.normal() as f32).collect();
        let mut bytes = 0u64;
        let mut wsb = 0u64;
        unsafe {
            assert_eq!(kve_stream_state_size(6, 2, 20, 8, &mut bytes), KVE_OK);
            assert_eq!(
                kve_stream_feed_workspace_size(6, 2, 20, 8, c as u64, &mut wsb),
                KVE_OK
            );
        }
        let mut state = Aligned::new(bytes as usize);
        let st = state.bytes();
        unsafe {
            assert_eq!(
                kve_stream_init(st.as_mut_ptr() as *mut _, bytes, 6, 2, 20, 8),
                KVE_OK
            );
        }
        Abi {
            hq,
            hkv,
            n,
            dk,
            q,
            k,
            state,
            ws: vec![0u8; wsb as usize],
        }
    }
    fn feed(&mut self, q: &[f32], pos: &[i64], lse: Option<&[f32]>) -> i32 {
        let c = pos.len();
        let qt = tensor(q, 0, [self.hq, c, self.dk], [c * self.dk, self.dk, 1]);
        let kt = tensor(
            &self.k,
            0,
            [self.hkv, self.n, self.dk],
            [self.n * self.dk, self.dk, 1],
        );
        // SAFETY: every pointer is into a live buffer of the given length.
        unsafe { self.args(&qt, &kt, pos, lse).call() }
    }
    /// The arguments of a feed of queries `q`, positions `pos` and keys `k` into this
    /// state, with this workspace.
    fn args(
        &mut self,
        q: &kve_tensor,
        k: &kve_tensor,
        pos: &[i64],
        lse: Option<&[f32]>,
    ) -> FeedArgs {
        let st = self.state.bytes();
        FeedArgs {
            state: st.as_mut_ptr(),
            bytes: st.len() as u64,
            q,
            pos: pos.as_ptr(),
            npos: pos.len() as u64,
            k,
            lse: lse.map_or((std::ptr::null(), 0), |l| (l.as_ptr(), l.len() as u64)),
            ws: self.ws.as_mut_ptr(),
            wsl: self.ws.len() as u64,
        }
    }
}

/// Every argument of `kve_stream_feed`, so that a test can break one at a time.
#[derive(Clone, Copy)]
struct FeedArgs {
    state: *mut u8,
    bytes: u64,
    q: *const kve_tensor,
    pos: *const i64,
    npos: u64,
    k: *const kve_tensor,
    lse: (*const f32, u64),
    ws: *mut u8,
    wsl: u64,
}

impl FeedArgs {
    unsafe fn call(&self) -> i32 {
        kve_stream_feed(
            self.state as *mut _,
            self.bytes,
            self.q,
            self.pos,
            self.npos,
            self.k,
            self.lse.0,
            self.lse.1,
            self.ws as *mut _,
            self.wsl,
        )
    }
}

#[test]
fn bad_input_leaves_the_state_unchanged() {
    let c = 4;
    let mut a = Abi::new(c);
    let q = a.q.clone();
    assert_eq!(a.feed(&q, &[3, 5, 5, 30], None), KVE_OK);
    let before = a.state.0.clone();
    let check = |a: &mut Abi, code: i32, want: i32, what: &str| {
        assert_eq!(code, want, "{what}");
        assert_eq!(a.state.0, before, "{what}: state changed");
    };
    // positions backwards: inside the chunk, and before the last one fed
    let r = a.feed(&q, &[31, 32, 31, 40], None);
    check(
        &mut a,
        r,
        KVE_ERR_INVALID_ARGUMENT,
        "backwards in the chunk",
    );
    let r = a.feed(&q, &[29, 40, 41, 42], None);
    check(
        &mut a,
        r,
        KVE_ERR_INVALID_ARGUMENT,
        "backwards across chunks",
    );
    let r = a.feed(&q, &[-1, 40, 41, 42], None);
    check(&mut a, r, KVE_ERR_INVALID_ARGUMENT, "negative");
    // NaN / Inf in the queries (last head, last row: after other groups were read)
    let mut bad = q.clone();
    *bad.last_mut().unwrap() = f32::NAN;
    let r = a.feed(&bad, &[30, 31, 32, 33], None);
    check(&mut a, r, KVE_ERR_NON_FINITE, "NaN query");
    bad[0] = f32::INFINITY;
    let r = a.feed(&bad, &[30, 31, 32, 33], None);
    check(&mut a, r, KVE_ERR_NON_FINITE, "Inf query");
    // Inf in a visible key of the last KV head
    let k0 = a.k.clone();
    let last = a.k.len() - 1;
    a.k[last] = f32::INFINITY;
    let r = a.feed(&q, &[30, 31, 32, 33], None);
    check(&mut a, r, KVE_ERR_NON_FINITE, "Inf key");
    a.k = k0;
    // row_lse: NaN, wrong length
    let mut lse = vec![1f32; a.hq * c];
    lse[5] = f32::NAN;
    let r = a.feed(&q, &[30, 31, 32, 33], Some(&lse));
    check(&mut a, r, KVE_ERR_NON_FINITE, "NaN lse");
    let r = a.feed(&q, &[30, 31, 32, 33], Some(&lse[1..]));
    check(&mut a, r, KVE_ERR_SHAPE_MISMATCH, "short lse");
    // short workspace
    let full = a.ws.len();
    a.ws.truncate(full - 1);
    let r = a.feed(&q, &[30, 31, 32, 33], None);
    check(&mut a, r, KVE_ERR_WORKSPACE_TOO_SMALL, "short workspace");
    a.ws.resize(full, 0);
    // the raw call with one argument broken at a time
    {
        let qt = tensor(&q, 0, [a.hq, c, a.dk], [c * a.dk, a.dk, 1]);
        let kt = tensor(&a.k, 0, [a.hkv, a.n, a.dk], [a.n * a.dk, a.dk, 1]);
        let kt2 = tensor(&a.k, 0, [a.hkv, a.n - 1, a.dk], [a.n * a.dk, a.dk, 1]);
        let pos = [30i64, 31, 32, 33];
        let base = a.args(&qt, &kt, &pos, None);
        let cases = [
            (
                FeedArgs { npos: 3, ..base },
                KVE_ERR_SHAPE_MISMATCH,
                "positions length",
            ),
            (
                FeedArgs { k: &kt2, ..base },
                KVE_ERR_SHAPE_MISMATCH,
                "keys of another shape",
            ),
            (
                FeedArgs {
                    q: std::ptr::null(),
                    ..base
                },
                KVE_ERR_NULL_POINTER,
                "NULL queries",
            ),
            (
                FeedArgs {
                    pos: std::ptr::null(),
                    ..base
                },
                KVE_ERR_NULL_POINTER,
                "NULL positions",
            ),
            (
                FeedArgs {
                    k: std::ptr::null(),
                    ..base
                },
                KVE_ERR_NULL_POINTER,
                "NULL keys",
            ),
            (
                FeedArgs {
                    lse: (std::ptr::null(), 24),
                    ..base
                },
                KVE_ERR_NULL_POINTER,
                "NULL row_lse",
            ),
            (
                FeedArgs {
                    state: std::ptr::null_mut(),
                    ..base
                },
                KVE_ERR_NULL_POINTER,
                "NULL state",
            ),
            (
                FeedArgs {
                    bytes: base.bytes - 8,
                    ..base
                },
                KVE_ERR_INVALID_ARGUMENT, // as every stream call (issue 26)
                "state shorter than its shape",
            ),
            (
                FeedArgs {
                    ws: base.state,
                    wsl: 8,
                    ..base
                },
                KVE_ERR_ALIASING,
                "workspace over the state",
            ),
            (
                // SAFETY: 4 bytes into the state, still inside it
                FeedArgs {
                    state: unsafe { base.state.add(4) },
                    bytes: base.bytes - 8,
                    ..base
                },
                KVE_ERR_MISALIGNED,
                "misaligned state",
            ),
        ];
        for (args, want, what) in cases {
            // SAFETY: every pointer is NULL or into a live buffer of the given length.
            let r = unsafe { args.call() };
            check(&mut a, r, want, what);
        }
    }
    // a state started for another shape: queries of 6 heads into a 3-head state
    let mut other = Aligned::new(8192);
    let ob = other.bytes();
    unsafe {
        assert_eq!(
            kve_stream_init(ob.as_mut_ptr() as *mut _, 8192, 3, 1, 20, 8),
            KVE_OK
        );
    }
    let snapshot = other.0.clone();
    std::mem::swap(&mut a.state, &mut other);
    let r = a.feed(&q, &[30, 31, 32, 33], None);
    assert_eq!(r, KVE_ERR_SHAPE_MISMATCH);
    assert_eq!(a.state.0, snapshot, "other-shape state changed");
    // a buffer that was never started
    let mut raw = Aligned::new(a.state.0.len() * 8);
    let rawc = raw.0.clone();
    std::mem::swap(&mut a.state, &mut raw);
    let r = a.feed(&q, &[30, 31, 32, 33], None);
    assert_eq!(r, KVE_ERR_INVALID_ARGUMENT);
    assert_eq!(a.state.0, rawc, "unstarted state changed");
    std::mem::swap(&mut a.state, &mut raw);
    std::mem::swap(&mut a.state, &mut other);
    // and the good state still feeds
    assert_eq!(a.state.0, before);
    assert_eq!(a.feed(&q, &[30, 31, 32, 33], None), KVE_OK);
}

/// LaProx's value term is one of the two (cached forms, or values with their Gram), never
/// one ignored: forms beside values or a Gram are `KVE_ERR_INVALID_ARGUMENT` (as
/// `kve_layer_inputs`), also when the ignored one is garbage (a NaN Gram of 1 float),
/// nothing written. Before issue 26 the Gram was ignored unchecked (`KVE_OK`).
#[test]
fn laprox_stream_refuses_a_value_term_it_would_ignore() {
    let mut a = Abi::new(3);
    let q = a.q.clone();
    assert_eq!(a.feed(&q, &[2, 9, 25], None), KVE_OK);
    let (hq, hkv, n, dv) = (a.hq, a.hkv, a.n, 4);
    let mut p = std::mem::MaybeUninit::<kve_stream_score_params>::zeroed();
    let size = std::mem::size_of::<kve_stream_score_params>() as u32;
    unsafe { assert_eq!(kve_stream_score_params_init(p.as_mut_ptr(), size), KVE_OK) };
    let p = kve_stream_score_params {
        stat: 3,
        ..unsafe { p.assume_init() }
    };
    let mut wsb = 0u64;
    let sizes = unsafe { kve_stream_scores_workspace_size(6, 2, 20, 8, &mut wsb) };
    assert_eq!(sizes, KVE_OK);
    let mut ws = vec![0u8; wsb as usize];
    let forms = vec![0.5f32; hq * n];
    let vals = vec![0.25f32; hkv * n * dv];
    let vt = tensor(&vals, 0, [hkv, n, dv], [n * dv, dv, 1]);
    let nan_gram = [f32::NAN];
    let canary = -7.25f32;
    let mut out = vec![canary; hkv * n];
    let bytes = a.state.bytes().len() as u64;
    let mut call = |values: *const kve_tensor, gram: &[f32], out: &mut [f32]| unsafe {
        let opt = |x: &[f32]| {
            if x.is_empty() {
                std::ptr::null()
            } else {
                x.as_ptr()
            }
        };
        kve_stream_scores(
            a.state.bytes().as_ptr() as *const _,
            bytes,
            &p,
            values,
            opt(gram),
            gram.len() as u64,
            forms.as_ptr(),
            forms.len() as u64,
            out.as_mut_ptr(),
            out.len() as u64,
            ws.as_mut_ptr() as *mut _,
            wsb,
        )
    };
    let none = std::ptr::null();
    for (values, gram, what) in [
        (
            &vt as *const kve_tensor,
            &nan_gram[..],
            "values and a NaN gram",
        ),
        (none, &nan_gram[..], "a NaN gram"),
        (&vt as *const kve_tensor, &[][..], "values"),
    ] {
        let r = call(values, gram, &mut out);
        assert_eq!(r, KVE_ERR_INVALID_ARGUMENT, "forms and {what}");
        assert!(
            out.iter().all(|&v| v == canary),
            "forms and {what}: out written"
        );
    }
    assert_eq!(call(none, &[], &mut out), KVE_OK);
}

#[test]
fn scores_abi_writes_nothing_on_error() {
    let mut a = Abi::new(3);
    let q = a.q.clone();
    let (hkv, n) = (a.hkv, a.n);
    let mut p = std::mem::MaybeUninit::<kve_stream_score_params>::zeroed();
    unsafe {
        assert_eq!(
            kve_stream_score_params_init(
                p.as_mut_ptr(),
                std::mem::size_of::<kve_stream_score_params>() as u32
            ),
            KVE_OK
        );
    }
    let mut p = unsafe { p.assume_init() };
    let mut wsb = 0u64;
    unsafe {
        assert_eq!(
            kve_stream_scores_workspace_size(6, 2, 20, 8, &mut wsb),
            KVE_OK
        )
    };
    let mut ws = vec![0u8; wsb as usize];
    let canary = -7.25f32;
    let mut out = vec![canary; hkv * n + 1];
    let bytes = a.state.bytes().len() as u64;
    // the raw call; `forms` are LaProx's value forms (empty: none)
    let raw = |a: &mut Abi,
               p: &kve_stream_score_params,
               forms: &[f32],
               out: *mut f32,
               ol: u64,
               ws: &mut [u8],
               wl: u64| unsafe {
        kve_stream_scores(
            a.state.bytes().as_ptr() as *const _,
            bytes,
            p,
            std::ptr::null(),
            std::ptr::null(),
            0,
            if forms.is_empty() {
                std::ptr::null()
            } else {
                forms.as_ptr()
            },
            forms.len() as u64,
            out,
            ol,
            ws.as_mut_ptr() as *mut _,
            wl,
        )
    };
    let call = |a: &mut Abi,
                p: &kve_stream_score_params,
                out: &mut [f32],
                ol: u64,
                ws: &mut [u8],
                wl: u64| { raw(a, p, &[], out.as_mut_ptr(), ol, ws, wl) };
    // mean of an empty stream
    p.stat = 1;
    assert_eq!(
        call(&mut a, &p, &mut out, (hkv * n) as u64, &mut ws, wsb),
        KVE_ERR_INVALID_ARGUMENT
    );
    // max of an empty stream: zeros
    p.stat = 0;
    assert_eq!(
        call(&mut a, &p, &mut out, (hkv * n) as u64, &mut ws, wsb),
        KVE_OK
    );
    assert!(out[..hkv * n].iter().all(|&v| v == 0.0) && out[hkv * n] == canary);
    out.fill(canary);
    assert_eq!(a.feed(&q, &[2, 9, 25], None), KVE_OK);
    let ol = (hkv * n) as u64;
    let with = |f: fn(&mut kve_stream_score_params)| {
        let mut q = p;
        f(&mut q);
        q
    };
    let bad: [(kve_stream_score_params, u64, u64, i32); 6] = [
        (with(|p| p.stat = 9), ol, wsb, KVE_ERR_BAD_ENUM),
        (with(|p| p.reserved = 1), ol, wsb, KVE_ERR_INVALID_ARGUMENT),
        (
            with(|p| {
                p.pool_kind = 1;
                p.pool_kernel = 4
            }),
            ol,
            wsb,
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (with(|p| p.stat = 3), ol, wsb, KVE_ERR_NULL_POINTER),
        (p, ol - 1, wsb, KVE_ERR_OUTPUT_TOO_SMALL),
        (p, ol, wsb - 1, KVE_ERR_WORKSPACE_TOO_SMALL),
    ];
    for (i, (pp, ol, wl, want)) in bad.into_iter().enumerate() {
        assert_eq!(
            call(&mut a, &pp, &mut out, ol, &mut ws, wl),
            want,
            "case {i}"
        );
        assert!(out.iter().all(|&v| v == canary), "case {i}: out written");
    }
    // value forms of the wrong length
    let lp = kve_stream_score_params { stat: 3, ..p };
    let r = raw(
        &mut a,
        &lp,
        &[1f32; 5],
        out.as_mut_ptr(),
        (hkv * n) as u64,
        &mut ws,
        wsb,
    );
    assert_eq!(r, KVE_ERR_SHAPE_MISMATCH);
    assert!(out.iter().all(|&v| v == canary));
    // out over the state
    let over = a.state.bytes().as_mut_ptr() as *mut f32;
    let r = raw(&mut a, &p, &[], over, (hkv * n) as u64, &mut ws, wsb);
    assert_eq!(r, KVE_ERR_ALIASING);
    let mut cnt = 0u64;
    unsafe {
        assert_eq!(
            kve_stream_query_count(a.state.bytes().as_ptr() as *const _, bytes, &mut cnt),
            KVE_OK
        );
    }
    assert_eq!(cnt, 3);
    assert_eq!(
        call(&mut a, &p, &mut out, (hkv * n) as u64, &mut ws, wsb),
        KVE_OK
    );
    assert!(out[..hkv * n].iter().all(|v| v.is_finite() && *v >= 0.0) && out[hkv * n] == canary);

    // the raw statistics through the C ABI: the core's, and nothing written when short
    let hn = a.hq * n;
    let mut arrays = vec![vec![canary; hn + 1]; 3];
    let mut seen = vec![7u64; n + 1];
    let stats = |a: &mut Abi, arrays: &mut [Vec<f32>], seen: &mut [u64], len: usize| unsafe {
        let [m, s, q] = arrays else { unreachable!() };
        kve_stream_stats(
            a.state.bytes().as_ptr() as *const _,
            bytes,
            m.as_mut_ptr(),
            s.as_mut_ptr(),
            q.as_mut_ptr(),
            len as u64,
            seen.as_mut_ptr(),
            n as u64,
        )
    };
    assert_eq!(
        stats(&mut a, &mut arrays, &mut seen, hn - 1),
        KVE_ERR_OUTPUT_TOO_SMALL
    );
    assert!(arrays.iter().all(|x| x.iter().all(|&v| v == canary)) && seen.iter().all(|&v| v == 7));
    assert_eq!(stats(&mut a, &mut arrays, &mut seen, hn), KVE_OK);
    let want = stream_stats(a.state.bytes()).unwrap();
    assert_eq!(&arrays[0][..hn], want.max);
    assert_eq!(&arrays[1][..hn], want.sum);
    assert_eq!(&arrays[2][..hn], want.sq);
    assert_eq!(&seen[..n], want.seen);
    assert!(arrays.iter().all(|x| x[hn] == canary) && seen[n] == 7);
    // positions 2, 9, 25 with N = 20: last visible keys 2, 9, 19
    let mut expect = vec![0u64; n];
    for l in [2, 9, 19] {
        expect[l] += 1;
    }
    assert_eq!(&seen[..n], &expect[..]);
}

#[test]
fn a_state_sized_for_the_capacity_never_reads_the_unfilled_tail() {
    let mut rng = Rng::new(31);
    let (hkv, g, n, dk, filled) = (2, 3, 64, 16, 40);
    let mut x = layer(&mut rng, hkv, g, n, dk, DType::F32, Layout::TokenMajor);
    // the unfilled tail of the cache holds garbage (NaN)
    for h in 0..hkv {
        for t in filled..n {
            for d in 0..dk {
                let o = x.k.offset(h, t, d);
                x.k.set_flat(o, f64::NAN);
            }
        }
    }
    // decode-time queries at their own positions, all inside the filled part
    let q = queries(&mut rng, x.hq, 6, dk, DType::F32);
    let pos: Vec<i64> = (filled - 6..filled).map(|p| p as i64).collect();
    let mut st = x.feed(&q, &pos, 4, DType::F32, Layout::HeadMajor);
    let r = ref_stats(&q, &pos, &x.kr);
    for stat in [StreamStat::Max, StreamStat::Mean, StreamStat::MeanVisible] {
        let cfg = StreamScoreConfig::new(stat, GqaReduce::Sum);
        let core = x.scores(&mut st, &cfg, &[]);
        assert!(core.iter().all(|v| v.is_finite()), "{stat:?}");
        for kh in 0..hkv {
            assert!(core[kh * n + filled..(kh + 1) * n]
                .iter()
                .all(|&v| v == 0.0));
        }
        close(
            &core,
            &ref_scores(&r, &cfg, hkv, &x.vr, &x.wo),
            n,
            &format!("{stat:?}"),
        );
    }
}

#[test]
fn very_negative_logits_are_finite_in_both_passes() {
    // every logit of every row about -125: exp(z) underflows unless the max is subtracted
    let (hq, hkv, n, dk, w) = (3, 1, 40, 64, 4);
    let mut k = vec![0f32; n * dk];
    for t in 0..n {
        k[t * dk] = 10.0 + t as f32 * 0.01;
    }
    let mut q = vec![0f32; hq * w * dk];
    for r in 0..hq * w {
        q[r * dk] = -100.0;
    }
    let kv = View::f32_contiguous(&k, [hkv, n, dk]).unwrap();
    let qv = View::f32_contiguous(&q, [hq, w, dk]).unwrap();
    let mut cfg = ScoreConfig::preset(Preset::SnapKv);
    cfg.window = w as u32;
    cfg.pool = Pool::NONE;
    let inputs = LayerInputs {
        queries: Some(qv),
        keys: Some(kv),
        ..Default::default()
    };
    let shape = layer_shape(&cfg, &inputs).unwrap();
    let mut want = vec![0f32; score_len(&cfg, &shape).unwrap()];
    let mut ws = vec![0u8; score_workspace_size(&cfg, &shape).unwrap()];
    score_layer(&cfg, &inputs, &mut want, &mut ws).unwrap();
    let sh = StreamShape { hq, hkv, n, dk };
    let mut st = Aligned::new(stream_state_size(&sh).unwrap());
    stream_init(&sh, st.bytes()).unwrap();
    let mut fws = vec![0u8; stream_feed_workspace_size(&sh, w).unwrap()];
    let pos: Vec<i64> = (n - w..n).map(|p| p as i64).collect();
    stream_feed(st.bytes(), &qv, &pos, &kv, None, &mut fws).unwrap();
    let mut got = vec![0f32; n];
    let mut sws = vec![0u8; stream_scores_workspace_size(&sh).unwrap()];
    let scfg = StreamScoreConfig::new(StreamStat::Mean, GqaReduce::Mean);
    stream_scores(
        st.bytes(),
        &scfg,
        &StreamValues::default(),
        &mut got,
        &mut sws,
    )
    .unwrap();
    // keys grow with t, the queries point the other way: the first key's logit is the
    // least negative
    assert!(want[0] > want[1] && want.iter().all(|v| v.is_finite() && *v > 0.0));
    near(
        &got[..n - w],
        &want,
        2e-5,
        "stream vs window at logits near -125",
    );
}
