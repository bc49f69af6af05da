//! `kve_cuda_lava_factor` (cuda/lava.cu): LAVa's per-head value factor.

use super::*;

// ------------------------------------------------------------------- LAVa factor --

/// `max_{i < prefix} ||V[h, i]||_1` per KV head, every dtype and layout (transposed V
/// included); prefix 0 gives zeros; prefix > N and a NULL output are refused.
#[test]
fn lava_factor_matches_reference() {
    let mut rng = device_rng!(2);
    for (dt, layout) in dtype_layouts() {
        for (hkv, n, dv) in [(3, 1000, 72), (2, 30, 12)] {
            let prefix = 1 + rng.below(n);
            let v = Tensor::normal(&mut rng, dt, layout, [hkv, n, dv]);
            // SAFETY: a device view and a device output of `hkv` floats.
            let got = launched(hkv, "lava", |out| unsafe {
                kve_cuda_lava_factor(&v.view(), prefix as i64, out, null_mut())
            });
            let l1 = |h: usize, i: usize| (0..dv).map(|d| v.at(h, i, d).abs()).sum::<f64>();
            let want: Vec<f64> = (0..hkv)
                .map(|h| (0..prefix).map(|i| l1(h, i)).fold(0.0, f64::max))
                .collect();
            assert_close(
                &format!("lava factor {dt:?} {layout:?} n{n}"),
                &got,
                &want,
                1e-5,
            );
        }
    }
    let v = Tensor::normal(&mut rng, Dt::F32, Layout::Transposed, [2, 30, 12]);
    let out = sentinel(2);
    // SAFETY: as above; the refused calls launch nothing.
    unsafe {
        assert_eq!(kve_cuda_lava_factor(&v.view(), 0, out.ptr(), null_mut()), 0);
        assert_eq!(out.download(), vec![0.0, 0.0], "prefix 0");
        out.upload(&[SENTINEL; 2]);
        assert_eq!(
            kve_cuda_lava_factor(&v.view(), 31, out.ptr(), null_mut()),
            INVALID
        );
        assert_eq!(
            kve_cuda_lava_factor(&v.view(), 5, null_mut(), null_mut()),
            INVALID
        );
    }
    assert!(out.download().iter().all(|&v| v == SENTINEL));
}
