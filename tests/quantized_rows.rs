//! K/V given as ggml's block-quantized rows (`Q8_0`, `Q4_0`; issue 27): for every preset,
//! scoring the quantized tensors gives bit-identical scores, value statistics and kept
//! lists to scoring the f32 tensors holding their dequantized values (dequantized here,
//! independently, as ggml's `dequantize_row_q8_0` / `dequantize_row_q4_0` do), in
//! head-major and llama.cpp token-row layouts, with K and V of different dtypes;
//! compaction (in place, varlen, the evictor's) moves whole blocks byte for byte, so the
//! compacted tensor dequantizes to the dequantized tensor compacted, and writes no byte
//! outside the kept rows; views of a block type that are not whole-block rows are refused.

use half::f16;
use kvevict::compact::{compact_in_place, compact_varlen};
use kvevict::evictor::{Budget, EvictorConfig, LayerViews, ModelDims, WoUse, PRESETS};
use kvevict::{
    accumulate_value_links, compute_gram, compute_value_forms, compute_value_l1, gram_len,
    score_layer, score_workspace_size, stream_feed, stream_feed_workspace_size, stream_init,
    stream_scores, stream_scores_len, stream_scores_workspace_size, stream_state_size,
    value_forms_len, value_links_workspace_size, window_row_lse, window_row_lse_workspace_size,
    DType, Error, Evictor, LayerInputs, LayerShape, Preset, ScoreConfig, ScorerKind,
    StreamScoreConfig, StreamShape, StreamStat, StreamValues, View, ViewMut,
};

mod xorshift;
use xorshift::Rng;

const DIMS: ModelDims = ModelDims {
    layers: 2,
    hq: 4,
    hkv: 2,
    dk: 64,
    dv: 32,
    d_model: 24,
};
const N: usize = 150;
const SHAPE: LayerShape = LayerShape {
    hq: DIMS.hq,
    hkv: DIMS.hkv,
    n: N,
    dk: DIMS.dk,
    dv: DIMS.dv,
};

/// Bytes per 32-value block.
fn block_bytes(dt: DType) -> usize {
    match dt {
        DType::Q8_0 => 34,
        DType::Q4_0 => 18,
        _ => unreachable!(),
    }
}

/// Random ggml blocks for `values` values (a multiple of 32): a positive f16 scale (values of
/// magnitude up to ~2, as a K/V cache's) and random quants.
fn random_blocks(r: &mut Rng, dt: DType, values: usize) -> Vec<u8> {
    let bb = block_bytes(dt);
    let mut out = vec![0u8; values / 32 * bb];
    for b in out.chunks_exact_mut(bb) {
        let top = if dt == DType::Q8_0 { 127.0 } else { 8.0 };
        let d = (0.25 + 1.75 * (r.next() >> 40) as f32 / (1u64 << 24) as f32) / top;
        b[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for q in &mut b[2..] {
            *q = r.next() as u8;
        }
    }
    out
}

/// ggml's dequantization, written from its definition: x = d · q, d the block's f16 scale as
/// f32; q8_0: q = qs[i] (i8); q4_0: q = (qs[j] & 0xF) − 8 for value j, (qs[j] >> 4) − 8 for
/// value j + 16.
fn dequantize(dt: DType, blocks: &[u8]) -> Vec<f32> {
    let bb = block_bytes(dt);
    let mut out = Vec::with_capacity(blocks.len() / bb * 32);
    for b in blocks.chunks_exact(bb) {
        let d = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
        if dt == DType::Q8_0 {
            out.extend(b[2..].iter().map(|&q| (q as i8) as i32 as f32 * d));
        } else {
            out.extend(b[2..].iter().map(|&q| ((q & 0xF) as i32 - 8) as f32 * d));
            out.extend(b[2..].iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
        }
    }
    out
}

/// How one K or V tensor `[H, n, d]` is stored.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    /// `[H][n][d]`
    HeadMajor,
    /// llama.cpp's cache rows `[n][H·d]`
    TokenRows,
}

impl Layout {
    fn strides(self, h: usize, n: usize, d: usize) -> [usize; 3] {
        match self {
            Layout::HeadMajor => [n * d, d, 1],
            Layout::TokenRows => [d, h * d, 1],
        }
    }
}

/// One K or V tensor in its stored dtype, and the f32 tensor of the same values.
struct Kv {
    dt: DType,
    bytes: Vec<u8>,
    f32s: Vec<f32>,
    extent: [usize; 3],
    stride: [usize; 3],
}

impl Kv {
    fn new(r: &mut Rng, dt: DType, lay: Layout, h: usize, n: usize, d: usize) -> Kv {
        let (bytes, f32s) = match dt {
            DType::Q8_0 | DType::Q4_0 => {
                let b = random_blocks(r, dt, h * n * d);
                let x = dequantize(dt, &b);
                (b, x)
            }
            DType::F16 => {
                let x: Vec<f32> = r
                    .vec(h * n * d)
                    .iter()
                    .map(|&x| f16::from_f32(x).to_f32())
                    .collect();
                let b = x
                    .iter()
                    .flat_map(|&x| f16::from_f32(x).to_bits().to_ne_bytes())
                    .collect();
                (b, x)
            }
            _ => unreachable!(),
        };
        Kv {
            dt,
            bytes,
            f32s,
            extent: [h, n, d],
            stride: lay.strides(h, n, d),
        }
    }
    fn reference(&self) -> View<'_> {
        View::f32(&self.f32s, self.extent, self.stride).unwrap()
    }
}

