//! The evictor against the stage calls by hand: for every preset and granularity, the
//! policies, several sequences and the query ring, its kept sets are bit-identical to
//! `score_layer` per layer → (`accumulate_value_links`) → `select_model(_linked)`; and on
//! hostile input every entry point returns a clear status with the context unchanged.

use kvevict::evictor::{Budget, EvictorConfig, LayerViews, ModelDims, WoUse, PRESETS};
use kvevict::{
    accumulate_value_links, compute_gram, compute_value_l1, gram_len, score_layer,
    score_workspace_size, select_model, select_model_linked, select_output_len,
    select_workspace_size, Error, Evictor, Granularity, LayerInputs, LayerShape, ModelScores,
    Preset, ScoreConfig, ScorerKind, SelectConfig, ValueLinks, View, ViewMut,
};

mod xorshift;
use xorshift::Rng;

const DIMS: ModelDims = ModelDims {
    layers: 3,
    hq: 4,
    hkv: 2,
    dk: 16,
    dv: 8,
    d_model: 24,
};
const MAX_CELLS: usize = 160;

/// One sequence's tensors: per layer queries `[Hq][n][dk]` (every position), keys
/// `[Hkv][n][dk]`, values `[Hkv][n][dv]`, and `Wo` `[Hq][dv][D]`.
struct Seq {
    n: usize,
    q: Vec<Vec<f32>>,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

fn seq(n: usize, seed: u64) -> Seq {
    let mut r = Rng::seeded(seed);
    let d = DIMS;
    Seq {
        n,
        q: (0..d.layers).map(|_| r.vec(d.hq * n * d.dk)).collect(),
        k: (0..d.layers).map(|_| r.vec(d.hkv * n * d.dk)).collect(),
        v: (0..d.layers).map(|_| r.vec(d.hkv * n * d.dv)).collect(),
    }
}

fn wo_of(layer: usize) -> Vec<f32> {
    Rng(77 + layer as u64).vec(DIMS.hq * DIMS.dv * DIMS.d_model)
}

impl Seq {
    fn keys(&self, l: usize) -> View<'_> {
        View::f32_contiguous(&self.k[l], [DIMS.hkv, self.n, DIMS.dk]).unwrap()
    }
    fn values(&self, l: usize) -> View<'_> {
        View::f32_contiguous(&self.v[l], [DIMS.hkv, self.n, DIMS.dv]).unwrap()
    }
    /// Query rows `a..b` of layer `l`.
    fn queries(&self, l: usize, a: usize, b: usize) -> View<'_> {
        let (n, dk) = (self.n, DIMS.dk);
        View::f32(&self.q[l][a * dk..], [DIMS.hq, b - a, dk], [n * dk, dk, 1]).unwrap()
    }
}

fn config(preset: Preset, g: Option<Granularity>, budget: Budget) -> EvictorConfig {
    let mut c = EvictorConfig::new(preset, DIMS, MAX_CELLS, budget);
    c.granularity = g;
    c
}

