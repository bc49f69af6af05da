//! The engine's marks (design §3c, `src/evictor/marks.rs`): a round whose cells the engine
//! marked (user turns, a system prompt) reserves a share of the kept cells for them. Checked
//! against the f64 reference (tests/reference): the rule written out here on its own — the
//! budget split, the reference selection over each part's cells, the union — and that a
//! round without marks, with none set, with share 0 or with every prefix cell marked keeps
//! exactly what the plain selection keeps (fixed seeds; random f32 data makes near-ties rare).

mod evictor_reference;
mod reference;

use evictor_reference::{QueriesKeys, DIMS};
use kvevict::evictor::{
    default_select, span_budgets, split_budget, Budget, EvictorConfig, MarkSplit,
};
use kvevict::{Error, Evictor, Granularity, Preset, ScoreConfig};
use reference::Rng;

const N: usize = 40;
const W: usize = 4;

fn data(seed: u64) -> QueriesKeys {
    QueriesKeys::new(W, N, seed)
}

fn evictor_config(preset: Preset, g: Granularity) -> EvictorConfig {
    let mut c = EvictorConfig::new(preset, DIMS, N, Budget::Explicit);
    c.granularity = Some(g);
    c.window = W as u32;
    c
}

/// The core's kept lists of one round to `target` cells, with `marks` (flags, share) given
/// after `begin` when `Some`.
fn core(
    ev: &mut Evictor,
    d: &QueriesKeys,
    target: usize,
    marks: Option<(&[u8], f32)>,
) -> (Vec<u64>, Vec<u32>) {
    core_split(ev, d, target, marks, MarkSplit::Share)
}

/// [`core`] with the marks' split.
fn core_split(
    ev: &mut Evictor,
    d: &QueriesKeys,
    target: usize,
    marks: Option<(&[u8], f32)>,
    split: MarkSplit,
) -> (Vec<u64>, Vec<u32>) {
    ev.begin(0, N, target).unwrap();
    if let Some((flags, share)) = marks {
        if split == MarkSplit::Share {
            ev.mark_cells(0, flags, share).unwrap();
        } else {
            ev.mark_cells_split(0, flags, share, split).unwrap();
        }
    }
    d.score_round(ev);
    let kept = ev.select(0).unwrap();
    let out = (kept.offsets.to_vec(), kept.indices.to_vec());
    ev.commit(0).unwrap();
    out
}

/// The reference scores `[L][Hkv][P]` of the preset.
fn reference_scores(preset: Preset, d: &QueriesKeys) -> Vec<f64> {
    let cfg = ScoreConfig {
        window: W as u32,
        ..ScoreConfig::preset(preset)
    };
    let mut flat = Vec::new();
    for l in 0..DIMS.layers {
        let sc = reference::score_layer(&cfg, &d.layer(l));
        for kh in 0..DIMS.hkv {
            flat.extend_from_slice(&sc.s[kh][..N - W]);
        }
    }
    flat
}

