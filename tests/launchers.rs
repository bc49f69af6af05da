#![cfg(any(feature = "cuda-mock", feature = "cuda"))]
//! One conformance suite for the CUDA launchers (`cuda/kvevict_cuda.h`): the same cases run
//! on the test double (feature `cuda-mock`, `src/cuda/mock.rs`) and on the kernels (feature
//! `cuda`; without a device each test prints "skipped: no CUDA device" and passes). Each
//! launcher is checked against one f64 reference (tests/reference, or a few lines here
//! built from its primitives) within the kernels' tolerance; the mock, which runs the
//! core's f32 arithmetic, is in addition held to the core bit for bit and to an
//! elementwise bound. Outputs start poisoned (NaN) or canary-filled, so an element not
//! written shows; refused arguments return 1 and leave every output as it was.
//! Each launcher's edges (ties, NaN, empty and in-place calls, refusals) are here too,
//! and the uniqueness scorer against the host scorer.
//!
//! Helpers (device buffers, data, dtypes, layouts, tolerances): `tests/conformance`.
//! Seeds: `KVEVICT_TEST_SEED` (default 1).
#![allow(clippy::needless_range_loop)]

mod reference;
#[macro_use]
mod conformance;

use conformance::*;
use half::{bf16, f16};
use kvevict::cuda::*;
use kvevict::{GqaReduce, Pool, View};
use std::ffi::c_void;
use std::ptr::{null, null_mut};

// ------------------------------------------------------------------- devices --

/// The kernels report the runtime's device count (0 without a device); the test double
/// is one device and ignores a NULL count.
#[test]
fn device_count_reports() {
    let mut n = -1;
    // SAFETY: an out-pointer to a local.
    let rc = unsafe { kve_cuda_device_count(&mut n) };
    if MOCK {
        assert_eq!((rc, n), (0, 1));
        // SAFETY: NULL is documented as accepted.
        assert_eq!(unsafe { kve_cuda_device_count(null_mut()) }, 0);
        return;
    }
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
    // Argument checks run on the host and need no device: on the kernels and the mock
    // alike, every call below returns 1 before touching any pointer (the "device
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
    let rc = unsafe {
        kve_cuda_window(
            &bad,
            &bad,
            1,
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut(),
            0,
            null(),
            null_mut(),
            0,
            null_mut(),
        )
    };
    assert_eq!(rc, 1);
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
const WIN_CASES: [WinCase; 11] = [
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
    // SAFETY: a pure host function of the sizes.
    let wsb = unsafe { kve_cuda_window_workspace_size(hq as i64, w as i64, n as i64, hkv as i64) };
    let ws = DBuf::from(&vec![0xFFu8; wsb]);
    // SAFETY: every pointer is a device buffer of the size the launcher documents.
    let rc = unsafe {
        kve_cuda_window(
            &q.view(),
            &k.view(),
            w as i64,
            outs[0].ptr(),
            outs[1].ptr(),
            if g <= 16 { outs[2].ptr() } else { null_mut() },
            outs[3].ptr(),
            op,
            lse.map_or(null(), |l| l.ptr()),
            ws.vptr(),
            wsb,
            null_stream(),
        )
    };
    ck(rc, "kve_cuda_window");
    outs.map(|o| o.download())
}

/// Host copies of a tensor's stored elements in its dtype, to give the core the very
/// bytes the launcher read.
enum Host {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

impl Host {
    fn of(t: &Tensor) -> Host {
        match t.dt {
            Dt::F32 => Host::F32(t.flat.clone()),
            Dt::F16 => Host::F16(t.flat.iter().map(|&x| f16::from_f32(x)).collect()),
            Dt::Bf16 => Host::Bf16(t.flat.iter().map(|&x| bf16::from_f32(x)).collect()),
        }
    }
    fn view(&self, t: &Tensor) -> View<'_> {
        match self {
            Host::F32(v) => View::f32(v, t.ext, t.st),
            Host::F16(v) => View::f16(v, t.ext, t.st),
            Host::Bf16(v) => View::bf16(v, t.ext, t.st),
        }
        .expect("core view")
    }
}

/// SnapKV through the core's `score_layer` (no pooling): its `[Hkv][P]` group reduction.
fn core_snapkv(q: &Tensor, k: &Tensor, w: usize, gqa: GqaReduce, lse: Option<&[f32]>) -> Vec<f32> {
    use kvevict::*;
    let (hq_, hk_) = (Host::of(q), Host::of(k));
    let mut cfg = ScoreConfig::preset(Preset::SnapKv);
    cfg.window = w as u32;
    cfg.pool = Pool::NONE;
    cfg.gqa = gqa;
    let inputs = LayerInputs {
        queries: Some(hq_.view(q)),
        keys: Some(hk_.view(k)),
        row_lse: lse,
        ..Default::default()
    };
    let shape = layer_shape(&cfg, &inputs).unwrap();
    let mut out = vec![0f32; score_len(&cfg, &shape).unwrap()];
    let mut ws = vec![0u8; score_workspace_size(&cfg, &shape).unwrap()];
    score_layer(&cfg, &inputs, &mut out, &mut ws).unwrap();
    out
}

/// The four outputs against the f64 reference (and, on the mock, elementwise).
fn check_window(tag: &str, got: &[Vec<f32>; 4], want: &[Vec<f64>; 4], g: usize) {
    for (x, name) in ["mean", "l2", "cross", "group"].iter().enumerate() {
        if x == 2 && g > 16 {
            continue;
        }
        assert_close(&format!("{tag} {name}"), &got[x], &want[x], 2e-4);
        if MOCK && x < 3 {
            let (rel, abs) = if x == 2 { (5e-5, 1e-12) } else { (2e-5, 1e-9) };
            assert_each_close(&format!("{tag} {name}"), &got[x], &want[x], rel, abs);
        }
    }
}

#[test]
fn window_aggregates_match_reference() {
    need_device!();
    let mut rng = Rng::new(1);
    for (ci, c) in WIN_CASES.iter().enumerate() {
        for (di, dt) in DTYPES.into_iter().enumerate() {
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
                if MOCK {
                    // the core's own passes: bit-identical SnapKV scores
                    assert_eq!(got[3], core_snapkv(&q, &k, c.w, gqa_of(op), None), "{tag}");
                }
            }
        }
    }
}

/// kve_cuda_window with the caller's row log-sum-exp (row_lse: the f64 reference's,
/// rounded to f32) gives the reference's aggregates and the two-pass path's; the
/// workspace holds NaN, so nothing of pass 1 is used. The mock equals the core's
/// one-pass path bit for bit.
/// Each output of `kve_cuda_window` requested alone (pass 2 then computes only the
/// statistics it needs: the column sums for mean / group, the products for l2 / cross)
/// equals, bit for bit, the same output of a call that requests all four.
#[test]
fn window_single_outputs_equal_all_outputs() {
    need_device!();
    let mut rng = Rng::new(35);
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
                // SAFETY: a pure host function of the sizes.
                let wsb = unsafe {
                    kve_cuda_window_workspace_size(
                        c.hq as i64,
                        c.w as i64,
                        c.n as i64,
                        c.hkv as i64,
                    )
                };
                let ws = DBuf::<u8>::new(wsb);
                // SAFETY: device buffers of the documented sizes.
                let rc = unsafe {
                    kve_cuda_window(
                        &q.view(),
                        &k.view(),
                        c.w as i64,
                        o(0),
                        o(1),
                        o(2),
                        o(3),
                        op,
                        null(),
                        ws.vptr(),
                        wsb,
                        null_stream(),
                    )
                };
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
    need_device!();
    let mut rng = Rng::new(36);
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
            // SAFETY: a pure host function of the sizes.
            let wsb = unsafe {
                kve_cuda_window_workspace_size(c.hq as i64, c.w as i64, c.n as i64, c.hkv as i64)
            };
            let ws = DBuf::<u8>::new(wsb);
            // SAFETY: device buffers of the documented sizes.
            let rc = unsafe {
                kve_cuda_window(
                    &q.view(),
                    &k.view(),
                    c.w as i64,
                    outs[0].ptr(),
                    outs[1].ptr(),
                    null_mut(),
                    outs[2].ptr(),
                    op,
                    null(),
                    ws.vptr(),
                    wsb,
                    null_stream(),
                )
            };
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
    need_device!();
    let mut rng = Rng::new(10);
    for (ci, c) in WIN_CASES.iter().enumerate() {
        for (di, dt) in DTYPES.into_iter().enumerate() {
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
            if MOCK {
                let core = core_snapkv(&q, &k, c.w, gqa_of(op), Some(&lse));
                assert_eq!(one_pass[3], core, "{tag}: the core's one-pass path");
            }
        }
    }
}

/// Refused arguments (window length, w > n, op, workspace, dtype, reserved, stride, group,
/// dk > 256, cross with g > 16, NULL workspace) return 1 and write nothing; nothing to do
/// (P = 0, or no outputs) succeeds without a workspace.
#[test]
fn window_nothing_to_do_and_rejections() {
    need_device!();
    let mut rng = Rng::new(9);
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
    // SAFETY: no outputs: nothing is read or written.
    let rc = unsafe {
        kve_cuda_window(
            &qd,
            &kd,
            w,
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut(),
            0,
            null(),
            null_mut(),
            0,
            null_stream(),
        )
    };
    assert_eq!(rc, 0, "no outputs");
    assert!(
        mean.download().iter().all(|&v| v == SENTINEL),
        "mean written"
    );
}

// ------------------------------------------------------------------- LAVa factor --

/// `max_{i < prefix} ||V[h, i]||_1` per KV head, every dtype and layout (transposed V
/// included); prefix 0 gives zeros; prefix > N and a NULL output are refused.
#[test]
fn lava_factor_matches_reference() {
    need_device!();
    let mut rng = Rng::new(2);
    for dt in DTYPES {
        for layout in LAYOUTS {
            for (hkv, n, dv) in [(3, 1000, 72), (2, 30, 12)] {
                let prefix = 1 + rng.below(n);
                let v = Tensor::new(dt, layout, [hkv, n, dv], &mut || rng.normal());
                let out = poisoned(hkv);
                // SAFETY: a device view and a device output of `hkv` floats.
                ck(
                    unsafe {
                        kve_cuda_lava_factor(&v.view(), prefix as i64, out.ptr(), null_mut())
                    },
                    "lava",
                );
                let l1 = |h: usize, i: usize| (0..dv).map(|d| v.at(h, i, d).abs()).sum::<f64>();
                let want: Vec<f64> = (0..hkv)
                    .map(|h| (0..prefix).map(|i| l1(h, i)).fold(0.0, f64::max))
                    .collect();
                let got = out.download();
                assert_close(
                    &format!("lava factor {dt:?} {layout:?} n{n}"),
                    &got,
                    &want,
                    1e-5,
                );
                if MOCK {
                    // the core's sequential f32 sums
                    for h in 0..hkv {
                        let s = |i: usize| {
                            let row = &v.vals[(h * n + i) * dv..(h * n + i + 1) * dv];
                            row.iter().map(|x| x.abs()).sum::<f32>()
                        };
                        let exact = (0..prefix).map(s).fold(0f32, f32::max);
                        assert_eq!(got[h], exact, "lava factor {dt:?} {layout:?} head {h}");
                    }
                }
            }
        }
    }
    let v = Tensor::new(Dt::F32, Layout::Transposed, [2, 30, 12], &mut || {
        rng.normal()
    });
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

// -------------------------------------------------------------------------- pool --

/// Every pooling mode (odd avg / max kernels, forward with decay, kernel 1) on rows read
/// and written at row strides (the gaps stay as they were); on the mock bit for bit the
/// core's `pool`. Even avg / max kernels, kernel 0, a bad mode, `ld < n` and NULL are
/// refused, nothing written.
#[test]
fn pool_matches_reference() {
    need_device!();
    let mut rng = Rng::new(4);
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
            let out = sentinel(rows * ld_out);
            // SAFETY: device rows of the given strides.
            ck(
                unsafe {
                    kve_cuda_pool(
                        xd.ptr(),
                        ld_in as i64,
                        out.ptr(),
                        ld_out as i64,
                        rows as i64,
                        n as i64,
                        mode,
                        p.kernel as i32,
                        p.decay,
                        null_stream(),
                    )
                },
                "pool",
            );
            let got = out.download();
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
                if MOCK {
                    let mut core = vec![0f32; n];
                    kvevict::pool::pool(&p, row, &mut core);
                    assert_eq!(&got[r * ld_out..r * ld_out + n], &core[..], "{tag} row {r}");
                }
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

// ------------------------------------------------ KNorm, sinks, CriticalKV --

#[test]
fn knorm_matches_reference() {
    need_device!();
    let mut rng = Rng::new(40);
    for dt in DTYPES {
        for layout in LAYOUTS {
            for &(h, n, d) in &[(3usize, 700usize, 72usize), (2, 300, 128), (1, 50, 5)] {
                let prefix = 1 + rng.below(n - 1); // < n: the core needs a window
                let k = Tensor::new(dt, layout, [h, n, d], &mut || rng.normal());
                let ld = prefix + 3;
                let out = poisoned(h * ld);
                ck(
                    unsafe {
                        kve_cuda_knorm(&k.view(), prefix as i64, out.ptr(), ld as i64, null_mut())
                    },
                    "knorm",
                );
                let what = format!("knorm {dt:?} {layout:?} h{h} n{n} d{d} prefix{prefix}");
                let got = unstride(&what, &out.download(), h, prefix, ld);
                assert_close(&what, &got, &ref_knorm(&k, prefix), 1e-5);
                // the core's f32 sum order: bit for bit
                assert_eq!(got, core_knorm(&k, prefix), "{what}: vs the core");
            }
        }
    }
}

/// kve_score_params.power on the device: the core's `score::power` bit for bit (products
/// rounded one by one), in place over strided rows, the padding between rows untouched;
/// refused arguments change nothing.
#[test]
fn score_power_matches_core() {
    need_device!();
    let mut rng = Rng::new(31);
    for &(rows, n, power) in &[
        (3usize, 1000usize, 3i32),
        (2, 17, 2),
        (1, 300, 16),
        (4, 5, 1),
    ] {
        let ld = n + 3;
        // signed scores over decades, zeros of both signs, the saturating extremes
        let mut host: Vec<f32> = (0..rows * ld)
            .map(|_| (rng.normal() * 4.0).exp2() * if rng.unif() < 0.3 { -1.0 } else { 1.0 })
            .collect();
        host[0] = -0.0;
        host[1] = 0.0;
        host[2] = f32::MAX;
        host[3] = -1e30;
        let buf = DBuf::from(&host);
        // SAFETY: `rows` rows of `ld` floats on the device.
        let rc = unsafe {
            kve_cuda_score_power(
                buf.ptr(),
                rows as i64,
                n as i64,
                ld as i64,
                power,
                null_mut(),
            )
        };
        ck(rc, "score_power");
        let mut want = host.clone();
        for r in 0..rows {
            kvevict::score::power::raise(power as u32, &mut want[r * ld..r * ld + n]);
        }
        let got = buf.download();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&got),
            bits(&want),
            "score_power rows{rows} n{n} power{power}"
        );
    }
    // refusals: power outside [1, 16], ld < n, rows < 0, NULL
    let host = vec![2.0f32; 16];
    let buf = DBuf::from(&host);
    for (rows, n, ld, power, what) in [
        (2i64, 8i64, 8i64, 0i32, "power 0"),
        (2, 8, 8, 17, "power 17"),
        (2, 8, 7, 3, "ld < n"),
        (-1, 8, 8, 3, "rows < 0"),
    ] {
        // SAFETY: refused before any access.
        let rc = unsafe { kve_cuda_score_power(buf.ptr(), rows, n, ld, power, null_mut()) };
        assert_eq!(rc, 1, "{what}");
    }
    // SAFETY: NULL with work to do is refused.
    assert_eq!(
        unsafe { kve_cuda_score_power(null_mut(), 1, 1, 1, 3, null_mut()) },
        1
    );
    assert_eq!(buf.download(), host, "refused calls wrote");
}

#[test]
fn sink_scores_match_reference() {
    need_device!();
    for &(rows, n, sinks) in &[
        (6usize, 1000usize, 4usize),
        (3, 17, 0),
        (2, 5, 9),
        (1, 300, 300),
    ] {
        let ld = n + 2;
        let out = poisoned(rows * ld);
        ck(
            unsafe {
                kve_cuda_sink_scores(
                    out.ptr(),
                    rows as i64,
                    n as i64,
                    ld as i64,
                    sinks as i64,
                    null_mut(),
                )
            },
            "sink_scores",
        );
        let what = format!("sink_scores rows{rows} n{n} sinks{sinks}");
        let got = unstride(&what, &out.download(), rows, n, ld);
        let want = ref_sinks(rows, n, sinks);
        assert_eq!(
            got,
            want.iter().map(|&x| x as f32).collect::<Vec<f32>>(),
            "{what}"
        );
        // the selection keeps the sinks and the most recent tokens (later position first)
        if n >= sinks + 10 {
            let keep = sinks + 10;
            let wsb = unsafe { kve_cuda_select_workspace_size(rows as i64) };
            let ws = DBuf::<u8>::new(wsb);
            let counts = DBuf::from(&vec![-1i32; rows]);
            let idx = DBuf::from(&vec![-1i32; rows * n]);
            ck(
                unsafe {
                    kve_cuda_select(
                        out.ptr(),
                        ld as i64,
                        n as i64,
                        rows as i64,
                        1,
                        null(),
                        keep as i64,
                        null(),
                        1,
                        counts.ptr(),
                        idx.ptr(),
                        n as i64,
                        ws.vptr(),
                        wsb,
                        null_mut(),
                    )
                },
                "select sinks",
            );
            let (gc, gi) = (counts.download(), idx.download());
            let want: Vec<i32> = (0..sinks).chain(n - 10..n).map(|i| i as i32).collect();
            for r in 0..rows {
                assert_eq!(gc[r] as usize, keep, "{what}: kept count row {r}");
                assert_eq!(&gi[r * n..r * n + keep], &want[..], "{what}: kept row {r}");
            }
        }
    }
}

