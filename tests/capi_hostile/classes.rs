use super::*;

#[test]
fn null_pointers() {
    let mut l = Layer::new();
    let sp = score_params(0);
    let inp = l.inputs();
    // each pointer NULL in turn; NULL with length 0 is an empty buffer: then it is too small
    let (p, i): (*const kve_score_params, *const kve_layer_inputs) = (&sp, &inp);
    let (o, on) = (l.out.as_mut_ptr(), l.out.len() as u64);
    let (w, wn) = (l.ws.as_mut_ptr() as *mut c_void, l.ws.len() as u64);
    let (nc, nm) = (null(), null_mut());
    let cases = [
        ((null(), i, o, on, w, wn), KVE_ERR_NULL_POINTER),
        ((p, nc, o, on, w, wn), KVE_ERR_NULL_POINTER),
        ((p, i, null_mut(), on, w, wn), KVE_ERR_NULL_POINTER),
        ((p, i, o, on, nm, wn), KVE_ERR_NULL_POINTER),
        ((p, i, null_mut(), 0, w, wn), KVE_ERR_OUTPUT_TOO_SMALL),
        ((p, i, o, on, nm, 0), KVE_ERR_WORKSPACE_TOO_SMALL),
    ];
    for (k, ((p, i, o, on, w, wn), want)) in cases.into_iter().enumerate() {
        let st = unsafe { kve_score_layer(p, i, o, on, w, wn) };
        assert_eq!(name(st), name(want), "case {k}");
    }
    unsafe {
        expect!(
            kve_score_params_init(null_mut(), 48, 0),
            KVE_ERR_NULL_POINTER
        );
        expect!(
            kve_score_workspace_size(&sp, 4, 2, 40, 8, 8, null_mut()),
            KVE_ERR_NULL_POINTER
        );
        expect!(
            kve_compact_in_place(null(), null(), 0, null(), 0, null_mut(), 0),
            KVE_ERR_NULL_POINTER
        );
        expect!(
            kve_compute_gram(null(), 1, 0, null_mut(), 0, null_mut(), 0),
            KVE_ERR_NULL_POINTER
        );
        expect!(
            kve_select_model(null(), null(), null_mut(), 0, null_mut(), 0, null_mut(), 0),
            KVE_ERR_NULL_POINTER
        );
        let mut count = CANARY as u64;
        expect!(
            kve_evicted_positions(null(), 3, 5, null_mut(), 0, &mut count),
            KVE_ERR_NULL_POINTER
        );
        assert_eq!(count, CANARY as u64);
        expect!(
            kve_search_step(null_mut(), null(), null_mut()),
            KVE_ERR_NULL_POINTER
        );
        expect!(
            kve_histogram_merge(null_mut(), null()),
            KVE_ERR_NULL_POINTER
        );
    }
    // a tensor whose data is NULL, and a required tensor absent
    l.check_edits(
        &sp,
        &[
            (|i| i.keys.data = null(), KVE_ERR_NULL_POINTER),
            (|i| i.queries = kve_tensor::NONE, KVE_ERR_NULL_POINTER),
        ],
    );
    // LaProx without gram or value forms, and with a gram pointer NULL of non-zero length
    let lp = score_params(PRESET_LAPROX);
    l.check_edits(
        &lp,
        &[
            (|_| {}, KVE_ERR_NULL_POINTER),
            (|i| i.gram_len = 10, KVE_ERR_NULL_POINTER),
        ],
    );
    // CriticalKV without value_l1
    let mut ck = score_params(PRESET_CRITICALKV);
    ck.window = W as u32;
    l.check_edits(&ck, &[(|_| {}, KVE_ERR_NULL_POINTER)]);
}

