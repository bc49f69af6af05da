use super::*;

/// Size queries loop over layers: a hostile layer count is refused at once, not after
/// seconds of looping (found by the fuzzer: 2^31 layers took 6.6 s in a pyramid query).
#[test]
fn layer_count_is_bounded() {
    unsafe {
        let mut p = std::mem::zeroed::<kve_select_params>();
        kve_select_params_init(
            &mut p,
            std::mem::size_of::<kve_select_params>() as u32,
            2, // pyramid
            0,
            16,
        );
        let (mut a, mut b) = (0u64, 0u64);
        let t = std::time::Instant::now();
        assert_eq!(
            kve_select_output_len(&p, (1 << 31) - 1, 1, 100, 10, &mut a, &mut b),
            KVE_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            kve_select_workspace_size(&p, (1 << 20) + 1, 1, 100, 10, &mut a),
            KVE_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            kve_select_output_len(&p, 1 << 20, 1, 100, 10, &mut a, &mut b),
            KVE_OK
        );
        assert!(t.elapsed().as_secs_f64() < 1.0);
    }
}

/// The query-stream entry points (`kve_stream_*`) with hostile sizes, NULL, misaligned or
/// short buffers, garbage states and unreleased struct sizes: the documented status, and
/// the caller's buffers untouched.
#[test]
fn stream_entry_points() {
    let (hq, hkv, n, dk) = (HQ as u64, HKV as u64, N as u64, D as u64);
    let huge = u64::MAX;
    unsafe {
        // size queries: NULL out-parameter, bad shapes; the canary survives every refusal
        expect!(
            kve_stream_state_size(hq, hkv, n, dk, null_mut()),
            KVE_ERR_NULL_POINTER
        );
        expect!(
            kve_stream_feed_workspace_size(hq, hkv, n, dk, 1, null_mut()),
            KVE_ERR_NULL_POINTER
        );
        expect!(
            kve_stream_scores_workspace_size(hq, hkv, n, dk, null_mut()),
            KVE_ERR_NULL_POINTER
        );
        let shapes = [
            ([0, hkv, n, dk], KVE_ERR_INVALID_ARGUMENT),
            ([hq, 0, n, dk], KVE_ERR_INVALID_ARGUMENT),
            ([hq, hkv, 0, dk], KVE_ERR_INVALID_ARGUMENT),
            ([hq, hkv, n, 0], KVE_ERR_INVALID_ARGUMENT),
            ([hq, 3, n, dk], KVE_ERR_SHAPE_MISMATCH),
            ([hq, hkv, n, 1025], KVE_ERR_INVALID_ARGUMENT),
            ([KVE_MAX_HEADS + 1, 1, n, dk], KVE_ERR_INVALID_ARGUMENT),
            ([hq, huge, n, dk], KVE_ERR_INVALID_ARGUMENT),
            ([hq, hkv, (1 << 31) + 1, dk], KVE_ERR_INVALID_ARGUMENT),
            ([hq, hkv, huge, dk], KVE_ERR_INVALID_ARGUMENT),
        ];
        for ([a, b, c, d], want) in shapes {
            let mut out = CANARY as u64;
            expect!(kve_stream_state_size(a, b, c, d, &mut out), want);
            expect!(kve_stream_scores_workspace_size(a, b, c, d, &mut out), want);
            expect!(
                kve_stream_feed_workspace_size(a, b, c, d, 4, &mut out),
                want
            );
            assert_eq!(out, CANARY as u64, "shape {:?}: written", [a, b, c, d]);
        }
        for chunk in [0, (1 << 31) + 1, huge] {
            let mut out = CANARY as u64;
            expect!(
                kve_stream_feed_workspace_size(hq, hkv, n, dk, chunk, &mut out),
                KVE_ERR_INVALID_ARGUMENT
            );
            assert_eq!(out, CANARY as u64);
        }
        // the largest shape sizes without overflow: N = 2^31, every head
        let mut out = 0u64;
        expect!(
            kve_stream_state_size(KVE_MAX_HEADS, 1, 1 << 31, 1024, &mut out),
            KVE_OK
        );
        assert!(out > (KVE_MAX_HEADS << 31) * 12);

        // init: NULL, short, misaligned; nothing written
        let mut bytes = 0u64;
        expect!(kve_stream_state_size(hq, hkv, n, dk, &mut bytes), KVE_OK);
        let mut mem = vec![CANARY as u64; bytes as usize / 8 + 1];
        let p = mem.as_mut_ptr() as *mut u8;
        let init = |s: *mut u8, b: u64| kve_stream_init(s as *mut c_void, b, hq, hkv, n, dk);
        expect!(init(null_mut(), bytes), KVE_ERR_NULL_POINTER);
        expect!(init(p, bytes - 8), KVE_ERR_INVALID_ARGUMENT); // one rule for state_bytes
        expect!(init(p.add(4), bytes), KVE_ERR_MISALIGNED);
        expect!(init(p, huge), KVE_ERR_OVERFLOW);
        expect!(
            kve_stream_init(p as *mut c_void, bytes, hq, 3, n, dk),
            KVE_ERR_SHAPE_MISMATCH
        );
        assert!(
            mem.iter().all(|&x| x == CANARY as u64),
            "state written on error"
        );

        // a garbage state (never started), or a started one cut short: refused everywhere
        let mut cnt = CANARY as u64;
        let sp = p as *const c_void;
        expect!(
            kve_stream_query_count(sp, bytes, &mut cnt),
            KVE_ERR_INVALID_ARGUMENT
        );
        expect!(
            kve_stream_query_count(sp, bytes, null_mut()),
            KVE_ERR_NULL_POINTER
        );
        let hn = HQ * N;
        let mut stats = canary_f32(3 * hn);
        let mut seen = vec![CANARY as u64; N];
        let sf = stats.as_mut_ptr();
        let st = |s: *const c_void, b: u64, len: u64, sl: u64, seen: *mut u64| {
            kve_stream_stats(s, b, sf, sf.add(hn), sf.add(2 * hn), len, seen, sl)
        };
        expect!(
            st(sp, bytes, hn as u64, n, seen.as_mut_ptr()),
            KVE_ERR_INVALID_ARGUMENT
        );
        expect!(init(p, bytes), KVE_OK);
        expect!(
            kve_stream_query_count(sp, bytes - 8, &mut cnt),
            KVE_ERR_INVALID_ARGUMENT
        );
        expect!(kve_stream_query_count(sp, bytes, &mut cnt), KVE_OK);
        assert_eq!(cnt, 0);
        cnt = CANARY as u64;
        expect!(
            st(sp, bytes - 8, hn as u64, n, seen.as_mut_ptr()),
            KVE_ERR_INVALID_ARGUMENT
        );
        expect!(
            st(sp, bytes, hn as u64, n, null_mut()),
            KVE_ERR_NULL_POINTER
        );
        expect!(st(sp, bytes, huge, n, seen.as_mut_ptr()), KVE_ERR_OVERFLOW);
        expect!(
            st(sp, bytes, hn as u64, n - 1, seen.as_mut_ptr()),
            KVE_ERR_OUTPUT_TOO_SMALL
        );
        expect!(
            st(
                (p as *const u8).add(4) as *const c_void,
                bytes,
                hn as u64,
                n,
                seen.as_mut_ptr()
            ),
            KVE_ERR_MISALIGNED
        );
        assert!(untouched_f32(&stats) && seen.iter().all(|&x| x == CANARY as u64));
        assert_eq!(cnt, CANARY as u64);

        // stream params: unreleased struct sizes are refused, reading or writing
        #[repr(C)]
        struct Bigger {
            p: kve_stream_score_params,
            extra: [u32; 4],
        }
        let mut big = Bigger {
            p: std::mem::zeroed(),
            extra: [CANARY; 4],
        };
        let size = std::mem::size_of::<kve_stream_score_params>() as u32;
        for bad in [0, 4, size - 4, size + 4, 4100, u32::MAX] {
            expect!(
                kve_stream_score_params_init(&mut big.p, bad),
                KVE_ERR_INVALID_ARGUMENT
            );
            assert_eq!(big.p.struct_size, 0);
            assert_eq!(big.extra, [CANARY; 4]);
        }
        expect!(
            kve_stream_score_params_init(null_mut(), size),
            KVE_ERR_NULL_POINTER
        );
        expect!(kve_stream_score_params_init(&mut big.p, size), KVE_OK);
        let mut swb = 0u64;
        expect!(
            kve_stream_scores_workspace_size(hq, hkv, n, dk, &mut swb),
            KVE_OK
        );
        let mut ws = vec![0u64; swb as usize / 8 + 1];
        let wsp = ws.as_mut_ptr() as *mut c_void;
        let mut out = canary_f32(HKV * N);
        let scores = |pp: *const kve_stream_score_params, o: *mut f32, ol: u64| {
            kve_stream_scores(sp, bytes, pp, null(), null(), 0, null(), 0, o, ol, wsp, swb)
        };
        for bad in [0, size - 4, size + 4, u32::MAX] {
            big.p.struct_size = bad;
            expect!(
                scores(&big.p, out.as_mut_ptr(), out.len() as u64),
                KVE_ERR_INVALID_ARGUMENT
            );
        }
        big.p.struct_size = size;
        expect!(
            scores(null(), out.as_mut_ptr(), out.len() as u64),
            KVE_ERR_NULL_POINTER
        );
        expect!(
            scores(&big.p, null_mut(), out.len() as u64),
            KVE_ERR_NULL_POINTER
        );
        expect!(scores(&big.p, out.as_mut_ptr(), huge), KVE_ERR_OVERFLOW);
        expect!(
            scores(&big.p, (out.as_mut_ptr() as *mut u8).add(2) as *mut f32, 8),
            KVE_ERR_MISALIGNED
        );
        assert!(untouched_f32(&out), "scores written on error");
        // and the call that was refused succeeds with the arguments repaired
        expect!(scores(&big.p, out.as_mut_ptr(), out.len() as u64), KVE_OK);
    }
}