#[test]
fn critical_combine_matches_reference() {
    need_device!();
    let mut rng = Rng::new(41);
    let (rows, n) = (5usize, 300usize);
    let (ld_b, ld_l, ld_o, idx_ld) = (n + 1, n + 2, n + 3, n + 4);
    let base: Vec<f32> = (0..rows * n).map(|_| rng.unif() * rng.unif()).collect();
    let l1: Vec<f32> = (0..rows * n).map(|_| 3.0 * rng.unif()).collect();
    // the core's second stage in f32: (s + 1e-4) · l1, forced positions f32::MAX
    let combine = |forced: &dyn Fn(usize, usize) -> bool| -> Vec<f32> {
        (0..rows * n)
            .map(|e| {
                let (r, i) = (e / n, e % n);
                if forced(r, i) {
                    f32::MAX
                } else {
                    (base[e] + 1e-4) * l1[e]
                }
            })
            .collect()
    };
    let (bd, ld) = (
        DBuf::from(&strided(&base, rows, n, ld_b)),
        DBuf::from(&strided(&l1, rows, n, ld_l)),
    );
    // 1. random first-stage lists, every array strided
    let (idx, counts) = random_lists(&mut rng, rows, n, idx_ld);
    let (id, cd) = (DBuf::from(&idx), DBuf::from(&counts));
    let out = poisoned(rows * ld_o);
    ck(
        unsafe {
            kve_cuda_critical_combine(
                bd.ptr(),
                ld_b as i64,
                ld.ptr(),
                ld_l as i64,
                cd.ptr(),
                id.ptr(),
                idx_ld as i64,
                rows as i64,
                n as i64,
                out.ptr(),
                ld_o as i64,
                null_mut(),
            )
        },
        "critical_combine",
    );
    let got = unstride("critical_combine", &out.download(), rows, n, ld_o);
    let want =
        combine(&|r, i| idx[r * idx_ld..r * idx_ld + counts[r] as usize].contains(&(i as i32)));
    assert_eq!(got, want, "critical_combine (strided, random lists)");
    // 2. in place, first stage from kve_cuda_select (top `first` of each row), as the core
    let first = 1 + rng.below(n / 4);
    let inplace = DBuf::from(&strided(&base, rows, n, ld_b));
    let wsb = unsafe { kve_cuda_select_workspace_size(rows as i64) };
    let ws = DBuf::<u8>::new(wsb);
    let (kc, ki) = (
        DBuf::from(&vec![-1i32; rows]),
        DBuf::from(&vec![-1i32; rows * n]),
    );
    unsafe {
        ck(
            kve_cuda_select(
                inplace.ptr(),
                ld_b as i64,
                n as i64,
                rows as i64,
                1,
                null(),
                first as i64,
                null(),
                1,
                kc.ptr(),
                ki.ptr(),
                n as i64,
                ws.vptr(),
                wsb,
                null_mut(),
            ),
            "select first stage",
        );
        ck(
            kve_cuda_critical_combine(
                inplace.ptr(),
                ld_b as i64,
                ld.ptr(),
                ld_l as i64,
                kc.ptr(),
                ki.ptr(),
                n as i64,
                rows as i64,
                n as i64,
                inplace.ptr(),
                ld_b as i64,
                null_mut(),
            ),
            "critical_combine in place",
        );
    }
    let first_stage = ref_select(&base, n, rows, 1, &vec![first as i64; rows], None);
    let got = unstride(
        "critical_combine in place",
        &inplace.download(),
        rows,
        n,
        ld_b,
    );
    let want = combine(&|r, i| first_stage[r].contains(&(i as i32)));
    assert_eq!(
        got, want,
        "critical_combine in place after select (first {first})"
    );
    // 3. first-stage positions outside the row (-1, n) are skipped; a count above n is
    // clamped to n (row 1: the whole list, all -1 past its first entries)
    let mut idx = vec![-1i32; rows * n];
    idx[..3].copy_from_slice(&[-1, n as i32, 2]);
    idx[n] = 7;
    let mut counts = vec![0i32; rows];
    counts[..2].copy_from_slice(&[3, 1000]);
    let (id, cd) = (DBuf::from(&idx), DBuf::from(&counts));
    let out = poisoned(rows * n);
    ck(
        // SAFETY: device buffers of the documented sizes.
        unsafe {
            kve_cuda_critical_combine(
                bd.ptr(),
                ld_b as i64,
                ld.ptr(),
                ld_l as i64,
                cd.ptr(),
                id.ptr(),
                n as i64,
                rows as i64,
                n as i64,
                out.ptr(),
                n as i64,
                null_mut(),
            )
        },
        "critical_combine, lists out of range",
    );
    let want = combine(&|r, i| (r, i) == (0, 2) || (r, i) == (1, 7));
    assert_eq!(out.download(), want, "critical_combine, lists out of range");
}

// --------------------------------------------------------------------- value norms --

#[test]
fn vonorm_matches_reference() {
    need_device!();
    let mut rng = Rng::new(3);
    for dt in DTYPES {
        for &(hkv, gpk, n, dv) in &[
            (2usize, 3usize, 300usize, 64usize),
            (1, 2, 130, 128),
            (2, 1, 70, 200),
            (1, 1, 33, 40),
        ] {
            for split in [false, true] {
                if dt == Dt::F32 && split {
                    continue;
                }
                let layout = LAYOUTS[rng.below(4)];
                let v = Tensor::new(dt, layout, [hkv, n, dv], &mut || rng.normal());
                let ngram = hkv * gpk;
                // PSD Grams like Wo_h Wo_hᵀ / D
                let dm = 96;
                let mut gram = vec![0f32; ngram * dv * dv];
                for m in 0..ngram {
                    let wo: Vec<f32> = (0..dv * dm).map(|_| rng.normal()).collect();
                    for r in 0..dv {
                        for c in 0..dv {
                            let s: f64 = (0..dm)
                                .map(|x| wo[r * dm + x] as f64 * wo[c * dm + x] as f64)
                                .sum();
                            gram[(m * dv + r) * dv + c] = (s / dm as f64) as f32;
                        }
                    }
                }
                let gd = DBuf::from(&gram);
                let hi = DBuf::<u8>::new(gram.len() * dt.size());
                let lo = DBuf::<u8>::new(gram.len() * dt.size());
                ck(
                    unsafe {
                        kve_cuda_gram_split(
                            gd.ptr(),
                            gram.len() as i64,
                            dt.code(),
                            hi.vptr(),
                            if split { lo.vptr() } else { null_mut() },
                            null_mut(),
                        )
                    },
                    "gram_split",
                );
                let out = poisoned(ngram * n);
                let ntok = n - rng.below(3);
                let out = if ntok < n {
                    poisoned(ngram * ntok)
                } else {
                    out
                };
                ck(
                    unsafe {
                        kve_cuda_vonorm(
                            &v.view(),
                            ntok as i64,
                            hi.vptr(),
                            if split { lo.vptr() } else { null() },
                            ngram as i64,
                            0,
                            out.ptr(),
                            null_mut(),
                        )
                    },
                    "vonorm",
                );
                // reference with the Gram the kernel sees: rounded (hi) or exact (hi+lo)
                let geff: Vec<f64> = gram
                    .iter()
                    .map(|&x| {
                        if split || dt == Dt::F32 {
                            x as f64
                        } else {
                            dt.round(x) as f64
                        }
                    })
                    .collect();
                let mut want = vec![0f64; ngram * ntok];
                for m in 0..ngram {
                    let hk = m / gpk;
                    for i in 0..ntok {
                        let mut s = 0f64;
                        for r in 0..dv {
                            let vr = v.at(hk, i, r);
                            for c in 0..dv {
                                s += vr * geff[(m * dv + r) * dv + c] * v.at(hk, i, c);
                            }
                        }
                        want[m * ntok + i] = s;
                    }
                }
                let tol = if split || dt == Dt::F32 { 1e-4 } else { 1e-3 };
                assert_close(
                    &format!(
                        "vonorm {dt:?} {layout:?} hkv{hkv} gpk{gpk} n{ntok} dv{dv} split{split}"
                    ),
                    &out.download(),
                    &want,
                    tol,
                );
                // sqrt variant
                let out2 = poisoned(ngram * ntok);
                ck(
                    unsafe {
                        kve_cuda_vonorm(
                            &v.view(),
                            ntok as i64,
                            hi.vptr(),
                            if split { lo.vptr() } else { null() },
                            ngram as i64,
                            1,
                            out2.ptr(),
                            null_mut(),
                        )
                    },
                    "vonorm sqrt",
                );
                let want2: Vec<f64> = want.iter().map(|x| x.max(0.0).sqrt()).collect();
                assert_close("vonorm sqrt", &out2.download(), &want2, tol);
            }
        }
    }
}

#[test]
fn vonorm_factor_matches_reference() {
    need_device!();
    let mut rng = Rng::new(31);
    for dt in DTYPES {
        for &(hkv, gpk, n, dv) in &[
            (2usize, 2usize, 300usize, 128usize),
            (1, 3, 77, 64),
            (1, 1, 50, 200),
        ] {
            for split in [false, true] {
                if dt == Dt::F32 && split {
                    continue;
                }
                let layout = LAYOUTS[rng.below(4)];
                let v = Tensor::new(dt, layout, [hkv, n, dv], &mut || rng.normal());
                let ngram = hkv * gpk;
                let gram = core_gram(&mut rng, ngram, ngram, dv, 2 * dv);
                let mut l = vec![0f32; gram.len()];
                assert_eq!(
                    unsafe {
                        kve_cuda_gram_factor(gram.as_ptr(), ngram as i64, dv as i64, l.as_mut_ptr())
                    },
                    0
                );
                // garbage above the diagonal must be ignored
                for m in 0..ngram {
                    for r in 0..dv {
                        for c in r + 1..dv {
                            l[(m * dv + r) * dv + c] = 1e3;
                        }
                    }
                }
                let ld = DBuf::from(&l);
                let (hi, lo) = (
                    DBuf::<u8>::new(l.len() * dt.size()),
                    DBuf::<u8>::new(l.len() * dt.size()),
                );
                ck(
                    unsafe {
                        kve_cuda_gram_split(
                            ld.ptr(),
                            l.len() as i64,
                            dt.code(),
                            hi.vptr(),
                            if split { lo.vptr() } else { null_mut() },
                            null_mut(),
                        )
                    },
                    "split",
                );
                let out = poisoned(ngram * n);
                ck(
                    unsafe {
                        kve_cuda_vonorm_factor(
                            &v.view(),
                            n as i64,
                            hi.vptr(),
                            if split { lo.vptr() } else { null() },
                            ngram as i64,
                            0,
                            out.ptr(),
                            null_mut(),
                        )
                    },
                    "vonorm_factor",
                );
                let mut want = vec![0f64; ngram * n];
                for m in 0..ngram {
                    let hk = m / gpk;
                    for i in 0..n {
                        let mut s = 0f64;
                        for r in 0..dv {
                            for c in 0..dv {
                                s += v.at(hk, i, r)
                                    * gram[(m * dv + r) * dv + c] as f64
                                    * v.at(hk, i, c);
                            }
                        }
                        want[m * n + i] = s;
                    }
                }
                let tol = if split || dt == Dt::F32 { 1e-4 } else { 5e-3 };
                assert_close(
                    &format!("vonorm_factor {dt:?} {layout:?} dv{dv} split{split}"),
                    &out.download(),
                    &want,
                    tol,
                );
            }
        }
    }
}

/// CPU only: the host Cholesky factor reproduces the Gram matrices (L Lᵀ = G, L lower).
#[test]
fn gram_factor_reproduces_gram_on_cpu() {
    let mut rng = Rng::new(30);
    for &(hq, hkv, dv, dm) in &[(4usize, 2usize, 64usize, 200usize), (2, 1, 48, 32)] {
        // dm < dv in the second case: rank-deficient (semi-definite) Grams
        let g = core_gram(&mut rng, hq, hkv, dv, dm);
        let mut l = vec![f32::NAN; g.len()];
        assert_eq!(
            unsafe { kve_cuda_gram_factor(g.as_ptr(), hq as i64, dv as i64, l.as_mut_ptr()) },
            0
        );
        for m in 0..hq {
            let lm = &l[m * dv * dv..(m + 1) * dv * dv];
            let mut want = Vec::new();
            let mut got = Vec::new();
            for r in 0..dv {
                for c in 0..dv {
                    if c > r {
                        assert_eq!(lm[r * dv + c], 0.0, "upper triangle");
                    }
                    let s: f64 = (0..dv)
                        .map(|k| lm[r * dv + k] as f64 * lm[c * dv + k] as f64)
                        .sum();
                    got.push(s as f32);
                    want.push(g[m * dv * dv + r * dv + c] as f64);
                }
            }
            let tol = if dm >= dv { 1e-5 } else { 1e-4 };
            assert_close(
                &format!("L Lᵀ = G (dv {dv}, D {dm}, head {m})"),
                &got,
                &want,
                tol,
            );
        }
    }
    // not PSD: rejected
    let bad = [1.0f32, 2.0, 2.0, 1.0];
    let mut out = vec![0f32; 4];
    assert_eq!(
        unsafe { kve_cuda_gram_factor(bad.as_ptr(), 1, 2, out.as_mut_ptr()) },
        1
    );
}

// --------------------------------------------------- head reductions, LaProx exact --

#[test]
fn head_reduce_and_laprox_exact_match_reference() {
    need_device!();
    let mut rng = Rng::new(5);
    let (hkv, g, n) = (3usize, 4usize, 500usize);
    let hq = hkv * g;
    let (ld_a, ld_b, ld_o) = (n + 3, n + 17, n + 5);
    // every 5th token negative in all heads (a max of negatives is not 0); one sign per
    // token, so the group sums do not cancel and the mock is held elementwise
    let a: Vec<f32> = (0..hq * n)
        .map(|e| rng.unif() * if e % n % 5 == 0 { -1.0 } else { 1.0 })
        .collect();
    let b: Vec<f32> = (0..hq * n).map(|_| rng.unif() * 5.0).collect();
    // the sqrt factor's input, a third negative: sqrt(max(b, 0)) (b_mode 2 keeps `b`)
    let b_neg: Vec<f32> = b
        .iter()
        .enumerate()
        .map(|(e, &x)| if e % 3 == 0 { -x } else { x })
        .collect();
    let sc: Vec<f32> = (0..hkv).map(|_| 1.0 + rng.unif()).collect();
    let (ad, sd) = (DBuf::from(&strided(&a, hq, n, ld_a)), DBuf::from(&sc));
    let bds = [
        DBuf::from(&strided(&b_neg, hq, n, ld_b)),
        DBuf::from(&strided(&b, hq, n, ld_b)),
    ];
    let b_of = |bm: i32| if bm == 1 { &b_neg } else { &b };
    let bd_of = |bm: i32| &bds[(bm != 1) as usize];
    let reference = |op: i32, bm: i32, use_scale: bool, hkv: usize, g: usize| -> Vec<f64> {
        let b = b_of(bm);
        let mut want = vec![0f64; hkv * n];
        for hk in 0..hkv {
            for i in 0..n {
                let xs: Vec<f64> = (0..g)
                    .map(|hh| {
                        let h = hk * g + hh;
                        let mut x = a[h * n + i] as f64;
                        if bm == 1 {
                            x *= (b[h * n + i].max(0.0) as f64).sqrt();
                        }
                        if bm == 2 {
                            x *= b[h * n + i] as f64;
                        }
                        if use_scale {
                            x *= sc[hk] as f64;
                        }
                        x
                    })
                    .collect();
                want[hk * n + i] = gqa(op, &xs);
            }
        }
        want
    };
    for op in 0..3 {
        for bm in 0..3 {
            for use_scale in [false, true] {
                let out = poisoned(hkv * ld_o);
                ck(
                    unsafe {
                        kve_cuda_head_reduce(
                            ad.ptr(),
                            ld_a as i64,
                            if bm == 0 { null() } else { bd_of(bm).ptr() },
                            ld_b as i64,
                            bm,
                            if use_scale { sd.ptr() } else { null() },
                            out.ptr(),
                            ld_o as i64,
                            hq as i64,
                            hkv as i64,
                            n as i64,
                            op,
                            null_mut(),
                        )
                    },
                    "head_reduce",
                );
                let what = format!("head_reduce op{op} b{bm} scale{use_scale} (strided)");
                let got = unstride(&what, &out.download(), hkv, n, ld_o);
                let want = reference(op, bm, use_scale, hkv, g);
                assert_close(&what, &got, &want, 1e-5);
                if MOCK {
                    assert_each_close(&what, &got, &want, 1e-6, 1e-7);
                }
            }
        }
    }
    // in place (Hkv == Hq, out == a, same row stride): plain per-head products
    for bm in 1..3 {
        let inplace = DBuf::from(&strided(&a, hq, n, ld_a));
        ck(
            unsafe {
                kve_cuda_head_reduce(
                    inplace.ptr(),
                    ld_a as i64,
                    bd_of(bm).ptr(),
                    ld_b as i64,
                    bm,
                    null(),
                    inplace.ptr(),
                    ld_a as i64,
                    hq as i64,
                    hq as i64,
                    n as i64,
                    KVE_CUDA_GQA_SUM,
                    null_mut(),
                )
            },
            "head_reduce in place",
        );
        let what = format!("head_reduce in place b{bm}");
        let got = unstride(&what, &inplace.download(), hq, n, ld_a);
        assert_close(
            &what,
            &got,
            &reference(KVE_CUDA_GQA_SUM, bm, false, hq, 1),
            1e-6,
        );
        if MOCK && bm == 2 {
            // one f32 product per element
            let prod: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x * y).collect();
            assert_eq!(got, prod, "{what}: the mock's products");
        }
    }
    // refusals (nothing written): b missing for b_mode 1, Hq not a multiple of Hkv, an
    // unknown b_mode or GQA op, ld_b < n; in place only element for element (not with a
    // group of g > 1, not with another row stride)
    let out = sentinel(hkv * ld_o);
    let bd = bd_of(2).ptr() as *const f32;
    let (ldo, ld_in) = (ld_o as i64, ld_a as i64);
    let (o, inp) = (out.ptr(), ad.ptr());
    for (what, bm, b_p, ld_b, hk, op, o, ld_out) in [
        ("b_mode 1 without b", 1, null(), ld_b, hkv, 0, o, ldo),
        ("hq % hkv != 0", 0, bd, ld_b, 5, 0, o, ldo),
        ("b_mode 3", 3, bd, ld_b, hkv, 0, o, ldo),
        ("GQA op 3", 0, bd, ld_b, hkv, 3, o, ldo),
        ("ld_b < n", 2, bd, n - 1, hkv, 0, o, ldo),
        ("in place, g > 1", 0, null(), 0, hkv, 0, inp, ld_in),
        (
            "in place, other stride",
            0,
            null(),
            0,
            hq,
            0,
            inp,
            ld_in + 1,
        ),
    ] {
        // SAFETY: device buffers of the declared sizes; refused before any is touched.
        let rc = unsafe {
            kve_cuda_head_reduce(
                inp,
                ld_in,
                b_p,
                ld_b as i64,
                bm,
                null(),
                o,
                ld_out,
                hq as i64,
                hk as i64,
                n as i64,
                op,
                null_mut(),
            )
        };
        assert_eq!(rc, INVALID, "head_reduce: {what}");
    }
    assert_sentinel("head_reduce refusals: out", &out);
    let got_a = unstride("head_reduce refusals: a", &ad.download(), hq, n, ld_a);
    assert_eq!(got_a, a, "head_reduce refusals: a written");
    // exact GQA from cross terms, every mode, strided; unused inputs passed as NULL
    let np = g * (g + 1) / 2;
    let (ld_c, ld_q) = (n + 9, n + 1);
    let cross: Vec<f32> = (0..hkv * np * n).map(|_| rng.unif()).collect();
    let mut qv: Vec<f32> = (0..hkv * np * n).map(|_| rng.unif()).collect();
    for x in qv.iter_mut().step_by(13) {
        *x *= -0.25; // rounding can make v G vᵀ slightly negative: clamped at 0
    }
    let (cd, qd) = (
        DBuf::from(&strided(&cross, hkv * np, n, ld_c)),
        DBuf::from(&strided(&qv, hkv * np, n, ld_q)),
    );
    for mode in [
        KVE_CUDA_LAPROX_EXACT,
        KVE_CUDA_LAPROX_MEAN_ATTN,
        KVE_CUDA_LAPROX_ATTN_TERM,
        KVE_CUDA_LAPROX_VALUE_TERM,
    ] {
        let out = poisoned(hkv * ld_o);
        ck(
            unsafe {
                kve_cuda_laprox_exact(
                    if mode == KVE_CUDA_LAPROX_VALUE_TERM {
                        null()
                    } else {
                        cd.ptr()
                    },
                    ld_c as i64,
                    if mode == KVE_CUDA_LAPROX_ATTN_TERM {
                        null()
                    } else {
                        qd.ptr()
                    },
                    ld_q as i64,
                    out.ptr(),
                    ld_o as i64,
                    hkv as i64,
                    g as i64,
                    n as i64,
                    mode,
                    null_mut(),
                )
            },
            "laprox_exact",
        );
        let mut want = vec![0f64; hkv * n];
        for hk in 0..hkv {
            for i in 0..n {
                let (mut s, mut cs, mut vs) = (0f64, 0f64, 0f64);
                for p in 0..np {
                    let w = if p < g { 1.0 } else { 2.0 };
                    let c = cross[(hk * np + p) * n + i] as f64;
                    let q = qv[(hk * np + p) * n + i] as f64;
                    s += w * c * q;
                    cs += w * c;
                    if p < g {
                        vs += q.max(0.0).sqrt();
                    }
                }
                let (attn, value) = (cs.max(0.0).sqrt(), vs / g as f64);
                want[hk * n + i] = match mode {
                    KVE_CUDA_LAPROX_EXACT => s.max(0.0).sqrt(),
                    KVE_CUDA_LAPROX_MEAN_ATTN => attn * value,
                    KVE_CUDA_LAPROX_ATTN_TERM => attn,
                    _ => value,
                };
            }
        }
        let what = format!("laprox_exact mode{mode} (strided)");
        let got = unstride(&what, &out.download(), hkv, n, ld_o);
        assert_close(&what, &got, &want, 1e-5);
        if MOCK {
            assert_each_close(&what, &got, &want, 1e-5, 1e-6);
        }
    }
    // refusals (nothing written): an input the mode reads missing, an unknown mode, a row
    // stride below n, a group past 64
    let out = sentinel(hkv * ld_o);
    let (c, q) = (cd.ptr() as *const f32, qd.ptr() as *const f32);
    for (what, c, ld_c, q, mode, g) in [
        (
            "exact without cross",
            null(),
            ld_c,
            q,
            KVE_CUDA_LAPROX_EXACT,
            g,
        ),
        (
            "mean-attn without qv",
            c,
            ld_c,
            null(),
            KVE_CUDA_LAPROX_MEAN_ATTN,
            g,
        ),
        ("mode 4", c, ld_c, q, 4, g),
        ("ld_cross < n", c, n - 1, q, KVE_CUDA_LAPROX_EXACT, g),
        ("g 65", c, ld_c, q, KVE_CUDA_LAPROX_EXACT, 65),
    ] {
        // SAFETY: device buffers of the declared sizes; refused before any is touched.
        let rc = unsafe {
            kve_cuda_laprox_exact(
                c,
                ld_c as i64,
                q,
                ld_q as i64,
                out.ptr(),
                ld_o as i64,
                hkv as i64,
                g as i64,
                n as i64,
                mode,
                null_mut(),
            )
        };
        assert_eq!(rc, INVALID, "laprox_exact: {what}");
    }
    assert_sentinel("laprox_exact refusals: out", &out);
}

