//! The evictor's device form (`kvevict::evictor::device`, `cuda/evictor.cu`) against the
//! host evictor: the same configuration and inputs give the same kept lists (bit for
//! bit) round after round, for several presets × granularities × both policies, with
//! queries through the ring or given per layer; compaction moves the same rows; a round
//! replays in a CUDA graph; hostile inputs get a status and write nothing.

use super::*;
use kvevict::device::{Floats, Tensor as DTensor};
use kvevict::evictor::device::{
    DeviceEvictor, DeviceLayerViews, DevicePagedLayerViews, DevicePool,
};
use kvevict::evictor::{Budget, Evictor, EvictorConfig, LayerViews, ModelDims};
use kvevict::paged::{PagedKind, PagedLayout};
use kvevict::{Error, Granularity, Preset};
use std::ptr::null;

/// Waits for the device.
fn sync() {
    conformance::device_sync("sync");
}

/// `n` int32 of device memory at `p`, after a sync.
fn read_i32(p: *const i32, n: usize) -> Vec<i32> {
    sync();
    let mut v = vec![0i32; n];
    // SAFETY: `n` int32 of device memory (the caller's), into a host vector of `n`.
    ck(
        unsafe { rt::cudaMemcpy(v.as_mut_ptr() as _, p as _, n * 4, rt::D2H) },
        "cudaMemcpy",
    );
    v
}

const L: usize = 2;
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 16;
const DM: usize = 24;
const CAP: usize = 96;
const W: u32 = 8;

fn dims() -> ModelDims {
    ModelDims {
        layers: L,
        hq: HQ,
        hkv: HKV,
        dk: D,
        dv: D,
        d_model: DM,
    }
}

fn config(preset: Preset, gran: Option<Granularity>, budget: Budget) -> EvictorConfig {
    let mut c = EvictorConfig::new(preset, dims(), CAP, budget);
    c.window = if preset == Preset::Tova { 0 } else { W }; // TOVA: its one-row window
    c.granularity = gran;
    c
}

/// A `[heads, n, d]` f32 view of device memory laid out `[heads][cap][d]`.
fn dview(b: &DBuf<f32>, heads: usize, n: usize, cap: usize) -> DTensor {
    let start = b.vptr() as usize;
    DTensor {
        view: cuda_view(b.vptr(), KVE_CUDA_F32, [heads, n, D], [cap * D, D, 1]),
        bytes: (start, start + heads * cap * D * 4),
    }
}

fn hview(h: &[f32], heads: usize, n: usize, cap: usize) -> kvevict::View<'_> {
    kvevict::View::f32(h, [heads, n, D], [cap * D, D, 1]).expect("host view")
}

/// One engine: K, V per layer `[Hkv][CAP][D]` (host and device copies), the queries of
/// the last ubatch per layer `[Hq][c][D]`.
struct Engine {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    n: usize,
}

impl Engine {
    /// Every layer's K and V cache of `CAP` cells, none used.
    fn empty() -> Engine {
        Engine {
            k: vec![vec![0f32; HKV * CAP * D]; L],
            v: vec![vec![0f32; HKV * CAP * D]; L],
            n: 0,
        }
    }
}

/// Host evictor and device evictor side by side over the same engine.
struct Pair {
    host_mem: Vec<u8>,
    dev_ctx: Vec<u8>,
    dev_block: DBuf<u8>,
    kd: Vec<DBuf<f32>>,
    vd: Vec<DBuf<f32>>,
}

