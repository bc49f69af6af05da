//! `uniqueness` under a cell budget carries each cell's twin list from one eviction to the
//! next (`src/math/score/uniqueness/twins.rs`, design §3c): the same stream of tokens, one
//! ubatch at a time as the llama.cpp fork places them, through an evictor with a cell budget
//! (lists carried) and through one whose engine gives every round's target (`Explicit`:
//! the plain search each round) must keep the same cells at every eviction, and the scores
//! must be the stage function's.

use kvevict::evictor::{Budget, EvictorConfig, LayerViews, ModelDims};
use kvevict::{Evictor, Granularity, Preset, View};

const DIMS: ModelDims = ModelDims {
    layers: 2,
    hq: 4,
    hkv: 2,
    dk: 16,
    dv: 24,
    d_model: 0,
};
const HIGH: usize = 96;
const LOW: usize = 72;

/// Text-like rows `[layer][Hkv][t][d]`: most tokens noisy copies of a few recurring
/// directions (twins), some unique, so every path of the twin search is taken.
fn rows(t: usize, d: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut rnd = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    let heads = DIMS.layers * DIMS.hkv;
    let vocab: Vec<f32> = (0..heads * 7 * d).map(|_| rnd()).collect();
    let mut out = vec![0f32; heads * t * d];
    for h in 0..heads {
        for i in 0..t {
            let w = (i * 5 + h) % 7;
            for c in 0..d {
                out[(h * t + i) * d + c] = if i % 6 == 2 {
                    rnd()
                } else {
                    vocab[(h * 7 + w) * d + c] + 0.1 * rnd()
                };
            }
        }
    }
    out
}

/// `src`'s rows of `layer` for the positions `pos`, `[Hkv][pos][d]`.
fn gather(src: &[f32], t: usize, d: usize, layer: usize, pos: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(DIMS.hkv * pos.len() * d);
    for kh in 0..DIMS.hkv {
        let h = layer * DIMS.hkv + kh;
        for &p in pos {
            out.extend_from_slice(&src[(h * t + p) * d..(h * t + p + 1) * d]);
        }
    }
    out
}

/// One round over the held positions to `target` cells: the kept cells.
fn round(
    ev: &mut Evictor,
    kv: (&[f32], &[f32]),
    t: usize,
    held: &[usize],
    target: usize,
) -> Vec<u32> {
    ev.begin(0, held.len(), target).unwrap();
    score(ev, kv, t, held, DIMS.layers);
    ev.select(0).unwrap();
    let mut out = vec![0u32; held.len()];
    let c = ev.kept_cells(0, &mut out).unwrap();
    out.truncate(c);
    ev.commit(0).unwrap();
    out
}

/// The begun round's first `layers` layers scored.
fn score(ev: &mut Evictor, kv: (&[f32], &[f32]), t: usize, held: &[usize], layers: usize) {
    let n = held.len();
    for l in 0..layers {
        let (k, v) = (
            gather(kv.0, t, DIMS.dk, l, held),
            gather(kv.1, t, DIMS.dv, l, held),
        );
        let views = LayerViews {
            keys: View::f32_contiguous(&k, [DIMS.hkv, n, DIMS.dk]).unwrap(),
            values: Some(View::f32_contiguous(&v, [DIMS.hkv, n, DIMS.dv]).unwrap()),
            queries: None,
            row_lse: None,
            wo: None,
        };
        ev.score_layer(0, l, &views).unwrap();
    }
}

fn evictor(mem: &mut Vec<u8>, budget: Budget) -> Evictor<'_> {
    let mut c = EvictorConfig::new(Preset::Uniqueness, DIMS, HIGH, budget);
    c.granularity = Some(Granularity::Token);
    mem.resize(Evictor::memory_size(&c).unwrap(), 0);
    Evictor::init(mem, &c).unwrap()
}

#[test]
fn carried_twin_lists_keep_what_the_plain_search_keeps() {
    for (seed, ub) in [(1u64, HIGH - LOW), (2, 5), (3, 1)] {
        let t = 40 * (HIGH - LOW);
        let (k, v) = (rows(t, DIMS.dk, seed), rows(t, DIMS.dv, seed + 100));
        let budget = Budget::Cells {
            high: HIGH as u64,
            low: LOW as u64,
        };
        let (mut m1, mut m2) = (Vec::new(), Vec::new());
        let mut carried = evictor(&mut m1, budget);
        let mut plain = evictor(&mut m2, Budget::Explicit);
        let (mut held, mut rounds) = (Vec::<usize>::new(), 0);
        for start in (0..t).step_by(ub) {
            let end = (start + ub).min(t);
            if held.len() + (end - start) > HIGH {
                let n = held.len();
                let target = carried.plan(0, n + (end - start)).unwrap().min(n);
                if rounds % 4 == 3 {
                    // a round abandoned after one layer (its pairs were offered to the lists)
                    carried.begin(0, n, target).unwrap();
                    score(&mut carried, (&k, &v), t, &held, 1);
                }
                let got = round(&mut carried, (&k, &v), t, &held, target);
                let want = round(&mut plain, (&k, &v), t, &held, target);
                assert_eq!(got, want, "seed {seed} ubatch {ub} round {rounds}");
                held = got.iter().map(|&i| held[i as usize]).collect();
                rounds += 1;
            }
            held.extend(start..end);
        }
        assert!(rounds >= 20, "rounds: {rounds}");
    }
}
