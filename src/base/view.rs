//! Strided 3-D tensor views over memory the caller owns: (head, token, dim) for K, V and
//! queries; (head, row, col) for `Wo`. One descriptor covers head-major `[H, N, d]`,
//! llama.cpp's token-major rows `[N, H*d]` and its transposed V `[H*d, N]`.
//!
//! Views of ggml's block types (`Q8_0`, `Q4_0`) count values too, and have whole-block
//! rows ([`whole_blocks`]: `len`, the row length and the outer strides multiples of 32,
//! unit value stride; else `InvalidArgument`): a row loads dequantized (ggml's arithmetic)
//! and moves as its bytes.

use crate::error::{add, mul, Error, Result};
use core::marker::PhantomData;
use half::{bf16, f16};

pub use crate::dtype::DType;
use crate::numerics::Simd;

/// Highest element offset a view touches, checked; `None` extent product means empty.
fn last_offset(extent: [usize; 3], stride: [usize; 3]) -> Result<usize> {
    let mut off = 0usize;
    for a in 0..3 {
        off = add(off, mul(extent[a] - 1, stride[a])?)?;
    }
    Ok(off)
}

fn check_layout(
    ptr: usize,
    len: usize,
    dtype: DType,
    extent: [usize; 3],
    stride: [usize; 3],
) -> Result<()> {
    if ptr == 0 {
        return Err(Error::NullPointer);
    }
    if ptr % dtype.align() != 0 {
        return Err(Error::Misaligned);
    }
    dtype.bytes(len).ok_or(Error::Overflow)?;
    if extent.contains(&0) {
        return Err(Error::InvalidArgument);
    }
    if extent[1] > crate::error::MAX_TOKENS {
        return Err(Error::Overflow);
    }
    if dtype.is_quantized() && !whole_blocks(len, extent, stride) {
        return Err(Error::InvalidArgument);
    }
    let last = last_offset(extent, stride)?;
    if last >= len {
        return Err(Error::OutOfBounds);
    }
    Ok(())
}

/// The layout a view of a block-quantized dtype must have: whole blocks in the buffer
/// (`len`) and in every row (row length and outer strides multiples of 32, unit value
/// stride), so a row is `extent[2] / 32` blocks, contiguous and starting on a block.
pub fn whole_blocks(len: usize, extent: [usize; 3], stride: [usize; 3]) -> bool {
    let q = crate::dtype::QK;
    len % q == 0 && extent[2] % q == 0 && stride[2] == 1 && stride[0] % q == 0 && stride[1] % q == 0
}

/// Element `off` of a buffer of `dtype` as f32 (of a block type: value `off`, from its
/// block).
///
/// # Safety
/// `ptr` points to at least `off + 1` readable, aligned elements of `dtype` (of a block
/// type: the whole block holding value `off`).
#[inline(always)]
unsafe fn load(ptr: *const u8, dtype: DType, off: usize) -> f32 {
    // SAFETY: the caller's contract: element `off` (its block) is in bounds and aligned.
    unsafe {
        match dtype {
            DType::F32 => *(ptr as *const f32).add(off),
            DType::F16 => (*(ptr as *const f16).add(off)).to_f32(),
            DType::BF16 => (*(ptr as *const bf16).add(off)).to_f32(),
            DType::Q8_0 | DType::Q4_0 => {
                let (q, bb) = (crate::dtype::QK, dtype.block_bytes());
                let block = core::slice::from_raw_parts(ptr.add(off / q * bb), bb);
                crate::dtype::block_value(dtype, block, off % q)
            }
        }
    }
}

