//! Shared helpers of the launcher conformance suite (`tests/device/`, `tests/capi_cuda/`,
//! `tests/capi_cuda_links.rs`; features `cuda` and `cuda-emu`): a device buffer (cudaMalloc'd),
//! the device check, the test data
//! generator (tests/reference's SplitMix), dtypes, memory layouts, tensors stored in them,
//! and the tolerance check. The including file declares `mod reference;`.
#![allow(dead_code)]

use half::{bf16, f16};
use kvevict::cuda::*;
use kvevict::{GqaReduce, Pool};
use std::ffi::c_void;
use std::ptr::null_mut;

// ------------------------------------------------------------- CUDA runtime --
#[allow(non_snake_case)]
pub mod rt {
    use std::ffi::{c_char, c_void};
    extern "C" {
        pub fn cudaMalloc(p: *mut *mut c_void, n: usize) -> i32;
        pub fn cudaFree(p: *mut c_void) -> i32;
        pub fn cudaMemcpy(dst: *mut c_void, src: *const c_void, n: usize, kind: i32) -> i32;
        pub fn cudaDeviceSynchronize() -> i32;
        pub fn cudaStreamCreate(s: *mut *mut c_void) -> i32;
        pub fn cudaStreamCreateWithFlags(s: *mut *mut c_void, flags: u32) -> i32;
        pub fn cudaStreamDestroy(s: *mut c_void) -> i32;
        pub fn cudaStreamSynchronize(s: *mut c_void) -> i32;
        pub fn cudaStreamBeginCapture(s: *mut c_void, mode: i32) -> i32;
        pub fn cudaStreamEndCapture(s: *mut c_void, graph: *mut *mut c_void) -> i32;
        pub fn cudaGraphInstantiate(exec: *mut *mut c_void, graph: *mut c_void, flags: u64) -> i32;
        pub fn cudaGraphLaunch(exec: *mut c_void, s: *mut c_void) -> i32;
        pub fn cudaGraphExecDestroy(exec: *mut c_void) -> i32;
        pub fn cudaGraphDestroy(graph: *mut c_void) -> i32;
        pub fn cudaGetErrorString(e: i32) -> *const c_char;
        pub fn cudaGetLastError() -> i32;
        pub fn cudaDeviceGetAttribute(v: *mut i32, attr: i32, dev: i32) -> i32;
    }
    /// cudaDevAttrMaxSharedMemoryPerBlockOptin
    pub const ATTR_SMEM_OPTIN: i32 = 97;
    pub const H2D: i32 = 1;
    pub const D2H: i32 = 2;
    pub const CAPTURE_GLOBAL: i32 = 0;
    pub const CAPTURE_THREAD_LOCAL: i32 = 1;
    pub const STREAM_NON_BLOCKING: u32 = 1;
}

/// A launcher's (or the runtime's) status as text.
pub fn err_str(e: i32) -> String {
    // SAFETY: cudaGetErrorString returns NULL or a static C string.
    unsafe {
        let p = rt::cudaGetErrorString(e);
        if !p.is_null() {
            return format!("{} ({e})", std::ffi::CStr::from_ptr(p).to_string_lossy());
        }
    }
    format!("status {e}")
}

#[track_caller]
pub fn ck(e: i32, what: &str) {
    assert_eq!(e, 0, "{what}: {}", err_str(e));
}

/// Device buffer of `n` elements of `T` (plain data only).
pub struct DBuf<T: Copy> {
    p: *mut c_void,
    n: usize,
    _t: std::marker::PhantomData<T>,
}

impl<T: Copy> DBuf<T> {
    pub fn new(n: usize) -> Self {
        let bytes = (n * std::mem::size_of::<T>()).max(16);
        let mut p = null_mut();
        // SAFETY: an out-pointer to a local.
        ck(unsafe { rt::cudaMalloc(&mut p, bytes) }, "cudaMalloc");
        assert!(!p.is_null(), "allocation of {bytes} bytes");
        let b = DBuf {
            p,
            n,
            _t: std::marker::PhantomData,
        };
        // garbage of a known pattern (0xA5 bytes): no launcher may read before it writes
        // SAFETY: `bytes` fits the buffer.
        unsafe {
            copy(
                b.p,
                vec![0xA5u8; bytes].as_ptr() as *const c_void,
                bytes,
                true,
            )
        };
        b
    }
    pub fn from(h: &[T]) -> Self {
        let b = Self::new(h.len());
        b.upload(h);
        b
    }
    pub fn upload(&self, h: &[T]) {
        assert!(h.len() <= self.n);
        let bytes = std::mem::size_of_val(h);
        // SAFETY: `bytes` fits both buffers.
        unsafe { copy(self.p, h.as_ptr() as *const c_void, bytes, true) };
    }
    /// All `n` elements, after the work enqueued so far has finished.
    pub fn download(&self) -> Vec<T> {
        let mut v = Vec::with_capacity(self.n);
        // SAFETY: `n` elements fit both buffers; plain data, so every bit pattern is a `T`.
        unsafe {
            copy(
                v.as_mut_ptr() as *mut c_void,
                self.p,
                self.n * std::mem::size_of::<T>(),
                false,
            );
            v.set_len(self.n);
        }
        v
    }
    pub fn ptr(&self) -> *mut T {
        self.p as *mut T
    }
    pub fn vptr(&self) -> *mut c_void {
        self.p
    }
    pub fn len(&self) -> usize {
        self.n
    }
}

