//! cuda/vonorm.cu: value-output norms through Gram matrices (hi / lo split, factor form)
//! and the host `kve_cuda_gram_factor`.

use super::*;

// --------------------------------------------------------------------- value norms --

/// Every case of the value-norm tests: each dtype and shape `(hkv, gpk, n, dv)`, the Gram
/// rounded to the values' dtype (hi) or split exactly (hi + lo, 16-bit dtypes only), values `v`
/// in a random layout.
fn vonorm_cases(
    rng: &mut Rng,
    shapes: &[(usize, usize, usize, usize)],
    mut case: impl FnMut(&mut Rng, Dt, Layout, (usize, usize, usize, usize), bool, Tensor),
) {
    for dt in DTYPES {
        for &shape in shapes {
            for split in [false, true] {
                if dt == Dt::F32 && split {
                    continue;
                }
                let layout = LAYOUTS[rng.below(4)];
                let (hkv, _, n, dv) = shape;
                let v = Tensor::normal(rng, dt, layout, [hkv, n, dv]);
                case(rng, dt, layout, shape, split, v);
            }
        }
    }
}

/// `kve_cuda_gram_split` of `g` into `dt`: the hi part, and the lo part when `split`.
fn split_on_device(g: &[f32], dt: Dt, split: bool) -> (DBuf<u8>, Option<DBuf<u8>>) {
    let gd = DBuf::from(g);
    let hi = DBuf::<u8>::new(g.len() * dt.size());
    let lo = split.then(|| DBuf::<u8>::new(g.len() * dt.size()));
    ck(
        unsafe {
            kve_cuda_gram_split(
                gd.ptr(),
                g.len() as i64,
                dt.code(),
                hi.vptr(),
                lo.as_ref().map_or(null_mut(), |b| b.vptr()),
                null_mut(),
            )
        },
        "gram_split",
    );
    (hi, lo)
}

/// `kve_cuda_vonorm` (or `_factor`) of the first `ntok` tokens of `v` with the split Gram
/// (`sqrt`: the norm, not its square) into `ngram * ntok` floats.
fn vonorm_on_device(
    factor: bool,
    v: &Tensor,
    ntok: usize,
    (hi, lo): &(DBuf<u8>, Option<DBuf<u8>>),
    ngram: usize,
    sqrt: bool,
) -> Vec<f32> {
    let launch = if factor {
        kve_cuda_vonorm_factor
    } else {
        kve_cuda_vonorm
    };
    let lo = lo.as_ref().map_or(null(), |b| b.vptr());
    launched(ngram * ntok, "vonorm", |out| unsafe {
        launch(
            &v.view(),
            ntok as i64,
            hi.vptr(),
            lo,
            ngram as i64,
            sqrt as i32,
            out,
            null_mut(),
        )
    })
}

/// The f64 reference: `v_i G_m v_iᵀ` for Gram `m` (`g(m, r, c)`, KV head `m / gpk`) and
/// token `i < ntok`, `[m][i]`.
fn vonorm_reference(
    v: &Tensor,
    g: impl Fn(usize, usize, usize) -> f64,
    ngram: usize,
    gpk: usize,
    ntok: usize,
    dv: usize,
) -> Vec<f64> {
    let mut want = vec![0f64; ngram * ntok];
    for m in 0..ngram {
        let hk = m / gpk;
        for i in 0..ntok {
            let mut s = 0f64;
            for r in 0..dv {
                let vr = v.at(hk, i, r);
                for c in 0..dv {
                    s += vr * g(m, r, c) * v.at(hk, i, c);
                }
            }
            want[m * ntok + i] = s;
        }
    }
    want
}

