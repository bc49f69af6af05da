//! Paged views (issue 30): a sequence's K/V reached through a block table, gathered and
//! scored, gives bit-identical scores, selections and compactions to the contiguous path,
//! for every preset, granularity, engine layout and dtype; hostile tables, layouts and
//! lists are refused with nothing written.

use half::f16;
use kvevict::compact::compact_in_place;
use kvevict::paged::*;
use kvevict::*;

mod paged_common;
use paged_common::{Rng, KINDS};

/// A model's K and V for `layers` layers in an engine's pool(s): raw bits in `u32`
/// storage (two f16 per word), whatever the kind keeps in one buffer kept in one.
struct Pools {
    kind: PagedKind,
    dtype: DType,
    layers: usize,
    num_blocks: usize,
    bs: usize,
    heads: usize,
    dim: usize,
    bufs: Vec<Vec<u32>>,
}

impl Pools {
    fn new(
        rng: &mut Rng,
        kind: PagedKind,
        dtype: DType,
        layers: usize,
        nb: usize,
        bs: usize,
        heads: usize,
        dim: usize,
    ) -> Pools {
        let mut p = Pools {
            kind,
            dtype,
            layers,
            num_blocks: nb,
            bs,
            heads,
            dim,
            bufs: vec![],
        };
        let nbuf = p.buffers();
        for b in 0..nbuf {
            // the longest of the tensors this buffer holds
            let len = paged_common::buffer_len(kind, layers, b, |l, kv| p.layout(l, kv));
            let words = (len * dtype.size()).div_ceil(4);
            // noise everywhere: a read of a wrong block shows
            let mut buf = vec![0u32; words];
            for e in 0..len {
                let x = rng.f() * 4.0;
                Self::put(&mut buf, dtype, e, x);
            }
            p.bufs.push(buf);
        }
        p
    }
    fn buffers(&self) -> usize {
        paged_common::buffers(self.kind, self.layers)
    }
    fn buf_of(&self, l: usize, kv: usize) -> usize {
        paged_common::buf_of(self.kind, l, kv)
    }
    fn layout(&self, l: usize, kv: usize) -> PagedLayout {
        let (layers, layer, kv) = paged_common::tensor_args(self.kind, self.layers, l, kv);
        PagedLayout::new(
            self.kind,
            self.dtype,
            self.num_blocks,
            self.bs,
            self.heads,
            self.dim,
            layers,
            layer,
            kv,
        )
        .unwrap()
    }
    fn put(buf: &mut [u32], dtype: DType, e: usize, x: f32) {
        match dtype {
            DType::F32 => buf[e] = x.to_bits(),
            DType::F16 => {
                let b = f16::from_f32(x).to_bits() as u32;
                let w = &mut buf[e / 2];
                *w = if e % 2 == 0 {
                    (*w & 0xffff_0000) | b
                } else {
                    (*w & 0xffff) | (b << 16)
                };
            }
            _ => unreachable!(),
        }
    }
    fn elems(&self, b: usize) -> usize {
        self.bufs[b].len() * 4 / self.dtype.size()
    }
    fn view<'a>(
        &'a self,
        l: usize,
        kv: usize,
        table: &'a [u32],
        n: usize,
    ) -> Result<PagedView<'a>> {
        let lay = self.layout(l, kv);
        let mut scratch = vec![0u8; table_check_size(&lay)?];
        let b = self.buf_of(l, kv);
        // SAFETY: the buffer holds `elems` elements of the dtype and outlives the view.
        unsafe {
            PagedView::from_raw(
                self.bufs[b].as_ptr() as *const u8,
                self.elems(b),
                lay,
                table,
                n,
                &mut scratch,
            )
        }
    }
    fn view_mut<'a>(
        &'a mut self,
        l: usize,
        kv: usize,
        table: &'a [u32],
        n: usize,
    ) -> Result<PagedViewMut<'a>> {
        let lay = self.layout(l, kv);
        let mut scratch = vec![0u8; compact_paged_workspace_size(&lay)?];
        let b = self.buf_of(l, kv);
        let len = self.elems(b);
        // SAFETY: as `view`, exclusively borrowed.
        unsafe {
            PagedViewMut::from_raw(
                self.bufs[b].as_mut_ptr() as *mut u8,
                len,
                lay,
                table,
                n,
                &mut scratch,
            )
        }
    }
    /// Write token `t` of head `h` of (layer, kv) through the table.
    fn set(&mut self, l: usize, kv: usize, table: &[u32], t: usize, h: usize, row: &[f32]) {
        let lay = self.layout(l, kv);
        let base = lay.offset
            + table[t / self.bs] as usize * lay.stride[0]
            + (t % self.bs) * lay.stride[1]
            + h * lay.stride[2];
        let dtype = self.dtype;
        let b = self.buf_of(l, kv);
        for (c, &x) in row.iter().enumerate() {
            Self::put(&mut self.bufs[b], dtype, base + c * lay.stride[3], x);
        }
    }
}

