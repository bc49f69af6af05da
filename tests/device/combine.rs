//! cuda/combine.cu: GQA head reductions and LaProx's exact-GQA combine.

use super::*;

// --------------------------------------------------- head reductions, LaProx exact --

#[test]
fn head_reduce_and_laprox_exact_match_reference() {
    let mut rng = device_rng!(5);
    let (hkv, g, n) = (3usize, 4usize, 500usize);
    let hq = hkv * g;
    let (ld_a, ld_b, ld_o) = (n + 3, n + 17, n + 5);
    // every 5th token negative in all heads (a max of negatives is not 0); one sign per
    // token, so the group sums do not cancel
    let a: Vec<f32> = (0..hq * n)
        .map(|e| rng.unif() * if e % n % 5 == 0 { -1.0 } else { 1.0 })
        .collect();
    let b: Vec<f32> = (0..hq * n).map(|_| rng.unif() * 5.0).collect();
    // the sqrt factor's input, a third negative: sqrt(max(b, 0)) (b_mode 2 keeps `b`)
    let b_neg: Vec<f32> = b
        .iter()
        .enumerate()
        .map(|(e, &x)| if e % 3 == 0 { -x } else { x })
        .collect();
    let sc: Vec<f32> = (0..hkv).map(|_| 1.0 + rng.unif()).collect();
    let (ad, sd) = (DBuf::from(&strided(&a, hq, n, ld_a)), DBuf::from(&sc));
    let bds = [
        DBuf::from(&strided(&b_neg, hq, n, ld_b)),
        DBuf::from(&strided(&b, hq, n, ld_b)),
    ];
    let b_of = |bm: i32| if bm == 1 { &b_neg } else { &b };
    let bd_of = |bm: i32| &bds[(bm != 1) as usize];
    let reference = |op: i32, bm: i32, use_scale: bool, hkv: usize, g: usize| -> Vec<f64> {
        let b = b_of(bm);
        let mut want = vec![0f64; hkv * n];
        for hk in 0..hkv {
            for i in 0..n {
                let xs: Vec<f64> = (0..g)
                    .map(|hh| {
                        let h = hk * g + hh;
                        let mut x = a[h * n + i] as f64;
                        if bm == 1 {
                            x *= (b[h * n + i].max(0.0) as f64).sqrt();
                        }
                        if bm == 2 {
                            x *= b[h * n + i] as f64;
                        }
                        if use_scale {
                            x *= sc[hk] as f64;
                        }
                        x
                    })
                    .collect();
                want[hk * n + i] = gqa(op, &xs);
            }
        }
        want
    };
    for op in 0..3 {
        for bm in 0..3 {
            for use_scale in [false, true] {
                let out = poisoned(hkv * ld_o);
                ck(
                    unsafe {
                        kve_cuda_head_reduce(
                            ad.ptr(),
                            ld_a as i64,
                            if bm == 0 { null() } else { bd_of(bm).ptr() },
                            ld_b as i64,
                            bm,
                            if use_scale { sd.ptr() } else { null() },
                            out.ptr(),
                            ld_o as i64,
                            hq as i64,
                            hkv as i64,
                            n as i64,
                            op,
                            null_mut(),
                        )
                    },
                    "head_reduce",
                );
                let what = format!("head_reduce op{op} b{bm} scale{use_scale} (strided)");
                let got = unstride(&what, &out.download(), hkv, n, ld_o);
                let want = reference(op, bm, use_scale, hkv, g);
                assert_close(&what, &got, &want, 1e-5);
            }
        }
    }
    // in place (Hkv == Hq, out == a, same row stride): plain per-head products
    for bm in 1..3 {
        let inplace = DBuf::from(&strided(&a, hq, n, ld_a));
        ck(
            unsafe {
                kve_cuda_head_reduce(
                    inplace.ptr(),
                    ld_a as i64,
                    bd_of(bm).ptr(),
                    ld_b as i64,
                    bm,
                    null(),
                    inplace.ptr(),
                    ld_a as i64,
                    hq as i64,
                    hq as i64,
                    n as i64,
                    KVE_CUDA_GQA_SUM,
                    null_mut(),
                )
            },
            "head_reduce in place",
        );
        let what = format!("head_reduce in place b{bm}");
        let got = unstride(&what, &inplace.download(), hq, n, ld_a);
        assert_close(
            &what,
            &got,
            &reference(KVE_CUDA_GQA_SUM, bm, false, hq, 1),
            1e-6,
        );
    }
    // refusals (nothing written): b missing for b_mode 1, Hq not a multiple of Hkv, an
    // unknown b_mode or GQA op, ld_b < n; in place only element for element (not with a
    // group of g > 1, not with another row stride)
    let out = sentinel(hkv * ld_o);
    let bd = bd_of(2).ptr() as *const f32;
    let (ldo, ld_in) = (ld_o as i64, ld_a as i64);
    let (o, inp) = (out.ptr(), ad.ptr());
    for (what, bm, b_p, ld_b, hk, op, o, ld_out) in [
        ("b_mode 1 without b", 1, null(), ld_b, hkv, 0, o, ldo),
        ("hq % hkv != 0", 0, bd, ld_b, 5, 0, o, ldo),
        ("b_mode 3", 3, bd, ld_b, hkv, 0, o, ldo),
        ("GQA op 3", 0, bd, ld_b, hkv, 3, o, ldo),
        ("ld_b < n", 2, bd, n - 1, hkv, 0, o, ldo),
        ("in place, g > 1", 0, null(), 0, hkv, 0, inp, ld_in),
        (
            "in place, other stride",
            0,
            null(),
            0,
            hq,
            0,
            inp,
            ld_in + 1,
        ),
    ] {
        // SAFETY: device buffers of the declared sizes; refused before any is touched.
        let rc = unsafe {
            kve_cuda_head_reduce(
                inp,
                ld_in,
                b_p,
                ld_b as i64,
                bm,
                null(),
                o,
                ld_out,
                hq as i64,
                hk as i64,
                n as i64,
                op,
                null_mut(),
            )
        };
        assert_eq!(rc, INVALID, "head_reduce: {what}");
    }
    assert_sentinel("head_reduce refusals: out", &out);
    let got_a = unstride("head_reduce refusals: a", &ad.download(), hq, n, ld_a);
    assert_eq!(got_a, a, "head_reduce refusals: a written");
    // exact GQA from cross terms, every mode, strided; unused inputs passed as NULL
    let np = g * (g + 1) / 2;
    let (ld_c, ld_q) = (n + 9, n + 1);
    let cross: Vec<f32> = (0..hkv * np * n).map(|_| rng.unif()).collect();
    let mut qv: Vec<f32> = (0..hkv * np * n).map(|_| rng.unif()).collect();
    for x in qv.iter_mut().step_by(13) {
        *x *= -0.25; // rounding can make v G vᵀ slightly negative: clamped at 0
    }
    let (cd, qd) = (
        DBuf::from(&strided(&cross, hkv * np, n, ld_c)),
        DBuf::from(&strided(&qv, hkv * np, n, ld_q)),
    );
    for mode in [
        KVE_CUDA_LAPROX_EXACT,
        KVE_CUDA_LAPROX_MEAN_ATTN,
        KVE_CUDA_LAPROX_ATTN_TERM,
        KVE_CUDA_LAPROX_VALUE_TERM,
    ] {
        let out = poisoned(hkv * ld_o);
        ck(
            unsafe {
                kve_cuda_laprox_exact(
                    if mode == KVE_CUDA_LAPROX_VALUE_TERM {
                        null()
                    } else {
                        cd.ptr()
                    },
                    ld_c as i64,
                    if mode == KVE_CUDA_LAPROX_ATTN_TERM {
                        null()
                    } else {
                        qd.ptr()
                    },
                    ld_q as i64,
                    out.ptr(),
                    ld_o as i64,
                    hkv as i64,
                    g as i64,
                    n as i64,
                    mode,
                    null_mut(),
                )
            },
            "laprox_exact",
        );
        let mut want = vec![0f64; hkv * n];
        for hk in 0..hkv {
            for i in 0..n {
                let (mut s, mut cs, mut vs) = (0f64, 0f64, 0f64);
                for p in 0..np {
                    let w = if p < g { 1.0 } else { 2.0 };
                    let c = cross[(hk * np + p) * n + i] as f64;
                    let q = qv[(hk * np + p) * n + i] as f64;
                    s += w * c * q;
                    cs += w * c;
                    if p < g {
                        vs += q.max(0.0).sqrt();
                    }
                }
                let (attn, value) = (cs.max(0.0).sqrt(), vs / g as f64);
                want[hk * n + i] = match mode {
                    KVE_CUDA_LAPROX_EXACT => s.max(0.0).sqrt(),
                    KVE_CUDA_LAPROX_MEAN_ATTN => attn * value,
                    KVE_CUDA_LAPROX_ATTN_TERM => attn,
                    _ => value,
                };
            }
        }
        let what = format!("laprox_exact mode{mode} (strided)");
        let got = unstride(&what, &out.download(), hkv, n, ld_o);
        assert_close(&what, &got, &want, 1e-5);
    }
    // refusals (nothing written): an input the mode reads missing, an unknown mode, a row
    // stride below n, a group past 64
    let out = sentinel(hkv * ld_o);
    let (c, q) = (cd.ptr() as *const f32, qd.ptr() as *const f32);
    for (what, c, ld_c, q, mode, g) in [
        (
            "exact without cross",
            null(),
            ld_c,
            q,
            KVE_CUDA_LAPROX_EXACT,
            g,
        ),
        (
            "mean-attn without qv",
            c,
            ld_c,
            null(),
            KVE_CUDA_LAPROX_MEAN_ATTN,
            g,
        ),
        ("mode 4", c, ld_c, q, 4, g),
        ("ld_cross < n", c, n - 1, q, KVE_CUDA_LAPROX_EXACT, g),
        ("g 65", c, ld_c, q, KVE_CUDA_LAPROX_EXACT, 65),
    ] {
        // SAFETY: device buffers of the declared sizes; refused before any is touched.
        let rc = unsafe {
            kve_cuda_laprox_exact(
                c,
                ld_c as i64,
                q,
                ld_q as i64,
                out.ptr(),
                ld_o as i64,
                hkv as i64,
                g as i64,
                n as i64,
                mode,
                null_mut(),
            )
        };
        assert_eq!(rc, INVALID, "laprox_exact: {what}");
    }
    assert_sentinel("laprox_exact refusals: out", &out);
}