impl Pair {
    fn new(cfg: &EvictorConfig, wo: &[Vec<f32>]) -> Pair {
        let hb = Evictor::memory_size(cfg).expect("host size");
        let ds = DeviceEvictor::memory_size(cfg).expect("device sizes");
        let mut p = Pair {
            host_mem: vec![0u8; hb],
            dev_ctx: vec![0u8; ds.host],
            dev_block: DBuf::<u8>::new(ds.device),
            kd: (0..L).map(|_| DBuf::<f32>::new(HKV * CAP * D)).collect(),
            vd: (0..L).map(|_| DBuf::<f32>::new(HKV * CAP * D)).collect(),
        };
        let mut h = Evictor::init(&mut p.host_mem, cfg).expect("host init");
        // SAFETY: the device block is ds.device bytes of device memory, kept by `p`.
        let mut d = unsafe {
            DeviceEvictor::init(&mut p.dev_ctx, p.dev_block.vptr(), ds.device as u64, cfg)
        }
        .expect("device init");
        if h.needs().capture.wo == kvevict::evictor::WoUse::Once {
            for (l, w) in wo.iter().enumerate() {
                let view = kvevict::View::f32_contiguous(w, [HQ, D, DM]).unwrap();
                h.set_output_projection(l, &view).expect("host wo");
                // SAFETY: the null stream.
                unsafe { d.set_output_projection(l, &view, null_stream()) }.expect("device wo");
            }
        }
        p
    }
    fn host(&mut self) -> Evictor<'_> {
        // SAFETY: the block init wrote, owned by self.
        unsafe {
            Evictor::from_block(
                self.host_mem
                    .as_mut_ptr()
                    .add(self.host_mem.as_ptr().align_offset(64)),
            )
        }
        .expect("host evictor")
    }
    /// The device evictor's context and block, to check that a refused call wrote neither.
    fn state(&self) -> (Vec<u8>, Vec<u8>) {
        (self.dev_ctx.clone(), self.dev_block.download())
    }
    fn assert_state(&self, before: &(Vec<u8>, Vec<u8>), what: &str) {
        assert!(self.dev_ctx == before.0, "{what}: context written");
        assert!(
            self.dev_block.download() == before.1,
            "{what}: device block written"
        );
    }
    fn dev(&mut self) -> DeviceEvictor<'_> {
        let off = self.dev_ctx.as_ptr().align_offset(64);
        // SAFETY: the context init wrote, owned by self.
        unsafe { DeviceEvictor::from_block(self.dev_ctx.as_mut_ptr().add(off)) }
            .expect("device evictor")
    }
}

/// Append `c` new cells (random K, V) and their queries to the engine and both evictors.
fn feed(e: &mut Engine, p: &mut Pair, rng: &mut Rng, c: usize, queries: bool) {
    for l in 0..L {
        for h in 0..HKV {
            for t in e.n..e.n + c {
                for d in 0..D {
                    e.k[l][(h * CAP + t) * D + d] = rng.normal();
                    e.v[l][(h * CAP + t) * D + d] = rng.normal();
                }
            }
        }
        p.kd[l].upload(&e.k[l]);
        p.vd[l].upload(&e.v[l]);
        if queries {
            let q: Vec<f32> = (0..HQ * c * D).map(|_| rng.normal()).collect();
            let qv = kvevict::View::f32_contiguous(&q, [HQ, c, D]).unwrap();
            p.host().observe_queries(0, l, &qv).expect("host observe");
            let qd = DBuf::from(&q);
            let t = dview(&qd, HQ, c, c);
            // SAFETY: a device tensor; the null stream (the ring is written before qd goes).
            unsafe { p.dev().observe_queries(0, l, &t, null_stream()) }.expect("device observe");
            sync();
        }
    }
    e.n += c;
}

/// Every layer's K and V also in paged pools (the device side reads them through the
/// table): one layout, a random table of distinct blocks covering `CAP` cells.
struct Paged {
    layout: PagedLayout,
    table: Vec<u32>,
    /// `[layer][K, V]`: host words and the device copy.
    host: Vec<[Vec<f32>; 2]>,
    dev: Vec<[DBuf<f32>; 2]>,
}

impl Paged {
    fn new(kind: PagedKind, bs: usize, rng: &mut Rng) -> Paged {
        let used = CAP.div_ceil(bs);
        let nb = used + 5;
        let layout =
            PagedLayout::new(kind, kvevict::DType::F32, nb, bs, HKV, D, 1, 0, 0).expect("layout");
        let mut all: Vec<u32> = (0..nb as u32).collect();
        for i in 0..used {
            let j = i + rng.below(nb - i);
            all.swap(i, j);
        }
        all.truncate(used);
        let len = layout.required_len().unwrap();
        let host: Vec<[Vec<f32>; 2]> = (0..L)
            .map(|_| [rng.normals(len, 1.0), rng.normals(len, 1.0)])
            .collect();
        let dev = host
            .iter()
            .map(|[k, v]| [DBuf::from(k), DBuf::from(v)])
            .collect();
        Paged {
            layout,
            table: all,
            host,
            dev,
        }
    }
    /// Element of (token t, head h, dim 0).
    fn row(&self, t: usize, h: usize) -> usize {
        let l = &self.layout;
        let b = self.table[t / l.block_size] as usize;
        l.offset + b * l.stride[0] + (t % l.block_size) * l.stride[1] + h * l.stride[2]
    }
    /// The engine's first `n` cells into both pools (the rest of the pools as they were).
    fn fill(&mut self, e: &Engine) {
        for l in 0..L {
            for which in 0..2 {
                let src = if which == 0 { &e.k[l] } else { &e.v[l] };
                for h in 0..HKV {
                    for t in 0..e.n {
                        let at = self.row(t, h);
                        for c in 0..D {
                            self.host[l][which][at + c * self.layout.stride[3]] =
                                src[(h * CAP + t) * D + c];
                        }
                    }
                }
                self.dev[l][which].upload(&self.host[l][which]);
            }
        }
    }
    fn pool(&self, l: usize, which: usize) -> DevicePool {
        DevicePool {
            data: self.dev[l][which].vptr(),
            len: self.host[l][which].len(),
            layout: self.layout,
        }
    }
}

