use super::*;

// ------------------------------------------------------------------- one shape check

/// Dimensions at and past every limit: the host and device size queries build the same
/// checked shape (`LayerShape::from_dims`, `ModelShape::new`), so they answer the same
/// status for each. They used to disagree (N > 2^31 was OVERFLOW on the host and
/// INVALID_ARGUMENT on the device; 0 heads, dk > 1024).
#[test]
fn host_and_device_size_queries_agree_on_bad_shapes() {
    let edges = [0u64, 1, 3, 1 << 20, (1 << 20) + 1, (1 << 31) - 1, 1 << 31];
    let edges = [&edges[..], &[(1 << 31) + 1, 1 << 32, u64::MAX]].concat();
    let sp = select_params(AllocatorKind::Ada, Granularity::Head, 8);
    let (mut checked, mut refused) = (0, 0);
    for &layers in &edges {
        for &hkv in &edges {
            for &n in &edges {
                // two prefix tokens: valid shapes need small workspaces on both sides
                let w = n.saturating_sub(2);
                let (mut a, mut b) = (0u64, 0u64);
                let (host, device) = unsafe {
                    (
                        kve_select_workspace_size(&sp, layers, hkv, n, w, &mut a),
                        kve_cuda_select_model_workspace_size(&sp, layers, hkv, n, w, &mut b),
                    )
                };
                assert_eq!(host, device, "select layers {layers} hkv {hkv} n {n}");
                let (mut o, mut i) = (0u64, 0u64);
                let lens = unsafe { kve_select_output_len(&sp, layers, hkv, n, w, &mut o, &mut i) };
                assert_eq!(
                    lens, host,
                    "output lengths, layers {layers} hkv {hkv} n {n}"
                );
                checked += 1;
                refused += (host != KVE_OK) as usize;
            }
        }
    }
    let heads = [0u64, 1, 2, 3, 65536, 65537, 1 << 32];
    let tokens = [0u64, 1, 1 << 31, (1 << 31) + 1, u64::MAX];
    let dims = [0u64, 1, 1024, 1025, u64::MAX];
    for preset in [Preset::SnapKv, Preset::LaProx, Preset::KNorm] {
        let p = score_params(|_| {}, preset);
        for &hq in &heads {
            for &hkv in &heads {
                for &n in &tokens {
                    for &dk in &dims {
                        for &dv in &dims {
                            let (mut a, mut b) = (0u64, 0u64);
                            let (host, device) = unsafe {
                                (
                                    kve_score_workspace_size(&p, hq, hkv, n, dk, dv, &mut a),
                                    kve_cuda_score_workspace_size(&p, hq, hkv, n, dk, dv, &mut b),
                                )
                            };
                            assert_eq!(
                                host, device,
                                "{preset:?} hq {hq} hkv {hkv} n {n} dk {dk} dv {dv}"
                            );
                            checked += 1;
                            refused += (host != KVE_OK) as usize;
                        }
                    }
                }
            }
        }
    }
    // a null out-parameter is refused first by both
    unsafe {
        assert_eq!(
            kve_cuda_select_model_workspace_size(&sp, 0, 0, 0, 0, null_mut()),
            kve_select_workspace_size(&sp, 0, 0, 0, 0, null_mut())
        );
    }
    println!("shape grid: {checked} shapes, {refused} refused, host == device for each");
    assert!(refused > checked / 2 && refused < checked);
}
