use super::*;

// ------------------------------------------------------------------------- selection

/// Host selection as per-unit prefix lists (the window dropped).
fn host_select(
    p: &kve_select_params,
    scores: &[f32],
    layers: usize,
    hkv: usize,
    n: usize,
    w: usize,
) -> Vec<Vec<u32>> {
    let m = kve_model_scores::of(&scores, layers as u64, hkv as u64, n as u64, w as u64);
    let (st, off, idx) = host_select_call(p, &m);
    assert_eq!(st, KVE_OK);
    (0..layers * hkv)
        .map(|u| idx[off[u] as usize..off[u + 1] as usize].to_vec())
        .collect()
}

fn device_select(
    p: &kve_select_params,
    scores: &Buf,
    len: usize,
    layers: usize,
    hkv: usize,
    n: usize,
    w: usize,
) -> Vec<Vec<u32>> {
    let m = kve_model_scores {
        scores: scores.ptr_as(),
        len: len as u64,
        layers: layers as u64,
        hkv: hkv as u64,
        n: n as u64,
        window: w as u64,
    };
    let units = layers * hkv;
    let ld = n + 3;
    unsafe {
        let mut bytes = 0u64;
        assert_eq!(
            kve_cuda_select_model_workspace_size(
                p,
                layers as u64,
                hkv as u64,
                n as u64,
                w as u64,
                &mut bytes
            ),
            KVE_OK
        );
        let ws = Buf::new(bytes as usize);
        let counts = Buf::new(units * 4);
        let idx = Buf::new(units * ld * 4);
        let st = kve_cuda_select_model(
            p,
            &m,
            counts.ptr_as(),
            units as u64,
            idx.ptr_as(),
            ld as u64,
            (units * ld) as u64,
            ws.ptr_as(),
            bytes,
            null_mut(),
        );
        assert_eq!(st, KVE_OK, "device select");
        let c = counts.download_as::<i32>(units);
        let x = idx.download_as::<i32>(units * ld);
        (0..units)
            .map(|u| {
                x[u * ld..u * ld + c[u] as usize]
                    .iter()
                    .map(|&i| i as u32)
                    .collect()
            })
            .collect()
    }
}

#[test]
fn device_selection_equals_host_for_every_allocator_and_granularity() {
    let mut rng = device_rng!(77);
    let (layers, hkv, n, w) = (5, 3, 230, 30);
    let p = n - w;
    // non-negative scores of different scales per layer, with exact ties
    let mut scores = vec![0f32; layers * hkv * p];
    for (e, s) in scores.iter_mut().enumerate() {
        let l = e / (hkv * p);
        *s = rng.unif() * (1.0 + l as f32);
        if e % 17 == 0 {
            *s = 0.5;
        }
    }
    let d = Buf::bytes_of(&scores);
    let mut checked = 0;
    for &alloc in AllocatorKind::ALL {
        for &gran in Granularity::ALL {
            for budget in [0u64, 7, 40, 1000] {
                for (norm, pool, sinks) in [
                    (Normalize::LayerSum, Pool::NONE, 0),
                    (Normalize::None, Pool::NONE, 2),
                    (Normalize::LayerSum, Pool::forward(8, 0.9), 0),
                    (Normalize::LayerSum, Pool::forward(9, 1.0), 1),
                    (Normalize::LayerSum, Pool::max(3), 0),
                    (Normalize::None, Pool::avg(5), 5),
                    (Normalize::LayerSum, Pool::forward(3, 0.5), u32::MAX),
                ] {
                    let mut sp = select_params(alloc, gran, budget);
                    sp.normalize = norm as u32;
                    sp.post_pool_kind = pool.kind as u32;
                    sp.post_pool_kernel = pool.kernel;
                    sp.post_pool_decay = pool.decay;
                    sp.post_pool_sinks = sinks;
                    sp.alpha = 0.3;
                    let host = host_select(&sp, &scores, layers, hkv, n, w);
                    let devs = device_select(&sp, &d, scores.len(), layers, hkv, n, w);
                    assert_eq!(
                        devs, host,
                        "{alloc:?} {gran:?} budget {budget} {norm:?} {pool:?} sinks {sinks}"
                    );
                    checked += 1;
                }
            }
        }
    }
    // LaProx-span's selection, and a cache that is all window
    // SAFETY: a writable struct of the size passed.
    let sp = capi_common::init_struct(|p, size| unsafe {
        kve_select_params_init_laprox_span(p, size, 20)
    });
    assert_eq!(
        device_select(&sp, &d, scores.len(), layers, hkv, n, w),
        host_select(&sp, &scores, layers, hkv, n, w)
    );
    // a cache that is all window: every list is the whole cache
    // (no prefix: the scores' length is 0, `layers * hkv * P`)
    let all_window = device_select(&sp, &d, 0, layers, hkv, 20, 30);
    assert_eq!(all_window, host_select(&sp, &[], layers, hkv, 20, 30));
    assert!(all_window
        .iter()
        .all(|l| *l == (0..20).collect::<Vec<u32>>()));
    println!("{checked} selections equal to the host's");
}

