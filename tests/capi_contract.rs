//! The C ABI's contract (include/kvevict.h) at its edges, through the host entry points,
//! one section per entry point: what the header promises where an implementation most
//! easily deviates (overflowing sizes, non-finite results, struct arguments an output
//! overlaps, `struct_size` values, scores of another layout, a search fed another model).
//! Each test states the promise and checks it. Hostile input in general:
//! tests/capi_hostile/; the device entry points (`kve_cuda_*`): tests/capi_cuda/.

use kvevict::capi::*;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

#[macro_use]
mod capi_common;
use capi_common::*;

fn canary_u64(len: usize) -> Vec<u64> {
    vec![CANARY as u64; len]
}

// ------------------------------ size queries (`kve_*_len`, `kve_budget_*`): overflow, ±inf

#[test]
fn lengths_whose_byte_size_overflows() {
    let mut len = CANARY as u64;
    unsafe {
        // 65536 heads in one group with cross pairs: ~2^31 blocks of 2^31 tokens
        expect!(
            kve_value_forms_len(65536, 1, 1 << 31, 1, &mut len),
            KVE_ERR_OVERFLOW
        );
        assert_eq!(len, CANARY as u64);
        expect!(
            kve_gram_len(65536, 1, 1 << 16, 1, &mut len),
            KVE_ERR_OVERFLOW
        );
        let sp = score_params(0);
        expect!(
            kve_score_output_len(&sp, 2, 1 << 62, &mut len),
            KVE_ERR_OVERFLOW
        );
        assert_eq!(len, CANARY as u64);
        // the largest lengths a buffer can hold are still answered
        expect!(kve_value_forms_len(65536, 1, 1 << 20, 0, &mut len), KVE_OK);
        assert_eq!(len, 1 << 36);
    }
}

#[test]
fn keep_ratios_at_infinity() {
    assert_eq!(kve_budget_keep_ratio_total(100, 10, 2.0), 90);
    assert_eq!(kve_budget_keep_ratio_total(100, 10, f64::INFINITY), 90);
    assert_eq!(kve_budget_keep_ratio_total(100, 10, f64::NEG_INFINITY), 0);
    assert_eq!(kve_budget_keep_ratio_total(100, 10, f64::NAN), 0);
    assert_eq!(kve_budget_keep_ratio_prefix(100, 10, f64::INFINITY), 90);
    assert_eq!(kve_budget_keep_ratio_prefix(100, 10, f64::NEG_INFINITY), 0);
    assert_eq!(kve_budget_keep_ratio_prefix(100, 10, f64::NAN), 0);
    assert_eq!(kve_budget_keep_ratio_total(u64::MAX, 0, 1.0), u64::MAX);
}

// ---- `kve_compute_gram`, `kve_compute_value_forms`, `kve_compute_value_l1`: non-finite results

fn gram(wo: &[f32], hq: usize, dv: usize, dm: usize, out: &mut [f32]) -> i32 {
    let t = contiguous(wo, [hq, dv, dm]);
    // SAFETY: a host out-parameter.
    let mut ws = workspace(|b| unsafe { kve_gram_workspace_size(dv as u64, dm as u64, b) });
    let (wp, wl) = (ws.as_mut_ptr() as *mut c_void, ws.len() as u64);
    // SAFETY: host buffers of the lengths passed.
    unsafe { kve_compute_gram(&t, 1, 1, out.as_mut_ptr(), out.len() as u64, wp, wl) }
}

#[test]
fn gram_entries_that_overflow_are_non_finite() {
    // Wo entries near 3e38: every G entry is ~1e77
    let (hq, dv, dm) = (2, 2, 3);
    let wo = vec![3e38f32; hq * dv * dm];
    let mut out = canary_f32(12); // hkv 1, cross: 3 blocks of 2x2
    expect!(gram(&wo, hq, dv, dm, &mut out), KVE_ERR_NON_FINITE);
    assert!(untouched_f32(&out));
    // a row whose square norm is just below FLT_MAX: every entry still fits
    let big = (f32::MAX as f64).sqrt() as f32 * 0.999_99;
    let mut wo = data(hq * dv * dm, 3);
    wo[0] = big;
    wo[1] = 0.0;
    wo[2] = 0.0;
    expect!(gram(&wo, hq, dv, dm, &mut out), KVE_OK);
    assert!(out.iter().all(|x| x.is_finite()));
    // entries as the f64 sums they are (block (0,0) row 0, then the cross block)
    let row = |h: usize, r: usize| &wo[(h * dv + r) * dm..(h * dv + r + 1) * dm];
    let dot = |x: &[f32], y: &[f32]| -> f32 {
        x.iter()
            .zip(y)
            .map(|(a, b)| *a as f64 * *b as f64)
            .sum::<f64>() as f32
    };
    assert_eq!(out[0], dot(row(0, 0), row(0, 0)));
    assert_eq!(out[2], dot(row(0, 1), row(0, 0)));
    assert_eq!(out[8 + 1], dot(row(0, 0), row(1, 1)));
}

fn value_forms(values: &[f32], n: usize, dv: usize, g: &[f32], out: &mut [f32]) -> i32 {
    let t = contiguous(values, [1, n, dv]);
    unsafe {
        kve_compute_value_forms(
            &t,
            g.as_ptr(),
            g.len() as u64,
            1,
            0,
            0,
            n as u64,
            out.as_mut_ptr(),
            out.len() as u64,
        )
    }
}

