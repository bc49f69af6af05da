//! The evictor over paged K/V (issue 30): a layer's K and V given through a block table
//! in each engine layout give the same kept sets as the same K/V given strided, for every
//! preset and granularity, and its block-aligned compaction leaves each head's kept rows
//! bit-identical to the strided compaction's, freeing the trailing blocks; a bad table is
//! refused with a clear status and nothing written (context, pool).

use half::f16;
use kvevict::evictor::{
    Budget, EvictorConfig, LayerViews, ModelDims, PagedLayerViews, WoUse, PRESETS,
};
use kvevict::paged::{
    table_check_size_for, PagedKind, PagedLayout, PagedView, PagedViewMut, PoolElement,
};
use kvevict::{DType, Error, Evictor, Granularity, View, ViewMut};
use paged_common::{Rng, KINDS};

mod paged_common;

const DIMS: ModelDims = ModelDims {
    layers: 2,
    hq: 4,
    hkv: 2,
    dk: 16,
    dv: 16,
    d_model: 24,
};
const MAX_CELLS: usize = 160;

/// Element types the test runs on.
trait Elem: PoolElement + Copy + Default + PartialEq + std::fmt::Debug {
    fn of(x: f32) -> Self;
    fn view<'a>(data: &'a [Self], extent: [usize; 3]) -> View<'a>;
    fn view_mut<'a>(data: &'a mut [Self], extent: [usize; 3]) -> ViewMut<'a>;
}
impl Elem for f32 {
    fn of(x: f32) -> Self {
        x
    }
    fn view<'a>(data: &'a [Self], e: [usize; 3]) -> View<'a> {
        View::f32_contiguous(data, e).unwrap()
    }
    fn view_mut<'a>(data: &'a mut [Self], e: [usize; 3]) -> ViewMut<'a> {
        ViewMut::f32(data, e, [e[1] * e[2], e[2], 1]).unwrap()
    }
}
impl Elem for f16 {
    fn of(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn view<'a>(data: &'a [Self], e: [usize; 3]) -> View<'a> {
        View::f16(data, e, [e[1] * e[2], e[2], 1]).unwrap()
    }
    fn view_mut<'a>(data: &'a mut [Self], e: [usize; 3]) -> ViewMut<'a> {
        ViewMut::f16(data, e, [e[1] * e[2], e[2], 1]).unwrap()
    }
}

/// A model's K and V twice: strided `[Hkv][n][d]` per layer, and in an engine's pool
/// (noise everywhere else) through `table`.
struct Model<T: Elem> {
    n: usize,
    k: Vec<Vec<T>>,
    v: Vec<Vec<T>>,
    q: Vec<Vec<f32>>,
    wo: Vec<Vec<f32>>,
    kind: PagedKind,
    nb: usize,
    bs: usize,
    bufs: Vec<Vec<T>>,
    table: Vec<u32>,
}

