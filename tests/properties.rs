//! Properties of the machinery under the allocators (design §4 "Selection across devices",
//! §5, §6): histogram-threshold top-K equals a full sort, sharded selection equals
//! unsharded, compaction equals a gather and writes nothing else, rejected inputs leave
//! every output untouched.

mod reference;

use kvevict::compact::{compact_in_place, compact_varlen, validate_selection};
use kvevict::select::{kept, make_key, run_search, top_k_threshold, Histogram, Search};
use kvevict::*;
use reference::harness::*;
use reference::{Rng, T3};

// ------------------------------------------------------------------ top-K by threshold --

/// Scores with many duplicates, both zeros, negatives, subnormals and extremes.
fn nasty_score(rng: &mut Rng) -> f32 {
    match rng.range(0, 9) {
        0 => 0.0,
        1 => -0.0,
        2 => rng.pick(&[1.0, 2.0, 0.5, -1.0]),
        3 => f32::MIN_POSITIVE / 4.0 * rng.range(1, 3) as f32,
        4 => rng.pick(&[f32::MAX, f32::MIN, f32::INFINITY, f32::NEG_INFINITY]),
        5 => -(rng.uniform() as f32),
        _ => (rng.normal() * 3.0).exp() as f32,
    }
}

/// Full-sort order of design §4: flag, score (as a number: -0 == +0), later position,
/// lower unit. Larger first.
fn sort_order(a: &(bool, f32, u32, u32), b: &(bool, f32, u32, u32)) -> std::cmp::Ordering {
    b.0.cmp(&a.0)
        .then(b.1.partial_cmp(&a.1).unwrap())
        .then(b.2.cmp(&a.2))
        .then(a.3.cmp(&b.3))
}

/// The key encodes exactly the design order (including -0 == +0: a tie in score).
#[test]
fn key_order_is_spec_order() {
    let mut rng = Rng::new(21);
    let mut c: Vec<(bool, f32, u32, u32)> = (0..3000)
        .map(|_| {
            (
                rng.coin(0.1),
                nasty_score(&mut rng),
                rng.range(0, 40) as u32,
                rng.range(0, 6) as u32,
            )
        })
        .collect();
    c.sort_by(|a, b| (a.2, a.3).cmp(&(b.2, b.3)));
    c.dedup_by(|a, b| (a.2, a.3) == (b.2, b.3)); // keys are unique per (position, unit)
    for a in &c {
        for b in c.iter().take(200) {
            let (ka, kb) = (make_key(a.1, a.2, a.3, a.0), make_key(b.1, b.2, b.3, b.0));
            assert_eq!(kb.cmp(&ka), sort_order(a, b), "{a:?} vs {b:?}");
        }
    }
}

#[test]
fn zero_signs_tie() {
    // -0.0 and +0.0 are the same score: the later position wins, whichever sign it has
    assert!(make_key(-0.0, 5, 0, false) > make_key(0.0, 3, 0, false));
    assert!(make_key(0.0, 5, 0, false) > make_key(-0.0, 3, 0, false));
    assert!(make_key(-0.0, 3, 0, false) > make_key(0.0, 3, 1, false));
}

/// `run_search` and a hand-driven `Search` give the full sort's top-K, for every K.
#[test]
fn threshold_top_k_equals_sort() {
    let mut rng = Rng::new(22);
    for case in 0..60 {
        let n = rng.range(0, 400);
        let units = rng.range(1, 4) as u32;
        let keys: Vec<u128> = (0..n)
            .map(|i| {
                make_key(
                    nasty_score(&mut rng),
                    (i as u32) / units,
                    (i as u32) % units,
                    rng.coin(0.05),
                )
            })
            .collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        for k in [0, 1, 2, n / 3, n / 2, n.saturating_sub(1), n, n + 5] {
            let thr = run_search(k as u64, n as u64, |sink| {
                keys.iter().for_each(|&x| sink(x))
            });
            let mut got: Vec<u128> = keys.iter().cloned().filter(|&x| kept(x, thr)).collect();
            got.sort_unstable_by(|a, b| b.cmp(a));
            assert_eq!(got, sorted[..k.min(n)], "case {case} n {n} k {k}");
            // by hand, the way a device would drive it
            let mut s = Search::new(k as u64, n as u64);
            let mut passes = 0;
            while !s.is_done() {
                let mut h = Histogram::default();
                keys.iter().for_each(|&x| s.count(x, &mut h));
                s.step(&h);
                passes += 1;
                assert!(passes <= 13, "too many passes");
            }
            assert_eq!(s.threshold(), thr);
        }
    }
}

/// `top_k_threshold` on plain scores: top-K by score, ties to the later position.
#[test]
fn top_k_threshold_matches_sort() {
    let mut rng = Rng::new(23);
    for _ in 0..100 {
        let n = rng.range(0, 300);
        let s: Vec<f32> = (0..n).map(|_| rng.range(0, 20) as f32 * 0.25).collect();
        let k = rng.range(0, n + 2);
        let thr = top_k_threshold(&s, 0, k);
        let got: Vec<usize> = (0..n)
            .filter(|&i| kept(make_key(s[i], i as u32, 0, false), thr))
            .collect();
        let mut want =
            reference::top_positions(&s.iter().map(|&x| x as f64).collect::<Vec<_>>(), k.min(n));
        want.sort();
        assert_eq!(got, want);
    }
}

