//! How the engines' pool kinds keep a model's K and V in buffers, shared by the paged
//! tests (`tests/paged.rs`, `tests/evictor_paged.rs`, `tests/device/paged.rs`): separate K and V tensors per layer
//! (NHD, HND), K and V stacked per layer (the `*_KV_*` kinds), or every layer in one
//! buffer (TensorRT-LLM).
#![allow(dead_code)] // each test file uses its own subset

use kvevict::paged::{PagedKind, PagedLayout};
use kvevict::Error;

#[path = "../xorshift/mod.rs"]
mod xorshift;
pub use xorshift::Rng;

pub const KINDS: [PagedKind; 6] = [
    PagedKind::Nhd,
    PagedKind::NhdKvInner,
    PagedKind::NhdKvOuter,
    PagedKind::Hnd,
    PagedKind::HndKvInner,
    PagedKind::TrtLlm,
];

/// Buffers a model of `layers` layers takes in pools of `kind`.
pub fn buffers(kind: PagedKind, layers: usize) -> usize {
    match kind {
        PagedKind::Nhd | PagedKind::Hnd => 2 * layers,
        PagedKind::TrtLlm => 1,
        _ => layers,
    }
}

/// The buffer holding layer `l`'s K (`kv` 0) or V (1).
pub fn buf_of(kind: PagedKind, l: usize, kv: usize) -> usize {
    match kind {
        PagedKind::Nhd | PagedKind::Hnd => 2 * l + kv,
        PagedKind::TrtLlm => 0,
        _ => l,
    }
}

/// `PagedLayout::new`'s `(layers, layer, kv)` for layer `l`'s K or V.
pub fn tensor_args(kind: PagedKind, layers: usize, l: usize, kv: usize) -> (usize, usize, usize) {
    match kind {
        PagedKind::TrtLlm => (layers, l, kv),
        PagedKind::Nhd | PagedKind::Hnd => (1, 0, 0),
        _ => (1, 0, kv),
    }
}

/// Elements buffer `b` needs: the longest of the tensors it holds (`layout(l, kv)`).
pub fn buffer_len(
    kind: PagedKind,
    layers: usize,
    b: usize,
    layout: impl Fn(usize, usize) -> PagedLayout,
) -> usize {
    (0..layers)
        .flat_map(|l| [(l, 0), (l, 1)])
        .filter(|&(l, kv)| buf_of(kind, l, kv) == b)
        .map(|(l, kv)| layout(l, kv).required_len().unwrap())
        .max()
        .unwrap()
}

/// The fault a block table's first `used` entries make for a pool of `nb` blocks (the
/// table holds at least `used`): entries in order, the first out of the pool
/// (`OutOfBounds`) or repeated (`Aliasing`) decides; `None` when they are valid.
pub fn table_fault(table: &[u32], used: usize, nb: usize) -> Option<Error> {
    (0..used).find_map(|i| {
        if table[i] as usize >= nb {
            Some(Error::OutOfBounds)
        } else if table[..i].contains(&table[i]) {
            Some(Error::Aliasing)
        } else {
            None
        }
    })
}
