//! Drives the C entry points with arbitrary descriptors and data: views over a
//! fuzzer-owned arena with arbitrary offsets (alignment), dtypes, extents, strides and
//! lengths (never more than the arena holds), arbitrary params and enum values, output
//! buffers of arbitrary sizes, sometimes placed inside the inputs.
//!
//! The device entry points (`kve_cuda_score_layer`, `kve_cuda_select_model`) run the real
//! kernels of cuda/ on the CPU emulator (feature `cuda-emu`): the arena and every output
//! and workspace buffer are registered with the emulated runtime as device memory (as
//! `cudaHostRegister`'d mapped memory is on a GPU), so the same arena serves as device
//! memory and the emulator still aborts on a kernel pointer outside every registered
//! buffer.
//!
//! The evictor (`kve_evictor_*`, or its device form `kve_cuda_evictor_*` on the
//! emulator) runs a random sequence of calls on one context built from an arbitrary
//! config: after every refused call the context (its workspace aside; for the device form
//! the host context and the device block) and every output are as they were.
//!
//! The query stream (`kve_stream_*`) runs start to finish: size, start, one to three
//! chunks, then scores, raw statistics or the count, with its descriptors, positions
//! and outputs sometimes placed inside the state, the workspace or the output.
//!
//! The paged entry points (`kve_paged_*`) get a pool layout over the arena (an engine's
//! kind or arbitrary strides), a table (sometimes words of the arena), a gather (checked
//! element by element through the table) or an in-place compaction (blocks freed and
//! kept positions checked).
//!
//! Oracles: no crash, no out-of-bounds access (ASan), and
//! - on error, outputs still hold their canaries and the arena is unchanged;
//! - on success, outputs are well formed (finite host scores, ascending kept lists, ...);
//! - an output overlapping an input never succeeds;
//! - a device call never answers `KVE_ERR_CUDA`: that means a launcher refused arguments
//!   the C layer had accepted (its validation is incomplete; the emulator has sm_90's
//!   shared-memory limit).
//! The harness caps the work of one call (element counts of views with stride 0, which
//! a small buffer can declare legally), not what the library accepts.
#![no_main]

use kvevict::capi::*;
use libfuzzer_sys::fuzz_target;
use std::ffi::{c_char, c_void};

const ARENA: usize = 1 << 15; // bytes
const CANARY: u32 = 0xA5A5_A5A5;
/// The CUDA stream of device calls: the legacy default stream.
const NULL: *mut c_void = std::ptr::null_mut();

struct R<'a> {
    d: &'a [u8],
    i: usize,
}

impl R<'_> {
    fn u8(&mut self) -> u8 {
        // past the input's end, bytes hashed from the index (zeros would make every `chance`
        // true, so a short input took every rare, hostile branch at once)
        let past = || ((self.i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8;
        let v = self.d.get(self.i).copied().unwrap_or_else(past);
        self.i += 1;
        v
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        (self.u32() as u64) << 32 | self.u32() as u64
    }
    fn chance(&mut self, one_in: u8) -> bool {
        self.u8() % one_in == 0
    }
    /// Mostly `1..=small`, sometimes 0 or a hostile value.
    fn size(&mut self, small: u64) -> u64 {
        match self.u8() {
            0..=3 => 0,
            4 => u64::MAX,
            5 => u64::MAX / 2 + 1,
            6 => 1 << 31,
            7 => (1 << 32) + 1,
            8 => self.u64(),
            _ => 1 + self.u32() as u64 % small,
        }
    }
    fn enum_val(&mut self, n: u32) -> u32 {
        if self.chance(24) {
            self.u32()
        } else {
            self.u8() as u32 % n
        }
    }
}

/// A host buffer registered with the emulator as device memory while it lives (declared
/// first in its owner, so it is unregistered before the buffer is freed).
struct Registered(*mut c_void);

impl Registered {
    fn new(p: *const u8, bytes: usize) -> Registered {
        let p = p as *mut c_void;
        // SAFETY: the owner keeps [p, p + bytes) alive until this is dropped.
        let st = unsafe { kvevict::cuda::kve_emu_host_register(p, bytes) };
        assert_eq!(st, 0, "kve_emu_host_register: CUDA status {st}");
        Registered(p)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        // SAFETY: registered by `new`; every device call has returned (and the emulator
        // runs its launches before they return).
        let st = unsafe { kvevict::cuda::kve_emu_host_unregister(self.0) };
        assert_eq!(st, 0, "kve_emu_host_unregister: CUDA status {st}");
    }
}

struct Arena {
    _dev: Registered,
    buf: Vec<u64>,
}

impl Arena {
    fn new(r: &mut R) -> Arena {
        let mut buf = vec![0u64; ARENA / 8];
        let mode = r.u8();
        let mut s = r.u64() | 1;
        for w in buf.iter_mut() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *w = if mode % 8 == 0 {
                s // raw bits: NaN, Inf, subnormals
            } else {
                // two finite f32 in [-2, 2) (their halves are finite bf16; f16 mostly)
                let a = ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0;
                let b = (((s >> 8) & 0xFF_FFFF) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0;
                (a.to_bits() as u64) << 32 | b.to_bits() as u64
            };
        }
        Arena {
            _dev: Registered::new(buf.as_ptr() as *const u8, ARENA),
            buf,
        }
    }
    fn base(&self) -> *const u8 {
        self.buf.as_ptr() as *const u8
    }
    fn bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.base(), ARENA) }
    }
}

/// A view over the arena (or NULL); its len never exceeds what the arena holds.
fn tensor(r: &mut R, a: &Arena, small: [u64; 3]) -> kve_tensor {
    if r.chance(40) {
        return kve_tensor::NONE;
    }
    let off = if r.chance(6) {
        r.u8() as usize % 64
    } else {
        (r.u8() as usize % 64) * 8
    };
    // f32, f16, bf16 and ggml's q8_0 / q4_0 (their values take at most 2 bytes each, so
    // `es` keeps `len` inside the arena)
    let dtype = r.enum_val(5);
    let es = if dtype == 0 { 4 } else { 2 };
    let max_len = (ARENA - off) / es;
    let mut extent = [0u64; 3];
    for (e, s) in extent.iter_mut().zip(small) {
        *e = r.size(s);
    }
    if dtype >= 3 && r.chance(2) {
        // mostly whole-block rows, so the block types get past the layout check
        extent[2] = extent[2].saturating_add(31) / 32 * 32;
    }
    let mut stride = [0u64; 3];
    match r.u8() % 8 {
        0 => {
            for s in stride.iter_mut() {
                *s = r.size(64) / 2;
            }
        }
        1 => {
            // token-major rows [N][H*d]
            stride = [extent[2], extent[0].wrapping_mul(extent[2]), 1];
        }
        2 => {
            // transposed [H*d][N]
            stride = [extent[2].wrapping_mul(extent[1]), 1, extent[1]];
        }
        _ => stride = [extent[1].wrapping_mul(extent[2]), extent[2], 1],
    }
    let need = (0..3).fold(0u64, |acc, i| {
        acc.saturating_add(extent[i].saturating_sub(1).saturating_mul(stride[i]))
    });
    let len = if r.chance(3) {
        (r.u32() as usize % (max_len + 1)) as u64
    } else {
        need.saturating_add(1).min(max_len as u64)
    };
    kve_tensor {
        data: unsafe { a.base().add(off) } as *const c_void,
        len,
        dtype,
        pad: if r.chance(50) { 1 } else { 0 },
        extent,
        stride,
    }
}

fn elems(t: &kve_tensor) -> u64 {
    t.extent.iter().fold(1u64, |a, &e| a.saturating_mul(e))
}

/// Bytes of `len` elements of `dtype` (of ggml's block types: whole 32-value blocks of 34
/// and 18 bytes, as the library counts them).
fn bytes_of(dtype: u32, len: u64) -> usize {
    let len = len as usize;
    match dtype {
        0 => len * 4,
        3 => len / 32 * 34,
        4 => len / 32 * 18,
        _ => len * 2,
    }
}

fn span(t: &kve_tensor) -> (usize, usize) {
    if t.data.is_null() {
        return (0, 0);
    }
    (t.data as usize, t.data as usize + bytes_of(t.dtype, t.len))
}

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < a.1 && b.0 < b.1 && a.0 < b.1 && b.0 < a.1
}

/// An output buffer: canary-filled, its own memory or (sometimes) inside the arena.
struct Out {
    _dev: Registered,
    own: Vec<u32>,
    ptr: *mut u32,
    len: u64,
    in_arena: bool,
}

impl Out {
    fn new(r: &mut R, a: &mut Arena, max: usize) -> Out {
        let len = if r.chance(8) {
            r.size(1 << 20) as usize % (max + 1)
        } else {
            max
        };
        let mut own = vec![CANARY; max.max(1)];
        if r.chance(16) {
            let off = (r.u8() as usize % 32) * 4;
            let n = ((ARENA - off) / 4).min(len);
            let p = unsafe { (a.buf.as_mut_ptr() as *mut u8).add(off) } as *mut u32;
            let _dev = Registered::new(own.as_ptr() as *const u8, own.len() * 4);
            return Out {
                _dev,
                own,
                ptr: p,
                len: n as u64,
                in_arena: true,
            };
        }
        let ptr = if r.chance(40) {
            std::ptr::null_mut()
        } else {
            own.as_mut_ptr()
        };
        let _dev = Registered::new(own.as_ptr() as *const u8, own.len() * 4);
        Out {
            _dev,
            ptr,
            len: len as u64,
            in_arena: false,
            own,
        }
    }
    fn span(&self) -> (usize, usize) {
        (self.ptr as usize, self.ptr as usize + self.len as usize * 4)
    }
    fn untouched(&self) -> bool {
        self.in_arena || self.own.iter().all(|&x| x == CANARY)
    }
}

/// A workspace length for a call whose size query gave `query` (`None`: the query failed):
/// mostly that size, sometimes a little short; a random one without a size or past 64 MiB.
fn ws_len(r: &mut R, query: Option<u64>) -> u64 {
    match query {
        Some(b) if b <= (64 << 20) => {
            if r.chance(8) {
                b.saturating_sub(1 + r.u8() as u64 % 64)
            } else {
                b
            }
        }
        _ => r.u8() as u64 * 16,
    }
}

fn workspace(r: &mut R, query: Option<u64>) -> Vec<u8> {
    vec![0u8; ws_len(r, query) as usize]
}

/// Floats in the arena for an input the call reads: 4-byte aligned below 256 bytes in
/// (with `odd`, 1 in 24 two bytes off: misaligned), `want` long (half the time, where it
/// fits) or any length that fits.
fn floats_in(r: &mut R, a: &Arena, want: u64, odd: bool) -> (*const f32, u64) {
    let off = (r.u8() as usize % 64) * 4 + if odd && r.chance(24) { 2 } else { 0 };
    let room = ((ARENA - off) / 4) as u64;
    let len = if want < room && r.chance(2) {
        want
    } else {
        r.u32() as u64 % room
    };
    (a.base().wrapping_add(off) as *const f32, len)
}

/// A device workspace (`kve_cuda_*`): 256-byte aligned like cudaMalloc memory, its own
/// buffer or (sometimes) inside the arena; sometimes short, misaligned or NULL on purpose.
struct DevWs {
    _dev: Option<Registered>,
    _own: Vec<u64>,
    ptr: *mut c_void,
    len: u64,
    in_arena: bool,
}

fn dev_workspace(r: &mut R, a: &mut Arena, query: Option<u64>) -> DevWs {
    let n = ws_len(r, query) as usize;
    let skew = if r.chance(16) {
        4 * (1 + r.u8() as usize % 63)
    } else {
        0
    };
    if r.chance(12) {
        let base = a.buf.as_mut_ptr() as usize;
        let first = base.next_multiple_of(256) - base;
        let off = (first + (r.u8() as usize % 64) * 256 + skew).min(ARENA);
        return DevWs {
            _dev: None,
            _own: Vec::new(),
            ptr: (base + off) as *mut c_void,
            len: n.min(ARENA - off) as u64,
            in_arena: true,
        };
    }
    let mut own = vec![0u64; (n + skew) / 8 + 33];
    let p = (own.as_mut_ptr() as usize).next_multiple_of(256) + skew;
    let ptr = if r.chance(40) {
        std::ptr::null_mut()
    } else {
        p as *mut c_void
    };
    let _dev = Some(Registered::new(own.as_ptr() as *const u8, own.len() * 8));
    DevWs {
        _dev,
        _own: own,
        ptr,
        len: n as u64,
        in_arena: false,
    }
}

/// Sometimes a head count at a limit of the device path (group size, launch grids,
/// `KVE_MAX_HEADS`), broadcast (head stride 0) so the view still fits its buffer.
fn wide_heads(r: &mut R, t: &mut kve_tensor) -> Option<u64> {
    if t.data.is_null() || !r.chance(10) {
        return None;
    }
    let h = [16, 17, 64, 65, 128, 129, 256, 1024, 65535, 65536, 65537][r.u8() as usize % 11];
    t.extent[0] = h;
    t.stride[0] = 0;
    Some(h)
}

