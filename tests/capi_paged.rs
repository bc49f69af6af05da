//! The paged entry points through the C ABI (`kve_paged_*`): a sequence gathered from a
//! stacked NHD pool scores exactly as its contiguous copy through `kve_score_layer`, the
//! compaction matches `kve_compact_in_place`, and every hostile class returns its status
//! with canary-filled outputs (and the pool) untouched.

use kvevict::capi::*;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

#[macro_use]
mod capi_common;
use capi_common::*;

const BS: usize = 8;
const NB: usize = 9; // N = 40 tokens: 5 blocks of 8

/// A stacked NHD pool `[NB, 2, BS, HKV, D]` holding the common layer's K (kv 0) and V
/// (kv 1) for a shuffled table, noise elsewhere.
struct Fixture {
    pool: Vec<f32>,
    table: Vec<u32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Fixture {
    fn new() -> Fixture {
        let mut pool = data(NB * 2 * BS * HKV * D, 99);
        let table = vec![7u32, 2, 5, 0, 8, 1, 3, 6, 4];
        let k = data(HKV * N * D, 3);
        let v = data(HKV * N * D, 4);
        for (kv, src) in [&k, &v].into_iter().enumerate() {
            for t in 0..N {
                for h in 0..HKV {
                    let b = table[t / BS] as usize;
                    let at = (((b * 2 + kv) * BS + t % BS) * HKV + h) * D;
                    pool[at..at + D].copy_from_slice(&src[(h * N + t) * D..(h * N + t + 1) * D]);
                }
            }
        }
        Fixture { pool, table, k, v }
    }
    fn layout(&self, kv: u32) -> kve_paged_layout {
        let p = self.pool.as_ptr() as *const c_void;
        let kind = kvevict::PagedKind::NhdKvInner;
        paged_f32_layout(kind, p, self.pool.len(), [NB, BS, HKV, D], kv)
    }
}

fn gather(
    l: &kve_paged_layout,
    table: &[u32],
    n: usize,
    dst: &mut [u64],
    out: &mut kve_tensor,
) -> i32 {
    unsafe {
        kve_paged_gather(
            l,
            table.as_ptr(),
            table.len() as u64,
            n as u64,
            dst.as_mut_ptr() as *mut c_void,
            (dst.len() * 8) as u64,
            out,
        )
    }
}

/// `kve_paged_gather` of `N` tokens with every pointer as given (the hostile cases).
unsafe fn gather_raw(
    l: &kve_paged_layout,
    table: *const u32,
    table_len: u64,
    dst: *mut c_void,
    dst_bytes: u64,
    out: *mut kve_tensor,
) -> i32 {
    unsafe { kve_paged_gather(l, table, table_len, N as u64, dst, dst_bytes, out) }
}

fn gather_bytes(l: &kve_paged_layout, n: usize) -> usize {
    let mut b = 0u64;
    expect!(
        unsafe { kve_paged_gather_size(l, n as u64, &mut b) },
        KVE_OK
    );
    b as usize
}

fn canary_tensor() -> kve_tensor {
    kve_tensor {
        data: 0x40 as *const c_void,
        len: 77,
        dtype: 9,
        pad: 9,
        extent: [9; 3],
        stride: [9; 3],
    }
}

fn is_canary(t: &kve_tensor) -> bool {
    t.data as usize == 0x40 && t.len == 77 && t.dtype == 9 && t.extent == [9; 3]
}

#[test]
fn gathered_sequence_scores_as_contiguous() {
    let f = Fixture::new();
    let mut dk = vec![0u64; gather_bytes(&f.layout(0), N).div_ceil(8)];
    let mut dv = vec![0u64; gather_bytes(&f.layout(1), N).div_ceil(8)];
    let (mut tk, mut tv) = (canary_tensor(), canary_tensor());
    expect!(gather(&f.layout(0), &f.table, N, &mut dk, &mut tk), KVE_OK);
    expect!(gather(&f.layout(1), &f.table, N, &mut dv, &mut tv), KVE_OK);
    assert_eq!(tk.extent, [HKV as u64, N as u64, D as u64]);
    assert_eq!(tk.stride, [(N * D) as u64, D as u64, 1]);
    let gk = unsafe { std::slice::from_raw_parts(tk.data as *const f32, HKV * N * D) };
    assert!(gk.iter().zip(&f.k).all(|(a, b)| a.to_bits() == b.to_bits()));
    // score both through kve_score_layer: bit-identical
    let mut l = Layer::new();
    l.k = f.k.clone();
    l.v = f.v.clone();
    let sp = score_params(2); // lava: queries, keys and values
    l.ws = vec![0; 1 << 20];
    let inp = l.inputs();
    expect!(l.score(&sp, &inp), KVE_OK);
    let want = l.out.clone();
    let mut inp2 = l.inputs();
    inp2.keys = tk;
    inp2.values = tv;
    expect!(l.score(&sp, &inp2), KVE_OK);
    assert!(l
        .out
        .iter()
        .zip(&want)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

fn compact(
    f: &mut Fixture,
    kv: u32,
    n: usize,
    offs: &[u64],
    idx: &[u32],
    pos: Option<&[u32]>,
    kept: &mut [u32],
    lens: &mut [u32],
    freed: *mut u64,
) -> i32 {
    let l = f.layout(kv);
    let mut ws_bytes = 0u64;
    expect!(
        unsafe { kve_paged_compact_workspace_size(&l, &mut ws_bytes) },
        KVE_OK
    );
    let mut ws = vec![0u8; ws_bytes as usize];
    let (pp, pl) = pos.map_or((null(), 0), |p| (p.as_ptr(), p.len() as u64));
    unsafe {
        kve_paged_compact(
            &l,
            f.table.as_ptr(),
            f.table.len() as u64,
            n as u64,
            offs.as_ptr(),
            offs.len() as u64,
            idx.as_ptr(),
            idx.len() as u64,
            pp,
            pl,
            if kept.is_empty() {
                null_mut()
            } else {
                kept.as_mut_ptr()
            },
            kept.len() as u64,
            if lens.is_empty() {
                null_mut()
            } else {
                lens.as_mut_ptr()
            },
            lens.len() as u64,
            freed,
            ws.as_mut_ptr() as *mut c_void,
            ws.len() as u64,
        )
    }
}

#[test]
fn compaction_matches_compact_in_place() {
    let mut f = Fixture::new();
    // per-head lists: head 0 keeps 10, head 1 keeps 3
    let offs = [0u64, 10, 13];
    let idx: Vec<u32> = (0..10).map(|i| i * 4 + 1).chain([0, 20, 39]).collect();
    let mut contiguous = f.k.clone();
    let t = contiguous_tensor(&mut contiguous);
    let mut lens_c = [0u32; HKV];
    expect!(
        unsafe {
            kve_compact_in_place(
                &t,
                offs.as_ptr(),
                3,
                idx.as_ptr(),
                idx.len() as u64,
                lens_c.as_mut_ptr(),
                2,
            )
        },
        KVE_OK
    );
    let (mut kept, mut lens, mut freed) = (vec![CANARY; 13], vec![CANARY; HKV], 99u64);
    let pos: Vec<u32> = (0..N as u32).map(|p| p + 1000).collect();
    expect!(
        compact(
            &mut f,
            0,
            N,
            &offs,
            &idx,
            Some(&pos),
            &mut kept,
            &mut lens,
            &mut freed
        ),
        KVE_OK
    );
    assert_eq!(lens, lens_c);
    assert_eq!(freed, 5 - 2);
    assert_eq!(kept, idx.iter().map(|i| i + 1000).collect::<Vec<_>>());
    let mut dk = vec![0u64; gather_bytes(&f.layout(0), N).div_ceil(8)];
    let mut tk = canary_tensor();
    expect!(gather(&f.layout(0), &f.table, N, &mut dk, &mut tk), KVE_OK);
    let g = unsafe { std::slice::from_raw_parts(tk.data as *const f32, HKV * N * D) };
    for h in 0..HKV {
        let r = (h * N * D)..(h * N + lens[h] as usize) * D;
        assert_eq!(g[r.clone()], contiguous[r]);
    }
    // V untouched by K's compaction
    let mut dv = vec![0u64; gather_bytes(&f.layout(1), N).div_ceil(8)];
    let mut tv = canary_tensor();
    expect!(gather(&f.layout(1), &f.table, N, &mut dv, &mut tv), KVE_OK);
    let gv = unsafe { std::slice::from_raw_parts(tv.data as *const f32, HKV * N * D) };
    assert_eq!(gv, &f.v[..]);
}

fn contiguous_tensor(v: &mut [f32]) -> kve_tensor {
    contiguous(v, [HKV, N, D])
}

#[test]
fn hostile_layouts() {
    let f = Fixture::new();
    let mut out = std::mem::MaybeUninit::<kve_paged_layout>::uninit();
    let sentinel = [0xA5u8; std::mem::size_of::<kve_paged_layout>()];
    let init = |out: *mut kve_paged_layout, a: Init| unsafe {
        kve_paged_layout_init(
            out,
            a.kind,
            a.data as *const c_void,
            a.len as u64,
            a.dtype,
            NB as u64,
            a.bs,
            HKV as u64,
            D as u64,
            a.layers,
            a.layer,
            a.kv,
        )
    };
    // a valid call; each case breaks one argument of it
    let ok = Init {
        kind: 1,
        data: f.pool.as_ptr(),
        len: f.pool.len(),
        dtype: 0,
        bs: 8,
        layers: 1,
        layer: 0,
        kv: 0,
    };
    expect!(init(null_mut(), ok), KVE_ERR_NULL_POINTER);
    reset(&mut out, &sentinel);
    let too_large = (kvevict::paged::MAX_BLOCK_SIZE + 1) as u64;
    let misaligned = (ok.data as usize + 2) as *const f32;
    let cases = [
        ("bad kind", Init { kind: 6, ..ok }, KVE_ERR_BAD_ENUM),
        ("bad dtype", Init { dtype: 7, ..ok }, KVE_ERR_BAD_ENUM),
        ("kv 2", Init { kv: 2, ..ok }, KVE_ERR_INVALID_ARGUMENT),
        (
            "layer without layers",
            Init { layer: 1, ..ok },
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (
            "block size 0",
            Init { bs: 0, ..ok },
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (
            "block size too large",
            Init {
                bs: too_large,
                ..ok
            },
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (
            "buffer too short",
            Init {
                len: ok.len - 1,
                kv: 1,
                ..ok
            },
            KVE_ERR_OUT_OF_BOUNDS,
        ),
        (
            "null data",
            Init { data: null(), ..ok },
            KVE_ERR_NULL_POINTER,
        ),
        (
            "misaligned",
            Init {
                data: misaligned,
                len: ok.len - 1,
                ..ok
            },
            KVE_ERR_MISALIGNED,
        ),
    ];
    for (what, a, want) in cases {
        assert_eq!(name(init(out.as_mut_ptr(), a)), name(want), "{what}");
    }
    let bytes = unsafe { std::slice::from_raw_parts(out.as_ptr() as *const u8, sentinel.len()) };
    assert_eq!(bytes, sentinel, "out written on error");
    // hand-made layouts: pad, overlapping strides, a table entry past the pool
    let mut l = f.layout(0);
    l.pad = 1;
    let mut b = CANARY as u64;
    expect!(
        unsafe { kve_paged_gather_size(&l, N as u64, &mut b) },
        KVE_ERR_INVALID_ARGUMENT
    );
    let mut l = f.layout(0);
    l.stride[1] = 1;
    expect!(
        unsafe { kve_paged_gather_size(&l, N as u64, &mut b) },
        KVE_ERR_ALIASING
    );
    let mut l = f.layout(0);
    l.num_blocks = NB as u64 + 1;
    expect!(
        unsafe { kve_paged_gather_size(&l, N as u64, &mut b) },
        KVE_ERR_OUT_OF_BOUNDS
    );
    assert_eq!(b, CANARY as u64);
}

/// The arguments of `kve_paged_layout_init` a case may break (the pool's shape fixed).
#[derive(Clone, Copy)]
struct Init {
    kind: u32,
    data: *const f32,
    len: usize,
    dtype: u32,
    bs: u64,
    layers: u64,
    layer: u64,
    kv: u32,
}

fn reset(out: &mut std::mem::MaybeUninit<kve_paged_layout>, s: &[u8]) {
    unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), out.as_mut_ptr() as *mut u8, s.len()) };
}

#[test]
fn hostile_gathers() {
    let f = Fixture::new();
    let l = f.layout(0);
    let mut dst = vec![0u64; gather_bytes(&l, N).div_ceil(8)];
    let mut out = canary_tensor();
    let mut t = f.table.clone();
    t[2] = 9;
    expect!(gather(&l, &t, N, &mut dst, &mut out), KVE_ERR_OUT_OF_BOUNDS);
    t[2] = u32::MAX; // int32 -1 padding
    expect!(gather(&l, &t, N, &mut dst, &mut out), KVE_ERR_OUT_OF_BOUNDS);
    t[2] = t[4];
    expect!(gather(&l, &t, N, &mut dst, &mut out), KVE_ERR_ALIASING);
    expect!(
        gather(&l, &f.table[..4], N, &mut dst, &mut out),
        KVE_ERR_SHAPE_MISMATCH
    );
    expect!(
        gather(&l, &f.table, 0, &mut dst, &mut out),
        KVE_ERR_INVALID_ARGUMENT
    );
    let short = dst.len() - 1;
    expect!(
        gather(&l, &f.table, N, &mut dst[..short], &mut out),
        KVE_ERR_WORKSPACE_TOO_SMALL
    );
    let (dp, db) = (dst.as_mut_ptr() as *mut c_void, 8 * dst.len() as u64);
    let tp = f.table.as_ptr();
    expect!(
        unsafe { gather_raw(&l, null(), 5, dp, db, &mut out) },
        KVE_ERR_NULL_POINTER
    );
    expect!(
        unsafe { gather_raw(&l, tp, 9, dp, db, null_mut()) },
        KVE_ERR_NULL_POINTER
    );
    // dst over the pool, the table, or out
    let (pp, pb) = (f.pool.as_ptr() as *mut c_void, 4 * f.pool.len() as u64);
    expect!(
        unsafe { gather_raw(&l, tp, 9, pp, pb, &mut out) },
        KVE_ERR_ALIASING
    );
    let mut big = vec![0u64; dst.len() + 8];
    let inside = unsafe { big.as_mut_ptr().add(1) } as *mut kve_tensor;
    let (bp, bb) = (big.as_mut_ptr() as *mut c_void, 8 * big.len() as u64);
    expect!(
        unsafe { gather_raw(&l, tp, 9, bp, bb, inside) },
        KVE_ERR_ALIASING
    );
    assert!(is_canary(&out));
}

#[test]
fn hostile_compactions_write_nothing() {
    let mut f = Fixture::new();
    let before = f.pool.clone();
    let pos: Vec<u32> = (0..N as u32).collect();
    let ok_offs = [0u64, 3];
    let ok_idx = [1u32, 5, 39];
    type Case<'a> = (
        &'a str,
        Vec<u64>,
        Vec<u32>,
        usize,
        Option<&'a [u32]>,
        usize,
        i32,
    );
    let cases: Vec<Case> = vec![
        (
            "descending",
            vec![0, 3],
            vec![5, 1, 39],
            N,
            None,
            3,
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (
            "past n",
            vec![0, 2],
            vec![1, 40],
            N,
            None,
            2,
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (
            "offsets past indices",
            vec![0, 4],
            vec![1, 2],
            N,
            None,
            4,
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (
            "three lists",
            vec![0, 1, 2, 3],
            vec![1, 2, 3],
            N,
            None,
            3,
            KVE_ERR_SHAPE_MISMATCH,
        ),
        (
            "positions short",
            ok_offs.to_vec(),
            ok_idx.to_vec(),
            N,
            Some(&pos[..N - 1]),
            3,
            KVE_ERR_SHAPE_MISMATCH,
        ),
        (
            "kept positions short",
            ok_offs.to_vec(),
            ok_idx.to_vec(),
            N,
            None,
            2,
            KVE_ERR_OUTPUT_TOO_SMALL,
        ),
        (
            "n past the table",
            ok_offs.to_vec(),
            ok_idx.to_vec(),
            NB * BS + 1,
            None,
            3,
            KVE_ERR_SHAPE_MISMATCH,
        ),
    ];
    for (what, offs, idx, n, p, kl, want) in cases {
        let (mut kept, mut lens, mut freed) = (vec![CANARY; kl], vec![CANARY; HKV], CANARY as u64);
        let st = compact(
            &mut f, 0, n, &offs, &idx, p, &mut kept, &mut lens, &mut freed,
        );
        assert_eq!(name(st), name(want), "{what}");
        assert!(
            kept.iter().chain(&lens).all(|&x| x == CANARY),
            "{what}: output written"
        );
        assert_eq!(freed, CANARY as u64, "{what}");
        assert_eq!(f.pool, before, "{what}: pool written");
    }
    // blocks_freed NULL
    let (mut kept, mut lens) = (vec![CANARY; 3], vec![CANARY; HKV]);
    expect!(
        compact(
            &mut f,
            0,
            N,
            &ok_offs,
            &ok_idx,
            None,
            &mut kept,
            &mut lens,
            null_mut()
        ),
        KVE_ERR_NULL_POINTER
    );
    // an output over an input, or a workspace too small: the same call but for the kept
    // positions and the workspace
    let l = f.layout(0);
    let mut idx = ok_idx.to_vec();
    let idx_ptr = idx.as_mut_ptr();
    let mut freed = CANARY as u64;
    let mut ws = vec![0u8; 256];
    let (ws_ptr, pool_ptr) = (
        ws.as_mut_ptr() as *mut c_void,
        f.pool.as_ptr() as *mut c_void,
    );
    let mut call = |kept: *mut u32, kept_len: u64, ws: *mut c_void, ws_bytes: u64| unsafe {
        kve_paged_compact(
            &l,
            f.table.as_ptr(),
            9,
            N as u64,
            ok_offs.as_ptr(),
            2,
            idx_ptr,
            3,
            null(),
            0,
            kept,
            kept_len,
            null_mut(),
            0,
            &mut freed,
            ws,
            ws_bytes,
        )
    };
    // kept positions over the indices
    expect!(call(idx_ptr, 3, ws_ptr, 256), KVE_ERR_ALIASING);
    // the workspace over the pool
    expect!(call(null_mut(), 0, pool_ptr, 256), KVE_ERR_ALIASING);
    // workspace too small
    expect!(call(null_mut(), 0, ws_ptr, 1), KVE_ERR_WORKSPACE_TOO_SMALL);
    assert_eq!(freed, CANARY as u64);
    assert_eq!(idx, ok_idx);
    assert_eq!(f.pool, before);
}