/// A byte buffer used for any plain type (the C entry points' `void*` arguments).
impl DBuf<u8> {
    pub fn bytes_of<T: Copy>(h: &[T]) -> DBuf<u8> {
        let b = DBuf::new(std::mem::size_of_val(h));
        b.upload_as(h);
        b
    }
    pub fn upload_as<T: Copy>(&self, h: &[T]) {
        let bytes = std::mem::size_of_val(h);
        assert!(bytes <= self.n);
        // SAFETY: `bytes` fits both buffers.
        unsafe { copy(self.p, h.as_ptr() as *const c_void, bytes, true) };
    }
    /// The first `count` elements as `T`, after the work enqueued so far has finished.
    pub fn download_as<T: Copy + Default>(&self, count: usize) -> Vec<T> {
        let mut v = vec![T::default(); count];
        let bytes = std::mem::size_of_val(&v[..]);
        assert!(bytes <= self.n);
        // SAFETY: `bytes` fits both buffers; plain data.
        unsafe { copy(v.as_mut_ptr() as *mut c_void, self.p, bytes, false) };
        v
    }
    pub fn ptr_as<T>(&self) -> *mut T {
        self.p as *mut T
    }
}

impl<T: Copy> Drop for DBuf<T> {
    fn drop(&mut self) {
        // SAFETY: allocated by cudaMalloc in `new`, freed once.
        unsafe {
            rt::cudaFree(self.p);
        }
    }
}

/// Held shared by every device-wide synchronisation of the tests and exclusively by a graph
/// capture (`in_graph`): CUDA refuses `cudaDeviceSynchronize` while any stream of the device is
/// capturing (cudaErrorStreamCaptureUnsupported, which the emulator enforces too), and the test
/// threads of one binary share the device.
static CAPTURE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// `cudaDeviceSynchronize`, never while another test thread captures a graph.
pub fn device_sync(what: &str) {
    let _shared = CAPTURE.read().unwrap_or_else(|e| e.into_inner());
    // SAFETY: no arguments.
    ck(unsafe { rt::cudaDeviceSynchronize() }, what);
}

/// Copy `n` bytes host → device (`up`) or device → host, synchronising first.
unsafe fn copy(dst: *mut c_void, src: *const c_void, n: usize, up: bool) {
    device_sync("sync before copy");
    let kind = if up { rt::H2D } else { rt::D2H };
    ck(rt::cudaMemcpy(dst, src, n, kind), "cudaMemcpy");
}

/// `n` NaNs: an element the launcher does not write stays NaN.
pub fn poisoned(n: usize) -> DBuf<f32> {
    DBuf::from(&vec![f32::NAN; n])
}

/// `out` after launch `f` wrote it (`f` gets its device pointer and returns the launcher's
/// status, checked as `what`).
#[track_caller]
pub fn written(out: &DBuf<f32>, what: &str, f: impl FnOnce(*mut f32) -> i32) -> Vec<f32> {
    ck(f(out.ptr()), what);
    out.download()
}

/// What launch `f` writes into a poisoned output of `len` floats (as [`written`]).
#[track_caller]
pub fn launched(len: usize, what: &str, f: impl FnOnce(*mut f32) -> i32) -> Vec<f32> {
    written(&poisoned(len), what, f)
}

/// Kept lists to be written: `rows` counts and `rows` lists of row stride `ld`, every
/// element `fill` (a canary).
pub fn lists_of(rows: usize, ld: usize, fill: i32) -> (DBuf<i32>, DBuf<i32>) {
    (
        DBuf::from(&vec![fill; rows]),
        DBuf::from(&vec![fill; rows * ld]),
    )
}

