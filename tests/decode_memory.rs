//! The decode-time score memory (design §3c, `tova-decay`) against the plain f64 reference
//! (tests/reference): a stream of tokens through a cell budget, one ubatch at a time as the
//! llama.cpp fork places them, each eviction scored by the evictor and, independently, by
//! the reference — TOVA's scores of the held cells, plus `decay ·` the score each cell had
//! when it was last kept, selected at token granularity — and the kept cells compared
//! exactly at every round (fixed seeds; random f32 data makes near-ties rare).

mod evictor_reference;
mod reference;

use evictor_reference::{QueriesKeys, DIMS};
use kvevict::evictor::{decode_decay, Budget, EvictorConfig};
use kvevict::{Evictor, Granularity, Preset, ScoreConfig, SelectConfig};
use reference::T3;

const HIGH: usize = 48;
const LOW: usize = 36;

/// `src`'s rows `[i][pos][..]` for the positions `pos`, as a new T3.
fn gather(src: &T3, pos: &[usize]) -> T3 {
    let mut t = T3::zeros(src.a, pos.len(), src.c);
    for i in 0..src.a {
        for (j, &p) in pos.iter().enumerate() {
            for c in 0..src.c {
                t.set(i, j, c, src.at(i, p, c));
            }
        }
    }
    t
}

/// The queries of the last `w` held positions and the keys of all `held` positions.
fn held_round(s: &QueriesKeys, held: &[usize], w: usize) -> QueriesKeys {
    QueriesKeys {
        q: s.q
            .iter()
            .map(|q| gather(q, &held[held.len() - w..]))
            .collect(),
        k: s.k.iter().map(|k| gather(k, held)).collect(),
    }
}

/// The reference's kept cells of a round over the held positions `held`: the preset's
/// scores with a window of `w` (the last `w` held positions' queries: TOVA's last one, H2O's
/// attention averaged over them) plus `decay · carry`, token-granular selection to `target`
/// cells; `carry` becomes the kept cells' combined scores.
fn reference_round(
    s: &QueriesKeys,
    held: &[usize],
    target: usize,
    (preset, w): (Preset, usize),
    decay: f64,
    carry: &mut Vec<Vec<f64>>,
) -> Vec<u32> {
    let cfg = ScoreConfig {
        window: w as u32,
        ..ScoreConfig::preset(preset)
    };
    let n = held.len();
    let p = n - w;
    let round = held_round(s, held, w);
    let mut flat = Vec::new();
    let mut combined = Vec::new();
    for l in 0..DIMS.layers {
        let sc = reference::score_layer(&cfg, &round.layer(l));
        for kh in 0..DIMS.hkv {
            let u = l * DIMS.hkv + kh;
            let row: Vec<f64> = (0..p)
                .map(|i| sc.s[kh][i] + decay * carry[u].get(i).copied().unwrap_or(0.0))
                .collect();
            flat.extend_from_slice(&row);
            combined.push(row);
        }
    }
    let mut sel = SelectConfig::new(
        kvevict::AllocatorKind::Uniform,
        Granularity::Token,
        (target - w) as u64,
    );
    sel.granularity = Granularity::Token;
    let kept = reference::select_model(&sel, &flat, DIMS.layers, DIMS.hkv, n, w);
    for (u, c) in carry.iter_mut().enumerate() {
        *c = kept[u]
            .iter()
            .map(|&i| {
                if (i as usize) < p {
                    combined[u][i as usize]
                } else {
                    0.0
                }
            })
            .collect();
    }
    kept[0].clone()
}

/// One evictor round over `held` to `target` cells, the last `w` held positions' queries
/// given; the kept cells.
fn core_round(
    ev: &mut Evictor,
    s: &QueriesKeys,
    held: &[usize],
    target: usize,
    w: usize,
) -> Vec<u32> {
    let n = held.len();
    ev.begin(0, n, target).unwrap();
    held_round(s, held, w).score_round(ev);
    ev.select(0).unwrap();
    let mut out = vec![0u32; n];
    let c = ev.kept_cells(0, &mut out).unwrap();
    out.truncate(c);
    ev.commit(0).unwrap();
    out
}