/// Bytes in 2-byte-aligned storage (`Vec<u8>` promises alignment 1 only).
fn aligned(bytes: &[u8]) -> Vec<u16> {
    assert!(bytes.len() % 2 == 0);
    bytes
        .chunks_exact(2)
        .map(|c| u16::from_ne_bytes([c[0], c[1]]))
        .collect()
}

fn as_bytes(x: &[u16]) -> &[u8] {
    // SAFETY (test): u16 storage read as its bytes.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, x.len() * 2) }
}

fn as_bytes_mut(x: &mut [u16]) -> &mut [u8] {
    // SAFETY (test): u16 storage written as its bytes.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr() as *mut u8, x.len() * 2) }
}

/// One layer's tensors: K and V stored (and as f32), queries and Wo f32.
struct LayerData {
    k: Kv,
    v: Kv,
    k_al: Vec<u16>,
    v_al: Vec<u16>,
    q: Vec<f32>,
    wo: Vec<f32>,
}

impl LayerData {
    fn new(seed: u64, kdt: DType, vdt: DType, lay: Layout) -> LayerData {
        let mut r = Rng::seeded(seed);
        let d = DIMS;
        let k = Kv::new(&mut r, kdt, lay, d.hkv, N, d.dk);
        let v = Kv::new(&mut r, vdt, lay, d.hkv, N, d.dv);
        let (k_al, v_al) = (aligned(&k.bytes), aligned(&v.bytes));
        LayerData {
            k,
            v,
            k_al,
            v_al,
            q: r.vec(d.hq * N * d.dk),
            wo: r
                .vec(d.hq * d.dv * d.d_model)
                .iter()
                .map(|x| x * 0.3)
                .collect(),
        }
    }
    /// K and V as stored (`true`) or as their f32 values.
    fn kv(&self, stored: bool) -> (View<'_>, View<'_>) {
        if stored {
            (
                View::bytes(
                    as_bytes(&self.k_al),
                    self.k.dt,
                    self.k.extent,
                    self.k.stride,
                )
                .unwrap(),
                View::bytes(
                    as_bytes(&self.v_al),
                    self.v.dt,
                    self.v.extent,
                    self.v.stride,
                )
                .unwrap(),
            )
        } else {
            (self.k.reference(), self.v.reference())
        }
    }
    /// Queries of positions `a..b`.
    fn queries(&self, a: usize, b: usize) -> View<'_> {
        let dk = DIMS.dk;
        View::f32(&self.q[a * dk..], [DIMS.hq, b - a, dk], [N * dk, dk, 1]).unwrap()
    }
    fn wo(&self) -> View<'_> {
        View::f32_contiguous(&self.wo, [DIMS.hq, DIMS.dv, DIMS.d_model]).unwrap()
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|x| x.to_bits()).collect()
}