/// One round on both (when the policy asks): the kept lists compared, then both caches
/// compacted and compared. With `paged`, the device evictor reads K/V through the pools'
/// table and compacts the pools, compared byte for byte with the host's `compact_paged`
/// of the same pools under the host evictor's lists. Returns whether a round ran.
fn round(e: &mut Engine, p: &mut Pair, mut paged: Option<&mut Paged>, tag: &str) -> bool {
    let target = p.host().plan(0, e.n).expect("host plan");
    assert_eq!(
        p.dev().plan(0, e.n).expect("device plan"),
        target,
        "{tag}: plan"
    );
    if target >= e.n {
        return false;
    }
    let needs = p.host().needs();
    p.host().begin(0, e.n, target).expect("host begin");
    p.dev().begin(0, e.n, target).expect("device begin");
    for l in 0..L {
        let lv = LayerViews {
            keys: hview(&e.k[l], HKV, e.n, CAP),
            values: Some(hview(&e.v[l], HKV, e.n, CAP)),
            queries: None,
            row_lse: None,
            wo: None,
        };
        p.host().score_layer(0, l, &lv).expect("host score");
        if let Some(pg) = paged.as_deref_mut() {
            if l == 0 {
                pg.fill(e);
            }
            let pv = DevicePagedLayerViews {
                keys: pg.pool(l, 0),
                values: Some(pg.pool(l, 1)),
                table: &pg.table,
                queries: None,
                row_lse: Floats::NONE,
            };
            // SAFETY: device pools, a host table; the null stream.
            unsafe { p.dev().score_layer_paged(0, l, &pv, null_stream()) }
                .expect("device score (paged)");
            continue;
        }
        let dv = DeviceLayerViews {
            keys: dview(&p.kd[l], HKV, e.n, CAP),
            values: Some(dview(&p.vd[l], HKV, e.n, CAP)),
            queries: None,
            row_lse: Floats::NONE,
        };
        // SAFETY: device tensors; the null stream.
        unsafe { p.dev().score_layer(0, l, &dv, null_stream()) }.expect("device score");
    }
    let (off, ind) = {
        let mut h = p.host();
        let k = h.select(0).expect("host select");
        (k.offsets.to_vec(), k.indices.to_vec())
    };
    // SAFETY: the null stream.
    let held = unsafe { p.dev().select(0, null_stream()) }.expect("device select");
    let kept = p.dev().kept(0).expect("device kept");
    let units = L * HKV;
    let counts = read_i32(kept.counts, units);
    let idx = read_i32(kept.idx, units * kept.idx_ld);
    for u in 0..units {
        let want = &ind[off[u] as usize..off[u + 1] as usize];
        let got: Vec<u32> = idx[u * kept.idx_ld..u * kept.idx_ld + counts[u] as usize]
            .iter()
            .map(|&x| x as u32)
            .collect();
        assert_eq!(
            got, want,
            "{tag}: unit {u}'s kept list (n {}, target {target})",
            e.n
        );
    }
    if let Some(h) = held {
        assert!(
            (0..units).all(|u| off[u + 1] - off[u] == h as u64),
            "{tag}: rectangular"
        );
    }
    let _ = needs;
    // compact both caches, compare
    let mut n_after = 0;
    for l in 0..L {
        for which in 0..2 {
            let t = dview(if which == 0 { &p.kd[l] } else { &p.vd[l] }, HKV, e.n, CAP);
            let host = if which == 0 { &mut e.k[l] } else { &mut e.v[l] };
            let mut hv = kvevict::ViewMut::f32(host, [HKV, e.n, D], [CAP * D, D, 1]).unwrap();
            p.host().compact(0, l, &mut hv).expect("host compact");
            if let Some(pg) = paged.as_deref_mut() {
                let pool = pg.pool(l, which);
                // SAFETY: a device pool we own, a host table; the null stream.
                let blocks = unsafe {
                    p.dev()
                        .compact_paged(0, l, &pool, &pg.table, null_stream())
                        .expect("device compact (paged)")
                };
                let got = pg.dev[l][which].download();
                let mut scratch = vec![0u8; kvevict::paged::table_check_size(&pg.layout).unwrap()];
                let (layout, table) = (pg.layout, pg.table.clone());
                let words = &mut pg.host[l][which];
                let mut hv =
                    kvevict::paged::PagedViewMut::new(words, layout, &table, e.n, &mut scratch)
                        .expect("host paged view");
                let want = kvevict::paged::compact_paged(
                    &mut hv,
                    &off[l * HKV..=(l + 1) * HKV],
                    &ind,
                    None,
                    None,
                    None,
                )
                .expect("host compact_paged");
                assert!(got == *words, "{tag}: paged pool, layer {l} tensor {which}");
                if held.is_some() {
                    assert_eq!(blocks, Some(want), "{tag}: blocks freed");
                } else {
                    assert_eq!(blocks, None, "{tag}: ragged");
                }
                // the pool's kept rows are the contiguous compaction's
                for h in 0..HKV {
                    let c = (off[l * HKV + h + 1] - off[l * HKV + h]) as usize;
                    n_after = n_after.max(c);
                    for r in 0..c {
                        let at = pg.row(r, h);
                        let row: Vec<f32> =
                            (0..D).map(|d| got[at + d * layout.stride[3]]).collect();
                        assert_eq!(
                            row,
                            host[(h * CAP + r) * D..(h * CAP + r + 1) * D],
                            "{tag}: paged row {r}, layer {l} head {h}"
                        );
                    }
                }
                continue;
            }
            // SAFETY: a device tensor we own; the null stream.
            unsafe { p.dev().compact(0, l, &t, null_stream()) }.expect("device compact");
            sync();
            let got = if which == 0 {
                p.kd[l].download()
            } else {
                p.vd[l].download()
            };
            for h in 0..HKV {
                let c = (off[l * HKV + h + 1] - off[l * HKV + h]) as usize;
                n_after = n_after.max(c);
                assert_eq!(
                    &got[h * CAP * D..(h * CAP + c) * D],
                    &host[h * CAP * D..(h * CAP + c) * D],
                    "{tag}: compacted rows, layer {l} head {h}"
                );
            }
        }
    }
    p.host().commit(0).expect("host commit");
    p.dev().commit(0).expect("device commit");
    let (hs, ds) = (p.host().stats(0).unwrap(), p.dev().stats(0).unwrap());
    if !hs.ragged {
        assert_eq!(hs, ds, "{tag}: stats");
        e.n = n_after;
    }
    true
}

