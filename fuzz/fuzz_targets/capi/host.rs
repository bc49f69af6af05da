//! The host entry points: scoring, the statistics precomputations, selection,
//! compaction and the sharded search (ops 0 to 8).

use crate::harness::*;
use kvevict::capi::*;
use std::ffi::c_void;

/// Op 0: `kve_score_layer` (host), its inputs and precomputed statistics views over the arena.
pub unsafe fn score_layer(r: &mut R, a: &mut Arena, ck: &mut Checks) -> Option<i32> {
    let st;
    let (spb, mut inp) = score_call(r, a, |_| 272);
    let sp = &spb.p;
    let fl = |r: &mut R| {
        let off = (r.u8() as usize % 64) * 4;
        let len = r.u32() as u64 % ((ARENA - off) / 4) as u64;
        (a.base().add(off) as *const f32, len)
    };
    if r.chance(3) {
        (inp.gram, inp.gram_len) = fl(r);
    }
    if r.chance(3) {
        (inp.value_forms, inp.value_forms_len) = fl(r);
    }
    if r.chance(3) {
        (inp.value_l1, inp.value_l1_len) = fl(r);
    }
    let work = inp
        .queries
        .extent
        .iter()
        .fold(1u64, |x, &e| x.saturating_mul(e))
        .saturating_mul(inp.keys.extent[1]);
    if elems(&inp.queries) > 1 << 16
        || elems(&inp.keys) > 1 << 16
        || elems(&inp.values) > 1 << 16
        || work > 1 << 24
    {
        return None;
    }
    let (hq, hkv, n, dk) = (
        inp.queries.extent[0],
        inp.keys.extent[0],
        inp.keys.extent[1],
        inp.keys.extent[2],
    );
    let mut ws_q = 0u64;
    let q = (kve_score_workspace_size(sp, hq, hkv, n, dk, inp.values.extent[2].max(1), &mut ws_q)
        == KVE_OK)
        .then_some(ws_q);
    let mut olen = 0u64;
    let ol = kve_score_output_len(sp, hkv, n, &mut olen);
    let max = if ol == KVE_OK && olen < 1 << 16 {
        olen as usize
    } else {
        64
    };
    let o = Out::new(r, a, max);
    let mut ws = workspace(r, q);
    st = kve_score_layer(
        sp,
        &inp,
        o.ptr as *mut f32,
        o.len,
        ws.as_mut_ptr() as *mut c_void,
        ws.len() as u64,
    );
    for t in [&inp.queries, &inp.keys, &inp.values] {
        if st == KVE_OK {
            assert!(
                !overlaps(o.span(), span(t)),
                "output overlapping an input accepted"
            );
        }
    }
    if st == KVE_OK && ol == KVE_OK && !o.in_arena && olen > 0 && !o.ptr.is_null() {
        let s = std::slice::from_raw_parts(o.ptr as *const f32, olen as usize);
        assert!(s.iter().all(|x| x.is_finite()), "non-finite score");
    }
    ck.outs.push(o);
    Some(st)
}

/// Ops 1 to 3: `kve_compute_gram`, `kve_compute_value_forms`, `kve_compute_value_l1`.
pub unsafe fn layer_stats(op: u8, r: &mut R, a: &mut Arena, ck: &mut Checks) -> Option<i32> {
    let st;
    let wo = tensor(r, a, [8, 32, 64]);
    let v = tensor(r, a, [4, 96, 32]);
    if elems(&wo) > 1 << 16 || elems(&v) > 1 << 16 {
        return None;
    }
    let hkv = r.size(8);
    let cross = r.enum_val(2);
    let o = Out::new(r, a, 1 << 14);
    if op == 1 {
        let mut q = 0u64;
        let ok = kve_gram_workspace_size(wo.extent[1], wo.extent[2], &mut q) == KVE_OK;
        let mut ws = workspace(r, ok.then_some(q));
        st = kve_compute_gram(
            &wo,
            hkv,
            cross,
            o.ptr as *mut f32,
            o.len,
            ws.as_mut_ptr() as *mut c_void,
            ws.len() as u64,
        );
    } else if op == 2 {
        let off = (r.u8() as usize % 64) * 4;
        let glen = r.u32() as u64 % ((ARENA - off) / 4) as u64;
        let (t0, t1) = (r.size(100), r.size(100));
        st = kve_compute_value_forms(
            &v,
            a.base().add(off) as *const f32,
            glen,
            r.size(16),
            cross,
            t0,
            t1,
            o.ptr as *mut f32,
            o.len,
        );
    } else {
        let mut q = 0u64;
        let ok = kve_value_l1_workspace_size(wo.extent[1], wo.extent[2], &mut q) == KVE_OK;
        let mut ws = workspace(r, ok.then_some(q));
        st = kve_compute_value_l1(
            &v,
            &wo,
            o.ptr as *mut f32,
            o.len,
            ws.as_mut_ptr() as *mut c_void,
            ws.len() as u64,
        );
    }
    if st == KVE_OK {
        // inputs of each call: gram reads wo; value forms read v (and the gram);
        // value L1 reads both
        if op != 2 {
            assert!(!overlaps(o.span(), span(&wo)), "output over wo accepted");
        }
        if op != 1 {
            assert!(!overlaps(o.span(), span(&v)), "output over values accepted");
        }
    }
    ck.outs.push(o);
    Some(st)
}