/// Everything a preset's scorer computes from one layer's K/V: the scores, and the value
/// statistics around them (Gram value forms, CriticalKV's L1, value links, the row LSE).
fn stage_outputs(pr: Preset, x: &LayerData, stored: bool) -> Vec<(&'static str, Vec<u32>)> {
    let d = DIMS;
    let mut sc = ScoreConfig::preset(pr);
    let w = (sc.window as usize).min(N);
    let cross = sc.laprox_gqa != kvevict::LaproxGqa::Sum;
    let (keys, values) = x.kv(stored);
    let shape = SHAPE;
    let mut ws = vec![0u8; score_workspace_size(&sc, &shape).unwrap() + (1 << 16)];
    let mut gram = vec![0f32; gram_len(d.hq, d.hkv, d.dv, cross).unwrap()];
    compute_gram(&x.wo(), d.hkv, cross, &mut gram, &mut ws).unwrap();
    let mut l1 = vec![0f32; d.hkv * N];
    compute_value_l1(&values, &x.wo(), &mut l1, &mut ws).unwrap();
    let mut out = Vec::new();
    let mut inputs = LayerInputs {
        keys: Some(keys),
        queries: Some(x.queries(N - w, N)),
        values: Some(values),
        ..Default::default()
    };
    match sc.scorer {
        ScorerKind::LaProx => inputs.gram = Some(&gram),
        ScorerKind::CriticalKv => {
            if sc.critical_first_stage == 0 {
                sc.critical_first_stage = 20;
            }
            inputs.value_l1 = Some(&l1);
        }
        _ => {}
    }
    let mut scores = vec![0f32; d.hkv * (N - w)];
    score_layer(&sc, &inputs, &mut scores, &mut ws).unwrap();
    out.push(("scores", bits(&scores)));
    out.push(("value_l1", bits(&l1)));
    if sc.scorer == ScorerKind::LaProx {
        let mut forms = vec![0f32; value_forms_len(d.hq, d.hkv, N, cross).unwrap()];
        compute_value_forms(&values, &gram, d.hq, cross, 0, N, &mut forms).unwrap();
        out.push(("value_forms", bits(&forms)));
        let with_forms = LayerInputs {
            gram: None,
            value_forms: Some(&forms),
            ..inputs
        };
        score_layer(&sc, &with_forms, &mut scores, &mut ws).unwrap();
        out.push(("scores from forms", bits(&scores)));
    }
    if sc.needs_queries() {
        let mut lse = vec![0f32; d.hq * w];
        let mut lws = vec![0u8; window_row_lse_workspace_size(&shape, w as u32).unwrap()];
        window_row_lse(&x.queries(N - w, N), &keys, w as u32, &mut lse, &mut lws).unwrap();
        out.push(("row lse", bits(&lse)));
        let with_lse = LayerInputs {
            row_lse: Some(&lse),
            ..inputs
        };
        score_layer(&sc, &with_lse, &mut scores, &mut ws).unwrap();
        out.push(("scores with lse", bits(&scores)));
    }
    let mut links = vec![0f32; N];
    let mut lk = vec![0u8; value_links_workspace_size(N, d.dv).unwrap()];
    accumulate_value_links(&values, &mut links, &mut lk).unwrap();
    out.push(("value links", bits(&links)));
    out
}

const PAIRS: [(DType, DType); 5] = [
    (DType::Q8_0, DType::Q8_0),
    (DType::Q4_0, DType::Q4_0),
    (DType::Q8_0, DType::F16),
    (DType::F16, DType::Q4_0),
    (DType::Q4_0, DType::Q8_0),
];

/// For every preset, dtype pair and layout, the stage calls on quantized K/V give the same
/// bits as on the f32 tensors of their dequantized values.
#[test]
fn stage_outputs_equal_the_dequantized_f32_ones() {
    for (i, &(kdt, vdt)) in PAIRS.iter().enumerate() {
        for lay in [Layout::HeadMajor, Layout::TokenRows] {
            let x = LayerData::new(i as u64 + 3, kdt, vdt, lay);
            for &(name, pr) in &PRESETS {
                let got = stage_outputs(pr, &x, true);
                let want = stage_outputs(pr, &x, false);
                for ((what, g), (_, w)) in got.iter().zip(&want) {
                    assert!(g == w, "{name} K {kdt:?} V {vdt:?} {lay:?}: {what} differ");
                }
            }
        }
    }
}

