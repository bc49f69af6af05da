//! Edge cases of the CUDA launchers' test double (`src/cuda/mock.rs`, feature `cuda-mock`)
//! against the CPU core, on host buffers: strided and in-place head reductions and
//! LaProx-exact terms, layer statistics, ties / NaN / edge budgets of the selection, shards
//! on the device, forced entries, broadcast lists and budgets, compaction, token reduction;
//! bit for bit where the mock runs the core's arithmetic, invalid arguments give 1 and
//! leave every output untouched. Every launcher's conformance (the same cases on the mock
//! and on the kernels, against f64 references) is `tests/launchers.rs`.
#![cfg(all(feature = "cuda-mock", not(feature = "cuda")))]
#![allow(clippy::needless_range_loop)]

use half::f16;
use kvevict::cuda::*;
use kvevict::select::Histogram;
use kvevict::*;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

const INVALID: i32 = 1;
const SENTINEL: f32 = -12345.0;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) & 0xFFFF) as f32 / 32768.0 - 1.0
    }
    fn vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.next() * scale).collect()
    }
    /// Non-negative scores on a coarse grid, so ties happen.
    fn coarse(&mut self, len: usize) -> Vec<f32> {
        (0..len)
            .map(|_| ((self.next() + 1.0) * 20.0).floor() / 7.0)
            .collect()
    }
}

fn view<T>(data: &[T], dtype: i32, ext: [usize; 3], st: [usize; 3]) -> KveCudaView {
    KveCudaView {
        data: data.as_ptr() as *mut c_void,
        dtype,
        reserved: 0,
        stride_head: st[0] as i64,
        stride_token: st[1] as i64,
        stride_dim: st[2] as i64,
        heads: ext[0] as i64,
        tokens: ext[1] as i64,
        dim: ext[2] as i64,
    }
}

/// A descriptor the launcher may write through (compaction).
fn view_mut<T>(data: &mut [T], dtype: i32, ext: [usize; 3], st: [usize; 3]) -> KveCudaView {
    KveCudaView {
        data: data.as_mut_ptr() as *mut c_void,
        ..view(data, dtype, ext, st)
    }
}

fn close(got: f32, want: f64, rel: f64, abs: f64) -> bool {
    (got as f64 - want).abs() <= rel * want.abs() + abs
}

fn null_stream() -> *mut c_void {
    null_mut()
}

// ------------------------------------------------------------------- helpers --

// ------------------------------------------------------------ pool and reductions --