/// The rule in f64: prefix budget `b` splits into `⌊share·b⌋` for the marked cells and the
/// rest for the unmarked ones (a short part gives its rest to the other); the reference
/// selection over the marked prefix cells (no window) and over the unmarked prefix cells
/// plus the window; per unit the union, ascending.
/// `sel` overrides the preset's selection; value links `(sums [N], threshold)`: each part's
/// selection reads the sums of its own cells (a cell's link is to the cell before it in the
/// round), the reference's linked forward post-pool over them.
#[allow(clippy::too_many_arguments)]
fn reference_round(
    preset: Preset,
    g: Granularity,
    d: &QueriesKeys,
    target: usize,
    flags: &[u8],
    share: f64,
    spans: bool,
    sel: Option<kvevict::SelectConfig>,
    links: Option<(&[f64], f64)>,
) -> Vec<Vec<u32>> {
    let mut sel = sel.unwrap_or(default_select(preset, 0));
    let p = N - W;
    let s = reference_scores(preset, d);
    let units = DIMS.layers * DIMS.hkv;
    sel.granularity = g;
    let b = (target - W) as u64;
    let marked: Vec<usize> = (0..p).filter(|&i| flags[i] != 0).collect();
    let unmarked: Vec<usize> = (0..p).filter(|&i| flags[i] == 0).collect();
    let (m, u) = (marked.len() as u64, unmarked.len() as u64);
    if share == 0.0 || m == 0 || u == 0 {
        sel.budget = b;
        return reference::select_model_linked(&sel, &s, links, DIMS.layers, DIMS.hkv, N, W);
    }
    let b = b.min(m + u);
    // the marked cells' share, as many as there are; the unmarked cells the rest, as many
    // as there are; what is still left back to the marked cells
    let reserved = ((share * b as f64).floor() as u64).min(m);
    let bu = (b - reserved).min(u);
    let bm = (b - bu).min(m);
    let part = |cols: &[usize], window: usize, budget: u64| -> Vec<Vec<u32>> {
        let kp = cols.len() - window;
        let mut g = Vec::new();
        for unit in 0..units {
            g.extend(cols[..kp].iter().map(|&c| s[unit * p + c]));
        }
        let mut c = sel;
        c.budget = budget;
        let sums: Vec<f64> =
            links.map_or(Vec::new(), |(l, _)| cols.iter().map(|&c| l[c]).collect());
        let l = links.map(|(_, t)| (&sums[..], t));
        reference::select_model_linked(&c, &g, l, DIMS.layers, DIMS.hkv, cols.len(), window)
            .into_iter()
            .map(|l| l.into_iter().map(|i| cols[i as usize] as u32).collect())
            .collect()
    };
    let a = if spans {
        // the runs of consecutive prefix cells with one nonzero flag; their budgets handed
        // out one cell at a time, oldest first, to every span not yet whole, until b_m is
        // spent
        let mut runs: Vec<Vec<usize>> = Vec::new();
        for &i in &marked {
            match runs.last_mut() {
                Some(r) if *r.last().unwrap() + 1 == i && flags[r[0]] == flags[i] => r.push(i),
                _ => runs.push(vec![i]),
            }
        }
        let mut got = vec![0u64; runs.len()];
        let mut left = bm;
        while left > 0 {
            for (g, r) in got.iter_mut().zip(&runs) {
                if left > 0 && (*g as usize) < r.len() {
                    *g += 1;
                    left -= 1;
                }
            }
        }
        let mut a = vec![Vec::new(); units];
        for (r, &b) in runs.iter().zip(&got) {
            if b > 0 {
                for (x, y) in a.iter_mut().zip(part(r, 0, b)) {
                    x.extend(y);
                }
            }
        }
        a
    } else {
        part(&marked, 0, bm)
    };
    let with_window: Vec<usize> = unmarked.iter().copied().chain(p..N).collect();
    let z = part(&with_window, W, bu);
    a.into_iter()
        .zip(z)
        .map(|(mut x, y)| {
            x.extend(y);
            x.sort_unstable();
            x
        })
        .collect()
}

fn lists(offsets: &[u64], indices: &[u32]) -> Vec<Vec<u32>> {
    (0..offsets.len() - 1)
        .map(|u| indices[offsets[u] as usize..offsets[u + 1] as usize].to_vec())
        .collect()
}

/// Runs of marked cells (a system prompt, user turns) over the prefix, some in the window,
/// each flagged 1, 2 or 3 (a later run overwrites an earlier one's cells: neighbouring runs,
/// spans of their own when their flags differ).
fn runs(r: &mut Rng) -> Vec<u8> {
    let mut f = vec![0u8; N];
    for _ in 0..r.range(1, 5) {
        let a = r.range(0, N - 2);
        let len = r.range(1, 9);
        let v = r.range(1, 4) as u8;
        for x in f.iter_mut().skip(a).take(len) {
            *x = v;
        }
    }
    f
}