/// The output projections, presets and policies the host/device comparisons run.
fn matrix(rng: &mut Rng) -> (Vec<Vec<f32>>, [Preset; 8], [Budget; 2]) {
    let wo: Vec<Vec<f32>> = (0..L)
        .map(|_| (0..HQ * D * DM).map(|_| 0.2 * rng.normal()).collect())
        .collect();
    let presets = [
        Preset::LaProxSpan,
        Preset::LaProx,
        Preset::SnapKv,
        Preset::Lava,
        Preset::Tova,
        Preset::KNorm,
        Preset::StreamingLlm,
        Preset::Uniqueness,
    ];
    let policies = [
        Budget::KeepRatio {
            ratio: 0.4,
            min_keep: 4,
        },
        Budget::Cells { high: 60, low: 40 },
    ];
    (wo, presets, policies)
}

/// Kept lists bit for bit against the host evictor: presets × granularities × policies,
/// several rounds each (rectangular selections), one round for the per-head allocators
/// (their sequences turn ragged).
#[test]
fn device_evictor_keeps_the_host_evictors_cells() {
    let mut rng = device_rng!(26);
    let (wo, presets, policies) = matrix(&mut rng);
    let mut rounds = 0;
    for preset in presets {
        for gran in [Some(Granularity::Token), Some(Granularity::Head), None] {
            for budget in policies {
                let cfg = config(preset, gran, budget);
                let tag = format!("{preset:?} {gran:?} {budget:?}");
                if let Err(e) = Evictor::memory_size(&cfg) {
                    // a combination the host refuses: the device form refuses it alike
                    assert_eq!(DeviceEvictor::memory_size(&cfg).err(), Some(e), "{tag}");
                    println!("{tag}: refused ({e:?}) by both");
                    continue;
                }
                let mut p = Pair::new(&cfg, &wo);
                let queries = p.host().needs().capture.queries;
                let mut e = Engine::empty();
                // a prompt, then turns: each round over what the policy asks
                for (turn, c) in [50usize, 24, 20, 16].into_iter().enumerate() {
                    if e.n + c > CAP {
                        break;
                    }
                    feed(&mut e, &mut p, &mut rng, c, queries);
                    if turn == 2 {
                        // the engine changed the cells: both forget the protection, keep the ring
                        p.host().unprotect(0).unwrap();
                        p.dev().unprotect(0).unwrap();
                        let (h, d) = (p.host().stats(0).unwrap(), p.dev().stats(0).unwrap());
                        assert_eq!((h, h.protected), (d, 0), "{tag}");
                    }
                    if round(&mut e, &mut p, None, &format!("{tag} turn {turn}")) {
                        rounds += 1;
                    }
                    if p.host().stats(0).unwrap().ragged {
                        break;
                    }
                }
            }
        }
    }
    println!("device evictor: {rounds} rounds, kept lists identical to the host evictor's");
    assert!(rounds >= 60, "{rounds} rounds");
}