#[test]
fn head_reduce_strided_and_in_place() {
    let mut r = Rng(41);
    let (hq, hkv, n, lda, ldb, ldo) = (6, 2, 19, 23, 21, 20);
    let a = r.vec(hq * lda, 1.0);
    let b = r.vec(hq * ldb, 1.0);
    let scale = [0.5f32, 2.0];
    let g = hq / hkv;
    for b_mode in 0..3 {
        for op in 0..3 {
            let mut out = vec![SENTINEL; hkv * ldo];
            let rc = unsafe {
                kve_cuda_head_reduce(
                    a.as_ptr(),
                    lda as i64,
                    b.as_ptr(),
                    ldb as i64,
                    b_mode,
                    scale.as_ptr(),
                    out.as_mut_ptr(),
                    ldo as i64,
                    hq as i64,
                    hkv as i64,
                    n as i64,
                    op,
                    null_stream(),
                )
            };
            assert_eq!(rc, 0);
            for hk in 0..hkv {
                for i in 0..n {
                    let xs: Vec<f64> = (0..g)
                        .map(|hh| {
                            let h = hk * g + hh;
                            let f = match b_mode {
                                1 => (b[h * ldb + i].max(0.0) as f64).sqrt(),
                                2 => b[h * ldb + i] as f64,
                                _ => 1.0,
                            };
                            a[h * lda + i] as f64 * f * scale[hk] as f64
                        })
                        .collect();
                    let want = match op {
                        0 => xs.iter().sum::<f64>() / g as f64,
                        1 => xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                        _ => xs.iter().sum::<f64>(),
                    };
                    assert!(
                        close(out[hk * ldo + i], want, 1e-6, 1e-7),
                        "b{b_mode} op{op} hk{hk} i{i}"
                    );
                }
                assert!(out[hk * ldo + n..(hk + 1) * ldo]
                    .iter()
                    .all(|&v| v == SENTINEL));
            }
        }
    }
    // in place, Hkv == Hq
    let mut x = a.clone();
    let rc = unsafe {
        kve_cuda_head_reduce(
            x.as_ptr(),
            lda as i64,
            b.as_ptr(),
            ldb as i64,
            2,
            null(),
            x.as_mut_ptr(),
            lda as i64,
            hq as i64,
            hq as i64,
            n as i64,
            KVE_CUDA_GQA_SUM,
            null_stream(),
        )
    };
    assert_eq!(rc, 0);
    for h in 0..hq {
        for i in 0..n {
            assert_eq!(x[h * lda + i], a[h * lda + i] * b[h * ldb + i]);
        }
    }
    // b_mode 0: b may be NULL; rejections
    let mut out = vec![SENTINEL; hkv * ldo];
    assert_eq!(
        unsafe {
            kve_cuda_head_reduce(
                a.as_ptr(),
                lda as i64,
                null(),
                0,
                0,
                null(),
                out.as_mut_ptr(),
                ldo as i64,
                hq as i64,
                hkv as i64,
                n as i64,
                0,
                null_stream(),
            )
        },
        0
    );
    out.fill(SENTINEL);
    for (bm, hk, ld_b, op) in [
        (1, 2, ldb, 0),
        (0, 4, ldb, 0),
        (3, 2, ldb, 0),
        (0, 2, ldb, 3),
        (2, 2, 5, 0),
    ] {
        let bp = if bm == 1 { null() } else { b.as_ptr() };
        let rc = unsafe {
            kve_cuda_head_reduce(
                a.as_ptr(),
                lda as i64,
                bp,
                ld_b as i64,
                bm,
                null(),
                out.as_mut_ptr(),
                ldo as i64,
                hq as i64,
                hk,
                n as i64,
                op,
                null_stream(),
            )
        };
        assert_eq!(rc, INVALID, "b_mode {bm} hkv {hk} op {op}");
    }
    assert!(out.iter().all(|&v| v == SENTINEL));
    // in place only element for element: not with g > 1, not with another row stride
    let mut x = a.clone();
    for (hk, ld_o) in [(hkv, lda), (hq, lda + 1)] {
        let rc = unsafe {
            kve_cuda_head_reduce(
                x.as_ptr(),
                lda as i64,
                null(),
                0,
                0,
                null(),
                x.as_mut_ptr(),
                ld_o as i64,
                hq as i64,
                hk as i64,
                n as i64,
                0,
                null_stream(),
            )
        };
        assert_eq!(rc, INVALID, "in place hkv {hk} ld_out {ld_o}");
    }
    assert_eq!(x, a);
}

#[test]
fn laprox_exact_strided_and_rejections() {
    let mut r = Rng(51);
    let (hkv, g, n, ld) = (2, 3, 17, 20);
    let np = g * (g + 1) / 2;
    let cross: Vec<f32> = r.vec(hkv * np * ld, 1.0).iter().map(|v| v.abs()).collect();
    let qv: Vec<f32> = r.vec(hkv * np * ld, 1.0);
    let mut out = vec![SENTINEL; hkv * 25];
    let rc = unsafe {
        kve_cuda_laprox_exact(
            cross.as_ptr(),
            ld as i64,
            qv.as_ptr(),
            ld as i64,
            out.as_mut_ptr(),
            25,
            hkv as i64,
            g as i64,
            n as i64,
            0,
            null_stream(),
        )
    };
    assert_eq!(rc, 0);
    for hk in 0..hkv {
        for i in 0..n {
            let s: f64 = (0..np)
                .map(|p| {
                    (if p < g { 1.0 } else { 2.0 })
                        * cross[(hk * np + p) * ld + i] as f64
                        * qv[(hk * np + p) * ld + i] as f64
                })
                .sum();
            assert!(close(out[hk * 25 + i], s.max(0.0).sqrt(), 1e-5, 1e-6));
        }
        assert!(out[hk * 25 + n..(hk + 1) * 25]
            .iter()
            .all(|&v| v == SENTINEL));
    }
    out.fill(SENTINEL);
    for (mode, c, q, ldc) in [
        (0, null(), qv.as_ptr(), ld),
        (1, cross.as_ptr(), null(), ld),
        (4, cross.as_ptr(), qv.as_ptr(), ld),
        (0, cross.as_ptr(), qv.as_ptr(), 5),
    ] {
        let rc = unsafe {
            kve_cuda_laprox_exact(
                c,
                ldc as i64,
                q,
                ld as i64,
                out.as_mut_ptr(),
                25,
                hkv as i64,
                g as i64,
                n as i64,
                mode,
                null_stream(),
            )
        };
        assert_eq!(rc, INVALID, "mode {mode}");
    }
    let rc = unsafe {
        kve_cuda_laprox_exact(
            cross.as_ptr(),
            ld as i64,
            qv.as_ptr(),
            ld as i64,
            out.as_mut_ptr(),
            25,
            hkv as i64,
            65,
            n as i64,
            0,
            null_stream(),
        )
    };
    assert_eq!(rc, INVALID);
    assert!(out.iter().all(|&v| v == SENTINEL));
}