/// The kept lists of every (layer, KV head), by the stage calls by hand, for a round over
/// cells `start..n` of `s` keeping `budget` prefix cells per unit.
fn by_hand(c: &EvictorConfig, s: &Seq, start: usize, budget: u64) -> Vec<Vec<u32>> {
    let d = DIMS;
    let mut sc = c.score.unwrap_or(ScoreConfig::preset(c.preset));
    if c.window != 0 {
        sc.window = c.window;
    }
    let n = s.n;
    let w = (sc.window as usize).min(n);
    if c.score.is_none() && sc.scorer == ScorerKind::CriticalKv {
        // kvpress's first stage, as python's select_kept sets it
        sc.critical_first_stage = ((budget as usize + w) / 2).max(1).saturating_sub(w) as u32;
    }
    let p = n - w;
    let shape = LayerShape {
        hq: d.hq,
        hkv: d.hkv,
        n,
        dk: d.dk,
        dv: d.dv,
    };
    let mut ws = vec![0u8; score_workspace_size(&sc, &shape).unwrap() + (1 << 16)];
    let mut scores = vec![0f32; d.layers * d.hkv * p];
    let mut links = vec![0f32; n];
    let cross = sc.laprox_gqa != kvevict::LaproxGqa::Sum;
    for l in 0..d.layers {
        let wo = wo_of(l);
        let wo = View::f32_contiguous(&wo, [d.hq, d.dv, d.d_model]).unwrap();
        let mut gram = vec![0f32; gram_len(d.hq, d.hkv, d.dv, cross).unwrap()];
        let mut l1 = vec![0f32; d.hkv * n];
        let mut inputs = LayerInputs {
            keys: Some(s.keys(l)),
            queries: Some(s.queries(l, n - w, n)),
            values: Some(s.values(l)),
            ..Default::default()
        };
        match sc.scorer {
            ScorerKind::LaProx => {
                compute_gram(&wo, d.hkv, cross, &mut gram, &mut ws).unwrap();
                inputs.gram = Some(&gram);
            }
            ScorerKind::CriticalKv => {
                compute_value_l1(&s.values(l), &wo, &mut l1, &mut ws).unwrap();
                inputs.value_l1 = Some(&l1);
            }
            _ => {}
        }
        score_layer(
            &sc,
            &inputs,
            &mut scores[l * d.hkv * p..][..d.hkv * p],
            &mut ws,
        )
        .unwrap();
        if c.link_threshold.is_some() {
            accumulate_value_links(&s.values(l), &mut links, &mut ws).unwrap();
        }
    }
    let mut sel = c
        .select
        .unwrap_or(kvevict::evictor::default_select(c.preset, 0));
    if let Some(g) = c.granularity {
        sel.granularity = g;
    }
    sel.budget = budget;
    let (m, units) = (n - start, d.layers * d.hkv);
    let ps = m - w.min(m);
    let span: Vec<f32> = (0..units)
        .flat_map(|u| scores[u * p + start..u * p + start + ps].to_vec())
        .collect();
    let ms = ModelScores {
        scores: &span,
        layers: d.layers,
        hkv: d.hkv,
        n: m,
        window: sc.window as usize,
    };
    let (no, ni) = select_output_len(&sel, d.layers, d.hkv, m, sc.window as usize).unwrap();
    let (mut off, mut idx) = (vec![0u64; no], vec![0u32; ni]);
    let mut sws = vec![0u8; select_workspace_size(&sel, d.layers, d.hkv, m, w).unwrap()];
    match c.link_threshold {
        Some(threshold) => {
            let vl = ValueLinks {
                sums: &links[start..],
                threshold,
            };
            select_model_linked(&sel, &ms, vl, &mut off, &mut idx, &mut sws).unwrap()
        }
        None => select_model(&sel, &ms, &mut off, &mut idx, &mut sws).unwrap(),
    }
    (0..units)
        .map(|u| {
            let span = idx[off[u] as usize..off[u + 1] as usize]
                .iter()
                .map(|&i| i + start as u32);
            (0..start as u32).chain(span).collect()
        })
        .collect()
}

fn lists(ev: &mut Evictor, seq: usize) -> Vec<Vec<u32>> {
    let k = ev.kept(seq).unwrap();
    (0..k.offsets.len() - 1)
        .map(|u| k.indices[k.offsets[u] as usize..k.offsets[u + 1] as usize].to_vec())
        .collect()
}

/// Set every layer's `Wo` the method reads once.
fn setup(ev: &mut Evictor) {
    if ev.needs().capture.wo == WoUse::Once {
        for l in 0..DIMS.layers {
            let wo = wo_of(l);
            let wo = View::f32_contiguous(&wo, [DIMS.hq, DIMS.dv, DIMS.d_model]).unwrap();
            ev.set_output_projection(l, &wo).unwrap();
        }
    }
}

