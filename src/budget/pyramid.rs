//! PyramidKV (SPEC §4): per-layer budgets fall linearly with depth, `beta = 20`.

/// Prefix budget of layer `l` of `layers` for an average of `b` per head.
pub fn pyramid_budget(b: u64, beta: u32, l: usize, layers: usize) -> u64 {
    if layers <= 1 {
        return b;
    }
    let min = b / beta as u64;
    let max = 2 * b - min;
    max - (l as u64) * (max - min) / (layers as u64 - 1)
}