#[test]
fn split_budget_rule() {
    assert_eq!(split_budget(10, 0.5, 3, 20), Some((3, 7)));
    assert_eq!(split_budget(10, 0.5, 20, 3), Some((7, 3)));
    assert_eq!(split_budget(10, 0.25, 20, 20), Some((2, 8)));
    assert_eq!(split_budget(10, 1.0, 20, 20), Some((10, 0)));
    assert_eq!(split_budget(50, 0.5, 4, 6), Some((4, 6)));
    assert_eq!(split_budget(10, 0.0, 5, 5), None);
    assert_eq!(split_budget(0, 0.5, 5, 5), None);
    assert_eq!(split_budget(10, 0.5, 0, 5), None);
    assert_eq!(split_budget(10, 0.5, 5, 0), None);
}

/// One round of [`random_rounds`]: its data, marks, share and target.
struct Round<'a> {
    g: Granularity,
    seed: u64,
    d: &'a QueriesKeys,
    flags: &'a [u8],
    share: f32,
    target: usize,
}

impl Round<'_> {
    /// The f64 reference's kept lists of this round's marks (`spans`: split over the runs).
    fn reference(&self, spans: bool) -> Vec<Vec<u32>> {
        reference_round(
            Preset::SnapKv,
            self.g,
            self.d,
            self.target,
            self.flags,
            self.share as f64,
            spans,
            None,
            None,
        )
    }

    /// The kept lists `(offsets, indices)` checked against [`Round::reference`] and the budget
    /// (never more, the window on top); returns them.
    fn checked(&self, (o, i): (Vec<u64>, Vec<u32>), spans: bool) -> Vec<Vec<u32>> {
        let got = lists(&o, &i);
        let (g, seed, share) = (self.g, self.seed, self.share);
        assert_eq!(
            got,
            self.reference(spans),
            "{g:?} seed {seed} share {share}"
        );
        for l in &got {
            assert!(l.len() <= self.target, "{} > {}", l.len(), self.target);
        }
        got
    }
}

/// `rounds` random rounds (data from `seed0`, marks from `rng`, the shares in turn) on
/// SnapKV at token and head granularity, each passed to `f` with the evictor.
fn random_rounds(
    rng: u64,
    seed0: u64,
    rounds: u64,
    shares: [f32; 4],
    mut f: impl FnMut(&mut Evictor, Round),
) {
    let mut r = Rng::new(rng);
    for g in [Granularity::Token, Granularity::Head] {
        let c = evictor_config(Preset::SnapKv, g);
        let mut mem = vec![0u8; Evictor::memory_size(&c).unwrap()];
        let mut ev = Evictor::init(&mut mem, &c).unwrap();
        for seed in 0..rounds {
            let d = data(seed0 + seed);
            let flags = runs(&mut r);
            let share = shares[seed as usize % 4];
            let target = r.range(W + 2, N - 4);
            let round = Round {
                g,
                seed,
                d: &d,
                flags: &flags,
                share,
                target,
            };
            f(&mut ev, round);
        }
    }
}

#[test]
fn marked_rounds_match_the_f64_reference() {
    let mut differs = 0;
    random_rounds(28, 100, 12, [0.25, 0.5, 0.75, 1.0], |ev, x| {
        let (d, target) = (x.d, x.target);
        let got = x.checked(core(ev, d, target, Some((x.flags, x.share))), false);
        let (po, pi) = core(ev, d, target, None);
        differs += (lists(&po, &pi) != got) as u32;
    });
    assert!(differs > 12, "marks changed only {differs} rounds");
}

#[test]
fn without_marks_the_selection_is_the_plain_one() {
    let mut r = Rng::new(7);
    for g in [Granularity::Token, Granularity::Head] {
        let c = evictor_config(Preset::SnapKv, g);
        let mut mem = vec![0u8; Evictor::memory_size(&c).unwrap()];
        let mut ev = Evictor::init(&mut mem, &c).unwrap();
        for seed in 0..6 {
            let d = data(seed);
            let target = r.range(W + 2, N - 4);
            let plain = core(&mut ev, &d, target, None);
            let want = reference_round(
                Preset::SnapKv,
                g,
                &d,
                target,
                &[0; N],
                0.5,
                false,
                None,
                None,
            );
            assert_eq!(lists(&plain.0, &plain.1), want, "{g:?} seed {seed}");
            let none = [0u8; N];
            assert_eq!(core(&mut ev, &d, target, Some((&none, 0.5))), plain);
            let flags = runs(&mut r);
            assert_eq!(core(&mut ev, &d, target, Some((&flags, 0.0))), plain);
            // every prefix cell marked: nothing to split
            let mut all = [0u8; N];
            all[..N - W].fill(1);
            assert_eq!(core(&mut ev, &d, target, Some((&all, 0.5))), plain);
            // marks last one round: the next begin forgets them
            ev.begin(0, N, target).unwrap();
            ev.mark_cells(0, &flags, 1.0).unwrap();
            assert_eq!(core(&mut ev, &d, target, None), plain);
        }
    }
}