impl<T: Elem> Model<T> {
    fn new(seed: u64, n: usize, kind: PagedKind, bs: usize) -> Self {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let d = DIMS;
        let mut vec = |len: usize| (0..len).map(|_| T::of(r.spiky())).collect::<Vec<T>>();
        let k: Vec<_> = (0..d.layers).map(|_| vec(d.hkv * n * d.dk)).collect();
        let v: Vec<_> = (0..d.layers).map(|_| vec(d.hkv * n * d.dv)).collect();
        let used = n.div_ceil(bs);
        let nb = used * 2 + 3;
        let mut m = Model {
            n,
            k,
            v,
            q: vec![],
            wo: vec![],
            kind,
            nb,
            bs,
            bufs: vec![],
            table: vec![],
        };
        let mut r = Rng(seed ^ 0x5555);
        m.q = (0..d.layers)
            .map(|_| (0..d.hq * n * d.dk).map(|_| r.spiky()).collect())
            .collect();
        m.wo = (0..d.layers)
            .map(|_| (0..d.hq * d.dv * d.d_model).map(|_| r.spiky()).collect())
            .collect();
        // the sequence's blocks scattered over the pool
        m.table = r.perm(nb)[..used].to_vec();
        for b in 0..paged_common::buffers(kind, d.layers) {
            let len = paged_common::buffer_len(kind, d.layers, b, |l, kv| m.layout(l, kv));
            m.bufs
                .push((0..len).map(|_| T::of(r.spiky() * 3.0)).collect());
        }
        for l in 0..d.layers {
            for kv in 0..2 {
                let lay = m.layout(l, kv);
                let src = if kv == 0 { &m.k[l] } else { &m.v[l] };
                let b = m.buf_of(l, kv);
                for h in 0..d.hkv {
                    for t in 0..n {
                        for c in 0..lay.dim {
                            let e = m.at(&lay, t, h, c);
                            m.bufs[b][e] = src[(h * n + t) * lay.dim + c];
                        }
                    }
                }
            }
        }
        m
    }
    fn buf_of(&self, l: usize, kv: usize) -> usize {
        paged_common::buf_of(self.kind, l, kv)
    }
    fn layout(&self, l: usize, kv: usize) -> PagedLayout {
        let (layers, layer, kv) = paged_common::tensor_args(self.kind, DIMS.layers, l, kv);
        let dim = [DIMS.dk, DIMS.dv][kv.min(1)];
        PagedLayout::new(
            self.kind,
            T::DTYPE,
            self.nb,
            self.bs,
            DIMS.hkv,
            dim,
            layers,
            layer,
            kv,
        )
        .unwrap()
    }
    /// Element of (token `t`, head `h`, dim `c`) in its buffer.
    fn at(&self, lay: &PagedLayout, t: usize, h: usize, c: usize) -> usize {
        let s = lay.stride;
        lay.offset
            + self.table[t / self.bs] as usize * s[0]
            + (t % self.bs) * s[1]
            + h * s[2]
            + c * s[3]
    }
    fn queries(&self, l: usize, w: usize) -> View<'_> {
        let (n, dk) = (self.n, DIMS.dk);
        View::f32(
            &self.q[l][(n - w) * dk..],
            [DIMS.hq, w, dk],
            [n * dk, dk, 1],
        )
        .unwrap()
    }
    fn wo(&self, l: usize) -> View<'_> {
        View::f32_contiguous(&self.wo[l], [DIMS.hq, DIMS.dv, DIMS.d_model]).unwrap()
    }
}

fn config(preset: kvevict::Preset, g: Option<Granularity>, paged: Option<DType>) -> EvictorConfig {
    let mut c = EvictorConfig::new(preset, DIMS, MAX_CELLS, Budget::Explicit);
    c.granularity = g;
    c.paged = paged;
    c
}

fn evictor(c: &EvictorConfig, m: &Model<impl Elem>) -> Evictor<'static> {
    let mem = vec![0xEEu8; Evictor::memory_size(c).unwrap()];
    // the test leaks each context's memory (a few hundred kB)
    let mem: &'static mut [u8] = Box::leak(mem.into_boxed_slice());
    let mut ev = Evictor::init(mem, c).unwrap();
    if ev.needs().capture.wo == WoUse::Once {
        for l in 0..DIMS.layers {
            ev.set_output_projection(l, &m.wo(l)).unwrap();
        }
    }
    ev
}

fn lists(ev: &mut Evictor) -> Vec<Vec<u32>> {
    let k = ev.kept(0).unwrap();
    (0..k.offsets.len() - 1)
        .map(|u| k.indices[k.offsets[u] as usize..k.offsets[u + 1] as usize].to_vec())
        .collect()
}

/// One round to `target` on the strided tensors.
fn strided_round<T: Elem>(ev: &mut Evictor, m: &Model<T>, target: usize) -> Vec<Vec<u32>> {
    let need = ev.needs();
    let w = (need.window as usize).min(m.n);
    ev.begin(0, m.n, target).unwrap();
    for l in 0..DIMS.layers {
        let views = LayerViews {
            keys: T::view(&m.k[l], [DIMS.hkv, m.n, DIMS.dk]),
            values: need
                .capture
                .values
                .then(|| T::view(&m.v[l], [DIMS.hkv, m.n, DIMS.dv])),
            queries: need.capture.queries.then(|| m.queries(l, w)),
            row_lse: None,
            wo: (need.capture.wo == WoUse::EveryRound).then(|| m.wo(l)),
        };
        ev.score_layer(0, l, &views).unwrap();
    }
    ev.select(0).unwrap();
    lists(ev)
}

/// Score layer `l` of the round from the pool (values given whether or not read).
fn score_paged<T: Elem>(ev: &mut Evictor, m: &Model<T>, l: usize) -> Result<(), Error> {
    let need = ev.needs();
    let w = (need.window as usize).min(m.n);
    let (kb, vb) = (&m.bufs[m.buf_of(l, 0)], &m.bufs[m.buf_of(l, 1)]);
    let keys = PagedView::new(kb, m.layout(l, 0), &m.table, m.n, ev.scratch())?;
    let values = PagedView::new(vb, m.layout(l, 1), &m.table, m.n, ev.scratch())?;
    let views = PagedLayerViews {
        keys,
        values: Some(values),
        queries: need.capture.queries.then(|| m.queries(l, w)),
        row_lse: None,
        wo: (need.capture.wo == WoUse::EveryRound).then(|| m.wo(l)),
    };
    ev.score_layer_paged(0, l, &views)
}