/// One round on `seq` of `s` to `target` cells; queries from the ring when `ring`.
fn round(ev: &mut Evictor, seq: usize, s: &Seq, target: usize, ring: bool) -> Vec<Vec<u32>> {
    let needs = ev.needs();
    let w = (needs.window as usize).min(s.n);
    ev.begin(seq, s.n, target).unwrap();
    let wos: Vec<Vec<f32>> = (0..DIMS.layers).map(wo_of).collect();
    for l in [2, 0, 1] {
        let cap = needs.capture;
        let views = LayerViews {
            keys: s.keys(l),
            values: cap.values.then(|| s.values(l)),
            queries: (cap.queries && !ring).then(|| s.queries(l, s.n - w, s.n)),
            row_lse: None,
            wo: (cap.wo == WoUse::EveryRound)
                .then(|| View::f32_contiguous(&wos[l], [DIMS.hq, DIMS.dv, DIMS.d_model]).unwrap()),
        };
        ev.score_layer(seq, l, &views).unwrap();
    }
    ev.select(seq).unwrap();
    lists(ev, seq)
}

fn evictor(c: &EvictorConfig) -> Evictor<'static> {
    // (test) a fresh buffer, leaked: it outlives the evictor
    let mem = vec![0xEE; Evictor::memory_size(c).unwrap()].leak();
    let mut ev = Evictor::init(mem, c).unwrap();
    setup(&mut ev);
    ev
}

#[test]
fn every_preset_and_granularity_matches_the_stage_calls() {
    let s = seq(150, 1);
    for &(name, preset) in &PRESETS {
        // the preset's own granularity, then each
        for g in std::iter::once(None).chain(Granularity::ALL.iter().copied().map(Some)) {
            let c = config(preset, g, Budget::Explicit);
            let mut ev = evictor(&c);
            let w = ev.needs().window as usize;
            let target = 40.max(w + 1);
            let kept = round(&mut ev, 0, &s, target, false);
            let want = by_hand(&c, &s, 0, (target - w) as u64);
            assert_eq!(kept, want, "{name} {g:?}");
            assert!(
                kept.iter().all(|k| k.len() < s.n),
                "{name}: nothing evicted"
            );
        }
    }
}

#[test]
fn value_links_and_overrides_match_the_stage_calls() {
    let s = seq(150, 2);
    let mut c = config(Preset::LaProxSpan, None, Budget::Explicit);
    c.link_threshold = Some(kvevict::LINK_THRESHOLD);
    let mut ev = evictor(&c);
    assert!(ev.needs().capture.values);
    assert_eq!(round(&mut ev, 0, &s, 30, false), by_hand(&c, &s, 0, 22));
    // explicit parameters, the window overridden
    let mut c = config(Preset::SnapKv, None, Budget::Explicit);
    c.score = Some(ScoreConfig {
        pool: kvevict::Pool::avg(3),
        ..ScoreConfig::preset(Preset::Lava)
    });
    c.select = Some(SelectConfig::new(
        kvevict::AllocatorKind::Ada,
        Granularity::Head,
        0,
    ));
    c.window = 12;
    let mut ev = evictor(&c);
    assert_eq!(round(&mut ev, 0, &s, 50, false), by_hand(&c, &s, 0, 38));
    // a criticalkv given as parameters keeps its own first stage
    c.score = Some(ScoreConfig::preset(Preset::CriticalKv));
    let mut ev = evictor(&c);
    assert_eq!(round(&mut ev, 0, &s, 50, false), by_hand(&c, &s, 0, 38));
}

#[test]
fn the_query_ring_gives_the_same_kept_set() {
    let s = seq(130, 3);
    for preset in [
        Preset::SnapKv,
        Preset::LaProxSpan,
        Preset::CriticalKv,
        Preset::Tova,
    ] {
        let c = config(preset, None, Budget::Explicit);
        let mut ev = evictor(&c);
        // a prefill of 100 rows, then decode rows one or a few at a time
        for l in 0..DIMS.layers {
            ev.observe_queries(0, l, &s.queries(l, 0, 100)).unwrap();
            let mut a = 100;
            for step in [1, 3, 1, 25] {
                ev.observe_queries(0, l, &s.queries(l, a, a + step))
                    .unwrap();
                a += step;
            }
            assert_eq!(a, s.n);
        }
        let w = ev.needs().window as usize;
        let from_ring = round(&mut ev, 0, &s, 70, true);
        assert_eq!(from_ring, by_hand(&c, &s, 0, (70 - w) as u64), "{preset:?}");
        // unprotect keeps the ring (the same round again); reset forgets it
        ev.unprotect(0).unwrap();
        assert_eq!(round(&mut ev, 0, &s, 70, true), from_ring, "{preset:?}");
        ev.reset(0).unwrap();
        ev.begin(0, s.n, 70).unwrap();
        let keys_only = LayerViews {
            keys: s.keys(0),
            values: Some(s.values(0)),
            queries: None,
            row_lse: None,
            wo: None,
        };
        assert!(ev.score_layer(0, 0, &keys_only).is_err(), "{preset:?}");
    }
}