#[test]
fn zero_and_huge_sizes() {
    let mut l = Layer::new();
    let sp = score_params(0);
    l.check_edits(
        &sp,
        &[
            (|i| i.keys.extent[0] = 0, KVE_ERR_INVALID_ARGUMENT),
            (|i| i.keys.extent[1] = 0, KVE_ERR_INVALID_ARGUMENT),
            (|i| i.keys.extent[2] = 0, KVE_ERR_INVALID_ARGUMENT),
            // "negative" sizes arrive as huge unsigned values
            (|i| i.keys.len = u64::MAX, KVE_ERR_OVERFLOW), // len * 4 overflows
            (|i| i.keys.extent[1] = (-1i64) as u64, KVE_ERR_OVERFLOW),
            // more heads than KVE_MAX_HEADS
            (
                |i| i.keys.extent[0] = (-1i64) as u64 >> 1,
                KVE_ERR_INVALID_ARGUMENT,
            ),
        ],
    );
    let mut out = CANARY as u64;
    unsafe {
        expect!(
            kve_score_workspace_size(&sp, 0, 2, 40, 8, 8, &mut out),
            KVE_ERR_INVALID_ARGUMENT
        );
        expect!(
            kve_score_workspace_size(&sp, 4, 2, 0, 8, 8, &mut out),
            KVE_ERR_INVALID_ARGUMENT
        );
        expect!(
            kve_score_workspace_size(&sp, 4, 2, u64::MAX, 8, 8, &mut out),
            KVE_ERR_INVALID_ARGUMENT
        );
        expect!(
            kve_score_workspace_size(&sp, 4, 2, 40, u64::MAX, 8, &mut out),
            KVE_ERR_INVALID_ARGUMENT
        );
        expect!(
            kve_score_workspace_size(&sp, u64::MAX, 2, 40, 8, 8, &mut out),
            KVE_ERR_INVALID_ARGUMENT
        );
        let sel = select_params(0, 0, 4);
        let mut o2 = CANARY as u64;
        expect!(
            kve_select_output_len(&sel, 0, 2, 40, 8, &mut out, &mut o2),
            KVE_ERR_INVALID_ARGUMENT
        );
        expect!(
            kve_select_output_len(&sel, 2, 2, 0, 8, &mut out, &mut o2),
            KVE_ERR_INVALID_ARGUMENT
        );
        expect!(
            kve_select_output_len(&sel, u64::MAX, 2, 40, 8, &mut out, &mut o2),
            KVE_ERR_OVERFLOW
        );
        expect!(
            kve_select_output_len(&sel, 2, 2, u64::MAX, 8, &mut out, &mut o2),
            KVE_ERR_OVERFLOW
        );
        expect!(
            kve_select_workspace_size(&sel, 1 << 20, 1 << 20, 40, 8, &mut out),
            KVE_ERR_OVERFLOW
        );
        expect!(
            kve_evicted_positions(null(), 0, u64::MAX, null_mut(), 0, &mut out),
            KVE_ERR_INVALID_ARGUMENT
        );
        // value links: no tokens, no channels, past 2^31 tokens (issue 26: these were sized)
        for (n, dv) in [(0, 8), (40, 0), ((1 << 31) + 1, 8), (u64::MAX, 8)] {
            expect!(
                kve_value_links_workspace_size(n, dv, &mut out),
                KVE_ERR_INVALID_ARGUMENT
            );
        }
        expect!(kve_value_links_workspace_size(1 << 31, 1, &mut out), KVE_OK);
        out = CANARY as u64;
        assert_eq!(o2, CANARY as u64);
    }
    assert_eq!(out, CANARY as u64);
}

#[test]
fn products_that_overflow() {
    let mut l = Layer::new();
    // (N-1) * stride overflows
    l.check_edits(
        &score_params(0),
        &[(|i| i.keys.stride[1] = u64::MAX / 2, KVE_ERR_OVERFLOW)],
    );
    let mut out = CANARY as u64;
    unsafe {
        expect!(
            kve_gram_len(65536, 1, 1 << 40, 1, &mut out),
            KVE_ERR_OVERFLOW
        );
        expect!(
            kve_gram_workspace_size(u64::MAX, 3, &mut out),
            KVE_ERR_OVERFLOW
        );
        expect!(
            kve_value_forms_len(65536, 1, u64::MAX, 1, &mut out),
            KVE_ERR_OVERFLOW
        );
        expect!(
            kve_value_l1_workspace_size(1 << 40, 1 << 40, &mut out),
            KVE_ERR_OVERFLOW
        );
        let sel = select_params(0, 0, 4);
        let mut o2 = CANARY as u64;
        expect!(
            kve_select_output_len(&sel, 1 << 31, 1 << 31, 40, 8, &mut out, &mut o2),
            KVE_ERR_OVERFLOW
        );
        expect!(
            kve_select_shard_output_len(1 << 20, 1 << 20, 1 << 30, &mut out, &mut o2),
            KVE_ERR_OVERFLOW
        );
    }
    assert_eq!(out, CANARY as u64);
}