/// `from_raw` of `View` (`*const u8`) and `ViewMut` (`*mut u8`): the layout checked by
/// [`check_layout`], then the view.
macro_rules! raw_constructor {
    ($(#[$doc:meta])* $raw:ty) => {
        $(#[$doc])*
        pub unsafe fn from_raw(
            ptr: $raw,
            len: usize,
            dtype: DType,
            extent: [usize; 3],
            stride: [usize; 3],
        ) -> Result<Self> {
            check_layout(ptr as usize, len, dtype, extent, stride)?;
            Ok(Self {
                ptr,
                len,
                dtype,
                extent,
                stride,
                _life: PhantomData,
            })
        }
    };
}

/// `f32` / `f16` / `bf16` constructors over typed slices, for `View` and `ViewMut`.
macro_rules! typed_constructors {
    ($f32:ty, $f16:ty, $bf16:ty, $ptr:ident, $raw:ty) => {
        pub fn f32(data: $f32, extent: [usize; 3], stride: [usize; 3]) -> Result<Self> {
            // SAFETY: a borrowed slice is valid for its length and lifetime.
            unsafe { Self::from_raw(data.$ptr() as $raw, data.len(), DType::F32, extent, stride) }
        }
        pub fn f16(data: $f16, extent: [usize; 3], stride: [usize; 3]) -> Result<Self> {
            // SAFETY: a borrowed slice is valid for its length and lifetime.
            unsafe { Self::from_raw(data.$ptr() as $raw, data.len(), DType::F16, extent, stride) }
        }
        pub fn bf16(data: $bf16, extent: [usize; 3], stride: [usize; 3]) -> Result<Self> {
            // SAFETY: a borrowed slice is valid for its length and lifetime.
            unsafe { Self::from_raw(data.$ptr() as $raw, data.len(), DType::BF16, extent, stride) }
        }
    };
}

/// The constructor over raw bytes of any dtype (ggml's `q8_0`/`q4_0` blocks, or f32/f16/bf16
/// as bytes), for `View` and `ViewMut`.
macro_rules! bytes_constructor {
    ($bytes:ty, $ptr:ident, $raw:ty) => {
        /// A view of `data` holding elements of `dtype` (a block type: whole blocks), extents
        /// and strides in elements (values): `data.len()` must be a whole number of elements
        /// (blocks), else `InvalidArgument`; `data` aligned for `dtype` (`Misaligned`).
        pub fn bytes(
            data: $bytes,
            dtype: DType,
            extent: [usize; 3],
            stride: [usize; 3],
        ) -> Result<Self> {
            if data.len() % dtype.block_bytes() != 0 {
                return Err(Error::InvalidArgument);
            }
            let len = data.len() / dtype.block_bytes() * dtype.block_len();
            // SAFETY: a borrowed slice is valid for its length and lifetime; `len` elements
            // of `dtype` are exactly its bytes.
            unsafe { Self::from_raw(data.$ptr() as $raw, len, dtype, extent, stride) }
        }
    };
}

/// The accessors `View` and `ViewMut` share (the same fields).
macro_rules! accessors {
    () => {
        pub fn dtype(&self) -> DType {
            self.dtype
        }
        pub fn extent(&self) -> [usize; 3] {
            self.extent
        }
        pub fn stride(&self) -> [usize; 3] {
            self.stride
        }
        /// Start and end (exclusive) address of the declared buffer, for alias checks.
        pub fn byte_range(&self) -> (usize, usize) {
            let s = self.ptr as usize;
            // `len` is whole blocks (checked at construction), so this is its byte size
            (
                s,
                s + self.len / self.dtype.block_len() * self.dtype.block_bytes(),
            )
        }
    };
}

/// The struct of `View` (`*const u8`, borrowing `&'a [u8]`) and `ViewMut` (`*mut u8`,
/// `&'a mut [u8]`): the fields the macros above build and read.
macro_rules! view_struct {
    ($(#[$attr:meta])* $name:ident, $raw:ty, $borrow:ty) => {
        $(#[$attr])*
        pub struct $name<'a> {
            ptr: $raw,
            len: usize,
            dtype: DType,
            extent: [usize; 3],
            stride: [usize; 3],
            _life: PhantomData<$borrow>,
        }
    };
}

view_struct!(
    /// A read-only strided view. Construction validates pointer, alignment and bounds, so every
    /// access through it stays inside the declared buffer.
    #[derive(Clone, Copy, Debug)]
    View, *const u8, &'a [u8]
);

// SAFETY: a View stands for the borrow `&'a [u8]` it was made from (`_life`) and only ever
// reads plain numbers through `ptr`, so it may move to another thread like that borrow.
unsafe impl Send for View<'_> {}
// SAFETY: no interior mutability: threads sharing a View only read, as through `&[u8]`.
unsafe impl Sync for View<'_> {}

impl<'a> View<'a> {
    raw_constructor!(
        /// # Safety
        /// `ptr` must point to `len` readable elements of `dtype` (of a block type: `len / 32`
        /// blocks, [`DType::bytes`]) that stay valid and unmodified
        /// for `'a`. Everything else (null, alignment, bounds, overflow) is checked here.
        *const u8
    );
    typed_constructors!(&'a [f32], &'a [f16], &'a [bf16], as_ptr, *const u8);
    bytes_constructor!(&'a [u8], as_ptr, *const u8);
    /// Contiguous row-major `[a, b, c]` f32 data.
    pub fn f32_contiguous(data: &'a [f32], extent: [usize; 3]) -> Result<Self> {
        Self::f32(data, extent, [extent[1] * extent[2], extent[2], 1])
    }
    /// The same elements with the last two axes swapped (`(a, b, c)` read as `(a, c, b)`):
    /// rows along axis 1, e.g. token rows of a transposed V. (Of a block type, the result
    /// reads value by value from each value's block, every one inside the buffer as before.)
    pub fn swap_last(&self) -> View<'a> {
        View {
            extent: [self.extent[0], self.extent[2], self.extent[1]],
            stride: [self.stride[0], self.stride[2], self.stride[1]],
            ..*self
        }
    }

    accessors!();

    #[inline(always)]
    pub fn get(&self, a: usize, b: usize, c: usize) -> f32 {
        debug_assert!(a < self.extent[0] && b < self.extent[1] && c < self.extent[2]);
        let off = a * self.stride[0] + b * self.stride[1] + c * self.stride[2];
        // SAFETY: indices are within extents, and construction proved the last offset in bounds.
        unsafe { load(self.ptr, self.dtype, off) }
    }

    /// Load row `(a, b, 0..extent[2])` into `out[..extent[2]]` as f32.
    #[inline]
    pub fn load_row(&self, a: usize, b: usize, out: &mut [f32]) {
        let n = self.extent[2];
        let out = &mut out[..n];
        assert!(
            a < self.extent[0] && b < self.extent[1],
            "row outside the view"
        );
        let base = a * self.stride[0] + b * self.stride[1];
        let s = self.stride[2];
        // SAFETY: (a, b, 0..n) is inside the extent (asserted), which construction proved
        // in bounds of the buffer.
        unsafe {
            match (self.dtype, s) {
                (DType::F32, 1) => {
                    let src = core::slice::from_raw_parts((self.ptr as *const f32).add(base), n);
                    out.copy_from_slice(src);
                }
                (DType::F16, 1) => {
                    let src = core::slice::from_raw_parts((self.ptr as *const u16).add(base), n);
                    crate::dtype::f16_to_f32(src, out);
                }
                (DType::BF16, 1) => {
                    let src = core::slice::from_raw_parts((self.ptr as *const u16).add(base), n);
                    crate::dtype::bf16_to_f32(src, out);
                }
                // whole blocks from a block boundary: `base` and `n` are multiples of 32
                // (the strides and row length, checked at construction)
                (DType::Q8_0 | DType::Q4_0, 1) if (base | n) % crate::dtype::QK == 0 => {
                    let (q, bb) = (crate::dtype::QK, self.dtype.block_bytes());
                    let src = core::slice::from_raw_parts(self.ptr.add(base / q * bb), n / q * bb);
                    crate::dtype::dequantize(self.dtype, src, out);
                }
                _ => {
                    for (c, o) in out.iter_mut().enumerate() {
                        *o = load(self.ptr, self.dtype, base + c * s);
                    }
                }
            }
        }
    }
}

impl View<'_> {
    /// Rows `(h, cells[i], ..)` of every head gathered into `ws` as a dense `[H,
    /// cells.len(), d]` view of the same dtype, raw bits (a block type's rows as their
    /// blocks): what a scorer reads of token `i` there is what it reads of cell `cells[i]`
    /// here. An engine's cells of one sequence in a stream it shares (by index, any order).
    /// Every cell below `extent[1]` (`OutOfBounds`), `cells` non-empty (`InvalidArgument`),
    /// `ws` large enough (`WorkspaceTooSmall`); repeated cells are read twice.
    pub fn gather_rows<'w>(&self, cells: &[u32], ws: &'w mut [u8]) -> Result<View<'w>> {
        let [h, s, d] = self.extent;
        let n = cells.len();
        if n == 0 {
            return Err(Error::InvalidArgument);
        }
        if cells.iter().any(|&c| c as usize >= s) {
            return Err(Error::OutOfBounds);
        }
        let len = mul(mul(h, n)?, d)?;
        let dt = self.dtype;
        let bytes = dt.bytes(len).ok_or(Error::Overflow)?;
        let dst = crate::workspace::Workspace::new(ws).take_dirty::<u8>(bytes)?;
        let out = dst.as_mut_ptr();
        let [s0, s1, s2] = self.stride;
        // a row's bytes when contiguous (a block type's always are: whole blocks, unit
        // stride), else element by element
        let (es, run) = match dt.is_quantized() || s2 == 1 {
            true => (dt.bytes(d).unwrap_or(0), 1),
            false => (dt.size(), d),
        };
        for hh in 0..h {
            for (i, &c) in cells.iter().enumerate() {
                let row = hh * s0 + c as usize * s1;
                let to = (hh * n + i) * d;
                for j in 0..run {
                    // SAFETY: (hh, c, 0..d) is inside the extent (c < s checked above), which
                    // construction proved inside this view's buffer (a block type's row
                    // offset a multiple of 32: whole blocks); the destination run is inside
                    // `dst` (`len` values), a buffer exclusively borrowed, distinct from it.
                    unsafe {
                        let (from, to) = match run {
                            1 => (dt.bytes(row).unwrap_or(0), dt.bytes(to).unwrap_or(0)),
                            _ => ((row + j * s2) * es, (to + j) * es),
                        };
                        core::ptr::copy_nonoverlapping(self.ptr.add(from), out.add(to), es);
                    }
                }
            }
        }
        // SAFETY: `dst` holds `len` values of the dtype (written above), borrowed for 'w.
        unsafe { View::from_raw(out, len, dt, [h, n, d], [n * d, d, 1]) }
    }
}

view_struct!(
    /// A writable strided view, used only by compaction.
    #[derive(Debug)]
    ViewMut, *mut u8, &'a mut [u8]
);

impl<'a> ViewMut<'a> {
    raw_constructor!(
        /// # Safety
        /// `ptr` must point to `len` writable elements of `dtype` (of a block type: `len / 32`
        /// blocks), exclusively borrowed for `'a`. Everything else is checked here.
        *mut u8
    );
    typed_constructors!(
        &'a mut [f32],
        &'a mut [f16],
        &'a mut [bf16],
        as_mut_ptr,
        *mut u8
    );
    bytes_constructor!(&'a mut [u8], as_mut_ptr, *mut u8);
    accessors!();
    /// A read-only view of the same memory.
    pub fn as_view(&self) -> View<'_> {
        View {
            ptr: self.ptr,
            len: self.len,
            dtype: self.dtype,
            extent: self.extent,
            stride: self.stride,
            _life: PhantomData,
        }
    }
    /// Two distinct (head, token) rows of this view would write the same element.
    /// Compaction refuses such views: moving rows through them is not well defined.
    pub fn rows_overlap(&self) -> bool {
        layout_overlaps(self.extent, self.stride)
    }

    /// Copy row `(a, from, ..)` onto row `(a, to, ..)`, element by element (raw bits); a
    /// row of a block type as its whole blocks, byte for byte.
    #[inline]
    pub(crate) fn move_row(&mut self, a: usize, from: usize, to: usize) {
        if from == to {
            return;
        }
        let dt = self.dtype;
        let base_f = a * self.stride[0] + from * self.stride[1];
        let base_t = a * self.stride[0] + to * self.stride[1];
        let s = self.stride[2];
        // SAFETY: both rows are inside the validated extents (of a block type: whole blocks
        // from a block boundary, `s` = 1, checked at construction).
        unsafe {
            if s == 1 {
                core::ptr::copy(
                    self.ptr.add(byte_offset(dt, base_f)),
                    self.ptr.add(byte_offset(dt, base_t)),
                    byte_offset(dt, self.extent[2]),
                );
            } else {
                let es = dt.size();
                for c in 0..self.extent[2] {
                    core::ptr::copy_nonoverlapping(
                        self.ptr.add((base_f + c * s) * es),
                        self.ptr.add((base_t + c * s) * es),
                        es,
                    );
                }
            }
        }
    }

    /// Copy row `(a, from, ..)` of `src` (same dtype and row length) into row `(a2, to, ..)`;
    /// a row of a block type as its whole blocks, byte for byte.
    #[inline]
    pub(crate) fn copy_row_from(
        &mut self,
        a2: usize,
        to: usize,
        src: &View<'_>,
        a: usize,
        from: usize,
    ) {
        let dt = self.dtype;
        let sb = a * src.stride[0] + from * src.stride[1];
        let db = a2 * self.stride[0] + to * self.stride[1];
        // SAFETY: compaction passes rows inside both views' extents (its lists are checked
        // against them first) and views that do not overlap (checked there too); rows of a
        // block type are whole blocks from a block boundary (both views, `ViewMut` and a
        // `View` not swapped: compaction's).
        unsafe {
            if dt.is_quantized() {
                debug_assert!(src.stride[2] == 1 && self.stride[2] == 1);
                core::ptr::copy_nonoverlapping(
                    src.ptr.add(byte_offset(dt, sb)),
                    self.ptr.add(byte_offset(dt, db)),
                    byte_offset(dt, self.extent[2]),
                );
                return;
            }
            let es = dt.size();
            for c in 0..self.extent[2] {
                core::ptr::copy_nonoverlapping(
                    src.ptr.add((sb + c * src.stride[2]) * es),
                    self.ptr.add((db + c * self.stride[2]) * es),
                    es,
                );
            }
        }
    }
}

/// Byte offset of element `e` (of a block type: of its block) inside a validated view,
/// where it cannot overflow (`check_layout` computed the buffer's bytes).
#[inline(always)]
fn byte_offset(dt: DType, e: usize) -> usize {
    e / dt.block_len() * dt.block_bytes()
}

/// Whether two different index tuples of a layout (3 axes for views, 4 for paged pools)
/// map to the same element.
/// Exact for the layouts engines use: sort axes by stride and require each stride to exceed
/// the span of all smaller axes (a sufficient condition; rejecting a few exotic
/// non-overlapping layouts is acceptable).
pub fn layout_overlaps<const N: usize>(extent: [usize; N], stride: [usize; N]) -> bool {
    let mut axes = [0usize; N];
    for (a, x) in axes.iter_mut().enumerate() {
        *x = a;
    }
    axes.sort_unstable_by_key(|&a| stride[a]);
    let mut span = 0usize; // highest offset reachable with the smaller axes
    for &a in &axes {
        if extent[a] <= 1 {
            continue;
        }
        if stride[a] <= span || stride[a] == 0 {
            return true;
        }
        span = match (extent[a] - 1)
            .checked_mul(stride[a])
            .and_then(|x| x.checked_add(span))
        {
            Some(v) => v,
            None => return true,
        };
    }
    false
}

/// Rows `b0 .. b0+nt` of head `a` of `view` as f32, row `t` into `dst[t*d..(t+1)*d]`
/// (`d = extent[2]`). Rows of f16 with unit element stride convert 8 at a time.
#[inline(always)]
pub(crate) fn load_rows<S: Simd>(view: &View, a: usize, b0: usize, nt: usize, dst: &mut [f32]) {
    load_rows_of::<S, false>(view, a, b0, nt, dst);
}

/// [`load_rows`]; with `CHECK`, returns whether every element loaded is finite (else
/// `true`): f16 rows checked as they convert (one pass over the chunk, not a second one
/// over the f32 rows).
#[inline(always)]
pub(crate) fn load_rows_of<S: Simd, const CHECK: bool>(
    view: &View,
    a: usize,
    b0: usize,
    nt: usize,
    dst: &mut [f32],
) -> bool {
    let d = view.extent()[2];
    let st = view.stride();
    let dst = &mut dst[..nt * d];
    if view.dtype() == DType::F16 && st[2] == 1 {
        assert!(a < view.extent()[0] && b0 + nt <= view.extent()[1]);
        // The view proved every element of its extent in bounds at construction; its
        // address comes back from `byte_range` (the pointer it was built from).
        let base = view.byte_range().0 as *const u16;
        let d8 = d / 8 * 8;
        // SAFETY: no memory is touched (S's features: our caller's)
        let mut acc = unsafe { S::zero() };
        let mut tail_ok = true;
        for t in 0..nt {
            let row = &mut dst[t * d..(t + 1) * d];
            // SAFETY: (a, b0 + t, 0..d) is inside the view's extent (asserted above).
            unsafe {
                let src = base.add(a * st[0] + (b0 + t) * st[1]);
                // the row 4 on (a hint: past the view it reads nothing): the loop otherwise
                // waits on each row's lines in turn
                let ahead = (src as *const u8).wrapping_add(4 * st[1] * 2);
                crate::numerics::prefetch_rows(ahead, 0, d * 2, 1);
                let mut c = 0;
                while c < d8 {
                    let v = S::load_f16(src.add(c));
                    S::store(row.as_mut_ptr().add(c), v);
                    if CHECK {
                        // v - v: +0 for finite v, NaN for NaN/Inf (as `all_finite`)
                        acc = S::add(acc, S::sub(v, v));
                    }
                    c += 8;
                }
                for c in d8..d {
                    row[c] = half::f16::from_bits(*src.add(c)).to_f32();
                    tail_ok &= !CHECK || row[c].is_finite();
                }
            }
        }
        // SAFETY: no memory is touched
        return !CHECK || (tail_ok && unsafe { S::hsum(acc) } == 0.0);
    }
    for t in 0..nt {
        view.load_row(a, b0 + t, &mut dst[t * d..(t + 1) * d]);
    }
    !CHECK || crate::numerics::all_finite::<S>(dst)
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use crate::numerics::{all_finite, Portable};
    use std::vec::Vec;

    /// `load_rows_of` (`CHECK`) converts as `load_rows` and finds a NaN or an infinity wherever it
    /// is (whole vectors, the part of a row past them, f16 or f32 rows), on every kernel
    /// build of this machine.
    #[test]
    fn load_rows_finite_finds_non_finite() {
        fn run<S: Simd>() {
            for d in [8, 13, 16] {
                let (hkv, n) = (2, 5);
                let vals: Vec<f32> = (0..hkv * n * d).map(|i| i as f32 * 0.25 - 3.0).collect();
                for bad in [None, Some(f32::NAN), Some(f32::INFINITY)] {
                    for at in [0, d - 1, 2 * d + 3] {
                        let mut v = vals.clone();
                        // head 1, rows 1.., in token-row layout [n][hkv][d]
                        if let Some(x) = bad {
                            v[(1 + at / d) * hkv * d + d + at % d] = x;
                        }
                        let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
                        let st = [d, hkv * d, 1];
                        let views = [
                            View::f16(&h, [hkv, n, d], st).unwrap(),
                            View::f32(&v, [hkv, n, d], st).unwrap(),
                        ];
                        for view in &views {
                            let (mut a, mut b) = (std::vec![0f32; 4 * d], std::vec![0f32; 4 * d]);
                            load_rows::<S>(view, 1, 1, 4, &mut a);
                            let ok = load_rows_of::<S, true>(view, 1, 1, 4, &mut b);
                            let what = std::format!("d {d} bad {bad:?} at {at}");
                            assert_eq!(
                                a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                                b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                                "{what}"
                            );
                            assert_eq!(ok, bad.is_none(), "{what}");
                            assert_eq!(ok, all_finite::<Portable>(&a), "{what}");
                        }
                    }
                }
            }
        }
        run::<Portable>();
        crate::numerics::on_vector_builds!(S => { run::<S>() });
    }
}