#[test]
fn keep_ratio_compresses_only_what_is_new() {
    let budget = Budget::KeepRatio {
        ratio: 0.5,
        min_keep: 40,
    };
    let c = config(Preset::SnapKv, Some(Granularity::Token), budget);
    let mut ev = evictor(&c);
    // a prompt of 120 keeps floor(120/2) = 60, the window of 32 inside
    let s1 = seq(120, 4);
    assert_eq!(ev.plan(0, 120).unwrap(), 60);
    let kept = round(&mut ev, 0, &s1, 60, false);
    assert_eq!(kept, by_hand(&c, &s1, 0, 28));
    assert!(kept.iter().all(|k| k.len() == 60));
    ev.commit(0).unwrap();
    let st = ev.stats(0).unwrap();
    assert_eq!(
        (st.cells, st.protected, st.evictions, st.cells_evicted),
        (60, 60, 1, 60)
    );
    // a second turn: 60 kept + 100 new; only the new 100 are compressed, to 50
    let s2 = seq(160, 5);
    assert_eq!(ev.plan(0, 160).unwrap(), 110);
    let kept = round(&mut ev, 0, &s2, 110, false);
    assert_eq!(kept, by_hand(&c, &s2, 60, 18));
    let protected: Vec<u32> = (0..60).collect();
    assert!(kept
        .iter()
        .all(|k| k.len() == 110 && k[..60] == protected[..]));
    ev.commit(0).unwrap();
    // a short turn (10 new cells) is left alone; 70 new keep min_keep = 40, not 35
    assert_eq!(ev.plan(0, 120).unwrap(), 120);
    assert_eq!(ev.plan(0, 180).unwrap(), 150);
    assert_eq!(ev.plan(0, 210).unwrap(), 160);
    // unprotect (the engine rewound the sequence): nothing protected, counters kept
    ev.unprotect(0).unwrap();
    let st = ev.stats(0).unwrap();
    assert_eq!((st.cells, st.protected, st.evictions), (0, 0, 2));
    assert_eq!(ev.plan(0, 160).unwrap(), 80);
    // reset: nothing protected, counters cleared
    ev.reset(0).unwrap();
    assert_eq!(ev.stats(0).unwrap(), Default::default());
    assert_eq!(ev.plan(0, 160).unwrap(), 80);
}

#[test]
fn cell_budget_evicts_down_to_low_over_all_cells() {
    let c = config(
        Preset::KNorm,
        Some(Granularity::Token),
        Budget::Cells { high: 120, low: 90 },
    );
    let mut ev = evictor(&c);
    assert_eq!(ev.plan(0, 120).unwrap(), 120);
    assert_eq!(ev.plan(0, 121).unwrap(), 90);
    let s = seq(121, 6);
    let kept = round(&mut ev, 0, &s, 90, false);
    assert_eq!(kept[0].len(), 90);
    ev.commit(0).unwrap();
    // the next round selects over all cells again (nothing protected from a cell budget)
    let s = seq(121, 7);
    let kept = round(&mut ev, 0, &s, 90, false);
    assert_eq!(kept, by_hand(&c, &s, 0, 90 - 32));
    let mut cells = vec![0u32; 121];
    let mut gone = vec![0u32; 121];
    let nk = ev.kept_cells(0, &mut cells).unwrap();
    let ne = ev.evicted_cells(0, &mut gone).unwrap();
    assert_eq!((nk, ne), (90, 31));
    assert_eq!(&cells[..nk], &kept[0][..]);
    assert!(gone[..ne].iter().all(|c| !kept[0].contains(c)));
}