#[test]
fn strides_past_the_buffer_and_overlapping_outputs() {
    Layer::new().check_edits(
        &score_params(0),
        &[
            (|i| i.keys.len -= 1, KVE_ERR_OUT_OF_BOUNDS),
            (|i| i.queries.stride[0] += 1, KVE_ERR_OUT_OF_BOUNDS),
            // stride 0 (broadcast) is a valid input view
            (|i| i.keys.stride[0] = 0, KVE_OK),
        ],
    );

    // compaction refuses a destination whose rows overlap
    let mut kv = data(HKV * N * D, 9);
    let before = kv.clone();
    let offsets = [0u64, 2, 4];
    let indices = [1u32, 3, 0, 5];
    let mut lengths = [CANARY; 2];
    // token stride < d
    let mut t = tensor(kv.as_mut_ptr(), kv.len(), [HKV, N, D], [N * D, 4, 1]);
    // the lists `offsets` (3) and `indices` (4) applied to `t`, their lengths out
    let mut compact = |t: &kve_tensor, offsets: &[u64; 3], indices: &[u32; 4]| unsafe {
        kve_compact_in_place(
            t,
            offsets.as_ptr(),
            3,
            indices.as_ptr(),
            4,
            lengths.as_mut_ptr(),
            2,
        )
    };
    expect!(compact(&t, &offsets, &indices), KVE_ERR_ALIASING);
    t.stride = [0, D as u64, 1]; // heads on top of each other
    expect!(compact(&t, &offsets, &indices), KVE_ERR_ALIASING);
    // lists that are not ascending, or reach past N
    t.stride = [(N * D) as u64, D as u64, 1];
    let bad = [3u32, 1, 0, 5];
    expect!(compact(&t, &offsets, &bad), KVE_ERR_INVALID_ARGUMENT);
    let bad = [1u32, 3, 0, N as u32];
    expect!(compact(&t, &offsets, &bad), KVE_ERR_INVALID_ARGUMENT);
    let bad_off = [0u64, 5, 4];
    expect!(compact(&t, &bad_off, &indices), KVE_ERR_INVALID_ARGUMENT);
    let bad_off = [0u64, 2, 40];
    expect!(compact(&t, &bad_off, &indices), KVE_ERR_INVALID_ARGUMENT);
    assert_eq!(kv, before);
    assert_eq!(lengths, [CANARY; 2]);
}

#[test]
fn misaligned_pointers() {
    let mut l = Layer::new();
    let sp = score_params(0);
    // the keys one byte past their (aligned) start
    fn odd(t: &mut kve_tensor) {
        t.data = (t.data as *const u8).wrapping_add(1) as *const c_void;
    }
    l.check_edits(
        &sp,
        &[
            (|i| odd(&mut i.keys), KVE_ERR_MISALIGNED),
            // f16 at an odd address
            (
                |i| {
                    i.keys.dtype = 1;
                    odd(&mut i.keys)
                },
                KVE_ERR_MISALIGNED,
            ),
        ],
    );
    let inp = l.inputs();
    let mut out = canary_f32(HKV * P + 1);
    unsafe {
        let st = kve_score_layer(
            &sp,
            &inp,
            (out.as_mut_ptr() as *mut u8).add(1) as *mut f32,
            (HKV * P) as u64,
            l.ws.as_mut_ptr() as _,
            l.ws.len() as u64,
        );
        expect!(st, KVE_ERR_MISALIGNED);
        let mut x = [0u64; 3];
        expect!(
            kve_score_workspace_size(
                &sp,
                4,
                2,
                40,
                8,
                8,
                (x.as_mut_ptr() as *mut u8).add(4) as *mut u64
            ),
            KVE_ERR_MISALIGNED
        );
        let scores = data(HKV * P, 4);
        let ms = kve_model_scores::of(&scores, 1, HKV as u64, N as u64, W as u64);
        let sel = select_params(0, 0, 4);
        let mut off = [CANARY as u64; 4];
        let mut idx = [CANARY; 64];
        let mut ws = vec![0u8; 4096];
        let st = kve_select_model(
            &sel,
            &ms,
            (off.as_mut_ptr() as *mut u8).add(4) as *mut u64,
            3,
            idx.as_mut_ptr(),
            64,
            ws.as_mut_ptr() as _,
            4096,
        );
        expect!(st, KVE_ERR_MISALIGNED);
        assert_eq!(idx, [CANARY; 64]);
        // params struct misaligned
        let mut raw = [0u32; 16];
        let sp_bytes = std::slice::from_raw_parts(&sp as *const _ as *const u8, 48);
        let dst = (raw.as_mut_ptr() as *mut u8).add(2);
        std::ptr::copy_nonoverlapping(sp_bytes.as_ptr(), dst, 48);
        let st = kve_score_layer(
            dst as *const kve_score_params,
            &inp,
            out.as_mut_ptr(),
            (HKV * P) as u64,
            l.ws.as_mut_ptr() as _,
            l.ws.len() as u64,
        );
        expect!(st, KVE_ERR_MISALIGNED);
    }
    assert!(untouched_f32(&out));
}

