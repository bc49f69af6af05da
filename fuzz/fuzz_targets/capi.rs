//! Drives the C entry points with arbitrary descriptors and data: views over a
//! fuzzer-owned arena with arbitrary offsets (alignment), dtypes, extents, strides and
//! lengths (never more than the arena holds), arbitrary params and enum values, output
//! buffers of arbitrary sizes, sometimes placed inside the inputs.
//!
//! The device entry points (`kve_cuda_score_layer`, `kve_cuda_select_model`) run the real
//! kernels of cuda/ on the CPU emulator (feature `cuda-emu`): the arena and every output
//! and workspace buffer are registered with the emulated runtime as device memory (as
//! `cudaHostRegister`'d mapped memory is on a GPU), so the same arena serves as device
//! memory and the emulator still aborts on a kernel pointer outside every registered
//! buffer.
//!
//! The evictor (`kve_evictor_*`, or its device form `kve_cuda_evictor_*` on the
//! emulator) runs a random sequence of calls on one context built from an arbitrary
//! config: after every refused call the context (its workspace aside; for the device form
//! the host context and the device block) and every output are as they were.
//!
//! The query stream (`kve_stream_*`) runs start to finish: size, start, one to three
//! chunks, then scores, raw statistics or the count, with its descriptors, positions
//! and outputs sometimes placed inside the state, the workspace or the output.
//!
//! The paged entry points (`kve_paged_*`) get a pool layout over the arena (an engine's
//! kind or arbitrary strides), a table (sometimes words of the arena), a gather (checked
//! element by element through the table) or an in-place compaction (blocks freed and
//! kept positions checked).
//!
//! Oracles: no crash, no out-of-bounds access (ASan), and
//! - on error, outputs still hold their canaries and the arena is unchanged;
//! - on success, outputs are well formed (finite host scores, ascending kept lists, ...);
//! - an output overlapping an input never succeeds;
//! - a device call never answers `KVE_ERR_CUDA`: that means a launcher refused arguments
//!   the C layer had accepted (its validation is incomplete; the emulator has sm_90's
//!   shared-memory limit).
//! The harness caps the work of one call (element counts of views with stride 0, which
//! a small buffer can declare legally), not what the library accepts.
#![no_main]

#[path = "capi/evictor.rs"]
mod evictor;
#[path = "capi/harness.rs"]
mod harness;

use harness::*;
use kvevict::capi::*;
use libfuzzer_sys::fuzz_target;
use std::ffi::c_void;