#[test]
fn value_forms_that_overflow_are_non_finite() {
    let (n, dv) = (4, 2);
    let identity = [1.0f32, 0.0, 0.0, 1.0];
    let mut out = canary_f32(n);
    // v G vᵀ = 2 * (2e19)² = 8e38
    expect!(
        value_forms(&vec![2e19f32; n * dv], n, dv, &identity, &mut out),
        KVE_ERR_NON_FINITE
    );
    assert!(untouched_f32(&out));
    // exactly 0, but the f32 evaluation overflows on the way (inf - inf)
    let cancel = [10.0f32, -10.0, -10.0, 10.0];
    expect!(
        value_forms(&vec![1e19f32; n * dv], n, dv, &cancel, &mut out),
        KVE_ERR_NON_FINITE
    );
    assert!(untouched_f32(&out));
    // past the cheap bound, yet finite: computed once to be sure, then written
    let mut v = vec![0f32; n * dv];
    for t in 0..n {
        v[t * dv] = 1e19;
    }
    let g = [1.0f32, 0.0, 0.0, 100.0];
    expect!(value_forms(&v, n, dv, &g, &mut out), KVE_OK);
    assert!(out.iter().all(|&x| x == 1e38f32));
}

fn value_l1(values: &[f32], n: usize, dv: usize, wo: &[f32], dm: usize, out: &mut [f32]) -> i32 {
    let v = contiguous(values, [1, n, dv]);
    let w = contiguous(wo, [1, dv, dm]);
    // SAFETY: a host out-parameter.
    let mut ws = workspace(|b| unsafe { kve_value_l1_workspace_size(dv as u64, dm as u64, b) });
    let (wp, wl) = (ws.as_mut_ptr() as *mut c_void, ws.len() as u64);
    // SAFETY: host buffers of the lengths passed.
    unsafe { kve_compute_value_l1(&v, &w, out.as_mut_ptr(), out.len() as u64, wp, wl) }
}

#[test]
fn value_l1_that_overflows_is_non_finite() {
    let (n, dv, dm) = (2, 2, 1);
    let mut out = canary_f32(n);
    expect!(
        value_l1(&[1e20; 4], n, dv, &[1e20, 1e20], dm, &mut out),
        KVE_ERR_NON_FINITE
    );
    assert!(untouched_f32(&out));
    // past the cheap bound (3e38 * 1e10), yet finite: 3e38 * 0.5 and 1e10 + 0.5
    expect!(
        value_l1(&[3e38, 0.0, 1.0, 1.0], n, dv, &[0.5, 1e10], dm, &mut out),
        KVE_OK
    );
    assert_eq!(out, [1.5e38, 1e10 + 0.5]);
}

// ----------------------------------------------------------- `kve_score_layer`: its inputs

#[test]
fn row_lse_is_checked_without_a_prefix() {
    let l = Layer::new();
    // the first W tokens only, window W: no prefix to score
    let mut sp = score_params(0);
    sp.window = W as u32;
    let mut inp = l.inputs();
    inp.keys = tensor(l.k.as_ptr(), l.k.len(), [HKV, W, D], [N * D, D, 1]);
    inp.values = tensor(l.v.as_ptr(), l.v.len(), [HKV, W, D], [N * D, D, 1]);
    let (hq, hkv, w, d) = (HQ as u64, HKV as u64, W as u64, D as u64);
    // SAFETY: a host out-parameter.
    let mut ws = workspace(|b| unsafe { kve_score_workspace_size(&sp, hq, hkv, w, d, d, b) });
    let wl = ws.len() as u64;
    let mut run = |inp: &kve_layer_inputs| unsafe {
        kve_score_layer(&sp, inp, null_mut(), 0, ws.as_mut_ptr() as *mut c_void, wl)
    };
    let lse = [1.0f32; HQ * W + 1];
    inp.row_lse = lse.as_ptr();
    inp.row_lse_len = (HQ * W + 1) as u64;
    expect!(run(&inp), KVE_ERR_SHAPE_MISMATCH);
    inp.row_lse_len = (HQ * W - 1) as u64;
    expect!(run(&inp), KVE_ERR_SHAPE_MISMATCH);
    let mut bad = [1.0f32; HQ * W];
    bad[3] = f32::NAN;
    inp.row_lse = bad.as_ptr();
    inp.row_lse_len = (HQ * W) as u64;
    expect!(run(&inp), KVE_ERR_NON_FINITE);
    inp.row_lse = lse.as_ptr();
    expect!(run(&inp), KVE_OK);
}

#[test]
fn gram_and_value_forms_together_are_refused() {
    let mut l = Layer::new();
    let sp = score_params(PRESET_LAPROX);
    let wo = data(HQ * D * 16, 7);
    let glen = gram_len(HQ, HKV, D, 0);
    let mut flen = 0u64;
    // SAFETY: a host out-parameter.
    let st = unsafe { kve_value_forms_len(HQ as u64, HKV as u64, N as u64, 0, &mut flen) };
    assert_eq!(st, KVE_OK);
    let mut g = vec![0f32; glen as usize];
    expect!(gram(&wo, HQ, D, 16, &mut g[..0]), KVE_ERR_OUTPUT_TOO_SMALL);
    let t = contiguous(&wo, [HQ, D, 16]);
    let mut ws = vec![0u8; 1 << 12];
    let mut forms = vec![0f32; flen as usize];
    unsafe {
        assert_eq!(
            kve_compute_gram(
                &t,
                HKV as u64,
                0,
                g.as_mut_ptr(),
                glen,
                ws.as_mut_ptr() as *mut c_void,
                ws.len() as u64
            ),
            KVE_OK
        );
        let v = contiguous(&l.v, [HKV, N, D]);
        assert_eq!(
            kve_compute_value_forms(
                &v,
                g.as_ptr(),
                glen,
                HQ as u64,
                0,
                0,
                N as u64,
                forms.as_mut_ptr(),
                flen
            ),
            KVE_OK
        );
    }
    let mut inp = l.inputs();
    inp.gram = g.as_ptr();
    inp.gram_len = glen;
    expect!(l.score(&sp, &inp), KVE_OK);
    let with_gram = l.out.clone();
    inp.value_forms = forms.as_ptr();
    inp.value_forms_len = flen;
    expect!(l.score(&sp, &inp), KVE_ERR_INVALID_ARGUMENT);
    // even a Gram that would be refused alone is not ignored silently
    let bad = vec![f32::NAN; glen as usize];
    inp.gram = bad.as_ptr();
    expect!(l.score(&sp, &inp), KVE_ERR_INVALID_ARGUMENT);
    inp.gram = null();
    inp.gram_len = 0;
    expect!(l.score(&sp, &inp), KVE_OK);
    for (a, b) in l.out.iter().zip(&with_gram) {
        assert!((a - b).abs() <= 1e-4 * b.abs().max(1e-6), "{a} vs {b}");
    }
}