#[test]
fn enums_out_of_range() {
    let mut l = Layer::new();
    let inp = l.inputs();
    let base = score_params(0);
    let cases: [(fn(&mut kve_score_params), i32); 7] = [
        (|p| p.scorer = 8, KVE_ERR_BAD_ENUM),
        (|p| p.scorer = u32::MAX, KVE_ERR_BAD_ENUM),
        (|p| p.pool_kind = 4, KVE_ERR_BAD_ENUM),
        (|p| p.gqa = 3, KVE_ERR_BAD_ENUM),
        (|p| p.laprox_gqa = 3, KVE_ERR_BAD_ENUM),
        (|p| p.placement = 2, KVE_ERR_BAD_ENUM),
        (|p| p.reduce_before_pool = 2, KVE_ERR_INVALID_ARGUMENT),
    ];
    for (f, want) in cases {
        let mut sp = base;
        f(&mut sp);
        expect!(l.score(&sp, &inp), want);
    }
    l.check_edits(
        &base,
        &[
            // the first value past KVE_DTYPE_Q4_0
            (|i| i.keys.dtype = 5, KVE_ERR_BAD_ENUM),
            (|i| i.keys.pad = 1, KVE_ERR_INVALID_ARGUMENT),
        ],
    );
    // out-of-range parameters that are not enums
    let mut sp = base;
    sp.pool_kernel = 4; // even kernel for max pooling
    expect!(l.score(&sp, &inp), KVE_ERR_INVALID_ARGUMENT);
    let mut sp = base;
    sp.window = 0;
    expect!(l.score(&sp, &inp), KVE_ERR_INVALID_ARGUMENT);
    unsafe {
        let mut p = std::mem::zeroed::<kve_score_params>();
        expect!(
            kve_score_params_init(&mut p, 48, kve_preset_count()),
            KVE_ERR_BAD_ENUM
        );
        assert_eq!(p.struct_size, 0);
        let mut s = std::mem::zeroed::<kve_select_params>();
        expect!(
            kve_select_params_init(&mut s, 48, 5, 0, 1),
            KVE_ERR_BAD_ENUM
        );
        expect!(
            kve_select_params_init(&mut s, 48, 0, 3, 1),
            KVE_ERR_BAD_ENUM
        );
        assert_eq!(s.struct_size, 0);
        let scores = data(HKV * P, 4);
        let ms = kve_model_scores::of(&scores, 1, HKV as u64, N as u64, W as u64);
        let mut off = [CANARY as u64; 3];
        let mut idx = [CANARY; 80];
        let mut ws = vec![0u8; 8192];
        let cases: [(fn(&mut kve_select_params), i32); 6] = [
            (|s| s.allocator = 5, KVE_ERR_BAD_ENUM),
            (|s| s.granularity = 3, KVE_ERR_BAD_ENUM),
            (|s| s.normalize = 2, KVE_ERR_BAD_ENUM),
            (|s| s.post_pool_kind = 9, KVE_ERR_BAD_ENUM),
            (|s| s.alpha = f32::NAN, KVE_ERR_INVALID_ARGUMENT),
            // (the V1 `reserved` slot is now post_pool_sinks, any value valid)
            (|s| s.beta = 0, KVE_ERR_INVALID_ARGUMENT),
        ];
        for (f, want) in cases {
            let mut sel = select_params(0, 0, 4);
            f(&mut sel);
            let (o, i, w) = (off.as_mut_ptr(), idx.as_mut_ptr(), ws.as_mut_ptr());
            expect!(kve_select_model(&sel, &ms, o, 3, i, 80, w as _, 8192), want);
        }
        assert_eq!(off, [CANARY as u64; 3]);
        assert_eq!(idx, [CANARY; 80]);
        let mut out = CANARY as u64;
        expect!(kve_gram_len(4, 2, 8, 2, &mut out), KVE_ERR_INVALID_ARGUMENT); // cross flag
        assert_eq!(out, CANARY as u64);
    }
}