/// Every preset × granularity, the engine layouts in turn (block sizes 16 and 5), f32
/// and f16: the same kept lists, then compaction leaves each head's kept rows
/// bit-identical to the strided compaction and frees the trailing blocks.
fn same_as_strided<T: Elem>(seed: u64) {
    let n = 137;
    let mut case = 0;
    for &(name, preset) in &PRESETS {
        // the preset's own granularity, then each
        for g in std::iter::once(None).chain(Granularity::ALL.iter().copied().map(Some)) {
            let kind = KINDS[case % KINDS.len()];
            let bs = [16, 5][case % 2];
            case += 1;
            let mut m = Model::<T>::new(seed + case as u64, n, kind, bs);
            let mut a = evictor(&config(preset, g, None), &m);
            let mut b = evictor(&config(preset, g, Some(T::DTYPE)), &m);
            let w = a.needs().window as usize;
            let target = 40.max(w + 1);
            let want = strided_round(&mut a, &m, target);
            b.begin(0, n, target).unwrap();
            for l in [1, 0] {
                score_paged(&mut b, &m, l).unwrap();
            }
            b.select(0).unwrap();
            let got = lists(&mut b);
            let tag = format!("{name} {g:?} {kind:?} bs {bs} {:?}", T::DTYPE);
            assert_eq!(got, want, "{tag}");
            assert!(got.iter().all(|k| k.len() < n), "{tag}: nothing evicted");
            // compaction: strided (the reference) and in the pool
            for l in 0..DIMS.layers {
                let most = (0..DIMS.hkv).map(|h| got[l * DIMS.hkv + h].len()).max();
                let blocks_kept = most.unwrap().div_ceil(bs);
                for kv in 0..2 {
                    let mut strided = if kv == 0 {
                        m.k[l].clone()
                    } else {
                        m.v[l].clone()
                    };
                    let d = [DIMS.dk, DIMS.dv][kv];
                    let mut sv = T::view_mut(&mut strided, [DIMS.hkv, n, d]);
                    a.compact(0, l, &mut sv).unwrap();
                    let lay = m.layout(l, kv);
                    let bi = m.buf_of(l, kv);
                    let mut buf = std::mem::take(&mut m.bufs[bi]);
                    let mut pv =
                        PagedViewMut::new(&mut buf, lay, &m.table, n, b.scratch()).unwrap();
                    let r = b.compact_paged(0, l, &mut pv).unwrap();
                    m.bufs[bi] = buf;
                    assert_eq!(r.blocks_kept, blocks_kept, "{tag}");
                    assert_eq!(r.blocks_freed, n.div_ceil(bs) - blocks_kept, "{tag}");
                    for h in 0..DIMS.hkv {
                        for t in 0..got[l * DIMS.hkv + h].len() {
                            for c in 0..d {
                                let e = m.at(&lay, t, h, c);
                                assert_eq!(
                                    m.bufs[bi][e],
                                    strided[(h * n + t) * d + c],
                                    "{tag}: layer {l} kv {kv} head {h} row {t}"
                                );
                            }
                        }
                    }
                }
            }
            a.commit(0).unwrap();
            b.commit(0).unwrap();
            assert_eq!(a.stats(0).unwrap(), b.stats(0).unwrap(), "{tag}");
        }
    }
}

#[test]
fn paged_rounds_match_strided_rounds_f32() {
    same_as_strided::<f32>(1);
}

#[test]
fn paged_rounds_match_strided_rounds_f16() {
    same_as_strided::<f16>(100);
}