#[test]
fn criticalkv_forced_tokens_score_flt_max_and_rank_first() {
    let mut l = Layer::new();
    let mut sp = score_params(PRESET_CRITICALKV);
    sp.window = W as u32;
    sp.critical_first_stage = 3;
    let wo = data(HQ * D * 16, 9);
    let mut l1 = vec![0f32; HKV * N];
    expect!(value_l1_of(&l.v, &wo, &mut l1), KVE_OK);
    let mut inp = l.inputs();
    inp.value_l1 = l1.as_ptr();
    inp.value_l1_len = l1.len() as u64;
    expect!(l.score(&sp, &inp), KVE_OK);
    for kh in 0..HKV {
        let head = &l.out[kh * P..(kh + 1) * P];
        assert_eq!(head.iter().filter(|&&x| x == f32::MAX).count(), 3);
        assert!(head.iter().all(|&x| x.is_finite()));
    }
    // summed over heads (layer granularity) forced tokens saturate to +inf: still first
    let mut scores = vec![0.5f32; HKV * P];
    for (kh, i) in [(0, 3), (0, 7), (1, 3), (1, 9)] {
        scores[kh * P + i] = f32::MAX;
    }
    scores[20] = 0.9; // the best unforced token of head 0
    for alloc in [UNIFORM, GLOBAL] {
        let sel = select_params(alloc, LAYER, 3);
        let (st, off, idx) = select(&sel, &scores, 1, N, W);
        expect!(st, KVE_OK);
        let kept = &idx[off[0] as usize..off[1] as usize];
        assert_eq!(&kept[..3], &[3, 7, 9]);
    }
}

fn value_l1_of(values: &[f32], wo: &[f32], out: &mut [f32]) -> i32 {
    let v = contiguous(values, [HKV, N, D]);
    let w = contiguous(wo, [HQ, D, 16]);
    let mut ws = vec![0u8; 1 << 12];
    // SAFETY: host tensors and buffers of the lengths passed.
    into_out(out, &mut ws, |o, len, wp, bytes| unsafe {
        kve_compute_value_l1(&v, &w, o, len, wp, bytes)
    })
}

// -------------------------------------------------- `kve_select_model`: the scores' layout

#[test]
fn two_to_the_31_units_are_accepted() {
    let sel = select_params(UNIFORM, HEAD, 4);
    let (mut ol, mut il) = (0u64, 0u64);
    unsafe {
        expect!(
            kve_select_output_len(&sel, 1 << 20, 1 << 11, 1, 0, &mut ol, &mut il),
            KVE_OK
        );
        assert_eq!((ol, il), ((1 << 31) + 1, 1 << 31));
        expect!(
            kve_select_output_len(&sel, 1 << 20, (1 << 11) + 1, 1, 0, &mut ol, &mut il),
            KVE_ERR_OVERFLOW
        );
        let glob = select_params(GLOBAL, HEAD, 4);
        let mut s = std::mem::zeroed::<kve_search>();
        expect!(
            kve_search_init(&mut s, &glob, 1 << 20, 1 << 11, 1, 0),
            KVE_OK
        );
        assert_eq!(s.need, 1 << 31); // every candidate: done at once
        let mut wl = 0u64;
        expect!(
            kve_select_shard_workspace_size(&glob, 1 << 20, 1 << 11, 1, 0, &mut wl),
            KVE_OK
        );
    }
}

fn model(scores: &[f32], len: usize, layers: usize, n: usize, w: usize) -> kve_model_scores {
    kve_model_scores {
        scores: scores.as_ptr(),
        len: len as u64,
        layers: layers as u64,
        hkv: HKV as u64,
        n: n as u64,
        window: w as u64,
    }
}

fn select_with(sel: &kve_select_params, ms: &kve_model_scores) -> i32 {
    let mut off = canary_u64(ms.layers as usize * HKV + 1);
    let mut idx = vec![CANARY; ms.layers as usize * HKV * N];
    let mut ws = vec![0u8; 1 << 16];
    let st = unsafe {
        kve_select_model(
            sel,
            ms,
            off.as_mut_ptr(),
            off.len() as u64,
            idx.as_mut_ptr(),
            idx.len() as u64,
            ws.as_mut_ptr() as *mut c_void,
            ws.len() as u64,
        )
    };
    if st != KVE_OK {
        assert!(off.iter().all(|&x| x == CANARY as u64));
        assert!(idx.iter().all(|&x| x == CANARY));
    }
    st
}

#[test]
fn scores_length_must_equal_the_layout() {
    let sel = select_params(UNIFORM, HEAD, 4);
    // made with window 4 (P = 36), selected as window 5 (P = 35): a shifted layout
    let scores: Vec<f32> = data(2 * HKV * (N - 4), 8).iter().map(|x| x.abs()).collect();
    let len = scores.len();
    expect!(select_with(&sel, &model(&scores, len, 2, N, 4)), KVE_OK);
    expect!(
        select_with(&sel, &model(&scores, len, 2, N, 5)),
        KVE_ERR_SHAPE_MISMATCH
    );
    expect!(
        select_with(&sel, &model(&scores, len - 1, 2, N, 4)),
        KVE_ERR_SHAPE_MISMATCH
    );
    expect!(
        select_with(&sel, &model(&scores, len, 1, N, 4)),
        KVE_ERR_SHAPE_MISMATCH
    );
    // no prefix: no scores, NULL allowed
    expect!(select_with(&sel, &model(&[], 0, 2, N, N)), KVE_OK);
    let null_scores = kve_model_scores {
        scores: null(),
        ..model(&[], 0, 2, N, N + 3)
    };
    expect!(select_with(&sel, &null_scores), KVE_OK);
}

