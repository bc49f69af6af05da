//! cuda/stats.cu: per-layer sums and entropy, token reduction, `head_reduce_all`.

use super::*;

// ----------------------------------------------- layer statistics, token reduction --

/// `kve_cuda_head_reduce_all` (TOVA's one launch): every output row equals, bit for bit,
/// `kve_cuda_head_reduce` of all `hq` rows into one (itself held to the reference above), for
/// each op; row gaps stay unwritten; in place (out == a) works; bad arguments give 1 and
/// write nothing.
#[test]
fn head_reduce_all_equals_head_reduce_of_every_row() {
    let mut rng = device_rng!(31);
    let (hq, n, reps) = (6usize, 300usize, 4usize);
    let (ld_a, ld_o) = (n + 7, n + 2);
    let a: Vec<f32> = (0..hq * n)
        .map(|e| rng.unif() * if e % 7 == 0 { -1.0 } else { 1.0 })
        .collect();
    let ad = DBuf::from(&strided(&a, hq, n, ld_a));
    for op in 0..3 {
        let one = poisoned(n);
        // SAFETY: device buffers of the sizes passed.
        ck(
            unsafe {
                kve_cuda_head_reduce(
                    ad.ptr(),
                    ld_a as i64,
                    null(),
                    0,
                    0,
                    null(),
                    one.ptr(),
                    n as i64,
                    hq as i64,
                    1,
                    n as i64,
                    op,
                    null_stream(),
                )
            },
            "head_reduce",
        );
        let want = one.download();
        // SAFETY: as above.
        let out = launched(reps * ld_o, "head_reduce_all", |out| unsafe {
            kve_cuda_head_reduce_all(
                ad.ptr(),
                ld_a as i64,
                out,
                ld_o as i64,
                hq as i64,
                reps as i64,
                n as i64,
                op,
                null_stream(),
            )
        });
        let got = unstride("head_reduce_all", &out, reps, n, ld_o);
        for r in 0..reps {
            let row = &got[r * n..(r + 1) * n];
            let same = row
                .iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "op {op} row {r}: {row:?}\nwant {want:?}");
        }
        // in place: rows 0..2 of a copy of a
        let inplace = DBuf::from(&strided(&a, hq, n, ld_a));
        // SAFETY: as above; out == a with the same ld is documented.
        ck(
            unsafe {
                kve_cuda_head_reduce_all(
                    inplace.ptr(),
                    ld_a as i64,
                    inplace.ptr(),
                    ld_a as i64,
                    hq as i64,
                    2,
                    n as i64,
                    op,
                    null_stream(),
                )
            },
            "in place",
        );
        let got = inplace.download();
        for r in 0..hq {
            let row = &got[r * ld_a..r * ld_a + n];
            if r < 2 {
                assert!(row
                    .iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits()));
            } else {
                assert_eq!(row, &a[r * n..(r + 1) * n], "op {op}: row {r} untouched");
            }
        }
    }
    let out = sentinel(reps * ld_o);
    let f = ad.ptr();
    let o = out.ptr();
    let call = |a: *const f32, lda: i64, o: *mut f32, ldo: i64, hq: i64, reps: i64, op: i32| {
        // SAFETY: refused calls touch no pointer.
        unsafe { kve_cuda_head_reduce_all(a, lda, o, ldo, hq, reps, n as i64, op, null_stream()) }
    };
    let (la, lo) = (ld_a as i64, ld_o as i64);
    for (what, rc) in [
        ("hq 0", call(f, la, o, lo, 0, 1, 0)),
        ("reps 0", call(f, la, o, lo, 6, 0, 0)),
        ("op 3", call(f, la, o, lo, 6, 1, 3)),
        ("ld_a < n", call(f, n as i64 - 1, o, lo, 6, 1, 0)),
        ("ld_out < n", call(f, la, o, n as i64 - 1, 6, 1, 0)),
        ("a NULL", call(null(), la, o, lo, 6, 1, 0)),
        ("out NULL", call(f, la, null_mut(), lo, 6, 1, 0)),
        ("in place, other ld", call(f, la, f, la + 1, 6, 1, 0)),
    ] {
        assert_eq!(rc, 1, "{what}");
    }
    assert_sentinel("head_reduce_all refusals", &out);
}

