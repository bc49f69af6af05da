#![cfg(any(feature = "cuda", feature = "cuda-mock"))]
//! The uniqueness scorer on the device (`kve_cuda_score_layer` → `kve_cuda_uniqueness`,
//! cuda/uniqueness.cu) against the host scorer (`score_layer`), over dtypes, layouts,
//! windows, `dk != dv`, planted twins and N from 1 to a few tiles.
//!
//! With `cuda-mock` the launcher is src/cuda/mock_uniqueness.rs, which runs the kernel's
//! arithmetic: bit-identical to the host's AVX2 + FMA path, so on such a host (and
//! `KVEVICT_PORTABLE` unset) the scores must be equal bit for bit; on other hosts the host
//! sums without fusing and the scores agree to 1e-5 of each head's largest score (each
//! cosine within a few ulp; `8·(1 − r)^7·δr` stays far below that). With `cuda` the kernel
//! runs on the GPU (the test prints "skipped: no CUDA device" and passes without one) and
//! must agree to the same 1e-5.
#![allow(clippy::needless_range_loop)] // tests/reference's loops

mod reference;

use kvevict::capi::*;
use kvevict::config::Preset;
use kvevict::*;
use reference::harness::*;
use reference::{Rng, T3};
use std::ffi::c_void;
use std::ptr::null_mut;

mod device_mem;
use device_mem::{present, upload, Buf};

fn desc(s: &Stored, b: &Buf) -> kve_tensor {
    let len = s.f32.len().max(s.f16.len()).max(s.bf16.len());
    kve_tensor {
        data: b.p as *const c_void,
        len: len as u64,
        dtype: s.dtype as u32,
        pad: 0,
        extent: s.extent.map(|x| x as u64),
        stride: s.stride.map(|x| x as u64),
    }
}

fn params(window: u32) -> kve_score_params {
    // SAFETY: an all-zero struct is filled by the init call.
    unsafe {
        let mut p = std::mem::zeroed::<kve_score_params>();
        let size = std::mem::size_of::<kve_score_params>() as u32;
        assert_eq!(
            kve_score_params_init(&mut p, size, Preset::Uniqueness as u32),
            KVE_OK
        );
        p.window = window;
        p
    }
}

/// `kve_cuda_score_layer` of keys / values on the device: (status, scores `[Hkv][P]`).
fn device_scores(ks: &Stored, vs: &Stored, window: u32) -> (i32, Vec<f32>) {
    let p = params(window);
    let [hkv, n, dk] = ks.extent;
    let dv = vs.extent[2];
    let mut bytes = 0u64;
    // SAFETY: host out-parameter; params from the init call.
    let st = unsafe {
        kve_cuda_score_workspace_size(
            &p, hkv as u64, hkv as u64, n as u64, dk as u64, dv as u64, &mut bytes,
        )
    };
    assert_eq!(st, KVE_OK);
    let (kb, vb) = (upload(ks), upload(vs));
    let mut inp = unsafe { std::mem::zeroed::<kve_layer_inputs>() };
    let size = std::mem::size_of::<kve_layer_inputs>() as u32;
    assert_eq!(unsafe { kve_layer_inputs_init(&mut inp, size) }, KVE_OK);
    inp.keys = desc(ks, &kb);
    inp.values = desc(vs, &vb);
    let len = hkv * (n - (window as usize).min(n));
    let canary = vec![-7f32; len.max(1)];
    let out = Buf::up(&canary);
    let ws = Buf::up(&vec![0u8; bytes as usize]);
    // SAFETY: every pointer is a buffer of the declared size.
    let st = unsafe {
        kve_cuda_score_layer(
            &p,
            &inp,
            out.p as *mut f32,
            len as u64,
            ws.p,
            bytes,
            null_mut(),
        )
    };
    (st, out.down(len))
}

fn host_scores(ks: &Stored, vs: &Stored, window: u32) -> Vec<f32> {
    let cfg = ScoreConfig {
        window,
        ..ScoreConfig::preset(Preset::Uniqueness)
    };
    let inputs = LayerInputs {
        keys: Some(ks.view()),
        values: Some(vs.view()),
        ..LayerInputs::default()
    };
    let shape = layer_shape(&cfg, &inputs).unwrap();
    let mut ws = vec![0u8; score_workspace_size(&cfg, &shape).unwrap()];
    let mut out = vec![0f32; score_len(&cfg, &shape).unwrap()];
    score_layer(&cfg, &inputs, &mut out, &mut ws).unwrap();
    out
}

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

