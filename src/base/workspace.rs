//! The one workspace carver: typed parts cut off a caller's workspace in a fixed order,
//! so a size query and the call that uses the workspace share one layout. Host parts are
//! 64-byte aligned slices ([`Workspace`], sized by [`WorkspaceSize`]); device parts are
//! 256-byte aligned pointers into device memory (`DeviceCarve`, features `cuda`/`cuda-emu`).

use crate::error::{Error, Result};

/// Alignment of every host part (a cache line).
const HOST_ALIGN: usize = 64;

/// Bytes of `n` elements of `T`, rounded up to `align` (a power of two).
fn part_bytes<T>(n: usize, align: usize) -> Result<usize> {
    n.checked_mul(core::mem::size_of::<T>())
        .and_then(|b| b.checked_add(align - 1))
        .map(|b| b & !(align - 1))
        .ok_or(Error::Overflow)
}

/// Carves typed, 64-byte-aligned slices out of the caller's byte workspace.
pub struct Workspace<'a> {
    buf: &'a mut [u8],
}

/// Bytes a workspace needs for a list of (element size, count) requests, alignment included.
pub struct WorkspaceSize(pub usize);

impl WorkspaceSize {
    pub const fn new() -> Self {
        WorkspaceSize(0)
    }
    pub fn add<T>(&mut self, n: usize) -> Result<()> {
        let padded = part_bytes::<T>(n, HOST_ALIGN)?;
        self.0 = self.0.checked_add(padded).ok_or(Error::Overflow)?;
        Ok(())
    }
    /// The parts, and `HOST_ALIGN` more for the alignment of the first one.
    pub fn total(&self) -> usize {
        self.0 + HOST_ALIGN
    }
}

impl Default for WorkspaceSize {
    fn default() -> Self {
        Self::new()
    }
}

mod sealed {
    pub trait Pod: Copy + Default {}
    impl Pod for f32 {}
    impl Pod for f64 {}
    impl Pod for u32 {}
    impl Pod for u64 {}
    impl Pod for u128 {}
    impl Pod for u8 {}
}

impl<'a> Workspace<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        let off = buf.as_ptr().align_offset(HOST_ALIGN).min(buf.len());
        let (_, rest) = buf.split_at_mut(off);
        Workspace { buf: rest }
    }
    /// What is left, for scratch that is carved anew on every iteration.
    pub fn into_rest(self) -> &'a mut [u8] {
        self.buf
    }
    /// A zeroed slice of `n` elements.
    /// A zeroed slice of `n` elements.
    pub fn take<T: sealed::Pod>(&mut self, n: usize) -> Result<&'a mut [T]> {
        let s = self.take_dirty::<T>(n)?;
        s.fill(T::default());
        Ok(s)
    }
    /// A slice of `n` elements holding whatever the workspace held (any bit pattern is a
    /// valid `T`), for large buffers written before they are read: no zeroing pass.
    pub fn take_dirty<T: sealed::Pod>(&mut self, n: usize) -> Result<&'a mut [T]> {
        let padded = part_bytes::<T>(n, HOST_ALIGN)?;
        let bytes = n * core::mem::size_of::<T>(); // no overflow: `padded` is larger
        let buf = core::mem::take(&mut self.buf);
        if padded > buf.len() && bytes > buf.len() {
            self.buf = buf;
            return Err(Error::WorkspaceTooSmall);
        }
        let cut = padded.min(buf.len());
        let (head, rest) = buf.split_at_mut(cut);
        self.buf = rest;
        // SAFETY: head is 64-byte aligned (every cut is a multiple of 64 from an aligned
        // start), at least `bytes` long, and T is plain data valid for any bit pattern.
        Ok(unsafe { core::slice::from_raw_parts_mut(head.as_mut_ptr() as *mut T, n) })
    }
}

/// Carves 256-aligned parts off a device workspace (cudaMalloc gives 256). With a null
/// base it only adds up sizes, so the size query and the call share one layout.
#[cfg(feature = "cuda")]
pub(crate) struct DeviceCarve {
    base: *mut u8,
    off: usize,
}

#[cfg(feature = "cuda")]
impl DeviceCarve {
    /// Alignment of every device part.
    pub const ALIGN: usize = 256;
    pub fn new(base: *mut core::ffi::c_void) -> DeviceCarve {
        DeviceCarve {
            base: base as *mut u8,
            off: 0,
        }
    }
    /// `count` elements of `T`; a null pointer for `count == 0`.
    pub fn take<T>(&mut self, count: usize) -> Result<*mut T> {
        if count == 0 {
            return Ok(core::ptr::null_mut());
        }
        let at = self.off;
        let padded = part_bytes::<T>(count, Self::ALIGN)?;
        self.off = at.checked_add(padded).ok_or(Error::Overflow)?;
        Ok(if self.base.is_null() {
            core::ptr::null_mut()
        } else {
            self.base.wrapping_add(at) as *mut T
        })
    }
    /// Bytes of every part taken so far.
    pub fn bytes(&self) -> usize {
        self.off
    }
}
