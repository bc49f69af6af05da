//! Launch contract of every launcher (cuda/kvevict_cuda.h): the device count, and invalid
//! arguments refused (status 1) before anything is enqueued, nothing written.

use super::*;

// ------------------------------------------------------------------- devices --

/// The kernels report the runtime's device count (0 without a device); the test double
/// is one device and ignores a NULL count.
#[test]
fn device_count_reports() {
    let mut n = -1;
    // SAFETY: an out-pointer to a local.
    let rc = unsafe { kve_cuda_device_count(&mut n) };
    if rc != 0 || n == 0 {
        assert_eq!(n, 0);
        conformance::no_device(&format!("status {rc}"));
        return;
    }
    assert!(n > 0);
}

// ---------------------------------------------------------------- refusals --

#[test]
fn invalid_arguments_are_rejected_before_launch() {
    // Argument checks run on the host and need no device: every call below returns 1 before touching any pointer (the "device
    // pointers" 16 and 32 are never dereferenced).
    let bad = KveCudaView {
        data: null_mut(),
        dtype: 7,
        reserved: 0,
        stride_head: 0,
        stride_token: 0,
        stride_dim: 1,
        heads: 1,
        tokens: 1,
        dim: 1,
    };
    assert_eq!(unsafe { window_without_outputs(&bad, &bad, 1) }, 1);
    let rc = unsafe { kve_cuda_pool(null(), 4, null_mut(), 4, 1, 4, 0, 4, 1.0, null_mut()) };
    assert_eq!(rc, 1, "even avg kernel");
    // the changed and new launchers (all checks before any CUDA call)
    let f = 16 as *mut f32; // never dereferenced: every call below is rejected
    let i = 16 as *mut i32;
    let dummy = i as *mut i64;
    let ok_view = KveCudaView {
        data: 16 as *mut c_void,
        dtype: KVE_CUDA_F16,
        ..bad
    };
    unsafe {
        let hr =
            |ld_a: i64, b: *const f32, ld_b: i64, bm: i32, out: *mut f32, ld_o: i64, hkv: i64| {
                kve_cuda_head_reduce(
                    f,
                    ld_a,
                    b,
                    ld_b,
                    bm,
                    null(),
                    out,
                    ld_o,
                    4,
                    hkv,
                    8,
                    0,
                    null_mut(),
                )
            };
        assert_eq!(hr(7, f, 8, 1, f.add(64), 8, 2), 1, "head_reduce ld_a < n");
        assert_eq!(hr(8, f, 7, 1, f.add(64), 8, 2), 1, "head_reduce ld_b < n");
        assert_eq!(
            hr(8, null(), 8, 2, f.add(64), 8, 2),
            1,
            "head_reduce b NULL"
        );
        assert_eq!(
            hr(8, null(), 0, 0, f.add(64), 7, 2),
            1,
            "head_reduce ld_out < n"
        );
        assert_eq!(
            hr(8, null(), 0, 0, f, 8, 2),
            1,
            "head_reduce out == a with g > 1"
        );
        assert_eq!(
            hr(8, null(), 0, 0, f, 9, 4),
            1,
            "head_reduce out == a, other ld"
        );
        let lx = |c: *const f32, ldc: i64, q: *const f32, ldq: i64, ldo: i64, mode: i32| {
            kve_cuda_laprox_exact(c, ldc, q, ldq, f, ldo, 2, 2, 8, mode, null_mut())
        };
        assert_eq!(lx(f, 8, f, 8, 8, 4), 1, "laprox_exact mode 4");
        assert_eq!(lx(f, 8, f, 8, 8, -1), 1, "laprox_exact mode -1");
        assert_eq!(
            lx(null(), 8, f, 8, 8, 2),
            1,
            "laprox_exact mode 2 without cross"
        );
        assert_eq!(
            lx(f, 8, null(), 8, 8, 3),
            1,
            "laprox_exact mode 3 without qv"
        );
        assert_eq!(
            lx(f, 8, null(), 8, 8, 1),
            1,
            "laprox_exact mode 1 without qv"
        );
        assert_eq!(lx(f, 7, f, 8, 8, 0), 1, "laprox_exact ld_cross < n");
        assert_eq!(lx(f, 8, f, 7, 8, 0), 1, "laprox_exact ld_qv < n");
        assert_eq!(lx(f, 8, f, 8, 7, 0), 1, "laprox_exact ld_out < n");
        assert_eq!(
            kve_cuda_knorm(&bad, 1, f, 1, null_mut()),
            1,
            "knorm bad dtype"
        );
        assert_eq!(
            kve_cuda_knorm(&ok_view, 2, f, 2, null_mut()),
            1,
            "knorm prefix > tokens"
        );
        assert_eq!(
            kve_cuda_knorm(&ok_view, 1, f, 0, null_mut()),
            1,
            "knorm ld_out < prefix"
        );
        assert_eq!(
            kve_cuda_knorm(&ok_view, 1, null_mut(), 1, null_mut()),
            1,
            "knorm out NULL"
        );
        assert_eq!(
            kve_cuda_sink_scores(f, 2, 8, 7, 4, null_mut()),
            1,
            "sinks ld < n"
        );
        assert_eq!(
            kve_cuda_sink_scores(f, -1, 8, 8, 4, null_mut()),
            1,
            "sinks rows < 0"
        );
        let cc = |ld_b: i64, out: *mut f32, ld_o: i64, idx: *const i32| {
            kve_cuda_critical_combine(
                f,
                ld_b,
                f.add(64),
                8,
                i,
                idx,
                8,
                2,
                8,
                out,
                ld_o,
                null_mut(),
            )
        };
        assert_eq!(
            cc(8, f, 9, i),
            1,
            "critical_combine in place with another ld"
        );
        assert_eq!(cc(7, f.add(128), 8, i), 1, "critical_combine ld_base < n");
        assert_eq!(cc(8, f.add(128), 8, null()), 1, "critical_combine idx NULL");
        assert_eq!(
            cc(8, f.add(64), 8, i),
            1,
            "critical_combine out == value_l1"
        );
        let lb = |mode: i32, w: *const f64, layers: i64, per: i64, beta: u32, alpha: f32| {
            kve_cuda_layer_budgets(
                mode,
                w,
                layers,
                per,
                10,
                5,
                beta,
                alpha,
                dummy,
                null_mut(),
                null_mut(),
            )
        };
        let wts = 16 as *const f64;
        assert_eq!(lb(4, wts, 2, 2, 20, 0.2), 1, "layer_budgets mode 4");
        assert_eq!(lb(1, wts, 2, 2, 0, 0.2), 1, "layer_budgets pyramid beta 0");
        assert_eq!(lb(2, wts, 2, 2, 20, 1.5), 1, "layer_budgets alpha > 1");
        assert_eq!(lb(3, wts, 2, 2, 20, f32::NAN), 1, "layer_budgets alpha NaN");
        assert_eq!(
            lb(3, null(), 2, 2, 20, 0.2),
            1,
            "layer_budgets lava without weights"
        );
        assert_eq!(lb(0, wts, 2, 0, 20, 0.2), 1, "layer_budgets per_layer 0");
        assert_eq!(lb(0, wts, -1, 2, 20, 0.2), 1, "layer_budgets layers < 0");
        assert_eq!(
            kve_cuda_layer_budgets(
                0,
                null(),
                4,
                1 << 30,
                1 << 30,
                5,
                20,
                0.2,
                dummy,
                null_mut(),
                null_mut()
            ),
            1,
            "layer_budgets layers·per_layer·p >= 2^62"
        );
        assert_eq!(
            kve_cuda_layer_budgets(
                0,
                null(),
                2,
                2,
                10,
                5,
                20,
                0.2,
                null_mut(),
                null_mut(),
                null_mut()
            ),
            1,
            "layer_budgets k_layer NULL"
        );
        assert_eq!(
            kve_cuda_mark_forced(f, 8, -1, i, i, 8, null_mut()),
            1,
            "mark_forced rows < 0"
        );
        assert_eq!(
            kve_cuda_mark_forced(f, 8, 2, null(), i, 8, null_mut()),
            1,
            "mark_forced counts NULL"
        );
        assert_eq!(
            kve_cuda_broadcast_lists(i, i.add(8), 8, 2, 2, i, i.add(64), 8, null_mut()),
            1,
            "broadcast_lists counts over the source"
        );
        assert_eq!(
            kve_cuda_broadcast_lists(i, i.add(8), 8, 2, -1, i.add(32), i.add(64), 8, null_mut()),
            1,
            "broadcast_lists reps < 0"
        );
        // dst NULL with rows to copy: refused before cu_seqlens is written (no launch,
        // so the answer is 1 even without a device)
        let src = KveCudaView {
            stride_head: 4,
            stride_token: 1,
            heads: 2,
            tokens: 4,
            ..ok_view
        };
        assert_eq!(
            kve_cuda_compact_varlen(&src, i, 0, i.add(8), null_mut(), i.add(16), null_mut()),
            1,
            "compact_varlen dst NULL"
        );
    }
}
