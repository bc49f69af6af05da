//! `kve_cuda_evictor_score_layer_paged` / `kve_cuda_evictor_compact_paged` (issue 30)
//! against the host C evictor's paged calls on the same pools and table: the same kept
//! cells, the compacted pools byte for byte, the same `blocks_freed`; hostile tables get
//! the host calls' statuses and write neither the device block nor the pool.

use super::*;
use kvevict::capi::kve_cuda_evictor;

const L: usize = 2;
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 16;
const N: usize = 60;

fn dtensor(p: *const c_void, len: usize, e: [usize; 3]) -> kve_tensor {
    kve_tensor {
        data: p,
        len: len as u64,
        dtype: kvevict::DType::F32 as u32,
        pad: 0,
        extent: e.map(|x| x as u64),
        stride: [(e[1] * e[2]) as u64, e[2] as u64, 1],
    }
}

/// One layer's pool `[2, nb, bs, Hkv, d]` (vLLM's FlashAttention layout), host and device.
struct Pools {
    host: Vec<Vec<f32>>,
    dev: Vec<conformance::DBuf<f32>>,
    table: Vec<u32>,
    nb: usize,
    bs: usize,
}

impl Pools {
    fn new(k: &[Vec<f32>], v: &[Vec<f32>], bs: usize, rng: &mut Rng) -> Pools {
        let used = N.div_ceil(bs);
        let nb = 2 * used + 1;
        let table: Vec<u32> = (0..used).map(|b| ((5 * b + 3) % nb) as u32).collect();
        let mut p = Pools {
            host: vec![],
            dev: vec![],
            table,
            nb,
            bs,
        };
        for l in 0..L {
            let mut pool = rng.normals(2 * nb * bs * HKV * D, 1.0);
            for (kv, src) in [&k[l], &v[l]].into_iter().enumerate() {
                for h in 0..HKV {
                    for t in 0..N {
                        let at = p.at(kv, t, h);
                        pool[at..at + D].copy_from_slice(&src[(h * N + t) * D..][..D]);
                    }
                }
            }
            p.dev.push(conformance::DBuf::from(&pool));
            p.host.push(pool);
        }
        p
    }
    fn at(&self, kv: usize, t: usize, h: usize) -> usize {
        let block = self.table[t / self.bs] as usize;
        ((kv * self.nb + block) * self.bs + t % self.bs) * HKV * D + h * D
    }
    /// Layer `l`'s K (0) or V (1), host or device memory.
    fn layout(&self, l: usize, kv: u32, device: bool) -> kve_paged_layout {
        let data = match device {
            true => self.dev[l].vptr() as *const c_void,
            false => self.host[l].as_ptr() as *const c_void,
        };
        let len = self.host[l].len();
        let kind = kvevict::PagedKind::NhdKvOuter;
        capi_common::paged_f32_layout(kind, data, len, [self.nb, self.bs, HKV, D], kv)
    }
    fn views(&self, l: usize, q: kve_tensor, device: bool) -> kve_evictor_paged_layer {
        let mut v = std::mem::MaybeUninit::<kve_evictor_paged_layer>::uninit();
        // SAFETY: a writable struct of the size passed.
        let st = unsafe {
            kve_evictor_paged_layer_init(v.as_mut_ptr(), KVE_EVICTOR_PAGED_LAYER_V1_SIZE)
        };
        assert_eq!(st, KVE_OK);
        // SAFETY: initialised above.
        let mut v = unsafe { v.assume_init() };
        v.keys = self.layout(l, 0, device);
        v.values = self.layout(l, 1, device);
        (v.table, v.table_len) = (self.table.as_ptr(), self.table.len() as u64);
        v.queries = q;
        v
    }
}

