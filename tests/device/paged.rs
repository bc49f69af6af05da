//! Paged pools on the device (`cuda/paged.cu`): the gather of a sequence through its block
//! table into a contiguous `[H, n, d]` tensor and the in-place compaction through the
//! table, for every engine layout (`kvevict::paged::PagedKind`), f32 / f16 / bf16, several
//! block sizes, against the host form (`kvevict::paged`) bit for bit: the gathered tensor
//! is the host's element map, the compacted pool is the host's `compact_paged` of the
//! same pool, every byte (moved rows, the rest left as it was, blocks outside the table).
//! Refused descriptors return 1 and write nothing; a table entry past the pool is skipped
//! (nothing outside the pool read or written).

use super::paged_common::KINDS;
use super::*;
use kvevict::paged::{compact_paged, PagedKind, PagedLayout, PagedViewMut};
use kvevict::DType;

/// A pool of `layout` (random bits, as many u32 words as its elements need).
fn pool_words(l: &PagedLayout, rng: &mut Rng) -> (Vec<u32>, usize) {
    let elems = l.required_len().expect("layout");
    let words = (elems * l.dtype.size()).div_ceil(4);
    ((0..words).map(|_| rng.next() as u32).collect(), elems)
}

/// Element `i` of a pool of `es`-byte elements held in words (raw bits).
fn elem(words: &[u32], es: usize, i: usize) -> u32 {
    if es == 4 {
        words[i]
    } else {
        (words[i / 2] >> (16 * (i % 2))) & 0xffff
    }
}

/// `used` distinct blocks of `nb`, in random order.
fn table(rng: &mut Rng, nb: usize, used: usize) -> Vec<u32> {
    let mut all: Vec<u32> = (0..nb as u32).collect();
    for i in 0..used {
        let j = i + rng.below(nb - i);
        all.swap(i, j);
    }
    all.truncate(used);
    all
}

fn cuda_pool(l: &PagedLayout, data: *mut c_void) -> KveCudaPaged {
    let len = l.required_len().expect("layout");
    kvevict::evictor::device::DevicePool {
        data,
        len,
        layout: *l,
    }
    .cuda()
}

/// Every layout × dtype × block size: (layout, n).
fn cases() -> Vec<(PagedLayout, usize)> {
    let mut out = vec![];
    for kind in KINDS {
        for dt in [DType::F32, DType::F16, DType::BF16] {
            for (bs, n) in [(1usize, 7usize), (3, 10), (16, 40), (8, 64)] {
                let (heads, dim) = if bs == 3 { (1, 5) } else { (3, 8) };
                let used = n.div_ceil(bs);
                let nb = used + 3;
                let (layers, layer) = if kind == PagedKind::TrtLlm {
                    (2, 1)
                } else {
                    (1, 0)
                };
                let kv = usize::from(kind != PagedKind::Nhd && kind != PagedKind::Hnd);
                let l = PagedLayout::new(kind, dt, nb, bs, heads, dim, layers, layer, kv)
                    .expect("layout");
                out.push((l, n));
            }
        }
    }
    out
}

#[test]
fn paged_gather_matches_the_host_element_map() {
    let mut rng = device_rng!(30);
    let mut count = 0;
    for (l, n) in cases() {
        let es = l.dtype.size();
        let (words, _) = pool_words(&l, &mut rng);
        let t = table(&mut rng, l.num_blocks, l.blocks_for(n));
        let (h, d) = (l.heads, l.dim);
        let out_words = (h * n * d * es).div_ceil(4);
        let pool = DBuf::from(&words);
        let dt = DBuf::from(&t);
        let out = DBuf::from(&vec![0xdead_beefu32; out_words + 4]);
        let p = cuda_pool(&l, pool.vptr());
        // SAFETY: device buffers of the declared sizes.
        let s = unsafe { kve_cuda_paged_gather(&p, dt.ptr(), n as i64, out.vptr(), null_mut()) };
        ck(s, "kve_cuda_paged_gather");
        let got = out.download();
        let tag = format!("{l:?} n {n}");
        for hh in 0..h {
            for tt in 0..n {
                let b = t[tt / l.block_size] as usize;
                for c in 0..d {
                    let i = l.offset
                        + b * l.stride[0]
                        + (tt % l.block_size) * l.stride[1]
                        + hh * l.stride[2]
                        + c * l.stride[3];
                    let o = (hh * n + tt) * d + c;
                    assert_eq!(
                        elem(&got, es, o),
                        elem(&words, es, i),
                        "{tag}: head {hh} token {tt} dim {c}"
                    );
                }
            }
        }
        // past the tensor: untouched
        let end = h * n * d * es;
        let bytes: Vec<u8> = got.iter().flat_map(|w| w.to_le_bytes()).collect();
        let canary: Vec<u8> = 0xdead_beefu32.to_le_bytes().repeat(out_words + 4);
        assert_eq!(
            &bytes[end..],
            &canary[end..],
            "{tag}: written past the tensor"
        );
        assert_eq!(pool.download(), words, "{tag}: pool written");
        count += 1;
    }
    println!("paged gather: {count} layouts x dtypes x block sizes, bit-identical");
}