/// A canary value in every element: for "nothing written".
pub fn sentinel(n: usize) -> DBuf<f32> {
    DBuf::from(&vec![SENTINEL; n])
}

pub const SENTINEL: f32 = -12345.0;

/// Every element of `b` still [`SENTINEL`]: nothing was written.
#[track_caller]
pub fn assert_sentinel(what: &str, b: &DBuf<f32>) {
    let got = b.download();
    let at = got.iter().position(|&x| x != SENTINEL);
    assert!(at.is_none(), "{what}: element {at:?} written");
}

/// The launchers' "invalid argument, nothing enqueued" status.
pub const INVALID: i32 = 1;

// ------------------------------------------------------------------- device --

/// A device to run on: when the runtime sees one
/// (otherwise prints the skip line) — unless `KVEVICT_REQUIRE_GPU` is set (cuda/check.sh
/// sets it where nvidia-smi lists a GPU): then no device is a failure, so a machine whose
/// driver is too old for the static cudart cannot pass by skipping every test.
pub fn have_device() -> bool {
    let mut n = 0;
    // SAFETY: an out-pointer to a local.
    let rc = unsafe { kve_cuda_device_count(&mut n) };
    if rc != 0 || n == 0 {
        no_device(&format!("cudaGetDeviceCount status {rc}, count {n}"));
        return false;
    }
    true
}

/// The device's opt-in shared memory per block (bytes).
pub fn smem_optin() -> usize {
    let mut v = 0i32;
    // SAFETY: an out-pointer to a local.
    ck(
        unsafe { rt::cudaDeviceGetAttribute(&mut v, rt::ATTR_SMEM_OPTIN, 0) },
        "cudaDeviceGetAttribute",
    );
    v as usize
}

/// The skip line, or a panic when a GPU is required (`KVEVICT_REQUIRE_GPU` set, not "0").
pub fn no_device(why: &str) {
    if std::env::var("KVEVICT_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0") {
        panic!("KVEVICT_REQUIRE_GPU is set but the CUDA runtime sees no device ({why})");
    }
    println!("skipped: no CUDA device ({why})");
}

#[allow(unused_macros)]
macro_rules! need_device {
    () => {
        if !have_device() {
            return;
        }
    };
}

/// A device test's start: skip without a device (`need_device!`), else its data
/// generator for the tag (`Rng::new(tag)`).
#[allow(unused_macros)]
macro_rules! device_rng {
    ($tag:expr) => {{
        need_device!();
        Rng::new($tag)
    }};
}

// ---------------------------------------------------------------------- rng --

/// Test data from tests/reference's generator, seeded by `KVEVICT_TEST_SEED` (default 1,
/// printed) and a per-test tag.
pub struct Rng(crate::reference::Rng);

impl Rng {
    pub fn new(tag: u64) -> Rng {
        let base = std::env::var("KVEVICT_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1u64);
        println!("seed {base} tag {tag}");
        Rng(crate::reference::Rng::new(
            base ^ tag.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        ))
    }
    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [0, 1).
    pub fn unif(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub fn normal(&mut self) -> f32 {
        self.0.normal() as f32
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// `len` values normal with standard deviation `scale`.
    pub fn normals(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.normal() * scale).collect()
    }
    /// `len` values uniform in [-scale, scale).
    pub fn vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len)
            .map(|_| (2.0 * self.unif() - 1.0) * scale)
            .collect()
    }
}

