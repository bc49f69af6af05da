//! `kve_cuda_uniqueness` (cuda/uniqueness.cu) against the host uniqueness scorer.

use super::*;

// ------------------------------------------------------------------------ uniqueness --
// The uniqueness scorer (`kvevict::device::score_layer` → `kve_cuda_uniqueness`,
// cuda/uniqueness.cu) against the host scorer on the same stored tensors. The kernel's
// arithmetic is the host's AVX2 + FMA path: on the emulator (host fmaf) with that path
// (`KVEVICT_PORTABLE` unset) the single-scan scores are equal bit for bit. Elsewhere
// the host sums without fusing, and on a GPU the order differs: each head's scores
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

/// The device's uniqueness scores of `k`, `v` (`len` floats), the element past them
/// checked unwritten.
fn device_scores(k: &Tensor, v: &Tensor, w: usize, len: usize, what: &str) -> Vec<f32> {
    let [hkv, n, dk] = k.ext;
    let ws = score_workspace(&uniqueness_cfg(w), [hkv, hkv, n, dk, v.ext[2]]);
    let out = poisoned(len + 1);
    device_uniqueness(&k.device(), &v.device(), w, &out, len as u64, &ws)
        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let mut got = out.download();
    assert!(got[len].is_nan(), "{what}: written past the output");
    got.truncate(len);
    got
}

/// Device scores `a` within 1e-5 of the largest host score of `b`.
fn assert_near_host(what: &str, a: &[f32], b: &[f32]) {
    let m = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * m,
            "{what} token {i}: device {x} host {y}"
        );
    }
}

/// Over dtypes, layouts (K and V apart), windows, `dk != dv`, planted twins and N from 1
/// to a few tiles of 64: the device's scores are the host scorer's (bits or 1e-5, above),
/// and the element past the output stays unwritten.
#[test]
fn uniqueness_matches_host_scorer() {
    need_device!();
    // the real kernel on the emulator (host fmaf: the same fused operations)
    let bits = cfg!(feature = "cuda-emu") && host_fuses();
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
        let got = device_scores(&k, &v, w, len, &what);
        let p = len / hkv;
        for h in 0..hkv {
            let (a, b) = (&got[h * p..(h + 1) * p], &want[h * p..(h + 1) * p]);
            if bits {
                let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{what} head {h}: device {a:?}\nhost {b:?}");
            } else {
                assert_near_host(&format!("{what} head {h}"), a, b);
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
/// host scorer's (to 1e-5 of the largest), with many tokens settled (score 0) and the unique
/// ones not.
#[test]
fn uniqueness_two_scans_match_host_scorer() {
    let mut rng = device_rng!(37);
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
        let got = device_scores(&k, &v, w, len, &what);
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
            assert_near_host(&format!("{what} head {h}"), a, b);
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

/// `kve_cuda_uniqueness`'s own checks: each bad
/// argument gives 1 and writes nothing; prefix 0 is a no-op needing no output; a second
/// call gives the same scores whatever the workspace held; sizes that overflow are
/// SIZE_MAX.
#[test]
fn uniqueness_launcher_rejects_and_writes_nothing() {
    let mut rng = device_rng!(3);
    let (hkv, n, d) = (2, 40, 16);
    let k = Tensor::normal(&mut rng, Dt::F32, Layout::HeadMajor, [hkv, n, d]);
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