/// Feeds `t` positions in ubatches of `HIGH - LOW` through a `Cells` budget with `preset`
/// (its memory), the scoring of preset `scoring` and window `w` (the evictor's `window`); at every eviction checks the core against the
/// reference with `decay`, and returns the kept positions of every round.
fn run(
    preset: Preset,
    scoring: Preset,
    w: usize,
    decay: f64,
    t: usize,
    seed: u64,
) -> Vec<Vec<usize>> {
    let s = QueriesKeys::new(t, t, seed);
    let budget = Budget::Cells {
        high: HIGH as u64,
        low: LOW as u64,
    };
    let mut c = EvictorConfig::new(preset, DIMS, HIGH, budget);
    c.granularity = Some(Granularity::Token);
    c.score = Some(ScoreConfig::preset(scoring));
    c.window = w as u32;
    let mut mem = vec![0u8; Evictor::memory_size(&c).unwrap()];
    let mut ev = Evictor::init(&mut mem, &c).unwrap();
    let mut carry = vec![Vec::new(); DIMS.layers * DIMS.hkv];
    let (mut held, mut rounds) = (Vec::new(), Vec::new());
    let ub = HIGH - LOW;
    for start in (0..t).step_by(ub) {
        let end = (start + ub).min(t);
        if held.len() + (end - start) > HIGH {
            let n = held.len();
            let target = ev.plan(0, n + (end - start)).unwrap().min(n);
            assert_eq!(target, LOW);
            let got = core_round(&mut ev, &s, &held, target, w);
            let want = reference_round(&s, &held, target, (scoring, w), decay, &mut carry);
            assert_eq!(got, want, "{preset:?} seed {seed} round {}", rounds.len());
            held = got.iter().map(|&i| held[i as usize]).collect();
            rounds.push(held.clone());
        }
        held.extend(start..end);
    }
    rounds
}

#[test]
fn tova_decay_matches_the_f64_reference_over_a_stream() {
    let d = decode_decay(Preset::TovaDecay) as f64;
    assert_eq!(d as f32, 0.3);
    for seed in [1, 2, 3] {
        let with = run(Preset::TovaDecay, Preset::TovaDecay, 1, d, 240, seed);
        assert!(with.len() >= 15, "rounds: {}", with.len());
        // plain TOVA is the same reference without memory, and keeps other cells
        let without = run(Preset::Tova, Preset::Tova, 1, 0.0, 240, seed);
        assert_eq!(with[0], without[0], "the first round carries nothing");
        assert!(with != without, "seed {seed}: the memory changed no round");
    }
}

#[test]
fn h2o_matches_the_f64_reference_over_a_stream() {
    let d = decode_decay(Preset::H2o) as f64;
    assert_eq!(d as f32, 0.5);
    // the window is the ubatch, as the fork's 128-cell budget gives it (every query read once)
    let w = HIGH - LOW;
    assert_eq!(ScoreConfig::preset(Preset::H2o).window, 32);
    for seed in [4, 5, 6] {
        let with = run(Preset::H2o, Preset::H2o, w, d, 240, seed);
        assert!(with.len() >= 15, "rounds: {}", with.len());
        // the same scoring without memory (a preset with none, given h2o's scoring) keeps
        // other cells
        let without = run(Preset::SnapKv, Preset::H2o, w, 0.0, 240, seed);
        assert_eq!(with[0], without[0], "the first round carries nothing");
        assert!(with != without, "seed {seed}: the memory changed no round");
    }
}

#[test]
fn memory_is_decode_time_only() {
    // a keep ratio or the engine's own targets are one-shot: tova-decay is tova
    assert_eq!(decode_decay(Preset::Tova), 0.0);
    assert_eq!(decode_decay(Preset::LaProxSpan), 0.0);
    let s = QueriesKeys::new(80, 80, 9);
    for budget in [Budget::Explicit, Budget::cells(1000)] {
        let mut kept = Vec::new();
        for preset in [Preset::Tova, Preset::TovaDecay] {
            let mut c = EvictorConfig::new(preset, DIMS, 60, budget);
            c.granularity = Some(Granularity::Token);
            let mut mem = vec![0u8; Evictor::memory_size(&c).unwrap()];
            let mut ev = Evictor::init(&mut mem, &c).unwrap();
            let held: Vec<usize> = (0..60).collect();
            let first = core_round(&mut ev, &s, &held, 40, 1);
            // the 40 kept positions, then 20 new ones
            let held: Vec<usize> = first.iter().map(|&i| i as usize).chain(60..80).collect();
            // a second round over what was kept: the memory (if any) now counts
            kept.push((first.clone(), core_round(&mut ev, &s, &held, 30, 1)));
            // after a reset nothing is carried: the round is the first one's again
            ev.reset(0).unwrap();
            let all: Vec<usize> = (0..60).collect();
            assert_eq!(core_round(&mut ev, &s, &all, 40, 1), first, "{preset:?}");
        }
        let same = kept[0] == kept[1];
        match budget {
            Budget::Explicit => assert!(same, "no memory without a cell budget"),
            _ => assert!(!same, "a cell budget carries the scores"),
        }
    }
}