/// Runs of similar values (each new cell's V a small step from the one before, in runs
/// of 1 to 6 cells) over the cells `from..e.n`, both copies: what value links join.
fn correlate(e: &mut Engine, p: &mut Pair, rng: &mut Rng, from: usize) {
    let mut t = from.max(1);
    while t < e.n {
        let run = 1 + rng.below(6);
        for t in t..(t + run).min(e.n) {
            for l in 0..L {
                for h in 0..HKV {
                    for d in 0..D {
                        let prev = e.v[l][(h * CAP + t - 1) * D + d];
                        e.v[l][(h * CAP + t) * D + d] = prev + 0.1 * rng.normal();
                    }
                }
            }
        }
        t += run + 1;
    }
    for l in 0..L {
        p.vd[l].upload(&e.v[l]);
    }
}

/// Value links on the device: the kept lists and compacted caches of the host evictor's
/// linked selection, over values with linked runs; and the links change what is kept.
#[test]
fn device_evictor_value_links_keep_the_host_evictors_cells() {
    need_device!();
    let (wo, _, policies) = matrix(&mut Rng::new(27));
    let mut rounds = 0;
    let mut differs = 0;
    for preset in [Preset::LaProxSpan, Preset::Uniqueness] {
        for budget in policies {
            let mut last = Vec::new();
            for threshold in [None, Some(0.5f32)] {
                let mut cfg = config(preset, None, budget);
                cfg.link_threshold = threshold;
                let tag = format!("{preset:?} {budget:?} links {threshold:?}");
                let mut p = Pair::new(&cfg, &wo);
                let queries = p.host().needs().capture.queries;
                let mut e = Engine::empty();
                let mut rng = Rng::new(29); // the same cells for both thresholds
                for (turn, c) in [50usize, 24, 20].into_iter().enumerate() {
                    if e.n + c > CAP {
                        break;
                    }
                    let from = e.n;
                    feed(&mut e, &mut p, &mut rng, c, queries);
                    correlate(&mut e, &mut p, &mut rng, from);
                    if round(&mut e, &mut p, None, &format!("{tag} turn {turn}"))
                        && threshold.is_some()
                    {
                        rounds += 1;
                    }
                }
                let now = (e.n, e.v.clone());
                if threshold.is_some() && last.first() != Some(&now) {
                    differs += 1;
                }
                last = vec![now];
            }
        }
    }
    println!("device evictor, value links: {rounds} linked rounds identical to the host's; links changed the kept cells in {differs} of 4 runs");
    assert!(rounds >= 6, "{rounds} rounds");
    assert!(differs >= 2, "links changed nothing: {differs}");
}

/// A round (scores of every layer and the selection) captured in a CUDA graph and
/// replayed gives the eager round's lists.
#[test]
fn device_evictor_round_replays_in_a_graph() {
    let mut rng = device_rng!(27);
    let cfg = config(Preset::SnapKv, Some(Granularity::Token), Budget::Explicit);
    let mut p = Pair::new(&cfg, &[]);
    let mut e = Engine::empty();
    feed(&mut e, &mut p, &mut rng, 70, true);
    let p = std::cell::RefCell::new(p);
    let run = |s: *mut c_void| {
        let mut p = p.borrow_mut();
        p.dev().begin(0, 70, 30).expect("begin");
        for l in 0..L {
            let dv = DeviceLayerViews {
                keys: dview(&p.kd[l], HKV, 70, CAP),
                values: None,
                queries: None,
                row_lse: Floats::NONE,
            };
            // SAFETY: device tensors; the capturing stream.
            unsafe { p.dev().score_layer(0, l, &dv, s) }.expect("score");
        }
        // SAFETY: the capturing stream.
        unsafe { p.dev().select(0, s) }.expect("select");
    };
    let lists = |p: &mut Pair| {
        let k = p.dev().kept(0).unwrap();
        (
            read_i32(k.counts, L * HKV),
            read_i32(k.idx, L * HKV * k.idx_ld),
        )
    };
    run(null_stream());
    let eager = lists(&mut p.borrow_mut());
    assert!(eager.0.iter().all(|&c| c == 30), "{:?}", eager.0);
    in_graph(&run);
    assert_eq!(lists(&mut p.borrow_mut()), eager, "graph replay");
}