#[test]
fn device_paged_evictor_through_c_matches_the_host_one() {
    let mut rng = device_rng!(3030);
    for (preset, bs) in [
        (kvevict::Preset::LaProxSpan, 16),
        (kvevict::Preset::SnapKv, 7),
        (kvevict::Preset::KNorm, 1),
    ] {
        let tag = format!("{preset:?} bs {bs}");
        let mut c = std::mem::MaybeUninit::<kve_evictor_config>::uninit();
        // SAFETY: a writable struct of the size passed.
        let st = unsafe {
            kve_evictor_config_init(c.as_mut_ptr(), KVE_EVICTOR_CONFIG_V2_SIZE, preset as u32)
        };
        assert_eq!(st, KVE_OK);
        // SAFETY: initialised above.
        let mut c = unsafe { c.assume_init() };
        (c.layers, c.hq, c.hkv, c.dk, c.dv, c.d_model) =
            (L as u64, HQ as u64, HKV as u64, D as u64, D as u64, 16);
        (c.max_cells, c.max_seqs, c.granularity) = (N as u64, 1, Granularity::Token as u32);
        c.paged = 1;
        // the host context
        let mut hb = 0u64;
        // SAFETY: valid pointers.
        assert_eq!(unsafe { kve_evictor_size(&c, &mut hb) }, KVE_OK);
        let mut hmem = vec![0u8; hb as usize];
        let mut he = null_mut();
        // SAFETY: `hb` writable bytes.
        let st = unsafe { kve_evictor_init(hmem.as_mut_ptr() as *mut c_void, hb, &c, &mut he) };
        assert_eq!(st, KVE_OK);
        // the device context
        let (mut ch, mut cd) = (0u64, 0u64);
        // SAFETY: valid pointers.
        assert_eq!(
            unsafe { kve_cuda_evictor_size(&c, &mut ch, &mut cd) },
            KVE_OK
        );
        let mut dmem = vec![0u8; ch as usize];
        let block = Buf::new(cd as usize);
        let mut de: *mut kve_cuda_evictor = null_mut();
        // SAFETY: host and device memory of the sizes reported.
        let st = unsafe {
            kve_cuda_evictor_init(
                dmem.as_mut_ptr() as *mut c_void,
                ch,
                block.vptr(),
                cd,
                &c,
                &mut de,
            )
        };
        assert_eq!(st, KVE_OK, "{tag}: init");
        let k: Vec<Vec<f32>> = (0..L).map(|_| rng.normals(HKV * N * D, 1.0)).collect();
        let v: Vec<Vec<f32>> = (0..L).map(|_| rng.normals(HKV * N * D, 1.0)).collect();
        let q: Vec<Vec<f32>> = (0..L).map(|_| rng.normals(HQ * N * D, 1.0)).collect();
        let qd: Vec<conformance::DBuf<f32>> =
            q.iter().map(|x| conformance::DBuf::from(x)).collect();
        let m = Pools::new(&k, &v, bs, &mut rng);
        let target = 25u64;
        // SAFETY: valid pointers and sizes throughout; device memory where the calls take it.
        unsafe {
            for l in 0..L {
                let wo = rng.normals(HQ * D * 16, 0.2);
                let t = dtensor(wo.as_ptr() as _, wo.len(), [HQ, D, 16]);
                let a = kve_evictor_set_output_projection(he, l as u64, &t);
                let b = kve_cuda_evictor_set_output_projection(de, l as u64, &t, null_mut());
                assert_eq!(a, b, "{tag}: set_output_projection");
            }
            assert_eq!(kve_evictor_begin(he, 0, N as u64, target), KVE_OK);
            assert_eq!(kve_cuda_evictor_begin(de, 0, N as u64, target), KVE_OK);
            // hostile tables: the host call's status, nothing written on the device
            let used = m.table.len();
            let mut bad: Vec<Vec<u32>> = vec![m.table[..used - 1].to_vec()];
            let mut t = m.table.clone();
            t[1] = m.nb as u32;
            bad.push(t);
            let mut t = m.table.clone();
            t[used - 1] = u32::MAX;
            bad.push(t);
            if used > 1 {
                let mut t = m.table.clone();
                t[used - 1] = t[0];
                bad.push(t);
            }
            let dev_before = block.download();
            let pool_before = m.dev[0].download();
            for t in &bad {
                let hq = dtensor(q[0].as_ptr() as _, q[0].len(), [HQ, N, D]);
                let mut hv = m.views(0, hq, false);
                (hv.table, hv.table_len) = (t.as_ptr(), t.len() as u64);
                let dq = dtensor(qd[0].vptr(), q[0].len(), [HQ, N, D]);
                let mut dv = m.views(0, dq, true);
                (dv.table, dv.table_len) = (t.as_ptr(), t.len() as u64);
                let a = kve_evictor_score_layer_paged(he, 0, 0, &hv);
                let b = kve_cuda_evictor_score_layer_paged(de, 0, 0, &dv, null_mut());
                assert_ne!(a, KVE_OK, "{tag}: host accepts a bad table");
                assert_eq!(a, b, "{tag}: score_layer_paged status");
            }
            assert!(
                block.download() == dev_before,
                "{tag}: device block written"
            );
            // a pool in host memory handed to the device evictor overlaps nothing; one in
            // its device block is refused
            let dq = dtensor(qd[0].vptr(), q[0].len(), [HQ, N, D]);
            let mut dv = m.views(0, dq, true);
            dv.keys.data = block.vptr();
            dv.keys.len = cd / 4;
            let st = kve_cuda_evictor_score_layer_paged(de, 0, 0, &dv, null_mut());
            assert_ne!(st, KVE_OK, "{tag}: a pool inside the device block");
            dv.keys = m.layout(0, 0, true);
            dv.wo = dtensor(q[0].as_ptr() as _, q[0].len(), [HQ, N, D]);
            let st = kve_cuda_evictor_score_layer_paged(de, 0, 0, &dv, null_mut());
            assert_eq!(st, KVE_ERR_INVALID_ARGUMENT, "{tag}: wo given");
            for l in 0..L {
                let hq = dtensor(q[l].as_ptr() as _, q[l].len(), [HQ, N, D]);
                let dq = dtensor(qd[l].vptr(), q[l].len(), [HQ, N, D]);
                let (hv, dv) = (m.views(l, hq, false), m.views(l, dq, true));
                assert_eq!(kve_evictor_score_layer_paged(he, 0, l as u64, &hv), KVE_OK);
                let st = kve_cuda_evictor_score_layer_paged(de, 0, l as u64, &dv, null_mut());
                assert_eq!(st, KVE_OK, "{tag}: device score");
            }
            let (mut ka, mut kb) = (0u64, 0u64);
            assert_eq!(kve_evictor_select(he, 0, &mut ka), KVE_OK);
            assert_eq!(kve_cuda_evictor_select(de, 0, &mut kb, null_mut()), KVE_OK);
            assert_eq!(ka, kb, "{tag}: kept cells");
            let mut cells = vec![0u32; N];
            let mut na = 0u64;
            let st = kve_evictor_kept_cells(he, 0, cells.as_mut_ptr(), N as u64, &mut na);
            assert_eq!(st, KVE_OK);
            let (mut cp, mut ip, mut ld) = (null(), null(), 0u64);
            let st = kve_cuda_evictor_kept_lists(de, 0, &mut cp, &mut ip, &mut ld);
            assert_eq!(st, KVE_OK);
            let idx = download_i32(ip, ld as usize);
            let got: Vec<u32> = idx[..na as usize].iter().map(|&x| x as u32).collect();
            assert_eq!(got, cells[..na as usize], "{tag}: kept lists");
            // compaction: bad table first (nothing moves), then every layer, K and V
            let lay = m.layout(0, 0, true);
            let mut t = m.table.clone();
            t[0] = m.nb as u32;
            let mut freed = 77u64;
            let st = kve_cuda_evictor_compact_paged(
                de,
                0,
                0,
                &lay,
                t.as_ptr(),
                t.len() as u64,
                &mut freed,
                null_mut(),
            );
            assert_eq!((st, freed), (KVE_ERR_OUT_OF_BOUNDS, 77), "{tag}");
            assert!(m.dev[0].download() == pool_before, "{tag}: pool written");
            for l in 0..L {
                for kv in 0..2u32 {
                    let (tp, tl) = (m.table.as_ptr(), m.table.len() as u64);
                    let (mut fa, mut fb) = (0u64, 0u64);
                    let hl = m.layout(l, kv, false);
                    assert_eq!(
                        kve_evictor_compact_paged(he, 0, l as u64, &hl, tp, tl, &mut fa),
                        KVE_OK
                    );
                    let dl = m.layout(l, kv, true);
                    let st = kve_cuda_evictor_compact_paged(
                        de,
                        0,
                        l as u64,
                        &dl,
                        tp,
                        tl,
                        &mut fb,
                        null_mut(),
                    );
                    assert_eq!(st, KVE_OK, "{tag}: device compact");
                    assert_eq!(fa, fb, "{tag}: blocks freed");
                    assert_eq!(fa as usize, N.div_ceil(bs) - (na as usize).div_ceil(bs));
                    let got = m.dev[l].download();
                    assert!(
                        got.iter()
                            .zip(&m.host[l])
                            .all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{tag}: layer {l} kv {kv}: pools differ"
                    );
                }
            }
            assert_eq!(kve_evictor_commit(he, 0), KVE_OK);
            assert_eq!(kve_cuda_evictor_commit(de, 0), KVE_OK);
            let freed = N.div_ceil(bs) - (na as usize).div_ceil(bs);
            println!("{tag}: {na} of {N} kept, pools identical, {freed} blocks freed");
        }
    }
}

/// `n` int32 of device memory at `p`, after the device is idle.
fn download_i32(p: *const i32, n: usize) -> Vec<i32> {
    let mut v = vec![0i32; n];
    conformance::device_sync("sync before download");
    // SAFETY: `n` int32 of device memory into a host vector of `n`.
    unsafe {
        let st =
            conformance::rt::cudaMemcpy(v.as_mut_ptr() as _, p as _, n * 4, conformance::rt::D2H);
        assert_eq!(st, 0);
    }
    v
}