/// A contiguous copy of one tensor in llama.cpp's token rows `[n][H*d]` (raw bits: the
/// same values the pool holds), and its view.
struct Rows {
    dtype: DType,
    data: Vec<u32>,
    h: usize,
    n: usize,
    d: usize,
}
impl Rows {
    fn new(dtype: DType, h: usize, n: usize, d: usize) -> Rows {
        Rows {
            dtype,
            data: vec![0; (h * n * d * dtype.size()).div_ceil(4)],
            h,
            n,
            d,
        }
    }
    fn set(&mut self, t: usize, hh: usize, row: &[f32]) {
        for (c, &x) in row.iter().enumerate() {
            Pools::put(
                &mut self.data,
                self.dtype,
                t * self.h * self.d + hh * self.d + c,
                x,
            );
        }
    }
    fn view(&self) -> View<'_> {
        let len = self.h * self.n * self.d;
        // SAFETY: `data` holds `len` elements of the dtype.
        unsafe {
            View::from_raw(
                self.data.as_ptr() as *const u8,
                len,
                self.dtype,
                [self.h, self.n, self.d],
                [self.d, self.h * self.d, 1],
            )
        }
        .unwrap()
    }
}

/// Raw bits of element (a, b, c) of a view, through a one-row load (f32 of f16 is exact).
fn bits(v: &View, a: usize, b: usize, c: usize) -> u32 {
    v.get(a, b, c).to_bits()
}

/// Every preset's scoring (tova-decay scores as tova).
fn presets() -> impl Iterator<Item = Preset> {
    Preset::ALL
        .iter()
        .copied()
        .filter(|&p| p != Preset::TovaDecay)
}

fn granularity_configs(budget: u64) -> [SelectConfig; 4] {
    [
        SelectConfig::new(AllocatorKind::Uniform, Granularity::Head, budget),
        SelectConfig::new(AllocatorKind::Ada, Granularity::Head, budget),
        SelectConfig::new(AllocatorKind::Global, Granularity::Layer, budget),
        SelectConfig::laprox_span(budget),
    ]
}