// ------------------------------------------------------------ dtype helpers --
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dt {
    F32,
    F16,
    Bf16,
}
pub const DTYPES: [Dt; 3] = [Dt::F32, Dt::F16, Dt::Bf16];
impl Dt {
    pub fn code(self) -> i32 {
        match self {
            Dt::F32 => KVE_CUDA_F32,
            Dt::F16 => KVE_CUDA_F16,
            Dt::Bf16 => KVE_CUDA_BF16,
        }
    }
    pub fn size(self) -> usize {
        if self == Dt::F32 {
            4
        } else {
            2
        }
    }
    pub fn round(self, x: f32) -> f32 {
        match self {
            Dt::F32 => x,
            Dt::F16 => f16::from_f32(x).to_f32(),
            Dt::Bf16 => bf16::from_f32(x).to_f32(),
        }
    }
    pub fn encode(self, xs: &[f32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(xs.len() * self.size());
        for &x in xs {
            match self {
                Dt::F32 => out.extend_from_slice(&x.to_le_bytes()),
                Dt::F16 => out.extend_from_slice(&f16::from_f32(x).to_le_bytes()),
                Dt::Bf16 => out.extend_from_slice(&bf16::from_f32(x).to_le_bytes()),
            }
        }
        out
    }
    pub fn decode(self, b: &[u8]) -> Vec<f32> {
        match self {
            Dt::F32 => b
                .chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dt::F16 => b
                .chunks(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dt::Bf16 => b
                .chunks(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        }
    }
}

// ------------------------------------------------------------------ layouts --
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Layout {
    /// [H, N, d] contiguous
    HeadMajor,
    /// [H, N, d] with padded rows (stride_token = d + 3) and a gap between heads
    Padded,
    /// llama.cpp K rows: [N, H*d]
    TokenMajor,
    /// llama.cpp transposed V: [H*d, N]
    Transposed,
}
pub const LAYOUTS: [Layout; 4] = [
    Layout::HeadMajor,
    Layout::Padded,
    Layout::TokenMajor,
    Layout::Transposed,
];

/// Every (dtype, layout) of `DTYPES` × `LAYOUTS`, layouts inner.
pub fn dtype_layouts() -> impl Iterator<Item = (Dt, Layout)> {
    DTYPES
        .into_iter()
        .flat_map(|dt| LAYOUTS.into_iter().map(move |l| (dt, l)))
}

/// (strides, buffer length in elements) of a [h, t, d] tensor.
pub fn strides(l: Layout, h: usize, t: usize, d: usize) -> ([usize; 3], usize) {
    match l {
        Layout::HeadMajor => ([t * d, d, 1], h * t * d),
        Layout::Padded => ([t * (d + 3) + 5, d + 3, 1], h * (t * (d + 3) + 5)),
        Layout::TokenMajor => ([d, h * d, 1], h * t * d),
        Layout::Transposed => ([d * t, 1, t], h * t * d),
    }
}

/// A host tensor (values already rounded to the dtype) and its device copy; the gaps of
/// a padded layout hold NaN, so a read of a gap shows.
pub struct Tensor {
    pub dt: Dt,
    pub ext: [usize; 3],
    pub st: [usize; 3],
    /// logical [h][t][d]
    pub vals: Vec<f32>,
    /// the stored elements (gaps NaN), as uploaded
    pub flat: Vec<f32>,
    pub buf: Option<DBuf<u8>>,
}

impl Tensor {
    pub fn new(dt: Dt, l: Layout, ext: [usize; 3], gen: &mut dyn FnMut() -> f32) -> Tensor {
        let mut t = Tensor::host(dt, l, ext, gen);
        t.buf = Some(DBuf::from(&dt.encode(&t.flat)));
        t
    }
    /// [`Tensor::new`] of standard normal values from `rng` (the usual random input).
    pub fn normal(rng: &mut Rng, dt: Dt, l: Layout, ext: [usize; 3]) -> Tensor {
        Tensor::new(dt, l, ext, &mut || rng.normal())
    }
    /// Host-only tensor (no device copy): for the CPU checks of the references.
    pub fn host(dt: Dt, l: Layout, ext: [usize; 3], gen: &mut dyn FnMut() -> f32) -> Tensor {
        let (st, len) = strides(l, ext[0], ext[1], ext[2]);
        let vals: Vec<f32> = (0..ext[0] * ext[1] * ext[2])
            .map(|_| dt.round(gen()))
            .collect();
        let mut flat = vec![f32::NAN; len];
        for h in 0..ext[0] {
            for tt in 0..ext[1] {
                for d in 0..ext[2] {
                    flat[h * st[0] + tt * st[1] + d * st[2]] = vals[(h * ext[1] + tt) * ext[2] + d];
                }
            }
        }
        Tensor {
            dt,
            ext,
            st,
            vals,
            flat,
            buf: None,
        }
    }
    /// The stored elements (the uploaded layout and dtype, gaps included) as the core's
    /// view, handed to `f`: the host reads exactly what the device reads.
    pub fn with_stored_view<R>(&self, f: impl FnOnce(kvevict::View<'_>) -> R) -> R {
        let (ext, st) = (self.ext, self.st);
        match self.dt {
            Dt::F32 => f(kvevict::View::f32(&self.flat, ext, st).expect("stored view")),
            Dt::F16 => {
                let h: Vec<f16> = self.flat.iter().map(|&x| f16::from_f32(x)).collect();
                f(kvevict::View::f16(&h, ext, st).expect("stored view"))
            }
            Dt::Bf16 => {
                let h: Vec<bf16> = self.flat.iter().map(|&x| bf16::from_f32(x)).collect();
                f(kvevict::View::bf16(&h, ext, st).expect("stored view"))
            }
        }
    }
    /// The same values as a contiguous f32 view for the CPU core.
    pub fn core_view(&self) -> kvevict::View<'_> {
        kvevict::View::f32_contiguous(&self.vals, self.ext).expect("core view")
    }
    pub fn at(&self, h: usize, t: usize, d: usize) -> f64 {
        self.vals[(h * self.ext[1] + t) * self.ext[2] + d] as f64
    }
    /// The logical tensor in f64 (tests/reference's `T3`).
    pub fn t3(&self) -> crate::reference::T3 {
        crate::reference::T3 {
            a: self.ext[0],
            b: self.ext[1],
            c: self.ext[2],
            data: self.vals.iter().map(|&x| x as f64).collect(),
        }
    }
    pub fn view(&self) -> KveCudaView {
        let data = self.buf.as_ref().expect("device tensor").vptr();
        cuda_view(data, self.dt.code(), self.ext, self.st)
    }
    /// The descriptor `kvevict::device` takes: the view and its buffer's byte range.
    pub fn device(&self) -> kvevict::device::Tensor {
        let b = self.buf.as_ref().expect("device tensor");
        let start = b.vptr() as usize;
        kvevict::device::Tensor {
            view: self.view(),
            bytes: (start, start + b.len()),
        }
    }
    /// Reads the device tensor back as logical [h][t][d].
    pub fn read_back(&self) -> Vec<f32> {
        let raw = self.buf.as_ref().expect("device tensor").download();
        let flat = self.dt.decode(&raw);
        let mut out = vec![0f32; self.vals.len()];
        for h in 0..self.ext[0] {
            for t in 0..self.ext[1] {
                for d in 0..self.ext[2] {
                    out[(h * self.ext[1] + t) * self.ext[2] + d] =
                        flat[h * self.st[0] + t * self.st[1] + d * self.st[2]];
                }
            }
        }
        out
    }
}

/// `max |got - want| / max |want| <= tol`, every element finite where the reference is.
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f64, |m, &x| m.max(x.abs())).max(1e-30);
    let mut worst = 0f64;
    let mut at = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.is_finite() || !w.is_finite(),
            "{what}: element {i} is {g} (want {w})"
        );
        let e = (g as f64 - w).abs() / scale;
        if e > worst {
            worst = e;
            at = i;
        }
    }
    println!("{what}: max rel err {worst:.3e} (scale {scale:.3e})");
    assert!(
        worst <= tol,
        "{what}: max rel err {worst:.3e} > {tol:.1e} at {at}: got {} want {}",
        got[at],
        want[at]
    );
}