#[test]
fn marks_refuse_bad_arguments() {
    let c = evictor_config(Preset::SnapKv, Granularity::Token);
    let mut mem = vec![0u8; Evictor::memory_size(&c).unwrap()];
    let mut ev = Evictor::init(&mut mem, &c).unwrap();
    let flags = [1u8; N];
    // no round begun
    assert_eq!(ev.mark_cells(0, &flags, 0.5), Err(Error::InvalidArgument));
    ev.begin(0, N, 20).unwrap();
    for bad in [f32::NAN, -0.1, 1.5, f32::INFINITY] {
        assert_eq!(ev.mark_cells(0, &flags, bad), Err(Error::InvalidArgument));
    }
    assert_eq!(
        ev.mark_cells(0, &flags[1..], 0.5),
        Err(Error::ShapeMismatch)
    );
    assert_eq!(ev.mark_cells(1, &flags, 0.5), Err(Error::InvalidArgument));
    assert_eq!(ev.mark_cells(0, &flags, 0.5), Ok(()));
    // selected: too late
    data(1).score_round(&mut ev);
    ev.select(0).unwrap();
    assert_eq!(ev.mark_cells(0, &flags, 0.5), Err(Error::InvalidArgument));
}

#[test]
fn span_budgets_rule() {
    let b = |budget: u64, lens: &[u64]| {
        let mut out = vec![u64::MAX; lens.len()];
        span_budgets(budget, lens, &mut out);
        out
    };
    assert_eq!(b(9, &[10, 10, 10]), [3, 3, 3]);
    assert_eq!(b(10, &[10, 10, 10]), [4, 3, 3]);
    assert_eq!(b(11, &[10, 2, 10]), [5, 2, 4]);
    assert_eq!(b(5, &[1, 1, 8]), [1, 1, 3]);
    assert_eq!(b(20, &[3, 4, 5]), [3, 4, 5]);
    assert_eq!(b(2, &[3, 4, 5]), [1, 1, 0]);
    assert_eq!(b(0, &[3, 4]), [0, 0]);
    assert_eq!(b(7, &[7]), [7]);
    assert_eq!(b(3, &[]), [0u64; 0]);
}

/// Marks with spans: the marked part's budget split over the runs of marked cells
/// (`MarkSplit::Spans`) against the f64 reference, the plain split's rounds in between
/// still the reference's, and the spans changing some rounds.
#[test]
fn span_split_rounds_match_the_f64_reference() {
    let (mut differs, mut split_rounds) = (0, 0);
    random_rounds(29, 200, 16, [0.5, 0.75, 1.0, 0.9], |ev, x| {
        let (d, target, marks) = (x.d, x.target, Some((x.flags, x.share)));
        let got = x.checked(core_split(ev, d, target, marks, MarkSplit::Spans), true);
        let plain = core(ev, d, target, marks);
        assert_eq!(lists(&plain.0, &plain.1), x.reference(false));
        differs += (lists(&plain.0, &plain.1) != got) as u32;
        split_rounds += 1;
    });
    assert!(differs > 0, "spans changed none of {split_rounds} rounds");
}