#[test]
fn struct_sizes() {
    let mut l = Layer::new();
    let inp = l.inputs();
    let mut sp = score_params(0);
    for bad in [0u32, 4, 44, 47, 4100, u32::MAX] {
        sp.struct_size = bad;
        expect!(l.score(&sp, &inp), KVE_ERR_INVALID_ARGUMENT);
    }
    // a size the library never released, larger ones included, is refused (reading or
    // writing it); tests/capi_contract.rs checks every released size
    #[repr(C)]
    struct Bigger {
        p: kve_score_params,
        extra: [u32; 4],
    }
    let mut b = Bigger {
        p: score_params(0),
        extra: [0; 4],
    };
    b.p.struct_size = std::mem::size_of::<Bigger>() as u32;
    expect!(l.score(&b.p, &inp), KVE_ERR_INVALID_ARGUMENT);
    let mut big = Bigger {
        p: unsafe { std::mem::zeroed() },
        extra: [CANARY; 4],
    };
    unsafe {
        expect!(
            kve_score_params_init(&mut big.p, 56, 3),
            KVE_ERR_INVALID_ARGUMENT
        );
    }
    assert_eq!(big.p.struct_size, 0);
    assert_eq!(big.extra, [CANARY; 4]);
    unsafe {
        let mut p = std::mem::zeroed::<kve_score_params>();
        expect!(
            kve_score_params_init(&mut p, 40, 3),
            KVE_ERR_INVALID_ARGUMENT
        );
        let mut i = std::mem::zeroed::<kve_layer_inputs>();
        expect!(kve_layer_inputs_init(&mut i, 8), KVE_ERR_INVALID_ARGUMENT);
    }
    l.check_edits(
        &score_params(0),
        &[(|i| i.reserved = 3, KVE_ERR_INVALID_ARGUMENT)],
    );
}

#[test]
fn window_longer_than_queries() {
    let mut l = Layer::new();
    let inp = l.inputs(); // W = 8 query rows
    let mut sp = score_params(0);
    sp.window = 16;
    expect!(l.score(&sp, &inp), KVE_ERR_INVALID_ARGUMENT);
    // a window longer than the cache is fine: no prefix, nothing to score, output untouched
    sp.window = 1000;
    let mut q = l.q.clone();
    q.resize(HQ * N * D, 0.5);
    let mut inp2 = l.inputs();
    inp2.queries = contiguous(&q, [HQ, N, D]);
    l.ws = vec![0; 1 << 20];
    expect!(l.score(&sp, &inp2), KVE_OK);
    assert!(untouched_f32(&l.out));
    let mut out = CANARY as u64;
    unsafe {
        assert_eq!(
            kve_score_output_len(&sp, HKV as u64, N as u64, &mut out),
            KVE_OK
        )
    };
    assert_eq!(out, 0);
}

#[test]
fn budgets_larger_than_available_are_clamped() {
    let scores: Vec<f32> = data(3 * HKV * P, 5).iter().map(|x| x.abs()).collect();
    for budget in [P as u64, P as u64 + 1, 1 << 40, u64::MAX] {
        for (alloc, gran) in [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (4, 2), (0, 1)] {
            if alloc == 2 && budget < 20 * P as u64 {
                continue; // PyramidKV's budget is an average: its deepest layers get budget/20
            }
            let sel = select_params(alloc, gran, budget);
            let (st, off, idx) = select(&sel, &scores, 3, N, W);
            expect!(st, KVE_OK);
            for u in 0..3 * HKV {
                let list = &idx[off[u] as usize..off[u + 1] as usize];
                assert_eq!(
                    list,
                    (0..N as u32).collect::<Vec<_>>().as_slice(),
                    "alloc {alloc} gran {gran} budget {budget}"
                );
            }
        }
    }
}