/// Hostile inputs: a clear status, and neither the context nor the device block written.
#[test]
fn device_evictor_refuses_bad_input_and_writes_nothing() {
    let mut rng = device_rng!(28);
    let cfg = config(Preset::SnapKv, Some(Granularity::Token), Budget::cells(60));
    let ds = DeviceEvictor::memory_size(&cfg).unwrap();
    // unsupported on the device, bad blocks
    let mut links = cfg;
    links.link_threshold = Some(0.5);
    links.preset = Preset::LaProxSpan;
    links.granularity = None;
    assert!(
        DeviceEvictor::memory_size(&links).is_ok(),
        "value links on the device"
    );
    links.link_threshold = Some(f32::NAN); // the host's refusal, alike
    let refused = Evictor::memory_size(&links).err();
    assert!(refused.is_some());
    assert_eq!(DeviceEvictor::memory_size(&links).err(), refused);
    let crit = config(Preset::CriticalKv, None, Budget::Explicit);
    assert_eq!(
        DeviceEvictor::memory_size(&crit),
        Err(Error::InvalidArgument)
    );
    let mut paged = cfg;
    paged.paged = Some(kvevict::DType::F16); // paged views: the table check's scratch
    assert!(
        DeviceEvictor::memory_size(&paged).unwrap().host
            > DeviceEvictor::memory_size(&cfg).unwrap().host
    );
    let block = DBuf::<u8>::new(ds.device + 256);
    let mut ctx = vec![7u8; ds.host];
    for (ptr, bytes, want) in [
        (null_mut(), ds.device as u64, Error::NullPointer),
        (
            block.ptr().wrapping_add(1) as *mut c_void,
            ds.device as u64,
            Error::Misaligned,
        ),
        (block.vptr(), ds.device as u64 - 1, Error::WorkspaceTooSmall),
    ] {
        // SAFETY: refused before any use.
        let r = unsafe { DeviceEvictor::init(&mut ctx, ptr, bytes, &cfg) };
        assert_eq!(r.err(), Some(want));
        assert!(ctx.iter().all(|&b| b == 7), "context written on error");
    }
    let mut small = vec![7u8; ds.host - 1];
    // SAFETY: refused before any use.
    let r = unsafe { DeviceEvictor::init(&mut small, block.vptr(), ds.device as u64, &cfg) };
    assert_eq!(r.err(), Some(Error::WorkspaceTooSmall));
    // a started evictor: bad rounds
    let mut p = Pair::new(&cfg, &[]);
    let mut e = Engine::empty();
    feed(&mut e, &mut p, &mut rng, 70, true);
    let before = p.state();
    let same = |p: &Pair, what: &str| p.assert_state(&before, what);
    let kv = dview(&p.kd[0], HKV, 70, CAP);
    let mut d = p.dev();
    assert_eq!(d.begin(0, 0, 0), Err(Error::InvalidArgument));
    assert_eq!(d.begin(0, CAP + 1, 10), Err(Error::InvalidArgument));
    assert_eq!(d.begin(0, 70, 71), Err(Error::InvalidArgument));
    assert_eq!(d.begin(1, 70, 30), Err(Error::InvalidArgument));
    // a sequence past max_seqs, however large, on every per-sequence call (the fuzzer found
    // its device slot's offset computed, and overflowing, before the check)
    let q = vec![0f32; HQ * 4 * D];
    let qd = DBuf::from(&q);
    let qt = dview(&qd, HQ, 4, 4);
    for seq in [1, usize::MAX / 2 + 1, usize::MAX] {
        assert_eq!(d.plan(seq, 70), Err(Error::InvalidArgument));
        assert_eq!(d.begin(seq, 70, 30), Err(Error::InvalidArgument));
        assert_eq!(d.commit(seq), Err(Error::InvalidArgument));
        assert_eq!(d.reset(seq), Err(Error::InvalidArgument));
        assert!(d.stats(seq).is_err() && d.kept(seq).is_err());
        // SAFETY: refused before any launch.
        unsafe {
            assert_eq!(
                d.observe_queries(seq, 0, &qt, null_stream()),
                Err(Error::InvalidArgument)
            );
            assert_eq!(d.select(seq, null_stream()), Err(Error::InvalidArgument));
            assert_eq!(
                d.compact(seq, 0, &kv, null_stream()),
                Err(Error::InvalidArgument)
            );
        }
    }
    // SAFETY: refused before any launch.
    unsafe {
        assert_eq!(d.select(0, null_stream()), Err(Error::InvalidArgument));
        assert_eq!(
            d.compact(0, 0, &kv, null_stream()),
            Err(Error::InvalidArgument)
        );
    }
    assert_eq!(d.commit(0), Err(Error::InvalidArgument));
    drop(d);
    same(&p, "no round");
    p.dev().begin(0, 70, 30).unwrap();
    let before = p.state();
    let same = |p: &Pair, what: &str| p.assert_state(&before, what);
    let good = DeviceLayerViews {
        keys: dview(&p.kd[0], HKV, 70, CAP),
        values: None,
        queries: None,
        row_lse: Floats::NONE,
    };
    let mut short = good;
    short.keys = dview(&p.kd[0], HKV, 69, CAP);
    let mut heads = good;
    heads.keys = dview(&p.kd[0], 1, 70, CAP);
    let mut into_block = good;
    into_block.keys.view.data = p.dev_block.vptr();
    into_block.keys.bytes = (
        p.dev_block.vptr() as usize,
        p.dev_block.vptr() as usize + 64,
    );
    let mut lse = good;
    lse.row_lse = Floats {
        ptr: null(),
        len: 3,
    };
    let mut d = p.dev();
    // SAFETY: refused before any launch.
    unsafe {
        assert_eq!(
            d.score_layer(0, 0, &short, null_stream()),
            Err(Error::ShapeMismatch)
        );
        assert_eq!(
            d.score_layer(0, 0, &heads, null_stream()),
            Err(Error::ShapeMismatch)
        );
        assert_eq!(
            d.score_layer(0, L, &good, null_stream()),
            Err(Error::InvalidArgument)
        );
        assert_eq!(
            d.score_layer(0, 0, &into_block, null_stream()),
            Err(Error::Aliasing)
        );
        assert!(d.score_layer(0, 0, &lse, null_stream()).is_err());
        assert_eq!(d.select(0, null_stream()), Err(Error::InvalidArgument));
    }
    drop(d);
    same(&p, "bad layers");
}

