//! `kve_cuda_window` (cuda/window.cu): the window-attention column aggregates (mean, l2,
//! cross, group) against the f64 reference, every dtype, layout and group size.

use super::*;

// ------------------------------------------------------------------------- window --

struct WinCase {
    hq: usize,
    hkv: usize,
    n: usize,
    w: usize,
    dk: usize,
}

const fn wc(hq: usize, hkv: usize, n: usize, w: usize, dk: usize) -> WinCase {
    WinCase { hq, hkv, n, w, dk }
}

/// Shapes: GQA groups 1..8, windows 3..45 (and w == n), head dims 8..256, N not a multiple
/// of any tile.
static WIN_CASES: [WinCase; 11] = [
    wc(8, 2, 150, 7, 64),
    wc(4, 4, 70, 3, 40),
    wc(6, 2, 300, 45, 128),
    wc(16, 2, 200, 20, 96),
    wc(4, 1, 129, 9, 200),
    wc(2, 1, 5, 5, 16),
    wc(4, 2, 150, 16, 24),
    wc(6, 2, 300, 40, 64),
    wc(3, 3, 97, 5, 130),
    wc(8, 1, 70, 9, 8),
    wc(2, 1, 33, 32, 256),
];

/// Every (case index, case, dtype index, dtype) of `WIN_CASES` × `DTYPES`, dtypes inner.
fn case_dtypes() -> impl Iterator<Item = (usize, &'static WinCase, usize, Dt)> {
    WIN_CASES.iter().enumerate().flat_map(|(ci, c)| {
        DTYPES
            .into_iter()
            .enumerate()
            .map(move |(di, dt)| (ci, c, di, dt))
    })
}

/// The window inputs of a case: queries `[Hq, w, dk]` head-major, keys `[Hkv, N, dk]` in
/// `layout`, the keys sharing a mean direction (peaked attention).
fn win_inputs(rng: &mut Rng, c: &WinCase, dt: Dt, layout: Layout) -> (Tensor, Tensor) {
    let spread = 1.0 + 3.0 * rng.unif();
    let q = Tensor::new(dt, Layout::HeadMajor, [c.hq, c.w, c.dk], &mut || {
        spread * rng.normal()
    });
    let mean = rng.vec(c.dk, 1.0);
    let mut d = 0;
    let k = Tensor::new(dt, layout, [c.hkv, c.n, c.dk], &mut || {
        d = (d + 1) % c.dk;
        1.5 * rng.normal() + mean[d]
    });
    (q, k)
}

/// kve_cuda_window's four outputs (poisoned first; cross only for groups <= 16), with the
/// workspace filled with 0xFF bytes (NaN) so that no stale pass-1 value can pass.
fn run_window(q: &Tensor, k: &Tensor, w: usize, op: i32, lse: Option<&DBuf<f32>>) -> [Vec<f32>; 4] {
    let (hq, hkv, n) = (q.ext[0], k.ext[0], k.ext[1]);
    let (g, p) = (hq / hkv, n - w);
    let np = g * (g + 1) / 2;
    let outs = [
        poisoned(hq * p),
        poisoned(hq * p),
        poisoned(hkv * np * p),
        poisoned(hkv * p),
    ];
    let cross = if g <= 16 { outs[2].ptr() } else { null_mut() };
    let o = [outs[0].ptr(), outs[1].ptr(), cross, outs[3].ptr()];
    let rc = launch_window(q, k, w, o, op, lse.map_or(null(), |l| l.ptr()), true);
    ck(rc, "kve_cuda_window");
    outs.map(|o| o.download())
}