// -------------------------------------------------------------- layer statistics --

// ------------------------------------------------------------------- selection --

struct Model {
    layers: usize,
    hkv: usize,
    n: usize,
    w: usize,
    s: Vec<f32>,
}

impl Model {
    fn p(&self) -> usize {
        self.n - self.w.min(self.n)
    }
    fn core(&self, cfg: &SelectConfig) -> (Vec<u64>, Vec<u32>) {
        let m = ModelScores {
            scores: &self.s,
            layers: self.layers,
            hkv: self.hkv,
            n: self.n,
            window: self.w,
        };
        let (no, ni) = select_output_len(cfg, self.layers, self.hkv, self.n, self.w).unwrap();
        let (mut off, mut idx) = (vec![0u64; no], vec![0u32; ni]);
        let mut ws =
            vec![0u8; select_workspace_size(cfg, self.layers, self.hkv, self.n, self.w).unwrap()];
        select_model(cfg, &m, &mut off, &mut idx, &mut ws).unwrap();
        (off, idx)
    }
    /// The core's prefix lists per (layer, head) (window positions dropped).
    fn core_lists(&self, cfg: &SelectConfig) -> Vec<Vec<i32>> {
        let (off, idx) = self.core(cfg);
        let p = self.p() as u32;
        (0..self.layers * self.hkv)
            .map(|u| {
                idx[off[u] as usize..off[u + 1] as usize]
                    .iter()
                    .filter(|&&i| i < p)
                    .map(|&i| i as i32)
                    .collect()
            })
            .collect()
    }
    unsafe fn layer_stats(&self) -> (Vec<f64>, Vec<f64>) {
        let count = self.hkv * self.p();
        let wsz = kve_cuda_layer_stats_workspace_size(self.layers as i64, count as i64);
        let mut ws = vec![0u8; wsz];
        let (mut sums, mut ent) = (vec![0f64; self.layers], vec![0f64; self.layers]);
        let rc = kve_cuda_layer_stats(
            self.s.as_ptr(),
            count as i64,
            count as i64,
            self.layers as i64,
            sums.as_mut_ptr(),
            ent.as_mut_ptr(),
            ws.as_mut_ptr() as *mut c_void,
            wsz,
            null_stream(),
        );
        assert_eq!(rc, 0);
        (sums, ent)
    }
}

/// kve_cuda_select over `rows` rows of `scores` (row stride p): the lists per row.
#[allow(clippy::too_many_arguments)]
unsafe fn select(
    scores: &[f32],
    p: usize,
    n_groups: usize,
    rpg: usize,
    k: Option<&[i64]>,
    k_all: i64,
    layer_sum: Option<&[f64]>,
    rpl: usize,
) -> Vec<Vec<i32>> {
    let rows = n_groups * rpg;
    let idx_ld = p + 3;
    let mut counts = vec![-7i32; rows];
    let mut idx = vec![-7i32; rows * idx_ld];
    let wsz = kve_cuda_select_workspace_size(n_groups as i64);
    let mut ws = vec![0u8; wsz];
    let rc = kve_cuda_select(
        scores.as_ptr(),
        p as i64,
        p as i64,
        n_groups as i64,
        rpg as i64,
        k.map_or(null(), |k| k.as_ptr()),
        k_all,
        layer_sum.map_or(null(), |s| s.as_ptr()),
        rpl as i64,
        counts.as_mut_ptr(),
        idx.as_mut_ptr(),
        idx_ld as i64,
        ws.as_mut_ptr() as *mut c_void,
        wsz,
        null_stream(),
    );
    assert_eq!(rc, 0);
    (0..rows)
        .map(|r| {
            let c = counts[r] as usize;
            assert!(idx[r * idx_ld + c..(r + 1) * idx_ld]
                .iter()
                .all(|&v| v == -7));
            idx[r * idx_ld..r * idx_ld + c].to_vec()
        })
        .collect()
}