/// Keys and values `[hkv, n, d]` with a third of the tokens near-copies of others (both K
/// and V), so some maxima are near 1 and the scores span decades.
fn twins(rng: &mut Rng, hkv: usize, n: usize, dk: usize, dv: usize) -> (T3, T3) {
    let (mut k, mut v) = (
        T3::normal(rng, hkv, n, dk, 1.0),
        T3::normal(rng, hkv, n, dv, 1.0),
    );
    for _ in 0..n / 3 {
        let (a, b) = (rng.range(0, n - 1), rng.range(0, n - 1));
        for h in 0..hkv {
            for (t, d) in [(&mut k, dk), (&mut v, dv)] {
                for c in 0..d {
                    let e = t.at(h, a, c) * (1.0 + 0.01 * rng.normal());
                    t.set(h, b, c, e);
                }
            }
        }
    }
    (k, v)
}

#[test]
fn device_scores_match_the_host_scorer() {
    if !present() {
        return;
    }
    let bits = cfg!(not(feature = "cuda")) && host_fuses();
    let mut rng = Rng::new(29);
    let cases = [
        (
            DType::F32,
            Layout::HeadMajor,
            Layout::HeadMajor,
            2,
            150,
            64,
            64,
            8,
        ),
        (
            DType::F16,
            Layout::TokenMajor,
            Layout::Transposed,
            3,
            97,
            40,
            24,
            8,
        ),
        (
            DType::BF16,
            Layout::HeadMajor,
            Layout::TokenMajor,
            1,
            200,
            13,
            70,
            32,
        ),
        (
            DType::F32,
            Layout::Transposed,
            Layout::HeadMajor,
            2,
            65,
            8,
            8,
            1,
        ),
        (
            DType::F16,
            Layout::HeadMajor,
            Layout::HeadMajor,
            1,
            2,
            16,
            16,
            1,
        ),
        (
            DType::F32,
            Layout::HeadMajor,
            Layout::HeadMajor,
            2,
            1,
            16,
            16,
            1,
        ),
        (
            DType::F32,
            Layout::HeadMajor,
            Layout::HeadMajor,
            1,
            20,
            16,
            16,
            20,
        ),
    ];
    for (dt, kl, vl, hkv, n, dk, dv, w) in cases {
        let (k, v) = twins(&mut rng, hkv, n, dk, dv);
        let (ks, _) = Stored::new(&k, dt, kl);
        let (vs, _) = Stored::new(&v, dt, vl);
        let what = format!("{dt:?} K {kl:?} V {vl:?} hkv {hkv} n {n} dk {dk} dv {dv} w {w}");
        let want = host_scores(&ks, &vs, w);
        let (st, got) = device_scores(&ks, &vs, w);
        assert_eq!(st, KVE_OK, "{what}");
        assert_eq!(got.len(), want.len(), "{what}");
        let p = want.len() / hkv;
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

/// Past the kernels' token limit (tiles of 64 in a grid dimension) the call is refused
/// before anything is enqueued: `KVE_ERR_INVALID_ARGUMENT`, the output untouched.
#[test]
fn too_many_tokens_is_invalid_argument() {
    if !present() {
        return;
    }
    let n = 65535 * 64 + 1;
    let one = Buf::up(&[1f32]);
    // every token aliases one element: a token stride of 0
    let t = kve_tensor {
        data: one.p as *const c_void,
        len: 1,
        dtype: DType::F32 as u32,
        pad: 0,
        extent: [1, n, 1],
        stride: [0, 0, 1],
    };
    let p = params(8);
    let mut inp = unsafe { std::mem::zeroed::<kve_layer_inputs>() };
    let size = std::mem::size_of::<kve_layer_inputs>() as u32;
    assert_eq!(unsafe { kve_layer_inputs_init(&mut inp, size) }, KVE_OK);
    inp.keys = t;
    inp.values = t;
    let out = Buf::up(&[-7f32; 4]);
    let ws = Buf::up(&[0u8; 1024]);
    // SAFETY: refused before `out` (4 floats: OutputTooSmall would come later) is read.
    let st = unsafe {
        kve_cuda_score_layer(
            &p,
            &inp,
            out.p as *mut f32,
            u64::MAX / 8,
            ws.p,
            1024,
            null_mut(),
        )
    };
    assert_eq!(st, KVE_ERR_INVALID_ARGUMENT);
    assert_eq!(out.down::<f32>(4), vec![-7f32; 4]);
}

/// The launcher's own checks (the kernel's, mirrored by the mock): each bad argument gives
/// `cudaErrorInvalidValue` (1) and writes nothing.
#[cfg(not(feature = "cuda"))]
#[test]
fn mock_rejects_bad_arguments_and_writes_nothing() {
    use device_mem::dview;
    use kvevict::cuda::*;
    let mut rng = Rng::new(3);
    let (hkv, n, d) = (2, 40, 16);
    let (ks, _) = Stored::new(
        &T3::normal(&mut rng, hkv, n, d, 1.0),
        DType::F32,
        Layout::HeadMajor,
    );
    let (kb, vb) = (upload(&ks), upload(&ks));
    let (k, v) = (dview(&ks, &kb), dview(&ks, &vb));
    let bytes =
        unsafe { kve_cuda_uniqueness_workspace_size(hkv as i64, n as i64, d as i64, d as i64) };
    let ws = Buf::up(&vec![0u8; bytes + 256]);
    let out = Buf::up(&vec![-7f32; hkv * n]);
    let run = |k: KveCudaView, v: KveCudaView, prefix: i64, ld: i64, w: *mut c_void, wb: usize| unsafe {
        kve_cuda_uniqueness(&k, &v, prefix, out.p as *mut f32, ld, w, wb, null_mut())
    };
    let p = n as i64 - 8;
    assert_eq!(run(k, v, p, p, ws.p, bytes), 0, "the good call");
    let good: Vec<f32> = out.down(hkv * n);
    let out_reset = || unsafe {
        std::ptr::copy_nonoverlapping(vec![-7f32; hkv * n].as_ptr(), out.p as *mut f32, hkv * n)
    };
    out_reset();
    let half = KveCudaView {
        dtype: KVE_CUDA_F16,
        ..v
    };
    let fewer = KveCudaView {
        tokens: n as i64 - 1,
        ..v
    };
    let heads = KveCudaView { heads: 1, ..v };
    let odd = (ws.p as *mut u8).wrapping_add(4) as *mut c_void;
    for (what, st) in [
        (
            "prefix > N",
            run(k, v, n as i64 + 1, n as i64 + 1, ws.p, bytes),
        ),
        ("prefix < 0", run(k, v, -1, p, ws.p, bytes)),
        ("ld_out < prefix", run(k, v, p, p - 1, ws.p, bytes)),
        ("dtypes differ", run(k, half, p, p, ws.p, bytes)),
        ("tokens differ", run(k, fewer, p, p, ws.p, bytes)),
        ("heads differ", run(k, heads, p, p, ws.p, bytes)),
        ("no workspace", run(k, v, p, p, null_mut(), bytes)),
        ("workspace too small", run(k, v, p, p, ws.p, bytes - 1)),
        ("workspace misaligned", run(k, v, p, p, odd, bytes)),
    ] {
        assert_eq!(st, 1, "{what}");
        assert_eq!(
            out.down::<f32>(hkv * n),
            vec![-7f32; hkv * n],
            "{what}: nothing written"
        );
    }
    let no_out = unsafe { kve_cuda_uniqueness(&k, &v, p, null_mut(), p, ws.p, bytes, null_mut()) };
    assert_eq!(no_out, 1, "no output");
    assert_eq!(
        unsafe {
            kve_cuda_uniqueness(
                std::ptr::null(),
                &v,
                p,
                out.p as *mut f32,
                p,
                ws.p,
                bytes,
                null_mut(),
            )
        },
        1
    );
    // prefix 0 is a no-op that needs no output
    assert_eq!(
        unsafe { kve_cuda_uniqueness(&k, &v, 0, null_mut(), 0, null_mut(), 0, null_mut()) },
        0
    );
    // the same call again gives the same scores, whatever the workspace held
    assert_eq!(run(k, v, p, p, ws.p, bytes), 0);
    assert_eq!(out.down::<f32>(hkv * n), good);
    // sizes that overflow are SIZE_MAX, which no workspace satisfies
    assert_eq!(
        unsafe { kve_cuda_uniqueness_workspace_size(1 << 20, 1 << 22, 1 << 30, 1) },
        usize::MAX
    );
}