// ----------------------------------------------- layer statistics, token reduction --

/// `kve_cuda_head_reduce_all` (TOVA's one launch): every output row equals, bit for bit,
/// `kve_cuda_head_reduce` of all `hq` rows into one (itself held to the reference above), for
/// each op; row gaps stay unwritten; in place (out == a) works; bad arguments give 1 and
/// write nothing.
#[test]
fn head_reduce_all_equals_head_reduce_of_every_row() {
    need_device!();
    let mut rng = Rng::new(31);
    let (hq, n, reps) = (6usize, 300usize, 4usize);
    let (ld_a, ld_o) = (n + 7, n + 2);
    let a: Vec<f32> = (0..hq * n)
        .map(|e| rng.unif() * if e % 7 == 0 { -1.0 } else { 1.0 })
        .collect();
    let ad = DBuf::from(&strided(&a, hq, n, ld_a));
    for op in 0..3 {
        let one = poisoned(n);
        // SAFETY: device buffers of the sizes passed.
        ck(
            unsafe {
                kve_cuda_head_reduce(
                    ad.ptr(),
                    ld_a as i64,
                    null(),
                    0,
                    0,
                    null(),
                    one.ptr(),
                    n as i64,
                    hq as i64,
                    1,
                    n as i64,
                    op,
                    null_stream(),
                )
            },
            "head_reduce",
        );
        let want = one.download();
        let out = poisoned(reps * ld_o);
        // SAFETY: as above.
        let rc = unsafe {
            kve_cuda_head_reduce_all(
                ad.ptr(),
                ld_a as i64,
                out.ptr(),
                ld_o as i64,
                hq as i64,
                reps as i64,
                n as i64,
                op,
                null_stream(),
            )
        };
        ck(rc, "head_reduce_all");
        let got = unstride("head_reduce_all", &out.download(), reps, n, ld_o);
        for r in 0..reps {
            let row = &got[r * n..(r + 1) * n];
            let same = row
                .iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "op {op} row {r}: {row:?}\nwant {want:?}");
        }
        // in place: rows 0..2 of a copy of a
        let inplace = DBuf::from(&strided(&a, hq, n, ld_a));
        // SAFETY: as above; out == a with the same ld is documented.
        ck(
            unsafe {
                kve_cuda_head_reduce_all(
                    inplace.ptr(),
                    ld_a as i64,
                    inplace.ptr(),
                    ld_a as i64,
                    hq as i64,
                    2,
                    n as i64,
                    op,
                    null_stream(),
                )
            },
            "in place",
        );
        let got = inplace.download();
        for r in 0..hq {
            let row = &got[r * ld_a..r * ld_a + n];
            if r < 2 {
                assert!(row
                    .iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits()));
            } else {
                assert_eq!(row, &a[r * n..(r + 1) * n], "op {op}: row {r} untouched");
            }
        }
    }
    let out = sentinel(reps * ld_o);
    let f = ad.ptr();
    let o = out.ptr();
    let call = |a: *const f32, lda: i64, o: *mut f32, ldo: i64, hq: i64, reps: i64, op: i32| {
        // SAFETY: refused calls touch no pointer.
        unsafe { kve_cuda_head_reduce_all(a, lda, o, ldo, hq, reps, n as i64, op, null_stream()) }
    };
    let (la, lo) = (ld_a as i64, ld_o as i64);
    for (what, rc) in [
        ("hq 0", call(f, la, o, lo, 0, 1, 0)),
        ("reps 0", call(f, la, o, lo, 6, 0, 0)),
        ("op 3", call(f, la, o, lo, 6, 1, 3)),
        ("ld_a < n", call(f, n as i64 - 1, o, lo, 6, 1, 0)),
        ("ld_out < n", call(f, la, o, n as i64 - 1, 6, 1, 0)),
        ("a NULL", call(null(), la, o, lo, 6, 1, 0)),
        ("out NULL", call(f, la, null_mut(), lo, 6, 1, 0)),
        ("in place, other ld", call(f, la, f, la + 1, 6, 1, 0)),
    ] {
        assert_eq!(rc, 1, "{what}");
    }
    assert_sentinel("head_reduce_all refusals", &out);
}

#[test]
fn layer_stats_and_token_reduce_match_reference() {
    need_device!();
    let mut rng = Rng::new(6);
    let (layers, rpl, n) = (5usize, 3usize, 20000usize);
    let stride = rpl * n;
    let mut s: Vec<f32> = (0..layers * stride)
        .map(|_| rng.unif() * rng.unif())
        .collect();
    for x in s.iter_mut().take(100) {
        *x = 0.0; // zeros contribute nothing to the entropy
    }
    for x in s.iter_mut().skip(100).step_by(97) {
        *x = -*x; // negative scores count by |s|, as in the core
    }
    let sd = DBuf::from(&s);
    let wsb = unsafe { kve_cuda_layer_stats_workspace_size(layers as i64, stride as i64) };
    let ws = DBuf::<u8>::new(wsb);
    let sums = DBuf::from(&vec![f64::NAN; layers]);
    let ent = DBuf::from(&vec![f64::NAN; layers]);
    ck(
        unsafe {
            kve_cuda_layer_stats(
                sd.ptr(),
                stride as i64,
                stride as i64,
                layers as i64,
                sums.ptr(),
                ent.ptr(),
                ws.vptr(),
                wsb,
                null_mut(),
            )
        },
        "layer_stats",
    );
    let (gs, ge) = (sums.download(), ent.download());
    for l in 0..layers {
        let xs = &s[l * stride..(l + 1) * stride];
        let tot: f64 = xs.iter().map(|&x| (x as f64).abs()).sum();
        let e: f64 = xs
            .iter()
            .filter(|&&x| x != 0.0)
            .map(|&x| {
                let p = (x as f64).abs() / tot;
                -p * p.ln()
            })
            .sum();
        assert!(
            (gs[l] - tot).abs() <= 1e-9 * tot,
            "sum layer {l}: {} vs {tot}",
            gs[l]
        );
        assert!(
            (ge[l] - e).abs() <= 1e-9 * e.max(1.0),
            "entropy layer {l}: {} vs {e}",
            ge[l]
        );
        // and the core's entropy
        let core = kvevict::budget::lava::layer_entropy(xs);
        assert!(
            (ge[l] - core).abs() <= 1e-6 * e.max(1.0),
            "core entropy layer {l}: {core} vs gpu {}",
            ge[l]
        );
    }
    for norm in [false, true] {
        let out = poisoned(n);
        ck(
            unsafe {
                kve_cuda_token_reduce(
                    sd.ptr(),
                    if norm { sums.ptr() } else { null() },
                    layers as i64,
                    rpl as i64,
                    n as i64,
                    out.ptr(),
                    null_mut(),
                )
            },
            "token_reduce",
        );
        let want: Vec<f64> = (0..n)
            .map(|i| {
                (0..layers)
                    .map(|l| {
                        let la: f64 = (0..rpl).map(|r| s[(l * rpl + r) * n + i] as f64).sum();
                        if norm {
                            la / gs[l]
                        } else {
                            la
                        }
                    })
                    .sum()
            })
            .collect();
        let got = out.download();
        assert_close(&format!("token_reduce norm{norm}"), &got, &want, 1e-5);
        // bit for bit the core's token-granularity arithmetic (f32, (layer, row) order)
        let core: Vec<f32> = (0..n)
            .map(|i| {
                let mut acc = 0f32;
                for l in 0..layers {
                    let f = if norm && gs[l] > 0.0 {
                        (1.0 / gs[l]) as f32
                    } else {
                        1.0
                    };
                    for r in 0..rpl {
                        acc += s[(l * rpl + r) * n + i] * f;
                    }
                }
                acc
            })
            .collect();
        assert!(
            got.iter()
                .zip(&core)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "token_reduce norm{norm}: not the core's bits"
        );
    }
}

/// Edges of token_reduce and sink_scores (exact values: the header's f32 order without
/// FMA): sums NULL gives plain sums; a layer whose sum is <= 0 counts with factor 1; no
/// layers gives zeros; refusals write nothing; sinks honour the row stride.
#[test]
fn token_reduce_and_sinks_edges() {
    need_device!();
    let sd = DBuf::from(&[1.0f32, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0]);
    let out = sentinel(2);
    let reduce = |s: *const f32, sums: *const f64, layers: i64| {
        // SAFETY: 2 layers of 2 rows of 2 floats, out of 2 (device buffers).
        unsafe { kve_cuda_token_reduce(s, sums, layers, 2, 2, out.ptr(), null_mut()) }
    };
    ck(reduce(sd.ptr(), null(), 2), "token_reduce without sums");
    assert_eq!(out.download(), vec![4.0, 6.0]);
    let sums = DBuf::from(&[10.0f64, 0.0]);
    ck(reduce(sd.ptr(), sums.ptr(), 2), "token_reduce, a zero sum");
    let f = (1.0f64 / 10.0) as f32;
    assert_eq!(out.download(), vec![1.0 * f + 3.0 * f, 2.0 * f + 4.0 * f]);
    out.upload(&[SENTINEL; 2]);
    assert_eq!(
        reduce(null(), null(), 2),
        INVALID,
        "token_reduce without scores"
    );
    assert_eq!(
        reduce(sd.ptr(), null(), -1),
        INVALID,
        "token_reduce, layers < 0"
    );
    assert_sentinel("token_reduce refused", &out);
    ck(reduce(null(), null(), 0), "token_reduce without layers");
    assert_eq!(out.download(), vec![0.0; 2], "no layers: zeros");
    // sinks with a row stride
    let o = sentinel(2 * 5);
    // SAFETY: 2 rows of stride 5 (device buffer); the second call is refused.
    unsafe {
        ck(
            kve_cuda_sink_scores(o.ptr(), 2, 4, 5, 2, null_mut()),
            "sinks",
        );
        assert_eq!(
            o.download(),
            vec![1.0, 1.0, 0.0, 0.0, SENTINEL, 1.0, 1.0, 0.0, 0.0, SENTINEL]
        );
        o.upload(&[SENTINEL; 10]);
        let rc = kve_cuda_sink_scores(o.ptr(), 2, 4, 3, 2, null_mut());
        assert_eq!(rc, INVALID, "sinks, ld < n");
    }
    assert_sentinel("sinks refused", &o);
}

// ----------------------------------------------------------- selection, compaction --

#[test]
fn select_matches_reference_exactly() {
    need_device!();
    let mut rng = Rng::new(7);
    // (layers, hkv, n): shapes; modes: global, per layer, per head. Rows past 4096
    // positions are written in chunks by several blocks (5000: 2, 20000: 5).
    for &(layers, hkv, n) in &[
        (4usize, 2usize, 1000usize),
        (3, 4, 37),
        (2, 1, 5000),
        (3, 2, 20000),
        (1, 1, 1),
    ] {
        let rows = layers * hkv;
        for mode in 0..3 {
            for ties in [false, true] {
                let s: Vec<f32> = (0..rows * n)
                    .map(|_| {
                        if ties {
                            (rng.below(7) as f32) * 0.25
                        } else {
                            rng.unif()
                        }
                    })
                    .collect();
                let (groups, rpg) = match mode {
                    0 => (1, rows),
                    1 => (layers, hkv),
                    _ => (rows, 1),
                };
                let ks: Vec<i64> = (0..groups)
                    .map(|_| rng.below(rpg * n + 2) as i64 - 1)
                    .collect();
                let norm = rng.below(2) == 1;
                let sums: Vec<f64> = (0..layers)
                    .map(|l| {
                        s[l * hkv * n..(l + 1) * hkv * n]
                            .iter()
                            .map(|&x| x as f64)
                            .sum::<f64>()
                            .max(1e-3)
                    })
                    .collect();
                let sd = DBuf::from(&s);
                let kd = DBuf::from(&ks);
                let lsd = DBuf::from(&sums);
                let counts = DBuf::from(&vec![-1i32; rows]);
                let idx = DBuf::from(&vec![-1i32; rows * n]);
                let wsb = unsafe { kve_cuda_select_workspace_size(groups as i64) };
                let ws = DBuf::<u8>::new(wsb);
                ck(
                    unsafe {
                        kve_cuda_select(
                            sd.ptr(),
                            n as i64,
                            n as i64,
                            groups as i64,
                            rpg as i64,
                            kd.ptr(),
                            0,
                            if norm { lsd.ptr() } else { null() },
                            hkv as i64,
                            counts.ptr(),
                            idx.ptr(),
                            n as i64,
                            ws.vptr(),
                            wsb,
                            null_mut(),
                        )
                    },
                    "select",
                );
                let want = ref_select(
                    &s,
                    n,
                    groups,
                    rpg,
                    &ks,
                    if norm { Some((&sums, hkv)) } else { None },
                );
                let (gc, gi) = (counts.download(), idx.download());
                for r in 0..rows {
                    let got = &gi[r * n..r * n + gc[r].max(0) as usize];
                    assert_eq!(gc[r] as usize, want[r].len(), "select count row {r} (layers {layers} hkv {hkv} n {n} mode {mode} ties {ties} norm {norm})");
                    assert_eq!(
                        got,
                        &want[r][..],
                        "select row {r} mode {mode} ties {ties} norm {norm}"
                    );
                }
            }
        }
    }
}

/// `kve_cuda_select` over `groups · rpg` rows of `s` (row stride and length `n`): the kept
/// lists per row; the index slots past each count stay unwritten.
#[allow(clippy::too_many_arguments)]
fn select_lists(
    s: &[f32],
    n: usize,
    groups: usize,
    rpg: usize,
    k: Option<&[i64]>,
    k_all: i64,
    sums: Option<&[f64]>,
    rpl: usize,
) -> Vec<Vec<i32>> {
    let (rows, idx_ld) = (groups * rpg, n + 3);
    let sd = DBuf::from(s);
    let kd = k.map(DBuf::from);
    let lsd = sums.map(DBuf::from);
    let counts = DBuf::from(&vec![-7i32; rows]);
    let idx = DBuf::from(&vec![-7i32; rows * idx_ld]);
    // SAFETY: a pure host function.
    let wsb = unsafe { kve_cuda_select_workspace_size(groups as i64) };
    let ws = DBuf::<u8>::new(wsb);
    // SAFETY: device buffers of the declared sizes.
    let rc = unsafe {
        kve_cuda_select(
            sd.ptr(),
            n as i64,
            n as i64,
            groups as i64,
            rpg as i64,
            kd.as_ref().map_or(null(), |b| b.ptr()),
            k_all,
            lsd.as_ref().map_or(null(), |b| b.ptr()),
            rpl as i64,
            counts.ptr(),
            idx.ptr(),
            idx_ld as i64,
            ws.vptr(),
            wsb,
            null_mut(),
        )
    };
    ck(rc, "select");
    let (gc, gi) = (counts.download(), idx.download());
    (0..rows)
        .map(|r| {
            let c = gc[r] as usize;
            let past = &gi[r * idx_ld + c..(r + 1) * idx_ld];
            assert!(
                past.iter().all(|&v| v == -7),
                "select row {r}: written past its count"
            );
            gi[r * idx_ld..r * idx_ld + c].to_vec()
        })
        .collect()
}