#[test]
fn select_ties_nan_and_edges() {
    // equal keys: later position first, then the lower row
    let s = vec![1.0f32; 2 * 4];
    let got = unsafe { select(&s, 4, 1, 2, None, 3, None, 1) };
    assert_eq!(got, vec![vec![2, 3], vec![3]]);
    // NaN ranks lowest, -inf above it, +inf on top
    let s = vec![f32::NAN, f32::NEG_INFINITY, 0.5, f32::INFINITY];
    assert_eq!(
        unsafe { select(&s, 4, 1, 1, None, 2, None, 1) },
        vec![vec![2, 3]]
    );
    assert_eq!(
        unsafe { select(&s, 4, 1, 1, None, 3, None, 1) },
        vec![vec![1, 2, 3]]
    );
    // k <= 0 keeps none, k >= size keeps all; per-group k
    let k = [-1i64, 9];
    assert_eq!(
        unsafe { select(&s, 2, 2, 1, Some(&k), 0, None, 1) },
        vec![vec![], vec![0, 1]]
    );
    // n == 0: counts zeroed, nothing else read
    let mut counts = vec![5i32; 3];
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
            counts.as_mut_ptr(),
            null_mut(),
            0,
            null_mut(),
            0,
            null_stream(),
        )
    };
    assert_eq!((rc, counts), (0, vec![0; 3]));
    // rejections
    let mut counts = vec![5i32; 2];
    let mut idx = vec![5i32; 8];
    let wsz = unsafe { kve_cuda_select_workspace_size(2) };
    let mut ws = vec![0u8; wsz];
    let sums = [1.0f64];
    for (ld, idx_ld, wsb, ls, rpl) in [
        (3, 4, wsz, null(), 0),
        (4, 3, wsz, null(), 0),
        (4, 4, wsz - 1, null(), 0),
        (4, 4, wsz, sums.as_ptr(), 0),
    ] {
        let rc = unsafe {
            kve_cuda_select(
                s.as_ptr(),
                ld,
                4,
                2,
                1,
                null(),
                1,
                ls,
                rpl,
                counts.as_mut_ptr(),
                idx.as_mut_ptr(),
                idx_ld,
                ws.as_mut_ptr() as *mut c_void,
                wsb,
                null_stream(),
            )
        };
        assert_eq!(rc, INVALID);
    }
    assert!(counts.iter().all(|&c| c == 5) && idx.iter().all(|&c| c == 5));
}

