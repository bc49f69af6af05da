//! `kve_cuda_pool` (cuda/pool.cu): average, max and forward pooling of score rows.

use super::*;

// -------------------------------------------------------------------------- pool --

/// Every pooling mode (odd avg / max kernels, forward with decay, kernel 1) on rows read
/// and written at row strides (the gaps stay as they were). Even avg / max kernels, kernel 0, a bad mode, `ld < n` and NULL are
/// refused, nothing written.
#[test]
fn pool_matches_reference() {
    let mut rng = device_rng!(4);
    for (rows, n, ld_in, ld_out) in [(5, 777, 780, 777), (3, 57, 60, 64)] {
        let x: Vec<f32> = (0..rows * ld_in).map(|_| 2.0 * rng.unif() - 1.0).collect();
        let xd = DBuf::from(&x);
        for (mode, p) in [
            (KVE_CUDA_POOL_AVG, Pool::avg(7)),
            (KVE_CUDA_POOL_AVG, Pool::avg(5)),
            (KVE_CUDA_POOL_AVG, Pool::avg(1)),
            (KVE_CUDA_POOL_MAX, Pool::max(5)),
            (KVE_CUDA_POOL_MAX, Pool::max(7)),
            (KVE_CUDA_POOL_FORWARD, Pool::forward(8, 0.9)),
            (KVE_CUDA_POOL_FORWARD, Pool::forward(1, 0.5)),
        ] {
            // SAFETY: device rows of the given strides.
            let got = written(&sentinel(rows * ld_out), "pool", |out| unsafe {
                kve_cuda_pool(
                    xd.ptr(),
                    ld_in as i64,
                    out,
                    ld_out as i64,
                    rows as i64,
                    n as i64,
                    mode,
                    p.kernel as i32,
                    p.decay,
                    null_stream(),
                )
            });
            let tag = format!("pool {:?} k{} rows {rows} n {n}", p.kind, p.kernel);
            let mut vals = Vec::new();
            let mut want = Vec::new();
            for r in 0..rows {
                let row = &x[r * ld_in..r * ld_in + n];
                let row64: Vec<f64> = row.iter().map(|&v| v as f64).collect();
                want.extend(reference::pool(&p, &row64));
                vals.extend_from_slice(&got[r * ld_out..r * ld_out + n]);
                let gap = &got[r * ld_out + n..(r + 1) * ld_out];
                assert!(
                    gap.iter().all(|&v| v == SENTINEL),
                    "{tag}: gap of row {r} written"
                );
            }
            assert_close(&tag, &vals, &want, 1e-5);
        }
        // refused: even avg / max kernels, k = 0, a bad mode, ld_in < n, NULL input
        let out = sentinel(rows * ld_out);
        for (mode, k, ldi, src) in [
            (0, 4, ld_in, xd.ptr() as *const f32),
            (1, 2, ld_in, xd.ptr()),
            (2, 0, ld_in, xd.ptr()),
            (3, 3, ld_in, xd.ptr()),
            (0, 3, n - 1, xd.ptr()),
            (0, 3, ld_in, null()),
        ] {
            // SAFETY: refused before any launch.
            let rc = unsafe {
                kve_cuda_pool(
                    src,
                    ldi as i64,
                    out.ptr(),
                    ld_out as i64,
                    rows as i64,
                    n as i64,
                    mode,
                    k,
                    1.0,
                    null_stream(),
                )
            };
            assert_eq!(rc, INVALID, "mode {mode} k {k} ld {ldi}");
        }
        assert!(
            out.download().iter().all(|&v| v == SENTINEL),
            "refused pool wrote"
        );
    }
}
