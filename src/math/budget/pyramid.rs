//! PyramidKV (design §4): per-layer budgets fall linearly with depth, `beta = 20`.

/// Prefix budget of layer `l` of `layers` for an average of `b` per head.
pub fn pyramid_budget(b: u64, beta: u32, l: usize, layers: usize) -> u64 {
    if layers <= 1 {
        return b;
    }
    // exact in u128: `2b` and `l·(max-min)` overflow u64 for huge "keep all" budgets
    let (b, l, layers) = (b as u128, l as u128, layers as u128);
    let min = b / beta as u128;
    let max = 2 * b - min;
    (max - l * (max - min) / (layers - 1)).min(u64::MAX as u128) as u64
}