#[test]
fn device_select_rejects_bad_input_before_launching() {
    need_device!();
    let (layers, hkv, n, w) = (2usize, 2usize, 50usize, 10usize);
    let p = n - w;
    let d = Buf::bytes_of(&vec![1f32; layers * hkv * p]);
    let sp = select_params(AllocatorKind::Lava, Granularity::Head, 5);
    let mut m = kve_model_scores {
        scores: d.ptr_as(),
        len: (layers * hkv * p) as u64,
        layers: layers as u64,
        hkv: hkv as u64,
        n: n as u64,
        window: w as u64,
    };
    unsafe {
        let mut bytes = 0u64;
        assert_eq!(
            kve_cuda_select_model_workspace_size(&sp, 2, 2, n as u64, w as u64, &mut bytes),
            KVE_OK
        );
        let ws = Buf::new(bytes as usize);
        let units = layers * hkv;
        let counts = Buf::new(units * 4);
        let idx = Buf::new(units * n * 4);
        let canary = vec![-7i32; units];
        let run = |m: &kve_model_scores, ld: u64, wsb: u64| {
            counts.upload_as(&canary);
            let st = kve_cuda_select_model(
                &sp,
                m,
                counts.ptr_as(),
                units as u64,
                idx.ptr_as(),
                ld,
                (units * n) as u64,
                ws.ptr_as(),
                wsb,
                null_mut(),
            );
            let untouched = counts.download_as::<i32>(units) == canary;
            (st, untouched)
        };
        assert_eq!(
            run(&m, n as u64, bytes - 1),
            (KVE_ERR_WORKSPACE_TOO_SMALL, true)
        );
        assert_eq!(
            run(&m, n as u64 - 1, bytes),
            (KVE_ERR_OUTPUT_TOO_SMALL, true)
        );
        m.len -= 1;
        assert_eq!(run(&m, n as u64, bytes), (KVE_ERR_SHAPE_MISMATCH, true));
        m.len += 1;
        m.layers = 0;
        assert_eq!(run(&m, n as u64, bytes), (KVE_ERR_INVALID_ARGUMENT, true));
        m.layers = 2;
        m.scores = null();
        assert_eq!(run(&m, n as u64, bytes), (KVE_ERR_NULL_POINTER, true));
        m.scores = d.ptr_as();
        // the kept lists over the scores
        let st = kve_cuda_select_model(
            &sp,
            &m,
            counts.ptr_as(),
            units as u64,
            d.ptr_as(),
            n as u64,
            (units * n) as u64,
            ws.ptr_as(),
            bytes,
            null_mut(),
        );
        assert_eq!(st, KVE_ERR_ALIASING);
        let (st, _) = run(&m, n as u64, bytes);
        assert_eq!(st, KVE_OK);
    }
}

/// Shapes past the select path's kernel limits (grid dimensions over layers or pooled
/// rows; a select group of 2^32 entries or more) are refused before any launch with
/// `KVE_ERR_INVALID_ARGUMENT`, not `KVE_ERR_CUDA` from a launcher. Found by reading the
/// launch chain against the launchers' checks (the fuzz target's arena is too small).
#[test]
fn device_select_rejects_shapes_beyond_the_kernels() {
    need_device!();
    // (allocator, granularity, normalize, layers, hkv, n, window)
    let cases = [
        // layer_stats over 65536 layers
        (
            AllocatorKind::Lava,
            Granularity::Head,
            Normalize::None,
            65536,
            1,
            2,
            1,
        ),
        // the layer reduce over 65536 layers
        (
            AllocatorKind::Uniform,
            Granularity::Layer,
            Normalize::None,
            65536,
            1,
            2,
            1,
        ),
        // the safeguard's copy: a pool over 65536 rows
        (
            AllocatorKind::Ada,
            Granularity::Head,
            Normalize::None,
            4,
            16384,
            2,
            1,
        ),
        // one global group of 3·(2^31 - 1) entries
        (
            AllocatorKind::Global,
            Granularity::Head,
            Normalize::None,
            1,
            3,
            (1 << 31) - 1,
            0,
        ),
    ];
    let d = Buf::bytes_of(&vec![1f32; 64]);
    let small = Buf::new(1024);
    let counts = Buf::new(64);
    let idx = Buf::new(64);
    for (alloc, gran, norm, layers, hkv, n, w) in cases {
        let mut sp = select_params(alloc, gran, 1);
        sp.normalize = norm as u32;
        let (units, p) = (layers * hkv, n - w);
        // descriptors only: nothing is read or written once the shape is refused
        let m = kve_model_scores {
            scores: d.ptr_as(),
            len: units * p,
            layers,
            hkv,
            n,
            window: w,
        };
        unsafe {
            let st = kve_cuda_select_model(
                &sp,
                &m,
                counts.ptr_as(),
                units,
                idx.ptr_as(),
                n,
                u64::MAX,
                small.ptr_as(),
                1024,
                null_mut(),
            );
            assert_eq!(
                st, KVE_ERR_INVALID_ARGUMENT,
                "{alloc:?} {gran:?} {layers}x{hkv} n {n}"
            );
        }
    }
}
