//! A layer's scores raised to an integer power, sign kept (`ScoreConfig::power`).
//!
//! Why: every order within a head stays, but once the selection divides each layer by its
//! sum and adds heads and layers (token granularity), a head's few high peaks weigh more
//! against heads of many middling scores. LaProx-span cubes its scores: at 2.5 % kept the
//! needle's peak in one head lost to the summed mass of others (eval/README).
//!
//! Exact definition, shared bit for bit by the CUDA launcher `kve_cuda_score_power`:
//! `a = |s|`, `r = a`, then `power - 1` times `r = r · a` (f32, rounded each time, no
//! fused operation), `r` saturated at `f32::MAX`, and `s`'s sign put back. Finite in,
//! finite out; a score of `f32::MAX` (CriticalKV's forced tokens) stays `f32::MAX`.

/// `s ↦ sign(s) · min(|s|^power, f32::MAX)` in place, by repeated f32 products.
pub fn raise(power: u32, scores: &mut [f32]) {
    if power <= 1 {
        return;
    }
    for s in scores {
        *s = raised(power, *s);
    }
}

/// One score (see the module docs).
#[inline]
pub fn raised(power: u32, s: f32) -> f32 {
    const SIGN: u32 = 0x8000_0000;
    let a = f32::from_bits(s.to_bits() & !SIGN);
    let mut r = a;
    for _ in 1..power {
        r *= a;
    }
    if r > f32::MAX {
        r = f32::MAX; // (a NaN stays NaN, as on the device)
    }
    f32::from_bits(r.to_bits() | (s.to_bits() & SIGN))
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn keeps_sign_order_and_saturates() {
        let mut s = [2.0f32, -2.0, 0.5, -0.0, 0.0, f32::MAX, -1e30, 1e-30];
        raise(3, &mut s);
        assert_eq!(&s[..4], &[8.0, -8.0, 0.125, -0.0]);
        assert!(s[3].is_sign_negative());
        assert_eq!(s[4], 0.0);
        assert_eq!(s[5], f32::MAX);
        assert_eq!(s[6], -f32::MAX);
        assert_eq!(s[7], 0.0); // underflows to +0
        let mut one = [1.5f32, -3.0];
        raise(1, &mut one);
        assert_eq!(one, [1.5, -3.0]);
        // the same order as the input, within a head
        let v: [f32; 6] = [-3.0, -1.0, -0.5, 0.25, 0.7, 4.0];
        for p in 1..=crate::config::MAX_SCORE_POWER {
            let r: Vec<f32> = v.iter().map(|&x| raised(p, x)).collect();
            assert!(r.windows(2).all(|w| w[0] <= w[1]), "power {p}: {r:?}");
        }
    }
}
