//! Compaction (design §5): move the kept K/V rows, order kept, positions untouched.
//! A layer's selection is `offsets[Hkv + 1]` (absolute, into `indices`) with ascending
//! positions per head — the slice of [`crate::select_model`]'s output for that layer.
//! Every list is validated before the first byte moves.

use crate::error::{Error, Result};
use crate::view::{View, ViewMut};

/// Check one layer's CSR against `heads` heads of `n` tokens; returns the total kept.
pub fn validate_selection(
    offsets: &[u64],
    indices: &[u32],
    heads: usize,
    n: usize,
) -> Result<usize> {
    if offsets.len() < heads + 1 {
        return Err(Error::ShapeMismatch);
    }
    let base = offsets[0];
    for h in 0..heads {
        let (a, b) = (offsets[h], offsets[h + 1]);
        if b < a || b as usize > indices.len() {
            return Err(Error::InvalidArgument);
        }
        let list = &indices[a as usize..b as usize];
        if list.len() > n {
            return Err(Error::InvalidArgument);
        }
        let mut prev: Option<u32> = None;
        for &i in list {
            if i as usize >= n || prev.is_some_and(|p| i <= p) {
                return Err(Error::InvalidArgument);
            }
            prev = Some(i);
        }
    }
    Ok((offsets[heads] - base) as usize)
}

/// Head-major in place: for every head, kept rows to the front (`[Hkv, cap, d]`, ragged).
/// The view may be K or V in any layout whose rows do not overlap; token-row layouts with
/// one shared set per layer work the same way. Writes `lengths[h]` when given.
pub fn compact_in_place(
    kv: &mut ViewMut,
    offsets: &[u64],
    indices: &[u32],
    lengths: Option<&mut [u32]>,
) -> Result<()> {
    let [heads, n, _] = kv.extent();
    validate_selection(offsets, indices, heads, n)?;
    if kv.rows_overlap() {
        return Err(Error::Aliasing);
    }
    if let Some(l) = lengths.as_ref() {
        if l.len() < heads {
            return Err(Error::OutputTooSmall);
        }
    }
    for h in 0..heads {
        let list = &indices[offsets[h] as usize..offsets[h + 1] as usize];
        // ascending and distinct, so row r <= list[r]: moving forward never overwrites a
        // row that is still to be read
        for (r, &t) in list.iter().enumerate() {
            kv.move_row(h, t as usize, r);
        }
    }
    if let Some(l) = lengths {
        for h in 0..heads {
            l[h] = (offsets[h + 1] - offsets[h]) as u32;
        }
    }
    Ok(())
}

/// Flattened varlen, out of place: kept rows of every head, head after head, into `dst`
/// (`[1, total, d]` rows), and `cu_seqlens[Hkv + 1]` (flash-attention varlen, AdaKV decode).
pub fn compact_varlen(
    src: &View,
    offsets: &[u64],
    indices: &[u32],
    dst: &mut ViewMut,
    cu_seqlens: &mut [i32],
) -> Result<()> {
    let [heads, n, d] = src.extent();
    let total = validate_selection(offsets, indices, heads, n)?;
    let [_, cap, dd] = dst.extent();
    if dd != d || dst.dtype() != src.dtype() {
        return Err(Error::ShapeMismatch);
    }
    // rows of a block type move as whole blocks: not from a view with swapped axes
    if src.dtype().is_quantized() && src.stride()[2] != 1 {
        return Err(Error::InvalidArgument);
    }
    if cap < total || cu_seqlens.len() < heads + 1 || total > i32::MAX as usize {
        return Err(Error::OutputTooSmall);
    }
    let (a0, a1) = src.byte_range();
    let (b0, b1) = dst.byte_range();
    if a0 < b1 && b0 < a1 {
        return Err(Error::Aliasing);
    }
    if dst.rows_overlap() {
        return Err(Error::Aliasing);
    }
    let mut o = 0usize;
    for h in 0..heads {
        cu_seqlens[h] = o as i32;
        for &t in &indices[offsets[h] as usize..offsets[h + 1] as usize] {
            dst.copy_row_from(0, o, src, h, t as usize);
            o += 1;
        }
    }
    cu_seqlens[heads] = o as i32;
    Ok(())
}