// --------------------------- `kve_search_*`, `kve_histogram_*`: a search records its model

struct Sharded {
    sel: kve_select_params,
    scores: Vec<f32>,
    layers: usize,
}

impl Sharded {
    fn new(layers: usize) -> Sharded {
        let scores = data(layers * HKV * P, 12).iter().map(|x| x.abs()).collect();
        Sharded {
            sel: select_params(GLOBAL, HEAD, 6),
            scores,
            layers,
        }
    }
    fn init(&self) -> kve_search {
        let mut s = unsafe { std::mem::zeroed::<kve_search>() };
        let st = unsafe {
            kve_search_init(
                &mut s,
                &self.sel,
                self.layers as u64,
                HKV as u64,
                N as u64,
                W as u64,
            )
        };
        assert_eq!(st, KVE_OK);
        s
    }
    fn shard(&self, first: usize, layers: usize) -> kve_model_scores {
        let part = &self.scores[first * HKV * P..(first + layers) * HKV * P];
        model(part, part.len(), layers, N, W)
    }
    fn count_with(
        &self,
        sel: &kve_select_params,
        ms: &kve_model_scores,
        first: u64,
        s: &kve_search,
        h: &mut kve_histogram,
    ) -> i32 {
        let mut ws = vec![0u8; 1 << 16];
        let before = *h;
        let st = unsafe {
            kve_search_count_shard(
                sel,
                ms,
                first,
                s,
                h,
                ws.as_mut_ptr() as *mut c_void,
                ws.len() as u64,
            )
        };
        if st != KVE_OK {
            assert_eq!(*h, before, "histogram written on error");
        }
        st
    }
    fn count(&self, first: usize, layers: usize, s: &kve_search, h: &mut kve_histogram) -> i32 {
        self.count_with(&self.sel, &self.shard(first, layers), first as u64, s, h)
    }
    /// The search's first state and the histogram of its layers `0..2` in that round.
    fn first_round(&self) -> (kve_search, kve_histogram) {
        let s = self.init();
        let mut h = empty();
        expect!(self.count(0, 2, &s, &mut h), KVE_OK);
        (s, h)
    }
    fn step(&self, s: &mut kve_search, h: &kve_histogram) -> i32 {
        let before = *s;
        let mut done = -1;
        let st = unsafe { kve_search_step(s, h, &mut done) };
        if st != KVE_OK {
            assert_eq!((*s, done), (before, -1), "search written on error");
        }
        st
    }
}

fn empty() -> kve_histogram {
    let mut h = unsafe { std::mem::zeroed::<kve_histogram>() };
    unsafe { assert_eq!(kve_histogram_clear(&mut h), KVE_OK) };
    h
}

#[test]
fn sharded_search_refuses_another_model() {
    let m = Sharded::new(4);
    let s = m.init();
    assert_eq!(s.done, 0);
    let mut h = empty();
    // shards of another hkv, n or window
    let part = &m.scores[..HKV * P];
    let other_hkv = kve_model_scores {
        hkv: 1,
        ..model(part, part.len() / 2, 1, N, W)
    };
    expect!(
        m.count_with(&m.sel, &other_hkv, 0, &s, &mut h),
        KVE_ERR_SHAPE_MISMATCH
    );
    let other_n = model(&part[..HKV * (P - 1)], HKV * (P - 1), 1, N - 1, W);
    expect!(
        m.count_with(&m.sel, &other_n, 0, &s, &mut h),
        KVE_ERR_SHAPE_MISMATCH
    );
    let other_w = model(&part[..HKV * (P - 1)], HKV * (P - 1), 1, N, W + 1);
    expect!(
        m.count_with(&m.sel, &other_w, 0, &s, &mut h),
        KVE_ERR_SHAPE_MISMATCH
    );
    // layers past the model's
    expect!(
        m.count_with(&m.sel, &m.shard(2, 2), 3, &s, &mut h),
        KVE_ERR_SHAPE_MISMATCH
    );
    expect!(
        m.count_with(&m.sel, &m.shard(0, 1), u64::MAX, &s, &mut h),
        KVE_ERR_SHAPE_MISMATCH
    );
    // other parameters
    let mut other = m.sel;
    other.budget = 7;
    expect!(
        m.count_with(&other, &m.shard(0, 2), 0, &s, &mut h),
        KVE_ERR_INVALID_ARGUMENT
    );
    let mut other = m.sel;
    other.normalize = 1;
    expect!(
        m.count_with(&other, &m.shard(0, 2), 0, &s, &mut h),
        KVE_ERR_INVALID_ARGUMENT
    );
    // a missing layer, an overlap, a layer twice in place of another
    for shards in [
        &[(0, 3)][..],
        &[(0, 2), (1, 3)],
        &[(0, 2), (1, 2), (3, 1)],
        &[(0, 1), (0, 1), (2, 2)],
    ] {
        let mut h = empty();
        for &(f, n) in shards {
            expect!(m.count(f, n, &s, &mut h), KVE_OK);
        }
        let mut s2 = s;
        expect!(m.step(&mut s2, &h), KVE_ERR_SHAPE_MISMATCH);
    }
    // an uncounted histogram
    let mut s2 = s;
    expect!(m.step(&mut s2, &empty()), KVE_ERR_INVALID_ARGUMENT);
    // select_shard checks the same
    let mut off = canary_u64(5);
    let mut idx = vec![CANARY; 4 * HKV * N];
    let mut ws = vec![0u8; 1 << 16];
    // a finished search (a state forged to look finished is refused before its shards)
    let fin = {
        let mut s = s;
        while s.done == 0 {
            let mut h = empty();
            expect!(m.count(0, 4, &s, &mut h), KVE_OK);
            expect!(m.step(&mut s, &h), KVE_OK);
        }
        s
    };
    let ms = model(part, part.len() - HKV, 1, N - 1, W);
    unsafe {
        expect!(
            select_shard(
                &m.sel,
                (&ms, 0),
                &fin,
                &mut off,
                &mut idx,
                (ws.as_mut_ptr() as *mut c_void, ws.len() as u64)
            ),
            KVE_ERR_SHAPE_MISMATCH
        );
    }
    assert!(off.iter().all(|&x| x == CANARY as u64));
}