/// Ascending kept lists: per head (`shared` false) or one for all heads.
fn kept_lists(rng: &mut Rng, heads: usize, n: usize, shared: bool) -> (Vec<u64>, Vec<u32>) {
    let lists = if shared { 1 } else { heads };
    let (mut off, mut idx) = (vec![0u64], vec![]);
    for u in 0..lists {
        // one list keeps everything, one nothing, the others a random share
        let p = match u % 4 {
            1 => 1.0,
            3 if lists > 3 => 0.0,
            _ => 0.2 + 0.6 * rng.unif(),
        };
        for t in 0..n {
            if rng.unif() < p {
                idx.push(t as u32);
            }
        }
        off.push(idx.len() as u64);
    }
    (off, idx)
}

#[test]
fn paged_compaction_matches_the_host_compaction_byte_for_byte() {
    let mut rng = device_rng!(31);
    let mut count = 0;
    for (l, n) in cases() {
        for shared in [false, true] {
            let tag = format!("{l:?} n {n} shared {shared}");
            let es = l.dtype.size();
            let (mut words, elems) = pool_words(&l, &mut rng);
            let t = table(&mut rng, l.num_blocks, l.blocks_for(n));
            let (off, idx) = kept_lists(&mut rng, l.heads, n, shared);
            let pool = DBuf::from(&words);
            let dt = DBuf::from(&t);
            // device lists: [lists][n] with counts, kept_ld n (0 shared)
            let lists = off.len() - 1;
            let mut dl = vec![-1i32; lists * n];
            let mut dc = vec![0i32; lists];
            for u in 0..lists {
                let k = &idx[off[u] as usize..off[u + 1] as usize];
                dc[u] = k.len() as i32;
                for (j, &x) in k.iter().enumerate() {
                    dl[u * n + j] = x as i32;
                }
            }
            let (kept, counts) = (DBuf::from(&dl), DBuf::from(&dc));
            let p = cuda_pool(&l, pool.vptr());
            // SAFETY: a pure host function.
            let wsb = unsafe { kve_cuda_paged_compact_workspace_size(&p, n as i64) };
            assert_eq!(wsb, l.heads * n * l.dim * es, "{tag}: workspace");
            let ws = DBuf::<u8>::new(wsb);
            // SAFETY: device buffers of the declared sizes.
            let s = unsafe {
                kve_cuda_paged_compact(
                    &p,
                    dt.ptr(),
                    n as i64,
                    kept.ptr(),
                    if shared { 0 } else { n as i64 },
                    counts.ptr(),
                    n as i64,
                    ws.vptr(),
                    wsb,
                    null_mut(),
                )
            };
            ck(s, "kve_cuda_paged_compact");
            let got = pool.download();
            // the host form on the same pool
            let mut scratch = vec![0u8; kvevict::paged::table_check_size(&l).unwrap()];
            // SAFETY: `words` holds `elems` elements of the layout's dtype (u32-aligned).
            let mut v = unsafe {
                PagedViewMut::from_raw(words.as_mut_ptr() as *mut u8, elems, l, &t, n, &mut scratch)
            }
            .expect("host view");
            let r = compact_paged(&mut v, &off, &idx, None, None, None).expect("host compact");
            drop(v);
            assert_eq!(got, words, "{tag}: pool after compaction");
            let most = (0..lists).map(|u| off[u + 1] - off[u]).max().unwrap() as usize;
            assert_eq!(r.blocks_kept, l.blocks_for(most), "{tag}");
            count += 1;
        }
    }
    println!("paged compaction: {count} cases, pools bit-identical to the host's");
}