/// A span of `count` elements of `size` bytes at `p` (empty for NULL).
fn span_n(p: *const c_void, count: u64, size: u64) -> (usize, usize) {
    if p.is_null() {
        return (0, 0);
    }
    let b = count.saturating_mul(size).min(usize::MAX as u64 / 2) as usize;
    (p as usize, (p as usize).saturating_add(b))
}

/// Whether the arena bytes of `s` (clipped to the arena) are as in `before`.
fn unchanged(a: &Arena, before: &[u8], s: (usize, usize)) -> bool {
    let base = a.base() as usize;
    let (lo, hi) = (s.0.max(base), s.1.min(base + ARENA));
    lo >= hi || a.bytes()[lo - base..hi - base] == before[lo - base..hi - base]
}

/// `p`'s offset in the arena, -1 for NULL (debug output).
fn offset_in(a: &Arena, p: *const c_void) -> isize {
    if p.is_null() {
        -1
    } else {
        p as isize - a.base() as isize
    }
}

/// A device entry point's status: the C layer refuses what the launchers would (never
/// `KVE_ERR_CUDA`), and accepts a workspace of the queried size `q`.
fn check_device_status(st: i32, q: Option<u64>, ws_len: u64) {
    assert_ne!(
        st, KVE_ERR_CUDA,
        "a launcher refused what the C layer accepted"
    );
    if q.is_some_and(|need| ws_len >= need) {
        assert_ne!(
            st, KVE_ERR_WORKSPACE_TOO_SMALL,
            "workspace of the queried size refused"
        );
    }
}

/// `KVE_FUZZ_DEBUG=1`: the device ops print their arguments (to read a reproducer).
fn debug() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("KVE_FUZZ_DEBUG").is_some())
}

/// A params struct followed by readable bytes, so any `struct_size` the harness writes is
/// honest (the library reads `struct_size` bytes).
#[repr(C)]
struct Padded<T> {
    p: T,
    tail: [u8; 4096],
}

fn padded<T>(r: &mut R, p: T) -> Box<Padded<T>> {
    let mut b = Box::new(Padded { p, tail: [0; 4096] });
    if r.chance(32) {
        // a caller from the future: a size never released (refused), maybe with non-zero
        // new fields
        let size = std::mem::size_of::<T>() as u32 + (r.u8() as u32 % 16) * 4;
        unsafe { *(&mut b.p as *mut T as *mut u32) = size };
        if r.chance(2) {
            b.tail[r.u8() as usize % 64] = 1;
        }
    } else if r.chance(32) {
        unsafe { *(&mut b.p as *mut T as *mut u32) = r.u32() % 4200 };
    }
    b
}

/// A pooling step of the score and stream params, `(pool_kind, pool_kernel, pool_decay)`:
/// any kind, kernel or decay, refused ones (huge kernels, negative or NaN decays) included.
fn pool(r: &mut R) -> (u32, u32, f32) {
    let kind = r.enum_val(4);
    let kernel = if r.chance(8) {
        r.u32()
    } else {
        r.u8() as u32 % 12
    };
    let decay = [0.9, 1.0, 0.0, -1.0, f32::NAN, 0.5][r.u8() as usize % 6];
    (kind, kernel, decay)
}

/// The post-pool of the select and stream params, `(post_pool_kind, _kernel, _decay)`.
fn post_pool(r: &mut R) -> (u32, u32, f32) {
    let kind = r.enum_val(4);
    let kernel = r.u8() as u32 % 12;
    let decay = [0.9, 1.0, 0.0, f32::NAN][r.u8() as usize % 4];
    (kind, kernel, decay)
}

fn score_params(r: &mut R) -> kve_score_params {
    let mut p: kve_score_params = unsafe { std::mem::zeroed() };
    // V1 (48 bytes, no power) or V2 (52)
    let size = if r.chance(4) {
        KVE_SCORE_PARAMS_V1_SIZE
    } else {
        KVE_SCORE_PARAMS_V2_SIZE
    };
    let st = unsafe { kve_score_params_init(&mut p, size, r.u8() as u32 % 10) };
    if st != KVE_OK {
        p.struct_size = size;
    }
    // (sometimes the preset's own window: TOVA's is 1)
    p.window = if r.chance(4) {
        r.u32() % 300
    } else if r.chance(5) {
        p.window
    } else {
        1 + r.u8() as u32 % 40
    };
    if r.chance(3) {
        p.scorer = r.enum_val(8);
        (p.pool_kind, p.pool_kernel, p.pool_decay) = pool(r);
        p.gqa = r.enum_val(3);
        p.reduce_before_pool = r.enum_val(2);
        p.laprox_gqa = r.enum_val(3);
        p.placement = r.enum_val(2);
        p.sinks = r.u8() as u32 % 8;
        p.critical_first_stage = r.u8() as u32 % 16;
        p.power = r.u8() as u32 % 18; // 0 and 17 are refused
    }
    p
}

fn select_params(r: &mut R) -> kve_select_params {
    let mut p: kve_select_params = unsafe { std::mem::zeroed() };
    let alloc = r.enum_val(5);
    let gran = r.enum_val(3);
    let budget = if r.chance(6) {
        r.u64()
    } else {
        r.u8() as u64 % 64
    };
    let st = unsafe {
        if r.chance(5) {
            kve_select_params_init_laprox_span(&mut p, 48, budget)
        } else {
            kve_select_params_init(&mut p, 48, alloc, gran, budget)
        }
    };
    if st != KVE_OK {
        p.struct_size = 48;
        p.allocator = alloc;
        p.granularity = gran;
    }
    if r.chance(4) {
        p.alpha = [0.2, 0.0, 1.0, 1.5, f32::NAN][r.u8() as usize % 5];
        p.beta = r.u8() as u32 % 30;
        p.normalize = r.enum_val(2);
        (p.post_pool_kind, p.post_pool_kernel, p.post_pool_decay) = post_pool(r);
    }
    p
}

fn stream_params(r: &mut R) -> kve_stream_score_params {
    let mut p: kve_stream_score_params = unsafe { std::mem::zeroed() };
    if unsafe { kve_stream_score_params_init(&mut p, 40) } != KVE_OK {
        p.struct_size = 40;
    }
    p.stat = r.enum_val(4);
    if r.chance(3) {
        p.gqa = r.enum_val(3);
        (p.pool_kind, p.pool_kernel, p.pool_decay) = pool(r);
        (p.post_pool_kind, p.post_pool_kernel, p.post_pool_decay) = post_pool(r);
        p.reserved = if r.chance(16) { 1 } else { 0 };
    }
    p
}

/// Mostly give `t` (a view over the arena) the extents the call wants, contiguous or
/// with its middle axes swapped, as long as the arena holds it.
fn fit(r: &mut R, a: &Arena, t: &mut kve_tensor, e: [u64; 3]) {
    if t.data.is_null() || r.chance(5) {
        return;
    }
    let es = if t.dtype == 0 { 4 } else { 2 };
    let room = ((ARENA - (t.data as usize - a.base() as usize)) / es) as u64;
    let need = e[0].saturating_mul(e[1]).saturating_mul(e[2]);
    if need > room {
        return;
    }
    t.extent = e;
    let plane = e[1].saturating_mul(e[2]);
    t.stride = if r.chance(4) {
        [plane, 1, e[1]]
    } else {
        [plane, e[2], 1]
    };
    t.len = if r.chance(16) {
        need.saturating_sub(1)
    } else {
        need
    };
}

/// A well-formed view of extents `e` over the arena (f32, f16 or bf16, contiguous, at a
/// 64-byte offset), or None when the arena is too small for it.
fn exact(r: &mut R, a: &Arena, e: [u64; 3]) -> Option<kve_tensor> {
    let (off, dtype) = ((r.u8() as usize % 16) * 64, r.u8() as u32 % 3);
    let es = if dtype == 0 { 4 } else { 2 };
    let need = e[0].checked_mul(e[1])?.checked_mul(e[2])?;
    if need == 0 || off as u64 + need * es as u64 > ARENA as u64 {
        return None;
    }
    Some(kve_tensor {
        data: unsafe { a.base().add(off) } as *const c_void,
        len: need,
        dtype,
        pad: 0,
        extent: e,
        stride: [e[1] * e[2], e[2], 1],
    })
}

/// Bytes of a tensor descriptor.
const TD: usize = std::mem::size_of::<kve_tensor>();

/// An 8-aligned state buffer of `bytes` (sometimes short or misaligned on purpose).
struct State {
    own: Vec<u64>,
    ptr: *mut u8,
    len: u64,
}

impl State {
    fn new(r: &mut R, bytes: u64) -> State {
        let mut own = vec![0x5A5A_5A5A_5A5A_5A5Au64; bytes as usize / 8 + 2];
        let mut ptr = own.as_mut_ptr() as *mut u8;
        let mut len = bytes;
        if r.chance(24) {
            len = len.saturating_sub(8);
        }
        if r.chance(24) {
            ptr = unsafe { ptr.add(4) };
        }
        State { own, ptr, len }
    }
    fn bytes(&self) -> Vec<u64> {
        self.own.clone()
    }
    /// An 8-aligned place for an argument of `size` bytes that starts inside the state's
    /// span (so it overlaps it) and ends inside its buffer.
    fn inside(&mut self, r: &mut R, size: usize) -> *mut u8 {
        let first = (self.ptr as usize - self.own.as_ptr() as usize) / 8;
        let last = self
            .own
            .len()
            .saturating_sub(size.div_ceil(8))
            .min((self.len as usize / 8).saturating_sub(1));
        let w = first + r.u8() as usize % (last.saturating_sub(first) + 1);
        unsafe { (self.own.as_mut_ptr() as *mut u8).add(w * 8) }
    }
}

/// A workspace placed inside the arena may be written on error (its contents are
/// unspecified after any call): put its bytes back so the arena check sees the rest.
fn scratch_back(a: &mut Arena, before: &[u8], s: (usize, usize)) {
    let base = a.buf.as_mut_ptr() as usize;
    let (lo, hi) = (s.0.max(base), s.1.min(base + ARENA));
    if lo < hi {
        unsafe {
            std::ptr::copy_nonoverlapping(before[lo - base..].as_ptr(), lo as *mut u8, hi - lo)
        };
    }
}

fn check_csr(off: &[u32], offsets_len: usize, idx: &[u32], units: usize, n: u64) {
    let o = unsafe { std::slice::from_raw_parts(off.as_ptr() as *const u64, offsets_len) };
    assert_eq!(o[0], 0);
    for u in 0..units {
        assert!(
            o[u] <= o[u + 1] && o[u + 1] as usize <= idx.len(),
            "offsets"
        );
        let list = &idx[o[u] as usize..o[u + 1] as usize];
        assert!(list.windows(2).all(|w| w[0] < w[1]), "ascending");
        assert!(list.iter().all(|&x| (x as u64) < n), "in range");
    }
}

/// `KVEVICT_FUZZ_TRACE` set: the harness says what some arms did (stderr).
fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("KVEVICT_FUZZ_TRACE").is_some())
}

/// The fuzz round's layers for `kve_evictor_round.fill` (the V2 form of call 13).
struct FillData {
    ks: Vec<kve_tensor>,
    vs: Vec<kve_tensor>,
    qs: Vec<kve_tensor>,
    values: bool,
    fail_at: u64,
    wo: bool,
    calls: u64,
    failed: bool,
}

/// Gives layer `layer`'s tensors from `FillData` (absent where it has none), or fails at
/// `fail_at`; asserts it is never called again after a failure.
unsafe extern "C" fn fuzz_fill(user: *mut c_void, layer: u64, out: *mut kve_evictor_layer) -> i32 {
    let d = unsafe { &mut *user.cast::<FillData>() };
    assert!(!d.failed, "fill called again after it failed");
    d.calls += 1;
    if layer == d.fail_at {
        d.failed = true;
        return 7;
    }
    let o = unsafe { &mut *out };
    let i = layer as usize;
    if let Some(k) = d.ks.get(i) {
        o.keys = *k;
    }
    if let Some(v) = d.vs.get(i).filter(|_| d.values) {
        o.values = *v;
    }
    if let Some(q) = d.qs.get(i) {
        o.queries = *q;
    }
    if d.wo {
        o.wo = o.keys;
    }
    0
}

