//! Host-side functions (workspace sizes), the CUDA error state, and launches captured in
//! CUDA graphs.

use super::*;

// ---------------------------------------------------------- host functions, graphs --

#[test]
fn workspace_sizes_are_pure_host_functions() {
    // Callable without a device.
    let a = unsafe { kve_cuda_window_workspace_size(32, 32, 131072, 8) };
    assert!(a > 0);
    assert_eq!(unsafe { kve_cuda_window_workspace_size(0, 32, 10, 8) }, 0);
    assert!(unsafe { kve_cuda_select_workspace_size(1) } >= 2048 * 4);
    assert!(unsafe { kve_cuda_layer_stats_workspace_size(32, 1 << 20) } > 0);
    let v = KveCudaView {
        data: null_mut(),
        dtype: KVE_CUDA_BF16,
        reserved: 0,
        stride_head: 0,
        stride_token: 0,
        stride_dim: 1,
        heads: 8,
        tokens: 100,
        dim: 128,
    };
    assert_eq!(
        unsafe { kve_cuda_compact_workspace_size(&v, 10) },
        8 * 10 * 128 * 2
    );
}

/// Each launcher reports its own launches' status: an earlier, unrelated (non-sticky) error
/// the caller left pending — a failed cudaMalloc — is neither returned by a launcher nor
/// cleared by it (the caller's `cudaGetLastError` still sees it afterwards).
#[cfg(feature = "cuda")]
#[test]
fn launchers_leave_a_pending_error_alone() {
    need_device!();
    let (rows, n) = (3usize, 40usize);
    let out = poisoned(rows * n);
    let sums = DBuf::<f64>::new(1);
    let ent = DBuf::<f64>::new(1);
    // SAFETY: a pure host function.
    let wsb = unsafe { kve_cuda_layer_stats_workspace_size(1, (rows * n) as i64) };
    let ws = DBuf::<u8>::new(wsb.max(1));
    let mut p = null_mut();
    // SAFETY: an out-pointer to a local; 4 EiB cannot be allocated.
    let pending = unsafe { rt::cudaMalloc(&mut p, 1 << 62) };
    assert_ne!(pending, 0, "a 4 EiB cudaMalloc must fail");
    // SAFETY: device buffers of the sizes passed.
    unsafe {
        let one =
            kve_cuda_sink_scores(out.ptr(), rows as i64, n as i64, n as i64, 4, null_stream());
        assert_eq!(one, 0, "one launch: {}", err_str(one));
        let two = kve_cuda_layer_stats(
            out.ptr(),
            (rows * n) as i64,
            (rows * n) as i64,
            1,
            sums.ptr(),
            ent.ptr(),
            ws.vptr(),
            wsb,
            null_stream(),
        );
        assert_eq!(two, 0, "two launches: {}", err_str(two));
        assert_eq!(
            rt::cudaGetLastError(),
            pending,
            "the caller's error is still pending"
        );
        assert_eq!(rt::cudaGetLastError(), 0, "and reading it cleared it");
    }
    let got = out.download();
    for r in 0..rows {
        for i in 0..n {
            assert_eq!(
                got[r * n + i],
                if i < 4 { 1.0 } else { 0.0 },
                "row {r} token {i}"
            );
        }
    }
    assert_eq!(sums.download()[0], (rows * 4) as f64, "the layer sum");
}

/// The row_lse path of kve_cuda_window in a CUDA graph: replays equal the eager run and
/// the reference (the path itself: `tests/launchers.rs`).
#[test]
fn window_row_lse_in_a_graph() {
    let mut rng = device_rng!(10);
    // the row_lse path in a CUDA graph: replays equal the eager run
    let (hq, hkv, w, n, d) = (4usize, 2usize, 8usize, 300usize, 64usize);
    let p = n - w;
    let q = Tensor::normal(&mut rng, Dt::Bf16, Layout::HeadMajor, [hq, w, d]);
    let k = Tensor::normal(&mut rng, Dt::Bf16, Layout::TokenMajor, [hkv, n, d]);
    let lse: Vec<f32> = ref_row_lse(&q, &k, w).iter().map(|&x| x as f32).collect();
    let lsed = DBuf::from(&lse);
    let wsb = unsafe { kve_cuda_window_workspace_size(hq as i64, w as i64, n as i64, hkv as i64) };
    let ws = DBuf::<u8>::new(wsb);
    let l2 = poisoned(hq * p);
    let run = |s: *mut c_void| {
        ck(
            unsafe {
                kve_cuda_window(
                    &q.view(),
                    &k.view(),
                    w as i64,
                    null_mut(),
                    l2.ptr(),
                    null_mut(),
                    null_mut(),
                    0,
                    lsed.ptr(),
                    ws.vptr(),
                    wsb,
                    s,
                )
            },
            "window row_lse",
        )
    };
    run(null_mut());
    let e = l2.download();
    l2.upload(&vec![f32::NAN; hq * p]);
    in_graph(&run);
    assert_eq!(l2.download(), e, "row_lse graph replay");
    let want = ref_window(&q, &k, w, 0);
    assert_close("window row_lse graph", &e, &want[1], 2e-4);
}

