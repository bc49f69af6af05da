//! What reading ggml's block-quantized K/V costs the scorers (issue 27; not a timed test):
//! `score_layer` of one Llama-3-8B layer (Hq=32, Hkv=8, d=128, window 32) from llama.cpp's
//! token-row cache `[N][Hkv·d]`, keys and values stored as q8_0 or q4_0, as the f32 tensor
//! of their dequantized values, and as f16 (those values rounded: its time only, the cache
//! size of an f16 engine), single-threaded, the minimum of `--reps` runs. Checks that the
//! quantized scores equal the f32 ones bit for bit.
//!
//!   cargo run --release --example bench_quantized -- [--reps 5] [--n 8192]
//!       [--scorers snapkv,knorm,tova,lava,laprox]

use half::f16;
use kvevict::*;
use std::time::Instant;

mod common;
use common::{arg, Rng};

const HQ: usize = 32;
const HKV: usize = 8;
const D: usize = 128;
const DM: usize = 4096;

/// Random q8_0 or q4_0 blocks for `values` values (magnitudes up to ~2) and their values.
fn blocks(r: &mut Rng, q8: bool, values: usize) -> (Vec<u16>, Vec<f32>) {
    let bb = if q8 { 34 } else { 18 };
    let mut b = vec![0u8; values / 32 * bb];
    let mut x = Vec::with_capacity(values);
    for blk in b.chunks_exact_mut(bb) {
        let d = f16::from_f32((0.5 + r.unit()) / if q8 { 96.0 } else { 6.0 });
        blk[..2].copy_from_slice(&d.to_bits().to_le_bytes());
        for q in &mut blk[2..] {
            *q = r.next() as u8;
        }
        let d = d.to_f32();
        if q8 {
            x.extend(blk[2..].iter().map(|&q| q as i8 as f32 * d));
        } else {
            x.extend(blk[2..].iter().map(|&q| ((q & 15) as i32 - 8) as f32 * d));
            x.extend(blk[2..].iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
        }
    }
    let al = b
        .chunks_exact(2)
        .map(|c| u16::from_ne_bytes([c[0], c[1]]))
        .collect();
    (al, x)
}

fn bytes(x: &[u16]) -> &[u8] {
    // SAFETY: u16 storage read as its bytes.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, x.len() * 2) }
}

fn main() {
    let reps: usize = arg("--reps", "5").parse().unwrap();
    let n: usize = arg("--n", "8192").parse().unwrap();
    let scorers = arg("--scorers", "snapkv,knorm,tova,lava,laprox");
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    let st = [D, HKV * D, 1];
    let ext = [HKV, n, D];
    let wq: Vec<f32> = (0..HQ * 32 * D)
        .map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 3.0)
        .collect();
    let q = View::f32_contiguous(&wq, [HQ, 32, D]).unwrap();
    let wo: Vec<f32> = (0..HQ * D * DM)
        .map(|i| (i * 104_729 % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let wo = View::f32_contiguous(&wo, [HQ, D, DM]).unwrap();
    println!("Llama-3-8B layer, N = {n}, token rows, window 32, 1 thread, min of {reps}");
    for name in scorers.split(',') {
        let preset = kvevict::evictor::preset_from_name(name.as_bytes())
            .unwrap_or_else(|_| panic!("unknown scorer {name}"));
        let mut cfg = ScoreConfig::preset(preset);
        if cfg.scorer != ScorerKind::Tova {
            cfg.window = 32;
        }
        let shape = LayerShape {
            hq: HQ,
            hkv: HKV,
            n,
            dk: D,
            dv: D,
        };
        let mut ws = vec![0u8; score_workspace_size(&cfg, &shape).unwrap()];
        let cross = cfg.laprox_gqa != LaproxGqa::Sum;
        let mut gram = vec![0f32; gram_len(HQ, HKV, D, cross).unwrap()];
        let mut gws = vec![0u8; gram_workspace_size(D, DM).unwrap()];
        compute_gram(&wo, HKV, cross, &mut gram, &mut gws).unwrap();
        let w = (cfg.window as usize).min(n);
        for q8 in [true, false] {
            let (kb, kx) = blocks(&mut r, q8, HKV * n * D);
            let (vb, vx) = blocks(&mut r, q8, HKV * n * D);
            let (kh, vh): (Vec<f16>, Vec<f16>) = (
                kx.iter().map(|&x| f16::from_f32(x)).collect(),
                vx.iter().map(|&x| f16::from_f32(x)).collect(),
            );
            let dt = if q8 { DType::Q8_0 } else { DType::Q4_0 };
            let cases = [
                (
                    "f32",
                    View::f32(&kx, ext, st).unwrap(),
                    View::f32(&vx, ext, st).unwrap(),
                ),
                (
                    "f16",
                    View::f16(&kh, ext, st).unwrap(),
                    View::f16(&vh, ext, st).unwrap(),
                ),
                (
                    if q8 { "q8_0" } else { "q4_0" },
                    View::bytes(bytes(&kb), dt, ext, st).unwrap(),
                    View::bytes(bytes(&vb), dt, ext, st).unwrap(),
                ),
            ];
            let mut reference: Option<Vec<u32>> = None;
            for (label, k, v) in cases {
                let inputs = LayerInputs {
                    queries: Some(q),
                    keys: Some(k),
                    values: Some(v),
                    gram: (cfg.scorer == ScorerKind::LaProx).then_some(&gram[..]),
                    ..Default::default()
                };
                let mut out = vec![0f32; HKV * (n - w)];
                let mut best = f64::INFINITY;
                for _ in 0..reps.max(1) {
                    let t = Instant::now();
                    score_layer(&cfg, &inputs, &mut out, &mut ws).unwrap();
                    best = best.min(t.elapsed().as_secs_f64());
                }
                if name == "knorm" {
                    // the row loads alone (every key row to f32, as the generic paths read them)
                    let mut row = vec![0f32; D];
                    let mut best_read = f64::INFINITY;
                    for _ in 0..reps.max(1) {
                        let t = Instant::now();
                        for h in 0..HKV {
                            for i in 0..n {
                                k.load_row(h, i, &mut row);
                                std::hint::black_box(&row);
                            }
                        }
                        best_read = best_read.min(t.elapsed().as_secs_f64());
                    }
                    println!(
                        "   rows {label:>5}: {:8.2} ms  (load_row of every key row)",
                        best_read * 1e3
                    );
                }
                let bits: Vec<u32> = out.iter().map(|x| x.to_bits()).collect();
                let same = match (&reference, label) {
                    (None, _) => {
                        reference = Some(bits);
                        "the dequantized values"
                    }
                    (_, "f16") => "those values rounded to f16",
                    (Some(r), _) if *r == bits => "scores equal f32's, bit for bit",
                    (Some(_), _) => panic!("{name} {label}: scores differ from f32's"),
                };
                println!("{name:>7} {label:>5}: {:8.2} ms  ({same})", best * 1e3);
            }
        }
    }
}