#[test]
fn shards_equal_select_model() {
    let mut r = Rng(303);
    let (layers, hkv, n, w, budget) = (5, 2, 45, 5, 7u64);
    let p = n - w;
    let m = Model {
        layers,
        hkv,
        n,
        w,
        s: r.coarse(layers * hkv * p),
    };
    let (sums, _) = unsafe { m.layer_stats() };
    let cfg = SelectConfig::new(AllocatorKind::Global, Granularity::Head, budget);
    let want = m.core_lists(&cfg);
    // two shards of layers [0, 2) and [2, 5), each with its own rows and sums
    let shards = [(0usize, 2usize), (2, 3)];
    let mut search = kvevict::shard::search_new(&cfg, layers, hkv, n, w).unwrap();
    let mut rounds = 0;
    while !search.done {
        let mut h = Histogram::default();
        for &(l0, ln) in &shards {
            let mut hs = [0u64; 256];
            let rc = unsafe {
                kve_cuda_shard_count(
                    m.s[l0 * hkv * p..].as_ptr(),
                    p as i64,
                    p as i64,
                    (ln * hkv) as i64,
                    (l0 * hkv) as i64,
                    sums[l0..].as_ptr(),
                    hkv as i64,
                    (search.prefix >> 64) as u64,
                    search.prefix as u64,
                    search.bits,
                    hs.as_mut_ptr(),
                    null_stream(),
                )
            };
            assert_eq!(rc, 0);
            h.merge(&Histogram(hs));
        }
        search.step(&h);
        rounds += 1;
        assert!(rounds <= 13);
    }
    let mut got = Vec::new();
    for &(l0, ln) in &shards {
        let rows = ln * hkv;
        let (mut counts, mut idx) = (vec![0i32; rows], vec![0i32; rows * p]);
        let rc = unsafe {
            kve_cuda_shard_select(
                m.s[l0 * hkv * p..].as_ptr(),
                p as i64,
                p as i64,
                rows as i64,
                (l0 * hkv) as i64,
                sums[l0..].as_ptr(),
                hkv as i64,
                (search.threshold >> 64) as u64,
                search.threshold as u64,
                counts.as_mut_ptr(),
                idx.as_mut_ptr(),
                p as i64,
                null_stream(),
            )
        };
        assert_eq!(rc, 0);
        for u in 0..rows {
            got.push(idx[u * p..u * p + counts[u] as usize].to_vec());
        }
    }
    assert_eq!(got, want);
    // KEEP_NOTHING keeps none; bad search states are rejected with hist untouched
    let mut counts = vec![9i32; 2];
    let mut idx = vec![0i32; 2 * p];
    let rc = unsafe {
        kve_cuda_shard_select(
            m.s.as_ptr(),
            p as i64,
            p as i64,
            2,
            0,
            null(),
            0,
            u64::MAX,
            u64::MAX,
            counts.as_mut_ptr(),
            idx.as_mut_ptr(),
            p as i64,
            null_stream(),
        )
    };
    assert_eq!((rc, counts), (0, vec![0, 0]));
    let mut hs = [3u64; 256];
    for (hi, lo, bits) in [(0, 5, 0), (0, 0, 4), (0, 0, 104), (0, 256, 8)] {
        let rc = unsafe {
            kve_cuda_shard_count(
                m.s.as_ptr(),
                p as i64,
                p as i64,
                2,
                0,
                null(),
                0,
                hi,
                lo,
                bits,
                hs.as_mut_ptr(),
                null_stream(),
            )
        };
        assert_eq!(rc, INVALID, "prefix {lo} bits {bits}");
    }
    assert!(hs.iter().all(|&c| c == 3));
}

