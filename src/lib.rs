#![no_std]
#[cfg(feature = "std")]
extern crate std;
