//! Memory the launchers read and write in `uniqueness_device` (the conformance suite has its
//! own `DBuf`; merging the two is left): device memory with `cuda`,
//! host memory with the mock; and the tensors of tests/reference uploaded as device views.
#![allow(dead_code)] // each test uses its part

use super::reference::harness::Stored;
use kvevict::cuda::{kve_cuda_device_count, KveCudaView};
use kvevict::DType;
use std::ffi::c_void;

#[cfg(feature = "cuda")]
extern "C" {
    fn cudaMalloc(p: *mut *mut c_void, n: usize) -> i32;
    fn cudaFree(p: *mut c_void) -> i32;
    fn cudaMemcpy(dst: *mut c_void, src: *const c_void, n: usize, kind: i32) -> i32;
    fn cudaDeviceSynchronize() -> i32;
}

/// A buffer starting 256-byte aligned (cudaMalloc's alignment, and the mock's host copy).
pub struct Buf {
    pub p: *mut c_void,
    bytes: usize,
    #[cfg(not(feature = "cuda"))]
    _host: Vec<u64>,
}

/// `n` bytes from `src` to `dst` (`kind` 1: to the device, 2: back), synchronised.
unsafe fn copy(dst: *mut c_void, src: *const c_void, n: usize, kind: i32) {
    #[cfg(feature = "cuda")]
    {
        assert_eq!(cudaMemcpy(dst, src, n, kind), 0, "cudaMemcpy");
        assert_eq!(cudaDeviceSynchronize(), 0, "sync");
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = kind;
        std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n);
    }
}

impl Buf {
    pub fn up<T: Copy>(x: &[T]) -> Buf {
        let bytes = std::mem::size_of_val(x).max(8);
        #[cfg(feature = "cuda")]
        let b = {
            let mut p = std::ptr::null_mut();
            assert_eq!(unsafe { cudaMalloc(&mut p, bytes) }, 0, "cudaMalloc");
            Buf { p, bytes }
        };
        #[cfg(not(feature = "cuda"))]
        let b = {
            let mut h = vec![0u64; bytes.div_ceil(8) + 32];
            let at = (h.as_mut_ptr() as usize).next_multiple_of(256);
            Buf {
                p: at as *mut c_void,
                bytes,
                _host: h,
            }
        };
        // SAFETY: `bytes` fits both buffers.
        unsafe {
            copy(
                b.p,
                x.as_ptr() as *const c_void,
                std::mem::size_of_val(x),
                1,
            )
        };
        b
    }
    pub fn down<T: Copy + Default>(&self, n: usize) -> Vec<T> {
        let mut out = vec![T::default(); n];
        assert!(n * std::mem::size_of::<T>() <= self.bytes);
        // SAFETY: as above.
        unsafe {
            copy(
                out.as_mut_ptr() as *mut c_void,
                self.p,
                n * std::mem::size_of::<T>(),
                2,
            )
        };
        out
    }
}

#[cfg(feature = "cuda")]
impl Drop for Buf {
    fn drop(&mut self) {
        unsafe { cudaFree(self.p) };
    }
}

/// A device to run on: always with the mock; with CUDA, when the runtime sees one.
pub fn present() -> bool {
    let mut c = 0;
    let ok = unsafe { kve_cuda_device_count(&mut c) } == 0 && c > 0;
    if !ok {
        println!("skipped: no CUDA device");
    }
    ok
}

/// A device view of a stored tensor uploaded to `buf`.
pub fn dview(s: &Stored, buf: &Buf) -> KveCudaView {
    KveCudaView {
        data: buf.p,
        dtype: s.dtype as i32,
        reserved: 0,
        stride_head: s.stride[0] as i64,
        stride_token: s.stride[1] as i64,
        stride_dim: s.stride[2] as i64,
        heads: s.extent[0] as i64,
        tokens: s.extent[1] as i64,
        dim: s.extent[2] as i64,
    }
}

pub fn upload(s: &Stored) -> Buf {
    match s.dtype {
        DType::F32 => Buf::up(&s.f32),
        DType::F16 => Buf::up(&s.f16),
        DType::BF16 => Buf::up(&s.bf16),
    }
}
