//! The dimensions of a whole model's scores, checked in one place: the host selection,
//! the sharded search and the device selection build a [`ModelShape`] and so return the
//! same status for the same dimensions.

use crate::error::{Error, Result, MAX_LAYERS, MAX_TOKENS};

/// Most selection units (`layers · hkv`): unit ids take 31 bits of a selection key.
pub const MAX_UNITS: u64 = crate::error::MAX_UNITS as u64;

/// Dimensions of scores `[layers][hkv][P]`, `P = n - window` (window clamped to `n`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelShape {
    pub layers: usize,
    pub hkv: usize,
    /// Tokens in the cache, window included.
    pub n: usize,
    /// Window tokens, `min(window, n)`: always kept, never scored.
    pub window: usize,
}

impl ModelShape {
    /// Zero dimensions and more than `MAX_LAYERS` layers are `InvalidArgument`; `n` past
    /// `MAX_TOKENS` or more than [`MAX_UNITS`] units are `Overflow` (in this order).
    pub fn new(layers: u64, hkv: u64, n: u64, window: u64) -> Result<ModelShape> {
        if layers == 0 || hkv == 0 || n == 0 {
            return Err(Error::InvalidArgument);
        }
        if n > MAX_TOKENS as u64 || layers.checked_mul(hkv).map_or(true, |u| u > MAX_UNITS) {
            return Err(Error::Overflow);
        }
        if layers > MAX_LAYERS as u64 {
            return Err(Error::InvalidArgument);
        }
        // every value fits 31 bits now, so a 32-bit usize holds it
        Ok(ModelShape {
            layers: layers as usize,
            hkv: hkv as usize,
            n: n as usize,
            window: window.min(n) as usize,
        })
    }
    /// Prefix tokens per unit (the scored ones).
    pub fn prefix(&self) -> usize {
        self.n - self.window
    }
    /// `layers · hkv`.
    pub fn units(&self) -> usize {
        self.layers * self.hkv
    }
}