/// Two keep-ratio rounds over paged K/V (the second over the protected cells and new
/// ones): the same kept sets as strided.
#[test]
fn keep_ratio_rounds_match() {
    let budget = Budget::KeepRatio {
        ratio: 0.3,
        min_keep: 8,
    };
    for (preset, kind) in [
        (kvevict::Preset::LaProxSpan, PagedKind::NhdKvOuter),
        (kvevict::Preset::SnapKv, PagedKind::Hnd),
    ] {
        let mut ca = EvictorConfig::new(preset, DIMS, MAX_CELLS, budget);
        ca.granularity = Some(Granularity::Token);
        let mut cb = ca;
        cb.paged = Some(DType::F32);
        let m = Model::<f32>::new(7, 120, kind, 8);
        let (mut a, mut b) = (evictor(&ca, &m), evictor(&cb, &m));
        let target = a.plan(0, m.n).unwrap();
        assert!(target < m.n);
        let want = strided_round(&mut a, &m, target);
        let tb = b.plan(0, m.n).unwrap();
        b.begin(0, m.n, tb).unwrap();
        for l in 0..DIMS.layers {
            score_paged(&mut b, &m, l).unwrap();
        }
        b.select(0).unwrap();
        assert_eq!(lists(&mut b), want, "{preset:?}");
        a.commit(0).unwrap();
        b.commit(0).unwrap();
        // the engine compacted (not modelled here) and appended: a fresh sequence of
        // the grown length stands in for it, the protected prefix the same count
        let m2 = Model::<f32>::new(8, 150, kind, 8);
        let (ta, tb) = (a.plan(0, m2.n).unwrap(), b.plan(0, m2.n).unwrap());
        assert_eq!(ta, tb);
        let want = strided_round(&mut a, &m2, ta);
        b.begin(0, m2.n, tb).unwrap();
        for l in 0..DIMS.layers {
            score_paged(&mut b, &m2, l).unwrap();
        }
        b.select(0).unwrap();
        assert_eq!(lists(&mut b), want, "{preset:?} second round");
    }
}

/// Bad tables and mismatched pools: a clear status, the context and the pool unchanged.
#[test]
fn bad_tables_are_refused_and_write_nothing() {
    let preset = kvevict::Preset::LaProxSpan;
    let m = Model::<f32>::new(3, 100, PagedKind::Nhd, 16);
    let mut b = evictor(
        &config(preset, Some(Granularity::Token), Some(DType::F32)),
        &m,
    );
    b.begin(0, m.n, 50).unwrap();
    let used = m.n.div_ceil(16);
    let lay = m.layout(0, 0);
    let mut bad_tables: Vec<(Vec<u32>, Error)> = vec![];
    let mut t = m.table.clone();
    t[3] = m.nb as u32; // outside the pool
    bad_tables.push((t, Error::OutOfBounds));
    let mut t = m.table.clone();
    t[used - 1] = u32::MAX; // -1 padding read as u32
    bad_tables.push((t, Error::OutOfBounds));
    let mut t = m.table.clone();
    t[5] = t[1]; // repeated
    bad_tables.push((t, Error::Aliasing));
    bad_tables.push((m.table[..used - 1].to_vec(), Error::ShapeMismatch));
    assert!(b.scratch().len() >= table_check_size_for(&lay, MAX_CELLS).unwrap());
    for (t, err) in &bad_tables {
        let before = b.context_bytes().to_vec();
        let r = PagedView::new(&m.bufs[0], lay, t, m.n, b.scratch());
        assert_eq!(r.err(), Some(*err));
        assert_eq!(b.context_bytes(), &before[..]);
    }
    // a pool of other heads, another length, a dtype wider than configured
    let keys = PagedView::new(&m.bufs[0], lay, &m.table, m.n - 1, b.scratch()).unwrap();
    let views = PagedLayerViews {
        keys,
        values: None,
        queries: Some(m.queries(0, b.needs().window as usize)),
        row_lse: None,
        wo: None,
    };
    let before = b.context_bytes().to_vec();
    assert_eq!(b.score_layer_paged(0, 0, &views), Err(Error::ShapeMismatch));
    assert_eq!(b.context_bytes(), &before[..]);
    let mut h16 = evictor(
        &config(preset, Some(Granularity::Token), Some(DType::F16)),
        &m,
    );
    h16.begin(0, m.n, 50).unwrap();
    let keys = PagedView::new(&m.bufs[0], lay, &m.table, m.n, h16.scratch()).unwrap();
    let before = h16.context_bytes().to_vec();
    let v = PagedLayerViews { keys, ..views };
    assert_eq!(h16.score_layer_paged(0, 0, &v), Err(Error::InvalidArgument));
    assert_eq!(h16.context_bytes(), &before[..]);
    // a context without `paged` refuses paged scoring
    let mut plain = evictor(&config(preset, Some(Granularity::Token), None), &m);
    plain.begin(0, m.n, 50).unwrap();
    assert_eq!(
        plain.score_layer_paged(0, 0, &v),
        Err(Error::InvalidArgument)
    );
    // compaction of a selected round over the wrong length: nothing moves
    for l in 0..DIMS.layers {
        score_paged(&mut b, &m, l).unwrap();
    }
    b.select(0).unwrap();
    let mut buf = m.bufs[0].clone();
    let mut pv = PagedViewMut::new(&mut buf, lay, &m.table, m.n - 1, b.scratch()).unwrap();
    assert_eq!(
        b.compact_paged(0, 0, &mut pv).err(),
        Some(Error::ShapeMismatch)
    );
    assert_eq!(buf, m.bufs[0]);
}

