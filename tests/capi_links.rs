//! Value links through the C entry points: `kve_accumulate_value_links` against an f64
//! computation on a transposed (strided) V, `kve_select_model_linked` against the core,
//! and the contract (status, nothing written on error) for both.

use kvevict::capi::*;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

#[macro_use]
mod capi_common;
use capi_common::*;

fn links_ws(n: usize, dv: usize) -> Vec<u8> {
    let mut b = 0u64;
    assert_eq!(
        unsafe { kve_value_links_workspace_size(n as u64, dv as u64, &mut b) },
        KVE_OK
    );
    vec![0u8; b as usize]
}

fn accumulate(t: &kve_tensor, links: &mut [f32], ws: &mut [u8]) -> i32 {
    // SAFETY: a host tensor and buffers of the lengths passed.
    into_out(links, ws, |l, len, w, bytes| unsafe {
        kve_accumulate_value_links(t, l, len, w, bytes)
    })
}

/// Two layers of V stored transposed (`[Hkv][dv][N]`, llama.cpp without flash attention):
/// the sums equal `Σ_l Σ_h cos(v_i, v_{i-1})` in f64; a zero vector links nothing.
#[test]
fn value_links_sum_cosines_over_layers_and_heads() {
    let (hkv, n, dv) = (HKV, N, D);
    let layers: Vec<Vec<f32>> = (0..2).map(|l| data(hkv * dv * n, 40 + l)).collect();
    let mut layers = layers;
    for h in 0..hkv {
        for c in 0..dv {
            layers[0][(h * dv + c) * n + 7] = 0.0; // token 7 of layer 0 is a zero vector
        }
    }
    let mut links = vec![0f32; n];
    let mut ws = links_ws(n, dv);
    for v in &layers {
        // element (h, t, c) at h*dv*n + c*n + t
        let t = tensor(v.as_ptr(), v.len(), [hkv, n, dv], [dv * n, 1, n]);
        expect!(accumulate(&t, &mut links, &mut ws), KVE_OK);
    }
    assert_eq!(links[0], 0.0);
    for i in 1..n {
        let mut want = 0f64;
        for (l, v) in layers.iter().enumerate() {
            for h in 0..hkv {
                let at = |t: usize, c: usize| v[(h * dv + c) * n + t] as f64;
                let dot: f64 = (0..dv).map(|c| at(i, c) * at(i - 1, c)).sum();
                let a: f64 = (0..dv).map(|c| at(i, c) * at(i, c)).sum();
                let b: f64 = (0..dv).map(|c| at(i - 1, c) * at(i - 1, c)).sum();
                if l == 0 && (i == 7 || i == 8) {
                    assert!(a == 0.0 || b == 0.0);
                    continue;
                }
                want += dot / (a * b).sqrt();
            }
        }
        assert!(
            (links[i] as f64 - want).abs() < 1e-5,
            "{i}: {} vs {want}",
            links[i]
        );
    }
}

