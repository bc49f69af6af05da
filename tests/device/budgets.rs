//! cuda/budgets.cu: layer budgets, forced entries, list broadcast and appended ranges.

use super::*;

// -------------------------------------------------- budgets, forced entries, lists --

#[test]
fn mark_forced_matches_reference() {
    let mut rng = device_rng!(42);
    let (rows, n) = (4usize, 400usize);
    let (ld, idx_ld) = (n + 5, n + 1);
    let s: Vec<f32> = (0..rows * ld).map(|_| rng.unif()).collect();
    let (idx, counts) = random_lists(&mut rng, rows, n, idx_ld);
    let (sd, id, cd) = (DBuf::from(&s), DBuf::from(&idx), DBuf::from(&counts));
    ck(
        unsafe {
            kve_cuda_mark_forced(
                sd.ptr(),
                ld as i64,
                rows as i64,
                cd.ptr(),
                id.ptr(),
                idx_ld as i64,
                null_mut(),
            )
        },
        "mark_forced",
    );
    let mut want = s.clone();
    for r in 0..rows {
        for t in 0..counts[r] as usize {
            want[r * ld + idx[r * idx_ld + t] as usize] = f32::INFINITY;
        }
    }
    assert_eq!(sd.download(), want, "mark_forced");
    // a select of exactly counts[r] per row then keeps the forced lists
    let kd = DBuf::from(&counts.iter().map(|&c| c as i64).collect::<Vec<i64>>());
    let (kc, ki) = select_rows(&sd, (ld, n, rows), Some(&kd), 0, "select forced");
    let (gc, gi) = (kc.download(), ki.download());
    for r in 0..rows {
        let c = counts[r] as usize;
        assert_eq!(gc[r] as usize, c, "forced count row {r}");
        assert_eq!(
            &gi[r * n..r * n + c],
            &idx[r * idx_ld..r * idx_ld + c],
            "forced list row {r}"
        );
    }
}

#[test]
fn broadcast_lists_matches_reference() {
    let mut rng = device_rng!(43);
    for &(src_rows, reps, src_ld, idx_ld) in &[(3usize, 4usize, 50usize, 64usize), (2, 1, 30, 30)] {
        let (mut idx, mut counts) = random_lists(&mut rng, src_rows, src_ld, src_ld);
        counts[src_rows - 1] = src_ld as i32; // one full list
        for t in 0..src_ld {
            idx[(src_rows - 1) * src_ld + t] = t as i32;
        }
        let (sid, scd) = (DBuf::from(&idx), DBuf::from(&counts));
        let rows = src_rows * reps;
        let (oc, oi) = lists_of(rows, idx_ld, -7);
        ck(
            unsafe {
                kve_cuda_broadcast_lists(
                    scd.ptr(),
                    sid.ptr(),
                    src_ld as i64,
                    src_rows as i64,
                    reps as i64,
                    oc.ptr(),
                    oi.ptr(),
                    idx_ld as i64,
                    null_mut(),
                )
            },
            "broadcast_lists",
        );
        let mut want_c = vec![0i32; rows];
        let mut want_i = vec![-7i32; rows * idx_ld];
        for u in 0..rows {
            let r = u / reps;
            want_c[u] = counts[r];
            for t in 0..counts[r] as usize {
                want_i[u * idx_ld + t] = idx[r * src_ld + t];
            }
        }
        assert_eq!(oc.download(), want_c, "broadcast counts (reps {reps})");
        assert_eq!(oi.download(), want_i, "broadcast lists (reps {reps})");
    }
}