/// Marks by position: each range is a span of its own, also when two ranges touch (the
/// text between two turns all evicted): the split over `[a, b)` and `[b, c)` keeps what
/// flags 1 and 2 on those cells keep, and not what one run of flag 1 keeps (some rounds);
/// without the split the ranges keep what the flags keep.
#[test]
fn position_ranges_are_spans_of_their_own() {
    let mut r = Rng::new(31);
    let mut differs = 0;
    let c = evictor_config(Preset::SnapKv, Granularity::Token);
    let mut mem = vec![0u8; Evictor::memory_size(&c).unwrap()];
    let mut ev = Evictor::init(&mut mem, &c).unwrap();
    // the cells' positions: ascending with gaps (evicted text)
    let positions: Vec<i32> = (0..N as i32).map(|i| 3 * i + (i % 2)).collect();
    for seed in 0..24 {
        let d = data(500 + seed);
        let target = r.range(W + 2, N - 12);
        let (a, b) = (r.range(0, 10), r.range(11, 20));
        let c3 = r.range(21, N - W);
        let ranges = [positions[a], positions[b], positions[b], positions[c3]];
        let mut flags = vec![0u8; N];
        flags[a..b].fill(1);
        flags[b..c3].fill(2);
        let one: Vec<u8> = flags.iter().map(|&f| (f != 0) as u8).collect();
        for (split, share) in [(MarkSplit::Spans, 1.0), (MarkSplit::Share, 0.75)] {
            ev.begin(0, N, target).unwrap();
            ev.mark_positions(0, &positions, &ranges, share).unwrap();
            if split == MarkSplit::Spans {
                ev.set_mark_split(0, split).unwrap();
            }
            d.score_round(&mut ev);
            let kept = ev.select(0).unwrap();
            let got = (kept.offsets.to_vec(), kept.indices.to_vec());
            ev.commit(0).unwrap();
            assert_eq!(
                got,
                core_split(&mut ev, &d, target, Some((&flags, share)), split)
            );
            let merged = core_split(&mut ev, &d, target, Some((&one, share)), split);
            match split {
                MarkSplit::Spans => differs += (got != merged) as u32,
                MarkSplit::Share => assert_eq!(got, merged),
            }
        }
    }
    assert!(differs > 0, "the ranges' spans changed no round");
}

/// Values `[Hkv][N][dv]` per layer with runs of linked cells: a linked cell's value is the
/// cell before it plus 1 % noise in every layer and head (mean link ~1), the others drawn
/// afresh (mean link ~0), so no link is near the threshold 0.5 and f32 and f64 agree on
/// every one. Returns the values (f32-exact) and the f64 link sums `Σ_{l,h} cos(v_i,
/// v_{i-1})` (`sums[0] = 0`).
fn linked_values(seed: u64) -> (Vec<reference::T3>, Vec<f64>) {
    let mut r = Rng::new(seed);
    let linked: Vec<bool> = (0..N).map(|i| i > 0 && r.range(0, 5) < 2).collect();
    let f32_exact = |x: f64| x as f32 as f64;
    let vals: Vec<reference::T3> = (0..DIMS.layers)
        .map(|_| {
            let mut t = reference::T3::normal(&mut r, DIMS.hkv, N, DIMS.dv, 1.0);
            for h in 0..DIMS.hkv {
                for (i, _) in linked.iter().enumerate().filter(|&(_, &l)| l) {
                    for c in 0..DIMS.dv {
                        let prev = t.data[(h * N + i - 1) * DIMS.dv + c];
                        t.data[(h * N + i) * DIMS.dv + c] = prev + 0.01 * r.normal();
                    }
                }
            }
            t.data.iter_mut().for_each(|x| *x = f32_exact(*x));
            t
        })
        .collect();
    let mut sums = vec![0f64; N];
    for t in &vals {
        for h in 0..DIMS.hkv {
            for (i, s) in sums.iter_mut().enumerate().skip(1) {
                let (a, b) = (t.row(h, i), t.row(h, i - 1));
                let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
                let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
                let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
                *s += dot / (na * nb);
            }
        }
    }
    (vals, sums)
}