#[test]
fn nan_and_inf() {
    let mut l = Layer::new();
    let sp = score_params(0);
    for (which, v) in [(0, f32::NAN), (1, f32::INFINITY), (0, f32::NEG_INFINITY)] {
        let mut l2 = Layer::new();
        if which == 0 {
            l2.q[5] = v;
        } else {
            l2.k[D * 3 + 1] = v;
        }
        let inp = l2.inputs();
        expect!(l2.score(&sp, &inp), KVE_ERR_NON_FINITE);
    }
    // LAVa reads values
    l.v[D * 2] = f32::NAN;
    let inp = l.inputs();
    expect!(l.score(&score_params(2), &inp), KVE_ERR_NON_FINITE);
    // selection
    let mut scores: Vec<f32> = data(HKV * P, 5);
    scores[7] = f32::NAN;
    let (st, _, _) = select(&select_params(0, 0, 4), &scores, 1, N, W);
    expect!(st, KVE_ERR_NON_FINITE);
    // Gram and CriticalKV's L1 norms reject a NaN in Wo
    let mut wo = data(HQ * D * 16, 6);
    wo[17] = f32::INFINITY;
    let t = contiguous(&wo, [HQ, D, 16]);
    let glen = gram_len(HQ, HKV, D, 0);
    let mut gws = 0u64;
    // SAFETY: a host out-parameter.
    unsafe { assert_eq!(kve_gram_workspace_size(D as u64, 16, &mut gws), KVE_OK) };
    let mut g = canary_f32(glen as usize);
    let mut ws = vec![0u8; gws as usize];
    unsafe {
        expect!(
            kve_compute_gram(
                &t,
                HKV as u64,
                0,
                g.as_mut_ptr(),
                glen,
                ws.as_mut_ptr() as _,
                gws
            ),
            KVE_ERR_NON_FINITE
        );
    }
    assert!(untouched_f32(&g));
    let mut lws = 0u64;
    unsafe { assert_eq!(kve_value_l1_workspace_size(D as u64, 16, &mut lws), KVE_OK) };
    let mut l1 = canary_f32(HKV * N);
    let mut ws = vec![0u8; lws as usize];
    let vt = contiguous(&l.k, [HKV, N, D]);
    unsafe {
        expect!(
            kve_compute_value_l1(
                &vt,
                &t,
                l1.as_mut_ptr(),
                l1.len() as u64,
                ws.as_mut_ptr() as _,
                lws
            ),
            KVE_ERR_NON_FINITE
        );
    }
    assert!(untouched_f32(&l1));
    // value forms with a NaN Gram
    let mut gram = data(glen as usize, 8);
    gram[3] = f32::NAN;
    let mut flen = 0u64;
    unsafe {
        assert_eq!(
            kve_value_forms_len(HQ as u64, HKV as u64, N as u64, 0, &mut flen),
            KVE_OK
        )
    };
    let mut forms = canary_f32(flen as usize);
    unsafe {
        expect!(
            kve_compute_value_forms(
                &vt,
                gram.as_ptr(),
                glen,
                HQ as u64,
                0,
                0,
                N as u64,
                forms.as_mut_ptr(),
                flen
            ),
            KVE_ERR_NON_FINITE
        );
    }
    assert!(untouched_f32(&forms));
}

