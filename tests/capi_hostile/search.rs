use super::*;

/// A search started for 2 layers (global allocator, head granularity, budget 5) and
/// the scores of both.
fn two_layer_search() -> (kve_select_params, kve_search, Vec<f32>) {
    let sel = select_params(4, 0, 5);
    let mut s = unsafe { std::mem::zeroed::<kve_search>() };
    unsafe {
        assert_eq!(
            kve_search_init(&mut s, &sel, 2, HKV as u64, N as u64, W as u64),
            KVE_OK
        )
    };
    (sel, s, data(2 * HKV * P, 9))
}

fn two_layers(scores: &[f32]) -> kve_model_scores {
    kve_model_scores::of(scores, 2, HKV as u64, N as u64, W as u64)
}

#[test]
fn search_state_from_garbage() {
    let (sel, good, scores) = two_layer_search();
    let mut s = good;
    // a histogram counted for this round over both layers, then saturated by hand
    let ms = two_layers(&scores);
    let mut h = unsafe { std::mem::zeroed::<kve_histogram>() };
    let mut ws = vec![0u8; 1 << 16];
    unsafe {
        expect!(
            kve_search_count_shard(
                &sel,
                &ms,
                0,
                &good,
                &mut h,
                ws.as_mut_ptr() as *mut c_void,
                ws.len() as u64
            ),
            KVE_OK
        )
    };
    h.bins = [u64::MAX; 256];
    for f in [
        (|s: &mut kve_search| s.done = 7) as fn(&mut kve_search),
        |s| s.bits = 3,
        |s| s.bits = 200,
        |s| s.need = 0,
        |s| s.prefix_lo = 1, // digits without bits
    ] {
        let mut bad = good;
        f(&mut bad);
        let copy = bad;
        let mut done = -5;
        unsafe {
            expect!(
                kve_search_step(&mut bad, &h, &mut done),
                KVE_ERR_INVALID_ARGUMENT
            )
        };
        assert_eq!((bad, done), (copy, -5));
    }
    // saturated counts do not overflow
    let mut s2 = good;
    let mut done = 0;
    unsafe { expect!(kve_search_step(&mut s2, &h, &mut done), KVE_OK) };
    let mut f = 0f32;
    unsafe {
        expect!(
            kve_search_threshold(&good, &mut f),
            KVE_ERR_INVALID_ARGUMENT
        )
    };
    // sharding is for the global allocator only
    let uni = select_params(0, 0, 5);
    unsafe {
        expect!(
            kve_search_init(&mut s, &uni, 2, HKV as u64, N as u64, W as u64),
            KVE_ERR_INVALID_ARGUMENT
        )
    };
    let mut m = unsafe { std::mem::zeroed::<kve_histogram>() };
    m.bins = [u64::MAX - 1; 256];
    unsafe { expect!(kve_histogram_merge(&mut m, &h), KVE_OK) };
    assert!(m.bins.iter().all(|&b| b == u64::MAX));
}

/// Issue 26: a state forged after `kve_search_init` (budget 5 over 2 layers: `need` 20 of
/// 64 candidates) is refused by every call that takes it, nothing written; before the fix
/// `need = UINT64_MAX` passed and the selection kept every position.
#[test]
fn forged_search_states_are_refused() {
    let (sel, good, scores) = two_layer_search();
    assert_eq!((good.need, good.done), (2 * HKV as u64 * 5, 0));
    let ms = two_layers(&scores);
    let mut ws = vec![0u8; 1 << 16];
    let (wp, wl) = (ws.as_mut_ptr() as *mut c_void, ws.len() as u64);
    let mut h = unsafe { std::mem::zeroed::<kve_histogram>() };
    unsafe {
        expect!(
            kve_search_count_shard(&sel, &ms, 0, &good, &mut h, wp, wl),
            KVE_OK
        )
    };
    // one honest step: a state with a settled digit
    let mut stepped = good;
    let mut done = 0;
    unsafe { expect!(kve_search_step(&mut stepped, &h, &mut done), KVE_OK) };
    assert_eq!((done, stepped.bits), (0, 8));
    let forged: [(kve_search, fn(&mut kve_search)); 7] = [
        (good, |s| s.need = u64::MAX),
        (good, |s| s.need = 2 * HKV as u64 * P as u64), // every candidate, still running
        (good, |s| s.need -= 1),
        (good, |s| s.done = 1), // done before any step: keeps all
        (stepped, |s| s.need = u64::MAX),
        (stepped, |s| s.threshold_hi = 1), // a threshold while running
        (stepped, |s| {
            s.done = 1;
            s.threshold_lo = 12345; // not the settled digits'
        }),
    ];
    for (i, (base, f)) in forged.into_iter().enumerate() {
        let mut bad = base;
        f(&mut bad);
        let mut h2 = unsafe { std::mem::zeroed::<kve_histogram>() };
        unsafe {
            expect!(
                kve_search_count_shard(&sel, &ms, 0, &bad, &mut h2, wp, wl),
                KVE_ERR_INVALID_ARGUMENT
            );
        }
        assert_eq!(
            h2,
            unsafe { std::mem::zeroed::<kve_histogram>() },
            "case {i}"
        );
        let (copy, mut d) = (bad, -5);
        unsafe {
            expect!(
                kve_search_step(&mut bad, &h, &mut d),
                KVE_ERR_INVALID_ARGUMENT
            )
        };
        assert_eq!((bad, d), (copy, -5), "case {i}");
        let mut thr = 7f32;
        unsafe {
            expect!(
                kve_search_threshold(&bad, &mut thr),
                KVE_ERR_INVALID_ARGUMENT
            )
        };
        assert_eq!(thr, 7.0, "case {i}");
        let mut off = vec![CANARY as u64; 2 * HKV + 1];
        let mut idx = vec![CANARY; 2 * HKV * N];
        unsafe {
            expect!(
                select_shard(&sel, (&ms, 0), &bad, &mut off, &mut idx, (wp, wl)),
                KVE_ERR_INVALID_ARGUMENT
            );
        }
        assert!(off.iter().all(|&x| x == CANARY as u64) && idx.iter().all(|&x| x == CANARY));
    }
}