#[test]
fn value_links_refuse_bad_input_and_write_nothing() {
    let (n, dv) = (N, D);
    let v = data(HKV * n * dv, 3);
    let t = contiguous(&v, [HKV, n, dv]);
    let mut ws = links_ws(n, dv);
    let mut links = canary_f32(n);
    unsafe {
        expect!(
            kve_accumulate_value_links(
                null(),
                links.as_mut_ptr(),
                n as u64,
                ws.as_mut_ptr() as *mut c_void,
                ws.len() as u64
            ),
            KVE_ERR_NULL_POINTER
        );
        expect!(
            kve_accumulate_value_links(
                &t,
                null_mut(),
                n as u64,
                ws.as_mut_ptr() as *mut c_void,
                ws.len() as u64
            ),
            KVE_ERR_NULL_POINTER
        );
    }
    assert!(untouched_f32(&links));
    expect!(
        accumulate(&t, &mut links[..n - 1], &mut ws),
        KVE_ERR_OUTPUT_TOO_SMALL
    );
    let mut small = vec![0u8; ws.len() - 1];
    expect!(
        accumulate(&t, &mut links, &mut small),
        KVE_ERR_WORKSPACE_TOO_SMALL
    );
    let mut bad = v.clone();
    bad[HKV * n * dv - 1] = f32::NAN;
    let tb = contiguous(&bad, [HKV, n, dv]);
    expect!(accumulate(&tb, &mut links, &mut ws), KVE_ERR_NON_FINITE);
    assert!(untouched_f32(&links));
    // finite values whose squared norm overflows f32, token-major and transposed
    let huge = vec![1e20f32; HKV * n * dv];
    for t in [
        contiguous(&huge, [HKV, n, dv]),
        tensor(huge.as_ptr(), huge.len(), [HKV, n, dv], [dv * n, 1, n]),
    ] {
        expect!(accumulate(&t, &mut links, &mut ws), KVE_ERR_NON_FINITE);
        assert!(untouched_f32(&links));
    }
    // a non-finite running sum is refused too (it would stay non-finite)
    let mut sums = vec![0f32; n];
    sums[3] = f32::INFINITY;
    expect!(accumulate(&t, &mut sums, &mut ws), KVE_ERR_NON_FINITE);
    assert!(sums
        .iter()
        .enumerate()
        .all(|(i, &x)| x == if i == 3 { f32::INFINITY } else { 0.0 }));
    // links over the values
    let mut vv = v.clone();
    let tv = contiguous(&vv, [HKV, n, dv]);
    let st = unsafe {
        kve_accumulate_value_links(
            &tv,
            vv.as_mut_ptr(),
            n as u64,
            ws.as_mut_ptr() as *mut c_void,
            ws.len() as u64,
        )
    };
    expect!(st, KVE_ERR_ALIASING);
    assert_eq!(vv, v);
}

/// The linked selection of `scores` (N tokens, window W); empty `links` passes NULL for n.
fn linked(
    sel: &kve_select_params,
    scores: &[f32],
    layers: usize,
    links: &[f32],
    threshold: f32,
) -> (i32, Vec<u64>, Vec<u32>) {
    let l = if links.is_empty() {
        (null(), N as u64, threshold)
    } else {
        (links.as_ptr(), links.len() as u64, threshold)
    };
    select_linked(sel, scores, layers, N, W, Some(l))
}

fn laprox_span(budget: u64) -> kve_select_params {
    // SAFETY: a writable struct of the size passed.
    init_struct(|p, size| unsafe { kve_select_params_init_laprox_span(p, size, budget) })
}

/// A cue whose 12 unread followers are linked: the flat 9-token continuation stops 3 short,
/// the linked one keeps them all; the C call gives the core's lists.
#[test]
fn linked_selection_keeps_a_run_longer_than_the_kernel() {
    let layers = 2;
    let mut one = vec![0.01f32; P];
    one[5] = 1.0; // the cue
    let scores: Vec<f32> = (0..layers * HKV).flat_map(|_| one.clone()).collect();
    let count = (layers * HKV) as f32;
    let mut links = vec![0.2 * count; N];
    for l in &mut links[9..=17] {
        *l = 0.8 * count; // 9..=17 continue their predecessors: the run 8..=17
    }
    let sel = laprox_span(13);
    let (st, off, idx) = linked(&sel, &scores, layers, &links, 0.5);
    expect!(st, KVE_OK);
    let head: Vec<u32> = idx[off[0] as usize..off[1] as usize].to_vec();
    let want: Vec<u32> = (5..=17).chain(P as u32..N as u32).collect();
    assert_eq!(head, want);
    // without links the continuation ends at 5 + 8, and the budget goes elsewhere
    let (st, off, idx) = select(&sel, &scores, layers, N, W);
    expect!(st, KVE_OK);
    assert!(!idx[off[0] as usize..off[1] as usize].contains(&17));
    // the same as the core
    let vl = kvevict::ValueLinks {
        sums: &links,
        threshold: 0.5,
    };
    let ms = kvevict::ModelScores {
        scores: &scores,
        layers,
        hkv: HKV,
        n: N,
        window: W,
    };
    let cfg = kvevict::SelectConfig::laprox_span(13);
    let (no, ni) = kvevict::select_output_len(&cfg, layers, HKV, N, W).unwrap();
    let (mut o2, mut i2) = (vec![0u64; no], vec![0u32; ni]);
    let mut ws = vec![0u8; kvevict::select_workspace_size(&cfg, layers, HKV, N, W).unwrap()];
    kvevict::select_model_linked(&cfg, &ms, vl, &mut o2, &mut i2, &mut ws).unwrap();
    let (_, off, idx) = linked(&sel, &scores, layers, &links, 0.5);
    assert_eq!(off, o2);
    assert_eq!(
        idx[..off[layers * HKV] as usize],
        i2[..o2[layers * HKV] as usize]
    );
}