#[test]
fn outputs_too_small() {
    let mut l = Layer::new();
    let sp = score_params(0);
    let inp = l.inputs();
    let mut out = canary_f32(HKV * P);
    unsafe {
        expect!(
            kve_score_layer(
                &sp,
                &inp,
                out.as_mut_ptr(),
                (HKV * P - 1) as u64,
                l.ws.as_mut_ptr() as _,
                l.ws.len() as u64
            ),
            KVE_ERR_OUTPUT_TOO_SMALL
        );
        expect!(
            kve_score_layer(
                &sp,
                &inp,
                out.as_mut_ptr(),
                (HKV * P) as u64,
                l.ws.as_mut_ptr() as _,
                l.ws.len() as u64 - 1
            ),
            KVE_ERR_WORKSPACE_TOO_SMALL
        );
    }
    assert!(untouched_f32(&out));
    // selection outputs
    let scores: Vec<f32> = data(2 * HKV * P, 5).iter().map(|x| x.abs()).collect();
    let sel = select_params(0, 0, 5);
    let (mut ol, mut il, mut wl) = (0u64, 0u64, 0u64);
    unsafe {
        kve_select_output_len(&sel, 2, HKV as u64, N as u64, W as u64, &mut ol, &mut il);
        kve_select_workspace_size(&sel, 2, HKV as u64, N as u64, W as u64, &mut wl);
    }
    let ms = kve_model_scores::of(&scores, 2, HKV as u64, N as u64, W as u64);
    let mut off = vec![CANARY as u64; ol as usize];
    let mut idx = vec![CANARY; il as usize];
    let mut ws = vec![0u8; wl as usize];
    let short = kve_model_scores {
        len: scores.len() as u64 - 1,
        ..ms
    };
    let (o, i, w) = (
        off.as_mut_ptr(),
        idx.as_mut_ptr(),
        ws.as_mut_ptr() as *mut c_void,
    );
    let cases = [
        ((&ms, ol - 1, il, wl), KVE_ERR_OUTPUT_TOO_SMALL),
        ((&ms, ol, il - 1, wl), KVE_ERR_OUTPUT_TOO_SMALL),
        ((&ms, ol, il, wl - 1), KVE_ERR_WORKSPACE_TOO_SMALL),
        ((&short, ol, il, wl), KVE_ERR_SHAPE_MISMATCH),
    ];
    for (k, ((m, ol, il, wl), want)) in cases.into_iter().enumerate() {
        let st = unsafe { kve_select_model(&sel, m, o, ol, i, il, w, wl) };
        assert_eq!(name(st), name(want), "case {k}");
    }
    assert!(off.iter().all(|&x| x == CANARY as u64) && idx.iter().all(|&x| x == CANARY));
    // eviction list
    let kept = [1u32, 4, 9];
    let mut ev = [CANARY; 16];
    let mut cnt = CANARY as u64;
    unsafe {
        expect!(
            kve_evicted_positions(kept.as_ptr(), 3, 12, ev.as_mut_ptr(), 8, &mut cnt),
            KVE_ERR_OUTPUT_TOO_SMALL
        );
        assert_eq!((ev, cnt), ([CANARY; 16], CANARY as u64));
        let unsorted = [4u32, 1];
        expect!(
            kve_evicted_positions(unsorted.as_ptr(), 2, 12, ev.as_mut_ptr(), 16, &mut cnt),
            KVE_ERR_INVALID_ARGUMENT
        );
        assert_eq!((ev, cnt), ([CANARY; 16], CANARY as u64));
        expect!(
            kve_evicted_positions(kept.as_ptr(), 3, 12, ev.as_mut_ptr(), 9, &mut cnt),
            KVE_OK
        );
    }
    assert_eq!(cnt, 9);
    assert_eq!(&ev[..9], &[0, 2, 3, 5, 6, 7, 8, 10, 11]);
    // varlen destination and cu_seqlens too small
    let src = data(HKV * N * D, 3);
    let offsets = [0u64, 3, 5];
    let indices = [1u32, 2, 7, 0, 39];
    let mut dst = canary_f32(4 * D);
    let mut cu = [CANARY as i32; 3];
    let ts = contiguous(&src, [HKV, N, D]);
    let td = contiguous(&dst, [1, 4, D]);
    let td5 = tensor(dst.as_mut_ptr(), 4 * D, [1, 5, D], [5 * D, D, 1]);
    let (o, i, c) = (offsets.as_ptr(), indices.as_ptr(), cu.as_mut_ptr());
    let cases = [
        ((&td, 3), KVE_ERR_OUTPUT_TOO_SMALL),
        ((&td5, 3), KVE_ERR_OUT_OF_BOUNDS),
        ((&td, 2), KVE_ERR_OUTPUT_TOO_SMALL),
    ];
    for (k, ((t, cu_len), want)) in cases.into_iter().enumerate() {
        let st = unsafe { kve_compact_varlen(&ts, o, 3, i, 5, t, c, cu_len) };
        assert_eq!(name(st), name(want), "case {k}");
    }
    assert!(untouched_f32(&dst));
    assert_eq!(cu, [CANARY as i32; 3]);
}