/// Query streams (`stream_feed` / `stream_scores`, LaProx's value term from values and the
/// Gram) read quantized keys and values as their values.
#[test]
fn query_stream_reads_dequantized_rows() {
    let x = LayerData::new(11, DType::Q4_0, DType::Q8_0, Layout::TokenRows);
    let d = DIMS;
    let run = |stored: bool| {
        let (keys, values) = x.kv(stored);
        let shape = StreamShape {
            hq: d.hq,
            hkv: d.hkv,
            n: N,
            dk: d.dk,
        };
        let mut state = vec![0u8; stream_state_size(&shape).unwrap()];
        stream_init(&shape, &mut state).unwrap();
        let mut ws = vec![0u8; stream_feed_workspace_size(&shape, 40).unwrap()];
        let positions: Vec<i64> = (N as i64 - 40..N as i64).collect();
        stream_feed(
            &mut state,
            &x.queries(N - 40, N),
            &positions,
            &keys,
            None,
            &mut ws,
        )
        .unwrap();
        let mut gram = vec![0f32; gram_len(d.hq, d.hkv, d.dv, false).unwrap()];
        let mut gws = vec![0u8; 1 << 16];
        compute_gram(&x.wo(), d.hkv, false, &mut gram, &mut gws).unwrap();
        let vals = StreamValues {
            values: Some(values),
            gram: Some(&gram),
            value_forms: None,
        };
        let mut out = vec![0f32; stream_scores_len(&shape).unwrap()];
        let mut sws = vec![0u8; stream_scores_workspace_size(&shape).unwrap()];
        let mut all = Vec::new();
        for stat in [StreamStat::Max, StreamStat::Mean, StreamStat::LaProx] {
            let cfg = StreamScoreConfig::new(stat, kvevict::GqaReduce::Max);
            stream_scores(&state, &cfg, &vals, &mut out, &mut sws).unwrap();
            all.extend(bits(&out));
        }
        all
    };
    assert_eq!(run(true), run(false));
}

fn config(preset: Preset) -> EvictorConfig {
    let budget = Budget::KeepRatio {
        ratio: 0.3,
        min_keep: 8,
    };
    EvictorConfig::new(preset, DIMS, N, budget)
}

/// One evictor round over `layers` (K/V stored or f32): every unit's kept list, then every
/// layer's K and V after `Evictor::compact` (a copy each), as the bits of their values.
fn evictor_round(
    preset: Preset,
    layers: &[LayerData],
    stored: bool,
) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let c = config(preset);
    let mut mem = vec![0xEEu8; Evictor::memory_size(&c).unwrap()];
    let mut ev = Evictor::init(&mut mem, &c).unwrap();
    let needs = ev.needs();
    if needs.capture.wo == WoUse::Once {
        for (l, x) in layers.iter().enumerate() {
            ev.set_output_projection(l, &x.wo()).unwrap();
        }
    }
    let w = (needs.window as usize).min(N);
    let target = ev.plan(0, N).unwrap();
    ev.begin(0, N, target).unwrap();
    for (l, x) in layers.iter().enumerate() {
        let cap = needs.capture;
        let (keys, values) = x.kv(stored);
        let views = LayerViews {
            keys,
            values: cap.values.then_some(values),
            queries: cap.queries.then(|| x.queries(N - w, N)),
            row_lse: None,
            wo: (cap.wo == WoUse::EveryRound).then(|| x.wo()),
        };
        ev.score_layer(0, l, &views).unwrap();
    }
    ev.select(0).unwrap();
    let k = ev.kept(0).unwrap();
    let kept = (0..k.offsets.len() - 1)
        .map(|u| k.indices[k.offsets[u] as usize..k.offsets[u + 1] as usize].to_vec())
        .collect();
    let mut compacted = Vec::new();
    for (l, x) in layers.iter().enumerate() {
        for (t, al) in [(&x.k, &x.k_al), (&x.v, &x.v_al)] {
            let values = if stored {
                let mut b = al.clone();
                let mut kv =
                    ViewMut::bytes(as_bytes_mut(&mut b), t.dt, t.extent, t.stride).unwrap();
                ev.compact(0, l, &mut kv).unwrap();
                match t.dt {
                    DType::F16 => b.iter().map(|&h| f16::from_bits(h).to_f32()).collect(),
                    dt => dequantize(dt, as_bytes(&b)),
                }
            } else {
                let mut f = t.f32s.clone();
                ev.compact(0, l, &mut ViewMut::f32(&mut f, t.extent, t.stride).unwrap())
                    .unwrap();
                f
            };
            compacted.push(bits(&values));
        }
    }
    (kept, compacted)
}

