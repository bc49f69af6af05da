use super::*;

#[test]
fn device_scores_match_host_for_every_scorer() {
    need_device!();
    let cases = SCORE_CASES;
    let mut worst_all = 0f64;
    for (ci, &(dt, kl, vl, hq, hkv, n, d)) in cases.iter().enumerate() {
        let l = layer(dt, kl, vl, hq, hkv, n, d, ci as u64 + 1);
        for (name, p) in configs() {
            for vals in [Vals::Gram, Vals::Forms] {
                if vals == Vals::Forms && p.scorer != ScorerKind::LaProx as u32 {
                    continue;
                }
                let host = scores(&l, &p, vals, None, false);
                let devs = scores(&l, &p, vals, None, true);
                let what =
                    format!("{name} {vals:?} {dt:?} {kl:?}/{vl:?} hq={hq} hkv={hkv} n={n} d={d}");
                if p.scorer == ScorerKind::CriticalKv as u32 {
                    let (m, e) = critical_diff(&devs, &host);
                    assert!(
                        m <= allowed_forced_mismatch(hkv),
                        "{what}: {m} forced entries differ"
                    );
                    assert!(e <= tolerance(dt), "{what}: {e:e}");
                    continue;
                }
                let e = worst_rel(&devs, &host, hkv);
                worst_all = worst_all.max(e);
                assert!(
                    e <= tolerance(dt),
                    "{what}: worst relative difference {e:e}"
                );
            }
        }
    }
    println!("worst relative difference, every scorer: {worst_all:.2e}");
}

#[test]
fn device_scores_with_row_lse_match_host() {
    need_device!();
    let l = layer(
        Dt::Bf16,
        Layout::TokenRows,
        Layout::Transposed,
        8,
        2,
        260,
        64,
        7,
    );
    for (name, p) in configs() {
        if matches!(p.scorer, x if x == ScorerKind::KNorm as u32 || x == ScorerKind::StreamingLlm as u32)
        {
            continue;
        }
        // the LSE `[Hq][min(w, n)]` from the host helper, on both sides
        let lse = capi_common::window_row_lse(&l.q.desc(false), &l.k.desc(false), p.window);
        let dl = Buf::bytes_of(&lse);
        let host = scores(&l, &p, Vals::Gram, Some((&lse, &dl)), false);
        let devs = scores(&l, &p, Vals::Gram, Some((&lse, &dl)), true);
        if p.scorer == ScorerKind::CriticalKv as u32 {
            let (m, e) = critical_diff(&devs, &host);
            assert!(
                m <= allowed_forced_mismatch(l.hkv) && e <= tolerance(Dt::Bf16),
                "{name}"
            );
            continue;
        }
        let e = worst_rel(&devs, &host, l.hkv);
        assert!(e <= tolerance(Dt::Bf16), "{name} with row_lse: {e:e}");
    }
}

/// An f16 head-major layer of 8 query heads, 2 KV heads, 120 tokens, d 32.
fn small_f16_layer(seed: u64) -> Layer {
    layer(
        Dt::F16,
        Layout::HeadMajor,
        Layout::HeadMajor,
        8,
        2,
        120,
        32,
        seed,
    )
}