/// Edges of `kve_cuda_select`: equal keys (the later position first, then the lower row),
/// NaN lowest and ±inf, k <= 0 and k >= size, per-group k, n == 0 (counts zeroed, nothing
/// else read), and refusals that write nothing.
#[test]
fn select_ties_nan_and_edges() {
    need_device!();
    let s = vec![1.0f32; 2 * 4];
    assert_eq!(
        select_lists(&s, 4, 1, 2, None, 3, None, 1),
        vec![vec![2, 3], vec![3]],
        "ties"
    );
    let s = vec![f32::NAN, f32::NEG_INFINITY, 0.5, f32::INFINITY];
    assert_eq!(
        select_lists(&s, 4, 1, 1, None, 2, None, 1),
        vec![vec![2, 3]]
    );
    assert_eq!(
        select_lists(&s, 4, 1, 1, None, 3, None, 1),
        vec![vec![1, 2, 3]],
        "NaN lowest, -inf above it"
    );
    assert_eq!(
        select_lists(&s, 2, 2, 1, Some(&[-1i64, 9][..]), 0, None, 1),
        vec![vec![], vec![0, 1]],
        "k <= 0 keeps none, k >= size all"
    );
    // n == 0: the counts zeroed, nothing else read
    let counts = DBuf::from(&[5i32; 3]);
    // SAFETY: only `counts` (3 rows) is written.
    let rc = unsafe {
        kve_cuda_select(
            null(),
            0,
            0,
            3,
            1,
            null(),
            1,
            null(),
            0,
            counts.ptr(),
            null_mut(),
            0,
            null_mut(),
            0,
            null_mut(),
        )
    };
    ck(rc, "select n 0");
    assert_eq!(counts.download(), vec![0; 3]);
    // refusals: ld < n, idx_ld < n, workspace too small, layer sums without rows per layer
    let sd = DBuf::from(&s);
    let counts = DBuf::from(&[5i32; 2]);
    let idx = DBuf::from(&[5i32; 8]);
    // SAFETY: a pure host function.
    let wsz = unsafe { kve_cuda_select_workspace_size(2) };
    let ws = DBuf::<u8>::new(wsz);
    let sums = DBuf::from(&[1.0f64]);
    for (what, ld, idx_ld, wsb, ls, rpl) in [
        ("ld < n", 3, 4, wsz, null(), 0),
        ("idx_ld < n", 4, 3, wsz, null(), 0),
        ("workspace too small", 4, 4, wsz - 1, null(), 0),
        (
            "sums without rows per layer",
            4,
            4,
            wsz,
            sums.ptr() as *const f64,
            0,
        ),
    ] {
        // SAFETY: device buffers of the declared sizes; refused before any is touched.
        let rc = unsafe {
            kve_cuda_select(
                sd.ptr(),
                ld,
                4,
                2,
                1,
                null(),
                1,
                ls,
                rpl,
                counts.ptr(),
                idx.ptr(),
                idx_ld,
                ws.vptr(),
                wsb,
                null_mut(),
            )
        };
        assert_eq!(rc, INVALID, "select: {what}");
    }
    assert_eq!(
        counts.download(),
        vec![5; 2],
        "select refusals: counts written"
    );
    assert_eq!(idx.download(), vec![5; 8], "select refusals: idx written");
}

#[test]
fn compact_matches_reference() {
    need_device!();
    let mut rng = Rng::new(8);
    for dt in DTYPES {
        for layout in LAYOUTS {
            for shared in [false, true] {
                let (h, n, d) = (3usize, 257usize, 24usize);
                let x = Tensor::new(dt, layout, [h, n, d], &mut || rng.normal());
                let lists = if shared { 1 } else { h };
                let mut kept = vec![0i32; lists * n];
                let mut counts = vec![0i32; lists];
                for l in 0..lists {
                    let mut c = 0;
                    for t in 0..n {
                        if rng.unif() < 0.3 || t < 5 {
                            kept[l * n + c] = t as i32;
                            c += 1;
                        }
                    }
                    counts[l] = c as i32;
                }
                let max_keep = *counts.iter().max().unwrap() as usize;
                let (kd, cd) = (DBuf::from(&kept), DBuf::from(&counts));
                let kept_ld = if shared { 0 } else { n as i64 };
                // varlen (out of place) first: reads the untouched tensor
                let total: usize = (0..h)
                    .map(|hh| counts[if shared { 0 } else { hh }] as usize)
                    .sum();
                let dst = DBuf::<u8>::new(total * d * dt.size());
                let cu = DBuf::from(&vec![-1i32; h + 1]);
                ck(
                    unsafe {
                        kve_cuda_compact_varlen(
                            &x.view(),
                            kd.ptr(),
                            kept_ld,
                            cd.ptr(),
                            dst.vptr(),
                            cu.ptr(),
                            null_mut(),
                        )
                    },
                    "varlen",
                );
                let cug = cu.download();
                let dstv = dt.decode(&dst.download());
                let mut acc = 0;
                for hh in 0..h {
                    let l = if shared { 0 } else { hh };
                    assert_eq!(cug[hh], acc as i32, "cu_seqlens[{hh}]");
                    for t in 0..counts[l] as usize {
                        let src = kept[l * n + t] as usize;
                        for dd in 0..d {
                            assert_eq!(
                                dstv[(acc + t) * d + dd],
                                x.vals[(hh * n + src) * d + dd],
                                "varlen {dt:?} {layout:?} h{hh} t{t} d{dd}"
                            );
                        }
                    }
                    acc += counts[l] as usize;
                }
                assert_eq!(cug[h], acc as i32);
                // in place
                let wsb = unsafe { kve_cuda_compact_workspace_size(&x.view(), max_keep as i64) };
                let ws = DBuf::<u8>::new(wsb);
                ck(
                    unsafe {
                        kve_cuda_compact(
                            &x.view(),
                            kd.ptr(),
                            kept_ld,
                            cd.ptr(),
                            max_keep as i64,
                            ws.vptr(),
                            wsb,
                            null_mut(),
                        )
                    },
                    "compact",
                );
                let what = format!("in place {dt:?} {layout:?} shared {shared}");
                assert_compacted(&what, &x, &kept, &counts, shared);
            }
        }
    }
}

/// Each head of `x` as compacted in place: row `t < count` holds the old row `kept[t]`,
/// the rest is unchanged (`shared`: one list for every head; lists `n` apart otherwise).
#[track_caller]
fn assert_compacted(what: &str, x: &Tensor, kept: &[i32], counts: &[i32], shared: bool) {
    let [h, n, d] = x.ext;
    let got = x.read_back();
    for hh in 0..h {
        let l = if shared { 0 } else { hh };
        for t in 0..n {
            let src = if t < counts[l] as usize {
                kept[l * n + t] as usize
            } else {
                t
            };
            for dd in 0..d {
                let (a, b) = (got[(hh * n + t) * d + dd], x.vals[(hh * n + src) * d + dd]);
                assert_eq!(a, b, "{what} h{hh} t{t} d{dd}");
            }
        }
    }
}

/// `kve_cuda_compact_batch`: 35 tensors (two launch pairs: 32 + 3) of every dtype and
/// layout, K and V of a "layer" sharing its lists, some layers with one shared list, each
/// compacted as `kve_cuda_compact` would (rows moved, the rest untouched); the workspace is
/// the largest pair's; a bad item anywhere refuses the whole call, nothing written.
#[test]
fn compact_batch_matches_reference() {
    need_device!();
    let mut rng = Rng::new(33);
    let (h, n, d) = (2usize, 150usize, 16usize);
    let mut tensors = Vec::new();
    let mut lists = Vec::new();
    for i in 0..35 {
        let (dt, layout) = (DTYPES[i % DTYPES.len()], LAYOUTS[(i / 2) % LAYOUTS.len()]);
        tensors.push(Tensor::new(dt, layout, [h, n, d], &mut || rng.normal()));
        if i % 2 == 0 {
            let shared = i % 6 == 4;
            let (kept, counts) = random_lists(&mut rng, if shared { 1 } else { h }, n, n);
            lists.push((
                shared,
                kept.clone(),
                counts.clone(),
                DBuf::from(&kept),
                DBuf::from(&counts),
            ));
        }
    }
    let items: Vec<KveCudaCompactItem> = tensors
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let (shared, _, _, kd, cd) = &lists[i / 2];
            KveCudaCompactItem {
                x: x.view(),
                kept: kd.ptr(),
                kept_ld: if *shared { 0 } else { n as i64 },
                counts: cd.ptr(),
            }
        })
        .collect();
    let max_keep = lists
        .iter()
        .flat_map(|l| l.2.iter())
        .copied()
        .max()
        .unwrap() as i64;
    // SAFETY: a pure host function of the descriptors.
    let wsb = unsafe { kve_cuda_compact_batch_workspace_size(items.as_ptr(), 35, max_keep) };
    let pair: usize = items[..32]
        .iter()
        // SAFETY: as above.
        .map(|it| unsafe { kve_cuda_compact_workspace_size(&it.x, max_keep) }.div_ceil(256) * 256)
        .sum();
    assert_eq!(wsb, pair, "the workspace is the first (largest) pair's");
    let ws = DBuf::<u8>::new(wsb);
    let before: Vec<Vec<f32>> = tensors.iter().map(|x| x.read_back()).collect();
    // refusals: nothing moves
    let mut bad = items.clone();
    bad[33].kept_ld = max_keep - 1;
    let stream = null_stream();
    // SAFETY: device buffers of the declared sizes; refused calls touch none.
    unsafe {
        let refused = [
            (
                "an item's kept_ld < max_keep",
                kve_cuda_compact_batch(bad.as_ptr(), 35, max_keep, ws.vptr(), wsb, stream),
            ),
            (
                "workspace too small",
                kve_cuda_compact_batch(items.as_ptr(), 35, max_keep, ws.vptr(), wsb - 1, stream),
            ),
            (
                "no workspace",
                kve_cuda_compact_batch(items.as_ptr(), 35, max_keep, null_mut(), wsb, stream),
            ),
            (
                "no items",
                kve_cuda_compact_batch(null(), 35, max_keep, ws.vptr(), wsb, stream),
            ),
            (
                "n_items < 0",
                kve_cuda_compact_batch(items.as_ptr(), -1, max_keep, ws.vptr(), wsb, stream),
            ),
        ];
        for (what, rc) in refused {
            assert_eq!(rc, 1, "{what}");
        }
        assert_eq!(
            kve_cuda_compact_batch(null(), 0, max_keep, null_mut(), 0, stream),
            0,
            "empty"
        );
    }
    for (i, x) in tensors.iter().enumerate() {
        assert_eq!(
            x.read_back(),
            before[i],
            "tensor {i}: nothing written on refusal"
        );
    }
    // SAFETY: as above.
    ck(
        unsafe { kve_cuda_compact_batch(items.as_ptr(), 35, max_keep, ws.vptr(), wsb, stream) },
        "compact_batch",
    );
    for (i, x) in tensors.iter().enumerate() {
        let (shared, kept, counts, _, _) = &lists[i / 2];
        let what = format!("tensor {i} ({:?})", items[i].x.dtype);
        assert_compacted(&what, x, kept, counts, *shared);
    }
}

/// Edges of compaction on a transposed f16 cache (tokens fastest): the workspace size,
/// refusals that write nothing (workspace too small, kept_ld below max_keep; varlen with
/// kept_ld below the tokens or no destination), varlen per head and with one shared list
/// (kept_ld 0), then in place. A kept position past the tokens is refused by the mock,
/// which reads the lists on the host; the kernels cannot see device lists before launching.
#[test]
fn compact_edges_and_rejections() {
    need_device!();
    let (heads, n, d) = (3usize, 10usize, 4usize);
    let mut e = 0f32;
    let x = Tensor::new(Dt::F16, Layout::Transposed, [heads, n, d], &mut || {
        e += 1.0;
        e
    });
    let at = |v: &[f32], h: usize, t: usize, c: usize| v[(h * n + t) * d + c];
    let kept = [0i32, 2, 5, 9, 1, 3, 4, 0, 7, 8, 9, 0];
    let counts = [4i32, 3, 2];
    let (kd, cd) = (DBuf::from(&kept), DBuf::from(&counts));
    // SAFETY: a pure host function of the view.
    let wsz = unsafe { kve_cuda_compact_workspace_size(&x.view(), 4) };
    assert_eq!(wsz, heads * 4 * d * 2, "compact workspace size");
    let ws = DBuf::<u8>::new(wsz);
    let compact = |kept: &DBuf<i32>, kept_ld: i64, wsb: usize| {
        // SAFETY: device buffers of the declared sizes.
        unsafe {
            kve_cuda_compact(
                &x.view(),
                kept.ptr(),
                kept_ld,
                cd.ptr(),
                4,
                ws.vptr(),
                wsb,
                null_mut(),
            )
        }
    };
    assert_eq!(
        compact(&kd, 4, wsz - 1),
        INVALID,
        "compact: workspace too small"
    );
    assert_eq!(compact(&kd, 3, wsz), INVALID, "compact: kept_ld < max_keep");
    if MOCK {
        let bad = DBuf::from(&[0i32, 2, 5, 10, 1, 3, 4, 0, 7, 8, 9, 0]);
        assert_eq!(
            compact(&bad, 4, wsz),
            INVALID,
            "compact: kept past the tokens"
        );
    }
    assert_eq!(x.read_back(), x.vals, "compact refused: tensor written");
    // varlen (out of place)
    let cu = DBuf::from(&[-1i32; 4]);
    let dst = DBuf::<u8>::new(9 * d * 2);
    let varlen = |kept: &DBuf<i32>, kept_ld: i64, counts: &DBuf<i32>, dst: *mut c_void| {
        // SAFETY: device buffers of the declared sizes.
        unsafe {
            kve_cuda_compact_varlen(
                &x.view(),
                kept.ptr(),
                kept_ld,
                counts.ptr(),
                dst,
                cu.ptr(),
                null_mut(),
            )
        }
    };
    let kept10: Vec<i32> = (0..heads)
        .flat_map(|h| {
            let mut row = kept[h * 4..h * 4 + 4].to_vec();
            row.resize(10, 0);
            row
        })
        .collect();
    let k10 = DBuf::from(&kept10);
    assert_eq!(
        varlen(&kd, 4, &cd, dst.vptr()),
        INVALID,
        "varlen: kept_ld < tokens"
    );
    assert_eq!(
        varlen(&k10, 10, &cd, null_mut()),
        INVALID,
        "varlen: no destination"
    );
    assert_eq!(
        cu.download(),
        vec![-1; 4],
        "varlen refused: cu_seqlens written"
    );
    ck(varlen(&k10, 10, &cd, dst.vptr()), "varlen");
    let cug = cu.download();
    assert_eq!(cug, vec![0, 4, 7, 9]);
    let got = Dt::F16.decode(&dst.download());
    for h in 0..heads {
        for t in 0..counts[h] as usize {
            for c in 0..d {
                let want = at(&x.vals, h, kept10[h * 10 + t] as usize, c);
                assert_eq!(
                    got[(cug[h] as usize + t) * d + c],
                    want,
                    "varlen h{h} t{t} c{c}"
                );
            }
        }
    }
    // one list for every head (kept_ld 0)
    let (shared, two) = (DBuf::from(&[1i32, 8]), DBuf::from(&[2i32]));
    let dst0 = DBuf::<u8>::new(3 * 2 * d * 2);
    ck(varlen(&shared, 0, &two, dst0.vptr()), "varlen, shared list");
    assert_eq!(cu.download(), vec![0, 2, 4, 6]);
    let got = Dt::F16.decode(&dst0.download());
    for h in 0..heads {
        for (t, src) in [1usize, 8].into_iter().enumerate() {
            for c in 0..d {
                assert_eq!(
                    got[(2 * h + t) * d + c],
                    at(&x.vals, h, src, c),
                    "shared h{h} t{t} c{c}"
                );
            }
        }
    }
    // in place
    ck(compact(&kd, 4, wsz), "compact");
    let y = x.read_back();
    for h in 0..heads {
        for t in 0..n {
            for c in 0..d {
                let src = if t < counts[h] as usize {
                    kept[h * 4 + t] as usize
                } else {
                    t
                };
                assert_eq!(
                    at(&y, h, t, c),
                    at(&x.vals, h, src, c),
                    "in place h{h} t{t} c{c}"
                );
            }
        }
    }
}

// -------------------------------------------------- budgets, forced entries, lists --

#[test]
fn mark_forced_matches_reference() {
    need_device!();
    let mut rng = Rng::new(42);
    let (rows, n) = (4usize, 400usize);
    let (ld, idx_ld) = (n + 5, n + 1);
    let s: Vec<f32> = (0..rows * ld).map(|_| rng.unif()).collect();
    let (idx, counts) = random_lists(&mut rng, rows, n, idx_ld);
    let (sd, id, cd) = (DBuf::from(&s), DBuf::from(&idx), DBuf::from(&counts));
    ck(
        unsafe {
            kve_cuda_mark_forced(
                sd.ptr(),
                ld as i64,
                rows as i64,
                cd.ptr(),
                id.ptr(),
                idx_ld as i64,
                null_mut(),
            )
        },
        "mark_forced",
    );
    let mut want = s.clone();
    for r in 0..rows {
        for t in 0..counts[r] as usize {
            want[r * ld + idx[r * idx_ld + t] as usize] = f32::INFINITY;
        }
    }
    assert_eq!(sd.download(), want, "mark_forced");
    // a select of exactly counts[r] per row then keeps the forced lists
    let kd = DBuf::from(&counts.iter().map(|&c| c as i64).collect::<Vec<i64>>());
    let wsb = unsafe { kve_cuda_select_workspace_size(rows as i64) };
    let ws = DBuf::<u8>::new(wsb);
    let (kc, ki) = (
        DBuf::from(&vec![-1i32; rows]),
        DBuf::from(&vec![-1i32; rows * n]),
    );
    ck(
        unsafe {
            kve_cuda_select(
                sd.ptr(),
                ld as i64,
                n as i64,
                rows as i64,
                1,
                kd.ptr(),
                0,
                null(),
                1,
                kc.ptr(),
                ki.ptr(),
                n as i64,
                ws.vptr(),
                wsb,
                null_mut(),
            )
        },
        "select forced",
    );
    let (gc, gi) = (kc.download(), ki.download());
    for r in 0..rows {
        let c = counts[r] as usize;
        assert_eq!(gc[r] as usize, c, "forced count row {r}");
        assert_eq!(
            &gi[r * n..r * n + c],
            &idx[r * idx_ld..r * idx_ld + c],
            "forced list row {r}"
        );
    }
}

#[test]
fn broadcast_lists_matches_reference() {
    need_device!();
    let mut rng = Rng::new(43);
    for &(src_rows, reps, src_ld, idx_ld) in &[(3usize, 4usize, 50usize, 64usize), (2, 1, 30, 30)] {
        let (mut idx, mut counts) = random_lists(&mut rng, src_rows, src_ld, src_ld);
        counts[src_rows - 1] = src_ld as i32; // one full list
        for t in 0..src_ld {
            idx[(src_rows - 1) * src_ld + t] = t as i32;
        }
        let (sid, scd) = (DBuf::from(&idx), DBuf::from(&counts));
        let rows = src_rows * reps;
        let (oc, oi) = (
            DBuf::from(&vec![-7i32; rows]),
            DBuf::from(&vec![-7i32; rows * idx_ld]),
        );
        ck(
            unsafe {
                kve_cuda_broadcast_lists(
                    scd.ptr(),
                    sid.ptr(),
                    src_ld as i64,
                    src_rows as i64,
                    reps as i64,
                    oc.ptr(),
                    oi.ptr(),
                    idx_ld as i64,
                    null_mut(),
                )
            },
            "broadcast_lists",
        );
        let mut want_c = vec![0i32; rows];
        let mut want_i = vec![-7i32; rows * idx_ld];
        for u in 0..rows {
            let r = u / reps;
            want_c[u] = counts[r];
            for t in 0..counts[r] as usize {
                want_i[u * idx_ld + t] = idx[r * src_ld + t];
            }
        }
        assert_eq!(oc.download(), want_c, "broadcast counts (reps {reps})");
        assert_eq!(oi.download(), want_i, "broadcast lists (reps {reps})");
    }
}