/// The evictor keeps the same cells from quantized K/V as from their f32 values, for every
/// preset (each layer with its own dtype pair), and its compaction moves the same rows.
#[test]
fn evictor_keeps_the_same_cells() {
    let layers: Vec<LayerData> = (0..DIMS.layers)
        .map(|l| {
            let (kdt, vdt) = PAIRS[l % PAIRS.len()];
            LayerData::new(20 + l as u64, kdt, vdt, Layout::TokenRows)
        })
        .collect();
    for &(name, pr) in &PRESETS {
        let (got, got_kv) = evictor_round(pr, &layers, true);
        let (want, want_kv) = evictor_round(pr, &layers, false);
        assert_eq!(got, want, "{name}");
        assert!(got.iter().all(|k| k.len() < N), "{name}: nothing evicted");
        assert!(got_kv == want_kv, "{name}: compacted K/V differ");
    }
}

/// Non-finite scales (an f16 Inf or NaN `d`) are non-finite values: the scorers that read
/// the tensor refuse it with nothing written.
#[test]
fn non_finite_scales_are_refused() {
    let x = LayerData::new(5, DType::Q8_0, DType::Q4_0, Layout::HeadMajor);
    let d = DIMS;
    for bad in [0x7C00u16, 0xFE00] {
        for pr in [
            Preset::SnapKv,
            Preset::KNorm,
            Preset::Tova,
            Preset::Lava,
            Preset::Uniqueness,
        ] {
            let sc = ScoreConfig::preset(pr);
            let w = (sc.window as usize).min(N);
            let mut k = x.k_al.clone();
            let mut v = x.v_al.clone();
            // block 3 of K (inside the prefix), block 5 of V
            k[3 * 17] = bad;
            v[5 * 9] = bad;
            let keys = View::bytes(as_bytes(&k), x.k.dt, x.k.extent, x.k.stride).unwrap();
            let values = View::bytes(as_bytes(&v), x.v.dt, x.v.extent, x.v.stride).unwrap();
            let clean_k = x.kv(true).0;
            let shape = SHAPE;
            let mut ws = vec![0u8; score_workspace_size(&sc, &shape).unwrap()];
            let mut out = vec![-3.25f32; d.hkv * (N - w)];
            let inputs = LayerInputs {
                keys: Some(keys),
                queries: Some(x.queries(N - w, N)),
                values: Some(values),
                ..Default::default()
            };
            assert_eq!(
                score_layer(&sc, &inputs, &mut out, &mut ws),
                Err(Error::NonFinite),
                "{pr:?} bad K scale {bad:#x}"
            );
            if sc.scorer == ScorerKind::Lava || sc.scorer == ScorerKind::Uniqueness {
                let inputs = LayerInputs {
                    keys: Some(clean_k),
                    ..inputs
                };
                assert_eq!(
                    score_layer(&sc, &inputs, &mut out, &mut ws),
                    Err(Error::NonFinite),
                    "{pr:?} bad V scale {bad:#x}"
                );
            }
            assert!(out.iter().all(|&x| x == -3.25));
        }
    }
}

/// A view of a block type must be whole-block rows: row length and outer strides
/// multiples of 32, unit value stride, `len` whole blocks; else `InvalidArgument`
/// (`Misaligned` for an odd address, `OutOfBounds` past the buffer).
#[test]
fn views_must_be_whole_block_rows() {
    for dt in [DType::Q8_0, DType::Q4_0] {
        let bb = block_bytes(dt);
        let store = vec![0u16; 4 * 8 * bb / 2 + 1]; // 32 blocks, and a spare u16
        let b = &as_bytes(&store)[..32 * bb];
        let ok = |e: [usize; 3], s: [usize; 3]| View::bytes(b, dt, e, s).map(|_| ());
        let bad = Err(Error::InvalidArgument);
        let cases = [
            ([4, 4, 64], [256, 64, 1], Ok(()), "head-major"),
            ([4, 8, 32], [32, 128, 1], Ok(()), "token rows"),
            ([4, 1, 32], [0, 7, 1], bad, "token stride 7"),
            ([4, 4, 64], [256, 64, 2], bad, "value stride 2"),
            ([4, 4, 48], [256, 64, 1], bad, "row of 48"),
            ([4, 4, 64], [240, 64, 1], bad, "head stride 240"),
            ([4, 64, 4], [256, 1, 64], bad, "transposed"),
            (
                [5, 4, 64],
                [256, 64, 1],
                Err(Error::OutOfBounds),
                "past the buffer",
            ),
        ];
        for (e, st, want, what) in cases {
            assert_eq!(ok(e, st), want, "{dt:?} {what}");
        }
        assert_eq!(
            View::bytes(&b[..b.len() - 1], dt, [1, 1, 32], [32, 32, 1]).map(|_| ()),
            Err(Error::InvalidArgument),
            "a partial block"
        );
        let odd = &as_bytes(&store)[1..1 + 32 * bb];
        assert_eq!(
            View::bytes(odd, dt, [1, 1, 32], [32, 32, 1]).map(|_| ()),
            Err(Error::Misaligned)
        );
        // SAFETY (test): 32 blocks of `store`; len of 33 values is not whole blocks
        let partial = unsafe { View::from_raw(b.as_ptr(), 33, dt, [1, 1, 32], [32, 32, 1]) };
        assert_eq!(partial.map(|_| ()), Err(Error::InvalidArgument));
        assert_eq!(dt.bytes(64), Some(2 * bb));
        assert_eq!(
            View::bytes(b, dt, [4, 4, 64], [256, 64, 1])
                .unwrap()
                .byte_range()
                .1
                - b.as_ptr() as usize,
            32 * bb
        );
    }
}