#[test]
fn linked_selection_refuses_bad_input_and_writes_nothing() {
    let layers = 2;
    let scores = data(layers * HKV * P, 9);
    let links = vec![0f32; N];
    let sel = laprox_span(5);
    let untouched = |off: &[u64], idx: &[u32]| {
        off.iter().all(|&x| x == CANARY as u64) && idx.iter().all(|&x| x == CANARY)
    };
    let mut nan = links.clone();
    nan[4] = f32::NAN;
    let mut avg = sel;
    avg.post_pool_kind = 1; // KVE_POOL_AVG
    avg.post_pool_kernel = 3;
    let mut decayed = sel;
    decayed.post_pool_decay = 0.9;
    let cases: [(&kve_select_params, &[f32], f32, i32); 6] = [
        (&sel, &links[..N - 1], 0.5, KVE_ERR_SHAPE_MISMATCH),
        (&sel, &[], 0.5, KVE_ERR_NULL_POINTER), // NULL links of n floats
        (&sel, &nan, 0.5, KVE_ERR_NON_FINITE),
        (&sel, &links, f32::NAN, KVE_ERR_INVALID_ARGUMENT),
        (&avg, &links, 0.5, KVE_ERR_INVALID_ARGUMENT),
        (&decayed, &links, 0.5, KVE_ERR_INVALID_ARGUMENT),
    ];
    for (i, (p, l, thr, want)) in cases.into_iter().enumerate() {
        let (st, off, idx) = linked(p, &scores, layers, l, thr);
        assert_eq!(name(st), name(want), "case {i}");
        assert!(untouched(&off, &idx), "case {i}");
    }
}

/// `kve_search_count_shard_linked` / `kve_select_shard_linked` over `shards` (first layer,
/// layers): the status of the first refused call, else the lists of every shard in order.
fn sharded_linked(
    sel: &kve_select_params,
    scores: &[f32],
    layers: usize,
    shards: &[(usize, usize)],
    links: (*const f32, u64, f32),
) -> Result<Vec<u32>, i32> {
    let (l, len, thr) = links;
    let part = |l0: usize, ln: usize| kve_model_scores {
        scores: scores[l0 * HKV * P..(l0 + ln) * HKV * P].as_ptr(),
        len: (ln * HKV * P) as u64,
        layers: ln as u64,
        hkv: HKV as u64,
        n: N as u64,
        window: W as u64,
    };
    let ws_for = |ln: usize| {
        let (l, h, n, w) = (ln as u64, HKV as u64, N as u64, W as u64);
        // SAFETY: a host out-parameter.
        workspace(|b| unsafe { kve_select_shard_workspace_size(sel, l, h, n, w, b) })
    };
    let mut s = unsafe { std::mem::zeroed::<kve_search>() };
    let st = unsafe { kve_search_init(&mut s, sel, layers as u64, HKV as u64, N as u64, W as u64) };
    assert_eq!(st, KVE_OK);
    let mut done = 0;
    while done == 0 {
        let mut total = unsafe { std::mem::zeroed::<kve_histogram>() };
        for &(l0, ln) in shards {
            let (ms, mut ws) = (part(l0, ln), ws_for(ln));
            let mut h = unsafe { std::mem::zeroed::<kve_histogram>() };
            let st = unsafe {
                kve_search_count_shard_linked(
                    sel,
                    &ms,
                    l0 as u64,
                    &s,
                    l,
                    len,
                    thr,
                    &mut h,
                    ws.as_mut_ptr() as *mut c_void,
                    ws.len() as u64,
                )
            };
            if st != KVE_OK {
                assert_eq!(h, unsafe { std::mem::zeroed::<kve_histogram>() });
                return Err(st);
            }
            assert_eq!(unsafe { kve_histogram_merge(&mut total, &h) }, KVE_OK);
        }
        assert_eq!(
            unsafe { kve_search_step(&mut s, &total, &mut done) },
            KVE_OK
        );
    }
    let mut got = Vec::new();
    for &(l0, ln) in shards {
        let (ms, mut ws) = (part(l0, ln), ws_for(ln));
        let (mut ol, mut il) = (0u64, 0u64);
        let st = unsafe {
            kve_select_shard_output_len(ln as u64, HKV as u64, N as u64, &mut ol, &mut il)
        };
        assert_eq!(st, KVE_OK);
        let (mut o, mut i) = (vec![CANARY as u64; ol as usize], vec![CANARY; il as usize]);
        let st = unsafe {
            kve_select_shard_linked(
                sel,
                &ms,
                l0 as u64,
                &s,
                l,
                len,
                thr,
                o.as_mut_ptr(),
                ol,
                i.as_mut_ptr(),
                il,
                ws.as_mut_ptr() as *mut c_void,
                ws.len() as u64,
            )
        };
        if st != KVE_OK {
            assert!(o.iter().all(|&x| x == CANARY as u64) && i.iter().all(|&x| x == CANARY));
            return Err(st);
        }
        got.extend_from_slice(&i[..o[ln * HKV] as usize]);
    }
    Ok(got)
}