#[test]
fn layer_stats_and_token_reduce_match_reference() {
    let mut rng = device_rng!(6);
    let (layers, rpl, n) = (5usize, 3usize, 20000usize);
    let stride = rpl * n;
    let mut s: Vec<f32> = (0..layers * stride)
        .map(|_| rng.unif() * rng.unif())
        .collect();
    for x in s.iter_mut().take(100) {
        *x = 0.0; // zeros contribute nothing to the entropy
    }
    for x in s.iter_mut().skip(100).step_by(97) {
        *x = -*x; // negative scores count by |s|, as in the core
    }
    let sd = DBuf::from(&s);
    let wsb = unsafe { kve_cuda_layer_stats_workspace_size(layers as i64, stride as i64) };
    let ws = DBuf::<u8>::new(wsb);
    let sums = DBuf::from(&vec![f64::NAN; layers]);
    let ent = DBuf::from(&vec![f64::NAN; layers]);
    ck(
        unsafe {
            kve_cuda_layer_stats(
                sd.ptr(),
                stride as i64,
                stride as i64,
                layers as i64,
                sums.ptr(),
                ent.ptr(),
                ws.vptr(),
                wsb,
                null_mut(),
            )
        },
        "layer_stats",
    );
    let (gs, ge) = (sums.download(), ent.download());
    for l in 0..layers {
        let xs = &s[l * stride..(l + 1) * stride];
        let tot: f64 = xs.iter().map(|&x| (x as f64).abs()).sum();
        let e: f64 = xs
            .iter()
            .filter(|&&x| x != 0.0)
            .map(|&x| {
                let p = (x as f64).abs() / tot;
                -p * p.ln()
            })
            .sum();
        assert!(
            (gs[l] - tot).abs() <= 1e-9 * tot,
            "sum layer {l}: {} vs {tot}",
            gs[l]
        );
        assert!(
            (ge[l] - e).abs() <= 1e-9 * e.max(1.0),
            "entropy layer {l}: {} vs {e}",
            ge[l]
        );
        // and the core's entropy
        let core = kvevict::budget::lava::layer_entropy(xs);
        assert!(
            (ge[l] - core).abs() <= 1e-6 * e.max(1.0),
            "core entropy layer {l}: {core} vs gpu {}",
            ge[l]
        );
    }
    for norm in [false, true] {
        let got = launched(n, "token_reduce", |out| unsafe {
            kve_cuda_token_reduce(
                sd.ptr(),
                if norm { sums.ptr() } else { null() },
                layers as i64,
                rpl as i64,
                n as i64,
                out,
                null_mut(),
            )
        });
        let want: Vec<f64> = (0..n)
            .map(|i| {
                (0..layers)
                    .map(|l| {
                        let la: f64 = (0..rpl).map(|r| s[(l * rpl + r) * n + i] as f64).sum();
                        if norm {
                            la / gs[l]
                        } else {
                            la
                        }
                    })
                    .sum()
            })
            .collect();
        assert_close(&format!("token_reduce norm{norm}"), &got, &want, 1e-5);
        // bit for bit the core's token-granularity arithmetic (f32, (layer, row) order)
        let core: Vec<f32> = (0..n)
            .map(|i| {
                let mut acc = 0f32;
                for l in 0..layers {
                    let f = if norm && gs[l] > 0.0 {
                        (1.0 / gs[l]) as f32
                    } else {
                        1.0
                    };
                    for r in 0..rpl {
                        acc += s[(l * rpl + r) * n + i] * f;
                    }
                }
                acc
            })
            .collect();
        assert!(
            got.iter()
                .zip(&core)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "token_reduce norm{norm}: not the core's bits"
        );
    }
}

