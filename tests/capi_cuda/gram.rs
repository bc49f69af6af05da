use super::*;

// ----------------------------------------------------- the Gram split per model --

/// The Gram of `l` split once (`kve_cuda_prepare_gram`), on the device.
fn prepared_gram(l: &Layer, p: &kve_score_params, with_lo: u32) -> (Buf, u64) {
    let c = (p.laprox_gqa != LaproxGqa::Sum as u32) as usize;
    let dtype = l.v.dt.code() as u32;
    let mut bytes = 0u64;
    unsafe {
        let len = l.gram[c].len() as u64;
        assert_eq!(
            kve_cuda_prepare_gram_size(len, dtype, with_lo, &mut bytes),
            KVE_OK
        );
        let b = Buf::new(bytes as usize);
        let st = kve_cuda_prepare_gram(
            l.dgram[c].ptr_as(),
            len,
            dtype,
            with_lo,
            b.ptr_as(),
            bytes,
            null_mut(),
        );
        assert_eq!(st, KVE_OK, "prepare gram");
        (b, bytes)
    }
}

/// `kve_cuda_score_layer_prepared`'s status and `out` (canary-filled before the call).
fn prepared_scores(
    l: &Layer,
    p: &kve_score_params,
    inp: &kve_layer_inputs,
    split: (*const c_void, u64),
    with_lo: u32,
) -> (i32, Vec<f32>) {
    device_call(l, p, |out, len, ws, bytes| unsafe {
        kve_cuda_score_layer_prepared(
            p,
            inp,
            split.0,
            split.1,
            with_lo,
            out,
            len,
            ws,
            bytes,
            null_mut(),
        )
    })
}

/// LaProx with the Gram split once per model equals the call that re-splits it on every
/// call, bit for bit (with the lo half; f32: always); without the lo half (16-bit values)
/// the value term sees G to 8 / 11 bits: other scores, near the host's. Refusals write
/// nothing.
#[test]
fn prepared_gram_scores_equal_the_recomputed_split() {
    need_device!();
    let cases = SCORE_CASES;
    let laprox: Vec<_> = configs()
        .into_iter()
        .filter(|(_, p)| p.scorer == ScorerKind::LaProx as u32)
        .collect();
    for (ci, &(dt, kl, vl, hq, hkv, n, d)) in cases.iter().enumerate() {
        let l = layer(dt, kl, vl, hq, hkv, n, d, ci as u64 + 40);
        for (name, p) in &laprox {
            let what = format!("{name} {dt:?} hq={hq} hkv={hkv} n={n} d={d}");
            let old = scores(&l, p, Vals::Gram, None, true);
            let mut inp = inputs(&l, p, Vals::Gram, None, true);
            inp.gram = null();
            inp.gram_len = 0;
            let (s1, b1) = prepared_gram(&l, p, 1);
            let (st, with_lo) = prepared_scores(&l, p, &inp, (s1.ptr_as(), b1), 1);
            assert_eq!(st, KVE_OK, "{what}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(&with_lo) == bits(&old),
                "{what}: prepared (hi + lo) != re-split"
            );
            let (s0, b0) = prepared_gram(&l, p, 0);
            let (st, hi_only) = prepared_scores(&l, p, &inp, (s0.ptr_as(), b0), 0);
            assert_eq!(st, KVE_OK, "{what}");
            let host = scores(&l, p, Vals::Gram, None, false);
            let e = worst_rel(&hi_only, &host, hkv);
            if dt == Dt::F32 {
                assert!(bits(&hi_only) == bits(&old), "{what}: f32 has no lo half");
            } else {
                assert!(
                    bits(&hi_only) != bits(&old),
                    "{what}: the hi half alone changes nothing"
                );
                let tol = if dt == Dt::Bf16 { 2e-2 } else { 3e-3 };
                assert!(e <= tol, "{what}: hi only, worst relative difference {e:e}");
            }
            if dt != Dt::F32 && *name == "laprox" {
                println!("hi-only Gram, {dt:?} values: worst relative difference {e:.2e}");
            }
        }
    }
    // refusals: nothing written to `out`
    let l = layer(
        Dt::Bf16,
        Layout::HeadMajor,
        Layout::HeadMajor,
        4,
        2,
        90,
        32,
        9,
    );
    let p = &laprox[0].1;
    let (s1, b1) = prepared_gram(&l, p, 1);
    let base = {
        let mut i = inputs(&l, p, Vals::Gram, None, true);
        i.gram = null();
        i.gram_len = 0;
        i
    };
    let sp = (s1.ptr_as::<c_void>() as *const c_void, b1);
    let canary = |r: (i32, Vec<f32>), want: i32, what: &str| {
        assert_eq!(r.0, want, "{what}");
        assert!(r.1.iter().all(|&x| x == -7.5), "{what}: out written");
    };
    canary(
        prepared_scores(&l, p, &inputs(&l, p, Vals::Gram, None, true), sp, 1),
        KVE_ERR_INVALID_ARGUMENT,
        "gram and split",
    );
    let mut f = inputs(&l, p, Vals::Forms, None, true);
    f.values = base.values;
    canary(
        prepared_scores(&l, p, &f, sp, 1),
        KVE_ERR_INVALID_ARGUMENT,
        "forms and split",
    );
    canary(
        prepared_scores(&l, p, &base, sp, 0),
        KVE_ERR_SHAPE_MISMATCH,
        "with_lo differs",
    );
    canary(
        prepared_scores(&l, p, &base, (sp.0, b1 - 2), 1),
        KVE_ERR_SHAPE_MISMATCH,
        "bytes",
    );
    canary(
        prepared_scores(&l, p, &base, sp, 2),
        KVE_ERR_INVALID_ARGUMENT,
        "with_lo 2",
    );
    canary(
        prepared_scores(&l, p, &base, (null(), b1), 1),
        KVE_ERR_NULL_POINTER,
        "NULL split",
    );
    let exact = score_params(|q| q.laprox_gqa = LaproxGqa::Exact as u32, Preset::LaProx);
    canary(
        prepared_scores(&l, &exact, &base, sp, 1),
        KVE_ERR_SHAPE_MISMATCH,
        "cross Gram",
    );
    unsafe {
        let mut b = 0u64;
        assert_eq!(
            kve_cuda_prepare_gram_size(10, 7, 1, &mut b),
            KVE_ERR_BAD_ENUM
        );
        assert_eq!(
            kve_cuda_prepare_gram_size(10, 1, 3, &mut b),
            KVE_ERR_INVALID_ARGUMENT
        );
        let len = l.gram[0].len() as u64;
        let g = l.dgram[0].ptr_as::<f32>();
        let before = s1.download_as::<u8>(b1 as usize);
        for (bytes, dst, want) in [
            (b1 - 1, s1.ptr_as::<u8>(), KVE_ERR_OUTPUT_TOO_SMALL),
            (b1, s1.ptr_as::<u8>().add(16), KVE_ERR_MISALIGNED),
            (b1, null_mut(), KVE_ERR_NULL_POINTER),
        ] {
            let st = kve_cuda_prepare_gram(g, len, 2, 1, dst as *mut c_void, bytes, null_mut());
            assert_eq!(st, want);
        }
        assert!(
            s1.download_as::<u8>(b1 as usize) == before,
            "refused split wrote"
        );
    }
}
