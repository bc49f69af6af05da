//! `kve_cuda_select` (cuda/select.cu): top-k selection per group, exactly the reference.

use super::*;

// ----------------------------------------------------------- selection, compaction --

#[test]
fn select_matches_reference_exactly() {
    let mut rng = device_rng!(7);
    // (layers, hkv, n): shapes; modes: global, per layer, per head. Rows past 4096
    // positions are written in chunks by several blocks (5000: 2, 20000: 5).
    for &(layers, hkv, n) in &[
        (4usize, 2usize, 1000usize),
        (3, 4, 37),
        (2, 1, 5000),
        (3, 2, 20000),
        (1, 1, 1),
    ] {
        let rows = layers * hkv;
        for mode in 0..3 {
            for ties in [false, true] {
                let s: Vec<f32> = (0..rows * n)
                    .map(|_| {
                        if ties {
                            (rng.below(7) as f32) * 0.25
                        } else {
                            rng.unif()
                        }
                    })
                    .collect();
                let (groups, rpg) = match mode {
                    0 => (1, rows),
                    1 => (layers, hkv),
                    _ => (rows, 1),
                };
                let ks: Vec<i64> = (0..groups)
                    .map(|_| rng.below(rpg * n + 2) as i64 - 1)
                    .collect();
                let norm = rng.below(2) == 1;
                let sums: Vec<f64> = (0..layers)
                    .map(|l| {
                        s[l * hkv * n..(l + 1) * hkv * n]
                            .iter()
                            .map(|&x| x as f64)
                            .sum::<f64>()
                            .max(1e-3)
                    })
                    .collect();
                let sums = norm.then_some(&sums[..]);
                let got = select_lists(&s, n, groups, rpg, Some(&ks), 0, sums, hkv);
                let want = ref_select(&s, n, groups, rpg, &ks, sums.map(|s| (s, hkv)));
                for r in 0..rows {
                    assert_eq!(
                        got[r], want[r],
                        "select row {r} (layers {layers} hkv {hkv} n {n} mode {mode} ties {ties} norm {norm})"
                    );
                }
            }
        }
    }
}

/// `kve_cuda_select` over `groups · rpg` rows of `s` (row stride and length `n`): the kept
/// lists per row; the index slots past each count stay unwritten.
#[allow(clippy::too_many_arguments)]
fn select_lists(
    s: &[f32],
    n: usize,
    groups: usize,
    rpg: usize,
    k: Option<&[i64]>,
    k_all: i64,
    sums: Option<&[f64]>,
    rpl: usize,
) -> Vec<Vec<i32>> {
    let (rows, idx_ld) = (groups * rpg, n + 3);
    let sd = DBuf::from(s);
    let kd = k.map(DBuf::from);
    let lsd = sums.map(DBuf::from);
    let (counts, idx) = lists_of(rows, idx_ld, -7);
    // SAFETY: a pure host function.
    let wsb = unsafe { kve_cuda_select_workspace_size(groups as i64) };
    let ws = DBuf::<u8>::new(wsb);
    // SAFETY: device buffers of the declared sizes.
    let rc = unsafe {
        kve_cuda_select(
            sd.ptr(),
            n as i64,
            n as i64,
            groups as i64,
            rpg as i64,
            kd.as_ref().map_or(null(), |b| b.ptr()),
            k_all,
            lsd.as_ref().map_or(null(), |b| b.ptr()),
            rpl as i64,
            counts.ptr(),
            idx.ptr(),
            idx_ld as i64,
            ws.vptr(),
            wsb,
            null_mut(),
        )
    };
    ck(rc, "select");
    let (gc, gi) = (counts.download(), idx.download());
    (0..rows)
        .map(|r| {
            let c = gc[r] as usize;
            let past = &gi[r * idx_ld + c..(r + 1) * idx_ld];
            assert!(
                past.iter().all(|&v| v == -7),
                "select row {r}: written past its count"
            );
            gi[r * idx_ld..r * idx_ld + c].to_vec()
        })
        .collect()
}

/// Edges of `kve_cuda_select`: equal keys (the later position first, then the lower row),
/// NaN lowest and ±inf, k <= 0 and k >= size, per-group k, n == 0 (counts zeroed, nothing
/// else read), and refusals that write nothing.
#[test]
fn select_ties_nan_and_edges() {
    need_device!();
    let s = vec![1.0f32; 2 * 4];
    assert_eq!(
        select_lists(&s, 4, 1, 2, None, 3, None, 1),
        vec![vec![2, 3], vec![3]],
        "ties"
    );
    let s = vec![f32::NAN, f32::NEG_INFINITY, 0.5, f32::INFINITY];
    assert_eq!(
        select_lists(&s, 4, 1, 1, None, 2, None, 1),
        vec![vec![2, 3]]
    );
    assert_eq!(
        select_lists(&s, 4, 1, 1, None, 3, None, 1),
        vec![vec![1, 2, 3]],
        "NaN lowest, -inf above it"
    );
    assert_eq!(
        select_lists(&s, 2, 2, 1, Some(&[-1i64, 9][..]), 0, None, 1),
        vec![vec![], vec![0, 1]],
        "k <= 0 keeps none, k >= size all"
    );
    // n == 0: the counts zeroed, nothing else read
    let counts = DBuf::from(&[5i32; 3]);
    // SAFETY: only `counts` (3 rows) is written.
    let rc = unsafe {
        kve_cuda_select(
            null(),
            0,
            0,
            3,
            1,
            null(),
            1,
            null(),
            0,
            counts.ptr(),
            null_mut(),
            0,
            null_mut(),
            0,
            null_mut(),
        )
    };
    ck(rc, "select n 0");
    assert_eq!(counts.download(), vec![0; 3]);
    // refusals: ld < n, idx_ld < n, workspace too small, layer sums without rows per layer
    let sd = DBuf::from(&s);
    let counts = DBuf::from(&[5i32; 2]);
    let idx = DBuf::from(&[5i32; 8]);
    // SAFETY: a pure host function.
    let wsz = unsafe { kve_cuda_select_workspace_size(2) };
    let ws = DBuf::<u8>::new(wsz);
    let sums = DBuf::from(&[1.0f64]);
    for (what, ld, idx_ld, wsb, ls, rpl) in [
        ("ld < n", 3, 4, wsz, null(), 0),
        ("idx_ld < n", 4, 3, wsz, null(), 0),
        ("workspace too small", 4, 4, wsz - 1, null(), 0),
        (
            "sums without rows per layer",
            4,
            4,
            wsz,
            sums.ptr() as *const f64,
            0,
        ),
    ] {
        // SAFETY: device buffers of the declared sizes; refused before any is touched.
        let rc = unsafe {
            kve_cuda_select(
                sd.ptr(),
                ld,
                4,
                2,
                1,
                null(),
                1,
                ls,
                rpl,
                counts.ptr(),
                idx.ptr(),
                idx_ld,
                ws.vptr(),
                wsb,
                null_mut(),
            )
        };
        assert_eq!(rc, INVALID, "select: {what}");
    }
    assert_eq!(
        counts.download(),
        vec![5; 2],
        "select refusals: counts written"
    );
    assert_eq!(idx.download(), vec![5; 8], "select refusals: idx written");
}