/// Every element within `rel·|want| + abs`.
#[track_caller]
pub fn assert_each_close(what: &str, got: &[f32], want: &[f64], rel: f64, abs: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= rel * w.abs() + abs,
            "{what}: element {i}: {g} vs {w}"
        );
    }
}

pub fn null_stream() -> *mut c_void {
    null_mut()
}

// ------------------------------------------------ f64 references of launcher outputs --
// Built on tests/reference (window attention, pooling, GQA reductions, softmax rows).

pub fn gqa_of(op: i32) -> GqaReduce {
    match op {
        KVE_CUDA_GQA_MAX => GqaReduce::Max,
        KVE_CUDA_GQA_SUM => GqaReduce::Sum,
        _ => GqaReduce::Mean,
    }
}

/// Block (a, b) of a group of g: the layout of the Gram blocks (src/math/gram.rs).
pub use kvevict::gram::block_pair;

/// The f64 window aggregates of kve_cuda_window over the prefix, from `A`: [mean `[Hq][P]`, l2
/// `[Hq][P]`, cross `[Hkv][g(g+1)/2][P]`, group `[Hkv][P]` (GQA `op` of the means)].
pub fn ref_window_of(a: &crate::reference::T3, hkv: usize, op: i32) -> [Vec<f64>; 4] {
    let (hq, w, n) = (a.a, a.b, a.c);
    let (g, p) = (hq / hkv, n - w);
    let np = g * (g + 1) / 2;
    let col = |h: usize, i: usize| (0..w).map(move |j| a.at(h, j, i));
    let (mut rm, mut rl) = (vec![0f64; hq * p], vec![0f64; hq * p]);
    for h in 0..hq {
        for i in 0..p {
            rm[h * p + i] = col(h, i).sum::<f64>() / w as f64;
            rl[h * p + i] = col(h, i).map(|x| x * x).sum::<f64>().sqrt();
        }
    }
    let mut rc = vec![0f64; hkv * np * p];
    let mut rg = Vec::with_capacity(hkv * p);
    for kh in 0..hkv {
        let rows: Vec<Vec<f64>> = (0..g)
            .map(|x| rm[(kh * g + x) * p..(kh * g + x + 1) * p].to_vec())
            .collect();
        rg.extend(crate::reference::reduce(gqa_of(op), &rows));
        for b in 0..np {
            let (x, y) = block_pair(g, b);
            for i in 0..p {
                rc[(kh * np + b) * p + i] = col(kh * g + x, i)
                    .zip(col(kh * g + y, i))
                    .map(|(s, t)| s * t)
                    .sum();
            }
        }
    }
    [rm, rl, rc, rg]
}