fuzz_target!(|data: &[u8]| {
    let mut r = R { d: data, i: 0 };
    let op = r.u8() % 14;
    let mut a = Arena::new(&mut r);
    let before: Vec<u8> = a.bytes().to_vec();
    let st;
    let mut outs: Vec<Out> = Vec::new();
    // a destination tensor left inside the arena (varlen compaction) or a device
    // workspace inside it is an output too
    let mut dst_in_arena = false;
    unsafe {
        match op {
            0 => {
                let sp0 = score_params(&mut r);
                let spb = padded(&mut r, sp0);
                let sp = &spb.p;
                let mut inp: kve_layer_inputs = std::mem::zeroed();
                kve_layer_inputs_init(&mut inp, 272);
                inp.queries = tensor(&mut r, &a, [8, 40, 32]);
                inp.keys = tensor(&mut r, &a, [4, 96, 32]);
                if r.chance(2) {
                    inp.values = tensor(&mut r, &a, [4, 96, 32]);
                }
                let fl = |r: &mut R| {
                    let off = (r.u8() as usize % 64) * 4;
                    let len = r.u32() as u64 % ((ARENA - off) / 4) as u64;
                    (a.base().add(off) as *const f32, len)
                };
                if r.chance(3) {
                    (inp.gram, inp.gram_len) = fl(&mut r);
                }
                if r.chance(3) {
                    (inp.value_forms, inp.value_forms_len) = fl(&mut r);
                }
                if r.chance(3) {
                    (inp.value_l1, inp.value_l1_len) = fl(&mut r);
                }
                let work = inp
                    .queries
                    .extent
                    .iter()
                    .fold(1u64, |x, &e| x.saturating_mul(e))
                    .saturating_mul(inp.keys.extent[1]);
                if elems(&inp.queries) > 1 << 16
                    || elems(&inp.keys) > 1 << 16
                    || elems(&inp.values) > 1 << 16
                    || work > 1 << 24
                {
                    return;
                }
                let (hq, hkv, n, dk) = (
                    inp.queries.extent[0],
                    inp.keys.extent[0],
                    inp.keys.extent[1],
                    inp.keys.extent[2],
                );
                let mut ws_q = 0u64;
                let q = (kve_score_workspace_size(
                    sp,
                    hq,
                    hkv,
                    n,
                    dk,
                    inp.values.extent[2].max(1),
                    &mut ws_q,
                ) == KVE_OK)
                    .then_some(ws_q);
                let mut olen = 0u64;
                let ol = kve_score_output_len(sp, hkv, n, &mut olen);
                let max = if ol == KVE_OK && olen < 1 << 16 {
                    olen as usize
                } else {
                    64
                };
                let o = Out::new(&mut r, &mut a, max);
                let mut ws = workspace(&mut r, q);
                st = kve_score_layer(
                    sp,
                    &inp,
                    o.ptr as *mut f32,
                    o.len,
                    ws.as_mut_ptr() as *mut c_void,
                    ws.len() as u64,
                );
                for t in [&inp.queries, &inp.keys, &inp.values] {
                    if st == KVE_OK {
                        assert!(
                            !overlaps(o.span(), span(t)),
                            "output overlapping an input accepted"
                        );
                    }
                }
                if st == KVE_OK && ol == KVE_OK && !o.in_arena && olen > 0 && !o.ptr.is_null() {
                    let s = std::slice::from_raw_parts(o.ptr as *const f32, olen as usize);
                    assert!(s.iter().all(|x| x.is_finite()), "non-finite score");
                }
                outs.push(o);
            }
            1 | 2 | 3 => {
                let wo = tensor(&mut r, &a, [8, 32, 64]);
                let v = tensor(&mut r, &a, [4, 96, 32]);
                if elems(&wo) > 1 << 16 || elems(&v) > 1 << 16 {
                    return;
                }
                let hkv = r.size(8);
                let cross = r.enum_val(2);
                let o = Out::new(&mut r, &mut a, 1 << 14);
                if op == 1 {
                    let mut q = 0u64;
                    let ok = kve_gram_workspace_size(wo.extent[1], wo.extent[2], &mut q) == KVE_OK;
                    let mut ws = workspace(&mut r, ok.then_some(q));
                    st = kve_compute_gram(
                        &wo,
                        hkv,
                        cross,
                        o.ptr as *mut f32,
                        o.len,
                        ws.as_mut_ptr() as *mut c_void,
                        ws.len() as u64,
                    );
                } else if op == 2 {
                    let off = (r.u8() as usize % 64) * 4;
                    let glen = r.u32() as u64 % ((ARENA - off) / 4) as u64;
                    let (t0, t1) = (r.size(100), r.size(100));
                    st = kve_compute_value_forms(
                        &v,
                        a.base().add(off) as *const f32,
                        glen,
                        r.size(16),
                        cross,
                        t0,
                        t1,
                        o.ptr as *mut f32,
                        o.len,
                    );
                } else {
                    let mut q = 0u64;
                    let ok =
                        kve_value_l1_workspace_size(wo.extent[1], wo.extent[2], &mut q) == KVE_OK;
                    let mut ws = workspace(&mut r, ok.then_some(q));
                    st = kve_compute_value_l1(
                        &v,
                        &wo,
                        o.ptr as *mut f32,
                        o.len,
                        ws.as_mut_ptr() as *mut c_void,
                        ws.len() as u64,
                    );
                }
                if st == KVE_OK {
                    // inputs of each call: gram reads wo; value forms read v (and the gram);
                    // value L1 reads both
                    if op != 2 {
                        assert!(!overlaps(o.span(), span(&wo)), "output over wo accepted");
                    }
                    if op != 1 {
                        assert!(!overlaps(o.span(), span(&v)), "output over values accepted");
                    }
                }
                outs.push(o);
            }
            4 | 5 => {
                let sp0 = select_params(&mut r);
                let spb = padded(&mut r, sp0);
                let sp = &spb.p;
                let (layers, hkv, n, w) = (r.size(6), r.size(4), r.size(120), r.u8() as u64 % 40);
                let off = (r.u8() as usize % 64) * 4;
                let len = if r.chance(4) {
                    r.u32() as u64 % ((ARENA - off) / 4) as u64
                } else {
                    layers
                        .saturating_mul(hkv)
                        .saturating_mul(n.saturating_sub(w))
                        .min(((ARENA - off) / 4) as u64)
                };
                let ms = kve_model_scores {
                    scores: a.base().add(off) as *const f32,
                    len,
                    layers,
                    hkv,
                    n,
                    window: w,
                };
                let (mut ol, mut il, mut wl) = (0u64, 0u64, 0u64);
                let ok = kve_select_output_len(sp, layers, hkv, n, w, &mut ol, &mut il) == KVE_OK
                    && kve_select_workspace_size(sp, layers, hkv, n, w, &mut wl) == KVE_OK
                    && ol < 1 << 14
                    && il < 1 << 18;
                let (ol, il) = if ok {
                    (ol as usize, il as usize)
                } else {
                    (16, 256)
                };
                let o = Out::new(&mut r, &mut a, ol * 2);
                let o = Out {
                    len: o.len / 2,
                    ..o
                };
                let i = Out::new(&mut r, &mut a, il);
                let mut ws = workspace(&mut r, ok.then_some(wl));
                st = kve_select_model(
                    sp,
                    &ms,
                    o.ptr as *mut u64,
                    o.len,
                    i.ptr,
                    i.len,
                    ws.as_mut_ptr() as *mut c_void,
                    ws.len() as u64,
                );
                if st == KVE_OK {
                    let sc = (ms.scores as usize, ms.scores as usize + ms.len as usize * 4);
                    assert!(
                        !overlaps(o.span(), sc) && !overlaps(i.span(), sc),
                        "selection output over the scores"
                    );
                }
                if st == KVE_OK && !o.in_arena && !i.in_arena {
                    let units = (layers * hkv) as usize;
                    check_csr(&o.own, units + 1, &i.own[..i.len as usize], units, n);
                    if op == 5 {
                        // the eviction list of unit 0
                        let offs = std::slice::from_raw_parts(o.ptr as *const u64, 2);
                        let kept = &i.own[offs[0] as usize..offs[1] as usize];
                        let p = n - w.min(n);
                        let mut ev = vec![CANARY; p as usize + 1];
                        let mut cnt = 0u64;
                        let e = kve_evicted_positions(
                            kept.as_ptr(),
                            kept.len() as u64,
                            p,
                            ev.as_mut_ptr(),
                            ev.len() as u64,
                            &mut cnt,
                        );
                        assert_eq!(e, KVE_OK);
                        assert_eq!(
                            cnt + kept.iter().filter(|&&x| (x as u64) < p).count() as u64,
                            p
                        );
                    }
                }
                outs.push(o);
                outs.push(i);
            }
            6 | 7 => {
                // compaction over a mutable copy; lists from the input (random or plausible)
                let heads = 1 + r.u8() as u64 % 4;
                let mut lists = vec![0u64; heads as usize + 1];
                let mut idx: Vec<u32> = Vec::new();
                let n = 1 + r.u8() as u32 % 64;
                for h in 0..heads as usize {
                    lists[h] = idx.len() as u64;
                    let mut t = 0u32;
                    while t < n && idx.len() < 512 {
                        if r.chance(2) {
                            idx.push(if r.chance(30) { r.u32() } else { t });
                        }
                        t += 1 + r.u8() as u32 % 4;
                    }
                }
                lists[heads as usize] = idx.len() as u64;
                if r.chance(20) {
                    let k = r.u8() as usize % lists.len();
                    lists[k] = r.u64() % 600;
                }
                let mut kv = tensor(&mut r, &a, [4, 64, 16]);
                if elems(&kv) > 1 << 16 {
                    return;
                }
                if op == 6 {
                    // write into a private copy of the arena, at the same offset
                    let mut copy = a.buf.clone();
                    if !kv.data.is_null() {
                        let off = kv.data as usize - a.base() as usize;
                        kv.data = (copy.as_mut_ptr() as *mut u8).add(off) as *const c_void;
                    }
                    let snapshot = copy.clone();
                    let o = Out::new(&mut r, &mut a, heads as usize);
                    st = kve_compact_in_place(
                        &kv,
                        lists.as_ptr(),
                        lists.len() as u64,
                        idx.as_ptr(),
                        idx.len() as u64,
                        o.ptr,
                        o.len,
                    );
                    if st != KVE_OK {
                        assert!(copy == snapshot, "cache written on error");
                    } else if !o.in_arena && o.len >= heads && kv.extent[0] == heads {
                        for h in 0..heads as usize {
                            assert_eq!(o.own[h] as u64, lists[h + 1] - lists[h]);
                        }
                    }
                    outs.push(o);
                } else {
                    let mut dst_buf = vec![CANARY; 1 << 13];
                    let mut d = tensor(&mut r, &a, [1, 600, 16]);
                    if !d.data.is_null() && !r.chance(10) {
                        d.data = dst_buf.as_mut_ptr() as *const c_void;
                        d.len = d
                            .len
                            .min((dst_buf.len() * 4 / if d.dtype == 0 { 4 } else { 2 }) as u64);
                    } else {
                        dst_in_arena = !d.data.is_null();
                    }
                    if elems(&d) > 1 << 16 {
                        return;
                    }
                    let o = Out::new(&mut r, &mut a, heads as usize + 1);
                    st = kve_compact_varlen(
                        &kv,
                        lists.as_ptr(),
                        lists.len() as u64,
                        idx.as_ptr(),
                        idx.len() as u64,
                        &d,
                        o.ptr as *mut i32,
                        o.len,
                    );
                    if st != KVE_OK {
                        assert!(
                            dst_buf.iter().all(|&x| x == CANARY),
                            "varlen dst written on error"
                        );
                    } else {
                        assert!(!overlaps(span(&d), span(&kv)));
                    }
                    outs.push(o);
                }
            }
            9 => {
                // kve_cuda_score_layer: op 0 on the device (the kernels on the emulator)
                let sp0 = score_params(&mut r);
                let spb = padded(&mut r, sp0);
                let sp = &spb.p;
                let mut inp: kve_layer_inputs = std::mem::zeroed();
                kve_layer_inputs_init(&mut inp, if r.chance(2) { 288 } else { 272 });
                inp.queries = tensor(&mut r, &a, [8, 40, 32]);
                inp.keys = tensor(&mut r, &a, [4, 96, 32]);
                if r.chance(2) {
                    inp.values = tensor(&mut r, &a, [4, 96, 32]);
                }
                wide_heads(&mut r, &mut inp.queries);
                if let Some(h) = wide_heads(&mut r, &mut inp.keys) {
                    if !inp.values.data.is_null() && r.chance(2) {
                        (inp.values.extent[0], inp.values.stride[0]) = (h, 0);
                    }
                }
                let (hq, hkv, n, dk) = (
                    inp.queries.extent[0],
                    inp.keys.extent[0],
                    inp.keys.extent[1],
                    inp.keys.extent[2],
                );
                let dv = if inp.values.data.is_null() {
                    dk
                } else {
                    inp.values.extent[2]
                };
                // the lengths the call wants (sometimes given exactly, to get past them)
                let cross = sp.scorer == 2 && sp.laprox_gqa != 0;
                let g = if hkv > 0 && hq % hkv == 0 {
                    hq / hkv
                } else {
                    1
                };
                let blocks = if cross {
                    g.saturating_mul(g.saturating_add(1)) / 2
                } else {
                    g
                };
                let w = (sp.window as u64).min(n);
                let want = [
                    hkv.saturating_mul(blocks)
                        .saturating_mul(dv.saturating_mul(dv)),
                    hkv.saturating_mul(blocks).saturating_mul(n),
                    hkv.saturating_mul(n),
                    hq.saturating_mul(w),
                ];
                if r.chance(3) {
                    (inp.gram, inp.gram_len) = floats_in(&mut r, &a, want[0], true);
                }
                if r.chance(3) {
                    (inp.value_forms, inp.value_forms_len) = floats_in(&mut r, &a, want[1], true);
                }
                if r.chance(3) {
                    (inp.value_l1, inp.value_l1_len) = floats_in(&mut r, &a, want[2], true);
                }
                if inp.struct_size >= 288 && r.chance(3) {
                    (inp.row_lse, inp.row_lse_len) = floats_in(&mut r, &a, want[3], true);
                }
                // work of the kernels: window (x g for the cross pairs), vonorm
                let work = elems(&inp.queries)
                    .saturating_mul(n)
                    .saturating_mul(if cross { g.clamp(1, 16) } else { 1 });
                let vo = if inp.gram.is_null() {
                    0
                } else {
                    n.saturating_mul(inp.gram_len)
                };
                if elems(&inp.queries) > 1 << 18
                    || elems(&inp.keys) > 1 << 18
                    || elems(&inp.values) > 1 << 18
                    || work > 1 << 24
                    || vo > 1 << 24
                {
                    return;
                }
                let mut ws_q = 0u64;
                let q = (kve_cuda_score_workspace_size(sp, hq, hkv, n, dk, dv.max(1), &mut ws_q)
                    == KVE_OK)
                    .then_some(ws_q);
                let mut olen = 0u64;
                let ol = kve_score_output_len(sp, hkv, n, &mut olen);
                let max = if ol == KVE_OK && olen <= 1 << 18 {
                    olen as usize
                } else {
                    64
                };
                let o = Out::new(&mut r, &mut a, max);
                let ws = dev_workspace(&mut r, &mut a, q);
                dst_in_arena = ws.in_arena;
                st = kve_cuda_score_layer(
                    sp,
                    &inp,
                    o.ptr as *mut f32,
                    o.len,
                    ws.ptr,
                    ws.len,
                    std::ptr::null_mut(),
                );
                if debug() {
                    let rel = |p: *const c_void| offset_in(&a, p);
                    eprintln!(
                        "status {st}\nparams {:?}\nq {:?} @{}\nk {:?} @{}\nv {:?} @{}",
                        std::slice::from_raw_parts(sp as *const _ as *const u32, 12),
                        inp.queries,
                        rel(inp.queries.data),
                        inp.keys,
                        rel(inp.keys.data),
                        inp.values,
                        rel(inp.values.data)
                    );
                    eprintln!(
                        "gram @{} {} forms @{} {} l1 @{} {} lse @{} {}",
                        rel(inp.gram as _),
                        inp.gram_len,
                        rel(inp.value_forms as _),
                        inp.value_forms_len,
                        rel(inp.value_l1 as _),
                        inp.value_l1_len,
                        rel(inp.row_lse as _),
                        inp.row_lse_len
                    );
                    eprintln!(
                        "out @{} len {} (olen {olen}); ws query {q:?} @{} len {}",
                        rel(o.ptr as _),
                        o.len,
                        rel(ws.ptr),
                        ws.len
                    );
                }
                check_device_status(st, q, ws.len);
                if st == KVE_OK {
                    // what the call reads, and what it writes
                    // (queries read, values read) per scorer, as src/math/score/requirements.rs
                    let (qr, vr) = match sp.scorer {
                        4 | 5 => (false, false),
                        1 => (true, true),
                        7 => (false, true), // uniqueness: keys and values, no queries
                        2 => (true, inp.value_forms.is_null()),
                        _ => (true, false),
                    };
                    let mut reads = vec![span(&inp.keys)];
                    if qr {
                        reads.push(span(&inp.queries));
                        reads.push(span_n(inp.row_lse as _, inp.row_lse_len, 4));
                    }
                    if vr {
                        reads.push(span(&inp.values));
                    }
                    if sp.scorer == 2 {
                        reads.push(span_n(inp.value_forms as _, inp.value_forms_len, 4));
                        if inp.value_forms.is_null() {
                            reads.push(span_n(inp.gram as _, inp.gram_len, 4));
                        }
                    }
                    if sp.scorer == 3 {
                        reads.push(span_n(inp.value_l1 as _, inp.value_l1_len, 4));
                    }
                    // (LaProx given value forms uses less workspace than the query sized)
                    let ws_used = if sp.scorer == 2 && !inp.value_forms.is_null() {
                        0
                    } else {
                        q.unwrap_or(0).min(ws.len)
                    };
                    let writes = [span_n(o.ptr as _, olen, 4), span_n(ws.ptr, ws_used, 1)];
                    for wr in writes {
                        for rd in &reads {
                            assert!(
                                !overlaps(wr, *rd),
                                "device output or workspace over an input accepted"
                            );
                        }
                    }
                    for rd in &reads {
                        assert!(
                            unchanged(&a, &before, *rd),
                            "an input of the device call modified"
                        );
                    }
                    assert!(
                        !overlaps(writes[0], writes[1]),
                        "device output over its workspace accepted"
                    );
                }
                outs.push(o);
            }
            10 => {
                // kve_cuda_select_model: op 4 on the device
                let sp0 = select_params(&mut r);
                let spb = padded(&mut r, sp0);
                let sp = &spb.p;
                let (layers, hkv, n, w) = (r.size(6), r.size(4), r.size(120), r.u8() as u64 % 40);
                let off = (r.u8() as usize % 64) * 4 + if r.chance(32) { 2 } else { 0 };
                let room = ((ARENA - off) / 4) as u64;
                let len = if r.chance(4) {
                    r.u32() as u64 % room
                } else {
                    layers
                        .saturating_mul(hkv)
                        .saturating_mul(n.saturating_sub(w))
                        .min(room)
                };
                let ms = kve_model_scores {
                    scores: a.base().add(off) as *const f32,
                    len,
                    layers,
                    hkv,
                    n,
                    window: w,
                };
                let units = layers.saturating_mul(hkv);
                let p = n - w.min(n);
                let mut wl = 0u64;
                let q = (kve_cuda_select_model_workspace_size(sp, layers, hkv, n, w, &mut wl)
                    == KVE_OK)
                    .then_some(wl);
                let ld = if r.chance(8) {
                    [
                        0,
                        p,
                        n.wrapping_sub(1),
                        n.wrapping_add(1),
                        1 << 31,
                        (1 << 31) - 1,
                        u64::MAX,
                        r.u64(),
                    ][r.u8() as usize % 8]
                } else {
                    n.saturating_add(r.u8() as u64 % 4)
                };
                let sane = q.is_some()
                    && units <= 1 << 14
                    && ld <= 1 << 16
                    && units.saturating_mul(ld) <= 1 << 18;
                let (cmax, imax) = if sane {
                    (units as usize, (units * ld) as usize)
                } else {
                    (16, 256)
                };
                let c = Out::new(&mut r, &mut a, cmax);
                let i = Out::new(&mut r, &mut a, imax);
                let ws = dev_workspace(&mut r, &mut a, q);
                dst_in_arena = ws.in_arena;
                st = kve_cuda_select_model(
                    sp,
                    &ms,
                    c.ptr as *mut i32,
                    c.len,
                    i.ptr as *mut i32,
                    ld,
                    i.len,
                    ws.ptr,
                    ws.len,
                    std::ptr::null_mut(),
                );
                if debug() {
                    let rel = |p: *const c_void| offset_in(&a, p);
                    eprintln!("status {st}\nparams {:?}\nscores @{} len {len} layers {layers} hkv {hkv} n {n} w {w}", std::slice::from_raw_parts(sp as *const _ as *const u32, 12), rel(ms.scores as _));
                    eprintln!(
                        "counts @{} len {}; idx @{} ld {ld} len {}; ws query {q:?} @{} len {}",
                        rel(c.ptr as _),
                        c.len,
                        rel(i.ptr as _),
                        i.len,
                        rel(ws.ptr),
                        ws.len
                    );
                }
                check_device_status(st, q, ws.len);
                if st == KVE_OK {
                    let sc = span_n(ms.scores as _, units * p, 4);
                    let writes = [
                        span_n(c.ptr as _, units, 4),
                        span_n(i.ptr as _, (units - 1) * ld + n, 4),
                        span_n(ws.ptr, q.unwrap_or(0).min(ws.len), 1),
                    ];
                    for (k, wr) in writes.iter().enumerate() {
                        assert!(
                            !overlaps(*wr, sc),
                            "device selection output over the scores"
                        );
                        for other in &writes[k + 1..] {
                            assert!(
                                !overlaps(*wr, *other),
                                "device selection outputs overlapping"
                            );
                        }
                    }
                    assert!(
                        unchanged(&a, &before, sc),
                        "device selection modified its scores"
                    );
                    if !c.in_arena && !i.in_arena {
                        for u in 0..units as usize {
                            let cnt = c.own[u] as i32;
                            assert!(
                                cnt >= 0 && cnt as u64 <= n,
                                "count {cnt} of unit {u} (N = {n})"
                            );
                            let row = &i.own[u * ld as usize..u * ld as usize + cnt as usize];
                            assert!(
                                row.windows(2).all(|x| (x[0] as i32) < x[1] as i32),
                                "ascending"
                            );
                            assert!(
                                row.iter().all(|&x| (x as i32) >= 0 && (x as u64) < n),
                                "in range"
                            );
                            // the whole window closes every list
                            let wn = (n - p) as usize;
                            assert!(
                                row.len() >= wn
                                    && row[row.len() - wn..]
                                        .iter()
                                        .zip(p as u32..)
                                        .all(|(&x, y)| x == y),
                                "window listed"
                            );
                        }
                        // the kept sets are the host's (where the host accepts the scores)
                        let (mut hol, mut hil, mut hwl) = (0u64, 0u64, 0u64);
                        if p > 0
                            && layers <= 1 << 12
                            && kve_select_output_len(sp, layers, hkv, n, w, &mut hol, &mut hil)
                                == KVE_OK
                            && kve_select_workspace_size(sp, layers, hkv, n, w, &mut hwl) == KVE_OK
                            && hil <= 1 << 20
                            && hwl <= 64 << 20
                        {
                            let mut ho = vec![0u64; hol as usize];
                            let mut hi = vec![0u32; hil as usize];
                            let mut hw = vec![0u8; hwl as usize];
                            let hs = kve_select_model(
                                sp,
                                &ms,
                                ho.as_mut_ptr(),
                                hol,
                                hi.as_mut_ptr(),
                                hil,
                                hw.as_mut_ptr() as *mut c_void,
                                hwl,
                            );
                            if hs == KVE_OK {
                                for u in 0..units as usize {
                                    let host = &hi[ho[u] as usize..ho[u + 1] as usize];
                                    let dev = &i.own
                                        [u * ld as usize..u * ld as usize + c.own[u] as usize];
                                    assert_eq!(
                                        dev, host,
                                        "unit {u}: device kept list differs from the host's"
                                    );
                                }
                            }
                        }
                    }
                }
                outs.push(c);
                outs.push(i);
            }
            8 => {
                // sharded search end to end over two shards
                let sp = select_params(&mut r);
                let (layers, hkv, n, w) = (
                    1 + r.u8() as u64 % 6,
                    1 + r.u8() as u64 % 4,
                    1 + r.u8() as u64 % 100,
                    r.u8() as u64 % 40,
                );
                let split = r.u8() as u64 % (layers + 1);
                let p = n - w.min(n);
                let scores =
                    std::slice::from_raw_parts(a.base() as *const f32, (layers * hkv * p) as usize);
                let mut s: kve_search = std::mem::zeroed();
                st = kve_search_init(&mut s, &sp, layers, hkv, n, w);
                if st == KVE_OK {
                    let mut done = 0;
                    let mut rounds = 0;
                    let mut failed = false;
                    while done == 0 && !failed {
                        let mut total: kve_histogram = std::mem::zeroed();
                        for (l0, ln) in [(0, split), (split, layers - split)] {
                            if ln == 0 {
                                continue;
                            }
                            let part =
                                &scores[(l0 * hkv * p) as usize..((l0 + ln) * hkv * p) as usize];
                            let ms = kve_model_scores {
                                scores: part.as_ptr(),
                                len: part.len() as u64,
                                layers: ln,
                                hkv,
                                n,
                                window: w,
                            };
                            let mut wl = 0u64;
                            assert_eq!(
                                kve_select_shard_workspace_size(&sp, ln, hkv, n, w, &mut wl),
                                KVE_OK
                            );
                            let mut ws = vec![0u8; wl as usize];
                            let mut h: kve_histogram = std::mem::zeroed();
                            let c = kve_search_count_shard(
                                &sp,
                                &ms,
                                l0,
                                &s,
                                &mut h,
                                ws.as_mut_ptr() as *mut c_void,
                                wl,
                            );
                            if c != KVE_OK {
                                assert!(
                                    h.bins.iter().all(|&b| b == 0),
                                    "histogram written on error"
                                );
                                failed = true;
                                break;
                            }
                            assert_eq!(kve_histogram_merge(&mut total, &h), KVE_OK);
                        }
                        if !failed {
                            assert_eq!(kve_search_step(&mut s, &total, &mut done), KVE_OK);
                            rounds += 1;
                            assert!(rounds <= 13, "search did not finish");
                        }
                    }
                    if !failed {
                        let mut thr = 0f32;
                        assert_eq!(kve_search_threshold(&s, &mut thr), KVE_OK);
                        let ms = kve_model_scores {
                            scores: scores.as_ptr(),
                            len: scores.len() as u64,
                            layers,
                            hkv,
                            n,
                            window: w,
                        };
                        let (mut ol, mut il, mut wl) = (0u64, 0u64, 0u64);
                        assert_eq!(
                            kve_select_shard_output_len(layers, hkv, n, &mut ol, &mut il),
                            KVE_OK
                        );
                        assert_eq!(
                            kve_select_shard_workspace_size(&sp, layers, hkv, n, w, &mut wl),
                            KVE_OK
                        );
                        let mut o = vec![0u32; ol as usize * 2];
                        let mut i = vec![0u32; il as usize];
                        let mut ws = vec![0u8; wl as usize];
                        assert_eq!(
                            kve_select_shard(
                                &sp,
                                &ms,
                                0,
                                &s,
                                o.as_mut_ptr() as *mut u64,
                                ol,
                                i.as_mut_ptr(),
                                il,
                                ws.as_mut_ptr() as *mut c_void,
                                wl
                            ),
                            KVE_OK
                        );
                        check_csr(
                            &o,
                            (layers * hkv) as usize + 1,
                            &i,
                            (layers * hkv) as usize,
                            n,
                        );
                    }
                }
            }
            11 => {
                // the query stream: size, start, feed chunks, then finish (scores, raw
                // statistics or the count); arguments sometimes placed inside the state or
                // the workspace
                let hq = r.size(8);
                let hkv = if r.chance(8) {
                    r.size(4)
                } else {
                    [1, 2, hq.max(1)][r.u8() as usize % 3]
                };
                let (n, dk) = (r.size(96), r.size(32));
                let mut bytes = 0u64;
                if kve_stream_state_size(hq, hkv, n, dk, &mut bytes) != KVE_OK || bytes > 1 << 20 {
                    assert_ne!(
                        kve_stream_state_size(hq, hkv, n, dk, std::ptr::null_mut()),
                        KVE_OK
                    );
                    return;
                }
                let mut state = State::new(&mut r, bytes);
                let s0 = state.bytes();
                let ist = kve_stream_init(state.ptr as *mut c_void, state.len, hq, hkv, n, dk);
                if ist != KVE_OK {
                    assert!(state.bytes() == s0, "state written by a refused init");
                    return;
                }
                let mut fed = 0u64;
                let mut last = 0i64;
                for _ in 0..1 + r.u8() % 3 {
                    let c = if r.chance(16) {
                        r.size(8)
                    } else {
                        1 + r.u8() as u64 % 8
                    };
                    let mut q = tensor(&mut r, &a, [8, 8, 32]);
                    fit(&mut r, &a, &mut q, [hq, c, dk]);
                    let mut k = tensor(&mut r, &a, [4, 96, 32]);
                    fit(&mut r, &a, &mut k, [hkv, n, dk]);
                    if elems(&q).saturating_mul(n) > 1 << 20 || elems(&k) > 1 << 16 || c > 1 << 12 {
                        return;
                    }
                    let npos = if r.chance(16) { c.wrapping_add(1) } else { c };
                    let mut pos: Vec<i64> = Vec::new();
                    for _ in 0..npos.min(64) {
                        last = if r.chance(24) {
                            r.u64() as i64
                        } else {
                            last.saturating_add((r.u8() % 4) as i64)
                        };
                        pos.push(last);
                    }
                    let npos = npos.min(pos.len() as u64);
                    let (mut lse, mut lse_len) = (std::ptr::null::<f32>(), 0u64);
                    if r.chance(3) {
                        let off = (r.u8() as usize % 64) * 4 + if r.chance(24) { 2 } else { 0 };
                        let room = ((ARENA - off) / 4) as u64;
                        let want = hq.saturating_mul(c);
                        lse_len = if want < room && !r.chance(8) {
                            want
                        } else {
                            r.u32() as u64 % room
                        };
                        lse = a.base().add(off) as *const f32;
                    }
                    let mut wq = 0u64;
                    let qsz = (kve_stream_feed_workspace_size(hq, hkv, n, dk, c, &mut wq)
                        == KVE_OK)
                        .then_some(wq);
                    let mut ws = workspace(&mut r, qsz);
                    let (mut wsp, mut wsl) = (ws.as_mut_ptr(), ws.len() as u64);
                    // arguments placed over the state or the workspace: never accepted
                    let mut placed = false;
                    let (mut qd, mut kd, mut pp): (
                        *const kve_tensor,
                        *const kve_tensor,
                        *const i64,
                    ) = (&q, &k, pos.as_ptr());
                    match r.u8() % 24 {
                        0 => {
                            let p = state.inside(&mut r, TD) as *mut kve_tensor;
                            p.write(q);
                            (qd, placed) = (p, true);
                        }
                        1 => {
                            let p = state.inside(&mut r, TD) as *mut kve_tensor;
                            p.write(k);
                            (kd, placed) = (p, true);
                        }
                        2 if !pos.is_empty() && pos.len() as u64 * 8 + 16 <= state.len => {
                            let p = state.inside(&mut r, pos.len() * 8) as *mut i64;
                            std::ptr::copy_nonoverlapping(pos.as_ptr(), p, pos.len());
                            (pp, placed) = (p, true);
                        }
                        3 if ws.len() >= TD => {
                            (ws.as_mut_ptr() as *mut kve_tensor).write_unaligned(q);
                            (qd, placed) = (ws.as_ptr() as *const kve_tensor, true);
                        }
                        4 => {
                            let p = state.inside(&mut r, 8);
                            (wsp, wsl, placed) = (p, wsl.min(8), true);
                        }
                        _ => {}
                    }
                    let snap = state.bytes();
                    let fst = kve_stream_feed(
                        state.ptr as *mut c_void,
                        state.len,
                        qd,
                        pp,
                        npos,
                        kd,
                        lse,
                        lse_len,
                        wsp as *mut c_void,
                        wsl,
                    );
                    if debug() {
                        eprintln!("stream feed {fst}: shape {hq} {hkv} {n} {dk}, c {c}, q {:?}, k {:?}, positions {pos:?} ({npos}), lse len {lse_len}, ws {wsl}, placed {placed}", q.extent, k.extent);
                    }
                    if placed {
                        assert_ne!(
                            fst, KVE_OK,
                            "an argument over the state or the workspace accepted"
                        );
                    }
                    if fst != KVE_OK {
                        assert!(
                            state.bytes() == snap,
                            "state written by a refused feed (status {fst})"
                        );
                        assert!(a.bytes() == &before[..], "arena written by a refused feed");
                        if placed || r.chance(2) {
                            return;
                        }
                        continue;
                    }
                    // what the feed read stays as it was, and the state counts the chunk
                    assert!(a.bytes() == &before[..], "feed wrote into its inputs");
                    fed += npos;
                    let mut cnt = 0u64;
                    assert_eq!(
                        kve_stream_query_count(state.ptr as *const c_void, state.len, &mut cnt),
                        KVE_OK
                    );
                    assert_eq!(cnt, fed, "query count");
                }
                let sp = state.ptr as *const c_void;
                match r.u8() % 3 {
                    0 => {
                        let p0 = stream_params(&mut r);
                        let pb = padded(&mut r, p0);
                        let p = &pb.p;
                        let mut v = kve_tensor::NONE;
                        if r.chance(2) {
                            v = tensor(&mut r, &a, [4, 96, 32]);
                            let dv = if r.chance(2) { dk } else { v.extent[2] };
                            fit(&mut r, &a, &mut v, [hkv, n, dv]);
                        }
                        if elems(&v) > 1 << 16 {
                            return;
                        }
                        let g = if hkv > 0 { hq / hkv } else { 1 };
                        let dv = v.extent[2];
                        let want = [
                            hkv.saturating_mul(g).saturating_mul(dv.saturating_mul(dv)),
                            hkv.saturating_mul(g).saturating_mul(n),
                        ];
                        let fl = |r: &mut R, want: u64| match r.chance(3) {
                            true => floats_in(r, &a, want, false),
                            false => (std::ptr::null::<f32>(), 0u64),
                        };
                        let (gram, gl) = fl(&mut r, want[0]);
                        let (forms, fl_) = fl(&mut r, want[1]);
                        if gl.saturating_mul(n) > 1 << 22 {
                            return;
                        }
                        let vd: *const kve_tensor = if v.data.is_null() && r.chance(2) {
                            std::ptr::null()
                        } else {
                            &v
                        };
                        let olen = hkv.saturating_mul(n);
                        let o = Out::new(&mut r, &mut a, olen.min(1 << 14) as usize);
                        let mut wq = 0u64;
                        let qsz = (kve_stream_scores_workspace_size(hq, hkv, n, dk, &mut wq)
                            == KVE_OK)
                            .then_some(wq);
                        let mut ws = workspace(&mut r, qsz);
                        // the params or the values descriptor inside the output: refused
                        let over = !o.in_arena
                            && !o.ptr.is_null()
                            && o.len as usize >= 2 + TD / 4
                            && r.chance(16);
                        let (mut pd, mut vdd) = (p as *const kve_stream_score_params, vd);
                        if over {
                            if r.chance(2) {
                                (o.ptr.add(2) as *mut kve_stream_score_params).write_unaligned(*p);
                                pd = o.ptr.add(2) as *const _;
                            } else {
                                (o.ptr.add(2) as *mut kve_tensor).write_unaligned(v);
                                vdd = o.ptr.add(2) as *const _;
                            }
                        }
                        let snap = state.bytes();
                        st = kve_stream_scores(
                            sp,
                            state.len,
                            pd,
                            vdd,
                            gram,
                            gl,
                            forms,
                            fl_,
                            o.ptr as *mut f32,
                            o.len,
                            ws.as_mut_ptr() as *mut c_void,
                            ws.len() as u64,
                        );
                        assert!(state.bytes() == snap, "scores wrote into the state");
                        if debug() {
                            eprintln!("stream scores {st}: stat {}, fed {fed}, values {:?}, gram {gl}, forms {fl_}, out {}", p.stat, v.extent, o.len);
                        }
                        if over {
                            assert_ne!(
                                st, KVE_OK,
                                "scores over the params or the values descriptor accepted"
                            );
                            // (the harness wrote into that output itself: checked here)
                            assert!(a.bytes() == &before[..], "arena written by a refused call");
                            return;
                        }
                        if st == KVE_OK {
                            let reads = [
                                span(&v),
                                span_n(gram as _, gl, 4),
                                span_n(forms as _, fl_, 4),
                                span_n(sp, state.len, 1),
                            ];
                            for rd in reads {
                                assert!(
                                    !overlaps(span_n(o.ptr as _, olen, 4), rd),
                                    "stream scores over an input accepted"
                                );
                            }
                            if !o.in_arena {
                                let s =
                                    std::slice::from_raw_parts(o.ptr as *const f32, olen as usize);
                                assert!(s.iter().all(|x| x.is_finite()), "non-finite stream score");
                            }
                        }
                        outs.push(o);
                    }
                    1 => {
                        let hn = hq.saturating_mul(n);
                        let cap = hn.min(1 << 14) as usize;
                        let m = Out::new(&mut r, &mut a, cap);
                        let s_ = Out::new(&mut r, &mut a, cap);
                        let q2 = Out::new(&mut r, &mut a, cap);
                        let sn = Out::new(&mut r, &mut a, 2 * n.min(1 << 13) as usize);
                        let sn = Out {
                            len: sn.len / 2,
                            ..sn
                        };
                        let len = [m.len, s_.len, q2.len][r.u8() as usize % 3];
                        let snap = state.bytes();
                        st = kve_stream_stats(
                            sp,
                            state.len,
                            m.ptr as *mut f32,
                            s_.ptr as *mut f32,
                            q2.ptr as *mut f32,
                            len,
                            sn.ptr as *mut u64,
                            sn.len,
                        );
                        assert!(state.bytes() == snap, "stats wrote into the state");
                        if debug() {
                            eprintln!("stream stats {st}: fed {fed}, len {len}, seen {}", sn.len);
                        }
                        if st == KVE_OK && ![&m, &s_, &q2, &sn].iter().any(|o| o.in_arena) {
                            let seen = std::slice::from_raw_parts(sn.ptr as *const u64, n as usize);
                            assert_eq!(
                                seen.iter().sum::<u64>(),
                                fed,
                                "seen does not add up to the queries fed"
                            );
                            for o in [&m, &s_, &q2] {
                                let x =
                                    std::slice::from_raw_parts(o.ptr as *const f32, hn as usize);
                                assert!(
                                    x.iter().all(|v| v.is_finite() && *v >= 0.0),
                                    "statistic negative or non-finite"
                                );
                            }
                        }
                        outs.extend([m, s_, q2, sn]);
                    }
                    _ => {
                        let mut cnt = CANARY as u64;
                        let inside = r.chance(8);
                        let cp = if inside {
                            state.inside(&mut r, 8) as *mut u64
                        } else {
                            &mut cnt
                        };
                        let snap = state.bytes();
                        st = kve_stream_query_count(sp, state.len, cp);
                        if inside {
                            assert_ne!(st, KVE_OK, "query count over the state accepted");
                        } else if st == KVE_OK {
                            assert_eq!(cnt, fed);
                        } else {
                            assert_eq!(cnt, CANARY as u64, "count written on error");
                        }
                        assert!(state.bytes() == snap, "query count wrote into the state");
                    }
                }
            }
            12 => {
                let device = r.chance(2);
                st = evictor_calls(&mut r, &a, &mut outs, device)
            }
            13 => {
                // paged caches: a pool layout over the arena (an engine's kind, or four
                // arbitrary strides and an offset), a block table (sometimes read from the
                // arena), a length; then a gather, or an in-place compaction with lists,
                // positions and outputs sometimes placed inside the pool
                let dtype = r.enum_val(5); // q8_0/q4_0 pools: refused
                let es = if dtype == 0 { 4u64 } else { 2 };
                let off = if r.chance(6) {
                    r.u8() as usize % 64
                } else {
                    (r.u8() as usize % 64) * 8
                };
                let max_len = (ARENA - off) as u64 / es;
                let len = if r.chance(3) {
                    r.u32() as u64 % (max_len + 1)
                } else {
                    max_len
                };
                let data = a.base().add(off) as *const c_void;
                let (nb, bs, h, d) = (r.size(16), r.size(8), r.size(4), r.size(16));
                let mut kl: kve_paged_layout = std::mem::zeroed();
                let init = if r.chance(3) {
                    kl = kve_paged_layout {
                        data: if r.chance(40) { std::ptr::null() } else { data },
                        len,
                        dtype,
                        pad: if r.chance(50) { 1 } else { 0 },
                        offset: r.size(64) / 2,
                        num_blocks: nb,
                        block_size: bs,
                        heads: h,
                        dim: d,
                        stride: [
                            r.size(2048) / 2,
                            r.size(64) / 2,
                            r.size(64) / 2,
                            r.size(4) / 2,
                        ],
                    };
                    KVE_OK
                } else {
                    let (kind, layers, layer, kv) = (
                        r.enum_val(6),
                        1 + r.u8() as u64 % 3,
                        r.u8() as u64 % 3,
                        r.u8() as u32 % 3,
                    );
                    let s0 = kve_paged_layout_init(
                        &mut kl, kind, data, len, dtype, nb, bs, h, d, layers, layer, kv,
                    );
                    if s0 != KVE_OK {
                        assert!(
                            kl.data.is_null() && kl.len == 0 && kl.stride == [0; 4],
                            "layout written on error"
                        );
                    }
                    s0
                };
                // the table: its own memory or words of the arena
                let tl = r.u8() as usize % 12;
                let own_table: Vec<u32> = (0..tl)
                    .map(|_| {
                        if r.chance(8) {
                            r.u32()
                        } else {
                            r.u8() as u32 % (nb.min(64) as u32 + 1)
                        }
                    })
                    .collect();
                let table: *const u32 = if r.chance(10) {
                    a.base().add((r.u8() as usize % 64) * 4) as *const u32
                } else if tl == 0 && r.chance(2) {
                    std::ptr::null()
                } else {
                    own_table.as_ptr()
                };
                let n = if r.chance(4) {
                    r.size(1 << 20)
                } else {
                    r.u8() as u64 % 100
                };
                let tspan = span_n(table as *const c_void, tl as u64, 4);
                let pool_span = if kl.data.is_null() {
                    (0, 0)
                } else {
                    span_n(kl.data, kl.len, es)
                };
                if init != KVE_OK {
                    st = init;
                } else if r.chance(2) {
                    let mut bytes = CANARY as u64;
                    let q = kve_paged_gather_size(&kl, n, &mut bytes);
                    let mut dst = workspace(&mut r, if q == KVE_OK { Some(bytes) } else { None });
                    let (dptr, dlen) = if r.chance(16) {
                        let o = (r.u8() as usize % 64) * 8;
                        (
                            a.base().add(o) as *mut u8,
                            (ARENA - o).min(dst.len()) as u64,
                        )
                    } else {
                        (dst.as_mut_ptr(), dst.len() as u64)
                    };
                    let dspan = span_n(dptr as *const c_void, dlen, 1);
                    let mut out = kve_tensor {
                        data: 0x40 as *const c_void,
                        len: 77,
                        dtype: 9,
                        pad: 9,
                        extent: [9; 3],
                        stride: [9; 3],
                    };
                    st = kve_paged_gather(
                        &kl,
                        table,
                        tl as u64,
                        n,
                        dptr as *mut c_void,
                        dlen,
                        &mut out,
                    );
                    if debug() {
                        eprintln!("paged gather n={n} bs={} st={st}", kl.block_size);
                    }
                    if st == KVE_OK {
                        assert_eq!(q, KVE_OK, "gather accepted a layout its size query refused");
                        assert!(
                            !overlaps(dspan, pool_span) && !overlaps(dspan, tspan),
                            "gather into its inputs accepted"
                        );
                        dst_in_arena =
                            dspan.0 >= a.base() as usize && dspan.0 < a.base() as usize + ARENA;
                        assert_eq!(out.extent, [kl.heads, n, kl.dim]);
                        assert_eq!(out.len, kl.heads * n * kl.dim);
                        let o = out.data as usize;
                        assert!(
                            o >= dspan.0 && o + (out.len * es) as usize <= dspan.1,
                            "gathered tensor outside dst"
                        );
                        // every element is the pool's element through the table
                        let t = std::slice::from_raw_parts(table, tl);
                        for hh in 0..kl.heads {
                            for tok in 0..n {
                                for c in 0..kl.dim {
                                    let src = kl.offset
                                        + t[(tok / kl.block_size) as usize] as u64 * kl.stride[0]
                                        + (tok % kl.block_size) * kl.stride[1]
                                        + hh * kl.stride[2]
                                        + c * kl.stride[3];
                                    let dsti = (hh * n + tok) * kl.dim + c;
                                    let (sp, dp) = (
                                        (kl.data as usize) + (src * es) as usize,
                                        o + (dsti * es) as usize,
                                    );
                                    let eq = if es == 4 {
                                        *(sp as *const u32) == *(dp as *const u32)
                                    } else {
                                        *(sp as *const u16) == *(dp as *const u16)
                                    };
                                    assert!(eq, "gathered element differs from the pool's");
                                }
                            }
                        }
                    } else {
                        assert!(
                            out.data as usize == 0x40 && out.len == 77 && out.extent == [9; 3],
                            "out written on error"
                        );
                        // dst is scratch on error (the table check's bitmap), as a workspace
                        scratch_back(&mut a, &before, dspan);
                    }
                } else {
                    // kept lists: one shared or one per head, mostly ascending and in range
                    let lists = if r.chance(2) || h > 64 { 1 } else { h as usize };
                    let mut offs = vec![0u64];
                    let mut idx: Vec<u32> = Vec::new();
                    let span_n_ = n.min(4096) as u32;
                    for _ in 0..lists {
                        let mut p = 0u32;
                        while p < span_n_ && idx.len() < 512 {
                            if r.chance(3) {
                                idx.push(p);
                            }
                            p += 1 + r.u8() as u32 % 3;
                        }
                        if r.chance(30) {
                            idx.push(r.u32() % (span_n_ + 2));
                        }
                        offs.push(idx.len() as u64);
                    }
                    if r.chance(30) {
                        let k = r.u8() as usize % offs.len();
                        offs[k] = r.size(1024);
                    }
                    let total = (offs[offs.len() - 1].saturating_sub(offs[0])).min(4096) as usize;
                    let pos_own: Vec<u32> = (0..n.min(4096) as u32).map(|i| i * 3 + 1).collect();
                    let (pos, pos_len) = if r.chance(2) {
                        (std::ptr::null(), 0)
                    } else {
                        (pos_own.as_ptr(), pos_own.len() as u64)
                    };
                    let kept = Out::new(&mut r, &mut a, total);
                    let lens = Out::new(&mut r, &mut a, h.min(64) as usize);
                    let mut freed = CANARY as u64;
                    let fp: *mut u64 = if r.chance(40) {
                        std::ptr::null_mut()
                    } else {
                        &mut freed
                    };
                    let mut q = 0u64;
                    let qs = kve_paged_compact_workspace_size(&kl, &mut q);
                    let mut ws = workspace(&mut r, if qs == KVE_OK { Some(q) } else { None });
                    let (wp, wl) = if r.chance(16) {
                        let o = (r.u8() as usize % 64) * 8;
                        (
                            a.base().add(o) as *mut u8,
                            (ARENA - o).min(ws.len().max(64)) as u64,
                        )
                    } else {
                        (ws.as_mut_ptr(), ws.len() as u64)
                    };
                    let wspan = span_n(wp as *const c_void, wl, 1);
                    let ospan = span_n(offs.as_ptr() as *const c_void, offs.len() as u64, 8);
                    let ispan = span_n(idx.as_ptr() as *const c_void, idx.len() as u64, 4);
                    st = kve_paged_compact(
                        &kl,
                        table,
                        tl as u64,
                        n,
                        offs.as_ptr(),
                        offs.len() as u64,
                        idx.as_ptr(),
                        idx.len() as u64,
                        pos,
                        pos_len,
                        kept.ptr,
                        kept.len,
                        lens.ptr,
                        lens.len,
                        fp,
                        wp as *mut c_void,
                        wl,
                    );
                    if debug() {
                        eprintln!(
                            "paged compact n={n} bs={} lists={} st={st}",
                            kl.block_size,
                            offs.len() - 1
                        );
                    }
                    if st == KVE_OK {
                        for o in [kept.span(), lens.span(), wspan] {
                            assert!(
                                !overlaps(o, pool_span)
                                    && !overlaps(o, tspan)
                                    && !overlaps(o, ospan)
                                    && !overlaps(o, ispan),
                                "compaction output over an input accepted"
                            );
                        }
                        dst_in_arena = true; // the pool lives in the arena
                        let before_blocks = n.div_ceil(kl.block_size);
                        assert!(freed <= before_blocks, "more blocks freed than held");
                        let most = (0..offs.len() - 1)
                            .map(|u| offs[u + 1] - offs[u])
                            .max()
                            .unwrap_or(0);
                        assert_eq!(freed, before_blocks - most.div_ceil(kl.block_size));
                        if !kept.ptr.is_null() && !kept.in_arena {
                            let k = std::slice::from_raw_parts(kept.ptr, total);
                            let list = &idx[offs[0] as usize..offs[offs.len() - 1] as usize];
                            for (j, &t) in list.iter().enumerate() {
                                let want = if pos.is_null() {
                                    t
                                } else {
                                    pos_own[t as usize]
                                };
                                assert_eq!(k[j], want, "kept position");
                            }
                        }
                    } else {
                        assert_eq!(freed, CANARY as u64, "blocks_freed written on error");
                        scratch_back(&mut a, &before, wspan);
                    }
                    outs.extend([kept, lens]);
                }
            }
            _ => unreachable!(),
        }
    }
    let _ = kve_status_name(st);
    if st != KVE_OK {
        for o in &outs {
            assert!(o.untouched(), "output written on error (status {st})");
        }
        assert!(
            a.bytes() == &before[..],
            "arena written on error (status {st})"
        );
    } else {
        let arena_changed = a.bytes() != &before[..];
        let wrote_in_arena = dst_in_arena || outs.iter().any(|o| o.in_arena);
        assert!(
            !arena_changed || wrote_in_arena,
            "input arena modified (op {op})"
        );
    }
});