/// The kept lists of one round of `d` with values `vals` (value links), marks as
/// [`core_split`] gives them.
fn core_linked(
    ev: &mut Evictor,
    d: &QueriesKeys,
    vals: &[reference::T3],
    target: usize,
    marks: Option<(&[u8], f32)>,
    split: MarkSplit,
) -> Vec<Vec<u32>> {
    // a ragged commit (head granularity) ends the sequence's rounds: each round anew
    ev.reset(0).unwrap();
    ev.begin(0, N, target).unwrap();
    if let Some((flags, share)) = marks {
        ev.mark_cells_split(0, flags, share, split).unwrap();
    }
    for (l, val) in vals.iter().enumerate() {
        let (k, q, v) = (d.k[l].f32s(), d.q[l].f32s(), val.f32s());
        let lv = kvevict::evictor::LayerViews {
            keys: kvevict::View::f32_contiguous(&k, [DIMS.hkv, N, DIMS.dk]).unwrap(),
            values: Some(kvevict::View::f32_contiguous(&v, [DIMS.hkv, N, DIMS.dv]).unwrap()),
            queries: Some(kvevict::View::f32_contiguous(&q, [DIMS.hq, W, DIMS.dk]).unwrap()),
            row_lse: None,
            wo: None,
        };
        ev.score_layer(0, l, &lv).unwrap();
    }
    let kept = ev.select(0).unwrap();
    let out = lists(kept.offsets, kept.indices);
    ev.commit(0).unwrap();
    out
}

/// Marks with value links (issue 28's eleventh pass: `uniqueness` with marks, the split over
/// the turns and `kv_evict_links`): each part's — and with the split each span's — linked
/// selection reads its own cells' link sums, against the f64 reference (SnapKV's scores, the
/// `uniqueness` / `laprox-span` selection: flat forward post-pool 9, links at 0.5), both
/// splits, token and head granularity; and the links change some marked rounds.
#[test]
fn linked_marked_rounds_match_the_f64_reference() {
    let sel = default_select(Preset::Uniqueness, 0);
    let mut r = Rng::new(41);
    let (mut differs, mut rounds) = (0, 0);
    for g in [Granularity::Token, Granularity::Head] {
        let mut c = evictor_config(Preset::SnapKv, g);
        c.select = Some(sel);
        c.link_threshold = Some(kvevict::LINK_THRESHOLD);
        let mut mem = vec![0u8; Evictor::memory_size(&c).unwrap()];
        let mut ev = Evictor::init(&mut mem, &c).unwrap();
        let plain_c = EvictorConfig {
            link_threshold: None,
            ..c
        };
        let mut plain_mem = vec![0u8; Evictor::memory_size(&plain_c).unwrap()];
        let mut plain = Evictor::init(&mut plain_mem, &plain_c).unwrap();
        for seed in 0..16u64 {
            let d = data(700 + seed);
            let (vals, sums) = linked_values(900 + seed);
            let flags = runs(&mut r);
            let share = [0.5f32, 0.75, 1.0, 0.9][seed as usize % 4];
            let target = r.range(W + 2, N - 4);
            let links = Some((&sums[..], kvevict::LINK_THRESHOLD as f64));
            // the reference round, linked or not, with these marks (`None`: unmarked)
            let want = |links, marks: Option<(&[u8], bool)>| {
                let (f, spans) = marks.unwrap_or((&[0; N], false));
                let sh = if marks.is_some() { share as f64 } else { 0.0 };
                reference_round(
                    Preset::SnapKv,
                    g,
                    &d,
                    target,
                    f,
                    sh,
                    spans,
                    Some(sel),
                    links,
                )
            };
            for split in [MarkSplit::Spans, MarkSplit::Share] {
                let spans = split == MarkSplit::Spans;
                let marks = Some((&flags[..], share));
                let got = core_linked(&mut ev, &d, &vals, target, marks, split);
                let w = want(links, Some((&flags, spans)));
                assert_eq!(got, w, "{g:?} seed {seed} share {share} {split:?}");
                let unlinked = core_linked(&mut plain, &d, &vals, target, marks, split);
                let w = want(None, Some((&flags, spans)));
                assert_eq!(unlinked, w, "{g:?} seed {seed} unlinked");
                differs += (got != unlinked) as u32;
                rounds += 1;
            }
            // no marks: the plain linked selection
            let got = core_linked(&mut ev, &d, &vals, target, None, MarkSplit::Share);
            let want = want(links, None);
            assert_eq!(got, want, "{g:?} seed {seed} unmarked");
        }
    }
    assert!(differs > 0, "links changed none of {rounds} marked rounds");
}