#[test]
fn histograms_of_another_round_are_refused() {
    let m = Sharded::new(4);
    let (s0, h0) = m.first_round();
    let mut rest = empty();
    expect!(m.count(2, 2, &s0, &mut rest), KVE_OK);
    let mut total = empty();
    unsafe {
        expect!(kve_histogram_merge(&mut total, &h0), KVE_OK);
        expect!(kve_histogram_merge(&mut total, &rest), KVE_OK);
    }
    let mut s1 = s0;
    expect!(m.step(&mut s1, &total), KVE_OK);
    assert_ne!(s1, s0);
    if s1.done == 1 {
        return; // (not with these scores: the search needs rounds)
    }
    // last round's histogram: refused by step, count and merge
    let mut s2 = s1;
    expect!(m.step(&mut s2, &total), KVE_ERR_INVALID_ARGUMENT);
    let mut h = h0;
    expect!(m.count(2, 2, &s1, &mut h), KVE_ERR_INVALID_ARGUMENT);
    let mut h1 = empty();
    expect!(m.count(0, 2, &s1, &mut h1), KVE_OK);
    let keep = h1;
    unsafe { expect!(kve_histogram_merge(&mut h1, &h0), KVE_ERR_INVALID_ARGUMENT) };
    assert_eq!(h1, keep);
    // a search of another model in the same round: its histograms do not mix either
    let (_, mut ho) = Sharded::new(5).first_round();
    unsafe { expect!(kve_histogram_merge(&mut ho, &h0), KVE_ERR_INVALID_ARGUMENT) };
    // the search ends within 13 rounds when every shard counts each round
    let mut s = s0;
    for _ in 0..13 {
        if s.done == 1 {
            break;
        }
        let mut t = empty();
        expect!(m.count(0, 3, &s, &mut t), KVE_OK);
        expect!(m.count(3, 1, &s, &mut t), KVE_OK);
        expect!(m.step(&mut s, &t), KVE_OK);
    }
    assert_eq!(s.done, 1);
}

#[test]
fn search_state_fields_are_checked() {
    let m = Sharded::new(2);
    let (s, h) = m.first_round();
    for f in [
        (|s: &mut kve_search| s.layers = 0) as fn(&mut kve_search),
        |s| s.n = 0,
        |s| s.window = s.n + 1,
        |s| s.hkv = 1 << 40,
        |s| s.params.allocator = 0,
        |s| s.params.struct_size = 52,
        |s| s.params.budget = u64::MAX,
    ] {
        let mut bad = s;
        f(&mut bad);
        expect!(m.step(&mut bad, &h), KVE_ERR_INVALID_ARGUMENT);
    }
    let mut ok = s;
    expect!(m.step(&mut ok, &h), KVE_OK);
}

// ------------------------------------------------------------------------- `kve_compact_*`

#[test]
fn compaction_offsets_are_absolute_into_the_whole_indices() {
    // two layers selected at once; compact layer 1 with its slice of the offsets
    let scores: Vec<f32> = data(2 * HKV * P, 10).iter().map(|x| x.abs()).collect();
    let sel = select_params(UNIFORM, HEAD, 5);
    let (st, off, idx) = select(&sel, &scores, 2, N, W);
    expect!(st, KVE_OK);
    let mut kv = data(HKV * N * D, 11);
    let orig = kv.clone();
    let t = tensor(kv.as_mut_ptr(), kv.len(), [HKV, N, D], [N * D, D, 1]);
    let mut lengths = [CANARY; HKV];
    unsafe {
        expect!(
            kve_compact_in_place(
                &t,
                off[HKV..].as_ptr(),
                (HKV + 1) as u64,
                idx.as_ptr(),
                idx.len() as u64,
                lengths.as_mut_ptr(),
                HKV as u64
            ),
            KVE_OK
        );
    }
    for h in 0..HKV {
        let list = &idx[off[HKV + h] as usize..off[HKV + h + 1] as usize];
        assert_eq!(lengths[h] as usize, list.len());
        for (j, &i) in list.iter().enumerate() {
            let src = &orig[(h * N + i as usize) * D..(h * N + i as usize + 1) * D];
            assert_eq!(&kv[(h * N + j) * D..(h * N + j + 1) * D], src);
        }
    }
}

// --------- every entry point: outputs over struct arguments, released `struct_size` values

/// 8-aligned scratch where structs and outputs can be placed over each other.
#[repr(C, align(16))]
struct Scratch([u64; 128]);