/// Every preset × engine layout × dtype × granularity: the gathered paged view scores,
/// selects and compacts exactly as llama.cpp-style contiguous rows of the same data.
#[test]
fn paged_equals_contiguous_for_every_scorer_layout_and_granularity() {
    let (layers, hq, hkv, d, n, bs, nb, dm) = (
        2usize, 4usize, 2usize, 16usize, 150usize, 16usize, 13usize, 24usize,
    );
    let wq = 64usize;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut checked = 0usize;
    for dtype in [DType::F32, DType::F16] {
        for kind in KINDS {
            let mut pools = Pools::new(&mut rng, kind, dtype, layers, nb, bs, hkv, d);
            // a random table over the pool, longer than needed (its tail is never read)
            let table = rng.perm(nb);
            let mut rows: Vec<[Rows; 2]> = (0..layers)
                .map(|_| [Rows::new(dtype, hkv, n, d), Rows::new(dtype, hkv, n, d)])
                .collect();
            for l in 0..layers {
                for kv in 0..2 {
                    for t in 0..n {
                        for h in 0..hkv {
                            // neighbouring tokens correlated, so uniqueness has twins,
                            // every fifth one alone
                            let row: Vec<f32> = (0..d)
                                .map(|c| match t % 5 {
                                    0 => rng.f(),
                                    _ => {
                                        ((t / 3) as f32 * 0.37 + c as f32 * (h + 1) as f32).sin()
                                            + 0.2 * rng.f()
                                    }
                                })
                                .collect();
                            pools.set(l, kv, &table, t, h, &row);
                            rows[l][kv].set(t, h, &row);
                        }
                    }
                }
            }
            let q: Vec<Vec<f32>> = (0..layers)
                .map(|_| (0..hq * wq * d).map(|_| rng.f()).collect())
                .collect();
            let wo: Vec<Vec<f32>> = (0..layers)
                .map(|_| (0..hq * d * dm).map(|_| rng.f() * 0.3).collect())
                .collect();
            for preset in presets() {
                let cfg = ScoreConfig::preset(preset);
                let cross = cfg.scorer == ScorerKind::LaProx && cfg.laprox_gqa != LaproxGqa::Sum;
                let w = (cfg.window as usize).min(n);
                let p = n - w;
                let mut scores = [vec![0f32; layers * hkv * p], vec![0f32; layers * hkv * p]];
                for l in 0..layers {
                    let qv = View::f32(&q[l], [hq, wq, d], [wq * d, d, 1]).unwrap();
                    let wov = View::f32(&wo[l], [hq, d, dm], [d * dm, dm, 1]).unwrap();
                    let mut gram = vec![0f32; gram_len(hq, hkv, d, cross).unwrap()];
                    compute_gram(
                        &wov,
                        hkv,
                        cross,
                        &mut gram,
                        &mut vec![0u8; gram_workspace_size(d, dm).unwrap()],
                    )
                    .unwrap();
                    let kp = pools.view(l, 0, &table, n).unwrap();
                    let vp = pools.view(l, 1, &table, n).unwrap();
                    let mut kw = vec![0u8; gather_workspace_size(kp.layout(), n).unwrap()];
                    let mut vw = vec![0u8; gather_workspace_size(vp.layout(), n).unwrap()];
                    let kg = gather(&kp, &mut kw).unwrap();
                    let vg = gather(&vp, &mut vw).unwrap();
                    for (path, (k, v)) in [(rows[l][0].view(), rows[l][1].view()), (kg, vg)]
                        .into_iter()
                        .enumerate()
                    {
                        let mut l1 = vec![0f32; hkv * n];
                        compute_value_l1(&v, &wov, &mut l1, &mut vec![0u8; 1 << 16]).unwrap();
                        let inputs = LayerInputs {
                            queries: Some(qv),
                            keys: Some(k),
                            values: Some(v),
                            gram: Some(&gram),
                            value_l1: Some(&l1),
                            ..Default::default()
                        };
                        let shape = layer_shape(&cfg, &inputs).unwrap();
                        let mut ws = vec![0u8; score_workspace_size(&cfg, &shape).unwrap()];
                        score_layer(
                            &cfg,
                            &inputs,
                            &mut scores[path][l * hkv * p..(l + 1) * hkv * p],
                            &mut ws,
                        )
                        .unwrap();
                    }
                }
                let same = scores[0]
                    .iter()
                    .zip(&scores[1])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{preset:?} {kind:?} {dtype:?}: scores differ");
                assert!(
                    scores[0].iter().any(|&s| s != 0.0),
                    "{preset:?}: all-zero scores test nothing"
                );
                for sel in granularity_configs(40) {
                    check_selection_and_compaction(
                        &sel, &scores[0], &pools, &rows, &table, layers, hkv, n, w, d,
                    );
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 2 * 6 * 11 * 4);
}

/// Select, then compact both the contiguous rows (`compact_in_place`) and a copy of the
/// paged pools (`compact_paged`): every kept row bit-identical, lengths and freed blocks
/// as the lists say, kept positions the lists' entries.
fn check_selection_and_compaction(
    sel: &SelectConfig,
    scores: &[f32],
    pools: &Pools,
    rows: &[[Rows; 2]],
    table: &[u32],
    layers: usize,
    hkv: usize,
    n: usize,
    w: usize,
    d: usize,
) {
    let (no, ni) = select_output_len(sel, layers, hkv, n, w).unwrap();
    let (mut offs, mut idx) = (vec![0u64; no], vec![0u32; ni]);
    let mut ws = vec![0u8; select_workspace_size(sel, layers, hkv, n, w).unwrap()];
    let m = ModelScores {
        scores,
        layers,
        hkv,
        n,
        window: w,
    };
    select_model(sel, &m, &mut offs, &mut idx, &mut ws).unwrap();
    let mut pools2 = Pools {
        bufs: pools.bufs.clone(),
        ..*pools
    };
    for l in 0..layers {
        let o = &offs[l * hkv..l * hkv + hkv + 1];
        // token granularity: one list for every head, passed once (offsets of one unit)
        let shared = sel.granularity == Granularity::Token;
        let o_paged: &[u64] = if shared { &o[..2] } else { o };
        for kv in 0..2 {
            let mut contiguous = Rows {
                data: rows[l][kv].data.clone(),
                ..rows[l][kv]
            };
            let len = hkv * n * d;
            let mut cv = unsafe {
                ViewMut::from_raw(
                    contiguous.data.as_mut_ptr() as *mut u8,
                    len,
                    contiguous.dtype,
                    [hkv, n, d],
                    [d, hkv * d, 1],
                )
            }
            .unwrap();
            let mut lengths = vec![0u32; hkv];
            compact_in_place(&mut cv, o, &idx, Some(&mut lengths)).unwrap();
            let total = (o_paged[o_paged.len() - 1] - o_paged[0]) as usize;
            let mut kept_pos = vec![u32::MAX; total];
            let mut plengths = vec![0u32; hkv];
            let r = {
                let mut pv = pools2.view_mut(l, kv, table, n).unwrap();
                compact_paged(
                    &mut pv,
                    o_paged,
                    &idx,
                    None,
                    Some(&mut kept_pos),
                    Some(&mut plengths),
                )
                .unwrap()
            };
            assert_eq!(plengths, lengths);
            assert_eq!(
                &kept_pos[..],
                &idx[o_paged[0] as usize..o_paged[o_paged.len() - 1] as usize]
            );
            let most = *lengths.iter().max().unwrap() as usize;
            assert_eq!(r.blocks_kept, most.div_ceil(pools.bs));
            assert_eq!(r.blocks_freed, n.div_ceil(pools.bs) - r.blocks_kept);
            let pv = pools2.view(l, kv, table, n).unwrap();
            let mut gw = vec![0u8; gather_workspace_size(pv.layout(), n).unwrap()];
            let g = gather(&pv, &mut gw).unwrap();
            let c = contiguous.view();
            for h in 0..hkv {
                for t in 0..lengths[h] as usize {
                    for e in 0..d {
                        assert_eq!(
                            bits(&g, h, t, e),
                            bits(&c, h, t, e),
                            "{sel:?} layer {l} kv {kv} head {h} token {t}"
                        );
                    }
                }
            }
        }
    }
}

fn small() -> (Pools, Vec<u32>) {
    let mut rng = Rng(7);
    let pools = Pools::new(&mut rng, PagedKind::Nhd, DType::F32, 1, 8, 4, 2, 3);
    (pools, vec![5, 2, 7, 0, 1, 3, 4, 6])
}

/// Hostile tables and layouts: the status named in the module doc, nothing read.
#[test]
fn hostile_tables_and_layouts() {
    let (pools, table) = small();
    let n = 14; // 4 blocks
    assert!(pools.view(0, 0, &table, n).is_ok());
    // entry out of the pool (a -1 padding entry read as u32 too)
    for bad in [8u32, u32::MAX] {
        let mut t = table.clone();
        t[3] = bad;
        assert_eq!(pools.view(0, 0, &t, n).err(), Some(Error::OutOfBounds));
        // past the sequence's blocks it is never read
        assert!(pools.view(0, 0, &t, 12).is_ok());
    }
    // repeated entry
    let mut t = table.clone();
    t[2] = t[0];
    assert_eq!(pools.view(0, 0, &t, n).err(), Some(Error::Aliasing));
    // table shorter than the sequence
    assert_eq!(
        pools.view(0, 0, &table[..3], n).err(),
        Some(Error::ShapeMismatch)
    );
    assert_eq!(
        pools.view(0, 0, &table, 33).err(),
        Some(Error::ShapeMismatch)
    );
    // empty sequence
    assert_eq!(
        pools.view(0, 0, &table, 0).err(),
        Some(Error::InvalidArgument)
    );
    // layouts: block sizes, dims, kv/layer selectors, overflow, overlapping strides
    let l = |kind, bs, layers, layer, kv| {
        PagedLayout::new(kind, DType::F32, 8, bs, 2, 3, layers, layer, kv)
    };
    assert!(l(PagedKind::Nhd, MAX_BLOCK_SIZE, 1, 0, 0).is_ok());
    for (kind, bs, layers, layer, kv) in [
        (PagedKind::Nhd, 0, 1, 0, 0),
        (PagedKind::Nhd, MAX_BLOCK_SIZE + 1, 1, 0, 0),
        (PagedKind::Nhd, 4, 1, 0, 1),
        (PagedKind::NhdKvInner, 4, 1, 0, 2),
        (PagedKind::TrtLlm, 4, 2, 2, 0),
        (PagedKind::Hnd, 4, 2, 0, 0),
    ] {
        assert_eq!(
            l(kind, bs, layers, layer, kv).err(),
            Some(Error::InvalidArgument),
            "{kind:?} block {bs}, {layers} layers, layer {layer}, kv {kv}"
        );
    }
    assert_eq!(
        PagedLayout::new(PagedKind::Nhd, DType::F32, usize::MAX / 2, 4, 2, 3, 1, 0, 0).err(),
        Some(Error::Overflow)
    );
    let mut lay = pools.layout(0, 0);
    lay.stride[0] = 5; // blocks overlapping each other
    assert_eq!(lay.required_len().err(), Some(Error::Aliasing));
    // a buffer shorter than the layout reaches
    let lay = pools.layout(0, 0);
    let len = lay.required_len().unwrap();
    let data = vec![0f32; len - 1];
    let mut scratch = vec![0u8; table_check_size(&lay).unwrap()];
    assert_eq!(
        PagedView::new(&data, lay, &table, n, &mut scratch).err(),
        Some(Error::OutOfBounds)
    );
    // wrong dtype for the slice
    let data = vec![0f32; len];
    let mut l16 = lay;
    l16.dtype = DType::F16;
    assert_eq!(
        PagedView::new(&data, l16, &table, n, &mut scratch).err(),
        Some(Error::ShapeMismatch)
    );
    // workspaces too small
    let mut tiny = vec![0u8; 1];
    assert_eq!(
        PagedView::new(&data, lay, &table, n, &mut tiny).err(),
        Some(Error::WorkspaceTooSmall)
    );
    let v = PagedView::new(&data, lay, &table, n, &mut scratch).unwrap();
    let mut gw = vec![0u8; gather_workspace_size(&lay, n).unwrap() - 1];
    assert_eq!(gather(&v, &mut gw).err(), Some(Error::WorkspaceTooSmall));
}

/// Hostile kept lists and outputs: refused, and neither the pool nor any output written.
#[test]
fn hostile_compaction_writes_nothing() {
    let (mut pools, table) = small();
    let n = 14;
    let before = pools.bufs.clone();
    let cases: Vec<(&str, Vec<u64>, Vec<u32>, Error)> = vec![
        (
            "descending",
            vec![0, 3],
            vec![4, 2, 9],
            Error::InvalidArgument,
        ),
        ("repeated", vec![0, 2], vec![4, 4], Error::InvalidArgument),
        ("past n", vec![0, 2], vec![1, 14], Error::InvalidArgument),
        (
            "offsets past indices",
            vec![0, 5],
            vec![1, 2],
            Error::InvalidArgument,
        ),
        (
            "offsets decreasing",
            vec![0, 2, 1],
            vec![1, 2],
            Error::InvalidArgument,
        ),
        (
            "three lists for two heads",
            vec![0, 1, 2, 3],
            vec![1, 2, 3],
            Error::ShapeMismatch,
        ),
    ];
    for (what, offs, idx, want) in cases {
        let mut kp = vec![7u32; 8];
        let mut lens = vec![7u32; 2];
        let mut pv = pools.view_mut(0, 0, &table, n).unwrap();
        let r = compact_paged(&mut pv, &offs, &idx, None, Some(&mut kp), Some(&mut lens));
        assert_eq!(r.err(), Some(want), "{what}");
        assert!(
            kp.iter().chain(&lens).all(|&x| x == 7),
            "{what}: output written"
        );
        assert_eq!(pools.bufs, before, "{what}: pool written");
    }
    // outputs too small, positions too short
    let (offs, idx) = (vec![0u64, 3], vec![1u32, 5, 13]);
    let mut pv = pools.view_mut(0, 0, &table, n).unwrap();
    let mut kp = vec![7u32; 2];
    assert_eq!(
        compact_paged(&mut pv, &offs, &idx, None, Some(&mut kp), None).err(),
        Some(Error::OutputTooSmall)
    );
    let mut lens = vec![7u32; 1];
    assert_eq!(
        compact_paged(&mut pv, &offs, &idx, None, None, Some(&mut lens)).err(),
        Some(Error::OutputTooSmall)
    );
    let pos = vec![0u32; n - 1];
    assert_eq!(
        compact_paged(&mut pv, &offs, &idx, Some(&pos), None, None).err(),
        Some(Error::ShapeMismatch)
    );
    assert_eq!(kp, [7, 7]);
    assert_eq!(lens, [7]);
    drop(pv);
    assert_eq!(pools.bufs, before);
}

/// Two rounds of token-granular compaction of one sequence: blocks freed each time, the
/// original positions carried through, every kept row where it should be.
#[test]
fn repeated_compaction_reports_positions_and_free_blocks() {
    let mut rng = Rng(11);
    let (bs, nb, h, d) = (4usize, 10usize, 2usize, 3usize);
    let mut pools = Pools::new(&mut rng, PagedKind::HndKvInner, DType::F16, 1, nb, bs, h, d);
    let table = rng.perm(nb);
    let n = 37; // 10 blocks
    let val = |pos: usize, hh: usize, c: usize| (pos * 8 + hh * 4 + c) as f32;
    for t in 0..n {
        for hh in 0..h {
            let row: Vec<f32> = (0..d).map(|c| val(t, hh, c)).collect();
            pools.set(0, 0, &table, t, hh, &row);
        }
    }
    // round 1: keep 17 of 37 -> 5 blocks
    let keep1: Vec<u32> = (0..n as u32).filter(|t| t % 2 == 0 || *t > 33).collect();
    assert_eq!(keep1.len(), 20);
    let mut pos1 = vec![0u32; keep1.len()];
    let r = {
        let mut pv = pools.view_mut(0, 0, &table, n).unwrap();
        compact_paged(
            &mut pv,
            &[0, keep1.len() as u64],
            &keep1,
            None,
            Some(&mut pos1),
            None,
        )
        .unwrap()
    };
    assert_eq!(
        r,
        PagedCompaction {
            blocks_kept: 5,
            blocks_freed: 5
        }
    );
    assert_eq!(pos1, keep1);
    // round 2 over the 20 survivors (positions from round 1): keep cells 0, 5, 19
    let keep2 = [0u32, 5, 19];
    let mut pos2 = vec![0u32; 3];
    let r = {
        let mut pv = pools.view_mut(0, 0, &table[..5], 20).unwrap();
        compact_paged(&mut pv, &[0, 3], &keep2, Some(&pos1), Some(&mut pos2), None).unwrap()
    };
    assert_eq!(
        r,
        PagedCompaction {
            blocks_kept: 1,
            blocks_freed: 4
        }
    );
    assert_eq!(pos2, [0, 10, 36]);
    let pv = pools.view(0, 0, &table, 3).unwrap();
    let mut gw = vec![0u8; gather_workspace_size(pv.layout(), 3).unwrap()];
    let g = gather(&pv, &mut gw).unwrap();
    for (t, &p) in pos2.iter().enumerate() {
        for hh in 0..h {
            for c in 0..d {
                assert_eq!(g.get(hh, t, c), val(p as usize, hh, c));
            }
        }
    }
    // everything evicted: every block free
    let r = {
        let mut pv = pools.view_mut(0, 0, &table, 3).unwrap();
        compact_paged(&mut pv, &[0, 0], &[], None, None, None).unwrap()
    };
    assert_eq!(
        r,
        PagedCompaction {
            blocks_kept: 0,
            blocks_freed: 1
        }
    );
}

/// Random tables, many of them hostile, against a plain reference: the status the
/// reference predicts (a short table first, then the first entry out of the pool or
/// repeated), and for the
/// valid ones a gather equal to the reference's reads, a compaction equal to a plain
/// move; nothing written on error.
#[test]
fn random_tables_against_a_reference() {
    let mut rng = Rng(0x5eed);
    let (h, d) = (2usize, 3usize);
    for case in 0..3000 {
        let nb = 1 + rng.below(12);
        let bs = 1 + rng.below(5);
        let lay = PagedLayout::new(PagedKind::Hnd, DType::F32, nb, bs, h, d, 1, 0, 0).unwrap();
        let len = lay.required_len().unwrap();
        let mut pool: Vec<f32> = (0..len).map(|i| i as f32).collect();
        let n = 1 + rng.below(nb * bs + 3);
        let tl = rng.below(nb + 3);
        let table: Vec<u32> = (0..tl)
            .map(|_| match rng.below(10) {
                0 => nb as u32 + rng.below(3) as u32,
                1 => u32::MAX,
                _ => rng.below(nb) as u32,
            })
            .collect();
        let used = n.div_ceil(bs);
        // entries in order: the first out of the pool or repeated decides
        let want = if tl < used {
            Some(Error::ShapeMismatch)
        } else {
            paged_common::table_fault(&table, used, nb)
        };
        let at = |t: usize, hh: usize, c: usize| {
            table[t / bs] as usize * lay.stride[0]
                + (t % bs) * lay.stride[1]
                + hh * lay.stride[2]
                + c
        };
        let mut scratch = vec![0u8; table_check_size(&lay).unwrap()];
        let before = pool.clone();
        {
            let v = PagedView::new(&pool, lay, &table, n, &mut scratch);
            assert_eq!(v.as_ref().err().copied(), want, "case {case}");
            if let Ok(v) = v {
                let mut gw = vec![0u8; gather_workspace_size(&lay, n).unwrap()];
                let g = gather(&v, &mut gw).unwrap();
                for t in 0..n {
                    for hh in 0..h {
                        for c in 0..d {
                            assert_eq!(g.get(hh, t, c), before[at(t, hh, c)], "case {case}");
                        }
                    }
                }
            }
        }
        // a random kept list, sometimes hostile
        let mut kept: Vec<u32> = (0..n as u32).filter(|_| rng.below(3) == 0).collect();
        let bad_list = rng.below(8) == 0 && !kept.is_empty();
        if bad_list {
            kept.push(kept[0]);
        }
        let offs = [0u64, kept.len() as u64];
        let r = PagedViewMut::new(&mut pool, lay, &table, n, &mut scratch)
            .and_then(|mut v| compact_paged(&mut v, &offs, &kept, None, None, None));
        match (want, bad_list) {
            (Some(e), _) => assert_eq!(r.err(), Some(e), "case {case}"),
            (None, true) => assert_eq!(r.err(), Some(Error::InvalidArgument), "case {case}"),
            (None, false) => {
                let r = r.unwrap();
                assert_eq!(r.blocks_kept, kept.len().div_ceil(bs));
                for (i, &t) in kept.iter().enumerate() {
                    for hh in 0..h {
                        for c in 0..d {
                            assert_eq!(
                                pool[at(i, hh, c)],
                                before[at(t as usize, hh, c)],
                                "case {case}"
                            );
                        }
                    }
                }
                continue;
            }
        }
        assert_eq!(pool, before, "case {case}: written on error");
    }
}