/// Paged pools on the device (issue 30): the device evictor reading K/V through a block
/// table keeps the host evictor's cells bit for bit (the contiguous path's, which the test
/// above ties to the device's), round after round, and its compaction of the pools is the
/// host's `compact_paged` byte for byte with the same blocks freed: presets ×
/// granularities × both policies × NHD / HND pools × block sizes 1, 4, 16.
#[test]
fn device_evictor_paged_matches_the_host_evictor() {
    let mut rng = device_rng!(30);
    let (wo, presets, policies) = matrix(&mut rng);
    let (mut rounds, mut case) = (0, 0usize);
    for preset in presets {
        for gran in [Some(Granularity::Token), Some(Granularity::Head), None] {
            for budget in policies {
                let mut cfg = config(preset, gran, budget);
                cfg.paged = Some(kvevict::DType::F32);
                if Evictor::memory_size(&cfg).is_err() {
                    continue;
                }
                let kind = [PagedKind::Nhd, PagedKind::Hnd][case % 2];
                let bs = [1, 4, 16][case % 3];
                case += 1;
                let tag = format!("{preset:?} {gran:?} {budget:?} paged {kind:?} bs {bs}");
                let mut pg = Paged::new(kind, bs, &mut rng);
                let mut p = Pair::new(&cfg, &wo);
                let queries = p.host().needs().capture.queries;
                let mut e = Engine::empty();
                for (turn, c) in [50usize, 24, 20].into_iter().enumerate() {
                    if e.n + c > CAP {
                        break;
                    }
                    feed(&mut e, &mut p, &mut rng, c, queries);
                    if round(&mut e, &mut p, Some(&mut pg), &format!("{tag} turn {turn}")) {
                        rounds += 1;
                    }
                    if p.host().stats(0).unwrap().ragged {
                        break;
                    }
                }
            }
        }
    }
    println!(
        "device evictor, paged: {rounds} rounds, kept lists and pools identical to the host's"
    );
    assert!(rounds >= 50, "{rounds} rounds");
}