#[test]
fn device_score_rejects_bad_input_before_launching() {
    need_device!();
    let l = small_f16_layer(3);
    let p = score_params(|_| {}, Preset::LaProx);
    let d = 32u64;
    let mut bytes = 0u64;
    unsafe {
        assert_eq!(
            kve_cuda_score_workspace_size(&p, 8, 2, l.n as u64, d, d, &mut bytes),
            KVE_OK
        );
        let ws = Buf::new(bytes as usize);
        let len = 2 * (l.n - 32);
        let out = Buf::new(len * 4);
        let canary = vec![0xA5A5_A5A5u32; len];
        let check = |inp: &kve_layer_inputs, wsb: u64, out_len: u64, want: i32, what: &str| {
            out.upload_as(&canary);
            let st =
                kve_cuda_score_layer(&p, inp, out.ptr_as(), out_len, ws.ptr_as(), wsb, null_mut());
            assert_eq!(st, want, "{what}");
            assert!(out.download_as::<u32>(len) == canary, "{what}: out written");
        };
        let good = inputs(&l, &p, Vals::Gram, None, true);
        check(
            &good,
            bytes - 1,
            len as u64,
            KVE_ERR_WORKSPACE_TOO_SMALL,
            "short workspace",
        );
        check(
            &good,
            bytes,
            len as u64 - 1,
            KVE_ERR_OUTPUT_TOO_SMALL,
            "short out",
        );
        let mut x = good;
        x.gram = null();
        x.gram_len = 0;
        check(&x, bytes, len as u64, KVE_ERR_NULL_POINTER, "no gram");
        let mut x = good;
        x.gram_len -= 1;
        check(&x, bytes, len as u64, KVE_ERR_SHAPE_MISMATCH, "gram length");
        let mut x = good;
        x.keys.data = null();
        check(&x, bytes, len as u64, KVE_ERR_NULL_POINTER, "no keys");
        let mut x = good;
        x.keys.dtype = 9;
        check(&x, bytes, len as u64, KVE_ERR_BAD_ENUM, "dtype");
        // ggml's block types, in a valid layout (d = 32: rows of one block; the f16 buffer
        // holds more than the blocks): the kernels do not take them, nothing is launched
        for dt in [kvevict::DType::Q8_0, kvevict::DType::Q4_0] {
            for what in ["keys", "values"] {
                let mut x = good;
                let t = if what == "keys" {
                    &mut x.keys
                } else {
                    &mut x.values
                };
                t.dtype = dt as u32;
                check(&x, bytes, len as u64, KVE_ERR_UNSUPPORTED_DTYPE, what);
            }
            let mut b = u64::MAX;
            let mut k = good.keys;
            k.dtype = dt as u32;
            let st = kve_cuda_compact_in_place_workspace_size(&k, 8, &mut b);
            assert_eq!((st, b), (KVE_ERR_UNSUPPORTED_DTYPE, u64::MAX), "compact");
        }
        let mut x = good;
        x.values.extent[1] -= 1;
        check(
            &x,
            bytes,
            len as u64,
            KVE_ERR_SHAPE_MISMATCH,
            "values tokens",
        );
        let mut x = good;
        x.keys.len -= 1;
        check(&x, bytes, len as u64, KVE_ERR_OUT_OF_BOUNDS, "keys length");
        let mut x = good;
        x.row_lse = l.dl1.ptr_as();
        x.row_lse_len = 3;
        check(
            &x,
            bytes,
            len as u64,
            KVE_ERR_SHAPE_MISMATCH,
            "row_lse length",
        );
        let st = kve_cuda_score_layer(
            &p,
            &good,
            null_mut(),
            len as u64,
            ws.ptr_as(),
            bytes,
            null_mut(),
        );
        assert_eq!(st, KVE_ERR_NULL_POINTER);
        // outputs over inputs: refused, the input untouched
        let keys_before = l.k.dev.download_as::<u8>(l.k.bytes.len());
        let st = kve_cuda_score_layer(
            &p,
            &good,
            l.k.dev.ptr_as(),
            len as u64,
            ws.ptr_as(),
            bytes,
            null_mut(),
        );
        assert_eq!(st, KVE_ERR_ALIASING);
        let st = kve_cuda_score_layer(
            &p,
            &good,
            out.ptr_as(),
            len as u64,
            l.dgram[0].ptr_as(),
            bytes,
            null_mut(),
        );
        assert_ne!(st, KVE_OK);
        assert!(l.k.dev.download_as::<u8>(l.k.bytes.len()) == keys_before);
        // the whole cache is window: nothing to score, nothing written
        let mut big = p;
        big.window = 4096;
        big.scorer = ScorerKind::KNorm as u32; // reads no queries: any window is valid
        out.upload_as(&canary);
        let st = kve_cuda_score_layer(&big, &good, out.ptr_as(), 0, ws.ptr_as(), bytes, null_mut());
        assert_eq!(st, KVE_OK);
        assert!(out.download_as::<u32>(len) == canary);
    }
}