#[test]
fn mark_forced_broadcast_budgets_rejections() {
    let mut s = vec![0.5f32; 2 * 6];
    let counts = [2i32, 1];
    let idx = [0i32, 5, 0, 0, 3, 0, 0, 0];
    assert_eq!(
        unsafe {
            kve_cuda_mark_forced(
                s.as_mut_ptr(),
                6,
                2,
                counts.as_ptr(),
                idx.as_ptr(),
                4,
                null_stream(),
            )
        },
        0
    );
    let inf = f32::INFINITY;
    assert_eq!(
        s,
        vec![inf, 0.5, 0.5, 0.5, 0.5, inf, 0.5, 0.5, 0.5, inf, 0.5, 0.5]
    );
    // positions outside the row are skipped (as the kernel); negative counts mark none
    let mut s2 = vec![0.5f32; 12];
    let bad = [-1i32, 6, 0, 0, 3, 0, 0, 0];
    assert_eq!(
        unsafe {
            kve_cuda_mark_forced(
                s2.as_mut_ptr(),
                6,
                2,
                counts.as_ptr(),
                bad.as_ptr(),
                4,
                null_stream(),
            )
        },
        0
    );
    assert!(s2[..6].iter().all(|&v| v == 0.5));
    assert_eq!(s2[6 + 3], inf);
    let neg = [-3i32, 1];
    let mut s3 = vec![0.5f32; 12];
    let rc = unsafe {
        kve_cuda_mark_forced(
            s3.as_mut_ptr(),
            6,
            2,
            neg.as_ptr(),
            idx.as_ptr(),
            4,
            null_stream(),
        )
    };
    assert_eq!(rc, 0);
    assert_eq!(s3.iter().filter(|v| v.is_infinite()).count(), 1);
    // null lists are rejected, nothing written
    let rc = unsafe {
        kve_cuda_mark_forced(
            s3.as_mut_ptr(),
            6,
            2,
            null(),
            idx.as_ptr(),
            4,
            null_stream(),
        )
    };
    assert_eq!(rc, INVALID);

    // broadcast: two source rows, three copies each
    let (sc, si) = ([2i32, 0], [4i32, 7, -1, 9, 9, 9]);
    let (mut c, mut i) = (vec![-1i32; 6], vec![-1i32; 6 * 3]);
    assert_eq!(
        unsafe {
            kve_cuda_broadcast_lists(
                sc.as_ptr(),
                si.as_ptr(),
                3,
                2,
                3,
                c.as_mut_ptr(),
                i.as_mut_ptr(),
                3,
                null_stream(),
            )
        },
        0
    );
    assert_eq!(c, vec![2, 2, 2, 0, 0, 0]);
    for u in 0..3 {
        assert_eq!(&i[u * 3..u * 3 + 3], &[4, 7, -1]);
    }
    assert!(i[9..].iter().all(|&v| v == -1));
    // outputs over the sources, reps < 0: rejected, nothing written
    let mut sc2 = vec![2i32, 0, -1, -1, -1, -1];
    let mut i = vec![-1i32; 6 * 3];
    let rc = unsafe {
        let c = sc2.as_mut_ptr();
        kve_cuda_broadcast_lists(c, si.as_ptr(), 3, 2, 3, c, i.as_mut_ptr(), 3, null_stream())
    };
    assert_eq!(rc, INVALID);
    let rc = unsafe {
        let c = sc2.as_mut_ptr();
        kve_cuda_broadcast_lists(si.as_ptr(), c, 3, 2, 3, c, i.as_mut_ptr(), 3, null_stream())
    };
    assert_eq!(rc, INVALID);
    let rc = unsafe {
        kve_cuda_broadcast_lists(
            sc.as_ptr(),
            si.as_ptr(),
            3,
            2,
            -1,
            sc2.as_mut_ptr(),
            i.as_mut_ptr(),
            3,
            null_stream(),
        )
    };
    assert_eq!(rc, INVALID);
    assert_eq!(sc2, vec![2, 0, -1, -1, -1, -1]);
    assert!(i.iter().all(|&v| v == -1));

    // budgets: bad mode, lava without weights, pyramid beta 0, alpha out of range,
    // per_layer 0 (even without layers), layers < 0, layers·per_layer·p >= 2^62
    let (mut kl, mut ku) = (vec![-1i64; 3], vec![-1i64; 6]);
    for (mode, layers, per, p, beta, alpha) in [
        (4, 3, 2, 10, 20, 0.2f32),
        (3, 3, 2, 10, 20, 0.2),
        (1, 3, 2, 10, 0, 0.2),
        (2, 3, 2, 10, 20, 1.5),
        (2, 3, 2, 10, 20, f32::NAN),
        (0, 3, 0, 10, 20, 0.2),
        (0, 0, 0, 10, 20, 0.2),
        (0, -1, 2, 10, 20, 0.2),
        (0, 4, 1 << 30, 1 << 30, 20, 0.2),
    ] {
        let rc = unsafe {
            kve_cuda_layer_budgets(
                mode,
                null(),
                layers,
                per,
                p,
                4,
                beta,
                alpha,
                kl.as_mut_ptr(),
                ku.as_mut_ptr(),
                null_stream(),
            )
        };
        assert_eq!(rc, INVALID, "mode {mode} layers {layers} per {per}");
    }
    assert!(kl.iter().all(|&v| v == -1) && ku.iter().all(|&v| v == -1));
    // no layers: nothing to do
    let rc = unsafe {
        kve_cuda_layer_budgets(
            0,
            null(),
            0,
            2,
            10,
            4,
            20,
            0.2,
            null_mut(),
            null_mut(),
            null_stream(),
        )
    };
    assert_eq!(rc, 0);
    // pyramid against the core's formula; k_unit may be NULL
    let rc = unsafe {
        kve_cuda_layer_budgets(
            1,
            null(),
            3,
            2,
            10,
            4,
            20,
            0.2,
            kl.as_mut_ptr(),
            null_mut(),
            null_stream(),
        )
    };
    assert_eq!(rc, 0);
    for l in 0..3 {
        assert_eq!(
            kl[l],
            2 * kvevict::budget::pyramid_budget(4, 20, l, 3).min(10) as i64
        );
    }
}