#[test]
fn sequences_are_independent() {
    let mut c = config(Preset::LaProx, None, Budget::Explicit);
    c.max_seqs = 3;
    let mut ev = evictor(&c);
    let (a, b) = (seq(140, 8), seq(100, 9));
    // interleaved: begin both, score alternately
    ev.begin(2, a.n, 50).unwrap();
    ev.begin(0, b.n, 60).unwrap();
    for l in 0..DIMS.layers {
        for (sq, s) in [(2, &a), (0, &b)] {
            let w = 32.min(s.n);
            let v = LayerViews {
                keys: s.keys(l),
                values: Some(s.values(l)),
                queries: Some(s.queries(l, s.n - w, s.n)),
                row_lse: None,
                wo: None,
            };
            ev.score_layer(sq, l, &v).unwrap();
        }
    }
    ev.select(0).unwrap();
    ev.select(2).unwrap();
    assert_eq!(lists(&mut ev, 2), by_hand(&c, &a, 0, 18));
    assert_eq!(lists(&mut ev, 0), by_hand(&c, &b, 0, 28));
    ev.commit(2).unwrap();
    // global allocator per head: ragged, so seq 2 takes no further round until reset
    assert!(ev.stats(2).unwrap().ragged);
    assert_eq!(ev.begin(2, 100, 50), Err(Error::InvalidArgument));
    assert_eq!(ev.stats(1).unwrap(), Default::default());
    ev.reset(2).unwrap();
    ev.begin(2, 100, 50).unwrap();
}

#[test]
fn compaction_moves_the_kept_rows() {
    let c = config(Preset::SnapKv, None, Budget::Explicit);
    let mut ev = evictor(&c);
    let s = seq(100, 10);
    let kept = round(&mut ev, 0, &s, 60, false);
    let mut k = s.k[1].clone();
    let mut kv = ViewMut::f32(
        &mut k,
        [DIMS.hkv, s.n, DIMS.dk],
        [s.n * DIMS.dk, DIMS.dk, 1],
    )
    .unwrap();
    ev.compact(0, 1, &mut kv).unwrap();
    for h in 0..DIMS.hkv {
        for (r, &t) in kept[DIMS.hkv + h].iter().enumerate() {
            let at = |i: usize| (h * s.n + i) * DIMS.dk;
            assert_eq!(
                &k[at(r)..at(r) + DIMS.dk],
                &s.k[1][at(t as usize)..at(t as usize) + DIMS.dk]
            );
        }
    }
}

/// `f` fails with `e` and leaves the context (and what it was given to write) as it was.
fn refused<T: std::fmt::Debug>(
    ev: &mut Evictor,
    e: Error,
    f: impl FnOnce(&mut Evictor) -> Result<T, Error>,
) {
    let before = ev.context_bytes().to_vec();
    let got = f(ev);
    assert_eq!(got.as_ref().err(), Some(&e), "{got:?}");
    assert!(
        ev.context_bytes() == &before[..],
        "the context changed on {e:?}"
    );
}