/// `kve_cuda_window` of `q` and `k` into the outputs `outs` (mean, l2, cross, group; NULL:
/// not asked for), its workspace of the queried size (all 0xFF, NaN as f32, where `nan_ws`).
/// The launcher's status.
fn launch_window(
    q: &Tensor,
    k: &Tensor,
    w: usize,
    outs: [*mut f32; 4],
    op: i32,
    lse: *const f32,
    nan_ws: bool,
) -> i32 {
    let (hq, hkv, n) = (q.ext[0], k.ext[0], k.ext[1]);
    // SAFETY: a pure host function of the sizes.
    let wsb = unsafe { kve_cuda_window_workspace_size(hq as i64, w as i64, n as i64, hkv as i64) };
    let ws = if nan_ws {
        DBuf::from(&vec![0xFFu8; wsb])
    } else {
        DBuf::<u8>::new(wsb)
    };
    let [mean, l2, cross, group] = outs;
    // SAFETY: every pointer is NULL or a device buffer of the size the launcher documents.
    unsafe {
        kve_cuda_window(
            &q.view(),
            &k.view(),
            w as i64,
            mean,
            l2,
            cross,
            group,
            op,
            lse,
            ws.vptr(),
            wsb,
            null_stream(),
        )
    }
}

/// The four outputs against the f64 reference.
fn check_window(tag: &str, got: &[Vec<f32>; 4], want: &[Vec<f64>; 4], g: usize) {
    for (x, name) in ["mean", "l2", "cross", "group"].iter().enumerate() {
        if x == 2 && g > 16 {
            continue;
        }
        assert_close(&format!("{tag} {name}"), &got[x], &want[x], 2e-4);
    }
}

#[test]
fn window_aggregates_match_reference() {
    let mut rng = device_rng!(1);
    for (ci, c, di, dt) in case_dtypes() {
        // K head-major, padded or token-major (llama.cpp rows)
        let layout = LAYOUTS[(ci + di) % 3];
        let (q, k) = win_inputs(&mut rng, c, dt, layout);
        let a = window_attention(&q, &k, c.w);
        let g = c.hq / c.hkv;
        for op in [KVE_CUDA_GQA_MEAN, KVE_CUDA_GQA_MAX, KVE_CUDA_GQA_SUM] {
            let got = run_window(&q, &k, c.w, op, None);
            let tag = format!(
                "window hq{} hkv{} w{} n{} dk{} {dt:?} K {layout:?} op{op}",
                c.hq, c.hkv, c.w, c.n, c.dk
            );
            check_window(&tag, &got, &ref_window_of(&a, c.hkv, op), g);
        }
    }
}

/// kve_cuda_window with the caller's row log-sum-exp (row_lse: the f64 reference's,
/// rounded to f32) gives the reference's aggregates and the two-pass path's; the
/// workspace holds NaN, so nothing of pass 1 is used.
/// Each output of `kve_cuda_window` requested alone (pass 2 then computes only the
/// statistics it needs: the column sums for mean / group, the products for l2 / cross)
/// equals, bit for bit, the same output of a call that requests all four.
#[test]
fn window_single_outputs_equal_all_outputs() {
    let mut rng = device_rng!(35);
    for (c, dt) in [
        (wc(8, 2, 300, 8, 64), Dt::Bf16),
        (wc(6, 3, 150, 12, 40), Dt::F32),
    ] {
        let (q, k) = win_inputs(&mut rng, &c, dt, Layout::HeadMajor);
        let (g, p) = (c.hq / c.hkv, c.n - c.w);
        let sizes = [c.hq * p, c.hq * p, c.hkv * g * (g + 1) / 2 * p, c.hkv * p];
        for op in [KVE_CUDA_GQA_MEAN, KVE_CUDA_GQA_MAX] {
            let all = run_window(&q, &k, c.w, op, None);
            for which in 0..4 {
                let out = poisoned(sizes[which]);
                let o = |i: usize| if i == which { out.ptr() } else { null_mut() };
                let rc = launch_window(&q, &k, c.w, [o(0), o(1), o(2), o(3)], op, null(), false);
                ck(rc, "kve_cuda_window, one output");
                let got = out.download();
                let same = got
                    .iter()
                    .zip(&all[which])
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{dt:?} g {g} op {op}: output {which} alone differs");
            }
        }
    }
}