#[test]
fn outputs_over_struct_arguments_are_aliasing() {
    let sel = select_params(GLOBAL, HEAD, 4);
    let mut m = Scratch([0; 128]);
    let base = m.0.as_mut_ptr();
    unsafe {
        // the search state written over its own parameters
        let params = base as *mut kve_select_params;
        *params = sel;
        let before = m.0;
        let search = base.add(2) as *mut kve_search;
        expect!(
            kve_search_init(search, params, 2, HKV as u64, N as u64, W as u64),
            KVE_ERR_ALIASING
        );
        assert_eq!(m.0, before);
        // a clean state for the next checks
        let mut s = std::mem::zeroed::<kve_search>();
        expect!(
            kve_search_init(&mut s, &sel, 2, HKV as u64, N as u64, W as u64),
            KVE_OK
        );
        let mut thr = s;
        expect!(
            kve_search_threshold(&thr, &mut thr.bits as *mut u32 as *mut f32),
            KVE_ERR_ALIASING
        );
        assert_eq!(thr, s);
    }
    // kve_select_model's offsets over the params, then over the scores struct
    let scores: Vec<f32> = data(HKV * P, 5).iter().map(|x| x.abs()).collect();
    let usel = select_params(UNIFORM, HEAD, 4);
    let mut idx = vec![CANARY; 2 * N];
    let mut ws = vec![0u8; 8192];
    unsafe {
        let params = base as *mut kve_select_params;
        *params = usel;
        let ms = base.add(8) as *mut kve_model_scores;
        *ms = kve_model_scores::of(&scores, 1, HKV as u64, N as u64, W as u64);
        let before = m.0;
        for off in [base.add(1), base.add(10)] {
            expect!(
                kve_select_model(
                    params,
                    ms,
                    off,
                    3,
                    idx.as_mut_ptr(),
                    idx.len() as u64,
                    ws.as_mut_ptr() as *mut c_void,
                    ws.len() as u64
                ),
                KVE_ERR_ALIASING
            );
            assert_eq!(m.0, before);
        }
        // the same call with separate offsets succeeds
        let mut off = canary_u64(3);
        expect!(
            kve_select_model(
                params,
                ms,
                off.as_mut_ptr(),
                3,
                idx.as_mut_ptr(),
                idx.len() as u64,
                ws.as_mut_ptr() as *mut c_void,
                ws.len() as u64
            ),
            KVE_OK
        );
    }
    // a score output over the params struct, or over the inputs struct
    let mut l = Layer::new();
    let inp = l.inputs();
    unsafe {
        let sp = base as *mut kve_score_params;
        *sp = score_params(0);
        let before = m.0;
        let st = kve_score_layer(
            sp,
            &inp,
            base.add(2) as *mut f32,
            4,
            l.ws.as_mut_ptr() as *mut c_void,
            l.ws.len() as u64,
        );
        expect!(st, KVE_ERR_ALIASING);
        assert_eq!(m.0, before);
        let ip = base.add(8) as *mut kve_layer_inputs;
        *ip = inp;
        let before = m.0;
        let st = kve_score_layer(
            &score_params(0),
            ip,
            base.add(20) as *mut f32,
            (HKV * P) as u64,
            l.ws.as_mut_ptr() as *mut c_void,
            l.ws.len() as u64,
        );
        expect!(st, KVE_ERR_ALIASING);
        assert_eq!(m.0, before);
        // the gram output over its Wo descriptor
        let wo = data(2 * D * D, 6);
        let wd = base.add(60) as *mut kve_tensor;
        *wd = contiguous(&wo, [2, D, D]);
        let before = m.0;
        let mut ws = vec![0u8; 1 << 12];
        let st = kve_compute_gram(
            wd,
            1,
            0,
            base.add(58) as *mut f32,
            (2 * D * D) as u64,
            ws.as_mut_ptr() as *mut c_void,
            ws.len() as u64,
        );
        expect!(st, KVE_ERR_ALIASING);
        assert_eq!(m.0, before);
    }
}