/// Element access (`View::get`, the path of strided reads) dequantizes each value from its
/// block as whole-row loads do.
#[test]
fn element_reads_equal_row_loads() {
    let mut r = Rng(9);
    for dt in [DType::Q8_0, DType::Q4_0] {
        let b = aligned(&random_blocks(&mut r, dt, 3 * 5 * 64));
        let want = dequantize(dt, as_bytes(&b));
        let v = View::bytes(as_bytes(&b), dt, [3, 5, 64], [320, 64, 1]).unwrap();
        let mut row = vec![0f32; 64];
        for h in 0..3 {
            for t in 0..5 {
                v.load_row(h, t, &mut row);
                for c in 0..64 {
                    let x = want[h * 320 + t * 64 + c];
                    assert_eq!(row[c].to_bits(), x.to_bits(), "{dt:?} row");
                    assert_eq!(v.get(h, t, c).to_bits(), x.to_bits(), "{dt:?} get");
                }
            }
        }
    }
}

/// A random selection of `heads` ascending lists over `n` tokens, offsets absolute into
/// `indices` (which starts with 5 entries no list uses).
fn selection(r: &mut Rng, heads: usize, n: usize) -> (Vec<u64>, Vec<u32>) {
    let mut idx = vec![7u32; 5];
    let mut off = vec![5u64];
    for _ in 0..heads {
        let p = 1 + r.next() % 3; // keep about 1/p of the tokens
        idx.extend((0..n as u32).filter(|_| r.next() % p == 0));
        off.push(idx.len() as u64);
    }
    (off, idx)
}

/// Byte range of row `(h, t)` of a block-type tensor (`d` values from a block boundary).
fn row_range(dt: DType, st: [usize; 3], d: usize, h: usize, t: usize) -> std::ops::Range<usize> {
    let bb = block_bytes(dt);
    let a = (h * st[0] + t * st[1]) / 32 * bb;
    a..a + d / 32 * bb
}

/// In-place compaction moves whole blocks: the quantized tensor after it dequantizes to the
/// dequantized tensor compacted (the whole buffer, bit for bit), each kept row is its
/// source row's bytes, and every byte outside the kept rows (the rows past each head's
/// count, padding blocks between rows, the buffer's tail) is untouched.
#[test]
fn compact_in_place_moves_whole_blocks() {
    let mut r = Rng(31);
    let (h, n, d) = (3, 50, 64);
    for dt in [DType::Q8_0, DType::Q4_0] {
        // head-major with a padding block after every row, and llama.cpp's token rows
        for (st, len) in [
            ([n * (d + 32), d + 32, 1], h * n * (d + 32) + 64),
            ([d, h * d, 1], n * h * d),
        ] {
            let orig = aligned(&random_blocks(&mut r, dt, len));
            let (off, idx) = selection(&mut r, h, n);
            let mut q = orig.clone();
            let mut lengths = vec![0u32; h];
            let mut view = ViewMut::bytes(as_bytes_mut(&mut q), dt, [h, n, d], st).unwrap();
            compact_in_place(&mut view, &off, &idx, Some(&mut lengths)).unwrap();
            let mut f = dequantize(dt, as_bytes(&orig));
            let mut fv = ViewMut::f32(&mut f, [h, n, d], st).unwrap();
            compact_in_place(&mut fv, &off, &idx, None).unwrap();
            assert!(
                bits(&dequantize(dt, as_bytes(&q))) == bits(&f),
                "{dt:?} {st:?}"
            );
            let (before, after) = (as_bytes(&orig), as_bytes(&q));
            let mut moved = vec![false; after.len()];
            for hh in 0..h {
                let list = &idx[off[hh] as usize..off[hh + 1] as usize];
                assert_eq!(lengths[hh] as usize, list.len());
                for (i, &t) in list.iter().enumerate() {
                    let (to, from) = (
                        row_range(dt, st, d, hh, i),
                        row_range(dt, st, d, hh, t as usize),
                    );
                    assert_eq!(
                        after[to.clone()],
                        before[from],
                        "{dt:?} {st:?} head {hh} row {i}"
                    );
                    moved[to].fill(true);
                }
            }
            for (i, m) in moved.iter().enumerate() {
                assert!(
                    *m || after[i] == before[i],
                    "{dt:?} {st:?}: byte {i} written"
                );
            }
        }
    }
}