/// Edges of the list launchers: mark_forced skips positions outside the row and marks
/// none for a negative count; broadcast_lists refuses outputs over its sources and
/// reps < 0; layer_budgets refuses bad modes and parameters, does nothing without layers,
/// and may leave k_unit NULL. Every refusal writes nothing.
#[test]
fn forced_broadcast_budgets_edges_and_rejections() {
    need_device!();
    let inf = f32::INFINITY;
    let counts = DBuf::from(&[2i32, 1]);
    let mark = |counts: *const i32, idx: &[i32]| -> (i32, Vec<f32>) {
        let (sd, id) = (DBuf::from(&[0.5f32; 2 * 6]), DBuf::from(idx));
        // SAFETY: device buffers of the declared sizes (2 rows of 6, lists of stride 4).
        let rc = unsafe { kve_cuda_mark_forced(sd.ptr(), 6, 2, counts, id.ptr(), 4, null_mut()) };
        (rc, sd.download())
    };
    let idx = [0i32, 5, 0, 0, 3, 0, 0, 0];
    let (rc, s) = mark(counts.ptr(), &idx);
    ck(rc, "mark_forced");
    assert_eq!(
        s,
        vec![inf, 0.5, 0.5, 0.5, 0.5, inf, 0.5, 0.5, 0.5, inf, 0.5, 0.5]
    );
    // positions outside the row are skipped
    let (rc, s) = mark(counts.ptr(), &[-1, 6, 0, 0, 3, 0, 0, 0]);
    ck(rc, "mark_forced, positions outside");
    assert!(
        s[..6].iter().all(|&v| v == 0.5),
        "mark_forced: outside marked"
    );
    assert_eq!(s[6 + 3], inf);
    // a negative count marks none
    let neg = DBuf::from(&[-3i32, 1]);
    let (rc, s) = mark(neg.ptr(), &idx);
    ck(rc, "mark_forced, negative count");
    assert_eq!(s.iter().filter(|v| v.is_infinite()).count(), 1);
    // no counts: refused, nothing written
    let (rc, s) = mark(null(), &idx);
    assert_eq!(rc, INVALID, "mark_forced without counts");
    assert!(s.iter().all(|&v| v == 0.5), "mark_forced refused: written");

    // broadcast: two source rows, three copies each; the slots past a count untouched
    let (sc, si) = (DBuf::from(&[2i32, 0]), DBuf::from(&[4i32, 7, -1, 9, 9, 9]));
    let (c, i) = (DBuf::from(&[-1i32; 6]), DBuf::from(&[-1i32; 6 * 3]));
    // SAFETY: device buffers of the declared sizes.
    let rc = unsafe {
        kve_cuda_broadcast_lists(sc.ptr(), si.ptr(), 3, 2, 3, c.ptr(), i.ptr(), 3, null_mut())
    };
    ck(rc, "broadcast_lists");
    assert_eq!(c.download(), vec![2, 2, 2, 0, 0, 0]);
    let got = i.download();
    for u in 0..3 {
        assert_eq!(&got[u * 3..u * 3 + 3], &[4, 7, -1]);
    }
    assert!(got[9..].iter().all(|&v| v == -1));
    // outputs over the sources, reps < 0: refused, nothing written
    let sc2 = DBuf::from(&[2i32, 0, -1, -1, -1, -1]);
    let i = DBuf::from(&[-1i32; 6 * 3]);
    let (c2, sip) = (sc2.ptr(), si.ptr());
    for (what, src_c, src_i, reps, out_c) in [
        (
            "counts over the source counts",
            c2 as *const i32,
            sip as *const i32,
            3,
            c2,
        ),
        (
            "counts over the source lists",
            sip as *const i32,
            c2 as *const i32,
            3,
            c2,
        ),
        (
            "reps < 0",
            sc.ptr() as *const i32,
            sip as *const i32,
            -1,
            c2,
        ),
    ] {
        // SAFETY: device buffers of the declared sizes; refused before any is touched.
        let rc = unsafe {
            kve_cuda_broadcast_lists(src_c, src_i, 3, 2, reps, out_c, i.ptr(), 3, null_mut())
        };
        assert_eq!(rc, INVALID, "broadcast_lists: {what}");
    }
    assert_eq!(sc2.download(), vec![2, 0, -1, -1, -1, -1]);
    assert!(i.download().iter().all(|&v| v == -1));

    // budgets: bad mode, lava without weights, pyramid beta 0, alpha out of range,
    // per_layer 0 (even without layers), layers < 0, layers·per_layer·p >= 2^62
    let (kl, ku) = (DBuf::from(&[-1i64; 3]), DBuf::from(&[-1i64; 6]));
    let budgets = |mode, layers, per, p, beta, alpha, kl: *mut i64, ku: *mut i64| {
        // SAFETY: device buffers of 3 and 6 entries (the shapes that pass the checks).
        unsafe {
            kve_cuda_layer_budgets(
                mode,
                null(),
                layers,
                per,
                p,
                4,
                beta,
                alpha,
                kl,
                ku,
                null_mut(),
            )
        }
    };
    for (mode, layers, per, p, beta, alpha) in [
        (4, 3, 2, 10, 20, 0.2f32),
        (KVE_CUDA_BUDGET_LAVA, 3, 2, 10, 20, 0.2),
        (KVE_CUDA_BUDGET_PYRAMID, 3, 2, 10, 0, 0.2),
        (KVE_CUDA_BUDGET_ADA, 3, 2, 10, 20, 1.5),
        (KVE_CUDA_BUDGET_ADA, 3, 2, 10, 20, f32::NAN),
        (KVE_CUDA_BUDGET_UNIFORM, 3, 0, 10, 20, 0.2),
        (KVE_CUDA_BUDGET_UNIFORM, 0, 0, 10, 20, 0.2),
        (KVE_CUDA_BUDGET_UNIFORM, -1, 2, 10, 20, 0.2),
        (KVE_CUDA_BUDGET_UNIFORM, 4, 1 << 30, 1 << 30, 20, 0.2),
    ] {
        let rc = budgets(mode, layers, per, p, beta, alpha, kl.ptr(), ku.ptr());
        assert_eq!(
            rc, INVALID,
            "layer_budgets mode {mode} layers {layers} per {per}"
        );
    }
    assert!(kl.download().iter().all(|&v| v == -1) && ku.download().iter().all(|&v| v == -1));
    // no layers: nothing to do
    let rc = budgets(
        KVE_CUDA_BUDGET_UNIFORM,
        0,
        2,
        10,
        20,
        0.2,
        null_mut(),
        null_mut(),
    );
    ck(rc, "layer_budgets without layers");
    // pyramid against the core's formula; k_unit may be NULL
    let rc = budgets(
        KVE_CUDA_BUDGET_PYRAMID,
        3,
        2,
        10,
        20,
        0.2,
        kl.ptr(),
        null_mut(),
    );
    ck(rc, "layer_budgets pyramid");
    let got = kl.download();
    for l in 0..3 {
        let want = 2 * kvevict::budget::pyramid_budget(4, 20, l, 3).min(10) as i64;
        assert_eq!(got[l], want, "pyramid layer {l}");
    }
}

#[test]
fn append_range_matches_reference() {
    need_device!();
    let mut rng = Rng::new(47);
    let (rows, ld, start, count) = (300usize, 80usize, 50usize, 30usize);
    // prefix lists of up to ld - count entries (the caller's guarantee), one empty
    let (mut idx, mut counts) = random_lists(&mut rng, rows, ld - count, ld);
    counts[0] = 0;
    let (di, dc) = (DBuf::from(&idx), DBuf::from(&counts));
    ck(
        unsafe {
            kve_cuda_append_range(
                dc.ptr(),
                di.ptr(),
                ld as i64,
                rows as i64,
                start as i64,
                count as i64,
                null_mut(),
            )
        },
        "append_range",
    );
    for r in 0..rows {
        let c = counts[r] as usize;
        for t in 0..count {
            idx[r * ld + c + t] = (start + t) as i32;
        }
        counts[r] += count as i32;
    }
    assert_eq!(dc.download(), counts, "append_range counts");
    assert_eq!(di.download(), idx, "append_range lists");
}

#[test]
fn layer_budgets_match_core_exactly() {
    need_device!();
    let mut rng = Rng::new(44);
    // (layers, per_layer, p, budget, beta, alpha)
    let cases: &[(usize, usize, u64, u64, u32, f32)] = &[
        (32, 8, 4000, 400, 20, 0.2),
        (1, 4, 100, 1000, 20, 0.5),
        (7, 3, 1 << 40, (1 << 39) + 12345, 3, 1.0),
        (5, 2, 50, 45, 1, 0.0),
        (12, 1, 1000, u64::MAX, 20, 0.3),
        (3, 5, 0, 10, 20, 0.2),
        (4, 8, 64, 0, 7, 0.2),
        (9, 4, 333, 100, 2, 0.7),
        (6, 1, 1 << 50, u64::MAX, 20, 0.25),
    ];
    for (ci, &(layers, per, p, budget, beta, alpha)) in cases.iter().enumerate() {
        // entropies: random, a zero, a negative (counts as 0); case 3 all zero (equal
        // split); case 7 skewed (one layer hits its cap, the excess moves on)
        let weights: Vec<f64> = (0..layers)
            .map(|l| match (ci, l) {
                (3, _) => 0.0,
                (7, 0) => 1e3,
                (_, 1) => 0.0,
                (_, 2) => -1.0,
                _ => 3.0 * rng.unif() as f64 + rng.unif() as f64 * 1e-7,
            })
            .collect();
        let wd = DBuf::from(&weights);
        for mode in [
            KVE_CUDA_BUDGET_UNIFORM,
            KVE_CUDA_BUDGET_PYRAMID,
            KVE_CUDA_BUDGET_ADA,
            KVE_CUDA_BUDGET_LAVA,
        ] {
            let (want_l, want_u) =
                core_budgets(mode, &weights, layers, per, p, budget, beta, alpha);
            for with_units in [true, false] {
                let kl = DBuf::from(&vec![-1i64; layers]);
                let ku = DBuf::from(&vec![-1i64; layers * per]);
                ck(
                    unsafe {
                        kve_cuda_layer_budgets(
                            mode,
                            if mode == KVE_CUDA_BUDGET_LAVA {
                                wd.ptr()
                            } else {
                                null()
                            },
                            layers as i64,
                            per as i64,
                            p as i64,
                            budget,
                            beta,
                            alpha,
                            kl.ptr(),
                            if with_units { ku.ptr() } else { null_mut() },
                            null_mut(),
                        )
                    },
                    "layer_budgets",
                );
                let what = format!(
                    "layer_budgets mode {mode} layers {layers} per {per} p {p} budget {budget} beta {beta} alpha {alpha}"
                );
                assert_eq!(kl.download(), want_l, "{what}: k_layer");
                let units = ku.download();
                if with_units {
                    assert_eq!(units, want_u, "{what}: k_unit");
                } else {
                    assert!(
                        units.iter().all(|&u| u == -1),
                        "{what}: k_unit NULL written"
                    );
                }
            }
        }
    }
    // capturable: LAVa budgets in a CUDA graph, replayed twice
    let (layers, per, p) = (8usize, 4usize, 500u64);
    let weights: Vec<f64> = (0..layers).map(|_| rng.unif() as f64).collect();
    let wd = DBuf::from(&weights);
    let (kl, ku) = (
        DBuf::from(&vec![-1i64; layers]),
        DBuf::from(&vec![-1i64; layers * per]),
    );
    in_graph(&|s| {
        ck(
            unsafe {
                kve_cuda_layer_budgets(
                    KVE_CUDA_BUDGET_LAVA,
                    wd.ptr(),
                    layers as i64,
                    per as i64,
                    p as i64,
                    100,
                    20,
                    0.2,
                    kl.ptr(),
                    ku.ptr(),
                    s,
                )
            },
            "layer_budgets in a graph",
        )
    });
    let (want_l, want_u) =
        core_budgets(KVE_CUDA_BUDGET_LAVA, &weights, layers, per, p, 100, 20, 0.2);
    assert_eq!(kl.download(), want_l, "graph k_layer");
    assert_eq!(ku.download(), want_u, "graph k_unit");
}

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
    need_device!();
    let mut rng = Rng::new(10);
    // the row_lse path in a CUDA graph: replays equal the eager run
    let (hq, hkv, w, n, d) = (4usize, 2usize, 8usize, 300usize, 64usize);
    let p = n - w;
    let q = Tensor::new(Dt::Bf16, Layout::HeadMajor, [hq, w, d], &mut || {
        rng.normal()
    });
    let k = Tensor::new(Dt::Bf16, Layout::TokenMajor, [hkv, n, d], &mut || {
        rng.normal()
    });
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
    need_device!();
    let mut rng = Rng::new(9);
    let (hq, hkv, w, n, d) = (8usize, 2usize, 16usize, 600usize, 64usize);
    let p = n - w;
    let dt = Dt::Bf16;
    let q = Tensor::new(dt, Layout::HeadMajor, [hq, w, d], &mut || rng.normal());
    let k = Tensor::new(dt, Layout::HeadMajor, [hkv, n, d], &mut || rng.normal());
    let v = Tensor::new(dt, Layout::HeadMajor, [hkv, n, d], &mut || rng.normal());
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
    let shape = kvevict::LayerShape::from_dims(hq as u64, hkv as u64, n as u64, d as u64, d as u64)
        .expect("shape");
    let wsb = kvevict::device::score_workspace_size(&cfg, &shape).expect("workspace");
    let ws = DBuf::<u8>::new(wsb);
    let inputs = kvevict::device::score::LayerInputs {
        queries: Some(q.device()),
        keys: Some(k.device()),
        values: Some(v.device()),
        gram: kvevict::device::Floats {
            ptr: gd.ptr(),
            len: gram.len() as u64,
        },
        value_forms: kvevict::device::Floats::NONE,
        value_l1: kvevict::device::Floats::NONE,
        row_lse: kvevict::device::Floats::NONE,
    };
    // SAFETY: a pure host function of the group count.
    let swsb = unsafe { kve_cuda_select_workspace_size(1) };
    let sws = DBuf::<u8>::new(swsb);
    let score = poisoned(hkv * p);
    let counts = DBuf::from(&vec![-1i32; hkv]);
    let idx = DBuf::from(&vec![-1i32; hkv * p]);
    let kk = (hkv * p / 10) as i64;
    // SAFETY: device tensors and buffers of the declared sizes.
    let run = |s: *mut c_void| unsafe {
        kvevict::device::score_layer(
            &cfg,
            &inputs,
            score.ptr(),
            (hkv * p) as u64,
            ws.vptr(),
            wsb as u64,
            s,
        )
        .expect("device score_layer");
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

// --------------------------------- scorer and selection pipelines against the core --

/// Scores `[Hkv][P]` of one layer from the CPU core.
fn core_scores(
    preset: kvevict::Preset,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    gram: Option<&[f32]>,
    w: usize,
) -> Vec<f32> {
    let mut cfg = kvevict::ScoreConfig::preset(preset);
    cfg.window = w as u32;
    core_scores_with(&cfg, q, k, v, gram)
}

/// Scores `[Hkv][P]` of one layer from the CPU core under `cfg`.
fn core_scores_with(
    cfg: &kvevict::ScoreConfig,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    gram: Option<&[f32]>,
) -> Vec<f32> {
    let inputs = kvevict::LayerInputs {
        queries: Some(q.core_view()),
        keys: Some(k.core_view()),
        values: Some(v.core_view()),
        gram,
        ..Default::default()
    };
    let shape = kvevict::layer_shape(cfg, &inputs).expect("layer_shape");
    let mut out = vec![0f32; kvevict::score_len(cfg, &shape).unwrap()];
    let mut ws = vec![0u8; kvevict::score_workspace_size(cfg, &shape).unwrap()];
    kvevict::score_layer(cfg, &inputs, &mut out, &mut ws).expect("score_layer");
    out
}

/// f64 reference of the three scorer presets (SPEC §3) on one layer:
/// LaProx (avg 7 on ||A||, times sqrt(v G vᵀ), group sum), SnapKV (max 7 on the
/// mean, group mean), LAVa (max 7 on the mean, times max_k ||V_k||_1, group max).
fn ref_scores(which: &str, q: &Tensor, k: &Tensor, v: &Tensor, gram: &[f32], w: usize) -> Vec<f64> {
    let (hq, hkv, n, dv) = (q.ext[0], k.ext[0], k.ext[1], v.ext[2]);
    let (g, p) = (hq / hkv, n - w);
    let a = window_attention(q, k, w).data;
    let mut out = vec![0f64; hkv * p];
    for hk in 0..hkv {
        let c: f64 = (0..p)
            .map(|i| (0..dv).map(|d| v.at(hk, i, d).abs()).sum::<f64>())
            .fold(0.0, f64::max);
        let mut per_head = Vec::new();
        for hh in 0..g {
            let h = hk * g + hh;
            let col = |f: &dyn Fn(f64) -> f64| -> Vec<f64> {
                (0..p)
                    .map(|i| (0..w).map(|j| f(a[(h * w + j) * n + i])).sum::<f64>())
                    .collect()
            };
            let s: Vec<f64> = match which {
                "laprox" => {
                    let l2: Vec<f64> = col(&|x| x * x).iter().map(|x| x.sqrt()).collect();
                    let pooled = ref_pool(&l2, KVE_CUDA_POOL_AVG, 7, 1.0);
                    (0..p)
                        .map(|i| {
                            let mut qf = 0f64;
                            for r in 0..dv {
                                for cc in 0..dv {
                                    qf += v.at(hk, i, r)
                                        * gram[(h * dv + r) * dv + cc] as f64
                                        * v.at(hk, i, cc);
                                }
                            }
                            pooled[i] * qf.max(0.0).sqrt()
                        })
                        .collect()
                }
                _ => {
                    let mean: Vec<f64> = col(&|x| x).iter().map(|x| x / w as f64).collect();
                    let pooled = ref_pool(&mean, KVE_CUDA_POOL_MAX, 7, 1.0);
                    if which == "lava" {
                        pooled.iter().map(|x| x * c).collect()
                    } else {
                        pooled
                    }
                }
            };
            per_head.push(s);
        }
        for i in 0..p {
            let xs: Vec<f64> = per_head.iter().map(|s| s[i]).collect();
            out[hk * p + i] = match which {
                "laprox" => gqa(KVE_CUDA_GQA_SUM, &xs),
                "lava" => gqa(KVE_CUDA_GQA_MAX, &xs),
                _ => gqa(KVE_CUDA_GQA_MEAN, &xs),
            };
        }
    }
    out
}

/// The core's kept prefix positions per (layer, head) for a global or uniform selection.
fn core_select(
    scores: &[f32],
    layers: usize,
    hkv: usize,
    p: usize,
    global: bool,
    budget: u64,
) -> Vec<Vec<i32>> {
    use kvevict::{AllocatorKind, Granularity, ModelScores, SelectConfig};
    let alloc = if global {
        AllocatorKind::Global
    } else {
        AllocatorKind::Uniform
    };
    let cfg = SelectConfig::new(alloc, Granularity::Head, budget);
    let window = 1; // the core appends the window's positions; we read only i < p
    let n = p + window;
    let m = ModelScores {
        scores,
        layers,
        hkv,
        n,
        window,
    };
    let (no, ni) = kvevict::select_output_len(&cfg, layers, hkv, n, window).unwrap();
    let mut off = vec![0u64; no];
    let mut idx = vec![0u32; ni];
    let mut ws = vec![0u8; kvevict::select_workspace_size(&cfg, layers, hkv, n, window).unwrap()];
    kvevict::select_model(&cfg, &m, &mut off, &mut idx, &mut ws).expect("select_model");
    (0..layers * hkv)
        .map(|u| {
            idx[off[u] as usize..off[u + 1] as usize]
                .iter()
                .filter(|&&i| (i as usize) < p)
                .map(|&i| i as i32)
                .collect()
        })
        .collect()
}

fn layer_sums(s: &[f32], layers: usize, per_layer: usize) -> Vec<f64> {
    (0..layers)
        .map(|l| {
            s[l * per_layer..(l + 1) * per_layer]
                .iter()
                .map(|&x| (x as f64).abs())
                .sum()
        })
        .collect()
}

/// CPU only (runs without a GPU): the f64 references of this file agree with the
/// core, so a GPU run that matches them also matches the core.
#[test]
fn references_agree_with_core_on_cpu() {
    let mut rng = Rng::new(20);
    for &(hq, hkv, w, n, d) in &[(4usize, 2usize, 6usize, 90usize, 16usize), (3, 1, 4, 50, 8)] {
        let q = Tensor::host(Dt::F32, Layout::HeadMajor, [hq, w, d], &mut || {
            2.0 * rng.normal()
        });
        let k = Tensor::host(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
            rng.normal()
        });
        let v = Tensor::host(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
            rng.normal()
        });
        let gram = core_gram(&mut rng, hq, hkv, d, 24);
        for (name, preset) in [
            ("laprox", kvevict::Preset::LaProx),
            ("snapkv", kvevict::Preset::SnapKv),
            ("lava", kvevict::Preset::Lava),
        ] {
            let core = core_scores(preset, &q, &k, &v, Some(&gram), w);
            let want = ref_scores(name, &q, &k, &v, &gram, w);
            assert_close(
                &format!("core vs f64 reference: {name} hq{hq} hkv{hkv}"),
                &core,
                &want,
                1e-4,
            );
        }
    }
    // KNorm and StreamingLLM (no attention): the references of the baseline launchers
    for &(hkv, n, d, w) in &[(2usize, 60usize, 16usize, 5usize), (3, 33, 7, 1)] {
        let (hq, p) = (hkv, n - w);
        let q = Tensor::host(Dt::F32, Layout::HeadMajor, [hq, w, d], &mut || rng.normal());
        let k = Tensor::host(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
            rng.normal()
        });
        let v = Tensor::host(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
            rng.normal()
        });
        let core = core_scores(kvevict::Preset::KNorm, &q, &k, &v, None, w);
        assert_close(
            "core vs f64 reference: knorm",
            &core,
            &ref_knorm(&k, p),
            1e-6,
        );
        assert_eq!(core, core_knorm(&k, p), "core_knorm helper");
        let core = core_scores(kvevict::Preset::StreamingLlm, &q, &k, &v, None, w);
        let sinks = kvevict::ScoreConfig::preset(kvevict::Preset::StreamingLlm).sinks as usize;
        assert_eq!(
            core,
            ref_sinks(hkv, p, sinks)
                .iter()
                .map(|&x| x as f32)
                .collect::<Vec<f32>>(),
            "core vs reference: streaming sinks"
        );
    }
    // row LSE: this file's f64 reference == the core's window_row_lse
    for &(hq, hkv, w, n, d) in &[(4usize, 2usize, 6usize, 90usize, 16usize), (3, 1, 4, 50, 8)] {
        let q = Tensor::host(Dt::F32, Layout::HeadMajor, [hq, w, d], &mut || {
            2.0 * rng.normal()
        });
        let k = Tensor::host(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
            rng.normal()
        });
        let shape = kvevict::LayerShape {
            hq,
            hkv,
            n,
            dk: d,
            dv: d,
        };
        let mut ws = vec![0u8; kvevict::window_row_lse_workspace_size(&shape, w as u32).unwrap()];
        let mut core = vec![0f32; hq * w];
        kvevict::window_row_lse(&q.core_view(), &k.core_view(), w as u32, &mut core, &mut ws)
            .expect("window_row_lse");
        assert_close(
            &format!("core vs f64 reference: row lse hq{hq} hkv{hkv}"),
            &core,
            &ref_row_lse(&q, &k, w),
            1e-6,
        );
    }
    // selection: this file's reference rule == the core's (global with layer sums, uniform)
    for &(layers, hkv, p) in &[(3usize, 2usize, 200usize), (2, 4, 31)] {
        for ties in [false, true] {
            let s: Vec<f32> = (0..layers * hkv * p)
                .map(|_| {
                    if ties {
                        rng.below(5) as f32
                    } else {
                        rng.unif()
                    }
                })
                .collect();
            let budget = 1 + rng.below(p) as u64;
            let sums = layer_sums(&s, layers, hkv * p);
            let core = core_select(&s, layers, hkv, p, true, budget);
            let want = ref_select(
                &s,
                p,
                1,
                layers * hkv,
                &[(layers * hkv) as i64 * budget as i64],
                Some((&sums, hkv)),
            );
            assert_eq!(core, want, "global select: core vs reference (ties {ties})");
            let core = core_select(&s, layers, hkv, p, false, budget);
            let ks = vec![budget as i64; layers * hkv];
            let want = ref_select(&s, p, layers * hkv, 1, &ks, None);
            assert_eq!(
                core, want,
                "uniform select: core vs reference (ties {ties})"
            );
        }
    }
}