/// The stream entry points (`kve_stream_*`) with an output (state, workspace, scores,
/// statistics) placed over a struct or array argument: ALIASING, nothing written. Each
/// case succeeds with the same arguments placed apart, so the status is the check's.
#[test]
fn stream_outputs_over_struct_arguments_are_aliasing() {
    const C: usize = 3;
    let (hq, hkv, n, dk) = (HQ as u64, HKV as u64, N as u64, D as u64);
    let (mut bytes, mut fwb, mut swb) = (0u64, 0u64, 0u64);
    unsafe {
        expect!(kve_stream_state_size(hq, hkv, n, dk, &mut bytes), KVE_OK);
        expect!(
            kve_stream_feed_workspace_size(hq, hkv, n, dk, C as u64, &mut fwb),
            KVE_OK
        );
        expect!(
            kve_stream_scores_workspace_size(hq, hkv, n, dk, &mut swb),
            KVE_OK
        );
    }
    // the state, then room for the arguments placed over its tail
    let words = bytes as usize / 8;
    let mut mem = vec![0u64; words];
    let state = mem.as_mut_ptr();
    unsafe {
        expect!(
            kve_stream_init(state as *mut c_void, bytes, hq, hkv, n, dk),
            KVE_OK
        );
    }
    let q = data(HQ * C * D, 21);
    let k = data(HKV * N * D, 22);
    let (qt, kt) = (contiguous(&q, [HQ, C, D]), contiguous(&k, [HKV, N, D]));
    // the first chunk, then the positions of every later (valid) feed
    let (first, pos) = ([1i64, 5, 9], [9i64, 12, 30]);
    let mut fws = vec![0u64; fwb as usize / 8 + 1];
    let feed = |state: *mut u64,
                qd: *const kve_tensor,
                p: *const i64,
                kd: *const kve_tensor,
                lse: &[f32],
                ws: *mut u64| unsafe {
        kve_stream_feed(
            state as *mut c_void,
            bytes,
            qd,
            p,
            C as u64,
            kd,
            if lse.is_empty() { null() } else { lse.as_ptr() },
            lse.len() as u64,
            ws as *mut c_void,
            fwb,
        )
    };
    expect!(
        feed(state, &qt, first.as_ptr(), &kt, &[], fws.as_mut_ptr()),
        KVE_OK
    );
    // a word of the state's tail (accumulators), 16-aligned for any argument
    let tail = (words - 16) & !1;
    let fws_p = fws.as_mut_ptr();
    unsafe {
        // the queries' and the keys' descriptors, and the positions, in the state's tail
        // or in the workspace
        for place in [state.add(tail), fws_p] {
            (place as *mut kve_tensor).write(qt);
            let (before, wsb) = (mem.clone(), fws.clone());
            expect!(
                feed(
                    state,
                    place as *const kve_tensor,
                    pos.as_ptr(),
                    &kt,
                    &[],
                    fws_p
                ),
                KVE_ERR_ALIASING
            );
            assert!(mem == before && fws == wsb, "queries descriptor: written");
            (place as *mut kve_tensor).write(kt);
            let (before, wsb) = (mem.clone(), fws.clone());
            expect!(
                feed(
                    state,
                    &qt,
                    pos.as_ptr(),
                    place as *const kve_tensor,
                    &[],
                    fws_p
                ),
                KVE_ERR_ALIASING
            );
            assert!(mem == before && fws == wsb, "keys descriptor: written");
            (place as *mut [i64; 3]).write(pos);
            let (before, wsb) = (mem.clone(), fws.clone());
            expect!(
                feed(state, &qt, place as *const i64, &kt, &[], fws_p),
                KVE_ERR_ALIASING
            );
            assert!(mem == before && fws == wsb, "positions: written");
        }
        // row_lse in the state's tail
        let lse = std::slice::from_raw_parts(state.add(tail) as *const f32, HQ * C);
        let before = mem.clone();
        expect!(
            feed(state, &qt, pos.as_ptr(), &kt, lse, fws_p),
            KVE_ERR_ALIASING
        );
        assert!(mem == before, "row_lse: written");
    }
    // placed apart, the same feed succeeds
    expect!(feed(state, &qt, pos.as_ptr(), &kt, &[], fws_p), KVE_OK);

    // kve_stream_scores: the scores or the workspace over the params or the values
    // descriptor (max attention ignores the values, so the call succeeds without the check)
    // SAFETY: a writable struct of the size passed.
    let sp: kve_stream_score_params =
        init_struct(|p, size| unsafe { kve_stream_score_params_init(p, size) });
    let v = data(HKV * N * D, 23);
    let vt = contiguous(&v, [HKV, N, D]);
    let ol = HKV * N;
    let mut out = vec![0u64; ol / 2 + 16];
    let mut sws = vec![0u64; swb as usize / 8 + 16];
    let scores = |p: *const kve_stream_score_params,
                  vd: *const kve_tensor,
                  o: *mut u64,
                  ws: *mut u64| unsafe {
        kve_stream_scores(
            state as *const c_void,
            bytes,
            p,
            vd,
            null(),
            0,
            null(),
            0,
            o as *mut f32,
            ol as u64,
            ws as *mut c_void,
            swb,
        )
    };
    let (op, wp) = (out.as_mut_ptr(), sws.as_mut_ptr());
    unsafe {
        for place in [op.add(2), wp.add(2)] {
            (place as *mut kve_stream_score_params).write(sp);
            let (ob, wb) = (out.clone(), sws.clone());
            expect!(scores(place as *const _, null(), op, wp), KVE_ERR_ALIASING);
            assert!(out == ob && sws == wb, "params: written");
            (place as *mut kve_tensor).write(vt);
            let (ob, wb) = (out.clone(), sws.clone());
            expect!(scores(&sp, place as *const _, op, wp), KVE_ERR_ALIASING);
            assert!(out == ob && sws == wb, "values descriptor: written");
        }
        // the scores over the workspace
        let before = sws.clone();
        let r = kve_stream_scores(
            state as *const c_void,
            bytes,
            &sp,
            null(),
            null(),
            0,
            null(),
            0,
            wp.add(2) as *mut f32,
            ol as u64,
            wp as *mut c_void,
            swb,
        );
        expect!(r, KVE_ERR_ALIASING);
        assert!(sws == before, "scores over the workspace: written");
    }
    expect!(scores(&sp, &vt, op, wp), KVE_OK);

    // kve_stream_stats: outputs over each other or over the state; query count over the state
    let hn = HQ * N;
    let mut st_out = vec![CANARY; 3 * hn + 1];
    let mut seen = canary_u64(N);
    let sp3 = st_out.as_mut_ptr() as *mut f32;
    let stats = |m: *mut f32, s: *mut f32, q: *mut f32, sn: *mut u64| unsafe {
        kve_stream_stats(state as *const c_void, bytes, m, s, q, hn as u64, sn, n)
    };
    let before = mem.clone();
    unsafe {
        let seen_p = seen.as_mut_ptr();
        let cases = [
            (sp3, sp3.add(hn - 1), sp3.add(2 * hn), seen_p),
            (
                sp3,
                sp3.add(hn),
                sp3.add(2 * hn),
                sp3.add(2 * hn) as *mut u64,
            ),
            (sp3, sp3.add(hn), state.add(tail) as *mut f32, seen_p),
            (sp3, sp3.add(hn), sp3.add(2 * hn), state.add(tail - N)),
        ];
        for (i, (m, s, q, sn)) in cases.into_iter().enumerate() {
            expect!(stats(m, s, q, sn), KVE_ERR_ALIASING);
            assert!(
                st_out.iter().all(|&x| x == CANARY) && seen.iter().all(|&x| x == CANARY as u64),
                "stats case {i}: written"
            );
            assert!(mem == before, "stats case {i}: state written");
        }
        let mut cnt = CANARY as u64;
        expect!(
            kve_stream_query_count(state as *const c_void, bytes, state.add(tail)),
            KVE_ERR_ALIASING
        );
        assert!(mem == before, "query count over the state: written");
        expect!(
            kve_stream_query_count(state as *const c_void, bytes, &mut cnt),
            KVE_OK
        );
        assert_eq!(cnt, 2 * C as u64);
        expect!(
            stats(sp3, sp3.add(hn), sp3.add(2 * hn), seen.as_mut_ptr()),
            KVE_OK
        );
    }
}

/// A struct followed by readable zero bytes, so any `struct_size` is honest memory.
#[repr(C)]
struct Padded<T> {
    p: T,
    tail: [u8; 4200],
}