/// An evictor's host form or device form (its host context and device block, the
/// device block registered with the emulator).
enum Ev {
    Host(*mut kve_evictor),
    // (the registration is held while the device block lives)
    Device(
        *mut kve_cuda_evictor,
        Vec<u64>,
        Vec<u64>,
        #[allow(dead_code)] Registered,
    ),
}

impl Ev {
    /// What a refused call leaves as it was: the host form's context bytes (its
    /// workspace aside); the device form's host context and device block.
    fn snapshot(&self) -> Vec<u8> {
        match self {
            Ev::Host(ev) => unsafe { kvevict::Evictor::from_block(*ev as *mut u8) }
                .unwrap()
                .context_bytes()
                .to_vec(),
            Ev::Device(_, host, dev, _) => {
                let b = |v: &Vec<u64>| unsafe {
                    std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 8).to_vec()
                };
                [b(host), b(dev)].concat()
            }
        }
    }
}

/// `round` on a fresh host evictor of config `c` (its fill data reset): the status and,
/// on success, the kept cells.
unsafe fn host_twin_round(
    c: &kve_evictor_config,
    seq: u64,
    round: &kve_evictor_round,
    fd: &mut FillData,
    max: usize,
) -> (i32, Vec<u32>) {
    let mut bytes = 0u64;
    let st = kve_evictor_size(c, &mut bytes);
    if st != KVE_OK {
        return (st, Vec::new());
    }
    let mut mem = vec![0u64; bytes as usize / 8 + 1];
    let mut ev = std::ptr::null_mut();
    let st = kve_evictor_init(mem.as_mut_ptr() as *mut c_void, bytes, c, &mut ev);
    if st != KVE_OK {
        return (st, Vec::new());
    }
    (fd.calls, fd.failed) = (0, false);
    let (mut kept, mut count) = (vec![0u32; max], 0u64);
    let st = kve_evictor_run_round(ev, seq, round, kept.as_mut_ptr(), max as u64, &mut count);
    kept.truncate(if st == KVE_OK { count as usize } else { 0 });
    (st, kept)
}