/// The device pipeline (`kvevict::device::score_layer`, the chain of launches the C entry
/// point enqueues) against the core's score_layer on the same inputs, for SnapKV (and
/// kvpress's reduce-before-pool), LAVa and LaProx (sum, product placement, exact GQA and
/// mean-attention, with cross Gram blocks): within 2e-3 of the core, and on the mock
/// in f32 equal to it bit for bit. Shapes: one per dtype with K token-major and V transposed
/// (llama.cpp), and four f32 head-major ones.
#[test]
fn device_scores_match_core() {
    use kvevict::{LaproxGqa, PoolPlacement, Preset, ScoreConfig};
    need_device!();
    let mut rng = Rng::new(21);
    let mut cases: Vec<(Dt, [usize; 5], Layout, Layout)> = DTYPES
        .into_iter()
        .map(|dt| {
            (
                dt,
                [8, 2, 400, 12, 64],
                Layout::TokenMajor,
                Layout::Transposed,
            )
        })
        .collect();
    for sh in [
        [4, 2, 90, 10, 16],
        [6, 3, 130, 24, 32],
        [2, 2, 50, 7, 8],
        [8, 2, 77, 4, 24],
    ] {
        cases.push((Dt::F32, sh, Layout::HeadMajor, Layout::HeadMajor));
    }
    let laprox = ScoreConfig::preset(Preset::LaProx);
    let exact = ScoreConfig {
        laprox_gqa: LaproxGqa::Exact,
        ..laprox
    };
    let mean_attn = ScoreConfig {
        laprox_gqa: LaproxGqa::MeanAttn,
        ..laprox
    };
    let configs: [(&str, ScoreConfig); 9] = [
        // cubed after the chain (kve_cuda_score_power)
        ("laprox-span", ScoreConfig::preset(Preset::LaProxSpan)),
        ("snapkv", ScoreConfig::preset(Preset::SnapKv)),
        (
            "snapkv reduce-before-pool",
            ScoreConfig {
                reduce_before_pool: true,
                ..ScoreConfig::preset(Preset::SnapKvKvpress)
            },
        ),
        ("lava", ScoreConfig::preset(Preset::Lava)),
        ("laprox sum", laprox),
        (
            "laprox product",
            ScoreConfig {
                placement: PoolPlacement::Product,
                ..laprox
            },
        ),
        ("laprox exact", exact),
        ("laprox mean-attn", mean_attn),
        (
            "laprox mean-attn product",
            ScoreConfig {
                placement: PoolPlacement::Product,
                ..mean_attn
            },
        ),
    ];
    for (dt, [hq, hkv, n, w, d], kl, vl) in cases {
        let p = n - w;
        let q = Tensor::new(dt, Layout::HeadMajor, [hq, w, d], &mut || {
            2.0 * rng.normal()
        });
        let k = Tensor::new(dt, kl, [hkv, n, d], &mut || rng.normal());
        let v = Tensor::new(dt, vl, [hkv, n, d], &mut || rng.normal());
        let grams = [
            core_gram_of(&mut rng, hq, hkv, d, 48, false),
            core_gram_of(&mut rng, hq, hkv, d, 48, true),
        ];
        let gds = [DBuf::from(&grams[0]), DBuf::from(&grams[1])];
        for (name, cfg) in &configs {
            let cfg = ScoreConfig {
                window: w as u32,
                ..*cfg
            };
            let cross = cfg.laprox_gqa != LaproxGqa::Sum;
            let (gram, gd) = (&grams[cross as usize], &gds[cross as usize]);
            let shape =
                kvevict::LayerShape::from_dims(hq as u64, hkv as u64, n as u64, d as u64, d as u64)
                    .expect("shape");
            let wsb = kvevict::device::score_workspace_size(&cfg, &shape).expect("workspace");
            let ws = DBuf::<u8>::new(wsb);
            let inputs = kvevict::device::score::LayerInputs {
                queries: Some(q.device()),
                keys: Some(k.device()),
                values: Some(v.device()),
                gram: kvevict::device::Floats {
                    ptr: gd.ptr(),
                    len: gram.len() as u64,
                },
                value_forms: kvevict::device::Floats::NONE,
                value_l1: kvevict::device::Floats::NONE,
                row_lse: kvevict::device::Floats::NONE,
            };
            let out = poisoned(hkv * p);
            let tag = format!("device vs core: {name} {dt:?} hq{hq} hkv{hkv} n{n} w{w} d{d}");
            // SAFETY: device tensors and buffers of the declared sizes.
            unsafe {
                kvevict::device::score_layer(
                    &cfg,
                    &inputs,
                    out.ptr(),
                    (hkv * p) as u64,
                    ws.vptr(),
                    wsb as u64,
                    null_mut(),
                )
            }
            .unwrap_or_else(|e| panic!("{tag}: {e:?}"));
            let core = core_scores_with(&cfg, &q, &k, &v, Some(gram));
            let got = out.download();
            let want: Vec<f64> = core.iter().map(|&x| x as f64).collect();
            assert_close(&tag, &got, &want, 2e-3);
            // (16-bit V: the device splits G into hi + lo parts, the core keeps it in f32)
            if MOCK && dt == Dt::F32 {
                assert_eq!(
                    got, core,
                    "{tag}: the mock's chain is the core's arithmetic"
                );
            }
        }
    }
}

/// The device selection (`kvevict::device::select_model`: layer sums, budgets, top-K as
/// the C entry point enqueues them) against the core's select_model (global with layer
/// sums; uniform): identical kept sets expected (exactly on the mock); overlap printed.
#[test]
fn device_select_matches_core() {
    need_device!();
    let mut rng = Rng::new(22);
    let (layers, hkv, p) = (6usize, 4usize, 3000usize);
    let rows = layers * hkv;
    // one window token per unit: the device lists end with it, the comparison reads i < p
    let n = p + 1;
    for global in [true, false] {
        let s: Vec<f32> = (0..rows * p).map(|_| rng.unif() * rng.unif()).collect();
        let budget = 1 + rng.below(p / 3) as u64;
        let core = core_select(&s, layers, hkv, p, global, budget);
        let alloc = if global {
            kvevict::AllocatorKind::Global
        } else {
            kvevict::AllocatorKind::Uniform
        };
        let cfg = kvevict::SelectConfig::new(alloc, kvevict::Granularity::Head, budget);
        let m = kvevict::ModelShape::new(layers as u64, hkv as u64, n as u64, 1).expect("shape");
        let sd = DBuf::from(&s);
        let wsb = kvevict::device::select_workspace_size(&cfg, &m).expect("workspace");
        let ws = DBuf::<u8>::new(wsb);
        let counts = DBuf::from(&vec![-1i32; rows]);
        let idx = DBuf::from(&vec![-1i32; rows * n]);
        let lists = kvevict::device::select::KeptLists {
            counts: counts.ptr(),
            counts_len: rows as u64,
            idx: idx.ptr(),
            idx_ld: n as u64,
            idx_len: (rows * n) as u64,
        };
        // SAFETY: device buffers of the declared sizes.
        unsafe {
            kvevict::device::select_model(
                &cfg,
                &m,
                sd.ptr(),
                s.len() as u64,
                &lists,
                ws.vptr(),
                wsb as u64,
                null_mut(),
            )
        }
        .expect("device select_model");
        let (gc, gi) = (counts.download(), idx.download());
        // the prefix part of each list
        let gc: Vec<i32> = (0..rows)
            .map(|r| {
                gi[r * n..r * n + gc[r] as usize]
                    .iter()
                    .filter(|&&i| (i as usize) < p)
                    .count() as i32
            })
            .collect();
        let gi: Vec<i32> = (0..rows)
            .flat_map(|r| {
                let mut row = gi[r * n..r * n + p].to_vec();
                row.truncate(gc[r] as usize);
                row.resize(p, -1);
                row
            })
            .collect();
        let (mut both, mut total) = (0usize, 0usize);
        let mut exact = true;
        for r in 0..rows {
            let got: std::collections::BTreeSet<i32> =
                gi[r * p..r * p + gc[r] as usize].iter().cloned().collect();
            let want: std::collections::BTreeSet<i32> = core[r].iter().cloned().collect();
            both += got.intersection(&want).count();
            total += want.len();
            exact &= got == want;
        }
        let overlap = both as f64 / total.max(1) as f64;
        println!("device vs core select (global {global}, budget {budget}): overlap {overlap:.6}, exact {exact}");
        assert!(
            exact || !MOCK,
            "the mock's kept sets differ from the core's"
        );
        assert_eq!(
            gc.iter().map(|&c| c as usize).sum::<usize>(),
            total,
            "kept count"
        );
        assert!(overlap >= 0.999, "overlap {overlap}");
    }
}

/// CPU + GPU split of one model-wide selection (SPEC §4 "Selection across devices"):
/// layers [0, split) on the GPU (kve_cuda_shard_count / _select), the rest on the CPU
/// (the core's count_shard / select_shard), histograms added on the host, the core's
/// ShardSearch stepping. Must equal select_model over the whole model exactly.
#[test]
fn gpu_and_cpu_shards_match_select_model() {
    need_device!();
    use kvevict::shard::{
        count_shard, search_new, select_shard, shard_output_len, shard_workspace_size,
    };
    use kvevict::{AllocatorKind, Granularity, ModelScores, SelectConfig};
    let mut rng = Rng::new(23);
    for &(layers, hkv, p, split) in &[(5usize, 3usize, 700usize, 2usize), (2, 2, 40, 1)] {
        for ties in [false, true] {
            let (window, n) = (1usize, p + 1);
            let s: Vec<f32> = (0..layers * hkv * p)
                .map(|_| {
                    if ties {
                        rng.below(6) as f32 * 0.5
                    } else {
                        rng.unif()
                    }
                })
                .collect();
            let budget = 1 + rng.below(p) as u64;
            let cfg = SelectConfig::new(AllocatorKind::Global, Granularity::Head, budget);
            let mut search = search_new(&cfg, layers, hkv, n, window).unwrap();
            let gpu_rows = split * hkv;
            let sd = DBuf::from(&s[..gpu_rows * p]);
            let lsd = DBuf::from(&layer_sums(&s[..gpu_rows * p], split, hkv * p));
            let hist = DBuf::<u64>::new(256);
            let cpu = ModelScores {
                scores: &s[gpu_rows * p..],
                layers: layers - split,
                hkv,
                n,
                window,
            };
            let mut ws =
                vec![0u8; shard_workspace_size(&cfg, layers - split, hkv, n, window).unwrap()];
            let mut rounds = 0;
            while !search.done {
                hist.upload(&[0u64; 256]);
                ck(
                    unsafe {
                        kve_cuda_shard_count(
                            sd.ptr(),
                            p as i64,
                            p as i64,
                            gpu_rows as i64,
                            0,
                            lsd.ptr(),
                            hkv as i64,
                            (search.prefix >> 64) as u64,
                            search.prefix as u64,
                            search.bits,
                            hist.ptr(),
                            null_mut(),
                        )
                    },
                    "shard_count",
                );
                let g = hist.download();
                let mut h = kvevict::select::Histogram([0u64; 256]);
                h.0.copy_from_slice(&g);
                count_shard(&cfg, &cpu, split, &search, &mut h, &mut ws).unwrap();
                search.step(&h);
                rounds += 1;
                assert!(rounds <= 13, "search does not end");
            }
            let counts = DBuf::from(&vec![-1i32; gpu_rows]);
            let idx = DBuf::from(&vec![-1i32; gpu_rows * p]);
            ck(
                unsafe {
                    kve_cuda_shard_select(
                        sd.ptr(),
                        p as i64,
                        p as i64,
                        gpu_rows as i64,
                        0,
                        lsd.ptr(),
                        hkv as i64,
                        (search.threshold >> 64) as u64,
                        search.threshold as u64,
                        counts.ptr(),
                        idx.ptr(),
                        p as i64,
                        null_mut(),
                    )
                },
                "shard_select",
            );
            let (no, ni) = shard_output_len(layers - split, hkv, n).unwrap();
            let (mut off, mut cidx) = (vec![0u64; no], vec![0u32; ni]);
            select_shard(&cfg, &cpu, split, &search, &mut off, &mut cidx, &mut ws).unwrap();
            let want = core_select(&s, layers, hkv, p, true, budget);
            let (gc, gi) = (counts.download(), idx.download());
            for r in 0..layers * hkv {
                let got: Vec<i32> = if r < gpu_rows {
                    gi[r * p..r * p + gc[r] as usize].to_vec()
                } else {
                    let u = r - gpu_rows;
                    cidx[off[u] as usize..off[u + 1] as usize]
                        .iter()
                        .filter(|&&i| (i as usize) < p)
                        .map(|&i| i as i32)
                        .collect()
                };
                assert_eq!(
                    got, want[r],
                    "unit {r} (layers {layers}, split {split}, ties {ties}, {rounds} rounds)"
                );
            }
        }
    }
}