/// Groups too large for one window position's g rows in shared memory: the launcher
/// splits each position's heads over chunks (sm_86/89's 99 KiB from g ~ 24 with f32 and
/// dk 256; f32 dk 256 g 128 even on sm_80 and sm_90), and mean, l2 and group still match
/// the f64 reference. Where even a split does not fit (f32 dk 256 g 128 under 152,832 B)
/// the launch is refused with nothing written.
#[test]
fn window_large_groups_split_heads_over_chunks() {
    let mut rng = device_rng!(36);
    for (c, dt) in [
        (wc(128, 1, 70, 3, 256), Dt::F32),
        (wc(96, 1, 80, 2, 120), Dt::F32),
        (wc(48, 2, 75, 4, 256), Dt::F32),
        (wc(96, 1, 70, 3, 256), Dt::Bf16),
        (wc(128, 1, 66, 2, 128), Dt::F16),
    ] {
        let (q, k) = win_inputs(&mut rng, &c, dt, Layout::HeadMajor);
        let g = c.hq / c.hkv;
        let p = c.n - c.w;
        let op = KVE_CUDA_GQA_MAX;
        let tag = format!("window hq{} hkv{} dk{} {dt:?}", c.hq, c.hkv, c.dk);
        // f32, dk 256, g 128: the smallest chunk (16 heads) needs 152,832 B in pass 2
        // (the K tile and the 256 accumulator rows alone are 131,328): refused on
        // sm_86/89, split on sm_80 (163 KiB) and sm_90
        if dt == Dt::F32 && c.dk == 256 && g == 128 && smem_optin() < 152_832 {
            let outs = [sentinel(c.hq * p), sentinel(c.hq * p), sentinel(c.hkv * p)];
            let o = [outs[0].ptr(), outs[1].ptr(), null_mut(), outs[2].ptr()];
            let rc = launch_window(&q, &k, c.w, o, op, null(), false);
            assert_eq!(rc, 1, "{tag}: refused (cudaErrorInvalidValue)");
            for o in &outs {
                assert_sentinel(&tag, o);
            }
            println!("{tag}: refused under {} B of shared memory", smem_optin());
            continue;
        }
        let got = run_window(&q, &k, c.w, op, None);
        check_window(&tag, &got, &ref_window(&q, &k, c.w, op), g);
    }
}

#[test]
fn window_row_lse_matches_computed_path() {
    let mut rng = device_rng!(10);
    for (ci, c, di, dt) in case_dtypes() {
        let layout = LAYOUTS[(ci + 2 * di + 1) % 3];
        let (q, k) = win_inputs(&mut rng, c, dt, layout);
        let lse: Vec<f32> = ref_row_lse(&q, &k, c.w).iter().map(|&x| x as f32).collect();
        let lsed = DBuf::from(&lse);
        let op = rng.below(3) as i32;
        let two_pass = run_window(&q, &k, c.w, op, None);
        let one_pass = run_window(&q, &k, c.w, op, Some(&lsed));
        let want = ref_window(&q, &k, c.w, op);
        let tag = format!(
            "window row_lse hq{} hkv{} w{} n{} dk{} {dt:?} K {layout:?} op{op}",
            c.hq, c.hkv, c.w, c.n, c.dk
        );
        let g = c.hq / c.hkv;
        check_window(&tag, &one_pass, &want, g);
        for x in 0..4 {
            let t: Vec<f64> = two_pass[x].iter().map(|&v| v as f64).collect();
            assert_close(
                &format!("{tag} output {x} vs two-pass"),
                &one_pass[x],
                &t,
                2e-4,
            );
        }
    }
}