#[test]
fn input_output_aliasing() {
    let mut l = Layer::new();
    let sp = score_params(0);
    let inp = l.inputs();
    let ws_len = l.ws.len() as u64;
    // output inside the keys, workspace over the queries
    let before = l.k.clone();
    unsafe {
        expect!(
            kve_score_layer(
                &sp,
                &inp,
                l.k.as_mut_ptr().add(3),
                (HKV * P) as u64,
                l.ws.as_mut_ptr() as _,
                ws_len
            ),
            KVE_ERR_ALIASING
        );
        let mut big = vec![0u8; ws_len as usize + l.q.len() * 4];
        let mut q2: Vec<f32> = Vec::new();
        q2.extend_from_slice(&l.q);
        let mut inp2 = inp;
        inp2.queries = contiguous(&q2, [HQ, W, D]);
        expect!(
            kve_score_layer(
                &sp,
                &inp2,
                l.out.as_mut_ptr(),
                (HKV * P) as u64,
                q2.as_mut_ptr() as _,
                ws_len
            ),
            KVE_ERR_ALIASING
        );
        // output overlapping the workspace
        expect!(
            kve_score_layer(
                &sp,
                &inp,
                big.as_mut_ptr() as *mut f32,
                (HKV * P) as u64,
                big.as_mut_ptr().add(8) as _,
                ws_len
            ),
            KVE_ERR_ALIASING
        );
    }
    assert_eq!(l.k, before);
    // selection: indices over the scores
    let mut scores: Vec<f32> = data(HKV * P + 200, 5).iter().map(|x| x.abs()).collect();
    let sc = scores.clone();
    let sel = select_params(0, 0, 4);
    let mut off = [CANARY as u64; 3];
    let mut ws = vec![0u8; 8192];
    let ms = kve_model_scores {
        scores: scores.as_ptr(),
        len: (HKV * P) as u64,
        layers: 1,
        hkv: HKV as u64,
        n: N as u64,
        window: W as u64,
    };
    unsafe {
        let idx = scores.as_mut_ptr().add(10) as *mut u32;
        expect!(
            kve_select_model(
                &sel,
                &ms,
                off.as_mut_ptr(),
                3,
                idx,
                80,
                ws.as_mut_ptr() as _,
                8192
            ),
            KVE_ERR_ALIASING
        );
    }
    assert_eq!(scores, sc);
    assert_eq!(off, [CANARY as u64; 3]);
    // compaction: lengths inside the cache, lists inside the cache, varlen dst over src
    let mut kv = data(HKV * N * D, 9);
    let kvc = kv.clone();
    let t = contiguous(&kv, [HKV, N, D]);
    let offsets = [0u64, 2, 4];
    let indices = [1u32, 3, 0, 5];
    unsafe {
        expect!(
            kve_compact_in_place(
                &t,
                offsets.as_ptr(),
                3,
                indices.as_ptr(),
                4,
                kv.as_mut_ptr().add(7) as *mut u32,
                2
            ),
            KVE_ERR_ALIASING
        );
        let lists = kv.as_ptr().add(100) as *const u32;
        expect!(
            kve_compact_in_place(&t, offsets.as_ptr(), 3, lists, 4, null_mut(), 0),
            KVE_ERR_ALIASING
        );
        let mut cu = [0i32; 3];
        let td = tensor(kv.as_mut_ptr().add(N * D), 4 * D, [1, 4, D], [4 * D, D, 1]);
        expect!(
            kve_compact_varlen(
                &t,
                offsets.as_ptr(),
                3,
                indices.as_ptr(),
                4,
                &td,
                cu.as_mut_ptr(),
                3
            ),
            KVE_ERR_ALIASING
        );
        // histogram merged into itself
        let mut h = std::mem::zeroed::<kve_histogram>();
        expect!(kve_histogram_merge(&mut h, &h), KVE_ERR_ALIASING);
        // two out-parameters on top of each other
        let mut x = 0u64;
        expect!(
            kve_select_output_len(&sel, 1, 2, 40, 8, &mut x, &mut x),
            KVE_ERR_ALIASING
        );
    }
    assert_eq!(kv, kvc);
}