/// Two device shards (layers [0, 2) and [2, 5), the second at a unit offset), fed the
/// device's own layer sums, on coarse scores (ties) reproduce the core's global
/// select_model; the threshold KEEP_NOTHING keeps none; bad search states are refused
/// with the histogram untouched.
#[test]
fn two_device_shards_keep_nothing_and_rejections() {
    use kvevict::select::Histogram;
    use kvevict::{AllocatorKind, Granularity, SelectConfig};
    need_device!();
    let mut rng = Rng::new(48);
    let (layers, hkv, p, budget) = (5usize, 2usize, 40usize, 7u64);
    let s: Vec<f32> = (0..layers * hkv * p)
        .map(|_| rng.below(40) as f32 / 7.0)
        .collect();
    let sd = DBuf::from(&s);
    let count = (hkv * p) as i64;
    // SAFETY: a pure host function.
    let wsz = unsafe { kve_cuda_layer_stats_workspace_size(layers as i64, count) };
    let ws = DBuf::<u8>::new(wsz);
    let (sums, ent) = (DBuf::<f64>::new(layers), DBuf::<f64>::new(layers));
    // SAFETY: device buffers of the declared sizes.
    let rc = unsafe {
        kve_cuda_layer_stats(
            sd.ptr(),
            count,
            count,
            layers as i64,
            sums.ptr(),
            ent.ptr(),
            ws.vptr(),
            wsz,
            null_mut(),
        )
    };
    ck(rc, "layer_stats");
    let want = core_select(&s, layers, hkv, p, true, budget);
    let cfg = SelectConfig::new(AllocatorKind::Global, Granularity::Head, budget);
    let mut search = kvevict::shard::search_new(&cfg, layers, hkv, p + 1, 1).unwrap();
    let shards = [(0usize, 2usize), (2, 3)];
    let hist = DBuf::<u64>::new(256);
    let mut rounds = 0;
    while !search.done {
        let mut h = Histogram::default();
        for &(l0, ln) in &shards {
            hist.upload(&[0u64; 256]);
            // SAFETY: the shard's rows and sums inside the device buffers.
            let rc = unsafe {
                kve_cuda_shard_count(
                    sd.ptr().wrapping_add(l0 * hkv * p),
                    p as i64,
                    p as i64,
                    (ln * hkv) as i64,
                    (l0 * hkv) as i64,
                    sums.ptr().wrapping_add(l0),
                    hkv as i64,
                    (search.prefix >> 64) as u64,
                    search.prefix as u64,
                    search.bits,
                    hist.ptr(),
                    null_mut(),
                )
            };
            ck(rc, "shard_count");
            let mut hs = [0u64; 256];
            hs.copy_from_slice(&hist.download());
            h.merge(&Histogram(hs));
        }
        search.step(&h);
        rounds += 1;
        assert!(rounds <= 13, "search does not end");
    }
    let mut got = Vec::new();
    for &(l0, ln) in &shards {
        let rows = ln * hkv;
        let (counts, idx) = (
            DBuf::from(&vec![-1i32; rows]),
            DBuf::from(&vec![-1i32; rows * p]),
        );
        // SAFETY: as above; outputs of `rows` rows.
        let rc = unsafe {
            kve_cuda_shard_select(
                sd.ptr().wrapping_add(l0 * hkv * p),
                p as i64,
                p as i64,
                rows as i64,
                (l0 * hkv) as i64,
                sums.ptr().wrapping_add(l0),
                hkv as i64,
                (search.threshold >> 64) as u64,
                search.threshold as u64,
                counts.ptr(),
                idx.ptr(),
                p as i64,
                null_mut(),
            )
        };
        ck(rc, "shard_select");
        let (gc, gi) = (counts.download(), idx.download());
        for u in 0..rows {
            got.push(gi[u * p..u * p + gc[u] as usize].to_vec());
        }
    }
    assert_eq!(
        got, want,
        "two device shards vs select_model ({rounds} rounds)"
    );
    // KEEP_NOTHING keeps none
    let (counts, idx) = (DBuf::from(&[9i32; 2]), DBuf::from(&vec![0i32; 2 * p]));
    // SAFETY: 2 rows of the device scores.
    let rc = unsafe {
        kve_cuda_shard_select(
            sd.ptr(),
            p as i64,
            p as i64,
            2,
            0,
            null(),
            0,
            u64::MAX,
            u64::MAX,
            counts.ptr(),
            idx.ptr(),
            p as i64,
            null_mut(),
        )
    };
    ck(rc, "shard_select KEEP_NOTHING");
    assert_eq!(counts.download(), vec![0, 0]);
    // bad search states: a prefix without bits, bits not a whole byte or past the key,
    // a prefix wider than its bits
    let hist = DBuf::from(&[3u64; 256]);
    for (hi, lo, bits) in [(0, 5, 0), (0, 0, 4), (0, 0, 104), (0, 256, 8)] {
        // SAFETY: refused before any buffer is touched.
        let rc = unsafe {
            kve_cuda_shard_count(
                sd.ptr(),
                p as i64,
                p as i64,
                2,
                0,
                null(),
                0,
                hi,
                lo,
                bits,
                hist.ptr(),
                null_mut(),
            )
        };
        assert_eq!(rc, INVALID, "shard_count prefix {lo} bits {bits}");
    }
    assert_eq!(
        hist.download(),
        vec![3u64; 256],
        "shard_count refused: histogram written"
    );
}

/// kve_cuda_vonorm in f32 against the core's value forms (`compute_value_forms`, all N
/// tokens; on the mock bit for bit) and its square-root mode; gram_split's hi part is
/// the dtype's rounding of G and hi + lo ~22 bits; 16-bit V with hi/lo Grams is
/// ~f32-accurate; the factor form `||v L||²` (L from the host gram_factor, L Lᵀ = G)
/// equals the forms.
#[test]
fn vonorm_gram_split_and_factor_equal_core() {
    use kvevict::{compute_value_forms, value_forms_len};
    need_device!();
    let mut rng = Rng::new(8);
    let (hq, hkv, n, d) = (4usize, 2usize, 40usize, 24usize);
    let g = hq / hkv;
    let v = Tensor::new(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
        rng.normal()
    });
    let gram = core_gram(&mut rng, hq, hkv, d, hq * d);
    let gd = DBuf::from(&gram);
    let mut forms = vec![0f32; value_forms_len(hq, hkv, n, false).unwrap()];
    compute_value_forms(&v.core_view(), &gram, hq, false, 0, n, &mut forms).unwrap();
    let forms64: Vec<f64> = forms.iter().map(|&x| x as f64).collect();
    let vonorm = |vv: &KveCudaView, hi: *const c_void, lo: *const c_void, sqrt: i32| {
        let out = poisoned(hq * n);
        // SAFETY: device buffers of the documented sizes.
        let rc = unsafe {
            kve_cuda_vonorm(
                vv,
                n as i64,
                hi,
                lo,
                hq as i64,
                sqrt,
                out.ptr(),
                null_stream(),
            )
        };
        ck(rc, "vonorm");
        out.download()
    };
    let got = vonorm(&v.view(), gd.vptr(), null(), 0);
    assert_close("vonorm f32", &got, &forms64, 1e-5);
    let roots = vonorm(&v.view(), gd.vptr(), null(), 1);
    let want: Vec<f64> = forms.iter().map(|f| f.max(0.0).sqrt() as f64).collect();
    assert_close("vonorm f32 sqrt", &roots, &want, 1e-5);
    if MOCK {
        assert_eq!(got, forms, "the core's value forms");
        let exact: Vec<f32> = forms.iter().map(|f| f.max(0.0).sqrt()).collect();
        assert_eq!(roots, exact, "their square roots");
    }
    // f16 V with hi/lo Grams from gram_split
    let v16 = Tensor::new(Dt::F16, Layout::HeadMajor, [hkv, n, d], &mut || {
        rng.normal()
    });
    let (hi, lo) = (DBuf::<u16>::new(gram.len()), DBuf::<u16>::new(gram.len()));
    // SAFETY: device buffers of `gram.len()` elements.
    let rc = unsafe {
        kve_cuda_gram_split(
            gd.ptr(),
            gram.len() as i64,
            KVE_CUDA_F16,
            hi.vptr(),
            lo.vptr(),
            null_stream(),
        )
    };
    ck(rc, "gram_split");
    let (hb, lb) = (hi.download(), lo.download());
    for ((&h, &l), &x) in hb.iter().zip(&lb).zip(&gram) {
        let (h, l) = (f16::from_bits(h), f16::from_bits(l));
        assert_eq!(h, f16::from_f32(x), "hi of {x}");
        // hi + lo: ~22 bits, down to f16's subnormal spacing (6e-8) for lo
        assert!(
            ((h.to_f32() + l.to_f32()) - x).abs() <= 5e-7 * x.abs() + 3e-8,
            "{x}"
        );
    }
    let got = vonorm(&v16.view(), hi.vptr(), lo.vptr(), 0);
    for m in 0..hq {
        for i in 0..n {
            let (mut s, mut mag) = (0f64, 0f64);
            for r in 0..d {
                for c in 0..d {
                    let t = v16.at(m / g, i, r)
                        * gram[(m * d + r) * d + c] as f64
                        * v16.at(m / g, i, c);
                    s += t;
                    mag += t.abs();
                }
            }
            let e = (got[m * n + i] as f64 - s).abs();
            assert!(e <= 2e-6 * mag, "f16 m{m} i{i}: {} vs {s}", got[m * n + i]);
        }
    }
    // the factor form: L from gram_factor (host), ||v L||² = v G vᵀ
    let mut lf = vec![SENTINEL; gram.len()];
    // SAFETY: host arrays of `hq·d·d` floats.
    assert_eq!(
        unsafe { kve_cuda_gram_factor(gram.as_ptr(), hq as i64, d as i64, lf.as_mut_ptr()) },
        0
    );
    for m in 0..hq {
        let b = &lf[m * d * d..(m + 1) * d * d];
        for r in 0..d {
            for c in 0..d {
                if c > r {
                    assert_eq!(b[r * d + c], 0.0);
                }
                let llt: f64 = (0..d)
                    .map(|k| b[r * d + k] as f64 * b[c * d + k] as f64)
                    .sum();
                let gv = gram[m * d * d + r * d + c] as f64;
                let scale = gram[m * d * d + r * d + r].abs().max(1e-6) as f64;
                assert!((llt - gv).abs() <= 1e-5 * scale + 1e-6);
            }
        }
    }
    let ld = DBuf::from(&lf);
    let fo = poisoned(hq * n);
    // SAFETY: device buffers of the documented sizes.
    let rc = unsafe {
        kve_cuda_vonorm_factor(
            &v.view(),
            n as i64,
            ld.vptr(),
            null(),
            hq as i64,
            0,
            fo.ptr(),
            null_stream(),
        )
    };
    ck(rc, "vonorm_factor");
    let fo = fo.download();
    let top = forms.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
    for (k, (&a, &b)) in fo.iter().zip(&forms).enumerate() {
        assert!(
            (a as f64 - b as f64).abs() <= 1e-5 * (b as f64).abs() + 1e-6 * top,
            "factor {k}: {a} vs {b}"
        );
    }
}

/// The host Cholesky factor of a rank-1 PSD Gram (zero pivots give zero columns); a
/// block not PSD, NaN, NULL or d = 0 are refused with nothing written; gram_split refuses
/// a bad dtype or a NULL hi, and its bf16 hi part is the rounding of G.
#[test]
fn gram_factor_rejects_and_zero_columns() {
    let d = 3;
    let u = [1.0f32, 2.0, -1.0];
    let g: Vec<f32> = (0..9).map(|e| u[e / 3] * u[e % 3]).collect();
    let mut l = vec![SENTINEL; 9];
    // SAFETY: host arrays (the factor runs on the host) of the documented sizes.
    unsafe {
        assert_eq!(kve_cuda_gram_factor(g.as_ptr(), 1, d, l.as_mut_ptr()), 0);
        assert_eq!(l, vec![1.0, 0.0, 0.0, 2.0, 0.0, 0.0, -1.0, 0.0, 0.0]);
        let mut g2 = g.clone();
        g2.extend_from_slice(&[1.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 1.0]);
        let mut l2 = vec![SENTINEL; 18];
        assert_eq!(
            kve_cuda_gram_factor(g2.as_ptr(), 2, d, l2.as_mut_ptr()),
            INVALID,
            "not PSD"
        );
        assert!(l2.iter().all(|&v| v == SENTINEL));
        let mut gn = g.clone();
        gn[4] = f32::NAN;
        assert_eq!(
            kve_cuda_gram_factor(gn.as_ptr(), 1, d, l2.as_mut_ptr()),
            INVALID,
            "NaN"
        );
        assert_eq!(
            kve_cuda_gram_factor(null(), 1, d, l2.as_mut_ptr()),
            INVALID,
            "NULL"
        );
        assert_eq!(
            kve_cuda_gram_factor(g.as_ptr(), 1, 0, l2.as_mut_ptr()),
            INVALID,
            "d = 0"
        );
        assert_eq!(
            kve_cuda_gram_factor(null(), 0, d, null_mut()),
            0,
            "no blocks"
        );
        assert!(l2.iter().all(|&v| v == SENTINEL));
    }
    need_device!();
    let gd = DBuf::from(&g);
    let hi = DBuf::from(&[0u16; 9]);
    // SAFETY: device buffers of 9 elements; the refused calls launch nothing.
    unsafe {
        assert_eq!(
            kve_cuda_gram_split(gd.ptr(), 9, 5, hi.vptr(), null_mut(), null_stream()),
            INVALID
        );
        assert_eq!(
            kve_cuda_gram_split(
                gd.ptr(),
                9,
                KVE_CUDA_BF16,
                null_mut(),
                null_mut(),
                null_stream()
            ),
            INVALID
        );
        assert!(hi.download().iter().all(|&v| v == 0));
        ck(
            kve_cuda_gram_split(
                gd.ptr(),
                9,
                KVE_CUDA_BF16,
                hi.vptr(),
                null_mut(),
                null_stream(),
            ),
            "split",
        );
    }
    for (h, &x) in hi.download().iter().zip(&g) {
        assert_eq!(*h, bf16::from_f32(x).to_bits());
    }
}

/// The core's kept lists of every (layer, head) unit, window positions included.
fn core_lists(
    cfg: &kvevict::SelectConfig,
    s: &[f32],
    layers: usize,
    hkv: usize,
    n: usize,
    w: usize,
) -> Vec<Vec<i32>> {
    let m = kvevict::ModelScores {
        scores: s,
        layers,
        hkv,
        n,
        window: w,
    };
    let (no, ni) = kvevict::select_output_len(cfg, layers, hkv, n, w).unwrap();
    let (mut off, mut idx) = (vec![0u64; no], vec![0u32; ni]);
    let mut ws = vec![0u8; kvevict::select_workspace_size(cfg, layers, hkv, n, w).unwrap()];
    kvevict::select_model(cfg, &m, &mut off, &mut idx, &mut ws).expect("select_model");
    (0..layers * hkv)
        .map(|u| {
            idx[off[u] as usize..off[u + 1] as usize]
                .iter()
                .map(|&i| i as i32)
                .collect()
        })
        .collect()
}

/// The device pipeline's kept lists (`kvevict::device::select_model`), row stride n.
fn device_lists(
    cfg: &kvevict::SelectConfig,
    s: &[f32],
    layers: usize,
    hkv: usize,
    n: usize,
    w: usize,
) -> Vec<Vec<i32>> {
    let units = layers * hkv;
    let m = kvevict::ModelShape::new(layers as u64, hkv as u64, n as u64, w as u64).expect("shape");
    let sd = DBuf::from(s);
    let wsb = kvevict::device::select_workspace_size(cfg, &m).expect("workspace");
    let ws = DBuf::<u8>::new(wsb);
    let counts = DBuf::from(&vec![-1i32; units]);
    let idx = DBuf::from(&vec![-1i32; units * n]);
    let lists = kvevict::device::select::KeptLists {
        counts: counts.ptr(),
        counts_len: units as u64,
        idx: idx.ptr(),
        idx_ld: n as u64,
        idx_len: (units * n) as u64,
    };
    // SAFETY: device buffers of the declared sizes.
    unsafe {
        kvevict::device::select_model(
            cfg,
            &m,
            sd.ptr(),
            s.len() as u64,
            &lists,
            ws.vptr(),
            wsb as u64,
            null_mut(),
        )
    }
    .unwrap_or_else(|e| panic!("device select_model {cfg:?}: {e:?}"));
    let (c, x) = (counts.download(), idx.download());
    (0..units)
        .map(|u| x[u * n..u * n + c[u] as usize].to_vec())
        .collect()
}

/// Every allocator the device pipeline runs (uniform, pyramid, global with and without
/// layer-sum normalisation, AdaKV and LAVa with and without the safeguard floor, token
/// granularity with and without post-pooling) on scores with many ties, over shapes with
/// no window, a budget of 0 and one past P: the kept lists are the core's (exactly on the
/// mock; on the kernels at least 99.9 % of them and the same counts).
#[test]
fn device_selections_equal_select_model() {
    use kvevict::{AllocatorKind as A, Granularity, Normalize, Pool, SelectConfig};
    need_device!();
    let mut rng = Rng::new(101);
    for &(layers, hkv, n, w, budget) in &[
        (4usize, 2usize, 40usize, 8usize, 5u64),
        (3, 3, 17, 4, 2),
        (5, 1, 100, 4, 30),
        (2, 4, 64, 0, 64),
        (6, 2, 50, 10, 0),
        (3, 2, 30, 6, 1000),
    ] {
        let p = n - w;
        // a coarse grid: ties everywhere
        let s: Vec<f32> = (0..layers * hkv * p)
            .map(|_| (rng.unif() * 40.0).floor() / 7.0)
            .collect();
        let mut cfgs: Vec<(String, SelectConfig)> = vec![
            (
                "uniform".into(),
                SelectConfig::new(A::Uniform, Granularity::Head, budget),
            ),
            (
                "pyramid".into(),
                SelectConfig::new(A::Pyramid, Granularity::Head, budget),
            ),
        ];
        for norm in [Normalize::LayerSum, Normalize::None] {
            let mut c = SelectConfig::new(A::Global, Granularity::Head, budget);
            c.normalize = norm;
            cfgs.push((format!("global {norm:?}"), c));
        }
        for alpha in [0.0f32, 0.2, 0.5] {
            for a in [A::Ada, A::Lava] {
                let mut c = SelectConfig::new(a, Granularity::Head, budget);
                c.alpha = alpha;
                cfgs.push((format!("{a:?} alpha {alpha}"), c));
            }
        }
        for pooled in [false, true] {
            let mut c = SelectConfig::new(A::Global, Granularity::Token, budget);
            if pooled {
                c.post_pool = Pool::forward(8, 0.9);
            }
            cfgs.push((format!("token pooled {pooled}"), c));
        }
        for (name, cfg) in &cfgs {
            if p == 0 && cfg.granularity == Granularity::Token {
                continue;
            }
            let want = core_lists(cfg, &s, layers, hkv, n, w);
            let got = device_lists(cfg, &s, layers, hkv, n, w);
            let tag = format!("{name}: layers {layers} hkv {hkv} n {n} w {w} budget {budget}");
            if MOCK {
                assert_eq!(got, want, "{tag}");
                continue;
            }
            let total: usize = want.iter().map(|l| l.len()).sum();
            let same: usize = got
                .iter()
                .zip(&want)
                .map(|(g, w)| g.iter().filter(|x| w.contains(x)).count())
                .sum();
            assert_eq!(
                got.iter().map(|l| l.len()).sum::<usize>(),
                total,
                "{tag}: kept count"
            );
            let overlap = same as f64 / total.max(1) as f64;
            println!("{tag}: overlap {overlap:.6}");
            assert!(overlap >= 0.999, "{tag}: overlap {overlap}");
        }
    }
}