#[test]
fn paged_launchers_refuse_bad_descriptors_and_guard_the_pool() {
    let mut rng = device_rng!(32);
    let l = PagedLayout::new(PagedKind::Nhd, DType::F32, 6, 4, 2, 8, 1, 0, 0).unwrap();
    let (words, _) = pool_words(&l, &mut rng);
    let pool = DBuf::from(&words);
    let n = 10;
    let t = table(&mut rng, 6, 3);
    let dt = DBuf::from(&t);
    let out = DBuf::from(&vec![7u32; 2 * n * 8]);
    let good = cuda_pool(&l, pool.vptr());
    let mut bad = vec![];
    let mut b = good;
    b.data = null_mut();
    bad.push(b);
    let mut b = good;
    b.reserved = 1;
    bad.push(b);
    let mut b = good;
    b.dtype = 7;
    bad.push(b);
    let edits: [fn(&mut KveCudaPaged); 8] = [
        |b: &mut KveCudaPaged| b.num_blocks = 0,
        |b: &mut KveCudaPaged| b.block_size = 0,
        |b: &mut KveCudaPaged| b.heads = 0,
        |b: &mut KveCudaPaged| b.heads = 65536,
        |b: &mut KveCudaPaged| b.dim = 0,
        |b: &mut KveCudaPaged| b.offset = -1,
        |b: &mut KveCudaPaged| b.stride_slot = -1,
        |b: &mut KveCudaPaged| b.stride_block = i64::MAX / 2,
    ];
    for f in edits {
        let mut b = good;
        f(&mut b);
        bad.push(b);
    }
    let (kept, counts) = (DBuf::from(&[0i32, 1, 2]), DBuf::from(&[3i32]));
    let ws = DBuf::<u8>::new(2 * n * 8 * 4);
    // `kve_cuda_paged_compact` of `n` tokens through `table`: one kept list (`kept`,
    // `counts`), `ws` given as `ws_bytes` long, on the default stream.
    let compact = |b: &KveCudaPaged,
                   table: *const u32,
                   kept: &DBuf<i32>,
                   counts: &DBuf<i32>,
                   ws_bytes: usize| {
        // SAFETY: device buffers of the declared sizes (or refused before any launch).
        unsafe {
            kve_cuda_paged_compact(
                b,
                table,
                n as i64,
                kept.ptr(),
                0,
                counts.ptr(),
                n as i64,
                ws.vptr(),
                ws_bytes,
                null_mut(),
            )
        }
    };
    for (i, b) in bad.iter().enumerate() {
        // SAFETY: refused before any launch.
        unsafe {
            assert_eq!(
                kve_cuda_paged_gather(b, dt.ptr(), n as i64, out.vptr(), null_mut()),
                1,
                "bad descriptor {i}: gather"
            );
            assert_eq!(kve_cuda_paged_compact_workspace_size(b, n as i64), 0);
            assert_eq!(
                compact(b, dt.ptr(), &kept, &counts, ws.len()),
                1,
                "bad descriptor {i}: compact"
            );
        }
    }
    // SAFETY: refused before any launch (negative n, NULL table, short workspace).
    unsafe {
        assert_eq!(
            kve_cuda_paged_gather(&good, dt.ptr(), -1, out.vptr(), null_mut()),
            1
        );
        assert_eq!(
            kve_cuda_paged_gather(&good, null(), n as i64, out.vptr(), null_mut()),
            1
        );
        assert_eq!(compact(&good, dt.ptr(), &kept, &counts, ws.len() - 1), 1);
    }
    assert!(out.download().iter().all(|&w| w == 7), "refused: written");
    assert_eq!(pool.download(), words, "refused: pool written");
    // a table entry past the pool: its tokens are skipped, nothing else is touched
    let mut hostile = t.clone();
    hostile[1] = 6;
    let dh = DBuf::from(&hostile);
    // SAFETY: device buffers of the declared sizes.
    unsafe {
        ck(
            kve_cuda_paged_gather(&good, dh.ptr(), n as i64, out.vptr(), null_mut()),
            "gather",
        );
    }
    let got = out.download();
    for h in 0..2 {
        for tok in 4..8 {
            assert!(
                got[(h * n + tok) * 8..(h * n + tok + 1) * 8]
                    .iter()
                    .all(|&w| w == 7),
                "guarded block read"
            );
        }
    }
    let (kept, counts) = (
        DBuf::from(&[0i32, 5, 9, 0, 0, 0, 0, 0, 0, 0]),
        DBuf::from(&[3i32]),
    );
    ck(
        compact(&good, dh.ptr(), &kept, &counts, ws.len()),
        "compact",
    );
    // token 5 (guarded block) is not moved; token 9 (block t[2]) moves to token 2
    let after = pool.download();
    let row = |w: &[u32], b: u32, s: usize, h: usize| {
        w[(b as usize * 4 + s) * 16 + h * 8..(b as usize * 4 + s) * 16 + h * 8 + 8].to_vec()
    };
    for h in 0..2 {
        assert_eq!(row(&after, t[0], 1, h), row(&words, t[0], 1, h));
        assert_eq!(row(&after, t[0], 2, h), row(&words, t[2], 1, h));
    }
    let changed = (0..words.len()).filter(|&i| after[i] != words[i]).count();
    assert!(changed <= 2 * 8, "{changed} words changed");
}
