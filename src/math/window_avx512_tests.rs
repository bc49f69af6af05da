//! The AVX-512 kernels of the window pass (`kernels/cpu/x86/`: `gemm512`, `softmax512`) give
//! the bits of the 8-lane pass they replace (`window`'s generic kernels on AVX2). Here, above
//! both, so that the kernels never import the window pass.

use crate::colstats::{Needs, Stats};
use crate::numerics::{has_avx2, Avx2};
use crate::window::{self, gemm_tiles, tests::vals};
use crate::{gemm512, softmax512};
use std::vec;
use std::vec::Vec;

/// Logits in [-40, 6) with masked (-inf) lanes and exact ±0 ties.
fn logits(n: usize, seed: u64) -> Vec<f32> {
    let mut v = vals(n, seed, 23.0);
    for (i, x) in v.iter_mut().enumerate() {
        *x = match (i * 7 + seed as usize) % 23 {
            0 => f32::NEG_INFINITY,
            1 => 0.0,
            2 => -0.0,
            _ => *x - 17.0,
        };
    }
    v
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pass1_avx2(nb: usize, c: &[f32], nt: usize, rp: usize, m: &[f32]) -> [f32; 64] {
    let mut o = [0f32; 64];
    let (cp, mp) = (c.as_ptr(), m.as_ptr());
    let (mx, cs) = (o.as_mut_ptr(), o[32..].as_mut_ptr());
    // SAFETY: `c` holds nt rows of rp >= 8·nb floats, `m` and `o`'s halves 32
    unsafe {
        match nb {
            4 => window::max_expsum::<Avx2, 4>(cp, nt, rp, mp, mx, cs),
            3 => window::max_expsum::<Avx2, 3>(cp, nt, rp, mp, mx, cs),
            2 => window::max_expsum::<Avx2, 2>(cp, nt, rp, mp, mx, cs),
            _ => window::max_expsum::<Avx2, 1>(cp, nt, rp, mp, mx, cs),
        }
    }
    o
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Pass 1 on 16 lanes gives the 8-lane bits (maxima, signed zeros included, and exp
/// sums) for 1-4 blocks, rows wider than the blocks, and every key count to 2 chunks.
#[test]
fn max_expsum_matches_avx2_bits() {
    if !(has_avx2() && gemm512::available()) {
        return; // nothing to compare on this CPU
    }
    for nb in 1..=4 {
        for rp in [8 * nb, 8 * nb + 16] {
            for nt in (1..=20).chain([95, 96, 97, 192]) {
                let c = logits(nt * rp, (nb * 1000 + rp * 10 + nt) as u64);
                // running maxima: -inf (first chunk), or values around the chunk's
                for m in [vec![f32::NEG_INFINITY; 32], logits(32, nt as u64)] {
                    // SAFETY: the CPU was checked above; `c` holds nt rows of rp floats
                    let a = unsafe { pass1_avx2(nb, &c, nt, rp, &m) };
                    let mut b = [0f32; 64];
                    let (mx, cs) = b.split_at_mut(32);
                    // SAFETY: as above
                    unsafe {
                        softmax512::max_expsum(
                            nb,
                            c.as_ptr(),
                            nt,
                            rp,
                            m.as_ptr(),
                            mx.as_mut_ptr(),
                            cs.as_mut_ptr(),
                        )
                    };
                    let k = 8 * nb;
                    assert_eq!(bits(&a[..k]), bits(&b[..k]), "max nb {nb} rp {rp} nt {nt}");
                    assert_eq!(
                        bits(&a[32..32 + k]),
                        bits(&b[32..32 + k]),
                        "sum nb {nb} rp {rp} nt {nt}"
                    );
                }
            }
        }
    }
}

/// Pass 2 at w = 8 on 16 lanes gives the 8-lane bits (sums and squares, added to what
/// the outputs held) for 1-6 heads, masked lanes and offsets into the prefix.
#[test]
fn column_sums_w8_matches_avx2_bits() {
    if !(has_avx2() && gemm512::available()) {
        return; // nothing to compare on this CPU
    }
    for g in 1..=6 {
        let rp = 8 * g;
        for nt8 in [8, 16, 96] {
            let (c0, p) = (24, 24 + nt8 + 5);
            let src = logits(nt8 * rp, (g * 100 + nt8) as u64);
            let m: Vec<f32> = logits(rp, g as u64).iter().map(|x| x.abs() + 6.0).collect();
            let inv: Vec<f32> = (0..rp).map(|r| 1.0 / (r as f32 + 1.5)).collect();
            for (sum, sq) in [(true, false), (false, true), (true, true)] {
                let needs = Needs {
                    sum,
                    sq,
                    cross: false,
                };
                let start = logits(g * p, 7)
                    .iter()
                    .map(|x| x.abs().min(3.0))
                    .collect::<Vec<_>>();
                let (mut s1, mut q1, mut s2, mut q2) =
                    (start.clone(), start.clone(), start.clone(), start.clone());
                let (mut x1, mut x2) = (vec![], vec![]);
                let mut o1 = Stats {
                    sum: &mut s1,
                    sq: &mut q1,
                    cross: &mut x1,
                };
                // SAFETY: the CPU was checked above; `src` holds nt8 rows of rp floats, `m`
                // and `inv` rp
                unsafe {
                    let s = src.as_ptr();
                    window::fused_stats::<Avx2, false>(
                        s, c0, nt8, p, g, 8, rp, &m, &inv, needs, &mut o1,
                    )
                };
                let mut o2 = Stats {
                    sum: &mut s2,
                    sq: &mut q2,
                    cross: &mut x2,
                };
                // SAFETY: as above
                unsafe {
                    softmax512::column_sums_w8(
                        src.as_ptr(),
                        c0,
                        nt8,
                        p,
                        g,
                        &m,
                        &inv,
                        needs,
                        &mut o2,
                    )
                };
                assert_eq!(bits(&s1), bits(&s2), "sum g {g} nt8 {nt8}");
                assert_eq!(bits(&q1), bits(&q2), "sq g {g} nt8 {nt8}");
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_avx2(q: &[f32], dk: usize, rp: usize, k: &[f32], ldk: usize, c: &mut [f32]) -> bool {
    // SAFETY: `k` holds `k.len() / ldk` rows of `ldk` floats; the caller checked the CPU.
    unsafe { gemm_tiles::<Avx2>(q, dk, rp, k.as_ptr(), ldk, k.len() / ldk, c) }
}

/// The AVX-512 kernel gives the AVX2 kernel's bits and finiteness verdict for every row
/// count up to 2 slot groups (with and without an 8-row panel), odd dims, padded key
/// strides, and NaN/Inf keys.
#[test]
fn avx512_matches_avx2_bits() {
    if !(gemm512::available() && has_avx2()) {
        return; // nothing to compare on this CPU
    }
    let mut x = 11u64;
    let mut val = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    for rp in (8..=136).step_by(8) {
        for (dk, ldk) in [(5, 5), (32, 36), (64, 70), (128, 128)] {
            for ntp in [6, 12, 18, 24, 30, 96] {
                let q: Vec<f32> = (0..rp * dk).map(|_| val()).collect();
                let mut k: Vec<f32> = (0..ntp * ldk).map(|_| val()).collect();
                for bad in [None, Some(f32::NAN), Some(f32::NEG_INFINITY)] {
                    if let Some(b) = bad {
                        k[(ntp - 1) * ldk + dk - 1] = b;
                    }
                    let (mut c1, mut c2) = (vec![0f32; ntp * rp], vec![1f32; ntp * rp]);
                    // SAFETY: k holds ntp rows of ldk >= dk floats; both CPUs checked.
                    let f1 =
                        unsafe { gemm512::gemm(&q, dk, rp, k.as_ptr(), ldk, ntp, &mut c1, true) };
                    // SAFETY: k holds ntp rows of ldk >= dk floats; has_avx2 checked the CPU.
                    let f2 = unsafe { gemm_avx2(&q, dk, rp, &k, ldk, &mut c2) };
                    assert_eq!(f1, f2, "rp {rp} dk {dk} ntp {ntp} {bad:?}");
                    assert_eq!(f1, bad.is_none());
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&c1), bits(&c2), "rp {rp} dk {dk} ntp {ntp} {bad:?}");
                }
            }
        }
    }
}
