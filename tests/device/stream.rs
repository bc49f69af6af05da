//! `kve_cuda_stream_feed` (cuda/stream.cu) against the core's stream state:
//! the same chunks fed to both, the accumulators compared with the state's statistics.
//! With feature `cuda` the kernels run on the GPU (the test prints "skipped: no CUDA
//! device" and passes without one), or on the CPU emulator with `cuda-emu`, and agree to
//! float tolerance.
#![allow(clippy::needless_range_loop)] // tests/reference's loops

use crate::{conformance, reference};
use kvevict::cuda::*;
use kvevict::*;
use reference::harness::*;
use reference::{softmax_row, Rng, T3};

/// Memory the launcher reads and writes (cudaMalloc'd).
type Buf = conformance::DBuf<u8>;

fn present() -> bool {
    conformance::have_device()
}

/// A device view of a stored tensor uploaded to `buf`.
fn dview(s: &Stored, buf: &Buf) -> KveCudaView {
    conformance::cuda_view(buf.vptr(), s.dtype as i32, s.extent, s.stride)
}

fn upload(s: &Stored) -> Buf {
    match s.dtype {
        DType::F32 => Buf::bytes_of(&s.f32),
        DType::F16 => Buf::bytes_of(&s.f16),
        DType::BF16 => Buf::bytes_of(&s.bf16),
        DType::Q8_0 | DType::Q4_0 => unreachable!("f32/f16/bf16 only here"),
    }
}

/// Accumulators `max`, `sum`, `sq` on the device, `[Hq][N]` each.
struct Acc {
    max: Buf,
    sum: Buf,
    sq: Buf,
}

struct Chunk {
    q: Stored,
    pos: Vec<i64>,
    lse: Option<Vec<f32>>,
}

unsafe fn feed(k: &KveCudaView, ch: &Chunk, acc: &Acc, ws: &Buf, ws_bytes: usize) -> i32 {
    let qb = upload(&ch.q);
    let qv = dview(&ch.q, &qb);
    let pb = Buf::bytes_of(&ch.pos);
    let lb = ch.lse.as_ref().map(|l| Buf::bytes_of(l));
    let r = kve_cuda_stream_feed(
        &qv,
        pb.vptr() as *const i64,
        k,
        lb.as_ref()
            .map_or(std::ptr::null(), |b| b.vptr() as *const f32),
        acc.max.vptr() as *mut f32,
        acc.sum.vptr() as *mut f32,
        acc.sq.vptr() as *mut f32,
        ws.vptr(),
        ws_bytes,
        std::ptr::null_mut(),
    );
    // the kernels' results are there after a copy (which syncs)
    let _ = acc.max.download_as::<f32>(1);
    r
}

/// |a − b| <= tol · max |b|.
fn near(a: &[f32], b: &[f32], tol: f32, what: &str) {
    let m = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (u, v)) in a.iter().zip(b).enumerate() {
        assert!(
            (u - v).abs() <= tol * m,
            "{what}: i {i}: device {u} core {v}"
        );
    }
}

#[test]
fn launcher_matches_the_core_state() {
    if !present() {
        return;
    }
    let mut rng = Rng::new(17);
    for (dt, lay, g) in [
        (DType::F32, Layout::HeadMajor, 1),
        (DType::F16, Layout::TokenMajor, 3),
        (DType::BF16, Layout::HeadMajor, 3),
    ] {
        let (hkv, n, dk) = (2, 150, 40);
        let hq = hkv * g;
        let (ks, kr) = Stored::new(&T3::normal(&mut rng, hkv, n, dk, 1.0), dt, lay);
        // chunk 1: causal positions inside the prefix; chunk 2: after N, with row_lse
        let mut chunks = vec![];
        for (c, lo, hi, with_lse) in [(9, 20, n - 1, false), (11, n, 3 * n, true)] {
            let (qs, qr) = Stored::new(&T3::normal(&mut rng, hq, c, dk, 1.5), dt, lay);
            let mut pos: Vec<i64> = (0..c).map(|_| rng.range(lo, hi) as i64).collect();
            pos.sort();
            let lse = with_lse.then(|| {
                let mut l = vec![0f32; hq * c];
                for h in 0..hq {
                    for j in 0..c {
                        let last = (pos[j] as usize).min(n - 1);
                        l[h * c + j] = softmax_row(qr.row(h, j), &kr, h / g, last).1 as f32;
                    }
                }
                l
            });
            chunks.push(Chunk { q: qs, pos, lse });
        }
        // the core
        let sh = StreamShape { hq, hkv, n, dk };
        let mut state = vec![0u64; stream_state_size(&sh).unwrap().div_ceil(8)];
        // SAFETY: a Vec<u64> is len*8 initialised, 8-aligned bytes.
        let st = unsafe {
            std::slice::from_raw_parts_mut(state.as_mut_ptr() as *mut u8, state.len() * 8)
        };
        stream_init(&sh, st).unwrap();
        let mut ws = vec![0u8; stream_feed_workspace_size(&sh, 11).unwrap()];
        for ch in &chunks {
            stream_feed(
                st,
                &ch.q.view(),
                &ch.pos,
                &ks.view(),
                ch.lse.as_deref(),
                &mut ws,
            )
            .unwrap();
        }
        let want = stream_stats(st).unwrap();
        // the launcher
        let kb = upload(&ks);
        let kv = dview(&ks, &kb);
        let zeros = vec![0f32; hq * n];
        let acc = Acc {
            max: Buf::bytes_of(&zeros),
            sum: Buf::bytes_of(&zeros),
            sq: Buf::bytes_of(&zeros),
        };
        let wsb = unsafe { kve_cuda_stream_feed_workspace_size(hq as i64, 11) };
        let dws = Buf::bytes_of(&vec![0u8; wsb]);
        for ch in &chunks {
            assert_eq!(
                unsafe { feed(&kv, ch, &acc, &dws, wsb) },
                0,
                "{dt:?} {lay:?} g{g}"
            );
        }
        let got = [
            acc.max.download_as::<f32>(hq * n),
            acc.sum.download_as::<f32>(hq * n),
            acc.sq.download_as::<f32>(hq * n),
        ];
        for (what, a, b) in [
            ("max", &got[0], want.max),
            ("sum", &got[1], want.sum),
            ("sq", &got[2], want.sq),
        ] {
            let what = format!("{dt:?} {lay:?} g{g} {what}");
            near(a, b, 2e-5, &what);
        }
    }
}
