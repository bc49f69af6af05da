//! CPU benchmark of `compute_value_forms` on f16 values in the two layouts llama.cpp's KV cache
//! has (issue 12; not a timed test): token rows (`[Hkv, N, dv]`, element (h, t, c) at
//! `t·Hkv·dv + h·dv + c`, flash attention on) and transposed (element (h, t, c) at
//! `(h·dv + c)·kv_size + t`, flash attention off). SmolLM2-135M's shape (Hq=9, Hkv=3, dv=64),
//! one layer, single-threaded; each case runs `--reps` times and the median is reported.
//! Both layouts hold the same values, so their forms must be bit-identical (checked).
//!
//!   cargo run --release --example bench_value_forms -- [--reps 21] [--n 1000,4000]

use half::f16;
use kvevict::*;
use std::time::Instant;

mod common;
use common::arg;

const HQ: usize = 9;
const HKV: usize = 3;
const DV: usize = 64;

/// xorshift64* uniform in [-1, 1)
fn unif(s: &mut u64) -> f32 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    ((s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn median(mut x: Vec<f64>) -> f64 {
    x.sort_by(|a, b| a.total_cmp(b));
    x[x.len() / 2]
}

fn main() {
    let reps: usize = arg("--reps", "21").parse().expect("--reps");
    let ns: Vec<usize> = arg("--n", "1000,4000")
        .split(',')
        .map(|x| x.parse().expect("--n"))
        .collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let dm = HQ * DV;
    let wo: Vec<f32> = (0..HQ * DV * dm)
        .map(|_| unif(&mut seed) / (dm as f32).sqrt())
        .collect();
    let wov = View::f32_contiguous(&wo, [HQ, DV, dm]).unwrap();
    let mut gram = vec![0f32; gram_len(HQ, HKV, DV, false).unwrap()];
    let mut ws = vec![0u8; gram_workspace_size(DV, dm).unwrap()];
    compute_gram(&wov, HKV, false, &mut gram, &mut ws).unwrap();
    for &n in &ns {
        // the cache holds n cells of a kv_size-cell buffer, as in llama.cpp
        let kv_size = n.next_multiple_of(256);
        let row = HKV * DV;
        let mut rows = vec![f16::ZERO; kv_size * row];
        let mut trans = vec![f16::ZERO; kv_size * row];
        for t in 0..n {
            for e in 0..row {
                let x = f16::from_f32(unif(&mut seed));
                rows[t * row + e] = x;
                trans[e * kv_size + t] = x;
            }
        }
        let vr = View::f16(&rows, [HKV, n, DV], [DV, row, 1]).unwrap();
        let vt = View::f16(&trans, [HKV, n, DV], [DV * kv_size, 1, kv_size]).unwrap();
        let len = value_forms_len(HQ, HKV, n, false).unwrap();
        let mut out = [vec![0f32; len], vec![0f32; len]];
        let mut med = [0f64; 2];
        for (i, v) in [&vr, &vt].into_iter().enumerate() {
            let times: Vec<f64> = (0..reps)
                .map(|_| {
                    let t = Instant::now();
                    compute_value_forms(v, &gram, HQ, false, 0, n, &mut out[i]).unwrap();
                    t.elapsed().as_secs_f64()
                })
                .collect();
            med[i] = median(times);
        }
        let same = out[0]
            .iter()
            .zip(&out[1])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "the two layouts gave different forms");
        println!(
            "N={n}: token rows {:.3} ms, transposed {:.3} ms per layer ({:.2}x), bit-identical",
            1e3 * med[0],
            1e3 * med[1],
            med[1] / med[0]
        );
        println!(
            "RESULT\tvalue-forms-layout\t{n}\t{:.6}\t{:.6}",
            1e3 * med[0],
            1e3 * med[1]
        );
    }
}