/// A pool whose bitmap is larger than the scratch (the evictor's scratch is sized by
/// `max_cells`, not by the pool): the table is checked on a sorted copy, with the
/// bitmap's answers (the first bad entry in table order decides).
#[test]
fn a_large_pool_is_checked_on_a_sorted_copy() {
    let mut rng = Rng(0xabc);
    let (nb, bs) = (4096usize, 2usize);
    let lay = PagedLayout::new(PagedKind::Hnd, DType::F32, nb, bs, 1, 1, 1, 0, 0).unwrap();
    let pool = vec![0f32; lay.required_len().unwrap()];
    let mut bitmap = vec![0u8; kvevict::paged::table_check_size(&lay).unwrap()];
    for case in 0..3000 {
        let n = 1 + (rng.next() % 60) as usize;
        let used = n.div_ceil(bs);
        assert!(table_check_size_for(&lay, n).unwrap() < bitmap.len());
        let mut sorted = vec![0u8; table_check_size_for(&lay, n).unwrap()];
        let tl = used + (rng.next() % 3) as usize - 1;
        let table: Vec<u32> = (0..tl)
            .map(|_| match rng.next() % 12 {
                0 => nb as u32 + (rng.next() % 3) as u32,
                1 => u32::MAX,
                2..=5 => (rng.next() % 40) as u32,
                _ => (rng.next() % nb as u64) as u32,
            })
            .collect();
        let want = PagedView::new(&pool, lay, &table, n, &mut bitmap).err();
        let got = PagedView::new(&pool, lay, &table, n, &mut sorted).err();
        assert_eq!(got, want, "case {case}: {table:?}");
        if tl >= used {
            let fault = paged_common::table_fault(&table, used, nb);
            assert_eq!(got, fault, "case {case}");
        }
    }

    let (nb, bs, n) = (4096, 16, 100);
    let lay = PagedLayout::new(PagedKind::Nhd, DType::F32, nb, bs, 2, 4, 1, 0, 0).unwrap();
    let pool = vec![0f32; lay.required_len().unwrap()];
    let need = table_check_size_for(&lay, n).unwrap();
    assert!(need < kvevict::paged::table_check_size(&lay).unwrap());
    let mut scratch = vec![0u8; need];
    let table: Vec<u32> = (0..7).map(|i| 4095 - 9 * i).collect();
    assert!(PagedView::new(&pool, lay, &table, n, &mut scratch).is_ok());
    let mut t = table.clone();
    t[6] = t[2];
    let r = PagedView::new(&pool, lay, &t, n, &mut scratch);
    assert_eq!(r.err(), Some(Error::Aliasing));
    t[6] = nb as u32;
    let r = PagedView::new(&pool, lay, &t, n, &mut scratch);
    assert_eq!(r.err(), Some(Error::OutOfBounds));
    let r = PagedView::new(&pool, lay, &table, n, &mut scratch[..need - 64]);
    assert_eq!(r.err(), Some(Error::WorkspaceTooSmall));
}

/// A round of `max_cells` cells (the gathered layer fills its part of the workspace) from
/// an f16 pool in a context configured for f32 pools.
#[test]
fn a_full_round_from_a_narrower_pool() {
    for preset in [kvevict::Preset::LaProxSpan, kvevict::Preset::Lava] {
        let m = Model::<f16>::new(21, MAX_CELLS, PagedKind::TrtLlm, 16);
        let mut a = evictor(&config(preset, None, None), &m);
        let mut b = evictor(&config(preset, None, Some(DType::F32)), &m);
        let want = strided_round(&mut a, &m, 60);
        b.begin(0, m.n, 60).unwrap();
        for l in 0..DIMS.layers {
            score_paged(&mut b, &m, l).unwrap();
        }
        b.select(0).unwrap();
        assert_eq!(lists(&mut b), want, "{preset:?}");
    }
}