/// Edges of token_reduce and sink_scores (exact values: the header's f32 order without
/// FMA): sums NULL gives plain sums; a layer whose sum is <= 0 counts with factor 1; no
/// layers gives zeros; refusals write nothing; sinks honour the row stride.
#[test]
fn token_reduce_and_sinks_edges() {
    need_device!();
    let sd = DBuf::from(&[1.0f32, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0]);
    let out = sentinel(2);
    let reduce = |s: *const f32, sums: *const f64, layers: i64| {
        // SAFETY: 2 layers of 2 rows of 2 floats, out of 2 (device buffers).
        unsafe { kve_cuda_token_reduce(s, sums, layers, 2, 2, out.ptr(), null_mut()) }
    };
    ck(reduce(sd.ptr(), null(), 2), "token_reduce without sums");
    assert_eq!(out.download(), vec![4.0, 6.0]);
    let sums = DBuf::from(&[10.0f64, 0.0]);
    ck(reduce(sd.ptr(), sums.ptr(), 2), "token_reduce, a zero sum");
    let f = (1.0f64 / 10.0) as f32;
    assert_eq!(out.download(), vec![1.0 * f + 3.0 * f, 2.0 * f + 4.0 * f]);
    out.upload(&[SENTINEL; 2]);
    assert_eq!(
        reduce(null(), null(), 2),
        INVALID,
        "token_reduce without scores"
    );
    assert_eq!(
        reduce(sd.ptr(), null(), -1),
        INVALID,
        "token_reduce, layers < 0"
    );
    assert_sentinel("token_reduce refused", &out);
    ck(reduce(null(), null(), 0), "token_reduce without layers");
    assert_eq!(out.download(), vec![0.0; 2], "no layers: zeros");
    // sinks with a row stride
    let o = sentinel(2 * 5);
    // SAFETY: 2 rows of stride 5 (device buffer); the second call is refused.
    unsafe {
        ck(
            kve_cuda_sink_scores(o.ptr(), 2, 4, 5, 2, null_mut()),
            "sinks",
        );
        assert_eq!(
            o.download(),
            vec![1.0, 1.0, 0.0, 0.0, SENTINEL, 1.0, 1.0, 0.0, 0.0, SENTINEL]
        );
        o.upload(&[SENTINEL; 10]);
        let rc = kve_cuda_sink_scores(o.ptr(), 2, 4, 3, 2, null_mut());
        assert_eq!(rc, INVALID, "sinks, ld < n");
    }
    assert_sentinel("sinks refused", &o);
}

/// kve_cuda_layer_stats: per-layer Σ|s| and entropy against the core's (`layer_entropy`;
/// to 1e-12), a layer of zeros has entropy 0, the
/// entropy alone may be asked for; a row stride below the count, a short workspace or
/// NULL scores are refused with nothing written.
#[test]
fn layer_stats_equal_core() {
    let mut rng = device_rng!(61);
    let (layers, count, stride) = (5usize, 333usize, 340usize);
    let mut s = rng.vec(layers * stride, 3.0);
    s[2 * stride..2 * stride + count].fill(0.0);
    let sd = DBuf::from(&s);
    // SAFETY: a pure host function of the sizes.
    let wsz = unsafe { kve_cuda_layer_stats_workspace_size(layers as i64, count as i64) };
    let ws = DBuf::<u8>::new(wsz);
    let (sums, ent) = (
        DBuf::from(&vec![-1f64; layers]),
        DBuf::from(&vec![-1f64; layers]),
    );
    let stats = |sp: *const f32, st: usize, sm: *mut f64, en: *mut f64, wsb: usize| {
        // SAFETY: device buffers of the documented sizes, or refused before any launch.
        unsafe {
            kve_cuda_layer_stats(
                sp,
                st as i64,
                count as i64,
                layers as i64,
                sm,
                en,
                ws.vptr(),
                wsb,
                null_stream(),
            )
        }
    };
    ck(
        stats(sd.ptr(), stride, sums.ptr(), ent.ptr(), wsz),
        "layer_stats",
    );
    let (gs, ge) = (sums.download(), ent.download());
    for l in 0..layers {
        let x = &s[l * stride..l * stride + count];
        let (ws_, we) = (
            x.iter().map(|&v| (v as f64).abs()).sum::<f64>(),
            kvevict::budget::layer_entropy(x),
        );
        assert!(
            (gs[l] - ws_).abs() <= 1e-12 * ws_ && (ge[l] - we).abs() <= 1e-12 * we.max(1.0),
            "layer {l}"
        );
    }
    assert_eq!(ge[2], 0.0, "a layer of zeros");
    let e2 = DBuf::from(&vec![-1f64; layers]);
    ck(
        stats(sd.ptr(), stride, null_mut(), e2.ptr(), wsz),
        "entropy alone",
    );
    assert_eq!(e2.download(), ge);
    let e3 = DBuf::from(&vec![-1f64; layers]);
    for (st, wsb, sp, what) in [
        (
            count - 1,
            wsz,
            sd.ptr() as *const f32,
            "stride below the count",
        ),
        (stride, wsz - 1, sd.ptr(), "short workspace"),
        (stride, wsz, null(), "NULL scores"),
    ] {
        assert_eq!(stats(sp, st, null_mut(), e3.ptr(), wsb), INVALID, "{what}");
    }
    assert!(
        e3.download().iter().all(|&v| v == -1.0),
        "refused layer_stats wrote"
    );
}