/// Hostile block tables and pools on the device evictor's paged calls: the host form's
/// statuses (the same check), and neither the context, the device block nor the pool
/// written.
#[test]
fn device_evictor_paged_refuses_bad_tables_and_writes_nothing() {
    let mut rng = device_rng!(33);
    let mut cfg = config(Preset::SnapKv, Some(Granularity::Token), Budget::Explicit);
    cfg.paged = Some(kvevict::DType::F32);
    let mut p = Pair::new(&cfg, &[]);
    let mut e = Engine::empty();
    feed(&mut e, &mut p, &mut rng, 70, true);
    let mut pg = Paged::new(PagedKind::Nhd, 4, &mut rng);
    pg.fill(&e);
    p.dev().begin(0, 70, 30).unwrap();
    let used = 70usize.div_ceil(4);
    let nb = pg.layout.num_blocks as u32;
    let mut tables: Vec<(&str, Vec<u32>)> = vec![];
    let t = pg.table[..used].to_vec();
    tables.push(("short", t[..used - 1].to_vec()));
    let mut x = t.clone();
    x[3] = nb;
    tables.push(("out of the pool", x));
    let mut x = t.clone();
    x[5] = u32::MAX; // an int32 -1 padding entry
    tables.push(("-1 entry", x));
    let mut x = t.clone();
    x[7] = x[2];
    tables.push(("repeated", x));
    let mut x = t.clone();
    x[9] = x[4];
    x[12] = nb + 1;
    tables.push(("repeat before out of the pool", x));
    let before = (
        p.dev_ctx.clone(),
        p.dev_block.download(),
        pg.dev[0][0].download(),
    );
    let mut host_status = vec![];
    for (what, tb) in &tables {
        // the host form's status: its view's check of the same pool and table
        let hs = {
            let words = &pg.host[0][0];
            let mut scratch = vec![0u8; 8 * CAP];
            kvevict::paged::PagedView::new(words, pg.layout, tb, 70, &mut scratch)
                .err()
                .expect("host refuses")
        };
        let pv = DevicePagedLayerViews {
            keys: pg.pool(0, 0),
            values: None,
            table: tb,
            queries: None,
            row_lse: Floats::NONE,
        };
        // SAFETY: refused before any launch.
        let ds = unsafe { p.dev().score_layer_paged(0, 0, &pv, null_stream()) };
        assert_eq!(ds, Err(hs), "{what}: score_layer_paged");
        println!("{what}: {hs:?} on both");
        host_status.push(hs);
    }
    // a pool past its buffer, a misaligned one, one larger than the config's dtype
    let mut bad = pg.pool(0, 0);
    bad.len -= 1;
    let mut mis = pg.pool(0, 0);
    mis.data = (mis.data as usize + 2) as *mut c_void;
    for (what, pool, want) in [
        ("short pool", bad, Error::OutOfBounds),
        ("misaligned", mis, Error::Misaligned),
    ] {
        let pv = DevicePagedLayerViews {
            keys: pool,
            values: None,
            table: &pg.table,
            queries: None,
            row_lse: Floats::NONE,
        };
        // SAFETY: refused before any launch.
        let ds = unsafe { p.dev().score_layer_paged(0, 0, &pv, null_stream()) };
        assert_eq!(ds, Err(want), "{what}");
    }
    // the context's last part is the table check's scratch (unspecified after a call)
    let kept = p.dev_ctx.len() - 8 * CAP - 128;
    assert!(p.dev_ctx[..kept] == before.0[..kept], "context written");
    assert!(p.dev_block.download() == before.1, "device block written");
    // a real round, then hostile compactions: nothing moves
    for l in 0..L {
        let pv = DevicePagedLayerViews {
            keys: pg.pool(l, 0),
            values: None,
            table: &pg.table,
            queries: None,
            row_lse: Floats::NONE,
        };
        // SAFETY: device pools, a host table; the null stream.
        unsafe { p.dev().score_layer_paged(0, l, &pv, null_stream()) }.expect("score");
    }
    // SAFETY: the null stream.
    unsafe { p.dev().select(0, null_stream()) }.expect("select");
    let block = p.dev_block.download();
    for ((what, tb), hs) in tables.iter().zip(host_status) {
        // SAFETY: refused before any launch.
        let ds = unsafe {
            p.dev()
                .compact_paged(0, 0, &pg.pool(0, 0), tb, null_stream())
        };
        assert_eq!(ds, Err(hs), "{what}: compact_paged");
    }
    assert!(pg.dev[0][0].download() == before.2, "pool written");
    assert!(p.dev_block.download() == block, "device block written");
    // the good table still compacts (the refusals left the round as it was)
    // SAFETY: a device pool we own, a host table; the null stream.
    let r = unsafe {
        p.dev()
            .compact_paged(0, 0, &pg.pool(0, 0), &pg.table, null_stream())
    };
    let r = r.expect("compact").expect("rectangular");
    assert_eq!(
        (r.blocks_kept, r.blocks_freed),
        (30usize.div_ceil(4), used - 30usize.div_ceil(4))
    );
}
