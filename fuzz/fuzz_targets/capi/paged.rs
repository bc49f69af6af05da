//! The paged entry points (`kve_paged_*`): a pool layout, a table, then a gather or an
//! in-place compaction (op 13).

use crate::harness::*;
use kvevict::capi::*;
use std::ffi::c_void;

/// Op 13: the paged entry points (`kve_paged_*`).
pub unsafe fn paged(r: &mut R, a: &mut Arena, ck: &mut Checks) -> Option<i32> {
    let st;
    // paged caches: a pool layout over the arena (an engine's kind, or four
    // arbitrary strides and an offset), a block table (sometimes read from the
    // arena), a length; then a gather, or an in-place compaction with lists,
    // positions and outputs sometimes placed inside the pool
    let dtype = r.enum_val(5); // q8_0/q4_0 pools: refused
    let es = if dtype == 0 { 4u64 } else { 2 };
    let off = if r.chance(6) {
        r.u8() as usize % 64
    } else {
        (r.u8() as usize % 64) * 8
    };
    let max_len = (ARENA - off) as u64 / es;
    let len = if r.chance(3) {
        r.u32() as u64 % (max_len + 1)
    } else {
        max_len
    };
    let data = a.base().add(off) as *const c_void;
    let (nb, bs, h, d) = (r.size(16), r.size(8), r.size(4), r.size(16));
    let mut kl: kve_paged_layout = std::mem::zeroed();
    let init = if r.chance(3) {
        kl = kve_paged_layout {
            data: if r.chance(40) { std::ptr::null() } else { data },
            len,
            dtype,
            pad: if r.chance(50) { 1 } else { 0 },
            offset: r.size(64) / 2,
            num_blocks: nb,
            block_size: bs,
            heads: h,
            dim: d,
            stride: [
                r.size(2048) / 2,
                r.size(64) / 2,
                r.size(64) / 2,
                r.size(4) / 2,
            ],
        };
        KVE_OK
    } else {
        let (kind, layers, layer, kv) = (
            r.enum_val(6),
            1 + r.u8() as u64 % 3,
            r.u8() as u64 % 3,
            r.u8() as u32 % 3,
        );
        let s0 = kve_paged_layout_init(
            &mut kl, kind, data, len, dtype, nb, bs, h, d, layers, layer, kv,
        );
        if s0 != KVE_OK {
            assert!(
                kl.data.is_null() && kl.len == 0 && kl.stride == [0; 4],
                "layout written on error"
            );
        }
        s0
    };
    // the table: its own memory or words of the arena
    let tl = r.u8() as usize % 12;
    let own_table: Vec<u32> = (0..tl)
        .map(|_| {
            if r.chance(8) {
                r.u32()
            } else {
                r.u8() as u32 % (nb.min(64) as u32 + 1)
            }
        })
        .collect();
    let table: *const u32 = if r.chance(10) {
        a.base().add((r.u8() as usize % 64) * 4) as *const u32
    } else if tl == 0 && r.chance(2) {
        std::ptr::null()
    } else {
        own_table.as_ptr()
    };
    let n = if r.chance(4) {
        r.size(1 << 20)
    } else {
        r.u8() as u64 % 100
    };
    let tspan = span_n(table as *const c_void, tl as u64, 4);
    let pool_span = if kl.data.is_null() {
        (0, 0)
    } else {
        span_n(kl.data, kl.len, es)
    };
    if init != KVE_OK {
        st = init;
    } else if r.chance(2) {
        let mut bytes = CANARY as u64;
        let q = kve_paged_gather_size(&kl, n, &mut bytes);
        let mut dst = workspace(r, if q == KVE_OK { Some(bytes) } else { None });
        let (dptr, dlen) = if r.chance(16) {
            let o = (r.u8() as usize % 64) * 8;
            (
                a.base().add(o) as *mut u8,
                (ARENA - o).min(dst.len()) as u64,
            )
        } else {
            (dst.as_mut_ptr(), dst.len() as u64)
        };
        let dspan = span_n(dptr as *const c_void, dlen, 1);
        let mut out = kve_tensor {
            data: 0x40 as *const c_void,
            len: 77,
            dtype: 9,
            pad: 9,
            extent: [9; 3],
            stride: [9; 3],
        };
        st = kve_paged_gather(
            &kl,
            table,
            tl as u64,
            n,
            dptr as *mut c_void,
            dlen,
            &mut out,
        );
        if debug() {
            eprintln!("paged gather n={n} bs={} st={st}", kl.block_size);
        }
        if st == KVE_OK {
            assert_eq!(q, KVE_OK, "gather accepted a layout its size query refused");
            assert!(
                !overlaps(dspan, pool_span) && !overlaps(dspan, tspan),
                "gather into its inputs accepted"
            );
            ck.dst_in_arena = dspan.0 >= a.base() as usize && dspan.0 < a.base() as usize + ARENA;
            assert_eq!(out.extent, [kl.heads, n, kl.dim]);
            assert_eq!(out.len, kl.heads * n * kl.dim);
            let o = out.data as usize;
            assert!(
                o >= dspan.0 && o + (out.len * es) as usize <= dspan.1,
                "gathered tensor outside dst"
            );
            // every element is the pool's element through the table
            let t = std::slice::from_raw_parts(table, tl);
            for hh in 0..kl.heads {
                for tok in 0..n {
                    for c in 0..kl.dim {
                        let src = kl.offset
                            + t[(tok / kl.block_size) as usize] as u64 * kl.stride[0]
                            + (tok % kl.block_size) * kl.stride[1]
                            + hh * kl.stride[2]
                            + c * kl.stride[3];
                        let dsti = (hh * n + tok) * kl.dim + c;
                        let (sp, dp) = (
                            (kl.data as usize) + (src * es) as usize,
                            o + (dsti * es) as usize,
                        );
                        let eq = if es == 4 {
                            *(sp as *const u32) == *(dp as *const u32)
                        } else {
                            *(sp as *const u16) == *(dp as *const u16)
                        };
                        assert!(eq, "gathered element differs from the pool's");
                    }
                }
            }
        } else {
            assert!(
                out.data as usize == 0x40 && out.len == 77 && out.extent == [9; 3],
                "out written on error"
            );
            // dst is scratch on error (the table check's bitmap), as a workspace
            scratch_back(a, &ck.before, dspan);
        }
    } else {
        // kept lists: one shared or one per head, mostly ascending and in range
        let lists = if r.chance(2) || h > 64 { 1 } else { h as usize };
        let mut offs = vec![0u64];
        let mut idx: Vec<u32> = Vec::new();
        let span_n_ = n.min(4096) as u32;
        for _ in 0..lists {
            let mut p = 0u32;
            while p < span_n_ && idx.len() < 512 {
                if r.chance(3) {
                    idx.push(p);
                }
                p += 1 + r.u8() as u32 % 3;
            }
            if r.chance(30) {
                idx.push(r.u32() % (span_n_ + 2));
            }
            offs.push(idx.len() as u64);
        }
        if r.chance(30) {
            let k = r.u8() as usize % offs.len();
            offs[k] = r.size(1024);
        }
        let total = (offs[offs.len() - 1].saturating_sub(offs[0])).min(4096) as usize;
        let pos_own: Vec<u32> = (0..n.min(4096) as u32).map(|i| i * 3 + 1).collect();
        let (pos, pos_len) = if r.chance(2) {
            (std::ptr::null(), 0)
        } else {
            (pos_own.as_ptr(), pos_own.len() as u64)
        };
        let kept = Out::new(r, a, total);
        let lens = Out::new(r, a, h.min(64) as usize);
        let mut freed = CANARY as u64;
        let fp: *mut u64 = if r.chance(40) {
            std::ptr::null_mut()
        } else {
            &mut freed
        };
        let mut q = 0u64;
        let qs = kve_paged_compact_workspace_size(&kl, &mut q);
        let mut ws = workspace(r, if qs == KVE_OK { Some(q) } else { None });
        let (wp, wl) = if r.chance(16) {
            let o = (r.u8() as usize % 64) * 8;
            (
                a.base().add(o) as *mut u8,
                (ARENA - o).min(ws.len().max(64)) as u64,
            )
        } else {
            (ws.as_mut_ptr(), ws.len() as u64)
        };
        let wspan = span_n(wp as *const c_void, wl, 1);
        let ospan = span_n(offs.as_ptr() as *const c_void, offs.len() as u64, 8);
        let ispan = span_n(idx.as_ptr() as *const c_void, idx.len() as u64, 4);
        st = kve_paged_compact(
            &kl,
            table,
            tl as u64,
            n,
            offs.as_ptr(),
            offs.len() as u64,
            idx.as_ptr(),
            idx.len() as u64,
            pos,
            pos_len,
            kept.ptr,
            kept.len,
            lens.ptr,
            lens.len,
            fp,
            wp as *mut c_void,
            wl,
        );
        if debug() {
            eprintln!(
                "paged compact n={n} bs={} lists={} st={st}",
                kl.block_size,
                offs.len() - 1
            );
        }
        if st == KVE_OK {
            for o in [kept.span(), lens.span(), wspan] {
                assert!(
                    !overlaps(o, pool_span)
                        && !overlaps(o, tspan)
                        && !overlaps(o, ospan)
                        && !overlaps(o, ispan),
                    "compaction output over an input accepted"
                );
            }
            ck.dst_in_arena = true; // the pool lives in the arena
            let before_blocks = n.div_ceil(kl.block_size);
            assert!(freed <= before_blocks, "more blocks freed than held");
            let most = (0..offs.len() - 1)
                .map(|u| offs[u + 1] - offs[u])
                .max()
                .unwrap_or(0);
            assert_eq!(freed, before_blocks - most.div_ceil(kl.block_size));
            if !kept.ptr.is_null() && !kept.in_arena {
                let k = std::slice::from_raw_parts(kept.ptr, total);
                let list = &idx[offs[0] as usize..offs[offs.len() - 1] as usize];
                for (j, &t) in list.iter().enumerate() {
                    let want = if pos.is_null() {
                        t
                    } else {
                        pos_own[t as usize]
                    };
                    assert_eq!(k[j], want, "kept position");
                }
            }
        } else {
            assert_eq!(freed, CANARY as u64, "blocks_freed written on error");
            scratch_back(a, &ck.before, wspan);
        }
        ck.outs.extend([kept, lens]);
    }
    Some(st)
}
