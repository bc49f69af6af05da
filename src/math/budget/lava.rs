//! LAVa's layer budgets (design §4): proportional to the normalised entropy of each layer's
//! scores, rounded by largest remainder, clamped to what a layer has, the excess handed to
//! layers below their cap. Cascade mode calls [`lava_budgets`] again over the layers seen
//! so far with their stored entropies.

/// `-Σ p ln p` with `p = |s| / Σ|s|` over a layer's scores (all heads, prefix). f64 sums.
pub fn layer_entropy(scores: &[f32]) -> f64 {
    let total: f64 = scores.iter().map(|&s| (s as f64).abs()).sum();
    if total <= 0.0 {
        return 0.0;
    }
    let mut e = 0f64;
    for &s in scores {
        let p = (s as f64).abs() / total;
        if p > 0.0 {
            e -= p * libm::log(p);
        }
    }
    e
}

/// Split `total` over layers in proportion to `weights` (all-zero weights: equal split),
/// each at most `caps[l]`. Writes `out[l]`; returns what could not be placed (0 unless
/// `total > Σ caps`). `mark` is scratch, one flag per layer.
pub fn lava_budgets(
    weights: &[f64],
    total: u64,
    caps: &[u64],
    out: &mut [u64],
    mark: &mut [u8],
) -> u64 {
    let n = weights.len();
    let (out, mark, caps) = (&mut out[..n], &mut mark[..n], &caps[..n]);
    out.fill(0);
    let mut left = total;
    loop {
        // a layer is open while below its cap
        let open = |out: &[u64], l: usize| out[l] < caps[l];
        let active = (0..n).filter(|&l| open(out, l)).count();
        if left == 0 || active == 0 {
            return left;
        }
        let wsum: f64 = (0..n)
            .filter(|&l| open(out, l))
            .map(|l| weights[l].max(0.0))
            .sum();
        let share = |l: usize| {
            if wsum > 0.0 {
                weights[l].max(0.0) / wsum * left as f64
            } else {
                left as f64 / active as f64
            }
        };
        mark.fill(0);
        for l in 0..n {
            mark[l] = open(out, l) as u8;
        }
        let mut given = 0u64;
        for l in 0..n {
            if mark[l] != 0 {
                let f = libm::floor(share(l)) as u64;
                out[l] += f;
                given += f;
            }
        }
        // largest remainders, one token each, ties to the lower layer
        let mut rest = left.saturating_sub(given);
        while rest > 0 {
            let mut best = usize::MAX;
            let mut bf = -1.0;
            for l in 0..n {
                if mark[l] != 0 {
                    let s = share(l);
                    if s - libm::floor(s) > bf {
                        bf = s - libm::floor(s);
                        best = l;
                    }
                }
            }
            if best == usize::MAX {
                break;
            }
            out[best] += 1;
            mark[best] = 0;
            rest -= 1;
        }
        let mut excess = rest;
        for l in 0..n {
            if out[l] > caps[l] {
                excess += out[l] - caps[l];
                out[l] = caps[l];
            }
        }
        if excess == left {
            return left; // nothing could be placed
        }
        left = excess;
    }
}
