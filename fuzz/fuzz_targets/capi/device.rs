//! The device entry points on the CPU emulator: `kve_cuda_score_layer` and
//! `kve_cuda_select_model` (ops 9 and 10).

use crate::harness::*;
use kvevict::capi::*;
use std::ffi::c_void;

/// Op 9: `kve_cuda_score_layer`, op 0 on the device (the kernels on the emulator).
pub unsafe fn score_layer(r: &mut R, a: &mut Arena, ck: &mut Checks) -> Option<i32> {
    let st;
    let (spb, mut inp) = score_call(r, a, |r| if r.chance(2) { 288 } else { 272 });
    let sp = &spb.p;
    wide_heads(r, &mut inp.queries);
    if let Some(h) = wide_heads(r, &mut inp.keys) {
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
        (inp.gram, inp.gram_len) = floats_in(r, a, want[0], true);
    }
    if r.chance(3) {
        (inp.value_forms, inp.value_forms_len) = floats_in(r, a, want[1], true);
    }
    if r.chance(3) {
        (inp.value_l1, inp.value_l1_len) = floats_in(r, a, want[2], true);
    }
    if inp.struct_size >= 288 && r.chance(3) {
        (inp.row_lse, inp.row_lse_len) = floats_in(r, a, want[3], true);
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
        return None;
    }
    let mut ws_q = 0u64;
    let q = (kve_cuda_score_workspace_size(sp, hq, hkv, n, dk, dv.max(1), &mut ws_q) == KVE_OK)
        .then_some(ws_q);
    let mut olen = 0u64;
    let ol = kve_score_output_len(sp, hkv, n, &mut olen);
    let max = if ol == KVE_OK && olen <= 1 << 18 {
        olen as usize
    } else {
        64
    };
    let o = Out::new(r, a, max);
    let ws = dev_workspace(r, a, q);
    ck.dst_in_arena = ws.in_arena;
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
        let rel = |p: *const c_void| offset_in(a, p);
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
                unchanged(a, &ck.before, *rd),
                "an input of the device call modified"
            );
        }
        assert!(
            !overlaps(writes[0], writes[1]),
            "device output over its workspace accepted"
        );
    }
    ck.outs.push(o);
    Some(st)
}

/// Op 10: `kve_cuda_select_model`, op 4 on the device.
pub unsafe fn select_model(r: &mut R, a: &mut Arena, ck: &mut Checks) -> Option<i32> {
    let st;
    let sp0 = select_params(r);
    let spb = padded(r, sp0);
    let sp = &spb.p;
    let ms = model_scores(r, a, true);
    let (layers, hkv, n, w, len) = (ms.layers, ms.hkv, ms.n, ms.window, ms.len);
    let units = layers.saturating_mul(hkv);
    let p = n - w.min(n);
    let mut wl = 0u64;
    let q = (kve_cuda_select_model_workspace_size(sp, layers, hkv, n, w, &mut wl) == KVE_OK)
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
    let sane =
        q.is_some() && units <= 1 << 14 && ld <= 1 << 16 && units.saturating_mul(ld) <= 1 << 18;
    let (cmax, imax) = if sane {
        (units as usize, (units * ld) as usize)
    } else {
        (16, 256)
    };
    let c = Out::new(r, a, cmax);
    let i = Out::new(r, a, imax);
    let ws = dev_workspace(r, a, q);
    ck.dst_in_arena = ws.in_arena;
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
        let rel = |p: *const c_void| offset_in(a, p);
        eprintln!(
            "status {st}\nparams {:?}\nscores @{} len {len} layers {layers} hkv {hkv} n {n} w {w}",
            std::slice::from_raw_parts(sp as *const _ as *const u32, 12),
            rel(ms.scores as _)
        );
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
            unchanged(a, &ck.before, sc),
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
                && kve_select_output_len(sp, layers, hkv, n, w, &mut hol, &mut hil) == KVE_OK
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
                        let dev = &i.own[u * ld as usize..u * ld as usize + c.own[u] as usize];
                        assert_eq!(
                            dev, host,
                            "unit {u}: device kept list differs from the host's"
                        );
                    }
                }
            }
        }
    }
    ck.outs.push(c);
    ck.outs.push(i);
    Some(st)
}