#[test]
fn vonorm_matches_reference() {
    need_device!();
    let shapes = [
        (2, 3, 300, 64),
        (1, 2, 130, 128),
        (2, 1, 70, 200),
        (1, 1, 33, 40),
    ];
    vonorm_cases(
        &mut Rng::new(3),
        &shapes,
        |rng, dt, layout, (hkv, gpk, n, dv), split, v| {
            let ngram = hkv * gpk;
            // PSD Grams like Wo_h Wo_hᵀ / D
            let dm = 96;
            let mut gram = vec![0f32; ngram * dv * dv];
            for m in 0..ngram {
                let wo: Vec<f32> = (0..dv * dm).map(|_| rng.normal()).collect();
                for r in 0..dv {
                    for c in 0..dv {
                        let s: f64 = (0..dm)
                            .map(|x| wo[r * dm + x] as f64 * wo[c * dm + x] as f64)
                            .sum();
                        gram[(m * dv + r) * dv + c] = (s / dm as f64) as f32;
                    }
                }
            }
            let parts = split_on_device(&gram, dt, split);
            let ntok = n - rng.below(3);
            let got = vonorm_on_device(false, &v, ntok, &parts, ngram, false);
            // reference with the Gram the kernel sees: rounded (hi) or exact (hi+lo)
            let exact = split || dt == Dt::F32;
            let geff = |m: usize, r: usize, c: usize| {
                let x = gram[(m * dv + r) * dv + c];
                (if exact { x } else { dt.round(x) }) as f64
            };
            let want = vonorm_reference(&v, geff, ngram, gpk, ntok, dv);
            let tol = if exact { 1e-4 } else { 1e-3 };
            let what =
                format!("vonorm {dt:?} {layout:?} hkv{hkv} gpk{gpk} n{ntok} dv{dv} split{split}");
            assert_close(&what, &got, &want, tol);
            // sqrt variant
            let got2 = vonorm_on_device(false, &v, ntok, &parts, ngram, true);
            let want2: Vec<f64> = want.iter().map(|x| x.max(0.0).sqrt()).collect();
            assert_close(&format!("{what} sqrt"), &got2, &want2, tol);
        },
    );
}

#[test]
fn vonorm_factor_matches_reference() {
    need_device!();
    let shapes = [(2, 2, 300, 128), (1, 3, 77, 64), (1, 1, 50, 200)];
    vonorm_cases(
        &mut Rng::new(31),
        &shapes,
        |rng, dt, layout, (hkv, gpk, n, dv), split, v| {
            let ngram = hkv * gpk;
            let gram = core_gram(rng, ngram, ngram, dv, 2 * dv);
            let mut l = vec![0f32; gram.len()];
            assert_eq!(
                unsafe {
                    kve_cuda_gram_factor(gram.as_ptr(), ngram as i64, dv as i64, l.as_mut_ptr())
                },
                0
            );
            // garbage above the diagonal must be ignored
            for m in 0..ngram {
                for r in 0..dv {
                    for c in r + 1..dv {
                        l[(m * dv + r) * dv + c] = 1e3;
                    }
                }
            }
            let parts = split_on_device(&l, dt, split);
            let got = vonorm_on_device(true, &v, n, &parts, ngram, false);
            let want = vonorm_reference(
                &v,
                |m, r, c| gram[(m * dv + r) * dv + c] as f64,
                ngram,
                gpk,
                n,
                dv,
            );
            let tol = if split || dt == Dt::F32 { 1e-4 } else { 5e-3 };
            let what = format!("vonorm_factor {dt:?} {layout:?} dv{dv} split{split}");
            assert_close(&what, &got, &want, tol);
        },
    );
}

/// CPU only: the host Cholesky factor reproduces the Gram matrices (L Lᵀ = G, L lower).
#[test]
fn gram_factor_reproduces_gram_on_cpu() {
    let mut rng = Rng::new(30);
    for &(hq, hkv, dv, dm) in &[(4usize, 2usize, 64usize, 200usize), (2, 1, 48, 32)] {
        // dm < dv in the second case: rank-deficient (semi-definite) Grams
        let g = core_gram(&mut rng, hq, hkv, dv, dm);
        let mut l = vec![f32::NAN; g.len()];
        assert_eq!(
            unsafe { kve_cuda_gram_factor(g.as_ptr(), hq as i64, dv as i64, l.as_mut_ptr()) },
            0
        );
        for m in 0..hq {
            let lm = &l[m * dv * dv..(m + 1) * dv * dv];
            let mut want = Vec::new();
            let mut got = Vec::new();
            for r in 0..dv {
                for c in 0..dv {
                    if c > r {
                        assert_eq!(lm[r * dv + c], 0.0, "upper triangle");
                    }
                    let s: f64 = (0..dv)
                        .map(|k| lm[r * dv + k] as f64 * lm[c * dv + k] as f64)
                        .sum();
                    got.push(s as f32);
                    want.push(g[m * dv * dv + r * dv + c] as f64);
                }
            }
            let tol = if dm >= dv { 1e-5 } else { 1e-4 };
            assert_close(
                &format!("L Lᵀ = G (dv {dv}, D {dm}, head {m})"),
                &got,
                &want,
                tol,
            );
        }
    }
    // not PSD: rejected
    let bad = [1.0f32, 2.0, 2.0, 1.0];
    let mut out = vec![0f32; 4];
    assert_eq!(
        unsafe { kve_cuda_gram_factor(bad.as_ptr(), 1, 2, out.as_mut_ptr()) },
        1
    );
}