#[test]
fn hostile_inputs_change_nothing() {
    use Error::*;
    let mut c = config(Preset::LaProxSpan, None, Budget::Explicit);
    c.max_seqs = 2;
    let mut ev = evictor(&c);
    let s = seq(100, 11);
    let good = |s: &'static Seq, l: usize| LayerViews {
        keys: s.keys(l),
        values: Some(s.values(l)),
        queries: Some(s.queries(l, s.n - 8, s.n)),
        row_lse: None,
        wo: None,
    };
    let s: &'static Seq = Box::leak(Box::new(s));
    let other: &'static Seq = Box::leak(Box::new(seq(99, 12)));
    let mut nan = seq(100, 13);
    nan.k[0][5] = f32::NAN;
    let nan: &'static Seq = Box::leak(Box::new(nan));
    // before a round
    refused(&mut ev, InvalidArgument, |ev| {
        ev.score_layer(0, 0, &good(s, 0))
    });
    refused(&mut ev, InvalidArgument, |ev| ev.select(0).map(|_| ()));
    refused(&mut ev, InvalidArgument, |ev| ev.commit(0));
    refused(&mut ev, InvalidArgument, |ev| {
        ev.kept_cells(0, &mut [0; 100])
    });
    refused(&mut ev, InvalidArgument, |ev| ev.plan(2, 100));
    refused(&mut ev, InvalidArgument, |ev| ev.begin(2, 100, 50));
    refused(&mut ev, InvalidArgument, |ev| ev.begin(0, 0, 0));
    refused(&mut ev, InvalidArgument, |ev| {
        ev.begin(0, MAX_CELLS + 1, 50)
    });
    refused(&mut ev, InvalidArgument, |ev| ev.begin(0, 100, 101));
    refused(&mut ev, InvalidArgument, |ev| ev.reset(2));
    refused(&mut ev, InvalidArgument, |ev| ev.stats(7));
    // the query ring: this method has one; shapes checked
    refused(&mut ev, InvalidArgument, |ev| {
        ev.observe_queries(0, 3, &s.queries(0, 0, 4))
    });
    refused(&mut ev, InvalidArgument, |ev| {
        ev.observe_queries(2, 0, &s.queries(0, 0, 4))
    });
    let q3 = View::f32_contiguous(&s.q[0][..3 * 4 * 16], [3, 4, 16]).unwrap();
    refused(&mut ev, ShapeMismatch, |ev| ev.observe_queries(0, 0, &q3));
    // Wo: shape, non-finite, layer
    let mut wo = wo_of(0);
    let wov = View::f32_contiguous(&wo, [DIMS.hq, DIMS.dv, DIMS.d_model]).unwrap();
    refused(&mut ev, InvalidArgument, |ev| {
        ev.set_output_projection(3, &wov)
    });
    let short = View::f32_contiguous(&wo, [DIMS.hq, DIMS.dv, DIMS.d_model - 1]).unwrap();
    refused(&mut ev, ShapeMismatch, |ev| {
        ev.set_output_projection(0, &short)
    });
    wo[9] = f32::INFINITY;
    let inf = View::f32_contiguous(&wo, [DIMS.hq, DIMS.dv, DIMS.d_model]).unwrap();
    refused(&mut ev, NonFinite, |ev| ev.set_output_projection(0, &inf));
    // in a round
    ev.begin(0, 100, 40).unwrap();
    refused(&mut ev, InvalidArgument, |ev| {
        ev.score_layer(0, 3, &good(s, 0))
    });
    refused(&mut ev, ShapeMismatch, |ev| {
        ev.score_layer(0, 0, &good(other, 0))
    });
    let mut v = good(s, 0);
    v.values = Some(other.values(0));
    refused(&mut ev, ShapeMismatch, |ev| ev.score_layer(0, 0, &v));
    v.values = None;
    refused(&mut ev, NullPointer, |ev| ev.score_layer(0, 0, &v));
    let mut v = good(s, 0);
    v.queries = None; // and the ring is empty
    refused(&mut ev, InvalidArgument, |ev| ev.score_layer(0, 0, &v));
    let mut v = good(s, 0);
    v.queries = Some(s.queries(0, 95, 100)); // 5 rows for a window of 8
    refused(&mut ev, InvalidArgument, |ev| ev.score_layer(0, 0, &v));
    let mut v = good(s, 0);
    let lse = [0f32; 4 * 8 - 1];
    v.row_lse = Some(&lse);
    refused(&mut ev, ShapeMismatch, |ev| ev.score_layer(0, 0, &v));
    refused(&mut ev, NonFinite, |ev| ev.score_layer(0, 0, &good(nan, 0)));
    ev.score_layer(0, 0, &good(s, 0)).unwrap();
    refused(&mut ev, InvalidArgument, |ev| {
        ev.score_layer(0, 0, &good(s, 0))
    });
    refused(&mut ev, InvalidArgument, |ev| ev.select(0).map(|_| ())); // layers 1, 2 missing
    ev.score_layer(0, 1, &good(s, 1)).unwrap();
    ev.score_layer(0, 2, &good(s, 2)).unwrap();
    refused(&mut ev, InvalidArgument, |ev| ev.select(1).map(|_| ())); // the other slot has no round
    let kept = ev.select(0).unwrap().indices.len();
    assert_eq!(kept, 6 * 40);
    // outputs too small: their canaries stay
    let mut out = [0xABCDu32; 39];
    refused(&mut ev, OutputTooSmall, |ev| ev.kept_cells(0, &mut out));
    assert!(out.iter().all(|&x| x == 0xABCD));
    refused(&mut ev, OutputTooSmall, |ev| {
        ev.evicted_cells(0, &mut [0; 59])
    });
    let mut k = s.k[0].clone();
    let mut kv = ViewMut::f32(&mut k, [2, 99, 16], [99 * 16, 16, 1]).unwrap();
    refused(&mut ev, ShapeMismatch, |ev| ev.compact(0, 0, &mut kv));
    assert_eq!(k, s.k[0]);
    ev.commit(0).unwrap();
    refused(&mut ev, InvalidArgument, |ev| ev.commit(0));
}

