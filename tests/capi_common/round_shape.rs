//! The model and stream shape of the round tests (`tests/capi_round.rs` on the host,
//! `tests/capi_cuda/round.rs` on the device), so both run the same shapes.
#![allow(dead_code)]

pub const L: usize = 2;
pub const HQ: usize = 4;
pub const HKV: usize = 2;
pub const D: usize = 32;
pub const S: usize = 56; // the stream's cells
pub const MAX: usize = 36; // max_cells
pub const DM: usize = 16; // Wo's columns
