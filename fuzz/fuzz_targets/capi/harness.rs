//! The harness: the fuzzer input's reader, the arena, views over it, outputs with
//! canaries, workspaces, params, and the checks the drivers share.

use kvevict::capi::*;
use std::ffi::c_void;

pub const ARENA: usize = 1 << 15; // bytes
pub const CANARY: u32 = 0xA5A5_A5A5;
/// The CUDA stream of device calls: the legacy default stream.
pub const NULL: *mut c_void = std::ptr::null_mut();

pub struct R<'a> {
    pub d: &'a [u8],
    pub i: usize,
}

impl R<'_> {
    pub fn u8(&mut self) -> u8 {
        // past the input's end, bytes hashed from the index (zeros would make every `chance`
        // true, so a short input took every rare, hostile branch at once)
        let past = || ((self.i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8;
        let v = self.d.get(self.i).copied().unwrap_or_else(past);
        self.i += 1;
        v
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    pub fn u64(&mut self) -> u64 {
        (self.u32() as u64) << 32 | self.u32() as u64
    }
    pub fn chance(&mut self, one_in: u8) -> bool {
        self.u8() % one_in == 0
    }
    /// Mostly `1..=small`, sometimes 0 or a hostile value.
    pub fn size(&mut self, small: u64) -> u64 {
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
    pub fn enum_val(&mut self, n: u32) -> u32 {
        if self.chance(24) {
            self.u32()
        } else {
            self.u8() as u32 % n
        }
    }
}

/// A host buffer registered with the emulator as device memory while it lives (declared
/// first in its owner, so it is unregistered before the buffer is freed).
pub struct Registered(*mut c_void);

impl Registered {
    pub fn new(p: *const u8, bytes: usize) -> Registered {
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

pub struct Arena {
    pub _dev: Registered,
    pub buf: Vec<u64>,
}

impl Arena {
    pub fn new(r: &mut R) -> Arena {
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
    pub fn base(&self) -> *const u8 {
        self.buf.as_ptr() as *const u8
    }
    pub fn bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.base(), ARENA) }
    }
}

/// A view over the arena (or NULL); its len never exceeds what the arena holds.
pub fn tensor(r: &mut R, a: &Arena, small: [u64; 3]) -> kve_tensor {
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

pub fn elems(t: &kve_tensor) -> u64 {
    t.extent.iter().fold(1u64, |a, &e| a.saturating_mul(e))
}

/// Bytes of `len` elements of `dtype` (of ggml's block types: whole 32-value blocks of 34
/// and 18 bytes, as the library counts them).
pub fn bytes_of(dtype: u32, len: u64) -> usize {
    let len = len as usize;
    match dtype {
        0 => len * 4,
        3 => len / 32 * 34,
        4 => len / 32 * 18,
        _ => len * 2,
    }
}

pub fn span(t: &kve_tensor) -> (usize, usize) {
    if t.data.is_null() {
        return (0, 0);
    }
    (t.data as usize, t.data as usize + bytes_of(t.dtype, t.len))
}

pub fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < a.1 && b.0 < b.1 && a.0 < b.1 && b.0 < a.1
}

/// An output buffer: canary-filled, its own memory or (sometimes) inside the arena.
pub struct Out {
    pub _dev: Registered,
    pub own: Vec<u32>,
    pub ptr: *mut u32,
    pub len: u64,
    pub in_arena: bool,
}

impl Out {
    pub fn new(r: &mut R, a: &mut Arena, max: usize) -> Out {
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
    pub fn span(&self) -> (usize, usize) {
        (self.ptr as usize, self.ptr as usize + self.len as usize * 4)
    }
    pub fn untouched(&self) -> bool {
        self.in_arena || self.own.iter().all(|&x| x == CANARY)
    }
}

/// What the oracles check after a call: the arena's bytes before it, the outputs (their
/// canaries), and whether a destination tensor (varlen compaction) or a device workspace
/// was left inside the arena (an output too).
pub struct Checks {
    pub before: Vec<u8>,
    pub outs: Vec<Out>,
    pub dst_in_arena: bool,
}

/// A workspace length for a call whose size query gave `query` (`None`: the query failed):
/// mostly that size, sometimes a little short; a random one without a size or past 64 MiB.
pub fn ws_len(r: &mut R, query: Option<u64>) -> u64 {
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

pub fn workspace(r: &mut R, query: Option<u64>) -> Vec<u8> {
    vec![0u8; ws_len(r, query) as usize]
}

/// Floats in the arena for an input the call reads: 4-byte aligned below 256 bytes in
/// (with `odd`, 1 in 24 two bytes off: misaligned), `want` long (half the time, where it
/// fits) or any length that fits.
pub fn floats_in(r: &mut R, a: &Arena, want: u64, odd: bool) -> (*const f32, u64) {
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
pub struct DevWs {
    pub _dev: Option<Registered>,
    pub _own: Vec<u64>,
    pub ptr: *mut c_void,
    pub len: u64,
    pub in_arena: bool,
}

pub fn dev_workspace(r: &mut R, a: &mut Arena, query: Option<u64>) -> DevWs {
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
pub fn wide_heads(r: &mut R, t: &mut kve_tensor) -> Option<u64> {
    if t.data.is_null() || !r.chance(10) {
        return None;
    }
    let h = [16, 17, 64, 65, 128, 129, 256, 1024, 65535, 65536, 65537][r.u8() as usize % 11];
    t.extent[0] = h;
    t.stride[0] = 0;
    Some(h)
}

/// A span of `count` elements of `size` bytes at `p` (empty for NULL).
pub fn span_n(p: *const c_void, count: u64, size: u64) -> (usize, usize) {
    if p.is_null() {
        return (0, 0);
    }
    let b = count.saturating_mul(size).min(usize::MAX as u64 / 2) as usize;
    (p as usize, (p as usize).saturating_add(b))
}

/// Whether the arena bytes of `s` (clipped to the arena) are as in `before`.
pub fn unchanged(a: &Arena, before: &[u8], s: (usize, usize)) -> bool {
    let base = a.base() as usize;
    let (lo, hi) = (s.0.max(base), s.1.min(base + ARENA));
    lo >= hi || a.bytes()[lo - base..hi - base] == before[lo - base..hi - base]
}

/// `p`'s offset in the arena, -1 for NULL (debug output).
pub fn offset_in(a: &Arena, p: *const c_void) -> isize {
    if p.is_null() {
        -1
    } else {
        p as isize - a.base() as isize
    }
}

/// A device entry point's status: the C layer refuses what the launchers would (never
/// `KVE_ERR_CUDA`), and accepts a workspace of the queried size `q`.
pub fn check_device_status(st: i32, q: Option<u64>, ws_len: u64) {
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
pub fn debug() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("KVE_FUZZ_DEBUG").is_some())
}

/// A params struct followed by readable bytes, so any `struct_size` the harness writes is
/// honest (the library reads `struct_size` bytes).
#[repr(C)]
pub struct Padded<T> {
    pub p: T,
    pub tail: [u8; 4096],
}

pub fn padded<T>(r: &mut R, p: T) -> Box<Padded<T>> {
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
pub fn pool(r: &mut R) -> (u32, u32, f32) {
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
pub fn post_pool(r: &mut R) -> (u32, u32, f32) {
    let kind = r.enum_val(4);
    let kernel = r.u8() as u32 % 12;
    let decay = [0.9, 1.0, 0.0, f32::NAN][r.u8() as usize % 4];
    (kind, kernel, decay)
}

/// The start of ops 0 and 9 (`kve_score_layer` and `kve_cuda_score_layer`): score params
/// (maybe padded), then layer inputs declaring `size(r)` bytes with queries, keys and (one
/// time in two) values over the arena, drawn in that order.
pub unsafe fn score_call(
    r: &mut R,
    a: &Arena,
    size: impl FnOnce(&mut R) -> u32,
) -> (Box<Padded<kve_score_params>>, kve_layer_inputs) {
    let sp0 = score_params(r);
    let spb = padded(r, sp0);
    let mut inp: kve_layer_inputs = std::mem::zeroed();
    kve_layer_inputs_init(&mut inp, size(r));
    inp.queries = tensor(r, a, [8, 40, 32]);
    inp.keys = tensor(r, a, [4, 96, 32]);
    if r.chance(2) {
        inp.values = tensor(r, a, [4, 96, 32]);
    }
    (spb, inp)
}

pub fn score_params(r: &mut R) -> kve_score_params {
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

/// Model scores for a selection: dimensions drawn, the scores a slice of the arena at a drawn
/// offset (2 bytes off alignment 1 time in 32 with `misalign`, drawn only then), their
/// length the dimensions' (or 1 time in 4 arbitrary), never past the arena.
pub unsafe fn model_scores(r: &mut R, a: &Arena, misalign: bool) -> kve_model_scores {
    let (layers, hkv, n, w) = (r.size(6), r.size(4), r.size(120), r.u8() as u64 % 40);
    let off = (r.u8() as usize % 64) * 4 + if misalign && r.chance(32) { 2 } else { 0 };
    let room = ((ARENA - off) / 4) as u64;
    let len = if r.chance(4) {
        r.u32() as u64 % room
    } else {
        layers
            .saturating_mul(hkv)
            .saturating_mul(n.saturating_sub(w))
            .min(room)
    };
    kve_model_scores {
        scores: a.base().add(off) as *const f32,
        len,
        layers,
        hkv,
        n,
        window: w,
    }
}

pub fn select_params(r: &mut R) -> kve_select_params {
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

pub fn stream_params(r: &mut R) -> kve_stream_score_params {
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
pub fn fit(r: &mut R, a: &Arena, t: &mut kve_tensor, e: [u64; 3]) {
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
pub fn exact(r: &mut R, a: &Arena, e: [u64; 3]) -> Option<kve_tensor> {
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
pub const TD: usize = std::mem::size_of::<kve_tensor>();

/// An 8-aligned state buffer of `bytes` (sometimes short or misaligned on purpose).
pub struct State {
    pub own: Vec<u64>,
    pub ptr: *mut u8,
    pub len: u64,
}

impl State {
    pub fn new(r: &mut R, bytes: u64) -> State {
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
    pub fn bytes(&self) -> Vec<u64> {
        self.own.clone()
    }
    /// An 8-aligned place for an argument of `size` bytes that starts inside the state's
    /// span (so it overlaps it) and ends inside its buffer.
    pub fn inside(&mut self, r: &mut R, size: usize) -> *mut u8 {
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
pub fn scratch_back(a: &mut Arena, before: &[u8], s: (usize, usize)) {
    let base = a.buf.as_mut_ptr() as usize;
    let (lo, hi) = (s.0.max(base), s.1.min(base + ARENA));
    if lo < hi {
        unsafe {
            std::ptr::copy_nonoverlapping(before[lo - base..].as_ptr(), lo as *mut u8, hi - lo)
        };
    }
}

pub fn check_csr(off: &[u32], offsets_len: usize, idx: &[u32], units: usize, n: u64) {
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
pub fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("KVEVICT_FUZZ_TRACE").is_some())
}