/// Varlen compaction copies whole blocks: `dst` dequantizes to the dequantized compaction,
/// and its rows past the kept ones are untouched; block types refuse a `dst` of another
/// dtype or a source with swapped axes.
#[test]
fn compact_varlen_moves_whole_blocks() {
    let mut r = Rng(37);
    let (h, n, d) = (2, 64, 96);
    for dt in [DType::Q8_0, DType::Q4_0] {
        let st = [d, h * d, 1];
        let src = aligned(&random_blocks(&mut r, dt, n * h * d));
        let (off, idx) = selection(&mut r, h, n);
        let total = idx.len() - 5;
        let cap = total + 3;
        let orig = aligned(&random_blocks(&mut r, dt, cap * d));
        let mut dst = orig.clone();
        let (mut cu, mut fcu) = (vec![0i32; h + 1], vec![0i32; h + 1]);
        let sv = View::bytes(as_bytes(&src), dt, [h, n, d], st).unwrap();
        let dstd = [1, cap, d];
        let mut dv = ViewMut::bytes(as_bytes_mut(&mut dst), dt, dstd, [cap * d, d, 1]).unwrap();
        compact_varlen(&sv, &off, &idx, &mut dv, &mut cu).unwrap();
        let fsrc = dequantize(dt, as_bytes(&src));
        let mut fdst = dequantize(dt, as_bytes(&orig));
        let fsv = View::f32(&fsrc, [h, n, d], st).unwrap();
        let mut fdv = ViewMut::f32(&mut fdst, dstd, [cap * d, d, 1]).unwrap();
        compact_varlen(&fsv, &off, &idx, &mut fdv, &mut fcu).unwrap();
        assert_eq!(cu, fcu);
        assert!(
            bits(&dequantize(dt, as_bytes(&dst))) == bits(&fdst),
            "{dt:?}"
        );
        let tail = total * d / 32 * block_bytes(dt);
        assert_eq!(
            as_bytes(&dst)[tail..],
            as_bytes(&orig)[tail..],
            "{dt:?}: rows past the kept ones"
        );
        // another dtype, or the source's axes swapped: refused, nothing written
        let other = if dt == DType::Q8_0 {
            DType::Q4_0
        } else {
            DType::Q8_0
        };
        let mut o = aligned(&random_blocks(&mut r, other, cap * d));
        let mut ov = ViewMut::bytes(as_bytes_mut(&mut o), other, dstd, [cap * d, d, 1]).unwrap();
        let before = dst.clone();
        assert_eq!(
            compact_varlen(&sv, &off, &idx, &mut ov, &mut cu),
            Err(Error::ShapeMismatch)
        );
        let swapped = View::bytes(as_bytes(&src), dt, [h, d, n], [d, 1, h * d]);
        assert_eq!(swapped.map(|_| ()), Err(Error::InvalidArgument));
        let sw = View::bytes(as_bytes(&src), dt, [h, n, d], st)
            .unwrap()
            .swap_last();
        let mut o = aligned(&random_blocks(&mut r, dt, cap * n));
        let o_before = o.clone();
        let mut ov =
            ViewMut::bytes(as_bytes_mut(&mut o), dt, [1, cap, n], [cap * n, n, 1]).unwrap();
        assert_eq!(
            compact_varlen(&sw, &off, &idx, &mut ov, &mut cu),
            Err(Error::InvalidArgument)
        );
        assert_eq!(o, o_before);
        assert_eq!(dst, before);
    }
}