/// Edges of the list launchers: mark_forced skips positions outside the row and marks
/// none for a negative count; broadcast_lists refuses outputs over its sources and
/// reps < 0; layer_budgets refuses bad modes and parameters, does nothing without layers,
/// and may leave k_unit NULL. Every refusal writes nothing.
#[test]
fn forced_broadcast_budgets_edges_and_rejections() {
    need_device!();
    let inf = f32::INFINITY;
    let counts = DBuf::from(&[2i32, 1]);
    let mark = |counts: *const i32, idx: &[i32]| -> (i32, Vec<f32>) {
        let (sd, id) = (DBuf::from(&[0.5f32; 2 * 6]), DBuf::from(idx));
        // SAFETY: device buffers of the declared sizes (2 rows of 6, lists of stride 4).
        let rc = unsafe { kve_cuda_mark_forced(sd.ptr(), 6, 2, counts, id.ptr(), 4, null_mut()) };
        (rc, sd.download())
    };
    let idx = [0i32, 5, 0, 0, 3, 0, 0, 0];
    let (rc, s) = mark(counts.ptr(), &idx);
    ck(rc, "mark_forced");
    assert_eq!(
        s,
        vec![inf, 0.5, 0.5, 0.5, 0.5, inf, 0.5, 0.5, 0.5, inf, 0.5, 0.5]
    );
    // positions outside the row are skipped
    let (rc, s) = mark(counts.ptr(), &[-1, 6, 0, 0, 3, 0, 0, 0]);
    ck(rc, "mark_forced, positions outside");
    assert!(
        s[..6].iter().all(|&v| v == 0.5),
        "mark_forced: outside marked"
    );
    assert_eq!(s[6 + 3], inf);
    // a negative count marks none
    let neg = DBuf::from(&[-3i32, 1]);
    let (rc, s) = mark(neg.ptr(), &idx);
    ck(rc, "mark_forced, negative count");
    assert_eq!(s.iter().filter(|v| v.is_infinite()).count(), 1);
    // no counts: refused, nothing written
    let (rc, s) = mark(null(), &idx);
    assert_eq!(rc, INVALID, "mark_forced without counts");
    assert!(s.iter().all(|&v| v == 0.5), "mark_forced refused: written");

    // broadcast: two source rows, three copies each; the slots past a count untouched
    let (sc, si) = (DBuf::from(&[2i32, 0]), DBuf::from(&[4i32, 7, -1, 9, 9, 9]));
    let (c, i) = (DBuf::from(&[-1i32; 6]), DBuf::from(&[-1i32; 6 * 3]));
    // SAFETY: device buffers of the declared sizes.
    let rc = unsafe {
        kve_cuda_broadcast_lists(sc.ptr(), si.ptr(), 3, 2, 3, c.ptr(), i.ptr(), 3, null_mut())
    };
    ck(rc, "broadcast_lists");
    assert_eq!(c.download(), vec![2, 2, 2, 0, 0, 0]);
    let got = i.download();
    for u in 0..3 {
        assert_eq!(&got[u * 3..u * 3 + 3], &[4, 7, -1]);
    }
    assert!(got[9..].iter().all(|&v| v == -1));
    // outputs over the sources, reps < 0: refused, nothing written
    let sc2 = DBuf::from(&[2i32, 0, -1, -1, -1, -1]);
    let i = DBuf::from(&[-1i32; 6 * 3]);
    let (c2, sip) = (sc2.ptr(), si.ptr());
    for (what, src_c, src_i, reps, out_c) in [
        (
            "counts over the source counts",
            c2 as *const i32,
            sip as *const i32,
            3,
            c2,
        ),
        (
            "counts over the source lists",
            sip as *const i32,
            c2 as *const i32,
            3,
            c2,
        ),
        (
            "reps < 0",
            sc.ptr() as *const i32,
            sip as *const i32,
            -1,
            c2,
        ),
    ] {
        // SAFETY: device buffers of the declared sizes; refused before any is touched.
        let rc = unsafe {
            kve_cuda_broadcast_lists(src_c, src_i, 3, 2, reps, out_c, i.ptr(), 3, null_mut())
        };
        assert_eq!(rc, INVALID, "broadcast_lists: {what}");
    }
    assert_eq!(sc2.download(), vec![2, 0, -1, -1, -1, -1]);
    assert!(i.download().iter().all(|&v| v == -1));

    // budgets: bad mode, lava without weights, pyramid beta 0, alpha out of range,
    // per_layer 0 (even without layers), layers < 0, layers·per_layer·p >= 2^62
    let (kl, ku) = (DBuf::from(&[-1i64; 3]), DBuf::from(&[-1i64; 6]));
    let budgets = |mode, layers, per, p, beta, alpha, kl: *mut i64, ku: *mut i64| {
        // SAFETY: device buffers of 3 and 6 entries (the shapes that pass the checks).
        unsafe {
            kve_cuda_layer_budgets(
                mode,
                null(),
                layers,
                per,
                p,
                4,
                beta,
                alpha,
                kl,
                ku,
                null_mut(),
            )
        }
    };
    for (mode, layers, per, p, beta, alpha) in [
        (4, 3, 2, 10, 20, 0.2f32),
        (KVE_CUDA_BUDGET_LAVA, 3, 2, 10, 20, 0.2),
        (KVE_CUDA_BUDGET_PYRAMID, 3, 2, 10, 0, 0.2),
        (KVE_CUDA_BUDGET_ADA, 3, 2, 10, 20, 1.5),
        (KVE_CUDA_BUDGET_ADA, 3, 2, 10, 20, f32::NAN),
        (KVE_CUDA_BUDGET_UNIFORM, 3, 0, 10, 20, 0.2),
        (KVE_CUDA_BUDGET_UNIFORM, 0, 0, 10, 20, 0.2),
        (KVE_CUDA_BUDGET_UNIFORM, -1, 2, 10, 20, 0.2),
        (KVE_CUDA_BUDGET_UNIFORM, 4, 1 << 30, 1 << 30, 20, 0.2),
    ] {
        let rc = budgets(mode, layers, per, p, beta, alpha, kl.ptr(), ku.ptr());
        assert_eq!(
            rc, INVALID,
            "layer_budgets mode {mode} layers {layers} per {per}"
        );
    }
    assert!(kl.download().iter().all(|&v| v == -1) && ku.download().iter().all(|&v| v == -1));
    // no layers: nothing to do
    let rc = budgets(
        KVE_CUDA_BUDGET_UNIFORM,
        0,
        2,
        10,
        20,
        0.2,
        null_mut(),
        null_mut(),
    );
    ck(rc, "layer_budgets without layers");
    // pyramid against the core's formula; k_unit may be NULL
    let rc = budgets(
        KVE_CUDA_BUDGET_PYRAMID,
        3,
        2,
        10,
        20,
        0.2,
        kl.ptr(),
        null_mut(),
    );
    ck(rc, "layer_budgets pyramid");
    let got = kl.download();
    for l in 0..3 {
        let want = 2 * kvevict::budget::pyramid_budget(4, 20, l, 3).min(10) as i64;
        assert_eq!(got[l], want, "pyramid layer {l}");
    }
}