/// kve_cuda_vonorm in f32 against the core's value forms (`compute_value_forms`, all N
/// tokens) and its square-root mode; gram_split's hi part is
/// the dtype's rounding of G and hi + lo ~22 bits; 16-bit V with hi/lo Grams is
/// ~f32-accurate; the factor form `||v L||²` (L from the host gram_factor, L Lᵀ = G)
/// equals the forms.
#[test]
fn vonorm_gram_split_and_factor_equal_core() {
    use kvevict::{compute_value_forms, value_forms_len};
    let mut rng = device_rng!(8);
    let (hq, hkv, n, d) = (4usize, 2usize, 40usize, 24usize);
    let g = hq / hkv;
    let v = Tensor::normal(&mut rng, Dt::F32, Layout::HeadMajor, [hkv, n, d]);
    let gram = core_gram(&mut rng, hq, hkv, d, hq * d);
    let gd = DBuf::from(&gram);
    let mut forms = vec![0f32; value_forms_len(hq, hkv, n, false).unwrap()];
    compute_value_forms(&v.core_view(), &gram, hq, false, 0, n, &mut forms).unwrap();
    let forms64: Vec<f64> = forms.iter().map(|&x| x as f64).collect();
    let vonorm = |vv: &KveCudaView, hi: *const c_void, lo: *const c_void, sqrt: i32| {
        // SAFETY: device buffers of the documented sizes.
        launched(hq * n, "vonorm", |out| unsafe {
            kve_cuda_vonorm(vv, n as i64, hi, lo, hq as i64, sqrt, out, null_stream())
        })
    };
    let got = vonorm(&v.view(), gd.vptr(), null(), 0);
    assert_close("vonorm f32", &got, &forms64, 1e-5);
    let roots = vonorm(&v.view(), gd.vptr(), null(), 1);
    let want: Vec<f64> = forms.iter().map(|f| f.max(0.0).sqrt() as f64).collect();
    assert_close("vonorm f32 sqrt", &roots, &want, 1e-5);
    // f16 V with hi/lo Grams from gram_split
    let v16 = Tensor::normal(&mut rng, Dt::F16, Layout::HeadMajor, [hkv, n, d]);
    let (hi, lo) = (DBuf::<u16>::new(gram.len()), DBuf::<u16>::new(gram.len()));
    // SAFETY: device buffers of `gram.len()` elements.
    let rc = unsafe {
        kve_cuda_gram_split(
            gd.ptr(),
            gram.len() as i64,
            KVE_CUDA_F16,
            hi.vptr(),
            lo.vptr(),
            null_stream(),
        )
    };
    ck(rc, "gram_split");
    let (hb, lb) = (hi.download(), lo.download());
    for ((&h, &l), &x) in hb.iter().zip(&lb).zip(&gram) {
        let (h, l) = (f16::from_bits(h), f16::from_bits(l));
        assert_eq!(h, f16::from_f32(x), "hi of {x}");
        // hi + lo: ~22 bits, down to f16's subnormal spacing (6e-8) for lo
        assert!(
            ((h.to_f32() + l.to_f32()) - x).abs() <= 5e-7 * x.abs() + 3e-8,
            "{x}"
        );
    }
    let got = vonorm(&v16.view(), hi.vptr(), lo.vptr(), 0);
    for m in 0..hq {
        for i in 0..n {
            let (mut s, mut mag) = (0f64, 0f64);
            for r in 0..d {
                for c in 0..d {
                    let t = v16.at(m / g, i, r)
                        * gram[(m * d + r) * d + c] as f64
                        * v16.at(m / g, i, c);
                    s += t;
                    mag += t.abs();
                }
            }
            let e = (got[m * n + i] as f64 - s).abs();
            assert!(e <= 2e-6 * mag, "f16 m{m} i{i}: {} vs {s}", got[m * n + i]);
        }
    }
    // the factor form: L from gram_factor (host), ||v L||² = v G vᵀ
    let mut lf = vec![SENTINEL; gram.len()];
    // SAFETY: host arrays of `hq·d·d` floats.
    assert_eq!(
        unsafe { kve_cuda_gram_factor(gram.as_ptr(), hq as i64, d as i64, lf.as_mut_ptr()) },
        0
    );
    for m in 0..hq {
        let b = &lf[m * d * d..(m + 1) * d * d];
        for r in 0..d {
            for c in 0..d {
                if c > r {
                    assert_eq!(b[r * d + c], 0.0);
                }
                let llt: f64 = (0..d)
                    .map(|k| b[r * d + k] as f64 * b[c * d + k] as f64)
                    .sum();
                let gv = gram[m * d * d + r * d + c] as f64;
                let scale = gram[m * d * d + r * d + r].abs().max(1e-6) as f64;
                assert!((llt - gv).abs() <= 1e-5 * scale + 1e-6);
            }
        }
    }
    let ld = DBuf::from(&lf);
    let fo = poisoned(hq * n);
    // SAFETY: device buffers of the documented sizes.
    let rc = unsafe {
        kve_cuda_vonorm_factor(
            &v.view(),
            n as i64,
            ld.vptr(),
            null(),
            hq as i64,
            0,
            fo.ptr(),
            null_stream(),
        )
    };
    ck(rc, "vonorm_factor");
    let fo = fo.download();
    let top = forms.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
    for (k, (&a, &b)) in fo.iter().zip(&forms).enumerate() {
        assert!(
            (a as f64 - b as f64).abs() <= 1e-5 * (b as f64).abs() + 1e-6 * top,
            "factor {k}: {a} vs {b}"
        );
    }
}

