//! Byte ranges of caller buffers, for the "outputs overlap no input" rule of the C layer
//! and of the device pipeline (host and device addresses are compared the same way).

use crate::error::{Error, Result};

/// A byte range `[start, end)`; empty ranges overlap nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span(pub usize, pub usize);

impl Span {
    pub const EMPTY: Span = Span(0, 0);
    pub fn overlaps(self, o: Span) -> bool {
        self.0 < self.1 && o.0 < o.1 && self.0 < o.1 && o.0 < self.1
    }
}

/// Span of `len` elements of `size` bytes at `addr`, checked against the address space.
pub(crate) fn span_of(addr: usize, len: usize, size: usize) -> Result<Span> {
    let bytes = len.checked_mul(size).ok_or(Error::Overflow)?;
    if bytes > isize::MAX as usize {
        return Err(Error::Overflow);
    }
    let end = addr.checked_add(bytes).ok_or(Error::Overflow)?;
    Ok(Span(addr, end))
}

/// Fail with `Aliasing` when any output overlaps any input or another output.
pub(crate) fn check_alias(outputs: &[Span], inputs: &[Span]) -> Result<()> {
    for (i, &o) in outputs.iter().enumerate() {
        if inputs.iter().any(|&x| o.overlaps(x)) || outputs[i + 1..].iter().any(|&x| o.overlaps(x))
        {
            return Err(Error::Aliasing);
        }
    }
    Ok(())
}