#[test]
fn append_range_matches_reference() {
    let mut rng = device_rng!(47);
    let (rows, ld, start, count) = (300usize, 80usize, 50usize, 30usize);
    // prefix lists of up to ld - count entries (the caller's guarantee), one empty
    let (mut idx, mut counts) = random_lists(&mut rng, rows, ld - count, ld);
    counts[0] = 0;
    let (di, dc) = (DBuf::from(&idx), DBuf::from(&counts));
    ck(
        unsafe {
            kve_cuda_append_range(
                dc.ptr(),
                di.ptr(),
                ld as i64,
                rows as i64,
                start as i64,
                count as i64,
                null_mut(),
            )
        },
        "append_range",
    );
    for r in 0..rows {
        let c = counts[r] as usize;
        for t in 0..count {
            idx[r * ld + c + t] = (start + t) as i32;
        }
        counts[r] += count as i32;
    }
    assert_eq!(dc.download(), counts, "append_range counts");
    assert_eq!(di.download(), idx, "append_range lists");
}

#[test]
fn layer_budgets_match_core_exactly() {
    let mut rng = device_rng!(44);
    // (layers, per_layer, p, budget, beta, alpha)
    let cases: &[(usize, usize, u64, u64, u32, f32)] = &[
        (32, 8, 4000, 400, 20, 0.2),
        (1, 4, 100, 1000, 20, 0.5),
        (7, 3, 1 << 40, (1 << 39) + 12345, 3, 1.0),
        (5, 2, 50, 45, 1, 0.0),
        (12, 1, 1000, u64::MAX, 20, 0.3),
        (3, 5, 0, 10, 20, 0.2),
        (4, 8, 64, 0, 7, 0.2),
        (9, 4, 333, 100, 2, 0.7),
        (6, 1, 1 << 50, u64::MAX, 20, 0.25),
    ];
    for (ci, &(layers, per, p, budget, beta, alpha)) in cases.iter().enumerate() {
        // entropies: random, a zero, a negative (counts as 0); case 3 all zero (equal
        // split); case 7 skewed (one layer hits its cap, the excess moves on)
        let weights: Vec<f64> = (0..layers)
            .map(|l| match (ci, l) {
                (3, _) => 0.0,
                (7, 0) => 1e3,
                (_, 1) => 0.0,
                (_, 2) => -1.0,
                _ => 3.0 * rng.unif() as f64 + rng.unif() as f64 * 1e-7,
            })
            .collect();
        let wd = DBuf::from(&weights);
        for mode in [
            KVE_CUDA_BUDGET_UNIFORM,
            KVE_CUDA_BUDGET_PYRAMID,
            KVE_CUDA_BUDGET_ADA,
            KVE_CUDA_BUDGET_LAVA,
        ] {
            let (want_l, want_u) =
                core_budgets(mode, &weights, layers, per, p, budget, beta, alpha);
            for with_units in [true, false] {
                let kl = DBuf::from(&vec![-1i64; layers]);
                let ku = DBuf::from(&vec![-1i64; layers * per]);
                ck(
                    unsafe {
                        kve_cuda_layer_budgets(
                            mode,
                            if mode == KVE_CUDA_BUDGET_LAVA {
                                wd.ptr()
                            } else {
                                null()
                            },
                            layers as i64,
                            per as i64,
                            p as i64,
                            budget,
                            beta,
                            alpha,
                            kl.ptr(),
                            if with_units { ku.ptr() } else { null_mut() },
                            null_mut(),
                        )
                    },
                    "layer_budgets",
                );
                let what = format!(
                    "layer_budgets mode {mode} layers {layers} per {per} p {p} budget {budget} beta {beta} alpha {alpha}"
                );
                assert_eq!(kl.download(), want_l, "{what}: k_layer");
                let units = ku.download();
                if with_units {
                    assert_eq!(units, want_u, "{what}: k_unit");
                } else {
                    assert!(
                        units.iter().all(|&u| u == -1),
                        "{what}: k_unit NULL written"
                    );
                }
            }
        }
    }
    // capturable: LAVa budgets in a CUDA graph, replayed twice
    let (layers, per, p) = (8usize, 4usize, 500u64);
    let weights: Vec<f64> = (0..layers).map(|_| rng.unif() as f64).collect();
    let wd = DBuf::from(&weights);
    let (kl, ku) = (
        DBuf::from(&vec![-1i64; layers]),
        DBuf::from(&vec![-1i64; layers * per]),
    );
    in_graph(&|s| {
        ck(
            unsafe {
                kve_cuda_layer_budgets(
                    KVE_CUDA_BUDGET_LAVA,
                    wd.ptr(),
                    layers as i64,
                    per as i64,
                    p as i64,
                    100,
                    20,
                    0.2,
                    kl.ptr(),
                    ku.ptr(),
                    s,
                )
            },
            "layer_budgets in a graph",
        )
    });
    let (want_l, want_u) =
        core_budgets(KVE_CUDA_BUDGET_LAVA, &weights, layers, per, p, 100, 20, 0.2);
    assert_eq!(kl.download(), want_l, "graph k_layer");
    assert_eq!(ku.download(), want_u, "graph k_unit");
}