/// The sharded linked selection through the C API equals `kve_select_model_linked` with
/// one shard, two and three; the links' rules and statuses are the model call's.
#[test]
fn sharded_linked_selection_equals_the_model_call() {
    let layers = 4;
    let scores = data(layers * HKV * P, 17);
    let count = (layers * HKV) as f32;
    // runs of linked positions: mean 0.8 inside, 0.2 at their starts
    let links: Vec<f32> = (0..N)
        .map(|i| count * if i % 6 == 0 { 0.2 } else { 0.8 })
        .collect();
    let mut sel = select_params(GLOBAL, HEAD, 3);
    sel.post_pool_kind = 3; // forward
    sel.post_pool_kernel = 2;
    sel.post_pool_decay = 1.0;
    let l = (links.as_ptr(), N as u64, 0.5);
    let (st, off, idx) = linked(&sel, &scores, layers, &links, 0.5);
    expect!(st, KVE_OK);
    let want = &idx[..off[layers * HKV] as usize];
    for shards in [
        vec![(0, 4)],
        vec![(0, 3), (3, 1)],
        vec![(0, 1), (1, 2), (3, 1)],
    ] {
        let got = sharded_linked(&sel, &scores, layers, &shards, l).unwrap();
        assert_eq!(got, want, "{shards:?}");
    }
    // the links matter: without them the lists differ
    let (_, o2, i2) = select(&sel, &scores, layers, N, W);
    assert_ne!(&i2[..o2[layers * HKV] as usize], want);
    let mut nan = links.clone();
    nan[7] = f32::NAN;
    let mut decayed = sel;
    decayed.post_pool_decay = 0.5;
    let shards = [(0usize, 2usize), (2, 2)];
    for (i, (p, l, want)) in [
        (
            &sel,
            (links.as_ptr(), N as u64 - 1, 0.5),
            KVE_ERR_SHAPE_MISMATCH,
        ),
        (&sel, (nan.as_ptr(), N as u64, 0.5), KVE_ERR_NON_FINITE),
        (&sel, (null(), N as u64, 0.5), KVE_ERR_NULL_POINTER),
        (
            &sel,
            (links.as_ptr(), N as u64, f32::NAN),
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (
            &decayed,
            (links.as_ptr(), N as u64, 0.5),
            KVE_ERR_INVALID_ARGUMENT,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let got = sharded_linked(p, &scores, layers, &shards, l);
        assert_eq!(got.map_err(name), Err(name(want)), "case {i}");
    }
}