/// Natural-log log-sum-exp of every window row's scaled logits over the keys it sees
/// (row `h*w + j`): the `row_lse` input of kve_cuda_window.
pub fn ref_row_lse(q: &Tensor, k: &Tensor, w: usize) -> Vec<f64> {
    let (q, k) = (q.t3(), k.t3());
    let (hq, n, g) = (q.a, k.b, q.a / k.a);
    let mut out = Vec::with_capacity(hq * w);
    for h in 0..hq {
        for j in 0..w {
            let qr = q.row(h, q.b - w + j);
            out.push(crate::reference::softmax_row(qr, &k, h / g, n - w + j).1);
        }
    }
    out
}

/// `reference::window_attention` of a case's stored tensors, then [`ref_window_of`].
pub fn ref_window(q: &Tensor, k: &Tensor, w: usize, op: i32) -> [Vec<f64>; 4] {
    ref_window_of(&window_attention(q, k, w), k.ext[0], op)
}

/// `A[h][j][i]` (`[Hq, w, N]`, 0 where masked) of a case's stored tensors.
pub fn window_attention(q: &Tensor, k: &Tensor, w: usize) -> crate::reference::T3 {
    crate::reference::window_attention(&q.t3(), &k.t3(), w)
}

/// The GQA reduction `op` (`KVE_CUDA_GQA_*`) of a group's values.
pub fn gqa(op: i32, xs: &[f64]) -> f64 {
    let rows: Vec<Vec<f64>> = xs.iter().map(|&x| vec![x]).collect();
    crate::reference::reduce(gqa_of(op), &rows)[0]
}

/// `reference::pool` of one row for a launcher's pooling arguments.
pub fn ref_pool(x: &[f64], mode: i32, k: usize, decay: f64) -> Vec<f64> {
    let p = match mode {
        KVE_CUDA_POOL_AVG => Pool::avg(k as u32),
        KVE_CUDA_POOL_MAX => Pool::max(k as u32),
        _ => Pool::forward(k as u32, decay as f32),
    };
    crate::reference::pool(&p, x)
}

// ------------------------------------------------- more references, strided rows --

/// Rows of `rows × n` values at row stride `ld`, the gaps NaN (so a read of a gap shows).
pub fn strided(vals: &[f32], rows: usize, n: usize, ld: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; rows * ld];
    for r in 0..rows {
        out[r * ld..r * ld + n].copy_from_slice(&vals[r * n..(r + 1) * n]);
    }
    out
}

/// The `rows × n` values of a strided download; asserts the gaps were not written.
#[track_caller]
pub fn unstride(what: &str, got: &[f32], rows: usize, n: usize, ld: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * n);
    for r in 0..rows {
        out.extend_from_slice(&got[r * ld..r * ld + n]);
        for (i, &x) in got[r * ld + n..(r + 1) * ld].iter().enumerate() {
            assert!(
                x.is_nan(),
                "{what}: gap element {} of row {r} written ({x})",
                n + i
            );
        }
    }
    out
}

/// Random ascending kept lists over [0, n): (lists [rows][ld], counts); row 0 empty.
pub fn random_lists(rng: &mut Rng, rows: usize, n: usize, ld: usize) -> (Vec<i32>, Vec<i32>) {
    let mut idx = vec![-1i32; rows * ld];
    let mut counts = vec![0i32; rows];
    for r in 1..rows {
        let frac = rng.unif();
        let mut c = 0;
        for i in 0..n {
            if rng.unif() < frac {
                idx[r * ld + c] = i as i32;
                c += 1;
            }
        }
        counts[r] = c as i32;
    }
    (idx, counts)
}

/// Order-preserving key (NaN lowest, -0 == +0), as cuda/common.cuh float_key.
pub fn fkey(f: f32) -> u32 {
    if f.is_nan() {
        return 0;
    }
    let f = if f == 0.0 { 0.0f32 } else { f };
    let u = f.to_bits();
    if u & 0x8000_0000 != 0 {
        !u
    } else {
        u | 0x8000_0000
    }
}

