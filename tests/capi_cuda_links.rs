//! Value links on the device: `kve_cuda_accumulate_value_links` and
//! `kve_cuda_select_model_linked` against the host (`kvevict::accumulate_value_links`,
//! `kve_select_model_linked`), the linked pool launcher against the core's
//! `pool_forward_linked`, and the C contract of both entry points.
//!
//! How exact: the links are compared BIT FOR BIT where the host runs its AVX2 + FMA path
//! (x86-64 with avx2 and fma): the kernel follows
//! that path's operation order — 8 fused lanes and their fixed tree for token rows, the
//! per-channel fused chains (unfused for the last tokens) for V transposed, the cosine in
//! f64 — so every rounding is the same. The host's portable path (no AVX2) sums its lanes
//! unfused, so there the links agree to 1e-5 relative only. Selections are compared as
//! kept lists, exactly (the linked pool picks one of the same scores; only a zero's sign
//! can differ, and the keys treat -0 and +0 alike).
//!
//! Runs with `--features cuda-emu` (the kernels on the CPU emulator) and on a GPU with
//! `--features cuda` (skips without a device; cuda/check.sh runs it).
#![cfg(feature = "cuda")]
#![allow(clippy::needless_range_loop)] // tests/reference's and tests/conformance's loops

use kvevict::capi::*;
use kvevict::config::*;
use kvevict::cuda::{kve_cuda_pool_linked, KVE_CUDA_F32};
use std::ffi::c_void;
use std::ptr::{null, null_mut};

mod capi_common;
mod reference;
#[macro_use]
mod conformance;
use conformance::{dtype_layouts, have_device, select_params, DBuf, Dt, Layout, Rng, Tensor};

type Buf = DBuf<u8>;

/// The host's AVX2 + FMA path runs here, so the links must be its bits.
fn host_is_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn desc(t: &Tensor) -> kve_tensor {
    kve_tensor {
        data: t.buf.as_ref().unwrap().vptr() as *const c_void,
        len: t.flat.len() as u64,
        dtype: t.dt.code() as u32,
        pad: 0,
        extent: t.ext.map(|x| x as u64),
        stride: t.st.map(|x| x as u64),
    }
}

fn device_ws_bytes(hkv: usize, n: usize) -> u64 {
    let mut b = 0u64;
    assert_eq!(
        unsafe { kve_cuda_value_links_workspace_size(hkv as u64, n as u64, &mut b) },
        KVE_OK
    );
    b
}

/// `kve_cuda_accumulate_value_links` over `layers` into a device `links` of `n` floats
/// starting at `start`; the downloaded sums.
fn device_links(layers: &[Tensor], start: &[f32]) -> Vec<f32> {
    let [hkv, n, _] = layers[0].ext;
    let links = DBuf::from(start);
    let bytes = device_ws_bytes(hkv, n);
    let ws = Buf::new(bytes.max(1) as usize);
    for t in layers {
        let st = unsafe {
            kve_cuda_accumulate_value_links(
                &desc(t),
                links.ptr(),
                start.len() as u64,
                ws.vptr(),
                bytes,
                null_mut(),
            )
        };
        assert_eq!(name(st), name(KVE_OK));
    }
    links.download()
}

/// The host's sums over the same stored bytes (dtype and layout as uploaded).
fn host_links(layers: &[Tensor], start: &[f32]) -> Result<Vec<f32>, kvevict::Error> {
    let [_, n, dv] = layers[0].ext;
    let mut out = start.to_vec();
    let mut ws = vec![0u8; kvevict::value_links_workspace_size(n, dv).unwrap()];
    for t in layers {
        t.with_stored_view(|v| kvevict::accumulate_value_links(&v, &mut out, &mut ws))?;
    }
    Ok(out)
}