#[test]
fn hostile_configs_and_memory() {
    use Error::*;
    let base = config(Preset::LaProx, None, Budget::Explicit);
    // `base` with one field changed
    let with = |change: fn(&mut EvictorConfig)| {
        let mut c = base;
        change(&mut c);
        c
    };
    let bad: Vec<(EvictorConfig, Error)> = vec![
        (with(|c| c.max_seqs = 0), InvalidArgument),
        (with(|c| c.max_cells = 0), InvalidArgument),
        (with(|c| c.model.hq = 5), ShapeMismatch),
        (with(|c| c.model.layers = 0), InvalidArgument),
        (with(|c| c.model.d_model = 0), InvalidArgument),
        (with(|c| c.model.dk = 2000), InvalidArgument),
        (
            with(|c| {
                c.budget = Budget::KeepRatio {
                    ratio: f64::NAN,
                    min_keep: 0,
                }
            }),
            InvalidArgument,
        ),
        (
            with(|c| c.budget = Budget::Cells { high: 10, low: 20 }),
            InvalidArgument,
        ),
        // no forward post-pool
        (with(|c| c.link_threshold = Some(0.5)), InvalidArgument),
        (
            with(|c| {
                c.window = 2;
                c.preset = Preset::Tova;
            }),
            InvalidArgument,
        ),
        (with(|c| c.max_cells = usize::MAX / 2), InvalidArgument),
        (with(|c| c.max_seqs = usize::MAX / 2), Overflow),
    ];
    for (c, e) in bad {
        assert_eq!(Evictor::memory_size(&c).err(), Some(e), "{c:?}");
        let mut mem = [0x5Au8; 256];
        assert_eq!(Evictor::init(&mut mem, &c).err(), Some(e));
        assert!(mem.iter().all(|&b| b == 0x5A));
    }
    // memory one byte short, at any alignment
    let size = Evictor::memory_size(&base).unwrap();
    let mut mem = vec![0x5Au8; size + 1];
    assert_eq!(
        Evictor::init(&mut mem[1..size], &base).err(),
        Some(WorkspaceTooSmall)
    );
    assert!(mem.iter().all(|&b| b == 0x5A));
    let ptr = Evictor::init(&mut mem[1..], &base).unwrap().as_ptr();
    assert_eq!(ptr as usize % 64, 0);
    // a block that init did not write
    let mut junk = vec![0u64; 64];
    // SAFETY: 512 readable bytes, 64-byte aligned or not as each case says.
    unsafe {
        assert_eq!(
            Evictor::from_block(std::ptr::null_mut()).err(),
            Some(NullPointer)
        );
        let p = junk.as_mut_ptr() as *mut u8;
        let aligned = p.add(p.align_offset(64));
        assert_eq!(Evictor::from_block(aligned.add(8)).err(), Some(Misaligned));
        assert_eq!(Evictor::from_block(aligned).err(), Some(InvalidArgument));
        let mut ev = Evictor::from_block(ptr).unwrap();
        assert_eq!(ev.plan(0, 100).unwrap(), 100);
    }
}