/// Host reference of kve_cuda_select: per group, the k largest composite keys
/// (score key, position, lower row first), kept positions ascending per row.
pub fn ref_select(
    s: &[f32],
    n: usize,
    groups: usize,
    rpg: usize,
    ks: &[i64],
    ls: Option<(&[f64], usize)>,
) -> Vec<Vec<i32>> {
    let rows = groups * rpg;
    let mut kept = vec![Vec::new(); rows];
    for gi in 0..groups {
        let mut keys: Vec<(u32, usize, std::cmp::Reverse<usize>)> = Vec::new();
        for r in gi * rpg..(gi + 1) * rpg {
            for i in 0..n {
                let x = s[r * n + i];
                let v = match ls {
                    Some((sum, rpl)) => {
                        x * if sum[r / rpl] > 0.0 {
                            (1.0 / sum[r / rpl]) as f32
                        } else {
                            1.0
                        }
                    }
                    None => x,
                };
                keys.push((fkey(v), i, std::cmp::Reverse(r)));
            }
        }
        keys.sort_unstable_by(|a, b| b.cmp(a));
        let k = ks[gi].clamp(0, keys.len() as i64) as usize;
        for &(_, i, std::cmp::Reverse(r)) in &keys[..k] {
            kept[r].push(i as i32);
        }
    }
    for v in kept.iter_mut() {
        v.sort_unstable();
    }
    kept
}

/// f64 KNorm: -||K[h,i]||_2 for i < prefix, [heads][prefix].
pub fn ref_knorm(k: &Tensor, prefix: usize) -> Vec<f64> {
    let (h, d) = (k.ext[0], k.ext[2]);
    let mut out = Vec::with_capacity(h * prefix);
    for hh in 0..h {
        for i in 0..prefix {
            out.push(-(0..d).map(|x| k.at(hh, i, x).powi(2)).sum::<f64>().sqrt());
        }
    }
    out
}

/// StreamingLLM: 1 for the first `sinks` positions, else 0, [rows][n].
pub fn ref_sinks(rows: usize, n: usize, sinks: usize) -> Vec<f64> {
    (0..rows * n)
        .map(|e| if e % n < sinks { 1.0 } else { 0.0 })
        .collect()
}

/// The core's KNorm scores of the first `prefix` tokens (window = the rest; keys only).
pub fn core_knorm(k: &Tensor, prefix: usize) -> Vec<f32> {
    let mut cfg = kvevict::ScoreConfig::preset(kvevict::Preset::KNorm);
    cfg.window = (k.ext[1] - prefix) as u32;
    let inputs = kvevict::LayerInputs {
        keys: Some(k.core_view()),
        ..Default::default()
    };
    let shape = kvevict::layer_shape(&cfg, &inputs).expect("layer_shape");
    let mut out = vec![0f32; kvevict::score_len(&cfg, &shape).unwrap()];
    let mut ws = vec![0u8; kvevict::score_workspace_size(&cfg, &shape).unwrap()];
    kvevict::score_layer(&cfg, &inputs, &mut out, &mut ws).expect("score_layer knorm");
    out
}

// ------------------------------------- core computations the launchers are held to --

/// Gram matrices `[Hq][dv][dv]` (f32) from a random `Wo` through the core.
pub fn core_gram(rng: &mut Rng, hq: usize, hkv: usize, dv: usize, dm: usize) -> Vec<f32> {
    core_gram_of(rng, hq, hkv, dv, dm, false)
}

/// The core's Gram blocks of a random `Wo` `[Hq, dv, dm]` (with the cross blocks of exact
/// GQA when `cross`).
pub fn core_gram_of(
    rng: &mut Rng,
    hq: usize,
    hkv: usize,
    dv: usize,
    dm: usize,
    cross: bool,
) -> Vec<f32> {
    let wo: Vec<f32> = (0..hq * dv * dm).map(|_| 0.1 * rng.normal()).collect();
    let view = kvevict::View::f32_contiguous(&wo, [hq, dv, dm]).unwrap();
    let mut g = vec![0f32; kvevict::gram_len(hq, hkv, dv, cross).unwrap()];
    let mut ws = vec![0u8; kvevict::gram_workspace_size(dv, dm).unwrap()];
    kvevict::compute_gram(&view, hkv, cross, &mut g, &mut ws).unwrap();
    g
}