fn padded<T: Copy>(p: T, size: u32) -> Box<Padded<T>> {
    let mut b = Box::new(Padded { p, tail: [0; 4200] });
    unsafe { *(&mut b.p as *mut T as *mut u32) = size };
    b
}

/// Sizes to try: every multiple of 4 up to 4100, odd ones and huge ones.
fn sizes() -> impl Iterator<Item = u32> {
    (0..=4100u32)
        .step_by(4)
        .chain([1, 47, 49, 51, 53, 271, 273, 287, 289, 1 << 20, u32::MAX])
}

#[test]
fn struct_sizes_are_released_versions_only() {
    // the sizes the Python binding passes (python/kvevict/_lib.py) are released ones
    assert_eq!(std::mem::size_of::<kve_score_params>(), 52);
    assert_eq!(std::mem::size_of::<kve_select_params>(), 48);
    assert_eq!(std::mem::size_of::<kve_layer_inputs>(), 288);
    let sp = score_params(0);
    let sel = select_params(UNIFORM, HEAD, 4);
    for size in sizes() {
        let ok = if size == 48 {
            KVE_OK
        } else {
            KVE_ERR_INVALID_ARGUMENT
        };
        // kve_score_params: V1 (48, no power) and V2 (52)
        let score_ok = if size == KVE_SCORE_PARAMS_V1_SIZE || size == KVE_SCORE_PARAMS_V2_SIZE {
            KVE_OK
        } else {
            KVE_ERR_INVALID_ARGUMENT
        };
        let p = padded(sp, size);
        let mut len = 0u64;
        expect!(
            unsafe { kve_score_output_len(&p.p, 2, 40, &mut len) },
            score_ok
        );
        let s = padded(sel, size);
        let (mut a, mut b) = (0u64, 0u64);
        expect!(
            unsafe { kve_select_output_len(&s.p, 1, 2, 40, 8, &mut a, &mut b) },
            ok
        );
        let mut w = Padded {
            p: unsafe { std::mem::zeroed::<kve_score_params>() },
            tail: [0xAB; 4200],
        };
        expect!(
            unsafe { kve_score_params_init(&mut w.p, size, kvevict::Preset::LaProxSpan as u32) },
            score_ok
        );
        assert!(
            w.tail.iter().all(|&x| x == 0xAB),
            "init wrote past the struct"
        );
        if score_ok != KVE_OK {
            assert_eq!(w.p.struct_size, 0);
        }
        if size == KVE_SCORE_PARAMS_V1_SIZE {
            // a V1 caller's struct ends before power: those bytes are not its
            assert_eq!(w.p.power, 0);
        }
        if size == KVE_SCORE_PARAMS_V2_SIZE {
            assert_eq!(w.p.power, 3);
        }
    }
    // a V1 struct's power bytes are not read: garbage there changes nothing, and a V1
    // caller gets power 1 (the scores of the first release). KNorm: negative scores.
    let mut l = Layer::new();
    let inp = l.inputs();
    let mut v1 = padded(
        score_params(kvevict::Preset::KNorm as u32),
        KVE_SCORE_PARAMS_V1_SIZE,
    );
    v1.p.power = 0;
    expect!(l.score(&v1.p, &inp), KVE_OK);
    let as_v1 = l.out.clone();
    assert!(as_v1.iter().all(|&x| x < 0.0));
    // V2: the power is applied (sign kept), and one out of [1, KVE_MAX_SCORE_POWER] rejected
    let mut cubed = score_params(kvevict::Preset::KNorm as u32);
    cubed.power = 3;
    expect!(l.score(&cubed, &inp), KVE_OK);
    for (c, s) in l.out.iter().zip(&as_v1) {
        assert_eq!(c.to_bits(), (s * s * s).to_bits());
    }
    for bad in [0, KVE_MAX_SCORE_POWER + 1, u32::MAX] {
        let mut b = score_params(kvevict::Preset::KNorm as u32);
        b.power = bad;
        // (Layer::score checks that nothing was written on error)
        expect!(l.score(&b, &inp), KVE_ERR_INVALID_ARGUMENT);
    }
    // kve_layer_inputs: V1 (272, no row_lse) and V2 (288); 276 and 284 split row_lse
    let mut l = Layer::new();
    let inp = l.inputs();
    for size in sizes() {
        let ok = if size == KVE_LAYER_INPUTS_V1_SIZE || size == KVE_LAYER_INPUTS_V2_SIZE {
            KVE_OK
        } else {
            KVE_ERR_INVALID_ARGUMENT
        };
        let i = padded(inp, size);
        expect!(l.score(&score_params(0), &i.p), ok);
        let mut w = Padded {
            p: inp,
            tail: [0xAB; 4200],
        };
        expect!(unsafe { kve_layer_inputs_init(&mut w.p, size) }, ok);
        assert!(w.tail.iter().all(|&x| x == 0xAB));
        if size == KVE_LAYER_INPUTS_V1_SIZE {
            // a V1 caller's struct ends before row_lse: those bytes are not its
            assert!(w.p.row_lse == inp.row_lse && w.p.keys.data.is_null());
        }
    }
    // a V1 struct's row_lse bytes are not read: garbage there changes nothing
    let mut i = padded(inp, KVE_LAYER_INPUTS_V1_SIZE);
    i.p.row_lse = 8 as *const f32;
    i.p.row_lse_len = 3;
    expect!(l.score(&score_params(0), &i.p), KVE_OK);
}

// ---------------------------------------------------- `kve_cuda_device_count` without CUDA

#[test]
fn device_count_without_cuda_is_zero() {
    if cfg!(feature = "cuda") {
        return;
    }
    let mut c = CANARY as i32;
    unsafe {
        expect!(
            kve_cuda_get_device_count(&mut c),
            KVE_ERR_NOT_BUILT_WITH_CUDA
        );
        assert_eq!(c, 0);
        expect!(
            kve_cuda_get_device_count(null_mut()),
            KVE_ERR_NOT_BUILT_WITH_CUDA
        );
    }
}