/// Refused arguments (window length, w > n, op, workspace, dtype, reserved, stride, group,
/// dk > 256, cross with g > 16, NULL workspace) return 1 and write nothing; nothing to do
/// (P = 0, or no outputs) succeeds without a workspace.
#[test]
fn window_nothing_to_do_and_rejections() {
    let mut rng = device_rng!(9);
    let c = wc(4, 2, 40, 8, 16);
    let (q, k) = win_inputs(&mut rng, &c, Dt::F32, Layout::HeadMajor);
    let (qd, kd) = (q.view(), k.view());
    let p = c.n - c.w;
    // SAFETY: a pure host function of the sizes.
    let wsz = unsafe { kve_cuda_window_workspace_size(4, 8, 40, 2) };
    let ws = DBuf::<u8>::new(wsz);
    let mean = sentinel(c.hq * p);
    let cross = sentinel(17 * 18 / 2 * 7);
    let call = |q: &KveCudaView,
                k: &KveCudaView,
                w: i64,
                cr: *mut f32,
                op: i32,
                ws: *mut u8,
                wsb: usize| {
        // SAFETY: device buffers of the documented sizes, or refused before any launch.
        unsafe {
            kve_cuda_window(
                q,
                k,
                w,
                mean.ptr(),
                null_mut(),
                cr,
                null_mut(),
                op,
                null(),
                ws as *mut _,
                wsb,
                null_stream(),
            )
        }
    };
    let w = c.w as i64;
    let wp = ws.ptr();
    let mut q16 = qd;
    q16.dtype = KVE_CUDA_F16;
    let mut bad_dt = qd;
    bad_dt.dtype = 7;
    let mut bad_res = qd;
    bad_res.reserved = 1;
    let mut bad_st = kd;
    bad_st.stride_token = -1;
    // hq % hkv != 0; dk > 256; a group of 17 with cross terms
    let kbuf = DBuf::<f32>::from(&vec![0.0; 2 * 300 * 4]);
    let f32v = |heads: i64, tokens: i64, dim: i64| KveCudaView {
        data: kbuf.vptr(),
        dtype: KVE_CUDA_F32,
        reserved: 0,
        stride_head: tokens * dim,
        stride_token: dim,
        stride_dim: 1,
        heads,
        tokens,
        dim,
    };
    let cases: [(KveCudaView, KveCudaView, i64, *mut f32, i32, usize, &str); 11] = [
        (qd, kd, w - 1, null_mut(), 0, wsz, "window length"),
        (qd, kd, c.n as i64 + 1, null_mut(), 0, wsz, "w > n"),
        (qd, kd, w, null_mut(), 3, wsz, "op"),
        (qd, kd, w, null_mut(), 0, wsz - 1, "short workspace"),
        (q16, kd, w, null_mut(), 0, wsz, "dtypes differ"),
        (bad_dt, kd, w, null_mut(), 0, wsz, "dtype 7"),
        (bad_res, kd, w, null_mut(), 0, wsz, "reserved"),
        (qd, bad_st, w, null_mut(), 0, wsz, "negative stride"),
        (
            f32v(4, 2, 16),
            f32v(3, 10, 16),
            2,
            null_mut(),
            0,
            wsz,
            "hq % hkv",
        ),
        (
            f32v(1, 1, 300),
            f32v(1, 4, 300),
            1,
            null_mut(),
            0,
            wsz,
            "dk > 256",
        ),
        (
            f32v(17, 1, 4),
            f32v(1, 8, 4),
            1,
            cross.ptr(),
            0,
            wsz,
            "cross, g > 16",
        ),
    ];
    for (qv, kv, w_, cr, op, wsb, what) in cases {
        assert_eq!(call(&qv, &kv, w_, cr, op, wp, wsb), INVALID, "{what}");
    }
    // a NULL workspace with work to do
    assert_eq!(
        call(&qd, &kd, w, null_mut(), 0, null_mut(), wsz),
        INVALID,
        "NULL workspace"
    );
    assert!(
        mean.download().iter().all(|&v| v == SENTINEL),
        "mean written"
    );
    assert!(
        cross.download().iter().all(|&v| v == SENTINEL),
        "cross written"
    );
    // P == 0, and no outputs: success, nothing written, no workspace needed
    let (q8, k8) = (f32v(4, 8, 16), f32v(2, 8, 16));
    assert_eq!(call(&q8, &k8, 8, null_mut(), 0, null_mut(), 0), 0, "P = 0");
    // SAFETY: device tensors of their extents; no outputs: nothing is written.
    let rc = unsafe { window_without_outputs(&qd, &kd, w) };
    assert_eq!(rc, 0, "no outputs");
    assert!(
        mean.download().iter().all(|&v| v == SENTINEL),
        "mean written"
    );
}
