//! cuda/combine.cu: GQA head reductions and LaProx's exact-GQA combine.

use super::*;

// --------------------------------------------------- head reductions, LaProx exact --

/// `kve_cuda_head_reduce`'s arguments (default stream): a test states the ones it changes
/// over a base (`HeadReduce { bm, op, ..base }`).
#[derive(Clone, Copy)]
struct HeadReduce {
    a: *const f32,
    ld_a: usize,
    b: *const f32,
    ld_b: usize,
    b_mode: i32,
    scale: *const f32,
    out: *mut f32,
    ld_o: usize,
    hq: usize,
    hkv: usize,
    n: usize,
    op: i32,
}

impl HeadReduce {
    /// The launcher's status.
    ///
    /// # Safety
    /// Device buffers of the sizes the arguments declare (or arguments it refuses).
    unsafe fn launch(self) -> i32 {
        let i = |x: usize| x as i64;
        // SAFETY: the caller's contract.
        unsafe {
            kve_cuda_head_reduce(
                self.a,
                i(self.ld_a),
                self.b,
                i(self.ld_b),
                self.b_mode,
                self.scale,
                self.out,
                i(self.ld_o),
                i(self.hq),
                i(self.hkv),
                i(self.n),
                self.op,
                null_mut(),
            )
        }
    }
}

/// `kve_cuda_laprox_exact`'s arguments (default stream), as [`HeadReduce`].
#[derive(Clone, Copy)]
struct LaproxExact {
    cross: *const f32,
    ld_c: usize,
    qv: *const f32,
    ld_q: usize,
    out: *mut f32,
    ld_o: usize,
    hkv: usize,
    g: usize,
    n: usize,
    mode: i32,
}

impl LaproxExact {
    /// The launcher's status.
    ///
    /// # Safety
    /// As [`HeadReduce::launch`].
    unsafe fn launch(self) -> i32 {
        let i = |x: usize| x as i64;
        // SAFETY: the caller's contract.
        unsafe {
            kve_cuda_laprox_exact(
                self.cross,
                i(self.ld_c),
                self.qv,
                i(self.ld_q),
                self.out,
                i(self.ld_o),
                i(self.hkv),
                i(self.g),
                i(self.n),
                self.mode,
                null_mut(),
            )
        }
    }
}

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
    let base = HeadReduce {
        a: ad.ptr(),
        ld_a,
        b: null(),
        ld_b,
        b_mode: 0,
        scale: null(),
        out: null_mut(),
        ld_o,
        hq,
        hkv,
        n,
        op: KVE_CUDA_GQA_MEAN,
    };
    for op in 0..3 {
        for bm in 0..3 {
            for use_scale in [false, true] {
                let out = launched(hkv * ld_o, "head_reduce", |out| unsafe {
                    HeadReduce {
                        b: if bm == 0 { null() } else { bd_of(bm).ptr() },
                        b_mode: bm,
                        scale: if use_scale { sd.ptr() } else { null() },
                        out,
                        op,
                        ..base
                    }
                    .launch()
                });
                let what = format!("head_reduce op{op} b{bm} scale{use_scale} (strided)");
                let got = unstride(&what, &out, hkv, n, ld_o);
                let want = reference(op, bm, use_scale, hkv, g);
                assert_close(&what, &got, &want, 1e-5);
            }
        }
    }
    // in place (Hkv == Hq, out == a, same row stride): plain per-head products
    for bm in 1..3 {
        let inplace = DBuf::from(&strided(&a, hq, n, ld_a));
        let call = HeadReduce {
            a: inplace.ptr(),
            b: bd_of(bm).ptr(),
            b_mode: bm,
            out: inplace.ptr(),
            ld_o: ld_a,
            hkv: hq,
            op: KVE_CUDA_GQA_SUM,
            ..base
        };
        ck(unsafe { call.launch() }, "head_reduce in place");
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
    let base = HeadReduce {
        b: bd_of(2).ptr(),
        out: out.ptr(),
        ..base
    };
    let in_place = HeadReduce {
        b: null(),
        ld_b: 0,
        out: ad.ptr(),
        ld_o: ld_a,
        ..base
    };
    for (what, call) in [
        (
            "b_mode 1 without b",
            HeadReduce {
                b_mode: 1,
                b: null(),
                ..base
            },
        ),
        ("hq % hkv != 0", HeadReduce { hkv: 5, ..base }),
        ("b_mode 3", HeadReduce { b_mode: 3, ..base }),
        ("GQA op 3", HeadReduce { op: 3, ..base }),
        (
            "ld_b < n",
            HeadReduce {
                b_mode: 2,
                ld_b: n - 1,
                ..base
            },
        ),
        ("in place, g > 1", in_place),
        (
            "in place, other stride",
            HeadReduce {
                hkv: hq,
                ld_o: ld_a + 1,
                ..in_place
            },
        ),
    ] {
        // SAFETY: device buffers of the declared sizes; refused before any is touched.
        assert_eq!(unsafe { call.launch() }, INVALID, "head_reduce: {what}");
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
    let lx = LaproxExact {
        cross: cd.ptr(),
        ld_c,
        qv: qd.ptr(),
        ld_q,
        out: null_mut(),
        ld_o,
        hkv,
        g,
        n,
        mode: KVE_CUDA_LAPROX_EXACT,
    };
    for mode in [
        KVE_CUDA_LAPROX_EXACT,
        KVE_CUDA_LAPROX_MEAN_ATTN,
        KVE_CUDA_LAPROX_ATTN_TERM,
        KVE_CUDA_LAPROX_VALUE_TERM,
    ] {
        let out = launched(hkv * ld_o, "laprox_exact", |out| unsafe {
            LaproxExact {
                cross: if mode == KVE_CUDA_LAPROX_VALUE_TERM {
                    null()
                } else {
                    cd.ptr()
                },
                qv: if mode == KVE_CUDA_LAPROX_ATTN_TERM {
                    null()
                } else {
                    qd.ptr()
                },
                out,
                mode,
                ..lx
            }
            .launch()
        });
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
        let got = unstride(&what, &out, hkv, n, ld_o);
        assert_close(&what, &got, &want, 1e-5);
    }
    // refusals (nothing written): an input the mode reads missing, an unknown mode, a row
    // stride below n, a group past 64
    let out = sentinel(hkv * ld_o);
    let lx = LaproxExact {
        out: out.ptr(),
        ..lx
    };
    for (what, call) in [
        (
            "exact without cross",
            LaproxExact {
                cross: null(),
                ..lx
            },
        ),
        (
            "mean-attn without qv",
            LaproxExact {
                qv: null(),
                mode: KVE_CUDA_LAPROX_MEAN_ATTN,
                ..lx
            },
        ),
        ("mode 4", LaproxExact { mode: 4, ..lx }),
        ("ld_cross < n", LaproxExact { ld_c: n - 1, ..lx }),
        ("g 65", LaproxExact { g: 65, ..lx }),
    ] {
        // SAFETY: device buffers of the declared sizes; refused before any is touched.
        assert_eq!(unsafe { call.launch() }, INVALID, "laprox_exact: {what}");
    }
    assert_sentinel("laprox_exact refusals: out", &out);
}