/// Ops 4 and 5: `kve_select_model`.
pub unsafe fn select_model(op: u8, r: &mut R, a: &mut Arena, ck: &mut Checks) -> Option<i32> {
    let st;
    let sp0 = select_params(r);
    let spb = padded(r, sp0);
    let sp = &spb.p;
    let ms = model_scores(r, a, false);
    let (layers, hkv, n, w) = (ms.layers, ms.hkv, ms.n, ms.window);
    let (mut ol, mut il, mut wl) = (0u64, 0u64, 0u64);
    let ok = kve_select_output_len(sp, layers, hkv, n, w, &mut ol, &mut il) == KVE_OK
        && kve_select_workspace_size(sp, layers, hkv, n, w, &mut wl) == KVE_OK
        && ol < 1 << 14
        && il < 1 << 18;
    let (ol, il) = if ok {
        (ol as usize, il as usize)
    } else {
        (16, 256)
    };
    let o = Out::new(r, a, ol * 2);
    let o = Out {
        len: o.len / 2,
        ..o
    };
    let i = Out::new(r, a, il);
    let mut ws = workspace(r, ok.then_some(wl));
    st = kve_select_model(
        sp,
        &ms,
        o.ptr as *mut u64,
        o.len,
        i.ptr,
        i.len,
        ws.as_mut_ptr() as *mut c_void,
        ws.len() as u64,
    );
    if st == KVE_OK {
        let sc = (ms.scores as usize, ms.scores as usize + ms.len as usize * 4);
        assert!(
            !overlaps(o.span(), sc) && !overlaps(i.span(), sc),
            "selection output over the scores"
        );
    }
    if st == KVE_OK && !o.in_arena && !i.in_arena {
        let units = (layers * hkv) as usize;
        check_csr(&o.own, units + 1, &i.own[..i.len as usize], units, n);
        if op == 5 {
            // the eviction list of unit 0
            let offs = std::slice::from_raw_parts(o.ptr as *const u64, 2);
            let kept = &i.own[offs[0] as usize..offs[1] as usize];
            let p = n - w.min(n);
            let mut ev = vec![CANARY; p as usize + 1];
            let mut cnt = 0u64;
            let e = kve_evicted_positions(
                kept.as_ptr(),
                kept.len() as u64,
                p,
                ev.as_mut_ptr(),
                ev.len() as u64,
                &mut cnt,
            );
            assert_eq!(e, KVE_OK);
            assert_eq!(
                cnt + kept.iter().filter(|&&x| (x as u64) < p).count() as u64,
                p
            );
        }
    }
    ck.outs.push(o);
    ck.outs.push(i);
    Some(st)
}

/// Ops 6 and 7: `kve_compact_in_place` and `kve_compact_varlen` over a mutable copy.
pub unsafe fn compact(op: u8, r: &mut R, a: &mut Arena, ck: &mut Checks) -> Option<i32> {
    let st;
    // compaction over a mutable copy; lists from the input (random or plausible)
    let heads = 1 + r.u8() as u64 % 4;
    let mut lists = vec![0u64; heads as usize + 1];
    let mut idx: Vec<u32> = Vec::new();
    let n = 1 + r.u8() as u32 % 64;
    for h in 0..heads as usize {
        lists[h] = idx.len() as u64;
        let mut t = 0u32;
        while t < n && idx.len() < 512 {
            if r.chance(2) {
                idx.push(if r.chance(30) { r.u32() } else { t });
            }
            t += 1 + r.u8() as u32 % 4;
        }
    }
    lists[heads as usize] = idx.len() as u64;
    if r.chance(20) {
        let k = r.u8() as usize % lists.len();
        lists[k] = r.u64() % 600;
    }
    let mut kv = tensor(r, a, [4, 64, 16]);
    if elems(&kv) > 1 << 16 {
        return None;
    }
    if op == 6 {
        // write into a private copy of the arena, at the same offset
        let mut copy = a.buf.clone();
        if !kv.data.is_null() {
            let off = kv.data as usize - a.base() as usize;
            kv.data = (copy.as_mut_ptr() as *mut u8).add(off) as *const c_void;
        }
        let snapshot = copy.clone();
        let o = Out::new(r, a, heads as usize);
        st = kve_compact_in_place(
            &kv,
            lists.as_ptr(),
            lists.len() as u64,
            idx.as_ptr(),
            idx.len() as u64,
            o.ptr,
            o.len,
        );
        if st != KVE_OK {
            assert!(copy == snapshot, "cache written on error");
        } else if !o.in_arena && o.len >= heads && kv.extent[0] == heads {
            for h in 0..heads as usize {
                assert_eq!(o.own[h] as u64, lists[h + 1] - lists[h]);
            }
        }
        ck.outs.push(o);
    } else {
        let mut dst_buf = vec![CANARY; 1 << 13];
        let mut d = tensor(r, a, [1, 600, 16]);
        if !d.data.is_null() && !r.chance(10) {
            d.data = dst_buf.as_mut_ptr() as *const c_void;
            d.len = d
                .len
                .min((dst_buf.len() * 4 / if d.dtype == 0 { 4 } else { 2 }) as u64);
        } else {
            ck.dst_in_arena = !d.data.is_null();
        }
        if elems(&d) > 1 << 16 {
            return None;
        }
        let o = Out::new(r, a, heads as usize + 1);
        st = kve_compact_varlen(
            &kv,
            lists.as_ptr(),
            lists.len() as u64,
            idx.as_ptr(),
            idx.len() as u64,
            &d,
            o.ptr as *mut i32,
            o.len,
        );
        if st != KVE_OK {
            assert!(
                dst_buf.iter().all(|&x| x == CANARY),
                "varlen dst written on error"
            );
        } else {
            assert!(!overlaps(span(&d), span(&kv)));
        }
        ck.outs.push(o);
    }
    Some(st)
}