fuzz_target!(|data: &[u8]| {
    let mut r = R { d: data, i: 0 };
    let op = r.u8() % 14;
    let mut a = Arena::new(&mut r);
    let before: Vec<u8> = a.bytes().to_vec();
    let st;
    let mut outs: Vec<Out> = Vec::new();
    // a destination tensor left inside the arena (varlen compaction) or a device
    // workspace inside it is an output too
    let mut dst_in_arena = false;
    unsafe {
        match op {
            0 => {
                let sp0 = score_params(&mut r);
                let spb = padded(&mut r, sp0);
                let sp = &spb.p;
                let mut inp: kve_layer_inputs = std::mem::zeroed();
                kve_layer_inputs_init(&mut inp, 272);
                inp.queries = tensor(&mut r, &a, [8, 40, 32]);
                inp.keys = tensor(&mut r, &a, [4, 96, 32]);
                if r.chance(2) {
                    inp.values = tensor(&mut r, &a, [4, 96, 32]);
                }
                let fl = |r: &mut R| {
                    let off = (r.u8() as usize % 64) * 4;
                    let len = r.u32() as u64 % ((ARENA - off) / 4) as u64;
                    (a.base().add(off) as *const f32, len)
                };
                if r.chance(3) {
                    (inp.gram, inp.gram_len) = fl(&mut r);
                }
                if r.chance(3) {
                    (inp.value_forms, inp.value_forms_len) = fl(&mut r);
                }
                if r.chance(3) {
                    (inp.value_l1, inp.value_l1_len) = fl(&mut r);
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
                    return;
                }
                let (hq, hkv, n, dk) = (
                    inp.queries.extent[0],
                    inp.keys.extent[0],
                    inp.keys.extent[1],
                    inp.keys.extent[2],
                );
                let mut ws_q = 0u64;
                let q = (kve_score_workspace_size(
                    sp,
                    hq,
                    hkv,
                    n,
                    dk,
                    inp.values.extent[2].max(1),
                    &mut ws_q,
                ) == KVE_OK)
                    .then_some(ws_q);
                let mut olen = 0u64;
                let ol = kve_score_output_len(sp, hkv, n, &mut olen);
                let max = if ol == KVE_OK && olen < 1 << 16 {
                    olen as usize
                } else {
                    64
                };
                let o = Out::new(&mut r, &mut a, max);
                let mut ws = workspace(&mut r, q);
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
                outs.push(o);
            }
            1 | 2 | 3 => {
                let wo = tensor(&mut r, &a, [8, 32, 64]);
                let v = tensor(&mut r, &a, [4, 96, 32]);
                if elems(&wo) > 1 << 16 || elems(&v) > 1 << 16 {
                    return;
                }
                let hkv = r.size(8);
                let cross = r.enum_val(2);
                let o = Out::new(&mut r, &mut a, 1 << 14);
                if op == 1 {
                    let mut q = 0u64;
                    let ok = kve_gram_workspace_size(wo.extent[1], wo.extent[2], &mut q) == KVE_OK;
                    let mut ws = workspace(&mut r, ok.then_some(q));
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
                    let ok =
                        kve_value_l1_workspace_size(wo.extent[1], wo.extent[2], &mut q) == KVE_OK;
                    let mut ws = workspace(&mut r, ok.then_some(q));
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
                outs.push(o);
            }
            4 | 5 => {
                let sp0 = select_params(&mut r);
                let spb = padded(&mut r, sp0);
                let sp = &spb.p;
                let (layers, hkv, n, w) = (r.size(6), r.size(4), r.size(120), r.u8() as u64 % 40);
                let off = (r.u8() as usize % 64) * 4;
                let len = if r.chance(4) {
                    r.u32() as u64 % ((ARENA - off) / 4) as u64
                } else {
                    layers
                        .saturating_mul(hkv)
                        .saturating_mul(n.saturating_sub(w))
                        .min(((ARENA - off) / 4) as u64)
                };
                let ms = kve_model_scores {
                    scores: a.base().add(off) as *const f32,
                    len,
                    layers,
                    hkv,
                    n,
                    window: w,
                };
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
                let o = Out::new(&mut r, &mut a, ol * 2);
                let o = Out {
                    len: o.len / 2,
                    ..o
                };
                let i = Out::new(&mut r, &mut a, il);
                let mut ws = workspace(&mut r, ok.then_some(wl));
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
                outs.push(o);
                outs.push(i);
            }
            6 | 7 => {
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
                let mut kv = tensor(&mut r, &a, [4, 64, 16]);
                if elems(&kv) > 1 << 16 {
                    return;
                }
                if op == 6 {
                    // write into a private copy of the arena, at the same offset
                    let mut copy = a.buf.clone();
                    if !kv.data.is_null() {
                        let off = kv.data as usize - a.base() as usize;
                        kv.data = (copy.as_mut_ptr() as *mut u8).add(off) as *const c_void;
                    }
                    let snapshot = copy.clone();
                    let o = Out::new(&mut r, &mut a, heads as usize);
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
                    outs.push(o);
                } else {
                    let mut dst_buf = vec![CANARY; 1 << 13];
                    let mut d = tensor(&mut r, &a, [1, 600, 16]);
                    if !d.data.is_null() && !r.chance(10) {
                        d.data = dst_buf.as_mut_ptr() as *const c_void;
                        d.len = d
                            .len
                            .min((dst_buf.len() * 4 / if d.dtype == 0 { 4 } else { 2 }) as u64);
                    } else {
                        dst_in_arena = !d.data.is_null();
                    }
                    if elems(&d) > 1 << 16 {
                        return;
                    }
                    let o = Out::new(&mut r, &mut a, heads as usize + 1);
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
                    outs.push(o);
                }
            }
            9 => {
                // kve_cuda_score_layer: op 0 on the device (the kernels on the emulator)
                let sp0 = score_params(&mut r);
                let spb = padded(&mut r, sp0);
                let sp = &spb.p;
                let mut inp: kve_layer_inputs = std::mem::zeroed();
                kve_layer_inputs_init(&mut inp, if r.chance(2) { 288 } else { 272 });
                inp.queries = tensor(&mut r, &a, [8, 40, 32]);
                inp.keys = tensor(&mut r, &a, [4, 96, 32]);
                if r.chance(2) {
                    inp.values = tensor(&mut r, &a, [4, 96, 32]);
                }
                wide_heads(&mut r, &mut inp.queries);
                if let Some(h) = wide_heads(&mut r, &mut inp.keys) {
                    if !inp.values.data.is_null() && r.chance(2) {
                        (inp.values.extent[0], inp.values.stride[0]) = (h, 0);
                    }
                }
                let (hq, hkv, n, dk) = (
                    inp.queries.extent[0],
                    inp.keys.extent[0],
                    inp.keys.extent[1],
                    inp.keys.extent[2],
                );
                let dv = if inp.values.data.is_null() {
                    dk
                } else {
                    inp.values.extent[2]
                };
                // the lengths the call wants (sometimes given exactly, to get past them)
                let cross = sp.scorer == 2 && sp.laprox_gqa != 0;
                let g = if hkv > 0 && hq % hkv == 0 {
                    hq / hkv
                } else {
                    1
                };
                let blocks = if cross {
                    g.saturating_mul(g.saturating_add(1)) / 2
                } else {
                    g
                };
                let w = (sp.window as u64).min(n);
                let want = [
                    hkv.saturating_mul(blocks)
                        .saturating_mul(dv.saturating_mul(dv)),
                    hkv.saturating_mul(blocks).saturating_mul(n),
                    hkv.saturating_mul(n),
                    hq.saturating_mul(w),
                ];
                if r.chance(3) {
                    (inp.gram, inp.gram_len) = floats_in(&mut r, &a, want[0], true);
                }
                if r.chance(3) {
                    (inp.value_forms, inp.value_forms_len) = floats_in(&mut r, &a, want[1], true);
                }
                if r.chance(3) {
                    (inp.value_l1, inp.value_l1_len) = floats_in(&mut r, &a, want[2], true);
                }
                if inp.struct_size >= 288 && r.chance(3) {
                    (inp.row_lse, inp.row_lse_len) = floats_in(&mut r, &a, want[3], true);
                }
                // work of the kernels: window (x g for the cross pairs), vonorm
                let work = elems(&inp.queries)
                    .saturating_mul(n)
                    .saturating_mul(if cross { g.clamp(1, 16) } else { 1 });
                let vo = if inp.gram.is_null() {
                    0
                } else {
                    n.saturating_mul(inp.gram_len)
                };
                if elems(&inp.queries) > 1 << 18
                    || elems(&inp.keys) > 1 << 18
                    || elems(&inp.values) > 1 << 18
                    || work > 1 << 24
                    || vo > 1 << 24
                {
                    return;
                }
                let mut ws_q = 0u64;
                let q = (kve_cuda_score_workspace_size(sp, hq, hkv, n, dk, dv.max(1), &mut ws_q)
                    == KVE_OK)
                    .then_some(ws_q);
                let mut olen = 0u64;
                let ol = kve_score_output_len(sp, hkv, n, &mut olen);
                let max = if ol == KVE_OK && olen <= 1 << 18 {
                    olen as usize
                } else {
                    64
                };
                let o = Out::new(&mut r, &mut a, max);
                let ws = dev_workspace(&mut r, &mut a, q);
                dst_in_arena = ws.in_arena;
                st = kve_cuda_score_layer(
                    sp,
                    &inp,
                    o.ptr as *mut f32,
                    o.len,
                    ws.ptr,
                    ws.len,
                    std::ptr::null_mut(),
                );
                if debug() {
                    let rel = |p: *const c_void| offset_in(&a, p);
                    eprintln!(
                        "status {st}\nparams {:?}\nq {:?} @{}\nk {:?} @{}\nv {:?} @{}",
                        std::slice::from_raw_parts(sp as *const _ as *const u32, 12),
                        inp.queries,
                        rel(inp.queries.data),
                        inp.keys,
                        rel(inp.keys.data),
                        inp.values,
                        rel(inp.values.data)
                    );
                    eprintln!(
                        "gram @{} {} forms @{} {} l1 @{} {} lse @{} {}",
                        rel(inp.gram as _),
                        inp.gram_len,
                        rel(inp.value_forms as _),
                        inp.value_forms_len,
                        rel(inp.value_l1 as _),
                        inp.value_l1_len,
                        rel(inp.row_lse as _),
                        inp.row_lse_len
                    );
                    eprintln!(
                        "out @{} len {} (olen {olen}); ws query {q:?} @{} len {}",
                        rel(o.ptr as _),
                        o.len,
                        rel(ws.ptr),
                        ws.len
                    );
                }
                check_device_status(st, q, ws.len);
                if st == KVE_OK {
                    // what the call reads, and what it writes
                    // (queries read, values read) per scorer, as src/math/score/requirements.rs
                    let (qr, vr) = match sp.scorer {
                        4 | 5 => (false, false),
                        1 => (true, true),
                        7 => (false, true), // uniqueness: keys and values, no queries
                        2 => (true, inp.value_forms.is_null()),
                        _ => (true, false),
                    };
                    let mut reads = vec![span(&inp.keys)];
                    if qr {
                        reads.push(span(&inp.queries));
                        reads.push(span_n(inp.row_lse as _, inp.row_lse_len, 4));
                    }
                    if vr {
                        reads.push(span(&inp.values));
                    }
                    if sp.scorer == 2 {
                        reads.push(span_n(inp.value_forms as _, inp.value_forms_len, 4));
                        if inp.value_forms.is_null() {
                            reads.push(span_n(inp.gram as _, inp.gram_len, 4));
                        }
                    }
                    if sp.scorer == 3 {
                        reads.push(span_n(inp.value_l1 as _, inp.value_l1_len, 4));
                    }
                    // (LaProx given value forms uses less workspace than the query sized)
                    let ws_used = if sp.scorer == 2 && !inp.value_forms.is_null() {
                        0
                    } else {
                        q.unwrap_or(0).min(ws.len)
                    };
                    let writes = [span_n(o.ptr as _, olen, 4), span_n(ws.ptr, ws_used, 1)];
                    for wr in writes {
                        for rd in &reads {
                            assert!(
                                !overlaps(wr, *rd),
                                "device output or workspace over an input accepted"
                            );
                        }
                    }
                    for rd in &reads {
                        assert!(
                            unchanged(&a, &before, *rd),
                            "an input of the device call modified"
                        );
                    }
                    assert!(
                        !overlaps(writes[0], writes[1]),
                        "device output over its workspace accepted"
                    );
                }
                outs.push(o);
            }
            10 => {
                // kve_cuda_select_model: op 4 on the device
                let sp0 = select_params(&mut r);
                let spb = padded(&mut r, sp0);
                let sp = &spb.p;
                let (layers, hkv, n, w) = (r.size(6), r.size(4), r.size(120), r.u8() as u64 % 40);
                let off = (r.u8() as usize % 64) * 4 + if r.chance(32) { 2 } else { 0 };
                let room = ((ARENA - off) / 4) as u64;
                let len = if r.chance(4) {
                    r.u32() as u64 % room
                } else {
                    layers
                        .saturating_mul(hkv)
                        .saturating_mul(n.saturating_sub(w))
                        .min(room)
                };
                let ms = kve_model_scores {
                    scores: a.base().add(off) as *const f32,
                    len,
                    layers,
                    hkv,
                    n,
                    window: w,
                };
                let units = layers.saturating_mul(hkv);
                let p = n - w.min(n);
                let mut wl = 0u64;
                let q = (kve_cuda_select_model_workspace_size(sp, layers, hkv, n, w, &mut wl)
                    == KVE_OK)
                    .then_some(wl);
                let ld = if r.chance(8) {
                    [
                        0,
                        p,
                        n.wrapping_sub(1),
                        n.wrapping_add(1),
                        1 << 31,
                        (1 << 31) - 1,
                        u64::MAX,
                        r.u64(),
                    ][r.u8() as usize % 8]
                } else {
                    n.saturating_add(r.u8() as u64 % 4)
                };
                let sane = q.is_some()
                    && units <= 1 << 14
                    && ld <= 1 << 16
                    && units.saturating_mul(ld) <= 1 << 18;
                let (cmax, imax) = if sane {
                    (units as usize, (units * ld) as usize)
                } else {
                    (16, 256)
                };
                let c = Out::new(&mut r, &mut a, cmax);
                let i = Out::new(&mut r, &mut a, imax);
                let ws = dev_workspace(&mut r, &mut a, q);
                dst_in_arena = ws.in_arena;
                st = kve_cuda_select_model(
                    sp,
                    &ms,
                    c.ptr as *mut i32,
                    c.len,
                    i.ptr as *mut i32,
                    ld,
                    i.len,
                    ws.ptr,
                    ws.len,
                    std::ptr::null_mut(),
                );
                if debug() {
                    let rel = |p: *const c_void| offset_in(&a, p);
                    eprintln!("status {st}\nparams {:?}\nscores @{} len {len} layers {layers} hkv {hkv} n {n} w {w}", std::slice::from_raw_parts(sp as *const _ as *const u32, 12), rel(ms.scores as _));
                    eprintln!(
                        "counts @{} len {}; idx @{} ld {ld} len {}; ws query {q:?} @{} len {}",
                        rel(c.ptr as _),
                        c.len,
                        rel(i.ptr as _),
                        i.len,
                        rel(ws.ptr),
                        ws.len
                    );
                }
                check_device_status(st, q, ws.len);
                if st == KVE_OK {
                    let sc = span_n(ms.scores as _, units * p, 4);
                    let writes = [
                        span_n(c.ptr as _, units, 4),
                        span_n(i.ptr as _, (units - 1) * ld + n, 4),
                        span_n(ws.ptr, q.unwrap_or(0).min(ws.len), 1),
                    ];
                    for (k, wr) in writes.iter().enumerate() {
                        assert!(
                            !overlaps(*wr, sc),
                            "device selection output over the scores"
                        );
                        for other in &writes[k + 1..] {
                            assert!(
                                !overlaps(*wr, *other),
                                "device selection outputs overlapping"
                            );
                        }
                    }
                    assert!(
                        unchanged(&a, &before, sc),
                        "device selection modified its scores"
                    );
                    if !c.in_arena && !i.in_arena {
                        for u in 0..units as usize {
                            let cnt = c.own[u] as i32;
                            assert!(
                                cnt >= 0 && cnt as u64 <= n,
                                "count {cnt} of unit {u} (N = {n})"
                            );
                            let row = &i.own[u * ld as usize..u * ld as usize + cnt as usize];
                            assert!(
                                row.windows(2).all(|x| (x[0] as i32) < x[1] as i32),
                                "ascending"
                            );
                            assert!(
                                row.iter().all(|&x| (x as i32) >= 0 && (x as u64) < n),
                                "in range"
                            );
                            // the whole window closes every list
                            let wn = (n - p) as usize;
                            assert!(
                                row.len() >= wn
                                    && row[row.len() - wn..]
                                        .iter()
                                        .zip(p as u32..)
                                        .all(|(&x, y)| x == y),
                                "window listed"
                            );
                        }
                        // the kept sets are the host's (where the host accepts the scores)
                        let (mut hol, mut hil, mut hwl) = (0u64, 0u64, 0u64);
                        if p > 0
                            && layers <= 1 << 12
                            && kve_select_output_len(sp, layers, hkv, n, w, &mut hol, &mut hil)
                                == KVE_OK
                            && kve_select_workspace_size(sp, layers, hkv, n, w, &mut hwl) == KVE_OK
                            && hil <= 1 << 20
                            && hwl <= 64 << 20
                        {
                            let mut ho = vec![0u64; hol as usize];
                            let mut hi = vec![0u32; hil as usize];
                            let mut hw = vec![0u8; hwl as usize];
                            let hs = kve_select_model(
                                sp,
                                &ms,
                                ho.as_mut_ptr(),
                                hol,
                                hi.as_mut_ptr(),
                                hil,
                                hw.as_mut_ptr() as *mut c_void,
                                hwl,
                            );
                            if hs == KVE_OK {
                                for u in 0..units as usize {
                                    let host = &hi[ho[u] as usize..ho[u + 1] as usize];
                                    let dev = &i.own
                                        [u * ld as usize..u * ld as usize + c.own[u] as usize];
                                    assert_eq!(
                                        dev, host,
                                        "unit {u}: device kept list differs from the host's"
                                    );
                                }
                            }
                        }
                    }
                }
                outs.push(c);
                outs.push(i);
            }
            8 => {
                // sharded search end to end over two shards
                let sp = select_params(&mut r);
                let (layers, hkv, n, w) = (
                    1 + r.u8() as u64 % 6,
                    1 + r.u8() as u64 % 4,
                    1 + r.u8() as u64 % 100,
                    r.u8() as u64 % 40,
                );
                let split = r.u8() as u64 % (layers + 1);
                let p = n - w.min(n);
                let scores =
                    std::slice::from_raw_parts(a.base() as *const f32, (layers * hkv * p) as usize);
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
                            let part =
                                &scores[(l0 * hkv * p) as usize..((l0 + ln) * hkv * p) as usize];
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
                                assert!(
                                    h.bins.iter().all(|&b| b == 0),
                                    "histogram written on error"
                                );
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
            }
            11 => {
                // the query stream: size, start, feed chunks, then finish (scores, raw
                // statistics or the count); arguments sometimes placed inside the state or
                // the workspace
                let hq = r.size(8);
                let hkv = if r.chance(8) {
                    r.size(4)
                } else {
                    [1, 2, hq.max(1)][r.u8() as usize % 3]
                };
                let (n, dk) = (r.size(96), r.size(32));
                let mut bytes = 0u64;
                if kve_stream_state_size(hq, hkv, n, dk, &mut bytes) != KVE_OK || bytes > 1 << 20 {
                    assert_ne!(
                        kve_stream_state_size(hq, hkv, n, dk, std::ptr::null_mut()),
                        KVE_OK
                    );
                    return;
                }
                let mut state = State::new(&mut r, bytes);
                let s0 = state.bytes();
                let ist = kve_stream_init(state.ptr as *mut c_void, state.len, hq, hkv, n, dk);
                if ist != KVE_OK {
                    assert!(state.bytes() == s0, "state written by a refused init");
                    return;
                }
                let mut fed = 0u64;
                let mut last = 0i64;
                for _ in 0..1 + r.u8() % 3 {
                    let c = if r.chance(16) {
                        r.size(8)
                    } else {
                        1 + r.u8() as u64 % 8
                    };
                    let mut q = tensor(&mut r, &a, [8, 8, 32]);
                    fit(&mut r, &a, &mut q, [hq, c, dk]);
                    let mut k = tensor(&mut r, &a, [4, 96, 32]);
                    fit(&mut r, &a, &mut k, [hkv, n, dk]);
                    if elems(&q).saturating_mul(n) > 1 << 20 || elems(&k) > 1 << 16 || c > 1 << 12 {
                        return;
                    }
                    let npos = if r.chance(16) { c.wrapping_add(1) } else { c };
                    let mut pos: Vec<i64> = Vec::new();
                    for _ in 0..npos.min(64) {
                        last = if r.chance(24) {
                            r.u64() as i64
                        } else {
                            last.saturating_add((r.u8() % 4) as i64)
                        };
                        pos.push(last);
                    }
                    let npos = npos.min(pos.len() as u64);
                    let (mut lse, mut lse_len) = (std::ptr::null::<f32>(), 0u64);
                    if r.chance(3) {
                        let off = (r.u8() as usize % 64) * 4 + if r.chance(24) { 2 } else { 0 };
                        let room = ((ARENA - off) / 4) as u64;
                        let want = hq.saturating_mul(c);
                        lse_len = if want < room && !r.chance(8) {
                            want
                        } else {
                            r.u32() as u64 % room
                        };
                        lse = a.base().add(off) as *const f32;
                    }
                    let mut wq = 0u64;
                    let qsz = (kve_stream_feed_workspace_size(hq, hkv, n, dk, c, &mut wq)
                        == KVE_OK)
                        .then_some(wq);
                    let mut ws = workspace(&mut r, qsz);
                    let (mut wsp, mut wsl) = (ws.as_mut_ptr(), ws.len() as u64);
                    // arguments placed over the state or the workspace: never accepted
                    let mut placed = false;
                    let (mut qd, mut kd, mut pp): (
                        *const kve_tensor,
                        *const kve_tensor,
                        *const i64,
                    ) = (&q, &k, pos.as_ptr());
                    match r.u8() % 24 {
                        0 => {
                            let p = state.inside(&mut r, TD) as *mut kve_tensor;
                            p.write(q);
                            (qd, placed) = (p, true);
                        }
                        1 => {
                            let p = state.inside(&mut r, TD) as *mut kve_tensor;
                            p.write(k);
                            (kd, placed) = (p, true);
                        }
                        2 if !pos.is_empty() && pos.len() as u64 * 8 + 16 <= state.len => {
                            let p = state.inside(&mut r, pos.len() * 8) as *mut i64;
                            std::ptr::copy_nonoverlapping(pos.as_ptr(), p, pos.len());
                            (pp, placed) = (p, true);
                        }
                        3 if ws.len() >= TD => {
                            (ws.as_mut_ptr() as *mut kve_tensor).write_unaligned(q);
                            (qd, placed) = (ws.as_ptr() as *const kve_tensor, true);
                        }
                        4 => {
                            let p = state.inside(&mut r, 8);
                            (wsp, wsl, placed) = (p, wsl.min(8), true);
                        }
                        _ => {}
                    }
                    let snap = state.bytes();
                    let fst = kve_stream_feed(
                        state.ptr as *mut c_void,
                        state.len,
                        qd,
                        pp,
                        npos,
                        kd,
                        lse,
                        lse_len,
                        wsp as *mut c_void,
                        wsl,
                    );
                    if debug() {
                        eprintln!("stream feed {fst}: shape {hq} {hkv} {n} {dk}, c {c}, q {:?}, k {:?}, positions {pos:?} ({npos}), lse len {lse_len}, ws {wsl}, placed {placed}", q.extent, k.extent);
                    }
                    if placed {
                        assert_ne!(
                            fst, KVE_OK,
                            "an argument over the state or the workspace accepted"
                        );
                    }
                    if fst != KVE_OK {
                        assert!(
                            state.bytes() == snap,
                            "state written by a refused feed (status {fst})"
                        );
                        assert!(a.bytes() == &before[..], "arena written by a refused feed");
                        if placed || r.chance(2) {
                            return;
                        }
                        continue;
                    }
                    // what the feed read stays as it was, and the state counts the chunk
                    assert!(a.bytes() == &before[..], "feed wrote into its inputs");
                    fed += npos;
                    let mut cnt = 0u64;
                    assert_eq!(
                        kve_stream_query_count(state.ptr as *const c_void, state.len, &mut cnt),
                        KVE_OK
                    );
                    assert_eq!(cnt, fed, "query count");
                }
                let sp = state.ptr as *const c_void;
                match r.u8() % 3 {
                    0 => {
                        let p0 = stream_params(&mut r);
                        let pb = padded(&mut r, p0);
                        let p = &pb.p;
                        let mut v = kve_tensor::NONE;
                        if r.chance(2) {
                            v = tensor(&mut r, &a, [4, 96, 32]);
                            let dv = if r.chance(2) { dk } else { v.extent[2] };
                            fit(&mut r, &a, &mut v, [hkv, n, dv]);
                        }
                        if elems(&v) > 1 << 16 {
                            return;
                        }
                        let g = if hkv > 0 { hq / hkv } else { 1 };
                        let dv = v.extent[2];
                        let want = [
                            hkv.saturating_mul(g).saturating_mul(dv.saturating_mul(dv)),
                            hkv.saturating_mul(g).saturating_mul(n),
                        ];
                        let fl = |r: &mut R, want: u64| match r.chance(3) {
                            true => floats_in(r, &a, want, false),
                            false => (std::ptr::null::<f32>(), 0u64),
                        };
                        let (gram, gl) = fl(&mut r, want[0]);
                        let (forms, fl_) = fl(&mut r, want[1]);
                        if gl.saturating_mul(n) > 1 << 22 {
                            return;
                        }
                        let vd: *const kve_tensor = if v.data.is_null() && r.chance(2) {
                            std::ptr::null()
                        } else {
                            &v
                        };
                        let olen = hkv.saturating_mul(n);
                        let o = Out::new(&mut r, &mut a, olen.min(1 << 14) as usize);
                        let mut wq = 0u64;
                        let qsz = (kve_stream_scores_workspace_size(hq, hkv, n, dk, &mut wq)
                            == KVE_OK)
                            .then_some(wq);
                        let mut ws = workspace(&mut r, qsz);
                        // the params or the values descriptor inside the output: refused
                        let over = !o.in_arena
                            && !o.ptr.is_null()
                            && o.len as usize >= 2 + TD / 4
                            && r.chance(16);
                        let (mut pd, mut vdd) = (p as *const kve_stream_score_params, vd);
                        if over {
                            if r.chance(2) {
                                (o.ptr.add(2) as *mut kve_stream_score_params).write_unaligned(*p);
                                pd = o.ptr.add(2) as *const _;
                            } else {
                                (o.ptr.add(2) as *mut kve_tensor).write_unaligned(v);
                                vdd = o.ptr.add(2) as *const _;
                            }
                        }
                        let snap = state.bytes();
                        st = kve_stream_scores(
                            sp,
                            state.len,
                            pd,
                            vdd,
                            gram,
                            gl,
                            forms,
                            fl_,
                            o.ptr as *mut f32,
                            o.len,
                            ws.as_mut_ptr() as *mut c_void,
                            ws.len() as u64,
                        );
                        assert!(state.bytes() == snap, "scores wrote into the state");
                        if debug() {
                            eprintln!("stream scores {st}: stat {}, fed {fed}, values {:?}, gram {gl}, forms {fl_}, out {}", p.stat, v.extent, o.len);
                        }
                        if over {
                            assert_ne!(
                                st, KVE_OK,
                                "scores over the params or the values descriptor accepted"
                            );
                            // (the harness wrote into that output itself: checked here)
                            assert!(a.bytes() == &before[..], "arena written by a refused call");
                            return;
                        }
                        if st == KVE_OK {
                            let reads = [
                                span(&v),
                                span_n(gram as _, gl, 4),
                                span_n(forms as _, fl_, 4),
                                span_n(sp, state.len, 1),
                            ];
                            for rd in reads {
                                assert!(
                                    !overlaps(span_n(o.ptr as _, olen, 4), rd),
                                    "stream scores over an input accepted"
                                );
                            }
                            if !o.in_arena {
                                let s =
                                    std::slice::from_raw_parts(o.ptr as *const f32, olen as usize);
                                assert!(s.iter().all(|x| x.is_finite()), "non-finite stream score");
                            }
                        }
                        outs.push(o);
                    }
                    1 => {
                        let hn = hq.saturating_mul(n);
                        let cap = hn.min(1 << 14) as usize;
                        let m = Out::new(&mut r, &mut a, cap);
                        let s_ = Out::new(&mut r, &mut a, cap);
                        let q2 = Out::new(&mut r, &mut a, cap);
                        let sn = Out::new(&mut r, &mut a, 2 * n.min(1 << 13) as usize);
                        let sn = Out {
                            len: sn.len / 2,
                            ..sn
                        };
                        let len = [m.len, s_.len, q2.len][r.u8() as usize % 3];
                        let snap = state.bytes();
                        st = kve_stream_stats(
                            sp,
                            state.len,
                            m.ptr as *mut f32,
                            s_.ptr as *mut f32,
                            q2.ptr as *mut f32,
                            len,
                            sn.ptr as *mut u64,
                            sn.len,
                        );
                        assert!(state.bytes() == snap, "stats wrote into the state");
                        if debug() {
                            eprintln!("stream stats {st}: fed {fed}, len {len}, seen {}", sn.len);
                        }
                        if st == KVE_OK && ![&m, &s_, &q2, &sn].iter().any(|o| o.in_arena) {
                            let seen = std::slice::from_raw_parts(sn.ptr as *const u64, n as usize);
                            assert_eq!(
                                seen.iter().sum::<u64>(),
                                fed,
                                "seen does not add up to the queries fed"
                            );
                            for o in [&m, &s_, &q2] {
                                let x =
                                    std::slice::from_raw_parts(o.ptr as *const f32, hn as usize);
                                assert!(
                                    x.iter().all(|v| v.is_finite() && *v >= 0.0),
                                    "statistic negative or non-finite"
                                );
                            }
                        }
                        outs.extend([m, s_, q2, sn]);
                    }
                    _ => {
                        let mut cnt = CANARY as u64;
                        let inside = r.chance(8);
                        let cp = if inside {
                            state.inside(&mut r, 8) as *mut u64
                        } else {
                            &mut cnt
                        };
                        let snap = state.bytes();
                        st = kve_stream_query_count(sp, state.len, cp);
                        if inside {
                            assert_ne!(st, KVE_OK, "query count over the state accepted");
                        } else if st == KVE_OK {
                            assert_eq!(cnt, fed);
                        } else {
                            assert_eq!(cnt, CANARY as u64, "count written on error");
                        }
                        assert!(state.bytes() == snap, "query count wrote into the state");
                    }
                }
            }
            12 => {
                let device = r.chance(2);
                st = evictor::evictor_calls(&mut r, &a, &mut outs, device)
            }
            13 => {
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
                    let mut dst = workspace(&mut r, if q == KVE_OK { Some(bytes) } else { None });
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
                        dst_in_arena =
                            dspan.0 >= a.base() as usize && dspan.0 < a.base() as usize + ARENA;
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
                        scratch_back(&mut a, &before, dspan);
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
                    let kept = Out::new(&mut r, &mut a, total);
                    let lens = Out::new(&mut r, &mut a, h.min(64) as usize);
                    let mut freed = CANARY as u64;
                    let fp: *mut u64 = if r.chance(40) {
                        std::ptr::null_mut()
                    } else {
                        &mut freed
                    };
                    let mut q = 0u64;
                    let qs = kve_paged_compact_workspace_size(&kl, &mut q);
                    let mut ws = workspace(&mut r, if qs == KVE_OK { Some(q) } else { None });
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
                        dst_in_arena = true; // the pool lives in the arena
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
                        scratch_back(&mut a, &before, wspan);
                    }
                    outs.extend([kept, lens]);
                }
            }
            _ => unreachable!(),
        }
    }
    let _ = kve_status_name(st);
    if st != KVE_OK {
        for o in &outs {
            assert!(o.untouched(), "output written on error (status {st})");
        }
        assert!(
            a.bytes() == &before[..],
            "arena written on error (status {st})"
        );
    } else {
        let arena_changed = a.bytes() != &before[..];
        let wrote_in_arena = dst_in_arena || outs.iter().any(|o| o.in_arena);
        assert!(
            !arena_changed || wrote_in_arena,
            "input arena modified (op {op})"
        );
    }
});
