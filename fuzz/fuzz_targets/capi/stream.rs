//! The query stream (`kve_stream_*`): size, start, chunks, then scores, raw statistics
//! or the count (op 11).

use crate::harness::*;
use kvevict::capi::*;
use std::ffi::c_void;

/// Op 11: the query stream (`kve_stream_*`) start to finish.
pub unsafe fn stream(r: &mut R, a: &mut Arena, ck: &mut Checks) -> Option<i32> {
    let st;
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
        return None;
    }
    let mut state = State::new(r, bytes);
    let s0 = state.bytes();
    let ist = kve_stream_init(state.ptr as *mut c_void, state.len, hq, hkv, n, dk);
    if ist != KVE_OK {
        assert!(state.bytes() == s0, "state written by a refused init");
        return None;
    }
    let mut fed = 0u64;
    let mut last = 0i64;
    for _ in 0..1 + r.u8() % 3 {
        let c = if r.chance(16) {
            r.size(8)
        } else {
            1 + r.u8() as u64 % 8
        };
        let mut q = tensor(r, a, [8, 8, 32]);
        fit(r, a, &mut q, [hq, c, dk]);
        let mut k = tensor(r, a, [4, 96, 32]);
        fit(r, a, &mut k, [hkv, n, dk]);
        if elems(&q).saturating_mul(n) > 1 << 20 || elems(&k) > 1 << 16 || c > 1 << 12 {
            return None;
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
        let qsz =
            (kve_stream_feed_workspace_size(hq, hkv, n, dk, c, &mut wq) == KVE_OK).then_some(wq);
        let mut ws = workspace(r, qsz);
        let (mut wsp, mut wsl) = (ws.as_mut_ptr(), ws.len() as u64);
        // arguments placed over the state or the workspace: never accepted
        let mut placed = false;
        let (mut qd, mut kd, mut pp): (*const kve_tensor, *const kve_tensor, *const i64) =
            (&q, &k, pos.as_ptr());
        match r.u8() % 24 {
            0 => {
                let p = state.inside(r, TD) as *mut kve_tensor;
                p.write(q);
                (qd, placed) = (p, true);
            }
            1 => {
                let p = state.inside(r, TD) as *mut kve_tensor;
                p.write(k);
                (kd, placed) = (p, true);
            }
            2 if !pos.is_empty() && pos.len() as u64 * 8 + 16 <= state.len => {
                let p = state.inside(r, pos.len() * 8) as *mut i64;
                std::ptr::copy_nonoverlapping(pos.as_ptr(), p, pos.len());
                (pp, placed) = (p, true);
            }
            3 if ws.len() >= TD => {
                (ws.as_mut_ptr() as *mut kve_tensor).write_unaligned(q);
                (qd, placed) = (ws.as_ptr() as *const kve_tensor, true);
            }
            4 => {
                let p = state.inside(r, 8);
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
            assert!(
                a.bytes() == &ck.before[..],
                "arena written by a refused feed"
            );
            if placed || r.chance(2) {
                return None;
            }
            continue;
        }
        // what the feed read stays as it was, and the state counts the chunk
        assert!(a.bytes() == &ck.before[..], "feed wrote into its inputs");
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
            let p0 = stream_params(r);
            let pb = padded(r, p0);
            let p = &pb.p;
            let mut v = kve_tensor::NONE;
            if r.chance(2) {
                v = tensor(r, a, [4, 96, 32]);
                let dv = if r.chance(2) { dk } else { v.extent[2] };
                fit(r, a, &mut v, [hkv, n, dv]);
            }
            if elems(&v) > 1 << 16 {
                return None;
            }
            let g = if hkv > 0 { hq / hkv } else { 1 };
            let dv = v.extent[2];
            let want = [
                hkv.saturating_mul(g).saturating_mul(dv.saturating_mul(dv)),
                hkv.saturating_mul(g).saturating_mul(n),
            ];
            let fl = |r: &mut R, want: u64| match r.chance(3) {
                true => floats_in(r, a, want, false),
                false => (std::ptr::null::<f32>(), 0u64),
            };
            let (gram, gl) = fl(r, want[0]);
            let (forms, fl_) = fl(r, want[1]);
            if gl.saturating_mul(n) > 1 << 22 {
                return None;
            }
            let vd: *const kve_tensor = if v.data.is_null() && r.chance(2) {
                std::ptr::null()
            } else {
                &v
            };
            let olen = hkv.saturating_mul(n);
            let o = Out::new(r, a, olen.min(1 << 14) as usize);
            let mut wq = 0u64;
            let qsz =
                (kve_stream_scores_workspace_size(hq, hkv, n, dk, &mut wq) == KVE_OK).then_some(wq);
            let mut ws = workspace(r, qsz);
            // the params or the values descriptor inside the output: refused
            let over =
                !o.in_arena && !o.ptr.is_null() && o.len as usize >= 2 + TD / 4 && r.chance(16);
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
                assert!(
                    a.bytes() == &ck.before[..],
                    "arena written by a refused call"
                );
                return None;
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
                    let s = std::slice::from_raw_parts(o.ptr as *const f32, olen as usize);
                    assert!(s.iter().all(|x| x.is_finite()), "non-finite stream score");
                }
            }
            ck.outs.push(o);
        }
        1 => {
            let hn = hq.saturating_mul(n);
            let cap = hn.min(1 << 14) as usize;
            let m = Out::new(r, a, cap);
            let s_ = Out::new(r, a, cap);
            let q2 = Out::new(r, a, cap);
            let sn = Out::new(r, a, 2 * n.min(1 << 13) as usize);
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
                    let x = std::slice::from_raw_parts(o.ptr as *const f32, hn as usize);
                    assert!(
                        x.iter().all(|v| v.is_finite() && *v >= 0.0),
                        "statistic negative or non-finite"
                    );
                }
            }
            ck.outs.extend([m, s_, q2, sn]);
        }
        _ => {
            let mut cnt = CANARY as u64;
            let inside = r.chance(8);
            let cp = if inside {
                state.inside(r, 8) as *mut u64
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
    Some(st)
}