/// The core's budgets (src/math/budget, as select_model uses them): (k_layer, k_unit).
#[allow(clippy::too_many_arguments)]
pub fn core_budgets(
    mode: i32,
    weights: &[f64],
    layers: usize,
    per: usize,
    p: u64,
    budget: u64,
    beta: u32,
    alpha: f32,
) -> (Vec<i64>, Vec<i64>) {
    use kvevict::budget::{lava_budgets, pyramid_budget};
    let bb = budget.min(p);
    // ada.rs: the safeguard floor follows the layer's own average head budget
    let floor = |total: u64| ((alpha as f64) * (total as f64 / per as f64)).floor() as u64;
    let (kl, ku): (Vec<u64>, Vec<u64>) = match mode {
        KVE_CUDA_BUDGET_UNIFORM => (vec![per as u64 * bb; layers], vec![bb; layers]),
        KVE_CUDA_BUDGET_PYRAMID => (0..layers)
            .map(|l| {
                let b = pyramid_budget(budget, beta, l, layers).min(p);
                (per as u64 * b, b)
            })
            .unzip(),
        KVE_CUDA_BUDGET_ADA => {
            let kl = vec![per as u64 * bb; layers];
            let ku = kl.iter().map(|&t| floor(t)).collect();
            (kl, ku)
        }
        _ => {
            let total = ((layers * per) as u64).saturating_mul(bb);
            let caps = vec![per as u64 * p; layers];
            let mut kl = vec![0u64; layers];
            let mut marks = vec![0u8; layers];
            lava_budgets(weights, total, &caps, &mut kl, &mut marks);
            let ku = kl.iter().map(|&t| floor(t)).collect();
            (kl, ku)
        }
    };
    let units = ku
        .iter()
        .flat_map(|&u| std::iter::repeat(u as i64).take(per))
        .collect();
    (kl.iter().map(|&x| x as i64).collect(), units)
}

// --------------------------------------------------------------------- CUDA graphs --

/// Captures `f(stream)` in a CUDA graph, launches it twice and synchronises: the
/// launchers inside must be capturable. Thread-local mode on a non-blocking stream: as
/// strict as global mode for this thread's own calls, while the other test threads'
/// cudaMalloc / cudaMemcpy (legacy stream) neither fail nor invalidate the capture, as
/// they would under global mode on a blocking stream (the emulator of feature
/// `cuda-emu` enforces these rules).
pub fn in_graph(f: &dyn Fn(*mut c_void)) {
    // no other test thread synchronises the device during the capture (`f` itself must not:
    // a capturing thread's synchronisation would end its capture anyway)
    let _exclusive = CAPTURE.write().unwrap_or_else(|e| e.into_inner());
    let mut s = null_mut();
    let mut graph = null_mut();
    let mut exec = null_mut();
    unsafe {
        ck(
            rt::cudaStreamCreateWithFlags(&mut s, rt::STREAM_NON_BLOCKING),
            "stream",
        );
        ck(
            rt::cudaStreamBeginCapture(s, rt::CAPTURE_THREAD_LOCAL),
            "begin capture",
        );
        f(s);
        ck(rt::cudaStreamEndCapture(s, &mut graph), "end capture");
        ck(rt::cudaGraphInstantiate(&mut exec, graph, 0), "instantiate");
        ck(rt::cudaGraphLaunch(exec, s), "graph launch");
        ck(rt::cudaGraphLaunch(exec, s), "graph launch twice");
        ck(rt::cudaStreamSynchronize(s), "sync graph");
        rt::cudaGraphExecDestroy(exec);
        rt::cudaGraphDestroy(graph);
        rt::cudaStreamDestroy(s);
    }
}

/// Selection parameters from `kve_select_params_init` (the C API suites on the device).
pub fn select_params(
    alloc: kvevict::config::AllocatorKind,
    gran: kvevict::config::Granularity,
    budget: u64,
) -> kvevict::capi::kve_select_params {
    use kvevict::capi::{kve_select_params, kve_select_params_init, KVE_OK};
    let mut p = unsafe { std::mem::zeroed::<kve_select_params>() };
    let size = std::mem::size_of::<kve_select_params>() as u32;
    let st = unsafe { kve_select_params_init(&mut p, size, alloc as u32, gran as u32, budget) };
    assert_eq!(st, KVE_OK);
    p
}

/// The launchers' view of `data`: a dtype code, extents `[heads, tokens, dim]` and
/// strides in elements.
pub fn cuda_view(data: *mut c_void, dtype: i32, ext: [usize; 3], st: [usize; 3]) -> KveCudaView {
    KveCudaView {
        data,
        dtype,
        reserved: 0,
        stride_head: st[0] as i64,
        stride_token: st[1] as i64,
        stride_dim: st[2] as i64,
        heads: ext[0] as i64,
        tokens: ext[1] as i64,
        dim: ext[2] as i64,
    }
}