/// An evictor (host form, or the device form when `device`) from an arbitrary config,
/// then up to 12 arbitrary calls on it with views over the arena (device memory for the
/// device form); returns the last status. A compaction works on a copy of the arena.
unsafe fn evictor_calls(r: &mut R, a: &Arena, outs: &mut Vec<Out>, device: bool) -> i32 {
    let mut c: kve_evictor_config = std::mem::zeroed();
    let size = if r.chance(2) {
        KVE_EVICTOR_CONFIG_V1_SIZE
    } else {
        KVE_EVICTOR_CONFIG_V2_SIZE
    };
    if kve_evictor_config_init(&mut c, size, r.enum_val(kve_preset_count())) != KVE_OK {
        c.struct_size = size;
    }
    if size == KVE_EVICTOR_CONFIG_V2_SIZE {
        (c.paged, c.paged_dtype) = (r.u8() as u32 % 3, r.enum_val(5));
    }
    c.preset = r.enum_val(kve_preset_count());
    (c.layers, c.hq, c.hkv) = (r.size(4), r.size(8), r.size(4));
    (c.dk, c.dv, c.d_model) = (r.size(16), r.size(16), r.size(16));
    (c.max_cells, c.max_seqs) = (r.size(96), r.size(3));
    c.window = if r.chance(2) { 0 } else { r.u8() as u32 % 40 };
    c.granularity = if r.chance(2) {
        KVE_EVICTOR_PRESET_GRANULARITY
    } else {
        r.enum_val(3)
    };
    c.policy = r.enum_val(3);
    c.keep_ratio = [0.5, 0.0, 1.0, 1.5, f64::NAN][r.u8() as usize % 5];
    (c.min_keep, c.high, c.low) = (r.size(64), r.size(96), r.size(96));
    c.link_threshold = [0.0, 0.5, f32::NAN][r.u8() as usize % 3];
    let (sp, sl) = (score_params(r), select_params(r));
    let (sp, sl) = (padded(r, sp), padded(r, sl));
    if r.chance(6) {
        c.score = &sp.p;
    }
    if r.chance(6) {
        c.select = &sl.p;
    }
    let sane = r.chance(2);
    if sane {
        // a small valid model and budget (arbitrary ones are almost always refused at
        // init, and the calls after it are the point)
        c.preset = r.u8() as u32 % kve_preset_count();
        c.hkv = 1 + r.u8() as u64 % 2;
        c.hq = c.hkv * (1 + r.u8() as u64 % 2);
        (c.layers, c.dk) = (1 + r.u8() as u64 % 2, 4 << (r.u8() % 2));
        (c.dv, c.d_model) = (c.dk, 8);
        (c.max_cells, c.max_seqs) = (8 + r.u8() as u64 % 56, 1 + r.u8() as u64 % 2);
        c.window = r.u8() as u32 % 8;
        c.keep_ratio = 0.5;
        (c.min_keep, c.high, c.low) = (0, c.max_cells, c.max_cells / 2);
        c.link_threshold = 0.0;
        (c.policy, c.granularity) = (r.u8() as u32 % 3, KVE_EVICTOR_PRESET_GRANULARITY);
        (c.score, c.select) = (std::ptr::null(), std::ptr::null());
        (c.paged, c.paged_dtype) = (c.paged % 2, r.u8() as u32 % 3);
        if device && r.u8() < 192 {
            // what the device round takes: token granularity, and `paged` (a V2 config) for
            // its gather of the round's cells out of the engine's stream
            c.granularity = kvevict::Granularity::Token as u32;
            (c.struct_size, c.paged) = (KVE_EVICTOR_CONFIG_V2_SIZE, 1);
        }
    }
    let (mut bytes, mut dev_bytes) = (CANARY as u64, CANARY as u64);
    let st = if device {
        kve_cuda_evictor_size(&c, &mut bytes, &mut dev_bytes)
    } else {
        kve_evictor_size(&c, &mut bytes)
    };
    if !device {
        // the check without memory: the size's status, a message exactly on a refusal
        let mut msg = 7usize as *const c_char;
        let ck = kve_evictor_config_check(&c, std::ptr::null_mut(), 0, &mut msg);
        assert_eq!(ck, st, "config_check disagrees with evictor_size");
        assert_eq!(msg.is_null(), st == KVE_OK, "config_check message");
    }
    if st != KVE_OK || bytes > (16 << 20) || (device && dev_bytes > (16 << 20)) {
        assert!(
            st == KVE_OK || (bytes == CANARY as u64 && dev_bytes == CANARY as u64),
            "size written on error"
        );
        return st;
    }
    let short = (!sane && r.chance(16)) as u64;
    let mut mem = vec![0u64; bytes as usize / 8 + 1];
    let ev = if device {
        // the device block: 256-byte aligned (cudaMalloc's), registered as device memory
        let mut dmem = vec![0u64; dev_bytes as usize / 8 + 33];
        let dptr = (dmem.as_mut_ptr() as usize).next_multiple_of(256) as *mut c_void;
        let reg = Registered::new(dmem.as_ptr() as *const u8, dmem.len() * 8);
        let dshort = (!sane && r.chance(16)) as u64 * 256;
        let mut ev = std::ptr::null_mut();
        let st = kve_cuda_evictor_init(
            mem.as_mut_ptr() as *mut c_void,
            bytes - short,
            dptr,
            dev_bytes - dshort.min(dev_bytes),
            &c,
            &mut ev,
        );
        if st != KVE_OK {
            assert!(
                ev.is_null() && mem.iter().all(|&w| w == 0) && dmem.iter().all(|&w| w == 0),
                "init wrote on error"
            );
            return st;
        }
        Ev::Device(ev, mem, dmem, reg)
    } else {
        let mut ev = std::ptr::null_mut();
        let st = kve_evictor_init(mem.as_mut_ptr() as *mut c_void, bytes - short, &c, &mut ev);
        if st != KVE_OK {
            assert!(
                ev.is_null() && mem.iter().all(|&w| w == 0),
                "init wrote on error"
            );
            return st;
        }
        Ev::Host(ev)
    };
    let (l, hkv, n) = (c.layers, c.hkv, c.max_cells);
    let mut st = KVE_OK;
    let mut done = Vec::new();
    for nth in 0..1 + r.u8() % 12 {
        let seq = if r.chance(16) {
            r.size(8)
        } else {
            r.u8() as u64 % c.max_seqs
        };
        let layer = if r.chance(16) {
            r.size(8)
        } else {
            r.u8() as u64 % l
        };
        let cells = if !sane && r.chance(8) {
            r.size(128)
        } else {
            1 + r.u8() as u64 % n
        };
        let snap = ev.snapshot();
        let max = (l * hkv * n) as usize + 1;
        let mut own = vec![CANARY; max];
        let len = if r.chance(8) {
            r.u8() as usize % max
        } else {
            max
        } as u64;
        let ptr = if r.chance(40) {
            std::ptr::null_mut()
        } else {
            own.as_mut_ptr()
        };
        let _dev = Registered::new(own.as_ptr() as *const u8, own.len() * 4);
        let out = Out {
            _dev,
            own,
            ptr,
            len,
            in_arena: false,
        };
        let mut count = CANARY as u64;
        let tensor_of = |r: &mut R, e: [u64; 3]| {
            if sane && r.u8() < 224 {
                if let Some(t) = exact(r, a, e) {
                    return t;
                }
            }
            let mut t = tensor(r, a, [8, 96, 16]);
            fit(r, a, &mut t, e);
            t
        };
        // a K or V tensor of `d` dims in a pool over `base` (the arena or a copy), and a
        // sequence's table: mostly distinct entries of the pool, sometimes hostile
        let paged_of = |r: &mut R, base: *const u8, d: u64| {
            let dtype = r.enum_val(5); // q8_0/q4_0 pools: refused
            let es = if dtype == 0 { 4 } else { 2 };
            let off = (r.u8() as usize % 64) * 8;
            let len = (ARENA - off) as u64 / es;
            let (nb, bs) = (r.size(16), r.size(8));
            let h = if r.chance(8) { r.size(4) } else { hkv };
            let d = if r.chance(8) { r.size(16) } else { d };
            let (kind, kv) = (r.enum_val(6), r.u8() as u32 % 2);
            let stacked = matches!(kind, 1 | 2 | 4 | 5);
            let layers = if kind == 5 { 1 + r.u8() as u64 % 3 } else { 1 };
            let mut kl: kve_paged_layout = std::mem::zeroed();
            let data = base.add(off) as *const c_void;
            let kv = if stacked { kv } else { 0 };
            kve_paged_layout_init(&mut kl, kind, data, len, dtype, nb, bs, h, d, layers, 0, kv);
            kl.pad = r.chance(50) as u32;
            kl
        };
        let table_of = |r: &mut R, kl: &kve_paged_layout| -> Vec<u32> {
            let nb = kl.num_blocks.min(64) as u32;
            let bs = kl.block_size.max(1);
            let tl = (cells.min(1 << 12).div_ceil(bs) as usize + r.u8() as usize % 3)
                .saturating_sub(1)
                .min(64);
            let mut t: Vec<u32> = (0..nb.max(1)).collect();
            for i in (1..t.len()).rev() {
                t.swap(i, r.u8() as usize % (i + 1));
            }
            t.resize(tl, 0);
            for e in t.iter_mut() {
                if r.chance(16) {
                    *e = if r.chance(2) {
                        r.u32()
                    } else {
                        r.u8() as u32 % (nb + 1)
                    };
                }
            }
            t
        };
        let mut snap_ok = true;
        let call = r.u8() % 14;
        st = match call {
            0 => {
                let rows = 1 + r.u8() as u64 % 40;
                let q = tensor_of(r, [c.hq, rows, c.dk]);
                match &ev {
                    Ev::Host(e) => kve_evictor_observe_queries(*e, seq, layer, &q),
                    Ev::Device(e, ..) => kve_cuda_evictor_observe_queries(*e, seq, layer, &q, NULL),
                }
            }
            1 => match &ev {
                Ev::Host(e) => kve_evictor_plan(*e, seq, cells, &mut count),
                Ev::Device(e, ..) => kve_cuda_evictor_plan(*e, seq, cells, &mut count),
            },
            2 => match &ev {
                Ev::Host(e) => kve_evictor_begin(*e, seq, cells, r.size(128)),
                Ev::Device(e, ..) => kve_cuda_evictor_begin(*e, seq, cells, r.size(128)),
            },
            3 => {
                let mut v: kve_evictor_layer = std::mem::zeroed();
                kve_evictor_layer_init(&mut v, KVE_EVICTOR_LAYER_V1_SIZE);
                v.keys = tensor_of(r, [hkv, cells, c.dk]);
                v.values = tensor_of(r, [hkv, cells, c.dv]);
                let rows = 1 + r.u8() as u64 % 40;
                v.queries = tensor_of(r, [c.hq, rows, c.dk]);
                v.wo = tensor_of(r, [c.hq, c.dv, c.d_model]);
                v.reserved = (!sane && r.chance(32)) as u32;
                if sane && matches!(ev, Ev::Device(..)) {
                    v.wo = kve_tensor::NONE; // the device form takes Wo once, on the host
                }
                match &ev {
                    Ev::Host(e) => kve_evictor_score_layer(*e, seq, layer, &v),
                    Ev::Device(e, ..) => kve_cuda_evictor_score_layer(*e, seq, layer, &v, NULL),
                }
            }
            4 => match &ev {
                Ev::Host(e) => kve_evictor_select(*e, seq, &mut count),
                Ev::Device(e, ..) => kve_cuda_evictor_select(*e, seq, &mut count, NULL),
            },
            5..=7 if matches!(ev, Ev::Device(..)) => {
                // the device form's kept lists: pointers into its device block
                let Ev::Device(e, _, dmem, _) = &ev else {
                    unreachable!()
                };
                let (mut counts, mut idx, mut ld) =
                    (std::ptr::null(), std::ptr::null(), CANARY as u64);
                let s = kve_cuda_evictor_kept_lists(*e, seq, &mut counts, &mut idx, &mut ld);
                if s != KVE_OK {
                    assert!(
                        counts.is_null() && idx.is_null() && ld == CANARY as u64,
                        "kept lists written on error"
                    );
                } else {
                    let span = dmem.as_ptr() as usize..dmem.as_ptr() as usize + dmem.len() * 8;
                    let units = (l * hkv) as usize;
                    assert!(span.contains(&(counts as usize)) && span.contains(&(idx as usize)));
                    for u in 0..units {
                        let k = *counts.add(u);
                        assert!(k >= 0 && k as u64 <= n && k as u64 <= ld, "kept count {k}");
                        let list = std::slice::from_raw_parts(idx.add(u * ld as usize), k as usize);
                        assert!(
                            list.windows(2).all(|w| w[0] < w[1])
                                && list.iter().all(|&c| c >= 0 && (c as u64) < n),
                            "device kept list ascending, in range"
                        );
                    }
                }
                s
            }
            5 | 6 => {
                let &Ev::Host(ev) = &ev else { unreachable!() };
                let f = if r.chance(2) {
                    kve_evictor_kept_cells
                } else {
                    kve_evictor_evicted_cells
                };
                let s = f(ev, seq, out.ptr, out.len, &mut count);
                if s == KVE_OK && !out.in_arena {
                    let cells = &out.own[..count as usize];
                    assert!(cells.windows(2).all(|w| w[0] < w[1]), "cells ascending");
                }
                s
            }
            7 => {
                let &Ev::Host(ev) = &ev else { unreachable!() };
                let mut offsets = vec![CANARY as u64; (l * hkv + 1) as usize];
                let o_len = if r.chance(8) {
                    offsets.len() as u64 - 1
                } else {
                    offsets.len() as u64
                };
                let s =
                    kve_evictor_kept_lists(ev, seq, offsets.as_mut_ptr(), o_len, out.ptr, out.len);
                if s != KVE_OK {
                    assert!(
                        offsets.iter().all(|&x| x == CANARY as u64),
                        "offsets written on error"
                    );
                } else if !out.in_arena {
                    check_csr(
                        std::slice::from_raw_parts(
                            offsets.as_ptr() as *const u32,
                            offsets.len() * 2,
                        ),
                        offsets.len(),
                        &out.own,
                        (l * hkv) as usize,
                        n,
                    );
                }
                s
            }
            8 => {
                // the same view over a copy of the arena (compaction writes through it)
                let mut copy = a.buf.clone();
                let _dev = Registered::new(copy.as_ptr() as *const u8, copy.len() * 8);
                let mut t = tensor_of(r, [hkv, cells, c.dk]);
                if !t.data.is_null() {
                    let at = t.data as usize - a.base() as usize;
                    t.data = (copy.as_mut_ptr() as *const u8).add(at) as *const c_void;
                }
                match &ev {
                    Ev::Host(e) => kve_evictor_compact(*e, seq, layer, &t),
                    Ev::Device(e, ..) => kve_cuda_evictor_compact(*e, seq, layer, &t, NULL),
                }
            }
            9 => match &ev {
                Ev::Host(e) => kve_evictor_commit(*e, seq),
                Ev::Device(e, ..) => kve_cuda_evictor_commit(*e, seq),
            },
            // paged views: the host form only (the device form's size refuses `paged`)
            11 if !matches!(ev, Ev::Host(_)) => KVE_OK,
            12 if !matches!(ev, Ev::Host(_)) => KVE_OK,
            11 => {
                let &Ev::Host(e) = &ev else { unreachable!() };
                let mut pl: kve_evictor_paged_layer = std::mem::zeroed();
                kve_evictor_paged_layer_init(&mut pl, KVE_EVICTOR_PAGED_LAYER_V1_SIZE);
                pl.keys = paged_of(r, a.base(), c.dk);
                if r.chance(3) {
                    pl.values = paged_of(r, a.base(), c.dv);
                }
                let t = table_of(r, &pl.keys);
                pl.table = if t.is_empty() && r.chance(2) {
                    std::ptr::null()
                } else {
                    t.as_ptr()
                };
                pl.table_len = t.len() as u64;
                let rows = 1 + r.u8() as u64 % 40;
                pl.queries = tensor_of(r, [c.hq, rows, c.dk]);
                pl.reserved = r.chance(32) as u32;
                kve_evictor_score_layer_paged(e, seq, layer, &pl)
            }
            12 => {
                let &Ev::Host(e) = &ev else { unreachable!() };
                // compaction writes through the pool: a copy of the arena
                let mut copy = a.buf.clone();
                let kl = paged_of(r, copy.as_mut_ptr() as *const u8, c.dk);
                let t = table_of(r, &kl);
                let before = copy.clone();
                let mut freed = CANARY as u64;
                let s = kve_evictor_compact_paged(
                    e,
                    seq,
                    layer,
                    &kl,
                    t.as_ptr(),
                    t.len() as u64,
                    &mut freed,
                );
                if s != KVE_OK {
                    assert!(
                        copy == before && freed == CANARY as u64,
                        "paged compaction wrote on error (status {s})"
                    );
                }
                s
            }
            13 => {
                // a whole round over a cell stream: cells by index (mostly distinct, inside
                // the stream) or NULL (dense); K/V/queries per layer, sometimes the wrong count.
                // The device form: K/V over the arena (registered: device memory), queries and
                // the kept cells host memory as the library reads them (marks and per-head
                // granularity refused there, before the round begins)
                // (the harness's own buffers stay small: `cells` may be a hostile size)
                let cells = cells.min(512);
                let stream = cells + r.u8() as u64 % 8;
                let mut ids: Vec<u32> = (0..stream as u32).collect();
                for i in (1..ids.len()).rev() {
                    ids.swap(i, r.u8() as usize % (i + 1));
                }
                ids.truncate(cells as usize);
                ids.sort_unstable();
                if !sane && r.chance(8) && !ids.is_empty() {
                    let i = r.u8() as usize % ids.len();
                    ids[i] = if r.chance(2) { r.u32() } else { ids[0] };
                }
                let dense = r.chance(4);
                let per = |r: &mut R, d: u64| -> Vec<kve_tensor> {
                    let nl = if r.chance(16) { r.u8() as u64 % 4 } else { l };
                    let s = if dense { cells } else { stream };
                    (0..nl).map(|_| tensor_of(r, [hkv, s, d])).collect()
                };
                let (mut ks, mut vs) = (per(r, c.dk), per(r, c.dv));
                if sane && matches!(ev, Ev::Device(..)) && r.u8() < 224 {
                    // the device form scores K and V in the context's paged dtype: mostly given
                    // (only a tensor inside the arena whose f32 reading still fits there; a
                    // hostile one, NULL or outside it, stays as it is)
                    for t in ks.iter_mut().chain(vs.iter_mut()) {
                        let end = (t.data as usize)
                            .checked_sub(a.base() as usize)
                            .and_then(|o| (t.len as usize).checked_mul(4)?.checked_add(o));
                        if t.dtype < 3 && end.is_some_and(|e| e <= ARENA) {
                            t.dtype = c.paged_dtype;
                        }
                    }
                }
                let rows = 1 + r.u8() as u64 % 40;
                let qs: Vec<kve_tensor> = if r.u8() < if sane { 224 } else { 128 } {
                    (0..l).map(|_| tensor_of(r, [c.hq, rows, c.dk])).collect()
                } else {
                    Vec::new()
                };
                let marks: Vec<u8> = (0..cells).map(|_| r.u8() % 2).collect();
                let mut rd: kve_evictor_round = std::mem::zeroed();
                kve_evictor_round_init(&mut rd, KVE_EVICTOR_ROUND_V1_SIZE);
                rd.cells = if dense {
                    std::ptr::null()
                } else {
                    ids.as_ptr()
                };
                rd.n_cells = ids.len() as u64;
                (rd.keys, rd.n_keys) = (ks.as_ptr(), ks.len() as u64);
                // (values: what LAVa, LaProx and value links read)
                let with_values = |r: &mut R| r.u8() < if sane { 224 } else { 128 };
                if with_values(r) {
                    (rd.values, rd.n_values) = (vs.as_ptr(), vs.len() as u64);
                }
                (rd.queries, rd.n_queries) = (qs.as_ptr(), qs.len() as u64);
                if r.chance(4) {
                    (rd.marks, rd.n_marks) = (marks.as_ptr(), marks.len() as u64);
                }
                // a sane round's target is below its cells (0 or all of them: refused or nothing to do)
                rd.target = match sane && r.u8() < 224 {
                    true => 1 + r.u8() as u64 % (ids.len() as u64 - 1).max(1),
                    false => r.size(128),
                };
                rd.mark_share = if r.chance(16) { 2.0 } else { 0.5 };
                rd.reserved = (!sane && r.chance(32)) as u32;
                // or the layers through the fill callback (V2): the same tensors given one layer
                // at a time, sometimes a failure at some layer, sometimes arrays given as well or
                // a hostile layer count / wo
                let mut fd = FillData {
                    ks,
                    vs,
                    qs,
                    values: with_values(r),
                    fail_at: if r.chance(4) {
                        r.u8() as u64 % (l + 1)
                    } else {
                        u64::MAX
                    },
                    wo: !sane && r.chance(32),
                    calls: 0,
                    failed: false,
                };
                if r.chance(3) {
                    rd.struct_size = KVE_EVICTOR_ROUND_V2_SIZE;
                    if sane || !r.chance(16) {
                        (rd.keys, rd.n_keys, rd.values, rd.n_values) =
                            (std::ptr::null(), 0, std::ptr::null(), 0);
                        (rd.queries, rd.n_queries) = (std::ptr::null(), 0);
                    }
                    rd.fill = Some(fuzz_fill);
                    rd.fill_layers = if r.chance(16) { r.u8() as u64 % 4 } else { l };
                    rd.user = (&mut fd as *mut FillData).cast();
                }
                if r.chance(8) {
                    rd.mark_split = r.u8() as u32 % 3;
                }
                let s = match &ev {
                    Ev::Host(e) => {
                        kve_evictor_run_round(*e, seq, &rd, out.ptr, out.len, &mut count)
                    }
                    Ev::Device(e, ..) => {
                        kve_cuda_evictor_run_round(*e, seq, &rd, out.ptr, out.len, &mut count, NULL)
                    }
                };
                if trace() {
                    // KVEVICT_FUZZ_TRACE=1: which form ran a round and its status (how often a
                    // device round gets past its checks)
                    eprintln!(
                        "round device={} sane={sane} v2={} marks={} split={} status={s}",
                        matches!(ev, Ev::Device(..)),
                        rd.struct_size == KVE_EVICTOR_ROUND_V2_SIZE,
                        rd.n_marks != 0,
                        rd.mark_split
                    );
                }
                if let (Ev::Device(..), true, 0, KVE_OK) = (&ev, sane, nth, s) {
                    // the same round on a fresh host evictor of the same config (the device
                    // context was fresh too: its first call): it keeps as many cells (the host
                    // may refuse what the device takes: NaN/Inf in device buffers are not
                    // detected). The cells themselves are only traced: the two forms sum in
                    // another order, so a near tie may go either way
                    let (n_host, kept_host) = host_twin_round(&c, seq, &rd, &mut fd, max);
                    if trace() {
                        let same = n_host == KVE_OK
                            && !out.in_arena
                            && kept_host[..] == out.own[..kept_host.len().min(count as usize)];
                        eprintln!(
                            "twin host status={n_host} device count={count} dtype={} same={same}",
                            c.paged_dtype
                        );
                    }
                    if n_host == KVE_OK {
                        assert_eq!(
                            kept_host.len() as u64,
                            count,
                            "the device round kept another number of cells than the host round"
                        );
                    }
                }
                if matches!(ev, Ev::Device(..)) && (rd.n_marks != 0 || rd.mark_split != 0) {
                    assert_ne!(s, KVE_OK, "the device round took marks");
                }
                assert!(fd.calls <= l, "fill called past the context's layers");
                if fd.failed {
                    assert_eq!(
                        s, KVE_ERR_CALLBACK,
                        "a failing fill ends the round with KVE_ERR_CALLBACK"
                    );
                }
                if s == KVE_OK && !out.in_arena {
                    let kept = &out.own[..count as usize];
                    assert!(
                        kept.windows(2).all(|w| w[0] < w[1])
                            && kept.iter().all(|&k| (k as u64) < ids.len() as u64),
                        "round's kept cells ascending, in range"
                    );
                }
                if s != KVE_OK {
                    // a round that began may stay begun (docs/c-abi.md); outputs untouched
                    assert!(
                        out.untouched() && count == CANARY as u64,
                        "round output written on error"
                    );
                    snap_ok = false;
                }
                s
            }
            _ => {
                let mut stats: kve_evictor_stats = std::mem::zeroed();
                let size = if r.chance(8) {
                    24
                } else {
                    KVE_EVICTOR_STATS_V1_SIZE
                };
                match &ev {
                    Ev::Host(e) => kve_evictor_get_stats(*e, seq, &mut stats, size),
                    Ev::Device(e, ..) => kve_cuda_evictor_get_stats(*e, seq, &mut stats, size),
                }
            }
        };
        if st != KVE_OK && snap_ok {
            assert!(
                ev.snapshot() == snap,
                "the context changed on error (status {st})"
            );
            assert!(
                out.untouched() && count == CANARY as u64,
                "output written on error"
            );
        }
        if r.chance(4) {
            match &ev {
                Ev::Host(e) => kve_evictor_seq_reset(*e, seq),
                Ev::Device(e, ..) => kve_cuda_evictor_seq_reset(*e, seq),
            };
        }
        // an output a call wrote on success is not one the input's last call (which may
        // fail) must leave untouched: kept alive here, not checked at the end
        if st == KVE_OK {
            done.push(out);
        } else {
            outs.push(out);
        }
    }
    st
}