/// Op 8: the sharded search (`kve_search_*`) end to end over two shards.
pub unsafe fn search(r: &mut R, a: &mut Arena) -> Option<i32> {
    let st;
    let sp = select_params(r);
    let (layers, hkv, n, w) = (
        1 + r.u8() as u64 % 6,
        1 + r.u8() as u64 % 4,
        1 + r.u8() as u64 % 100,
        r.u8() as u64 % 40,
    );
    let split = r.u8() as u64 % (layers + 1);
    let p = n - w.min(n);
    let scores = std::slice::from_raw_parts(a.base() as *const f32, (layers * hkv * p) as usize);
    let mut s: kve_search = std::mem::zeroed();
    st = kve_search_init(&mut s, &sp, layers, hkv, n, w);
    if st == KVE_OK {
        let mut done = 0;
        let mut rounds = 0;
        let mut failed = false;
        while done == 0 && !failed {
            let mut total: kve_histogram = std::mem::zeroed();
            for (l0, ln) in [(0, split), (split, layers - split)] {
                if ln == 0 {
                    continue;
                }
                let part = &scores[(l0 * hkv * p) as usize..((l0 + ln) * hkv * p) as usize];
                let ms = kve_model_scores {
                    scores: part.as_ptr(),
                    len: part.len() as u64,
                    layers: ln,
                    hkv,
                    n,
                    window: w,
                };
                let mut wl = 0u64;
                assert_eq!(
                    kve_select_shard_workspace_size(&sp, ln, hkv, n, w, &mut wl),
                    KVE_OK
                );
                let mut ws = vec![0u8; wl as usize];
                let mut h: kve_histogram = std::mem::zeroed();
                let c = kve_search_count_shard(
                    &sp,
                    &ms,
                    l0,
                    &s,
                    &mut h,
                    ws.as_mut_ptr() as *mut c_void,
                    wl,
                );
                if c != KVE_OK {
                    assert!(h.bins.iter().all(|&b| b == 0), "histogram written on error");
                    failed = true;
                    break;
                }
                assert_eq!(kve_histogram_merge(&mut total, &h), KVE_OK);
            }
            if !failed {
                assert_eq!(kve_search_step(&mut s, &total, &mut done), KVE_OK);
                rounds += 1;
                assert!(rounds <= 13, "search did not finish");
            }
        }
        if !failed {
            let mut thr = 0f32;
            assert_eq!(kve_search_threshold(&s, &mut thr), KVE_OK);
            let ms = kve_model_scores {
                scores: scores.as_ptr(),
                len: scores.len() as u64,
                layers,
                hkv,
                n,
                window: w,
            };
            let (mut ol, mut il, mut wl) = (0u64, 0u64, 0u64);
            assert_eq!(
                kve_select_shard_output_len(layers, hkv, n, &mut ol, &mut il),
                KVE_OK
            );
            assert_eq!(
                kve_select_shard_workspace_size(&sp, layers, hkv, n, w, &mut wl),
                KVE_OK
            );
            let mut o = vec![0u32; ol as usize * 2];
            let mut i = vec![0u32; il as usize];
            let mut ws = vec![0u8; wl as usize];
            assert_eq!(
                kve_select_shard(
                    &sp,
                    &ms,
                    0,
                    &s,
                    o.as_mut_ptr() as *mut u64,
                    ol,
                    i.as_mut_ptr(),
                    il,
                    ws.as_mut_ptr() as *mut c_void,
                    wl
                ),
                KVE_OK
            );
            check_csr(
                &o,
                (layers * hkv) as usize + 1,
                &i,
                (layers * hkv) as usize,
                n,
            );
        }
    }
    Some(st)
}