/// The host Cholesky factor of a rank-1 PSD Gram (zero pivots give zero columns); a
/// block not PSD, NaN, NULL or d = 0 are refused with nothing written; gram_split refuses
/// a bad dtype or a NULL hi, and its bf16 hi part is the rounding of G.
#[test]
fn gram_factor_rejects_and_zero_columns() {
    let d = 3;
    let u = [1.0f32, 2.0, -1.0];
    let g: Vec<f32> = (0..9).map(|e| u[e / 3] * u[e % 3]).collect();
    let mut l = vec![SENTINEL; 9];
    // SAFETY: host arrays (the factor runs on the host) of the documented sizes.
    unsafe {
        assert_eq!(kve_cuda_gram_factor(g.as_ptr(), 1, d, l.as_mut_ptr()), 0);
        assert_eq!(l, vec![1.0, 0.0, 0.0, 2.0, 0.0, 0.0, -1.0, 0.0, 0.0]);
        let mut g2 = g.clone();
        g2.extend_from_slice(&[1.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 1.0]);
        let mut l2 = vec![SENTINEL; 18];
        assert_eq!(
            kve_cuda_gram_factor(g2.as_ptr(), 2, d, l2.as_mut_ptr()),
            INVALID,
            "not PSD"
        );
        assert!(l2.iter().all(|&v| v == SENTINEL));
        let mut gn = g.clone();
        gn[4] = f32::NAN;
        assert_eq!(
            kve_cuda_gram_factor(gn.as_ptr(), 1, d, l2.as_mut_ptr()),
            INVALID,
            "NaN"
        );
        assert_eq!(
            kve_cuda_gram_factor(null(), 1, d, l2.as_mut_ptr()),
            INVALID,
            "NULL"
        );
        assert_eq!(
            kve_cuda_gram_factor(g.as_ptr(), 1, 0, l2.as_mut_ptr()),
            INVALID,
            "d = 0"
        );
        assert_eq!(
            kve_cuda_gram_factor(null(), 0, d, null_mut()),
            0,
            "no blocks"
        );
        assert!(l2.iter().all(|&v| v == SENTINEL));
    }
    need_device!();
    let gd = DBuf::from(&g);
    let hi = DBuf::from(&[0u16; 9]);
    // SAFETY: device buffers of 9 elements; the refused calls launch nothing.
    unsafe {
        assert_eq!(
            kve_cuda_gram_split(gd.ptr(), 9, 5, hi.vptr(), null_mut(), null_stream()),
            INVALID
        );
        assert_eq!(
            kve_cuda_gram_split(
                gd.ptr(),
                9,
                KVE_CUDA_BF16,
                null_mut(),
                null_mut(),
                null_stream()
            ),
            INVALID
        );
        assert!(hi.download().iter().all(|&v| v == 0));
        ck(
            kve_cuda_gram_split(
                gd.ptr(),
                9,
                KVE_CUDA_BF16,
                hi.vptr(),
                null_mut(),
                null_stream(),
            ),
            "split",
        );
    }
    for (h, &x) in hi.download().iter().zip(&g) {
        assert_eq!(*h, bf16::from_f32(x).to_bits());
    }
}