// --------------------------------------------------------------------- compact --

#[test]
fn compact_in_place_and_varlen() {
    let (heads, n, d) = (3usize, 10usize, 4usize);
    // transposed layout (tokens fastest): element (h, t, c) at (h·d + c)·N + t
    let x: Vec<f16> = (0..heads * n * d)
        .map(|e| f16::from_f32(e as f32))
        .collect();
    let st = [d * n, 1, n];
    let at = |buf: &[f16], h: usize, t: usize, c: usize| buf[h * st[0] + t * st[1] + c * st[2]];
    let kept = [0i32, 2, 5, 9, 1, 3, 4, 0, 7, 8, 9, 0];
    let counts = [4i32, 3, 2];
    let kept_ld = 4;
    let mut y = x.clone();
    let yd = view_mut(&mut y, KVE_CUDA_F16, [heads, n, d], st);
    let wsz = unsafe { kve_cuda_compact_workspace_size(&yd, 4) };
    assert_eq!(wsz, heads * 4 * d * 2);
    let mut ws = vec![0u8; wsz];
    let rc = unsafe {
        kve_cuda_compact(
            &yd,
            kept.as_ptr(),
            kept_ld,
            counts.as_ptr(),
            4,
            ws.as_mut_ptr() as *mut c_void,
            wsz,
            null_stream(),
        )
    };
    assert_eq!(rc, 0);
    for h in 0..heads {
        for t in 0..n {
            for c in 0..d {
                let want = if t < counts[h] as usize {
                    at(&x, h, kept[h * 4 + t] as usize, c)
                } else {
                    at(&x, h, t, c)
                };
                assert_eq!(at(&y, h, t, c), want, "h{h} t{t} c{c}");
            }
        }
    }
    // varlen from the original, and a shared list (kept_ld = 0)
    let xd = view(&x, KVE_CUDA_F16, [heads, n, d], st);
    let mut dst = vec![f16::ZERO; 9 * d];
    let mut cu = vec![-1i32; heads + 1];
    let rc = unsafe {
        kve_cuda_compact_varlen(
            &xd,
            kept.as_ptr(),
            4,
            counts.as_ptr(),
            dst.as_mut_ptr() as *mut c_void,
            cu.as_mut_ptr(),
            null_stream(),
        )
    };
    assert_eq!(rc, INVALID, "kept_ld < tokens");
    assert!(cu.iter().all(|&v| v == -1));
    let kept10: Vec<i32> = (0..heads)
        .flat_map(|h| {
            let mut row = kept[h * 4..h * 4 + 4].to_vec();
            row.resize(10, 0);
            row
        })
        .collect();
    let rc = unsafe {
        kve_cuda_compact_varlen(
            &xd,
            kept10.as_ptr(),
            10,
            counts.as_ptr(),
            dst.as_mut_ptr() as *mut c_void,
            cu.as_mut_ptr(),
            null_stream(),
        )
    };
    assert_eq!(rc, 0);
    assert_eq!(cu, vec![0, 4, 7, 9]);
    for h in 0..heads {
        for t in 0..counts[h] as usize {
            for c in 0..d {
                assert_eq!(
                    dst[(cu[h] as usize + t) * d + c],
                    at(&x, h, kept10[h * 10 + t] as usize, c)
                );
            }
        }
    }
    let mut cu0 = vec![-1i32; heads + 1];
    let mut dst0 = vec![f16::ZERO; 3 * 2 * d];
    let shared = [1i32, 8];
    let rc = unsafe {
        kve_cuda_compact_varlen(
            &xd,
            shared.as_ptr(),
            0,
            [2i32].as_ptr(),
            dst0.as_mut_ptr() as *mut c_void,
            cu0.as_mut_ptr(),
            null_stream(),
        )
    };
    assert_eq!(rc, 0);
    assert_eq!(cu0, vec![0, 2, 4, 6]);
    assert_eq!(dst0[(2 * 2 + 1) * d + 3], at(&x, 2, 8, 3));
    // rejections: kept out of range, small workspace, null dst; nothing written
    let mut z = x.clone();
    let zd = view_mut(&mut z, KVE_CUDA_F16, [heads, n, d], st);
    let bad = [0i32, 2, 5, 10, 1, 3, 4, 0, 7, 8, 9, 0];
    assert_eq!(
        unsafe {
            kve_cuda_compact(
                &zd,
                bad.as_ptr(),
                4,
                counts.as_ptr(),
                4,
                ws.as_mut_ptr() as *mut c_void,
                wsz,
                null_stream(),
            )
        },
        INVALID
    );
    assert_eq!(
        unsafe {
            kve_cuda_compact(
                &zd,
                kept.as_ptr(),
                4,
                counts.as_ptr(),
                4,
                ws.as_mut_ptr() as *mut c_void,
                wsz - 1,
                null_stream(),
            )
        },
        INVALID
    );
    assert_eq!(
        unsafe {
            kve_cuda_compact(
                &zd,
                kept.as_ptr(),
                3,
                counts.as_ptr(),
                4,
                ws.as_mut_ptr() as *mut c_void,
                wsz,
                null_stream(),
            )
        },
        INVALID
    );
    assert_eq!(z, x);
    let mut cu1 = vec![-1i32; heads + 1];
    assert_eq!(
        unsafe {
            kve_cuda_compact_varlen(
                &xd,
                kept10.as_ptr(),
                10,
                counts.as_ptr(),
                null_mut(),
                cu1.as_mut_ptr(),
                null_stream(),
            )
        },
        INVALID
    );
    assert!(cu1.iter().all(|&v| v == -1));
}