/// Model-wide top-K split over layer shards: per-shard histograms (`Search::count`),
/// merged on the "host" (`Histogram::merge`), one `step` per pass, then every shard keeps
/// `key >= threshold` alone. Equals the unsharded search, a full sort, and
/// `select_model`'s global allocation on the same scores (key: score·(1/layer Σ|s|) in f32,
/// position, unit = layer·Hkv + head — the documented construction).
#[test]
fn sharded_selection_equals_unsharded() {
    let mut rng = Rng::new(24);
    for case in 0..30 {
        let layers = rng.range(1, 9);
        let hkv = rng.range(1, 4);
        let n = rng.range(1, 120);
        let window = rng.pick(&[0, 1, 8]);
        let p = n - window.min(n);
        let scores: Vec<f32> = (0..layers * hkv * p)
            .map(|_| {
                if rng.coin(0.1) {
                    0.25
                } else {
                    ((rng.normal() * 2.0).exp()) as f32
                }
            })
            .collect();
        let budget = rng.range(0, p + 2) as u64;
        let key = |l: usize, kh: usize, i: usize| -> u128 {
            let ls: f64 = scores[l * hkv * p..(l + 1) * hkv * p]
                .iter()
                .map(|&x| (x as f64).abs())
                .sum();
            let scale = if ls > 0.0 { (1.0 / ls) as f32 } else { 1.0 };
            make_key(
                scores[(l * hkv + kh) * p + i] * scale,
                i as u32,
                (l * hkv + kh) as u32,
                false,
            )
        };
        let all: Vec<u128> = (0..layers)
            .flat_map(|l| (0..hkv).flat_map(move |kh| (0..p).map(move |i| (l, kh, i))))
            .map(|(l, kh, i)| key(l, kh, i))
            .collect();
        let total = all.len() as u64;
        let k = (layers * hkv) as u64 * budget.min(p as u64);
        // shards: random cut points over layers
        let mut cuts = vec![0usize];
        for l in 1..layers {
            if rng.coin(0.5) {
                cuts.push(l);
            }
        }
        cuts.push(layers);
        let shard_keys: Vec<Vec<u128>> = cuts
            .windows(2)
            .map(|c| all[c[0] * hkv * p..c[1] * hkv * p].to_vec())
            .collect();
        let mut s = Search::new(k, total);
        while !s.is_done() {
            let mut merged = Histogram::default();
            for sk in &shard_keys {
                let local = s; // each shard holds a copy of the state
                let mut h = Histogram::default();
                sk.iter().for_each(|&x| local.count(x, &mut h));
                merged.merge(&h);
            }
            s.step(&merged);
        }
        let thr = s.threshold();
        let unsharded = run_search(k, total, |sink| all.iter().for_each(|&x| sink(x)));
        assert_eq!(thr, unsharded, "case {case}");
        let mut sorted = all.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let cut = sorted.get(k as usize - 1.min(k as usize)).copied();
        let sharded_kept: Vec<Vec<u32>> = (0..layers * hkv)
            .map(|u| {
                (0..p)
                    .filter(|&i| kept(all[u * p + i], thr))
                    .map(|i| i as u32)
                    .collect()
            })
            .collect();
        let count: usize = sharded_kept.iter().map(|v| v.len()).sum();
        assert_eq!(count as u64, k.min(total), "case {case}: kept count");
        if k > 0 && (k as usize) <= sorted.len() {
            assert!(all.iter().filter(|&&x| x >= cut.unwrap()).count() as u64 == k);
        }
        let cfg = SelectConfig::new(AllocatorKind::Global, Granularity::Head, budget);
        let core = core_select(&cfg, &scores, layers, hkv, n, window).unwrap();
        for u in 0..layers * hkv {
            assert_eq!(
                &core[u][..core[u].len() - (n - p)],
                &sharded_kept[u][..],
                "case {case} unit {u}"
            );
        }
    }
}

// -------------------------------------------------------------------------- compaction --

/// Random ascending kept lists per head (ragged), as CSR with an offset base.
fn random_selection(rng: &mut Rng, heads: usize, n: usize, base: usize) -> (Vec<u64>, Vec<u32>) {
    let mut offsets = vec![base as u64];
    let mut indices = vec![u32::MAX; base];
    for _ in 0..heads {
        let keep = rng.pick(&[0.0, 0.3, 0.7, 1.0]);
        for i in 0..n {
            if rng.coin(keep) {
                indices.push(i as u32);
            }
        }
        offsets.push(indices.len() as u64);
    }
    (offsets, indices)
}