fn name(st: i32) -> String {
    unsafe { std::ffi::CStr::from_ptr(kve_status_name(st)) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn device_links_are_the_host_bits() {
    need_device!();
    let exact = host_is_avx2();
    let mut rng = Rng::new(131);
    let mut checked = 0;
    for (dt, layout) in dtype_layouts() {
        // n crosses the transposed path's 8-token body; dv its 8-lane tail
        for &(hkv, n, dv) in &[(2, 1, 8), (2, 2, 5), (3, 9, 8), (2, 40, 20), (1, 67, 64)] {
            let mut layers: Vec<Tensor> = (0..2)
                .map(|_| Tensor::normal(&mut rng, dt, layout, [hkv, n, dv]))
                .collect();
            if n > 5 {
                // token 4 of head 0, layer 1, is a zero vector: it links nothing
                let t = &mut layers[1];
                for d in 0..dv {
                    let at = t.st[1] * 4 + t.st[2] * d;
                    t.flat[at] = 0.0;
                }
                t.buf.as_ref().unwrap().upload(&t.dt.encode(&t.flat));
            }
            let start: Vec<f32> = (0..n).map(|i| (i % 3) as f32 * 0.25).collect();
            let host = host_links(&layers, &start).unwrap();
            let dev = device_links(&layers, &start);
            for i in 0..n {
                let ok = if exact {
                    dev[i].to_bits() == host[i].to_bits()
                } else {
                    (dev[i] - host[i]).abs() <= 1e-5 * host[i].abs().max(1.0)
                };
                assert!(
                    ok,
                    "{dt:?} {layout:?} hkv {hkv} n {n} dv {dv}: token {i}: device {} host {}",
                    dev[i], host[i]
                );
            }
            checked += 1;
        }
    }
    println!(
        "{checked} link sums equal to the host's ({})",
        if exact { "bits" } else { "1e-5" }
    );
}

/// A NaN in token 5's value: the host refuses (NON_FINITE, nothing written), the device,
/// which cannot return a status for device data, makes links 5 and 6 NaN and no others.
#[test]
fn device_links_mark_non_finite_values() {
    let mut rng = device_rng!(5);
    for layout in [Layout::HeadMajor, Layout::Transposed] {
        let mut t = Tensor::normal(&mut rng, Dt::F32, layout, [2, 12, 16]);
        let at = t.st[0] + t.st[1] * 5 + t.st[2] * 3;
        t.flat[at] = f32::NAN;
        t.buf.as_ref().unwrap().upload(&t.dt.encode(&t.flat));
        let start = vec![0f32; 12];
        let layers = [t];
        assert!(matches!(
            host_links(&layers, &start),
            Err(kvevict::Error::NonFinite)
        ));
        let dev = device_links(&layers, &start);
        for (i, x) in dev.iter().enumerate() {
            assert_eq!(x.is_nan(), i == 5 || i == 6, "{layout:?} token {i}: {x}");
        }
    }
}

/// The size query refuses what the call refuses: no heads or tokens, more heads than a
/// grid dimension, past 2^31 tokens (issue 26: these were sized), nothing written.
#[test]
fn device_links_workspace_size_refuses_bad_shapes() {
    for (hkv, n) in [
        (0, 40),
        (2, 0),
        (65536, 40),
        (2, (1 << 31) + 1),
        (2, u64::MAX),
    ] {
        let mut b = 7u64;
        let st = unsafe { kve_cuda_value_links_workspace_size(hkv, n, &mut b) };
        assert_eq!((st, b), (KVE_ERR_INVALID_ARGUMENT, 7), "hkv {hkv}, n {n}");
    }
    assert!(device_ws_bytes(65535, 1) > 0);
}

#[test]
fn device_links_refuse_bad_input_and_write_nothing() {
    let mut rng = device_rng!(6);
    let (hkv, n, dv) = (2, 20, 8);
    let t = Tensor::normal(&mut rng, Dt::F16, Layout::HeadMajor, [hkv, n, dv]);
    let d = desc(&t);
    let bytes = device_ws_bytes(hkv, n);
    assert!(bytes >= (hkv * n * 4) as u64);
    let ws = Buf::new(bytes as usize + 256);
    let links = DBuf::from(&vec![conformance::SENTINEL; n]);
    let call = |v: *const kve_tensor, l: *mut f32, len: usize, w: *mut c_void, wb: u64| unsafe {
        kve_cuda_accumulate_value_links(v, l, len as u64, w, wb, null_mut())
    };
    let mut bad_dtype = d;
    bad_dtype.dtype = 7;
    let mut short = d;
    short.len -= 1; // the strides reach past the declared length
    let cases: Vec<(&str, i32, i32)> = vec![
        (
            "null values",
            call(null(), links.ptr(), n, ws.vptr(), bytes),
            KVE_ERR_NULL_POINTER,
        ),
        (
            "null links",
            call(&d, null_mut(), n, ws.vptr(), bytes),
            KVE_ERR_NULL_POINTER,
        ),
        (
            "links shorter than N",
            call(&d, links.ptr(), n - 1, ws.vptr(), bytes),
            KVE_ERR_OUTPUT_TOO_SMALL,
        ),
        (
            "workspace too small",
            call(&d, links.ptr(), n, ws.vptr(), bytes - 1),
            KVE_ERR_WORKSPACE_TOO_SMALL,
        ),
        (
            "workspace misaligned",
            call(
                &d,
                links.ptr(),
                n,
                unsafe { ws.ptr().add(4) } as *mut c_void,
                bytes,
            ),
            KVE_ERR_MISALIGNED,
        ),
        (
            "links misaligned",
            call(
                &d,
                unsafe { (links.ptr() as *mut u8).add(2) } as *mut f32,
                n - 1,
                ws.vptr(),
                bytes,
            ),
            KVE_ERR_MISALIGNED,
        ),
        (
            "bad dtype",
            call(&bad_dtype, links.ptr(), n, ws.vptr(), bytes),
            KVE_ERR_BAD_ENUM,
        ),
        (
            "strides past len",
            call(&short, links.ptr(), n, ws.vptr(), bytes),
            KVE_ERR_OUT_OF_BOUNDS,
        ),
        (
            "links over the values",
            call(&d, d.data as *mut f32, n, ws.vptr(), bytes),
            KVE_ERR_ALIASING,
        ),
        (
            "workspace over the links",
            call(&d, ws.ptr() as *mut f32, n, ws.vptr(), bytes),
            KVE_ERR_ALIASING,
        ),
    ];
    for (what, got, want) in cases {
        assert_eq!(name(got), name(want), "{what}");
    }
    conformance::assert_sentinel("links after refused calls", &links);
    // without the feature's launchers the entry points answer NOT_BUILT_WITH_CUDA; here OK
    assert_eq!(
        name(call(&d, links.ptr(), n, ws.vptr(), bytes)),
        name(KVE_OK)
    );
}

/// The linked launcher against
/// the core's pool over rows that cross its 256-entry tiles, kernels past the runs, sinks,
/// every link density; ties (a zero's sign aside).
#[test]
fn linked_pool_launcher_matches_the_core() {
    let mut rng = device_rng!(9);
    let rows = 3;
    for n in [1usize, 2, 255, 256, 257, 700] {
        let src: Vec<f32> = (0..rows * n)
            .map(|i| if i % 5 == 0 { 0.5 } else { rng.unif() })
            .collect();
        for density in [0.0f32, 0.3, 0.9, 1.0] {
            let links: Vec<f32> = (0..n).map(|_| rng.unif()).collect();
            let min = 1.0 - density;
            let (din, dl) = (DBuf::from(&src), DBuf::from(&links));
            for k in [1usize, 3, 9, 300] {
                for sinks in [0usize, 2, 300] {
                    let dout = DBuf::from(&vec![f32::NAN; rows * n]);
                    let st = unsafe {
                        kve_cuda_pool_linked(
                            din.ptr(),
                            n as i64,
                            dout.ptr(),
                            n as i64,
                            rows as i64,
                            n as i64,
                            k as i32,
                            sinks as i64,
                            dl.ptr(),
                            min,
                            null_mut(),
                        )
                    };
                    assert_eq!(st, 0);
                    let got = dout.download();
                    let mut want = vec![0f32; n];
                    for r in 0..rows {
                        kvevict::pool::pool_forward_linked(
                            k,
                            sinks,
                            &links,
                            min,
                            &src[r * n..(r + 1) * n],
                            &mut want,
                        );
                        assert_eq!(
                            &got[r * n..(r + 1) * n],
                            &want[..],
                            "n {n} density {density} k {k} sinks {sinks} row {r}"
                        );
                    }
                }
            }
        }
    }
    // a NaN threshold is refused before anything is written
    let dout = DBuf::from(&[conformance::SENTINEL; 4]);
    let din = DBuf::from(&[1f32; 4]);
    let st = unsafe {
        kve_cuda_pool_linked(
            din.ptr(),
            4,
            dout.ptr(),
            4,
            1,
            4,
            2,
            0,
            din.ptr(),
            f32::NAN,
            null_mut(),
        )
    };
    assert_eq!(st, conformance::INVALID);
    conformance::assert_sentinel("pool_linked refused", &dout);
    let _ = KVE_CUDA_F32;
}

struct Model {
    layers: usize,
    hkv: usize,
    n: usize,
    w: usize,
}

impl Model {
    fn desc(&self, scores: *const f32, len: usize) -> kve_model_scores {
        kve_model_scores {
            scores,
            len: len as u64,
            layers: self.layers as u64,
            hkv: self.hkv as u64,
            n: self.n as u64,
            window: self.w as u64,
        }
    }
    /// The model's scores `[L][Hkv][n - w]`, element `e` being `f(e)`, and their device copy.
    fn scores(&self, f: impl FnMut(usize) -> f32) -> (Vec<f32>, Buf) {
        let host: Vec<f32> = (0..self.layers * self.hkv * (self.n - self.w))
            .map(f)
            .collect();
        let device = Buf::bytes_of(&host);
        (host, device)
    }
}

/// The host's linked selection as per-unit lists.
fn host_linked(
    p: &kve_select_params,
    m: &Model,
    scores: &[f32],
    links: &[f32],
    thr: f32,
) -> Vec<Vec<u32>> {
    let ms = m.desc(scores.as_ptr(), scores.len());
    let (mut no, mut ni, mut wb) = (0u64, 0u64, 0u64);
    let (l, h, n, w) = (ms.layers, ms.hkv, ms.n, ms.window);
    unsafe {
        assert_eq!(
            kve_select_output_len(p, l, h, n, w, &mut no, &mut ni),
            KVE_OK
        );
        assert_eq!(kve_select_workspace_size(p, l, h, n, w, &mut wb), KVE_OK);
        let (mut off, mut idx, mut ws) = (
            vec![0u64; no as usize],
            vec![0u32; ni as usize],
            vec![0u8; wb as usize],
        );
        let st = kve_select_model_linked(
            p,
            &ms,
            links.as_ptr(),
            links.len() as u64,
            thr,
            off.as_mut_ptr(),
            no,
            idx.as_mut_ptr(),
            ni,
            ws.as_mut_ptr() as *mut c_void,
            wb,
        );
        assert_eq!(name(st), name(KVE_OK));
        (0..m.layers * m.hkv)
            .map(|u| idx[off[u] as usize..off[u + 1] as usize].to_vec())
            .collect()
    }
}

/// Buffers of a device selection: counts, lists (row stride n + 3) and workspace.
struct DevOut {
    counts: Buf,
    idx: Buf,
    ld: usize,
    ws: Buf,
    bytes: u64,
}

impl DevOut {
    fn new(p: &kve_select_params, m: &Model) -> DevOut {
        let units = m.layers * m.hkv;
        let ld = m.n + 3;
        let mut bytes = 0u64;
        let st = unsafe {
            kve_cuda_select_model_workspace_size(
                p,
                m.layers as u64,
                m.hkv as u64,
                m.n as u64,
                m.w as u64,
                &mut bytes,
            )
        };
        assert_eq!(st, KVE_OK);
        let sentinel = conformance::SENTINEL.to_bits();
        DevOut {
            counts: Buf::bytes_of(&vec![sentinel; units]),
            idx: Buf::bytes_of(&vec![sentinel; units * ld]),
            ld,
            ws: Buf::new(bytes.max(1) as usize),
            bytes,
        }
    }
    fn untouched(&self, units: usize) -> bool {
        let s = conformance::SENTINEL.to_bits();
        self.counts
            .download_as::<u32>(units)
            .iter()
            .all(|&x| x == s)
            && self
                .idx
                .download_as::<u32>(units * self.ld)
                .iter()
                .all(|&x| x == s)
    }
    fn lists(&self, units: usize) -> Vec<Vec<u32>> {
        let c = self.counts.download_as::<i32>(units);
        let x = self.idx.download_as::<i32>(units * self.ld);
        (0..units)
            .map(|u| {
                x[u * self.ld..u * self.ld + c[u] as usize]
                    .iter()
                    .map(|&i| i as u32)
                    .collect()
            })
            .collect()
    }
}

#[allow(clippy::too_many_arguments)]
fn device_linked_call(
    p: &kve_select_params,
    m: &Model,
    scores: &Buf,
    len: usize,
    links: *const f32,
    links_len: usize,
    thr: f32,
    o: &DevOut,
) -> i32 {
    let ms = m.desc(scores.ptr_as(), len);
    let units = m.layers * m.hkv;
    unsafe {
        kve_cuda_select_model_linked(
            p,
            &ms,
            links,
            links_len as u64,
            thr,
            o.counts.ptr_as(),
            units as u64,
            o.idx.ptr_as(),
            o.ld as u64,
            (units * o.ld) as u64,
            o.ws.vptr(),
            o.bytes,
            null_mut(),
        )
    }
}

#[test]
fn device_linked_selection_equals_host() {
    let mut rng = device_rng!(21);
    let m = Model {
        layers: 3,
        hkv: 2,
        n: 300,
        w: 16,
    };
    let (scores, ds) = m.scores(|e| if e % 13 == 0 { 0.25 } else { rng.unif() });
    let heads = (m.layers * m.hkv) as f32;
    let mut checked = 0;
    for density in [0.0f32, 0.4, 0.8] {
        // mean links in [0, 1): linked (above 0.5) with probability `density`
        let links: Vec<f32> = (0..m.n)
            .map(|_| {
                let linked = rng.unif() < density;
                heads
                    * if linked {
                        0.6 + 0.3 * rng.unif()
                    } else {
                        0.4 * rng.unif()
                    }
            })
            .collect();
        let dl = DBuf::from(&links);
        for &alloc in AllocatorKind::ALL {
            for &gran in Granularity::ALL {
                for (budget, kernel, sinks) in [(12u64, 5u32, 0u32), (40, 1, 4), (7, 9, 1)] {
                    let mut sp = select_params(alloc, gran, budget);
                    sp.post_pool_kind = PoolKind::Forward as u32;
                    sp.post_pool_kernel = kernel;
                    sp.post_pool_decay = 1.0;
                    sp.post_pool_sinks = sinks;
                    let host = host_linked(&sp, &m, &scores, &links, 0.5);
                    let o = DevOut::new(&sp, &m);
                    let st = device_linked_call(&sp, &m, &ds, scores.len(), dl.ptr(), m.n, 0.5, &o);
                    assert_eq!(name(st), name(KVE_OK));
                    assert_eq!(
                        o.lists(m.layers * m.hkv),
                        host,
                        "{alloc:?} {gran:?} density {density} budget {budget} kernel {kernel} sinks {sinks}"
                    );
                    checked += 1;
                }
            }
        }
    }
    println!("{checked} linked selections equal to the host's");
}

/// The host's statuses where the host can see the fault; nothing written on any.
#[test]
fn device_linked_selection_refuses_bad_input_and_writes_nothing() {
    let mut rng = device_rng!(22);
    let m = Model {
        layers: 2,
        hkv: 2,
        n: 40,
        w: 8,
    };
    let (scores, ds) = m.scores(|_| rng.unif());
    let links = DBuf::from(&vec![0f32; m.n + 1]);
    // SAFETY: a writable struct of the size passed.
    let span = capi_common::init_struct(|p, size| unsafe {
        kve_select_params_init_laprox_span(p, size, 6)
    });
    let mut avg = span;
    avg.post_pool_kind = PoolKind::Avg as u32;
    avg.post_pool_kernel = 3;
    let mut decayed = span;
    decayed.post_pool_decay = 0.9;
    let units = m.layers * m.hkv;
    let o = DevOut::new(&span, &m);
    let cases: [(&str, &kve_select_params, *const f32, usize, f32, i32); 7] = [
        (
            "links of n - 1",
            &span,
            links.ptr(),
            m.n - 1,
            0.5,
            KVE_ERR_SHAPE_MISMATCH,
        ),
        (
            "links of n + 1",
            &span,
            links.ptr(),
            m.n + 1,
            0.5,
            KVE_ERR_SHAPE_MISMATCH,
        ),
        ("null links", &span, null(), m.n, 0.5, KVE_ERR_NULL_POINTER),
        (
            "NaN threshold",
            &span,
            links.ptr(),
            m.n,
            f32::NAN,
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (
            "infinite threshold",
            &span,
            links.ptr(),
            m.n,
            f32::INFINITY,
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (
            "avg post-pool",
            &avg,
            links.ptr(),
            m.n,
            0.5,
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (
            "decayed post-pool",
            &decayed,
            links.ptr(),
            m.n,
            0.5,
            KVE_ERR_INVALID_ARGUMENT,
        ),
    ];
    for (what, sp, l, len, thr, want) in cases {
        let st = device_linked_call(sp, &m, &ds, scores.len(), l, len, thr, &o);
        assert_eq!(name(st), name(want), "{what}");
        assert!(o.untouched(units), "{what}: written");
    }
    // links that are the workspace or the lists: refused as aliasing
    for (what, l) in [
        ("links in the workspace", o.ws.ptr_as::<f32>() as *const f32),
        ("links in the lists", o.idx.ptr_as::<f32>() as *const f32),
    ] {
        let st = device_linked_call(&span, &m, &ds, scores.len(), l, m.n, 0.5, &o);
        assert_eq!(name(st), name(KVE_ERR_ALIASING), "{what}");
        assert!(o.untouched(units), "{what}: written");
    }
    let st = device_linked_call(&span, &m, &ds, scores.len(), links.ptr(), m.n, 0.5, &o);
    assert_eq!(name(st), name(KVE_OK));
}
