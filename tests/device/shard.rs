//! cuda/shard.cu: one model-wide selection split over devices (shard count / select).

use super::pipelines::{core_select, layer_sums};
use super::*;

/// One shard's device rows: `rows` rows of `p` scores at `scores` (row stride `p`), the first
/// the model's unit `unit0`, the layer sums at `sums` (`hkv` rows a layer).
struct DeviceShard {
    scores: *const f32,
    sums: *const f64,
    p: usize,
    rows: usize,
    unit0: usize,
    hkv: usize,
}

/// `$launcher` over the shard's rows: the scores (row stride `p`), `p`, `rows`, `unit0`, the
/// sums and `hkv`, the arguments both launchers start with, then `$rest`.
macro_rules! on_rows {
    ($shard:expr, $launcher:ident($($rest:expr),* $(,)?)) => {{
        let d = $shard;
        let [p, rows, unit0, hkv] = [d.p, d.rows, d.unit0, d.hkv].map(|v| v as i64);
        // SAFETY: device rows and sums of the declared sizes (and outputs, the caller's), or
        // refused before any launch.
        unsafe { $launcher(d.scores, p, p, rows, unit0, d.sums, hkv, $($rest),*) }
    }};
}

impl DeviceShard {
    /// `kve_cuda_shard_count` at the prefix `(hi, lo)` of `bits` bits into `hist` (256).
    fn count(&self, (hi, lo): (u64, u64), bits: u32, hist: &DBuf<u64>) -> i32 {
        on_rows!(
            self,
            kve_cuda_shard_count(hi, lo, bits, hist.ptr(), null_mut())
        )
    }

    /// `kve_cuda_shard_select` at the threshold `(hi, lo)` into `counts` and `idx` (row
    /// stride `p`).
    fn select(&self, (hi, lo): (u64, u64), counts: &DBuf<i32>, idx: &DBuf<i32>) -> i32 {
        let ld = self.p as i64;
        on_rows!(
            self,
            kve_cuda_shard_select(hi, lo, counts.ptr(), idx.ptr(), ld, null_mut())
        )
    }
}

/// A search key as the launchers take it: (high, low) 64-bit halves.
fn halves(k: u128) -> (u64, u64) {
    ((k >> 64) as u64, k as u64)
}

/// CPU + GPU split of one model-wide selection (design §4 "Selection across devices"):
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
            let gpu = DeviceShard {
                scores: sd.ptr(),
                sums: lsd.ptr(),
                p,
                rows: gpu_rows,
                unit0: 0,
                hkv,
            };
            let mut rounds = 0;
            while !search.done {
                hist.upload(&[0u64; 256]);
                ck(
                    gpu.count(halves(search.prefix), search.bits, &hist),
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
                gpu.select(halves(search.threshold), &counts, &idx),
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
    let mut rng = device_rng!(48);
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
    // layers [l0, l0 + ln) of the device scores and sums
    let shard = |l0: usize, ln: usize| DeviceShard {
        scores: sd.ptr().wrapping_add(l0 * hkv * p),
        sums: sums.ptr().wrapping_add(l0),
        p,
        rows: ln * hkv,
        unit0: l0 * hkv,
        hkv,
    };
    let hist = DBuf::<u64>::new(256);
    let mut rounds = 0;
    while !search.done {
        let mut h = Histogram::default();
        for &(l0, ln) in &shards {
            hist.upload(&[0u64; 256]);
            let rc = shard(l0, ln).count(halves(search.prefix), search.bits, &hist);
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
        let (counts, idx) = lists_of(rows, p, -1);
        let rc = shard(l0, ln).select(halves(search.threshold), &counts, &idx);
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
    // 2 rows of the device scores, no layer sums
    let two = DeviceShard {
        scores: sd.ptr(),
        sums: null(),
        p,
        rows: 2,
        unit0: 0,
        hkv: 0,
    };
    let rc = two.select((u64::MAX, u64::MAX), &counts, &idx);
    ck(rc, "shard_select KEEP_NOTHING");
    assert_eq!(counts.download(), vec![0, 0]);
    // bad search states: a prefix without bits, bits not a whole byte or past the key,
    // a prefix wider than its bits
    let hist = DBuf::from(&[3u64; 256]);
    for (hi, lo, bits) in [(0, 5, 0), (0, 0, 4), (0, 0, 104), (0, 256, 8)] {
        let rc = two.count((hi, lo), bits, &hist);
        assert_eq!(rc, INVALID, "shard_count prefix {lo} bits {bits}");
    }
    assert_eq!(
        hist.download(),
        vec![3u64; 256],
        "shard_count refused: histogram written"
    );
}