/// Head-major storage with spare capacity: `[Hkv, cap, d]`, view over the first `n` rows.
fn head_major_cap(t: &T3, dtype: DType, cap: usize, canary: f64) -> Stored {
    let (h, n, d) = (t.a, t.b, t.c);
    let mut big = T3::zeros(h, cap, d);
    for i in 0..h {
        for j in 0..cap {
            for k in 0..d {
                big.set(i, j, k, if j < n { t.at(i, j, k) } else { canary });
            }
        }
    }
    let (mut s, _) = Stored::new(&big, dtype, Layout::HeadMajor);
    s.extent = [h, n, d];
    s
}

/// In place: the first `len_h` rows of each head are the kept rows in order (bit exact);
/// the core writes nothing else — rows from `len_h` on keep their old contents (the API
/// leaves them unspecified; this pins that the core does not touch them), and memory
/// outside the view (spare capacity, padding) is untouched. `lengths` are the counts.
#[test]
fn compact_in_place_is_a_gather() {
    let mut rng = Rng::new(31);
    for case in 0..90 {
        let dtype = DTYPES[case % 3];
        let heads = rng.range(1, 4);
        let n = rng.range(1, 90);
        let d = rng.range(1, 40);
        let t = T3::normal(&mut rng, heads, n, d, 1.0);
        let mut st = match (case / 3) % 4 {
            0 => head_major_cap(&t, dtype, n + rng.range(0, 5), 12345.0),
            1 => Stored::with_pad(&t, dtype, Layout::HeadMajor, 7, 4321.0).0,
            2 => Stored::with_pad(&t, dtype, Layout::TokenMajor, 7, 4321.0).0,
            _ => Stored::with_pad(&t, dtype, Layout::Transposed, 7, 4321.0).0,
        };
        let before = st.clone();
        let base = rng.range(0, 3);
        let (offsets, indices) = if rng.coin(0.2) {
            // one shared set for every head (llama.cpp rows move whole)
            let (o, i) = random_selection(&mut rng, 1, n, base);
            let list = i[base..].to_vec();
            let mut offs = vec![base as u64];
            let mut idx = vec![u32::MAX; base];
            for _ in 0..heads {
                idx.extend(&list);
                offs.push(idx.len() as u64);
            }
            let _ = o;
            (offs, idx)
        } else {
            random_selection(&mut rng, heads, n, base)
        };
        let mut lengths = vec![u32::MAX; heads + 2];
        compact_in_place(&mut st.view_mut(), &offsets, &indices, Some(&mut lengths)).unwrap();
        let mut written = vec![false; st.bits().len()];
        for h in 0..heads {
            let list = &indices[offsets[h] as usize..offsets[h + 1] as usize];
            assert_eq!(
                lengths[h] as usize,
                list.len(),
                "case {case}: length of head {h}"
            );
            for (r, &src) in list.iter().enumerate() {
                for c in 0..d {
                    assert_eq!(
                        st.bits_at(h, r, c),
                        before.bits_at(h, src as usize, c),
                        "case {case}: head {h} row {r} col {c}"
                    );
                    written[st.offset(h, r, c)] = true;
                }
            }
        }
        assert!(
            lengths[heads..].iter().all(|&x| x == u32::MAX),
            "case {case}: lengths past Hkv"
        );
        let (a, b) = (st.bits(), before.bits());
        for o in 0..a.len() {
            if !written[o] {
                assert_eq!(
                    a[o], b[o],
                    "case {case}: element {o} outside the kept rows changed"
                );
            }
        }
    }
}

/// Varlen out of place: rows of every head, head after head, `cu_seqlens` prefix sums;
/// destination rows past the total and `cu_seqlens` past `Hkv + 1` untouched.
#[test]
fn compact_varlen_is_a_gather() {
    let mut rng = Rng::new(32);
    for case in 0..90 {
        let dtype = DTYPES[case % 3];
        let lay = LAYOUTS[(case / 3) % 3];
        let heads = rng.range(1, 4);
        let n = rng.range(1, 70);
        let d = rng.range(1, 33);
        let t = T3::normal(&mut rng, heads, n, d, 1.0);
        let (src, _) = Stored::new(&t, dtype, lay);
        let (offsets, indices) = {
            let base = rng.range(0, 3);
            random_selection(&mut rng, heads, n, base)
        };
        let total = (offsets[heads] - offsets[0]) as usize;
        let cap = total + rng.range(1, 4);
        let canary = T3 {
            a: 1,
            b: cap,
            c: d,
            data: vec![-999.0; cap * d],
        };
        let dlay = rng.pick(&[Layout::HeadMajor, Layout::Transposed]);
        let (mut dst, _) = Stored::with_pad(&canary, dtype, dlay, 5, -555.0);
        let before = dst.clone();
        let mut cu = vec![-1i32; heads + 3];
        compact_varlen(
            &src.view(),
            &offsets,
            &indices,
            &mut dst.view_mut(),
            &mut cu,
        )
        .unwrap();
        let mut o = 0usize;
        let mut written = vec![false; dst.bits().len()];
        for h in 0..heads {
            assert_eq!(cu[h] as usize, o, "case {case}: cu_seqlens[{h}]");
            for &t in &indices[offsets[h] as usize..offsets[h + 1] as usize] {
                for c in 0..d {
                    assert_eq!(
                        dst.bits_at(0, o, c),
                        src.bits_at(h, t as usize, c),
                        "case {case}"
                    );
                    written[dst.offset(0, o, c)] = true;
                }
                o += 1;
            }
        }
        assert_eq!(cu[heads] as usize, total);
        assert!(cu[heads + 1..].iter().all(|&x| x == -1));
        let (a, b) = (dst.bits(), before.bits());
        for e in 0..a.len() {
            if !written[e] {
                assert_eq!(a[e], b[e], "case {case}: dst element {e} changed");
            }
        }
    }
}