/// Found by fuzz/fuzz_targets/capi.rs: LaProx given cached value forms sized its Gram
/// parts with `dk` instead of the queried `dv`, so a workspace of the size
/// `kve_cuda_score_workspace_size` gave for the call's shape (`dv < dk`) was refused.
#[test]
fn device_score_with_value_forms_fits_the_queried_workspace() {
    need_device!();
    let l = small_f16_layer(5);
    for gqa in [LaproxGqa::Sum, LaproxGqa::Exact, LaproxGqa::MeanAttn] {
        let p = score_params(|p| p.laprox_gqa = gqa as u32, Preset::LaProx);
        let host = scores(&l, &p, Vals::Forms, None, false);
        for dv in [1u64, 16] {
            let mut bytes = 0u64;
            unsafe {
                assert_eq!(
                    kve_cuda_score_workspace_size(&p, 8, 2, l.n as u64, 32, dv, &mut bytes),
                    KVE_OK
                );
                let ws = Buf::new(bytes as usize);
                let len = host.len();
                let out = Buf::new(len * 4);
                let inp = inputs(&l, &p, Vals::Forms, None, true);
                let st = score_into(&p, &inp, &out, len, &ws, bytes);
                assert_eq!(st, KVE_OK, "{gqa:?} dv {dv}");
                let d = out.download_as::<f32>(len);
                assert!(
                    worst_rel(&d, &host, 2) < tolerance(Dt::F16),
                    "{gqa:?} dv {dv}"
                );
            }
        }
    }
}

/// Found by fuzz/fuzz_targets/capi.rs: shapes the C layer accepted and a launcher then
/// refused (`KVE_ERR_CUDA`): more than 128 query heads per KV head (window), 65536 heads
/// (the kernels' grid limit is 65535). Now `KVE_ERR_INVALID_ARGUMENT`, nothing written.
#[test]
fn device_score_rejects_shapes_beyond_the_kernels() {
    need_device!();
    let (w, n, d) = (2u64, 6u64, 4u64);
    let buf = Buf::bytes_of(&vec![0.25f32; (n * d) as usize]);
    // `heads` heads sharing one [n, d] block (head stride 0)
    let t = |heads: u64, tokens: u64| kve_tensor {
        data: buf.vptr() as *const c_void,
        len: tokens * d,
        dtype: Dt::F32.code() as u32,
        pad: 0,
        extent: [heads, tokens, d],
        stride: [0, d, 1],
    };
    let cases = [
        (Preset::SnapKv, 129, 1, KVE_ERR_INVALID_ARGUMENT),
        (Preset::SnapKv, 128, 1, KVE_OK),
        (Preset::SnapKv, 65536, 1, KVE_ERR_INVALID_ARGUMENT),
        (Preset::Tova, 256, 1, KVE_ERR_INVALID_ARGUMENT),
        (Preset::KNorm, 65536, 65536, KVE_ERR_INVALID_ARGUMENT),
        (Preset::SnapKv, 65536, 65536, KVE_ERR_INVALID_ARGUMENT),
    ];
    for (preset, hq, hkv, want) in cases {
        let w = if preset == Preset::Tova { 1 } else { w };
        let p = score_params(|p| p.window = w as u32, preset);
        let mut inp = inputs_init();
        inp.queries = t(hq, w);
        inp.keys = t(hkv, n);
        let mut bytes = 0u64;
        unsafe {
            assert_eq!(
                kve_cuda_score_workspace_size(&p, hq, hkv, n, d, d, &mut bytes),
                KVE_OK
            );
            let ws = Buf::new(bytes as usize);
            let len = (hkv * (n - w)) as usize;
            let out = Buf::new(len * 4);
            let canary = vec![0xA5A5_A5A5u32; len];
            out.upload_as(&canary);
            let st = score_into(&p, &inp, &out, len, &ws, bytes);
            assert_eq!(st, want, "{preset:?} hq {hq} hkv {hkv}");
            if want != KVE_OK {
                assert!(
                    out.download_as::<u32>(len) == canary,
                    "{preset:?}: out written"
                );
            }
        }
    }
}