/// The whole LaProx pipeline of one layer (`kvevict::device::score_layer`) and a top-K
/// selection, captured in a CUDA graph and replayed: proves the chain is capturable and
/// gives the same numbers as an eager run, and the f64 reference's scores.
#[test]
fn laprox_pipeline_graph_capture_matches_eager() {
    let mut rng = device_rng!(9);
    let (hq, hkv, w, n, d) = (8usize, 2usize, 16usize, 600usize, 64usize);
    let p = n - w;
    let dt = Dt::Bf16;
    let q = Tensor::normal(&mut rng, dt, Layout::HeadMajor, [hq, w, d]);
    let k = Tensor::normal(&mut rng, dt, Layout::HeadMajor, [hkv, n, d]);
    let v = Tensor::normal(&mut rng, dt, Layout::HeadMajor, [hkv, n, d]);
    // G per query head [Hq][d][d] (cross = 0): the identity plus small noise
    let gram: Vec<f32> = (0..hq * d * d)
        .map(|i| {
            if i % (d + 1) == 0 {
                1.0
            } else {
                0.01 * rng.normal()
            }
        })
        .collect();
    let gd = DBuf::from(&gram);
    let mut cfg = kvevict::ScoreConfig::preset(kvevict::Preset::LaProx);
    cfg.window = w as u32;
    let ws = score_workspace(&cfg, [hq, hkv, n, d, d]);
    let inputs = gram_inputs(&q, &k, &v, &gd);
    // SAFETY: a pure host function of the group count.
    let swsb = unsafe { kve_cuda_select_workspace_size(1) };
    let sws = DBuf::<u8>::new(swsb);
    let score = poisoned(hkv * p);
    let (counts, idx) = lists_of(hkv, p, -1);
    let kk = (hkv * p / 10) as i64;
    // SAFETY: device tensors and buffers of the declared sizes.
    let run = |s: *mut c_void| unsafe {
        score_layer_into(&cfg, &inputs, &score, &ws, s).expect("device score_layer");
        ck(
            kve_cuda_select(
                score.ptr(),
                p as i64,
                p as i64,
                1,
                hkv as i64,
                null(),
                kk,
                null(),
                1,
                counts.ptr(),
                idx.ptr(),
                p as i64,
                sws.vptr(),
                swsb,
                s,
            ),
            "select",
        );
    };
    run(null_mut());
    let (e_score, e_counts, e_idx) = (score.download(), counts.download(), idx.download());
    score.upload(&vec![f32::NAN; hkv * p]);
    counts.upload(&vec![-1; hkv]);
    in_graph(&run);
    assert_eq!(score.download(), e_score, "graph replay scores");
    assert_eq!(counts.download(), e_counts, "graph replay counts");
    assert_eq!(idx.download(), e_idx, "graph replay indices");
    assert_eq!(e_counts.iter().map(|&c| c as i64).sum::<i64>(), kk);
    // reference: f64 LaProx default (pool the attention term, sum over the group)
    let a = window_attention(&q, &k, w).data;
    let mut want = vec![0f64; hkv * p];
    for h in 0..hq {
        let col: Vec<f64> = (0..p)
            .map(|i| {
                (0..w)
                    .map(|j| a[(h * w + j) * n + i].powi(2))
                    .sum::<f64>()
                    .sqrt()
            })
            .collect();
        let pooled = ref_pool(&col, KVE_CUDA_POOL_AVG, 7, 1.0);
        for i in 0..p {
            let mut qf = 0f64;
            for r in 0..d {
                for c in 0..d {
                    qf += v.at(h / (hq / hkv), i, r)
                        * gram[(h * d + r) * d + c] as f64
                        * v.at(h / (hq / hkv), i, c);
                }
            }
            want[(h / (hq / hkv)) * p + i] += pooled[i] * qf.max(0.0).sqrt();
        }
    }
    assert_close("laprox pipeline", &e_score, &want, 2e-3);
}