/// A real selection (select_model) compacted per layer, K head-major and V transposed:
/// every head's kept rows, window included, in order.
#[test]
fn select_then_compact() {
    let mut rng = Rng::new(33);
    let (layers, hkv, n, w, d) = (3, 2, 77, 8, 16);
    let p = n - w;
    let scores: Vec<f32> = (0..layers * hkv * p)
        .map(|_| rng.uniform() as f32)
        .collect();
    let cfg = SelectConfig::new(AllocatorKind::Ada, Granularity::Head, 20);
    let m = ModelScores {
        scores: &scores,
        layers,
        hkv,
        n,
        window: w,
    };
    let (no, ni) = select_output_len(&cfg, layers, hkv, n, w).unwrap();
    let (mut offsets, mut indices) = (vec![0u64; no], vec![0u32; ni]);
    let mut ws = vec![0u8; select_workspace_size(&cfg, layers, hkv, n, w).unwrap()];
    select_model(&cfg, &m, &mut offsets, &mut indices, &mut ws).unwrap();
    for l in 0..layers {
        let k = T3::normal(&mut rng, hkv, n, d, 1.0);
        let (mut ks, _) = Stored::new(&k, DType::F16, Layout::HeadMajor);
        let (mut vs, _) = Stored::new(&k, DType::F32, Layout::Transposed);
        let (k0, v0) = (ks.clone(), vs.clone());
        let offs = &offsets[l * hkv..(l + 1) * hkv + 1];
        compact_in_place(&mut ks.view_mut(), offs, &indices, None).unwrap();
        compact_in_place(&mut vs.view_mut(), offs, &indices, None).unwrap();
        for h in 0..hkv {
            let list = &indices[offs[h] as usize..offs[h + 1] as usize];
            assert!(list.ends_with(&(p as u32..n as u32).collect::<Vec<_>>()));
            for (r, &t) in list.iter().enumerate() {
                for c in 0..d {
                    assert_eq!(ks.bits_at(h, r, c), k0.bits_at(h, t as usize, c));
                    assert_eq!(vs.bits_at(h, r, c), v0.bits_at(h, t as usize, c));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------- rejected inputs --

/// Bad selection lists are refused before anything moves.
#[test]
fn bad_selections_leave_kv_untouched() {
    let mut rng = Rng::new(41);
    let (heads, n, d) = (2, 10, 4);
    let t = T3::normal(&mut rng, heads, n, d, 1.0);
    let bad: Vec<(Vec<u64>, Vec<u32>, &str)> = vec![
        (vec![0, 2, 4], vec![1, 1, 2, 3], "duplicate"),
        (vec![0, 2, 4], vec![3, 1, 2, 3], "descending"),
        (vec![0, 2, 4], vec![1, 2, 3, 10], "index >= n"),
        (vec![0, 2, 1], vec![1, 2, 3, 4], "offsets decrease"),
        (vec![0, 2, 9], vec![1, 2, 3, 4], "offsets past indices"),
        (vec![0, 2], vec![1, 2, 3, 4], "too few offsets"),
        (vec![0, 11, 11], (0..11).collect(), "more than n"),
    ];
    for (offs, idx, what) in &bad {
        assert!(validate_selection(offs, idx, heads, n).is_err(), "{what}");
        for lay in LAYOUTS {
            let (mut st, _) = Stored::with_pad(&t, DType::F32, lay, 3, 77.0);
            let before = st.bits();
            let mut lengths = vec![u32::MAX; heads];
            assert!(
                compact_in_place(&mut st.view_mut(), offs, idx, Some(&mut lengths)).is_err(),
                "{what}"
            );
            assert_eq!(st.bits(), before, "{what}: K/V changed");
            assert!(
                lengths.iter().all(|&x| x == u32::MAX),
                "{what}: lengths written"
            );
            // varlen
            let (src, _) = Stored::new(&t, DType::F32, lay);
            let canary = T3 {
                a: 1,
                b: 2 * n,
                c: d,
                data: vec![-1.0; 2 * n * d],
            };
            let (mut dst, _) = Stored::new(&canary, DType::F32, Layout::HeadMajor);
            let mut cu = vec![-7i32; heads + 1];
            assert!(compact_varlen(&src.view(), offs, idx, &mut dst.view_mut(), &mut cu).is_err());
            assert!(
                dst.f32.iter().all(|&x| x == -1.0) && cu.iter().all(|&x| x == -7),
                "{what}: varlen wrote"
            );
        }
    }
    // a good selection with an output problem
    let (offs, idx) = (vec![0u64, 3, 5], vec![0u32, 4, 9, 2, 3]);
    let (mut st, _) = Stored::new(&t, DType::F32, Layout::HeadMajor);
    let before = st.bits();
    let mut short = vec![u32::MAX; heads - 1];
    assert_eq!(
        compact_in_place(&mut st.view_mut(), &offs, &idx, Some(&mut short)),
        Err(Error::OutputTooSmall)
    );
    assert_eq!(st.bits(), before);
    let (src, _) = Stored::new(&t, DType::F32, Layout::HeadMajor);
    let run = |cap: usize, dd: usize, dt: DType, cu_len: usize| -> (Result<()>, bool) {
        let c = T3 {
            a: 1,
            b: cap,
            c: dd,
            data: vec![-1.0; cap * dd],
        };
        let (mut dst, _) = Stored::new(&c, dt, Layout::HeadMajor);
        let mut cu = vec![-7i32; cu_len];
        let r = compact_varlen(&src.view(), &offs, &idx, &mut dst.view_mut(), &mut cu);
        let same = dst.bits() == Stored::new(&c, dt, Layout::HeadMajor).0.bits()
            && cu.iter().all(|&x| x == -7);
        (r, same)
    };
    // refused, nothing written
    use DType::{F16, F32};
    use Error::{OutputTooSmall, ShapeMismatch};
    for (what, cap, dd, dt, cu_len, err) in [
        ("dst too small", 4, d, F32, 3, OutputTooSmall),
        ("cu_seqlens too small", 5, d, F32, 2, OutputTooSmall),
        ("row length", 5, d + 1, F32, 3, ShapeMismatch),
        ("dtype", 5, d, F16, 3, ShapeMismatch),
    ] {
        assert_eq!(run(cap, dd, dt, cu_len), (Err(err), true), "{what}");
    }
    assert_eq!(run(5, d, DType::F32, 3).0, Ok(()));
    // overlapping rows: a view whose token stride is smaller than a row
    let mut buf = vec![1.0f32; 64];
    let mut v = ViewMut::f32(&mut buf, [1, 8, 4], [0, 2, 1]).unwrap();
    assert_eq!(
        compact_in_place(&mut v, &[0, 2], &[1, 3], None),
        Err(Error::Aliasing)
    );
    // source and destination the same memory
    let mut same = vec![0.5f32; heads * n * d];
    let ptr = same.as_mut_ptr();
    let sv = unsafe {
        View::from_raw(
            ptr as *const u8,
            heads * n * d,
            DType::F32,
            [heads, n, d],
            [n * d, d, 1],
        )
    }
    .unwrap();
    let mut dv = unsafe {
        ViewMut::from_raw(
            ptr as *mut u8,
            heads * n * d,
            DType::F32,
            [1, heads * n, d],
            [0, d, 1],
        )
    }
    .unwrap();
    let mut cu = vec![-7i32; heads + 1];
    assert_eq!(
        compact_varlen(&sv, &offs, &idx, &mut dv, &mut cu),
        Err(Error::Aliasing)
    );
    assert!(same.iter().all(|&x| x == 0.5) && cu.iter().all(|&x| x == -7));
}

fn laprox_layer(rng: &mut Rng, hkv: usize, g: usize, n: usize, dk: usize) -> (T3, T3, T3, T3) {
    (
        T3::normal(rng, hkv * g, 8, dk, 1.0),
        T3::normal(rng, hkv, n, dk, 1.0),
        T3::normal(rng, hkv, n, dk, 1.0),
        T3::normal(rng, hkv * g, dk, 12, 0.3),
    )
}

/// NaN/Inf in any input, and too-small outputs or workspaces, are refused with nothing
/// written to `out` (canaries), for every scorer that reads the input.
#[test]
fn rejected_scoring_inputs_leave_output_untouched() {
    let mut rng = Rng::new(42);
    let (hkv, g, n, dk) = (2, 2, 70, 8);
    let presets = [
        Preset::SnapKv,
        Preset::Lava,
        Preset::LaProx,
        Preset::CriticalKv,
        Preset::KNorm,
        Preset::Tova,
        Preset::StreamingLlm,
    ];
    for pr in presets {
        for lay in LAYOUTS {
            let mut cfg = ScoreConfig::preset(pr);
            if cfg.scorer != ScorerKind::Tova {
                cfg.window = 8;
            }
            let (q, k, v, wo) = laprox_layer(&mut rng, hkv, g, n, dk);
            let (qs, _) = Stored::new(&q, DType::F32, Layout::HeadMajor);
            let (ks, _) = Stored::new(&k, DType::F32, lay);
            let (vs, _) = Stored::new(&v, DType::F32, lay);
            let (wos, _) = Stored::new(&wo, DType::F32, Layout::HeadMajor);
            let cross = cfg.scorer == ScorerKind::LaProx && cfg.laprox_gqa != LaproxGqa::Sum;
            let gram = core_gram(&wos, hkv, cross);
            let l1 = vec![1.0f32; hkv * n];
            let p = n - (cfg.window as usize).min(n);
            // poison one element (flat offset) of a store; None = run clean
            let attempt = |what: &str,
                           qs: &Stored,
                           ks: &Stored,
                           vs: &Stored,
                           gram: &[f32],
                           l1: &[f32],
                           out_len: usize,
                           ws_cut: usize|
             -> Result<()> {
                let inputs = LayerInputs {
                    queries: Some(qs.view()),
                    keys: Some(ks.view()),
                    values: Some(vs.view()),
                    gram: Some(gram),
                    value_forms: None,
                    value_l1: Some(l1),
                    row_lse: None,
                };
                let shape = layer_shape(&cfg, &inputs)?;
                let mut ws = vec![0u8; score_workspace_size(&cfg, &shape)? - ws_cut];
                let mut out = vec![-3.25f32; out_len];
                let r = score_layer(&cfg, &inputs, &mut out, &mut ws);
                if r.is_err() {
                    assert!(
                        out.iter().all(|&x| x == -3.25),
                        "{pr:?} {lay:?} {what}: output written on {r:?}"
                    );
                }
                r
            };
            assert_eq!(
                attempt("clean", &qs, &ks, &vs, &gram, &l1, hkv * p, 0),
                Ok(())
            );
            assert_eq!(
                attempt("short out", &qs, &ks, &vs, &gram, &l1, hkv * p - 1, 0),
                Err(Error::OutputTooSmall)
            );
            assert_eq!(
                attempt("short ws", &qs, &ks, &vs, &gram, &l1, hkv * p, 1),
                Err(Error::WorkspaceTooSmall)
            );
            for bad in [f64::NAN, f64::INFINITY] {
                // K: a prefix key and a window key
                for pos in [3usize, n - 2] {
                    let mut kb = ks.clone();
                    kb.set_flat(kb.offset(1, pos, 2), bad);
                    let r = attempt("bad K", &qs, &kb, &vs, &gram, &l1, hkv * p, 0);
                    if cfg.scorer == ScorerKind::StreamingLlm {
                        assert_eq!(r, Ok(()), "StreamingLLM reads no K values");
                    } else {
                        assert_eq!(r, Err(Error::NonFinite), "{pr:?} {lay:?} K[{pos}] = {bad}");
                    }
                }
                let mut qb = qs.clone();
                qb.set_flat(qb.offset(3, 7, 1), bad);
                let r = attempt("bad Q", &qb, &ks, &vs, &gram, &l1, hkv * p, 0);
                if cfg.needs_queries() {
                    assert_eq!(r, Err(Error::NonFinite), "{pr:?} Q = {bad}");
                } else {
                    assert_eq!(r, Ok(()), "{pr:?} does not read Q");
                }
                let mut vb = vs.clone();
                vb.set_flat(vb.offset(0, 5, 0), bad);
                let r = attempt("bad V", &qs, &ks, &vb, &gram, &l1, hkv * p, 0);
                if matches!(cfg.scorer, ScorerKind::Lava | ScorerKind::LaProx) {
                    assert_eq!(r, Err(Error::NonFinite), "{pr:?} V = {bad}");
                }
                if cfg.scorer == ScorerKind::LaProx {
                    let mut gb = gram.clone();
                    gb[5] = bad as f32;
                    assert_eq!(
                        attempt("bad gram", &qs, &ks, &vs, &gb, &l1, hkv * p, 0),
                        Err(Error::NonFinite)
                    );
                }
                if cfg.scorer == ScorerKind::CriticalKv {
                    let mut lb = l1.clone();
                    lb[n + 1] = bad as f32;
                    assert_eq!(
                        attempt("bad l1", &qs, &ks, &vs, &gram, &lb, hkv * p, 0),
                        Err(Error::NonFinite)
                    );
                }
            }
        }
    }
}

/// Shape problems are refused before anything is written.
#[test]
fn rejected_shapes() {
    let mut rng = Rng::new(43);
    let (q, k, v, _) = laprox_layer(&mut rng, 2, 2, 40, 8);
    let cfg = ScoreConfig {
        window: 8,
        ..ScoreConfig::preset(Preset::SnapKv)
    };
    let (ks, _) = Stored::new(&k, DType::F32, Layout::HeadMajor);
    let (vs, _) = Stored::new(&v, DType::F32, Layout::HeadMajor);
    let q_bad_d = T3::normal(&mut rng, 4, 8, 7, 1.0);
    let q_short = T3::normal(&mut rng, 4, 7, 8, 1.0);
    let q_heads = T3::normal(&mut rng, 3, 8, 8, 1.0);
    let v_n = T3::normal(&mut rng, 2, 39, 8, 1.0);
    for (qq, vv, want) in [
        (&q_bad_d, &v, Error::ShapeMismatch),
        (&q_short, &v, Error::InvalidArgument),
        (&q_heads, &v, Error::ShapeMismatch),
        (&q, &v_n, Error::ShapeMismatch),
    ] {
        let (qs, _) = Stored::new(qq, DType::F32, Layout::HeadMajor);
        let (vb, _) = Stored::new(vv, DType::F32, Layout::HeadMajor);
        let inputs = LayerInputs {
            queries: Some(qs.view()),
            keys: Some(ks.view()),
            values: Some(vb.view()),
            ..Default::default()
        };
        let mut out = vec![9.0f32; 1000];
        let mut ws = vec![0u8; 1 << 20];
        assert_eq!(score_layer(&cfg, &inputs, &mut out, &mut ws), Err(want));
        assert!(out.iter().all(|&x| x == 9.0));
    }
    let _ = vs;
}

/// compute_gram, compute_value_forms, compute_value_l1 refuse NaN with outputs untouched.
#[test]
fn rejected_value_inputs() {
    let mut rng = Rng::new(44);
    let (_, _, v, wo) = laprox_layer(&mut rng, 2, 3, 30, 8);
    let (mut wos, _) = Stored::new(&wo, DType::F32, Layout::HeadMajor);
    let (mut vs, _) = Stored::new(&v, DType::BF16, Layout::Transposed);
    let gram = core_gram(&wos, 2, true);
    wos.set_flat(17, f64::NAN);
    let mut out = vec![-1.0f32; gram.len()];
    let mut ws = vec![0u8; gram_workspace_size(8, 12).unwrap()];
    assert_eq!(
        compute_gram(&wos.view(), 2, true, &mut out, &mut ws),
        Err(Error::NonFinite)
    );
    assert!(out.iter().all(|&x| x == -1.0));
    let mut short = vec![-1.0f32; gram.len() - 1];
    let (wok, _) = Stored::new(&wo, DType::F32, Layout::HeadMajor);
    assert_eq!(
        compute_gram(&wok.view(), 2, true, &mut short, &mut ws),
        Err(Error::OutputTooSmall)
    );
    assert!(short.iter().all(|&x| x == -1.0));
    let o = vs.offset(1, 20, 3);
    vs.set_flat(o, f64::INFINITY);
    let mut forms = vec![-1.0f32; value_forms_len(6, 2, 30, true).unwrap()];
    assert_eq!(
        compute_value_forms(&vs.view(), &gram, 6, true, 0, 30, &mut forms),
        Err(Error::NonFinite)
    );
    assert!(forms.iter().all(|&x| x == -1.0));
    // a range that does not read the bad token is fine and writes only its columns
    compute_value_forms(&vs.view(), &gram, 6, true, 2, 9, &mut forms).unwrap();
    let nb = 3 + 3;
    for blk in 0..2 * nb {
        for t in 0..30 {
            let x = forms[blk * 30 + t];
            assert_eq!(x == -1.0, !(2..9).contains(&t), "block {blk} token {t}");
        }
    }
    let mut l1 = vec![-1.0f32; 60];
    let mut ws = vec![0u8; kvevict::gram::value_l1_workspace_size(8, 12).unwrap()];
    assert_eq!(
        compute_value_l1(&vs.view(), &wok.view(), &mut l1, &mut ws),
        Err(Error::NonFinite)
    );
    assert!(l1.iter().all(|&x| x == -1.0));
}

/// select_model refuses NaN scores and short outputs/workspaces with nothing written.
#[test]
fn rejected_selection_inputs() {
    let (layers, hkv, n, w) = (3, 2, 50, 5);
    let p = n - w;
    let mut rng = Rng::new(45);
    let scores: Vec<f32> = (0..layers * hkv * p)
        .map(|_| rng.uniform() as f32)
        .collect();
    for alloc in [
        AllocatorKind::Uniform,
        AllocatorKind::Lava,
        AllocatorKind::Global,
    ] {
        let cfg = SelectConfig::new(alloc, Granularity::Head, 10);
        let (no, ni) = select_output_len(&cfg, layers, hkv, n, w).unwrap();
        let wsn = select_workspace_size(&cfg, layers, hkv, n, w).unwrap();
        let run = |s: &[f32], no: usize, ni: usize, wsn: usize| -> Result<()> {
            let m = ModelScores {
                scores: s,
                layers,
                hkv,
                n,
                window: w,
            };
            let mut o = vec![u64::MAX; no];
            let mut i = vec![u32::MAX; ni];
            let mut ws = vec![0u8; wsn];
            let r = select_model(&cfg, &m, &mut o, &mut i, &mut ws);
            if r.is_err() {
                assert!(
                    o.iter().all(|&x| x == u64::MAX) && i.iter().all(|&x| x == u32::MAX),
                    "{alloc:?}: wrote on {r:?}"
                );
            }
            r
        };
        assert_eq!(run(&scores, no, ni, wsn), Ok(()));
        assert_eq!(run(&scores, no - 1, ni, wsn), Err(Error::OutputTooSmall));
        assert_eq!(run(&scores, no, ni - 1, wsn), Err(Error::OutputTooSmall));
        assert_eq!(run(&scores, no, ni, wsn - 1), Err(Error::WorkspaceTooSmall));
        assert_eq!(
            run(&scores[..scores.len() - 1], no, ni, wsn),
            Err(Error::ShapeMismatch)
        );
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut s = scores.clone();
            let at = rng.range(0, s.len() - 1);
            s[at] = bad;
            assert_eq!(run(&s, no, ni, wsn), Err(Error::NonFinite));
        }
    }
}

/// Finite inputs whose score overflows f32 (value norms near 1e19 squared by the Gram form)
/// are an error too. Unlike rejected inputs this is found while scoring: the core checks
/// the finished output, so `out` may already hold partial scores (reported, not pinned).
#[test]
fn produced_non_finite_is_an_error() {
    let mut rng = Rng::new(46);
    let (q, k, v, wo) = laprox_layer(&mut rng, 1, 2, 40, 8);
    let v = v.map(|x| x * 1e19);
    let (qs, _) = Stored::new(&q, DType::F32, Layout::HeadMajor);
    let (ks, _) = Stored::new(&k, DType::F32, Layout::HeadMajor);
    let (vs, _) = Stored::new(&v, DType::F32, Layout::HeadMajor);
    let (wos, _) = Stored::new(&wo, DType::F32, Layout::HeadMajor);
    let cx = CoreLayer {
        q: Some(qs),
        k: ks,
        v: Some(vs),
        wo: Some(wos),
    };
    let cfg = ScoreConfig {
        window: 8,
        ..ScoreConfig::preset(Preset::LaProx)
    };
    assert_eq!(
        core_score(&cfg, &cx, ValuePath::Gram),
        Err(Error::NonFinite)
    );
}

/// The workspace may start at any byte and hold garbage: exactly the queried size is
/// enough, and the results are bit-identical.
#[test]
fn workspace_alignment_and_garbage() {
    let mut rng = Rng::new(47);
    let (q, k, v, wo) = laprox_layer(&mut rng, 2, 4, 150, 16);
    let (qs, _) = Stored::new(&q, DType::F16, Layout::TokenMajor);
    let (ks, _) = Stored::new(&k, DType::F16, Layout::TokenMajor);
    let (vs, _) = Stored::new(&v, DType::F16, Layout::Transposed);
    let (wos, _) = Stored::new(&wo, DType::F32, Layout::HeadMajor);
    let gram = core_gram(&wos, 2, true);
    let mut cfg = ScoreConfig {
        window: 8,
        ..ScoreConfig::preset(Preset::LaProx)
    };
    cfg.laprox_gqa = LaproxGqa::Exact;
    let inputs = LayerInputs {
        queries: Some(qs.view()),
        keys: Some(ks.view()),
        values: Some(vs.view()),
        gram: Some(&gram),
        ..Default::default()
    };
    let shape = layer_shape(&cfg, &inputs).unwrap();
    let need = score_workspace_size(&cfg, &shape).unwrap();
    let len = score_len(&cfg, &shape).unwrap();
    let mut first: Option<Vec<u32>> = None;
    let mut big = vec![0u8; need + 64];
    for off in 0..64 {
        big.iter_mut()
            .for_each(|b| *b = if off % 2 == 0 { 0xFF } else { 0x7F });
        let mut out = vec![0f32; len];
        score_layer(&cfg, &inputs, &mut out, &mut big[off..off + need]).unwrap();
        let bits: Vec<u32> = out.iter().map(|x| x.to_bits()).collect();
        match &first {
            None => first = Some(bits),
            Some(f) => assert_eq!(&bits, f, "workspace offset {off}"),
        }
    }
    // selection
    let (layers, hkv, n, w) = (4, 2, 90, 6);
    let scores: Vec<f32> = (0..layers * hkv * (n - w))
        .map(|_| rng.uniform() as f32)
        .collect();
    for alloc in [AllocatorKind::Lava, AllocatorKind::Global] {
        for gran in [Granularity::Head, Granularity::Token] {
            let mut cfg = SelectConfig::new(alloc, gran, 17);
            cfg.post_pool = Pool::forward(8, 0.9);
            let need = select_workspace_size(&cfg, layers, hkv, n, w).unwrap();
            let (no, ni) = select_output_len(&cfg, layers, hkv, n, w).unwrap();
            let m = ModelScores {
                scores: &scores,
                layers,
                hkv,
                n,
                window: w,
            };
            let mut first: Option<(Vec<u64>, Vec<u32>)> = None;
            let mut big = vec![0xEEu8; need + 64];
            for off in 0..64 {
                let (mut o, mut i) = (vec![0u64; no], vec![0u32; ni]);
                select_model(&cfg, &m, &mut o, &mut i, &mut big[off..off + need]).unwrap();
                match &first {
                    None => first = Some((o, i)),
                    Some(f) => assert_eq!(&(o, i), f, "{alloc:?} {gran:?} offset {off}"),
                }
            }
        }
    }
}