#[test]
fn sharded_search_through_the_c_api_matches_select_model() {
    let layers = 4;
    let scores: Vec<f32> = data(layers * HKV * P, 11)
        .iter()
        .map(|x| (x * 4.0).round().abs())
        .collect();
    let mut sel = select_params(4, 0, 6);
    sel.post_pool_kind = 3;
    sel.post_pool_kernel = 3;
    sel.post_pool_decay = 0.5;
    let (st, off, idx) = select(&sel, &scores, layers, N, W);
    expect!(st, KVE_OK);
    let shards = [(0usize, 1usize), (1, 3)];
    let mut s = unsafe { std::mem::zeroed::<kve_search>() };
    unsafe {
        assert_eq!(
            kve_search_init(&mut s, &sel, layers as u64, HKV as u64, N as u64, W as u64),
            KVE_OK
        )
    };
    let mut rounds = 0;
    let mut done = 0;
    while done == 0 {
        let mut total = unsafe { std::mem::zeroed::<kve_histogram>() };
        for &(l0, ln) in &shards {
            let part = &scores[l0 * HKV * P..(l0 + ln) * HKV * P];
            let ms = kve_model_scores::of(&part, ln as u64, HKV as u64, N as u64, W as u64);
            let mut wsb = 0u64;
            let mut h = unsafe { std::mem::zeroed::<kve_histogram>() };
            unsafe {
                assert_eq!(
                    kve_select_shard_workspace_size(
                        &sel, ln as u64, HKV as u64, N as u64, W as u64, &mut wsb
                    ),
                    KVE_OK
                );
                let mut ws = vec![0u8; wsb as usize];
                assert_eq!(kve_histogram_clear(&mut h), KVE_OK);
                assert_eq!(
                    kve_search_count_shard(
                        &sel,
                        &ms,
                        l0 as u64,
                        &s,
                        &mut h,
                        ws.as_mut_ptr() as _,
                        wsb
                    ),
                    KVE_OK
                );
                assert_eq!(kve_histogram_merge(&mut total, &h), KVE_OK);
            }
        }
        unsafe { assert_eq!(kve_search_step(&mut s, &total, &mut done), KVE_OK) };
        rounds += 1;
        assert!(rounds <= 13);
    }
    let mut thr = 0f32;
    unsafe { assert_eq!(kve_search_threshold(&s, &mut thr), KVE_OK) };
    assert!(thr.is_finite());
    for &(l0, ln) in &shards {
        let part = &scores[l0 * HKV * P..(l0 + ln) * HKV * P];
        let ms = kve_model_scores::of(&part, ln as u64, HKV as u64, N as u64, W as u64);
        let (mut ol, mut il, mut wsb) = (0u64, 0u64, 0u64);
        unsafe {
            assert_eq!(
                kve_select_shard_output_len(ln as u64, HKV as u64, N as u64, &mut ol, &mut il),
                KVE_OK
            );
            assert_eq!(
                kve_select_shard_workspace_size(
                    &sel, ln as u64, HKV as u64, N as u64, W as u64, &mut wsb
                ),
                KVE_OK
            );
        }
        let mut o2 = vec![0u64; ol as usize];
        let mut i2 = vec![0u32; il as usize];
        let mut ws = vec![0u8; wsb as usize];
        unsafe {
            assert_eq!(
                select_shard(
                    &sel,
                    (&ms, l0),
                    &s,
                    &mut o2,
                    &mut i2,
                    (ws.as_mut_ptr() as _, wsb)
                ),
                KVE_OK
            );
        }
        for u in 0..ln * HKV {
            let g = l0 * HKV + u;
            assert_eq!(
                &i2[o2[u] as usize..o2[u + 1] as usize],
                &idx[off[g] as usize..off[g + 1] as usize]
            );
        }
    }
}