#[test]
fn token_reduce_and_sinks_edges() {
    // sums NULL: plain sums; a layer with sum <= 0 counts with factor 1 (the core's norm)
    let s = [1.0f32, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0];
    let mut out = [SENTINEL; 2];
    assert_eq!(
        unsafe {
            kve_cuda_token_reduce(s.as_ptr(), null(), 2, 2, 2, out.as_mut_ptr(), null_stream())
        },
        0
    );
    assert_eq!(out, [4.0, 6.0]);
    let sums = [10.0f64, 0.0];
    assert_eq!(
        unsafe {
            kve_cuda_token_reduce(
                s.as_ptr(),
                sums.as_ptr(),
                2,
                2,
                2,
                out.as_mut_ptr(),
                null_stream(),
            )
        },
        0
    );
    let f = (1.0f64 / 10.0) as f32;
    assert_eq!(out, [1.0 * f + 3.0 * f, 2.0 * f + 4.0 * f]);
    out = [SENTINEL; 2];
    assert_eq!(
        unsafe { kve_cuda_token_reduce(null(), null(), 2, 2, 2, out.as_mut_ptr(), null_stream()) },
        INVALID
    );
    assert_eq!(
        unsafe {
            kve_cuda_token_reduce(
                s.as_ptr(),
                null(),
                -1,
                2,
                2,
                out.as_mut_ptr(),
                null_stream(),
            )
        },
        INVALID
    );
    assert_eq!(out, [SENTINEL; 2]);
    // no layers: zeros
    assert_eq!(
        unsafe { kve_cuda_token_reduce(null(), null(), 0, 2, 2, out.as_mut_ptr(), null_stream()) },
        0
    );
    assert_eq!(out, [0.0; 2]);
    // sinks with a row stride
    let mut o = [SENTINEL; 2 * 5];
    assert_eq!(
        unsafe { kve_cuda_sink_scores(o.as_mut_ptr(), 2, 4, 5, 2, null_stream()) },
        0
    );
    assert_eq!(
        o,
        [1.0, 1.0, 0.0, 0.0, SENTINEL, 1.0, 1.0, 0.0, 0.0, SENTINEL]
    );
    assert_eq!(
        unsafe { kve_cuda_sink_scores(o.as_mut_ptr(), 2, 4, 3, 2, null_stream()) },
        INVALID
    );
}