/// kve_cuda_layer_stats: per-layer Σ|s| and entropy against the core's (`layer_entropy`;
/// bit for bit on the mock, to 1e-12 on the kernels), a layer of zeros has entropy 0, the
/// entropy alone may be asked for; a row stride below the count, a short workspace or
/// NULL scores are refused with nothing written.
#[test]
fn layer_stats_equal_core() {
    need_device!();
    let mut rng = Rng::new(61);
    let (layers, count, stride) = (5usize, 333usize, 340usize);
    let mut s = rng.vec(layers * stride, 3.0);
    s[2 * stride..2 * stride + count].fill(0.0);
    let sd = DBuf::from(&s);
    // SAFETY: a pure host function of the sizes.
    let wsz = unsafe { kve_cuda_layer_stats_workspace_size(layers as i64, count as i64) };
    let ws = DBuf::<u8>::new(wsz);
    let (sums, ent) = (
        DBuf::from(&vec![-1f64; layers]),
        DBuf::from(&vec![-1f64; layers]),
    );
    let stats = |sp: *const f32, st: usize, sm: *mut f64, en: *mut f64, wsb: usize| {
        // SAFETY: device buffers of the documented sizes, or refused before any launch.
        unsafe {
            kve_cuda_layer_stats(
                sp,
                st as i64,
                count as i64,
                layers as i64,
                sm,
                en,
                ws.vptr(),
                wsb,
                null_stream(),
            )
        }
    };
    ck(
        stats(sd.ptr(), stride, sums.ptr(), ent.ptr(), wsz),
        "layer_stats",
    );
    let (gs, ge) = (sums.download(), ent.download());
    for l in 0..layers {
        let x = &s[l * stride..l * stride + count];
        let (ws_, we) = (
            x.iter().map(|&v| (v as f64).abs()).sum::<f64>(),
            kvevict::budget::layer_entropy(x),
        );
        if MOCK {
            assert_eq!((gs[l], ge[l]), (ws_, we), "layer {l}");
        } else {
            assert!(
                (gs[l] - ws_).abs() <= 1e-12 * ws_ && (ge[l] - we).abs() <= 1e-12 * we.max(1.0),
                "layer {l}"
            );
        }
    }
    assert_eq!(ge[2], 0.0, "a layer of zeros");
    let e2 = DBuf::from(&vec![-1f64; layers]);
    ck(
        stats(sd.ptr(), stride, null_mut(), e2.ptr(), wsz),
        "entropy alone",
    );
    assert_eq!(e2.download(), ge);
    let e3 = DBuf::from(&vec![-1f64; layers]);
    for (st, wsb, sp, what) in [
        (
            count - 1,
            wsz,
            sd.ptr() as *const f32,
            "stride below the count",
        ),
        (stride, wsz - 1, sd.ptr(), "short workspace"),
        (stride, wsz, null(), "NULL scores"),
    ] {
        assert_eq!(stats(sp, st, null_mut(), e3.ptr(), wsb), INVALID, "{what}");
    }
    assert!(
        e3.download().iter().all(|&v| v == -1.0),
        "refused layer_stats wrote"
    );
}

// ------------------------------------------------------------------------ uniqueness --
// The uniqueness scorer (`kvevict::device::score_layer` → `kve_cuda_uniqueness`,
// cuda/uniqueness.cu) against the host scorer on the same stored tensors. The mock
// (src/cuda/mock_uniqueness.rs) runs the kernel's arithmetic, which is the host's AVX2 + FMA
// path: there (with `KVEVICT_PORTABLE` unset) the scores are equal bit for bit. Elsewhere
// the host sums without fusing, and on the kernels the order differs: each head's scores
// agree to 1e-5 of its largest (each cosine within a few ulp; `8·(1 − r)^7·δr` stays far
// below that).

/// Whether the host scorer runs its AVX2 + FMA path (the arithmetic of the kernel).
fn host_fuses() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
            && std::env::var_os("KVEVICT_PORTABLE").is_none()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Keys `[hkv, n, dk]` and values `[hkv, n, dv]` (values of `[h][t][d]`), a third of the
/// tokens near-copies of others in both K and V, so some maxima are near 1 and the scores
/// span decades.
fn twins(rng: &mut Rng, hkv: usize, n: usize, dk: usize, dv: usize) -> (Vec<f32>, Vec<f32>) {
    let mut k: Vec<f32> = (0..hkv * n * dk).map(|_| rng.normal()).collect();
    let mut v: Vec<f32> = (0..hkv * n * dv).map(|_| rng.normal()).collect();
    for _ in 0..n / 3 {
        let (a, b) = (rng.below(n), rng.below(n));
        for h in 0..hkv {
            for (t, d) in [(&mut k, dk), (&mut v, dv)] {
                for c in 0..d {
                    let e = t[(h * n + a) * d + c] * (1.0 + 0.01 * rng.normal());
                    t[(h * n + b) * d + c] = e;
                }
            }
        }
    }
    (k, v)
}

/// The host scorer's uniqueness scores `[Hkv][P]` on the stored layouts of `k` and `v`.
fn host_uniqueness(k: &Tensor, v: &Tensor, w: usize) -> Vec<f32> {
    let cfg = kvevict::ScoreConfig {
        window: w as u32,
        ..kvevict::ScoreConfig::preset(kvevict::Preset::Uniqueness)
    };
    k.with_stored_view(|kv| {
        v.with_stored_view(|vv| {
            let inputs = kvevict::LayerInputs {
                keys: Some(kv),
                values: Some(vv),
                ..Default::default()
            };
            let shape = kvevict::layer_shape(&cfg, &inputs).expect("layer_shape");
            let mut ws = vec![0u8; kvevict::score_workspace_size(&cfg, &shape).unwrap()];
            let mut out = vec![0f32; kvevict::score_len(&cfg, &shape).unwrap()];
            kvevict::score_layer(&cfg, &inputs, &mut out, &mut ws).expect("score_layer");
            out
        })
    })
}

fn uniqueness_cfg(w: usize) -> kvevict::ScoreConfig {
    kvevict::ScoreConfig {
        window: w as u32,
        ..kvevict::ScoreConfig::preset(kvevict::Preset::Uniqueness)
    }
}

/// `kvevict::device::score_layer` (uniqueness) of `k`, `v` into `out` (`out_len` floats)
/// with the workspace `ws`.
fn device_uniqueness(
    k: &kvevict::device::Tensor,
    v: &kvevict::device::Tensor,
    w: usize,
    out: &DBuf<f32>,
    out_len: u64,
    ws: &DBuf<u8>,
) -> kvevict::Result<()> {
    let inputs = kvevict::device::score::LayerInputs {
        queries: None,
        keys: Some(*k),
        values: Some(*v),
        gram: kvevict::device::Floats::NONE,
        value_forms: kvevict::device::Floats::NONE,
        value_l1: kvevict::device::Floats::NONE,
        row_lse: kvevict::device::Floats::NONE,
    };
    // SAFETY: device tensors and buffers of the declared sizes.
    unsafe {
        kvevict::device::score_layer(
            &uniqueness_cfg(w),
            &inputs,
            out.ptr(),
            out_len,
            ws.vptr(),
            ws.len() as u64,
            null_stream(),
        )
    }
}

/// Over dtypes, layouts (K and V apart), windows, `dk != dv`, planted twins and N from 1
/// to a few tiles of 64: the device's scores are the host scorer's (bits or 1e-5, above),
/// and the element past the output stays unwritten.
#[test]
fn uniqueness_matches_host_scorer() {
    need_device!();
    // the mock, and the real kernel on the emulator (host fmaf: the same fused operations)
    let bits = (MOCK || cfg!(feature = "cuda-emu")) && host_fuses();
    let mut rng = Rng::new(29);
    use Layout::*;
    let cases = [
        (Dt::F32, HeadMajor, HeadMajor, 2, 150, 64, 64, 8),
        (Dt::F16, TokenMajor, Transposed, 3, 97, 40, 24, 8),
        (Dt::Bf16, HeadMajor, TokenMajor, 1, 200, 13, 70, 32),
        (Dt::F32, Transposed, HeadMajor, 2, 65, 8, 8, 1),
        (Dt::F16, Padded, Padded, 2, 130, 24, 16, 4),
        (Dt::F16, HeadMajor, HeadMajor, 1, 2, 16, 16, 1),
        (Dt::F32, HeadMajor, HeadMajor, 2, 1, 16, 16, 1),
        (Dt::F32, HeadMajor, HeadMajor, 1, 20, 16, 16, 20),
    ];
    for (dt, kl, vl, hkv, n, dk, dv, w) in cases {
        let (kv, vv) = twins(&mut rng, hkv, n, dk, dv);
        let (mut ki, mut vi) = (kv.into_iter(), vv.into_iter());
        let k = Tensor::new(dt, kl, [hkv, n, dk], &mut || ki.next().unwrap());
        let v = Tensor::new(dt, vl, [hkv, n, dv], &mut || vi.next().unwrap());
        let what = format!("{dt:?} K {kl:?} V {vl:?} hkv {hkv} n {n} dk {dk} dv {dv} w {w}");
        let want = host_uniqueness(&k, &v, w);
        let len = hkv * (n - w.min(n));
        assert_eq!(want.len(), len, "{what}");
        let shape =
            kvevict::LayerShape::from_dims(hkv as u64, hkv as u64, n as u64, dk as u64, dv as u64)
                .expect("shape");
        let wsb = kvevict::device::score_workspace_size(&uniqueness_cfg(w), &shape);
        let ws = DBuf::<u8>::new(wsb.expect("workspace"));
        let out = poisoned(len + 1);
        device_uniqueness(&k.device(), &v.device(), w, &out, len as u64, &ws)
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
        let got = out.download();
        assert!(got[len].is_nan(), "{what}: written past the output");
        let p = len / hkv;
        for h in 0..hkv {
            let (a, b) = (&got[h * p..(h + 1) * p], &want[h * p..(h + 1) * p]);
            if bits {
                let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{what} head {h}: device {a:?}\nhost {b:?}");
            } else {
                let m = b.iter().fold(0f32, |m, x| m.max(x.abs()));
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (x - y).abs() <= 1e-5 * m,
                        "{what} head {h} token {i}: device {x} host {y}"
                    );
                }
            }
        }
    }
}

/// Keys and values `[hkv, n, d]` (n = 1536) laid out for the two scans: tokens 0..256 unique
/// (never settled: compared with the whole cache), then five blocks of 128 tokens, 256
/// apart, each holding the same 128 clusters (four twins each, all beyond the band's reach:
/// settled by the second scan, which stops early for such a group), with filler repeating
/// every 8 tokens between them (settled by the band).
fn two_scan_cache(rng: &mut Rng, hkv: usize, dk: usize, dv: usize) -> (Vec<f32>, Vec<f32>, usize) {
    let n = 256 + 5 * 256;
    let mut k = vec![0f32; hkv * n * dk];
    let mut v = vec![0f32; hkv * n * dv];
    for h in 0..hkv {
        for (t, d) in [(&mut k, dk), (&mut v, dv)] {
            let far: Vec<f32> = (0..128 * d).map(|_| rng.normal()).collect();
            let fill: Vec<f32> = (0..8 * d).map(|_| rng.normal()).collect();
            for i in 0..n {
                let row = &mut t[(h * n + i) * d..(h * n + i + 1) * d];
                let base = match i.checked_sub(256).map(|x| (x / 128 % 2, x % 128)) {
                    None => None,
                    Some((0, c)) => Some(&far[c * d..(c + 1) * d]),
                    Some((_, c)) => Some(&fill[c % 8 * d..(c % 8 + 1) * d]),
                };
                for (c, x) in row.iter_mut().enumerate() {
                    *x = match base {
                        None => rng.normal(),
                        Some(b) => b[c] * (1.0 + 0.02 * rng.normal()),
                    };
                }
            }
        }
    }
    (k, v, n)
}

/// The kernel's two scans (band, then the unsettled tokens against the whole cache with an
/// early stop) on a cache built to take every path (`two_scan_cache`): the scores are the
/// host scorer's (bits or 1e-5, as above), with many tokens settled (score 0) and the unique
/// ones not.
#[test]
fn uniqueness_two_scans_match_host_scorer() {
    need_device!();
    let bits = MOCK && host_fuses();
    let mut rng = Rng::new(37);
    for (dt, hkv, dk, dv, w) in [(Dt::F32, 2, 24, 40, 8), (Dt::Bf16, 1, 64, 32, 32)] {
        let (kv, vv, n) = two_scan_cache(&mut rng, hkv, dk, dv);
        let (mut ki, mut vi) = (kv.into_iter(), vv.into_iter());
        let k = Tensor::new(dt, Layout::HeadMajor, [hkv, n, dk], &mut || {
            ki.next().unwrap()
        });
        let v = Tensor::new(dt, Layout::TokenMajor, [hkv, n, dv], &mut || {
            vi.next().unwrap()
        });
        let what = format!("{dt:?} hkv {hkv} n {n} dk {dk} dv {dv} w {w}");
        let want = host_uniqueness(&k, &v, w);
        let len = hkv * (n - w);
        let shape =
            kvevict::LayerShape::from_dims(hkv as u64, hkv as u64, n as u64, dk as u64, dv as u64)
                .expect("shape");
        let wsb = kvevict::device::score_workspace_size(&uniqueness_cfg(w), &shape);
        let ws = DBuf::<u8>::new(wsb.expect("workspace"));
        let out = poisoned(len + 1);
        device_uniqueness(&k.device(), &v.device(), w, &out, len as u64, &ws)
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
        let got = out.download();
        assert!(got[len].is_nan(), "{what}: written past the output");
        let p = n - w;
        for h in 0..hkv {
            let (a, b) = (&got[h * p..(h + 1) * p], &want[h * p..(h + 1) * p]);
            let zeros = b.iter().filter(|&&x| x == 0.0).count();
            assert!(
                zeros > 1000 && p - zeros >= 250,
                "{what}: {zeros} of {p} scores 0"
            );
            let same = a
                .iter()
                .zip(b)
                .filter(|(x, y)| x.to_bits() == y.to_bits())
                .count();
            println!("uniqueness two scans {what} head {h}: {same} of {p} scores equal in bits");
            if bits {
                assert_eq!(same, p, "{what} head {h}: device {a:?}\nhost {b:?}");
            } else {
                let m = b.iter().fold(0f32, |m, x| m.max(x.abs()));
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (x - y).abs() <= 1e-5 * m,
                        "{what} head {h} token {i}: device {x} host {y}"
                    );
                }
            }
        }
    }
}

/// Past the kernels' token limit (tiles of 64 in a grid dimension) the call is refused
/// before anything is enqueued: `InvalidArgument` (the C entry's
/// `KVE_ERR_INVALID_ARGUMENT`), the output untouched.
#[test]
fn uniqueness_too_many_tokens_is_invalid_argument() {
    need_device!();
    let n = 65535 * 64 + 1;
    let one = DBuf::from(&[1f32]);
    let start = one.vptr() as usize;
    // every token aliases one element: strides of 0
    let t = kvevict::device::Tensor {
        view: KveCudaView {
            data: one.vptr(),
            dtype: KVE_CUDA_F32,
            reserved: 0,
            stride_head: 0,
            stride_token: 0,
            stride_dim: 1,
            heads: 1,
            tokens: n,
            dim: 1,
        },
        bytes: (start, start + 4),
    };
    let out = sentinel(4);
    let ws = DBuf::<u8>::new(1024);
    // refused before `out` (4 floats: OutputTooSmall would come later) or the workspace
    // (too small) is looked at
    let r = device_uniqueness(&t, &t, 8, &out, u64::MAX / 8, &ws);
    assert_eq!(r, Err(kvevict::Error::InvalidArgument));
    assert_sentinel("uniqueness past the token limit", &out);
}

/// `kve_cuda_uniqueness`'s own checks (the kernel's, mirrored by the mock): each bad
/// argument gives 1 and writes nothing; prefix 0 is a no-op needing no output; a second
/// call gives the same scores whatever the workspace held; sizes that overflow are
/// SIZE_MAX.
#[test]
fn uniqueness_launcher_rejects_and_writes_nothing() {
    need_device!();
    let mut rng = Rng::new(3);
    let (hkv, n, d) = (2, 40, 16);
    let k = Tensor::new(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
        rng.normal()
    });
    let (k, v) = (k.view(), k.view());
    // SAFETY: a pure host function.
    let bytes =
        unsafe { kve_cuda_uniqueness_workspace_size(hkv as i64, n as i64, d as i64, d as i64) };
    let ws = DBuf::<u8>::new(bytes + 256);
    let out = sentinel(hkv * n);
    let run = |k: KveCudaView, v: KveCudaView, prefix: i64, ld: i64, w: *mut c_void, wb: usize| {
        // SAFETY: device views and buffers of the declared sizes; refused calls touch none.
        unsafe { kve_cuda_uniqueness(&k, &v, prefix, out.ptr(), ld, w, wb, null_stream()) }
    };
    let p = n as i64 - 8;
    ck(run(k, v, p, p, ws.vptr(), bytes), "the good call");
    let good = out.download();
    assert!(good[..hkv * p as usize].iter().all(|x| x.is_finite()));
    let untouched = vec![SENTINEL; hkv * n];
    out.upload(&untouched);
    let half = KveCudaView {
        dtype: KVE_CUDA_F16,
        ..v
    };
    let fewer = KveCudaView {
        tokens: n as i64 - 1,
        ..v
    };
    let heads = KveCudaView { heads: 1, ..v };
    let odd = (ws.vptr() as *mut u8).wrapping_add(4) as *mut c_void;
    let wsp = ws.vptr();
    for (what, st) in [
        (
            "prefix > N",
            run(k, v, n as i64 + 1, n as i64 + 1, wsp, bytes),
        ),
        ("prefix < 0", run(k, v, -1, p, wsp, bytes)),
        ("ld_out < prefix", run(k, v, p, p - 1, wsp, bytes)),
        ("dtypes differ", run(k, half, p, p, wsp, bytes)),
        ("tokens differ", run(k, fewer, p, p, wsp, bytes)),
        ("heads differ", run(k, heads, p, p, wsp, bytes)),
        ("no workspace", run(k, v, p, p, null_mut(), bytes)),
        ("workspace too small", run(k, v, p, p, wsp, bytes - 1)),
        ("workspace misaligned", run(k, v, p, p, odd, bytes)),
    ] {
        assert_eq!(st, INVALID, "{what}");
        assert_eq!(out.download(), untouched, "{what}: nothing written");
    }
    // SAFETY: refused before any pointer is dereferenced.
    unsafe {
        let no_out = kve_cuda_uniqueness(&k, &v, p, null_mut(), p, wsp, bytes, null_stream());
        assert_eq!(no_out, INVALID, "no output");
        let no_k = kve_cuda_uniqueness(null(), &v, p, out.ptr(), p, wsp, bytes, null_stream());
        assert_eq!(no_k, INVALID, "no keys");
        // prefix 0 is a no-op that needs no output
        let none = kve_cuda_uniqueness(&k, &v, 0, null_mut(), 0, null_mut(), 0, null_stream());
        assert_eq!(none, 0, "prefix 0");
    }
    assert_eq!(out.download(), untouched, "nothing written");
    ck(run(k, v, p, p, wsp, bytes), "the good call again");
    assert_eq!(out.download(), good, "the same scores again");
    // SAFETY: a pure host function.
    let huge = unsafe { kve_cuda_uniqueness_workspace_size(1 << 20, 1 << 22, 1 << 30, 1) };
    assert_eq!(huge, usize::MAX);
}
