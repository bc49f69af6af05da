//! An engine's own query ring, written by its compute graph (llama.cpp: a `set_rows` of each
//! layer's post-RoPE queries after the layer's `Qcur`): per sequence `window` rows
//! (`seq * window + slot`, the `k`-th query of a sequence in slot `k % window`) and one
//! scratch row after them (`n_seqs * window`). A graph writes a ubatch's rows at once, in
//! no defined order, so a token that a later token of its sequence in the same ubatch
//! overwrites goes to the scratch row instead; the ring then holds each sequence's last
//! `window` queries. The evictor's own ring (`observe_queries`) is the host-side form.

use crate::error::{Error, Result};

/// Each token's ring row for a ubatch: token `i` of sequence `seq_of[i]` (a sequence
/// `0..counts.len()`, anything else: none, the scratch row) and `counts[s]` the queries
/// of `s` written so far (advanced by the ubatch's). `rows[..seq_of.len()]` gets the
/// rows. `window >= 1`, `rows` long enough, the rows within `i64` (else
/// `InvalidArgument`, nothing written). O(tokens), no memory.
pub fn ring_rows(counts: &mut [u64], window: u32, seq_of: &[i32], rows: &mut [i64]) -> Result<()> {
    let w = window as u64;
    let scratch = (counts.len() as u64)
        .checked_mul(w)
        .filter(|&s| w >= 1 && s < i64::MAX as u64)
        .ok_or(Error::InvalidArgument)?;
    if rows.len() < seq_of.len() || counts.iter().any(|&c| c > u64::MAX - seq_of.len() as u64) {
        return Err(Error::InvalidArgument);
    }
    let n = counts.len();
    let seq = |s: i32| usize::try_from(s).ok().filter(|&s| s < n);
    // each token's arrival index in its sequence; then the counts are the final ones
    for (r, &s) in rows.iter_mut().zip(seq_of) {
        *r = match seq(s) {
            Some(s) => {
                counts[s] += 1;
                (counts[s] - 1) as i64
            }
            None => -1,
        };
    }
    for (r, &s) in rows.iter_mut().zip(seq_of) {
        *r = match seq(s) {
            // overwritten by a later token of this ubatch: the scratch row
            Some(s) if (*r as u64) + w >= counts[s] => (s as u64 * w + *r as u64 % w) as i64,
            _ => scratch as i64,
        };
    }
    Ok(())
}
