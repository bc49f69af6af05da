#![cfg(feature = "cuda")]
//! GPU-vs-CPU tests of the CUDA launchers (cuda/kvevict_cuda.h).
//!
//! Without a CUDA device every test prints "skipped: no CUDA device" and passes:
//! the binary still proves that the kernels compile and link. With a device,
//! each test draws fresh random inputs, runs the launcher, and compares with a
//! float64 reference in this file computed from the same (dtype-rounded) inputs;
//! outputs are poisoned with NaN before each run so unwritten elements fail.
//! Scores must match within a stated relative tolerance (max |gpu - ref| over
//! max |ref|); selections must match exactly (same keys, same tie rule) and are
//! compared with the core's `select_model` by overlap.
//!
//! Seeds: KVEVICT_TEST_SEED (default: time-based, printed).

use half::{bf16, f16};
use kvevict::cuda::*;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

// ------------------------------------------------------------- CUDA runtime --
#[allow(non_snake_case)]
mod rt {
    use std::ffi::{c_char, c_void};
    extern "C" {
        pub fn cudaMalloc(p: *mut *mut c_void, n: usize) -> i32;
        pub fn cudaFree(p: *mut c_void) -> i32;
        pub fn cudaMemcpy(dst: *mut c_void, src: *const c_void, n: usize, kind: i32) -> i32;
        pub fn cudaDeviceSynchronize() -> i32;
        pub fn cudaStreamCreate(s: *mut *mut c_void) -> i32;
        pub fn cudaStreamDestroy(s: *mut c_void) -> i32;
        pub fn cudaStreamSynchronize(s: *mut c_void) -> i32;
        pub fn cudaStreamBeginCapture(s: *mut c_void, mode: i32) -> i32;
        pub fn cudaStreamEndCapture(s: *mut c_void, graph: *mut *mut c_void) -> i32;
        pub fn cudaGraphInstantiate(exec: *mut *mut c_void, graph: *mut c_void, flags: u64) -> i32;
        pub fn cudaGraphLaunch(exec: *mut c_void, s: *mut c_void) -> i32;
        pub fn cudaGraphExecDestroy(exec: *mut c_void) -> i32;
        pub fn cudaGraphDestroy(graph: *mut c_void) -> i32;
        pub fn cudaGetErrorString(e: i32) -> *const c_char;
    }
    pub const H2D: i32 = 1;
    pub const D2H: i32 = 2;
    pub const CAPTURE_GLOBAL: i32 = 0;
}

fn err_str(e: i32) -> String {
    unsafe {
        let p = rt::cudaGetErrorString(e);
        if p.is_null() {
            return format!("cuda error {e}");
        }
        format!("{} ({e})", std::ffi::CStr::from_ptr(p).to_string_lossy())
    }
}

#[track_caller]
fn ck(e: i32, what: &str) {
    assert_eq!(e, 0, "{what}: {}", err_str(e));
}

/// Device buffer of `n` elements of `T` (plain data only).
struct DBuf<T: Copy> {
    p: *mut c_void,
    n: usize,
    _t: std::marker::PhantomData<T>,
}
impl<T: Copy> DBuf<T> {
    fn new(n: usize) -> Self {
        let mut p = null_mut();
        let bytes = (n * std::mem::size_of::<T>()).max(16);
        ck(unsafe { rt::cudaMalloc(&mut p, bytes) }, "cudaMalloc");
        DBuf {
            p,
            n,
            _t: std::marker::PhantomData,
        }
    }
    fn from(h: &[T]) -> Self {
        let b = Self::new(h.len());
        b.upload(h);
        b
    }
    fn upload(&self, h: &[T]) {
        assert!(h.len() <= self.n);
        let bytes = std::mem::size_of_val(h);
        ck(
            unsafe { rt::cudaMemcpy(self.p, h.as_ptr() as *const c_void, bytes, rt::H2D) },
            "H2D",
        );
    }
    fn download(&self) -> Vec<T> {
        let mut v = Vec::with_capacity(self.n);
        let bytes = self.n * std::mem::size_of::<T>();
        ck(unsafe { rt::cudaDeviceSynchronize() }, "sync before D2H");
        unsafe {
            ck(
                rt::cudaMemcpy(v.as_mut_ptr() as *mut c_void, self.p, bytes, rt::D2H),
                "D2H",
            );
            v.set_len(self.n);
        }
        v
    }
    fn ptr(&self) -> *mut T {
        self.p as *mut T
    }
    fn vptr(&self) -> *mut c_void {
        self.p
    }
}
impl<T: Copy> Drop for DBuf<T> {
    fn drop(&mut self) {
        unsafe {
            rt::cudaFree(self.p);
        }
    }
}

fn poisoned(n: usize) -> DBuf<f32> {
    DBuf::from(&vec![f32::NAN; n])
}

// ------------------------------------------------------------------- device --
fn have_device() -> bool {
    let mut n = 0;
    let rc = unsafe { kve_cuda_device_count(&mut n) };
    if rc != 0 || n == 0 {
        println!("skipped: no CUDA device (cudaGetDeviceCount status {rc}, count {n})");
        return false;
    }
    true
}

macro_rules! need_device {
    () => {
        if !have_device() {
            return;
        }
    };
}

// ---------------------------------------------------------------------- rng --
struct Rng(u64);
impl Rng {
    fn new(tag: u64) -> Rng {
        let base = std::env::var("KVEVICT_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        println!("seed {base} tag {tag}");
        Rng(base ^ tag.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unif(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        // sum of 4 uniforms, variance-normalised (enough for test data)
        let s: f32 = (0..4).map(|_| self.unif()).sum::<f32>() - 2.0;
        s * (3.0f32).sqrt()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

// ------------------------------------------------------------ dtype helpers --
#[derive(Clone, Copy, Debug, PartialEq)]
enum Dt {
    F32,
    F16,
    Bf16,
}
const DTYPES: [Dt; 3] = [Dt::F32, Dt::F16, Dt::Bf16];
impl Dt {
    fn code(self) -> i32 {
        match self {
            Dt::F32 => KVE_CUDA_F32,
            Dt::F16 => KVE_CUDA_F16,
            Dt::Bf16 => KVE_CUDA_BF16,
        }
    }
    fn size(self) -> usize {
        if self == Dt::F32 {
            4
        } else {
            2
        }
    }
    fn round(self, x: f32) -> f32 {
        match self {
            Dt::F32 => x,
            Dt::F16 => f16::from_f32(x).to_f32(),
            Dt::Bf16 => bf16::from_f32(x).to_f32(),
        }
    }
    fn encode(self, xs: &[f32]) -> Vec<u8> {
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
    fn decode(self, b: &[u8]) -> Vec<f32> {
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
enum Layout {
    /// [H, N, d] contiguous
    HeadMajor,
    /// [H, N, d] with padded rows (stride_token = d + 3) and a gap between heads
    Padded,
    /// llama.cpp K rows: [N, H*d]
    TokenMajor,
    /// llama.cpp transposed V: [H*d, N]
    Transposed,
}
const LAYOUTS: [Layout; 4] = [
    Layout::HeadMajor,
    Layout::Padded,
    Layout::TokenMajor,
    Layout::Transposed,
];

/// (strides, buffer length in elements) of a [h, t, d] tensor.
fn strides(l: Layout, h: usize, t: usize, d: usize) -> ([usize; 3], usize) {
    match l {
        Layout::HeadMajor => ([t * d, d, 1], h * t * d),
        Layout::Padded => ([t * (d + 3) + 5, d + 3, 1], h * (t * (d + 3) + 5)),
        Layout::TokenMajor => ([d, h * d, 1], h * t * d),
        Layout::Transposed => ([d * t, 1, t], h * t * d),
    }
}

/// A host tensor (values already rounded to the dtype) and its device copy.
struct Tensor {
    dt: Dt,
    ext: [usize; 3],
    st: [usize; 3],
    vals: Vec<f32>, // logical [h][t][d]
    buf: Option<DBuf<u8>>,
}
impl Tensor {
    fn new(dt: Dt, l: Layout, ext: [usize; 3], gen: &mut dyn FnMut() -> f32) -> Tensor {
        let mut t = Tensor::host(dt, l, ext, gen);
        let len = strides(l, ext[0], ext[1], ext[2]).1;
        let mut flat = vec![f32::NAN; len]; // poison in the gaps
        for h in 0..ext[0] {
            for tt in 0..ext[1] {
                for d in 0..ext[2] {
                    flat[h * t.st[0] + tt * t.st[1] + d * t.st[2]] =
                        t.vals[(h * ext[1] + tt) * ext[2] + d];
                }
            }
        }
        t.buf = Some(DBuf::from(&dt.encode(&flat)));
        t
    }
    /// Host-only tensor (no device copy): for the CPU checks of the references.
    fn host(dt: Dt, l: Layout, ext: [usize; 3], gen: &mut dyn FnMut() -> f32) -> Tensor {
        let (st, len) = strides(l, ext[0], ext[1], ext[2]);
        let vals: Vec<f32> = (0..ext[0] * ext[1] * ext[2])
            .map(|_| dt.round(gen()))
            .collect();
        let _ = len;
        Tensor {
            dt,
            ext,
            st,
            vals,
            buf: None,
        }
    }
    /// The same values as a contiguous f32 view for the CPU core.
    fn core_view(&self) -> kvevict::View<'_> {
        kvevict::View::f32_contiguous(&self.vals, self.ext).expect("core view")
    }
    fn at(&self, h: usize, t: usize, d: usize) -> f64 {
        self.vals[(h * self.ext[1] + t) * self.ext[2] + d] as f64
    }
    fn view(&self) -> KveCudaView {
        KveCudaView {
            data: self.buf.as_ref().expect("device tensor").vptr(),
            dtype: self.dt.code(),
            reserved: 0,
            stride_head: self.st[0] as i64,
            stride_token: self.st[1] as i64,
            stride_dim: self.st[2] as i64,
            heads: self.ext[0] as i64,
            tokens: self.ext[1] as i64,
            dim: self.ext[2] as i64,
        }
    }
    /// Reads the device tensor back as logical [h][t][d].
    fn read_back(&self) -> Vec<f32> {
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

#[track_caller]
fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
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

// ---------------------------------------------------------- f64 references --
/// A[h][j][i] (0 where masked), SPEC §2.
fn ref_attention(q: &Tensor, k: &Tensor, w: usize) -> Vec<f64> {
    let (hq, dk) = (q.ext[0], q.ext[2]);
    let (hkv, n) = (k.ext[0], k.ext[1]);
    let g = hq / hkv;
    let p = n - w;
    let scale = 1.0 / (dk as f64).sqrt();
    let mut a = vec![0f64; hq * w * n];
    for h in 0..hq {
        for j in 0..w {
            let vis = p + j + 1;
            let mut z = vec![0f64; vis];
            for (i, zi) in z.iter_mut().enumerate() {
                let mut s = 0f64;
                for d in 0..dk {
                    s += q.at(h, j, d) * k.at(h / g, i, d);
                }
                *zi = s * scale;
            }
            let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let l: f64 = z.iter().map(|&x| (x - m).exp()).sum();
            for i in 0..vis {
                a[(h * w + j) * n + i] = (z[i] - m).exp() / l;
            }
        }
    }
    a
}

/// The f64 window aggregates of kve_cuda_window: [mean, l2, cross, group(op)].
fn ref_window(q: &Tensor, k: &Tensor, w: usize, op: i32) -> [Vec<f64>; 4] {
    let (hq, hkv, n) = (q.ext[0], k.ext[0], k.ext[1]);
    let (g, p) = (hq / hkv, n - w);
    let np = g * (g + 1) / 2;
    let a = ref_attention(q, k, w);
    let (mut rm, mut rl) = (vec![0f64; hq * p], vec![0f64; hq * p]);
    let mut rc = vec![0f64; hkv * np * p];
    let mut rg = vec![0f64; hkv * p];
    for h in 0..hq {
        for i in 0..p {
            let col: Vec<f64> = (0..w).map(|j| a[(h * w + j) * n + i]).collect();
            rm[h * p + i] = col.iter().sum::<f64>() / w as f64;
            rl[h * p + i] = col.iter().map(|x| x * x).sum::<f64>().sqrt();
        }
    }
    for hk in 0..hkv {
        for i in 0..p {
            let ms: Vec<f64> = (0..g).map(|hh| rm[(hk * g + hh) * p + i]).collect();
            rg[hk * p + i] = gqa(op, &ms);
            for b in 0..np {
                let (x, y) = block_pair(g, b);
                let (hx, hy) = (hk * g + x, hk * g + y);
                rc[(hk * np + b) * p + i] = (0..w)
                    .map(|j| a[(hx * w + j) * n + i] * a[(hy * w + j) * n + i])
                    .sum();
            }
        }
    }
    [rm, rl, rc, rg]
}

/// f64 log-sum-exp of every window row's scaled logits over the keys it sees
/// (row h*w + j): the `row_lse` input of kve_cuda_window.
fn ref_row_lse(q: &Tensor, k: &Tensor, w: usize) -> Vec<f64> {
    let (hq, dk) = (q.ext[0], q.ext[2]);
    let (hkv, n) = (k.ext[0], k.ext[1]);
    let (g, p) = (hq / hkv, n - w);
    let scale = 1.0 / (dk as f64).sqrt();
    let mut out = vec![0f64; hq * w];
    for h in 0..hq {
        for j in 0..w {
            let z: Vec<f64> = (0..p + j + 1)
                .map(|i| {
                    (0..dk)
                        .map(|d| q.at(h, j, d) * k.at(h / g, i, d))
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            out[h * w + j] = m + z.iter().map(|&x| (x - m).exp()).sum::<f64>().ln();
        }
    }
    out
}

fn gqa(op: i32, xs: &[f64]) -> f64 {
    match op {
        KVE_CUDA_GQA_MAX => xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        KVE_CUDA_GQA_SUM => xs.iter().sum(),
        _ => xs.iter().sum::<f64>() / xs.len() as f64,
    }
}

/// Block (a, b) of a group of g: the diagonal first, then a < b (src/gram.rs order).
fn block_pair(g: usize, k: usize) -> (usize, usize) {
    if k < g {
        return (k, k);
    }
    let mut k = k - g;
    for a in 0..g {
        let row = g - a - 1;
        if k < row {
            return (a, a + 1 + k);
        }
        k -= row;
    }
    unreachable!()
}

fn ref_pool(x: &[f64], mode: i32, k: usize, decay: f64) -> Vec<f64> {
    let n = x.len() as i64;
    (0..n)
        .map(|i| match mode {
            KVE_CUDA_POOL_AVG => {
                let mut s = 0.0;
                for t in i - (k as i64) / 2..=i + (k as i64) / 2 {
                    if t >= 0 && t < n {
                        s += x[t as usize];
                    }
                }
                s / k as f64
            }
            KVE_CUDA_POOL_MAX => {
                let mut m = f64::NEG_INFINITY;
                for t in i - (k as i64) / 2..=i + (k as i64) / 2 {
                    if t >= 0 && t < n {
                        m = m.max(x[t as usize]);
                    }
                }
                m
            }
            _ => {
                let mut m = f64::NEG_INFINITY;
                for j in 0..(k as i64).min(i + 1) {
                    m = m.max(decay.powi(j as i32) * x[(i - j) as usize]);
                }
                m
            }
        })
        .collect()
}

/// Order-preserving key (NaN lowest, -0 == +0), as cuda/common.cuh float_key.
fn fkey(f: f32) -> u32 {
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

// ====================================================================== tests --

#[test]
fn device_count_reports() {
    let mut n = -1;
    let rc = unsafe { kve_cuda_device_count(&mut n) };
    if rc != 0 || n == 0 {
        assert_eq!(n, 0);
        println!("skipped: no CUDA device (status {rc})");
        return;
    }
    assert!(n > 0);
}

#[test]
fn workspace_sizes_are_pure_host_functions() {
    // Callable without a device.
    let a = unsafe { kve_cuda_window_workspace_size(32, 32, 131072, 8) };
    assert!(a > 0);
    assert_eq!(unsafe { kve_cuda_window_workspace_size(0, 32, 10, 8) }, 0);
    assert!(unsafe { kve_cuda_select_workspace_size(1) } >= 2048 * 4);
    assert!(unsafe { kve_cuda_layer_stats_workspace_size(32, 1 << 20) } > 0);
    let v = KveCudaView {
        data: null_mut(),
        dtype: KVE_CUDA_BF16,
        reserved: 0,
        stride_head: 0,
        stride_token: 0,
        stride_dim: 1,
        heads: 8,
        tokens: 100,
        dim: 128,
    };
    assert_eq!(
        unsafe { kve_cuda_compact_workspace_size(&v, 10) },
        8 * 10 * 128 * 2
    );
}

#[test]
fn invalid_arguments_are_rejected_before_launch() {
    // Argument checks run on the host and need no device.
    let bad = KveCudaView {
        data: null_mut(),
        dtype: 7,
        reserved: 0,
        stride_head: 0,
        stride_token: 0,
        stride_dim: 1,
        heads: 1,
        tokens: 1,
        dim: 1,
    };
    let rc = unsafe {
        kve_cuda_window(
            &bad,
            &bad,
            1,
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut(),
            0,
            null(),
            null_mut(),
            0,
            null_mut(),
        )
    };
    assert_eq!(rc, 1);
    let rc = unsafe { kve_cuda_pool(null(), 4, null_mut(), 4, 1, 4, 0, 4, 1.0, null_mut()) };
    assert_eq!(rc, 1, "even avg kernel");
    // the changed and new launchers (all checks before any CUDA call)
    let f = 16 as *mut f32; // never dereferenced: every call below is rejected
    let i = 16 as *mut i32;
    let dummy = i as *mut i64;
    let ok_view = KveCudaView {
        data: 16 as *mut c_void,
        dtype: KVE_CUDA_F16,
        ..bad
    };
    unsafe {
        let hr =
            |ld_a: i64, b: *const f32, ld_b: i64, bm: i32, out: *mut f32, ld_o: i64, hkv: i64| {
                kve_cuda_head_reduce(
                    f,
                    ld_a,
                    b,
                    ld_b,
                    bm,
                    null(),
                    out,
                    ld_o,
                    4,
                    hkv,
                    8,
                    0,
                    null_mut(),
                )
            };
        assert_eq!(hr(7, f, 8, 1, f.add(64), 8, 2), 1, "head_reduce ld_a < n");
        assert_eq!(hr(8, f, 7, 1, f.add(64), 8, 2), 1, "head_reduce ld_b < n");
        assert_eq!(
            hr(8, null(), 8, 2, f.add(64), 8, 2),
            1,
            "head_reduce b NULL"
        );
        assert_eq!(
            hr(8, null(), 0, 0, f.add(64), 7, 2),
            1,
            "head_reduce ld_out < n"
        );
        assert_eq!(
            hr(8, null(), 0, 0, f, 8, 2),
            1,
            "head_reduce out == a with g > 1"
        );
        assert_eq!(
            hr(8, null(), 0, 0, f, 9, 4),
            1,
            "head_reduce out == a, other ld"
        );
        let lx = |c: *const f32, ldc: i64, q: *const f32, ldq: i64, ldo: i64, mode: i32| {
            kve_cuda_laprox_exact(c, ldc, q, ldq, f, ldo, 2, 2, 8, mode, null_mut())
        };
        assert_eq!(lx(f, 8, f, 8, 8, 4), 1, "laprox_exact mode 4");
        assert_eq!(lx(f, 8, f, 8, 8, -1), 1, "laprox_exact mode -1");
        assert_eq!(
            lx(null(), 8, f, 8, 8, 2),
            1,
            "laprox_exact mode 2 without cross"
        );
        assert_eq!(
            lx(f, 8, null(), 8, 8, 3),
            1,
            "laprox_exact mode 3 without qv"
        );
        assert_eq!(
            lx(f, 8, null(), 8, 8, 1),
            1,
            "laprox_exact mode 1 without qv"
        );
        assert_eq!(lx(f, 7, f, 8, 8, 0), 1, "laprox_exact ld_cross < n");
        assert_eq!(lx(f, 8, f, 7, 8, 0), 1, "laprox_exact ld_qv < n");
        assert_eq!(lx(f, 8, f, 8, 7, 0), 1, "laprox_exact ld_out < n");
        assert_eq!(
            kve_cuda_knorm(&bad, 1, f, 1, null_mut()),
            1,
            "knorm bad dtype"
        );
        assert_eq!(
            kve_cuda_knorm(&ok_view, 2, f, 2, null_mut()),
            1,
            "knorm prefix > tokens"
        );
        assert_eq!(
            kve_cuda_knorm(&ok_view, 1, f, 0, null_mut()),
            1,
            "knorm ld_out < prefix"
        );
        assert_eq!(
            kve_cuda_knorm(&ok_view, 1, null_mut(), 1, null_mut()),
            1,
            "knorm out NULL"
        );
        assert_eq!(
            kve_cuda_sink_scores(f, 2, 8, 7, 4, null_mut()),
            1,
            "sinks ld < n"
        );
        assert_eq!(
            kve_cuda_sink_scores(f, -1, 8, 8, 4, null_mut()),
            1,
            "sinks rows < 0"
        );
        let cc = |ld_b: i64, out: *mut f32, ld_o: i64, idx: *const i32| {
            kve_cuda_critical_combine(
                f,
                ld_b,
                f.add(64),
                8,
                i,
                idx,
                8,
                2,
                8,
                out,
                ld_o,
                null_mut(),
            )
        };
        assert_eq!(
            cc(8, f, 9, i),
            1,
            "critical_combine in place with another ld"
        );
        assert_eq!(cc(7, f.add(128), 8, i), 1, "critical_combine ld_base < n");
        assert_eq!(cc(8, f.add(128), 8, null()), 1, "critical_combine idx NULL");
        assert_eq!(
            cc(8, f.add(64), 8, i),
            1,
            "critical_combine out == value_l1"
        );
        let lb = |mode: i32, w: *const f64, layers: i64, per: i64, beta: u32, alpha: f32| {
            kve_cuda_layer_budgets(
                mode,
                w,
                layers,
                per,
                10,
                5,
                beta,
                alpha,
                dummy,
                null_mut(),
                null_mut(),
            )
        };
        let wts = 16 as *const f64;
        assert_eq!(lb(4, wts, 2, 2, 20, 0.2), 1, "layer_budgets mode 4");
        assert_eq!(lb(1, wts, 2, 2, 0, 0.2), 1, "layer_budgets pyramid beta 0");
        assert_eq!(lb(2, wts, 2, 2, 20, 1.5), 1, "layer_budgets alpha > 1");
        assert_eq!(lb(3, wts, 2, 2, 20, f32::NAN), 1, "layer_budgets alpha NaN");
        assert_eq!(
            lb(3, null(), 2, 2, 20, 0.2),
            1,
            "layer_budgets lava without weights"
        );
        assert_eq!(lb(0, wts, 2, 0, 20, 0.2), 1, "layer_budgets per_layer 0");
        assert_eq!(lb(0, wts, -1, 2, 20, 0.2), 1, "layer_budgets layers < 0");
        assert_eq!(
            kve_cuda_layer_budgets(
                0,
                null(),
                4,
                1 << 30,
                1 << 30,
                5,
                20,
                0.2,
                dummy,
                null_mut(),
                null_mut()
            ),
            1,
            "layer_budgets layers·per_layer·p >= 2^62"
        );
        assert_eq!(
            kve_cuda_layer_budgets(
                0,
                null(),
                2,
                2,
                10,
                5,
                20,
                0.2,
                null_mut(),
                null_mut(),
                null_mut()
            ),
            1,
            "layer_budgets k_layer NULL"
        );
        assert_eq!(
            kve_cuda_mark_forced(f, 8, -1, i, i, 8, null_mut()),
            1,
            "mark_forced rows < 0"
        );
        assert_eq!(
            kve_cuda_mark_forced(f, 8, 2, null(), i, 8, null_mut()),
            1,
            "mark_forced counts NULL"
        );
        assert_eq!(
            kve_cuda_broadcast_lists(i, i.add(8), 8, 2, 2, i, i.add(64), 8, null_mut()),
            1,
            "broadcast_lists counts over the source"
        );
        assert_eq!(
            kve_cuda_broadcast_lists(i, i.add(8), 8, 2, -1, i.add(32), i.add(64), 8, null_mut()),
            1,
            "broadcast_lists reps < 0"
        );
        // dst NULL with rows to copy: refused before cu_seqlens is written (no launch,
        // so the answer is 1 even without a device)
        let src = KveCudaView {
            stride_head: 4,
            stride_token: 1,
            heads: 2,
            tokens: 4,
            ..ok_view
        };
        assert_eq!(
            kve_cuda_compact_varlen(&src, i, 0, i.add(8), null_mut(), i.add(16), null_mut()),
            1,
            "compact_varlen dst NULL"
        );
    }
}

struct WinCase {
    hq: usize,
    hkv: usize,
    w: usize,
    n: usize,
    dk: usize,
}

#[test]
fn window_aggregates_match_reference() {
    need_device!();
    let mut rng = Rng::new(1);
    let cases = [
        WinCase {
            hq: 8,
            hkv: 2,
            w: 7,
            n: 150,
            dk: 64,
        },
        WinCase {
            hq: 4,
            hkv: 4,
            w: 3,
            n: 70,
            dk: 40,
        },
        WinCase {
            hq: 6,
            hkv: 2,
            w: 45,
            n: 300,
            dk: 128,
        },
        WinCase {
            hq: 16,
            hkv: 2,
            w: 20,
            n: 200,
            dk: 96,
        },
        WinCase {
            hq: 4,
            hkv: 1,
            w: 9,
            n: 129,
            dk: 200,
        },
        WinCase {
            hq: 2,
            hkv: 1,
            w: 5,
            n: 5,
            dk: 16,
        },
    ];
    for c in &cases {
        for dt in DTYPES {
            let layout = LAYOUTS[rng.below(3)]; // K: head-major, padded or token-major
            let spread = 1.0 + 3.0 * rng.unif();
            let q = Tensor::new(dt, Layout::HeadMajor, [c.hq, c.w, c.dk], &mut || {
                spread * rng.normal()
            });
            let k = Tensor::new(dt, layout, [c.hkv, c.n, c.dk], &mut || rng.normal());
            let g = c.hq / c.hkv;
            let p = c.n - c.w;
            let np = g * (g + 1) / 2;
            let op = rng.below(3) as i32;
            let mean = poisoned(c.hq * p);
            let l2 = poisoned(c.hq * p);
            let cross = poisoned(c.hkv * np * p);
            let group = poisoned(c.hkv * p);
            let wsb = unsafe {
                kve_cuda_window_workspace_size(c.hq as i64, c.w as i64, c.n as i64, c.hkv as i64)
            };
            let ws = DBuf::<u8>::new(wsb);
            let rc = unsafe {
                kve_cuda_window(
                    &q.view(),
                    &k.view(),
                    c.w as i64,
                    mean.ptr(),
                    l2.ptr(),
                    cross.ptr(),
                    group.ptr(),
                    op,
                    null(),
                    ws.vptr(),
                    wsb,
                    null_mut(),
                )
            };
            ck(rc, "kve_cuda_window");
            let [rm, rl, rc_, rg] = ref_window(&q, &k, c.w, op);
            let tag = format!(
                "window hq{} hkv{} w{} n{} dk{} {:?} K {:?}",
                c.hq, c.hkv, c.w, c.n, c.dk, dt, layout
            );
            let tol = 2e-4;
            assert_close(&format!("{tag} mean"), &mean.download(), &rm, tol);
            assert_close(&format!("{tag} l2"), &l2.download(), &rl, tol);
            assert_close(&format!("{tag} cross"), &cross.download(), &rc_, tol);
            assert_close(&format!("{tag} group op{op}"), &group.download(), &rg, tol);
        }
    }
}

/// kve_cuda_window with the caller's row log-sum-exp (row_lse: f64 reference LSE
/// rounded to f32) gives the same aggregates as the two-pass path and the reference;
/// the workspace is NaN-filled first, so nothing of pass 1 is needed.
#[test]
fn window_row_lse_matches_computed_path() {
    need_device!();
    let mut rng = Rng::new(10);
    let cases = [
        WinCase {
            hq: 8,
            hkv: 2,
            w: 7,
            n: 150,
            dk: 64,
        },
        WinCase {
            hq: 6,
            hkv: 2,
            w: 45,
            n: 300,
            dk: 128,
        },
        WinCase {
            hq: 4,
            hkv: 1,
            w: 9,
            n: 129,
            dk: 200,
        },
        WinCase {
            hq: 16,
            hkv: 2,
            w: 20,
            n: 200,
            dk: 96,
        },
    ];
    for c in &cases {
        for dt in DTYPES {
            let layout = LAYOUTS[rng.below(3)];
            let spread = 1.0 + 3.0 * rng.unif();
            let q = Tensor::new(dt, Layout::HeadMajor, [c.hq, c.w, c.dk], &mut || {
                spread * rng.normal()
            });
            let k = Tensor::new(dt, layout, [c.hkv, c.n, c.dk], &mut || rng.normal());
            let g = c.hq / c.hkv;
            let p = c.n - c.w;
            let np = g * (g + 1) / 2;
            let op = rng.below(3) as i32;
            let lse: Vec<f32> = ref_row_lse(&q, &k, c.w).iter().map(|&x| x as f32).collect();
            let lsed = DBuf::from(&lse);
            let wsb = unsafe {
                kve_cuda_window_workspace_size(c.hq as i64, c.w as i64, c.n as i64, c.hkv as i64)
            };
            let mut runs = Vec::new();
            for with_lse in [false, true] {
                let (mean, l2, cross, group) = (
                    poisoned(c.hq * p),
                    poisoned(c.hq * p),
                    poisoned(c.hkv * np * p),
                    poisoned(c.hkv * p),
                );
                let ws = DBuf::from(&vec![0xFFu8; wsb]);
                ck(
                    unsafe {
                        kve_cuda_window(
                            &q.view(),
                            &k.view(),
                            c.w as i64,
                            mean.ptr(),
                            l2.ptr(),
                            cross.ptr(),
                            group.ptr(),
                            op,
                            if with_lse { lsed.ptr() } else { null() },
                            ws.vptr(),
                            wsb,
                            null_mut(),
                        )
                    },
                    "kve_cuda_window",
                );
                runs.push([
                    mean.download(),
                    l2.download(),
                    cross.download(),
                    group.download(),
                ]);
            }
            let want = ref_window(&q, &k, c.w, op);
            let tag = format!(
                "window row_lse hq{} hkv{} w{} n{} dk{} {:?} K {:?} op{op}",
                c.hq, c.hkv, c.w, c.n, c.dk, dt, layout
            );
            for (x, name) in ["mean", "l2", "cross", "group"].iter().enumerate() {
                assert_close(&format!("{tag} {name}"), &runs[1][x], &want[x], 2e-4);
                let two_pass: Vec<f64> = runs[0][x].iter().map(|&v| v as f64).collect();
                assert_close(
                    &format!("{tag} {name} vs two-pass"),
                    &runs[1][x],
                    &two_pass,
                    2e-4,
                );
            }
        }
    }
    // the row_lse path in a CUDA graph: replays equal the eager run
    let (hq, hkv, w, n, d) = (4usize, 2usize, 8usize, 300usize, 64usize);
    let p = n - w;
    let q = Tensor::new(Dt::Bf16, Layout::HeadMajor, [hq, w, d], &mut || {
        rng.normal()
    });
    let k = Tensor::new(Dt::Bf16, Layout::TokenMajor, [hkv, n, d], &mut || {
        rng.normal()
    });
    let lse: Vec<f32> = ref_row_lse(&q, &k, w).iter().map(|&x| x as f32).collect();
    let lsed = DBuf::from(&lse);
    let wsb = unsafe { kve_cuda_window_workspace_size(hq as i64, w as i64, n as i64, hkv as i64) };
    let ws = DBuf::<u8>::new(wsb);
    let l2 = poisoned(hq * p);
    let run = |s: *mut c_void| {
        ck(
            unsafe {
                kve_cuda_window(
                    &q.view(),
                    &k.view(),
                    w as i64,
                    null_mut(),
                    l2.ptr(),
                    null_mut(),
                    null_mut(),
                    0,
                    lsed.ptr(),
                    ws.vptr(),
                    wsb,
                    s,
                )
            },
            "window row_lse",
        )
    };
    run(null_mut());
    let e = l2.download();
    l2.upload(&vec![f32::NAN; hq * p]);
    in_graph(&run);
    assert_eq!(l2.download(), e, "row_lse graph replay");
    let want = ref_window(&q, &k, w, 0);
    assert_close("window row_lse graph", &e, &want[1], 2e-4);
}

/// Captures `f(stream)` (global capture mode) in a CUDA graph, launches it twice and
/// synchronises: the launchers inside must be capturable.
fn in_graph(f: &dyn Fn(*mut c_void)) {
    let mut s = null_mut();
    let mut graph = null_mut();
    let mut exec = null_mut();
    unsafe {
        ck(rt::cudaStreamCreate(&mut s), "stream");
        ck(
            rt::cudaStreamBeginCapture(s, rt::CAPTURE_GLOBAL),
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

#[test]
fn lava_factor_matches_reference() {
    need_device!();
    let mut rng = Rng::new(2);
    for dt in DTYPES {
        for layout in LAYOUTS {
            let (hkv, n, dv) = (3, 1000, 72);
            let prefix = 1 + rng.below(n);
            let v = Tensor::new(dt, layout, [hkv, n, dv], &mut || rng.normal());
            let out = poisoned(hkv);
            ck(
                unsafe { kve_cuda_lava_factor(&v.view(), prefix as i64, out.ptr(), null_mut()) },
                "lava",
            );
            let want: Vec<f64> = (0..hkv)
                .map(|h| {
                    (0..prefix)
                        .map(|i| (0..dv).map(|d| v.at(h, i, d).abs()).sum::<f64>())
                        .fold(0.0, f64::max)
                })
                .collect();
            assert_close(
                &format!("lava factor {dt:?} {layout:?}"),
                &out.download(),
                &want,
                1e-5,
            );
        }
    }
}

#[test]
fn vonorm_matches_reference() {
    need_device!();
    let mut rng = Rng::new(3);
    for dt in DTYPES {
        for &(hkv, gpk, n, dv) in &[
            (2usize, 3usize, 300usize, 64usize),
            (1, 2, 130, 128),
            (2, 1, 70, 200),
            (1, 1, 33, 40),
        ] {
            for split in [false, true] {
                if dt == Dt::F32 && split {
                    continue;
                }
                let layout = LAYOUTS[rng.below(4)];
                let v = Tensor::new(dt, layout, [hkv, n, dv], &mut || rng.normal());
                let ngram = hkv * gpk;
                // PSD Grams like Wo_h Wo_hᵀ / D
                let dm = 96;
                let mut gram = vec![0f32; ngram * dv * dv];
                for m in 0..ngram {
                    let wo: Vec<f32> = (0..dv * dm).map(|_| rng.normal()).collect();
                    for r in 0..dv {
                        for c in 0..dv {
                            let s: f64 = (0..dm)
                                .map(|x| wo[r * dm + x] as f64 * wo[c * dm + x] as f64)
                                .sum();
                            gram[(m * dv + r) * dv + c] = (s / dm as f64) as f32;
                        }
                    }
                }
                let gd = DBuf::from(&gram);
                let hi = DBuf::<u8>::new(gram.len() * dt.size());
                let lo = DBuf::<u8>::new(gram.len() * dt.size());
                ck(
                    unsafe {
                        kve_cuda_gram_split(
                            gd.ptr(),
                            gram.len() as i64,
                            dt.code(),
                            hi.vptr(),
                            if split { lo.vptr() } else { null_mut() },
                            null_mut(),
                        )
                    },
                    "gram_split",
                );
                let out = poisoned(ngram * n);
                let ntok = n - rng.below(3);
                let out = if ntok < n {
                    poisoned(ngram * ntok)
                } else {
                    out
                };
                ck(
                    unsafe {
                        kve_cuda_vonorm(
                            &v.view(),
                            ntok as i64,
                            hi.vptr(),
                            if split { lo.vptr() } else { null() },
                            ngram as i64,
                            0,
                            out.ptr(),
                            null_mut(),
                        )
                    },
                    "vonorm",
                );
                // reference with the Gram the kernel sees: rounded (hi) or exact (hi+lo)
                let geff: Vec<f64> = gram
                    .iter()
                    .map(|&x| {
                        if split || dt == Dt::F32 {
                            x as f64
                        } else {
                            dt.round(x) as f64
                        }
                    })
                    .collect();
                let mut want = vec![0f64; ngram * ntok];
                for m in 0..ngram {
                    let hk = m / gpk;
                    for i in 0..ntok {
                        let mut s = 0f64;
                        for r in 0..dv {
                            let vr = v.at(hk, i, r);
                            for c in 0..dv {
                                s += vr * geff[(m * dv + r) * dv + c] * v.at(hk, i, c);
                            }
                        }
                        want[m * ntok + i] = s;
                    }
                }
                let tol = if split || dt == Dt::F32 { 1e-4 } else { 1e-3 };
                assert_close(
                    &format!(
                        "vonorm {dt:?} {layout:?} hkv{hkv} gpk{gpk} n{ntok} dv{dv} split{split}"
                    ),
                    &out.download(),
                    &want,
                    tol,
                );
                // sqrt variant
                let out2 = poisoned(ngram * ntok);
                ck(
                    unsafe {
                        kve_cuda_vonorm(
                            &v.view(),
                            ntok as i64,
                            hi.vptr(),
                            if split { lo.vptr() } else { null() },
                            ngram as i64,
                            1,
                            out2.ptr(),
                            null_mut(),
                        )
                    },
                    "vonorm sqrt",
                );
                let want2: Vec<f64> = want.iter().map(|x| x.max(0.0).sqrt()).collect();
                assert_close("vonorm sqrt", &out2.download(), &want2, tol);
            }
        }
    }
}

#[test]
fn pool_matches_reference() {
    need_device!();
    let mut rng = Rng::new(4);
    let (rows, n) = (5, 777);
    let x: Vec<f32> = (0..rows * (n + 3)).map(|_| rng.unif()).collect();
    let xd = DBuf::from(&x);
    for (mode, k) in [
        (KVE_CUDA_POOL_AVG, 7),
        (KVE_CUDA_POOL_AVG, 1),
        (KVE_CUDA_POOL_MAX, 5),
        (KVE_CUDA_POOL_FORWARD, 8),
        (KVE_CUDA_POOL_FORWARD, 1),
    ] {
        let out = poisoned(rows * n);
        let decay = 0.9f32;
        ck(
            unsafe {
                kve_cuda_pool(
                    xd.ptr(),
                    (n + 3) as i64,
                    out.ptr(),
                    n as i64,
                    rows as i64,
                    n as i64,
                    mode,
                    k,
                    decay,
                    null_mut(),
                )
            },
            "pool",
        );
        let mut want = Vec::new();
        for r in 0..rows {
            let row: Vec<f64> = x[r * (n + 3)..r * (n + 3) + n]
                .iter()
                .map(|&v| v as f64)
                .collect();
            want.extend(ref_pool(&row, mode, k as usize, decay as f64));
        }
        assert_close(
            &format!("pool mode{mode} k{k}"),
            &out.download(),
            &want,
            1e-5,
        );
    }
}

/// Rows of `rows × n` values at row stride `ld`, the gaps NaN (so a read of a gap shows).
fn strided(vals: &[f32], rows: usize, n: usize, ld: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; rows * ld];
    for r in 0..rows {
        out[r * ld..r * ld + n].copy_from_slice(&vals[r * n..(r + 1) * n]);
    }
    out
}

/// The `rows × n` values of a strided download; asserts the gaps were not written.
#[track_caller]
fn unstride(what: &str, got: &[f32], rows: usize, n: usize, ld: usize) -> Vec<f32> {
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

#[test]
fn head_reduce_and_laprox_exact_match_reference() {
    need_device!();
    let mut rng = Rng::new(5);
    let (hkv, g, n) = (3usize, 4usize, 500usize);
    let hq = hkv * g;
    let (ld_a, ld_b, ld_o) = (n + 3, n + 17, n + 5);
    let a: Vec<f32> = (0..hq * n).map(|_| rng.unif()).collect();
    let b: Vec<f32> = (0..hq * n).map(|_| rng.unif() * 5.0).collect();
    let sc: Vec<f32> = (0..hkv).map(|_| 1.0 + rng.unif()).collect();
    let (ad, bd, sd) = (
        DBuf::from(&strided(&a, hq, n, ld_a)),
        DBuf::from(&strided(&b, hq, n, ld_b)),
        DBuf::from(&sc),
    );
    let reference = |op: i32, bm: i32, use_scale: bool, hkv: usize, g: usize| -> Vec<f64> {
        let mut want = vec![0f64; hkv * n];
        for hk in 0..hkv {
            for i in 0..n {
                let xs: Vec<f64> = (0..g)
                    .map(|hh| {
                        let h = hk * g + hh;
                        let mut x = a[h * n + i] as f64;
                        if bm == 1 {
                            x *= (b[h * n + i] as f64).sqrt();
                        }
                        if bm == 2 {
                            x *= b[h * n + i] as f64;
                        }
                        if use_scale {
                            x *= sc[hk] as f64;
                        }
                        x
                    })
                    .collect();
                want[hk * n + i] = gqa(op, &xs);
            }
        }
        want
    };
    for op in 0..3 {
        for bm in 0..3 {
            for use_scale in [false, true] {
                let out = poisoned(hkv * ld_o);
                ck(
                    unsafe {
                        kve_cuda_head_reduce(
                            ad.ptr(),
                            ld_a as i64,
                            if bm == 0 { null() } else { bd.ptr() },
                            ld_b as i64,
                            bm,
                            if use_scale { sd.ptr() } else { null() },
                            out.ptr(),
                            ld_o as i64,
                            hq as i64,
                            hkv as i64,
                            n as i64,
                            op,
                            null_mut(),
                        )
                    },
                    "head_reduce",
                );
                let what = format!("head_reduce op{op} b{bm} scale{use_scale} (strided)");
                let got = unstride(&what, &out.download(), hkv, n, ld_o);
                assert_close(&what, &got, &reference(op, bm, use_scale, hkv, g), 1e-5);
            }
        }
    }
    // in place (Hkv == Hq, out == a, same row stride): plain per-head products
    for bm in 1..3 {
        let inplace = DBuf::from(&strided(&a, hq, n, ld_a));
        ck(
            unsafe {
                kve_cuda_head_reduce(
                    inplace.ptr(),
                    ld_a as i64,
                    bd.ptr(),
                    ld_b as i64,
                    bm,
                    null(),
                    inplace.ptr(),
                    ld_a as i64,
                    hq as i64,
                    hq as i64,
                    n as i64,
                    KVE_CUDA_GQA_SUM,
                    null_mut(),
                )
            },
            "head_reduce in place",
        );
        let what = format!("head_reduce in place b{bm}");
        let got = unstride(&what, &inplace.download(), hq, n, ld_a);
        assert_close(
            &what,
            &got,
            &reference(KVE_CUDA_GQA_SUM, bm, false, hq, 1),
            1e-6,
        );
    }
    // exact GQA from cross terms, every mode, strided; unused inputs passed as NULL
    let np = g * (g + 1) / 2;
    let (ld_c, ld_q) = (n + 9, n + 1);
    let cross: Vec<f32> = (0..hkv * np * n).map(|_| rng.unif()).collect();
    let mut qv: Vec<f32> = (0..hkv * np * n).map(|_| rng.unif()).collect();
    for x in qv.iter_mut().step_by(13) {
        *x *= -0.25; // rounding can make v G vᵀ slightly negative: clamped at 0
    }
    let (cd, qd) = (
        DBuf::from(&strided(&cross, hkv * np, n, ld_c)),
        DBuf::from(&strided(&qv, hkv * np, n, ld_q)),
    );
    for mode in [
        KVE_CUDA_LAPROX_EXACT,
        KVE_CUDA_LAPROX_MEAN_ATTN,
        KVE_CUDA_LAPROX_ATTN_TERM,
        KVE_CUDA_LAPROX_VALUE_TERM,
    ] {
        let out = poisoned(hkv * ld_o);
        ck(
            unsafe {
                kve_cuda_laprox_exact(
                    if mode == KVE_CUDA_LAPROX_VALUE_TERM {
                        null()
                    } else {
                        cd.ptr()
                    },
                    ld_c as i64,
                    if mode == KVE_CUDA_LAPROX_ATTN_TERM {
                        null()
                    } else {
                        qd.ptr()
                    },
                    ld_q as i64,
                    out.ptr(),
                    ld_o as i64,
                    hkv as i64,
                    g as i64,
                    n as i64,
                    mode,
                    null_mut(),
                )
            },
            "laprox_exact",
        );
        let mut want = vec![0f64; hkv * n];
        for hk in 0..hkv {
            for i in 0..n {
                let (mut s, mut cs, mut vs) = (0f64, 0f64, 0f64);
                for p in 0..np {
                    let w = if p < g { 1.0 } else { 2.0 };
                    let c = cross[(hk * np + p) * n + i] as f64;
                    let q = qv[(hk * np + p) * n + i] as f64;
                    s += w * c * q;
                    cs += w * c;
                    if p < g {
                        vs += q.max(0.0).sqrt();
                    }
                }
                let (attn, value) = (cs.max(0.0).sqrt(), vs / g as f64);
                want[hk * n + i] = match mode {
                    KVE_CUDA_LAPROX_EXACT => s.max(0.0).sqrt(),
                    KVE_CUDA_LAPROX_MEAN_ATTN => attn * value,
                    KVE_CUDA_LAPROX_ATTN_TERM => attn,
                    _ => value,
                };
            }
        }
        let what = format!("laprox_exact mode{mode} (strided)");
        let got = unstride(&what, &out.download(), hkv, n, ld_o);
        assert_close(&what, &got, &want, 1e-5);
    }
}

#[test]
fn layer_stats_and_token_reduce_match_reference() {
    need_device!();
    let mut rng = Rng::new(6);
    let (layers, rpl, n) = (5usize, 3usize, 20000usize);
    let stride = rpl * n;
    let mut s: Vec<f32> = (0..layers * stride)
        .map(|_| rng.unif() * rng.unif())
        .collect();
    for x in s.iter_mut().take(100) {
        *x = 0.0; // zeros contribute nothing to the entropy
    }
    for x in s.iter_mut().skip(100).step_by(97) {
        *x = -*x; // negative scores count by |s|, as in the core
    }
    let sd = DBuf::from(&s);
    let wsb = unsafe { kve_cuda_layer_stats_workspace_size(layers as i64, stride as i64) };
    let ws = DBuf::<u8>::new(wsb);
    let sums = DBuf::from(&vec![f64::NAN; layers]);
    let ent = DBuf::from(&vec![f64::NAN; layers]);
    ck(
        unsafe {
            kve_cuda_layer_stats(
                sd.ptr(),
                stride as i64,
                stride as i64,
                layers as i64,
                sums.ptr(),
                ent.ptr(),
                ws.vptr(),
                wsb,
                null_mut(),
            )
        },
        "layer_stats",
    );
    let (gs, ge) = (sums.download(), ent.download());
    for l in 0..layers {
        let xs = &s[l * stride..(l + 1) * stride];
        let tot: f64 = xs.iter().map(|&x| (x as f64).abs()).sum();
        let e: f64 = xs
            .iter()
            .filter(|&&x| x != 0.0)
            .map(|&x| {
                let p = (x as f64).abs() / tot;
                -p * p.ln()
            })
            .sum();
        assert!(
            (gs[l] - tot).abs() <= 1e-9 * tot,
            "sum layer {l}: {} vs {tot}",
            gs[l]
        );
        assert!(
            (ge[l] - e).abs() <= 1e-9 * e.max(1.0),
            "entropy layer {l}: {} vs {e}",
            ge[l]
        );
        // and the core's entropy
        let core = kvevict::budget::lava::layer_entropy(xs);
        assert!(
            (ge[l] - core).abs() <= 1e-6 * e.max(1.0),
            "core entropy layer {l}: {core} vs gpu {}",
            ge[l]
        );
    }
    for norm in [false, true] {
        let out = poisoned(n);
        ck(
            unsafe {
                kve_cuda_token_reduce(
                    sd.ptr(),
                    if norm { sums.ptr() } else { null() },
                    layers as i64,
                    rpl as i64,
                    n as i64,
                    out.ptr(),
                    null_mut(),
                )
            },
            "token_reduce",
        );
        let want: Vec<f64> = (0..n)
            .map(|i| {
                (0..layers)
                    .map(|l| {
                        let la: f64 = (0..rpl).map(|r| s[(l * rpl + r) * n + i] as f64).sum();
                        if norm {
                            la / gs[l]
                        } else {
                            la
                        }
                    })
                    .sum()
            })
            .collect();
        let got = out.download();
        assert_close(&format!("token_reduce norm{norm}"), &got, &want, 1e-5);
        // bit for bit the core's token-granularity arithmetic (f32, (layer, row) order)
        let core: Vec<f32> = (0..n)
            .map(|i| {
                let mut acc = 0f32;
                for l in 0..layers {
                    let f = if norm && gs[l] > 0.0 {
                        (1.0 / gs[l]) as f32
                    } else {
                        1.0
                    };
                    for r in 0..rpl {
                        acc += s[(l * rpl + r) * n + i] * f;
                    }
                }
                acc
            })
            .collect();
        assert!(
            got.iter()
                .zip(&core)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "token_reduce norm{norm}: not the core's bits"
        );
    }
}

/// Host reference of kve_cuda_select: per group, the k largest composite keys
/// (score key, position, lower row first), kept positions ascending per row.
fn ref_select(
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

#[test]
fn select_matches_reference_exactly() {
    need_device!();
    let mut rng = Rng::new(7);
    // (layers, hkv, n): shapes; modes: global, per layer, per head
    for &(layers, hkv, n) in &[
        (4usize, 2usize, 1000usize),
        (3, 4, 37),
        (2, 1, 5000),
        (1, 1, 1),
    ] {
        let rows = layers * hkv;
        for mode in 0..3 {
            for ties in [false, true] {
                let s: Vec<f32> = (0..rows * n)
                    .map(|_| {
                        if ties {
                            (rng.below(7) as f32) * 0.25
                        } else {
                            rng.unif()
                        }
                    })
                    .collect();
                let (groups, rpg) = match mode {
                    0 => (1, rows),
                    1 => (layers, hkv),
                    _ => (rows, 1),
                };
                let ks: Vec<i64> = (0..groups)
                    .map(|_| rng.below(rpg * n + 2) as i64 - 1)
                    .collect();
                let norm = rng.below(2) == 1;
                let sums: Vec<f64> = (0..layers)
                    .map(|l| {
                        s[l * hkv * n..(l + 1) * hkv * n]
                            .iter()
                            .map(|&x| x as f64)
                            .sum::<f64>()
                            .max(1e-3)
                    })
                    .collect();
                let sd = DBuf::from(&s);
                let kd = DBuf::from(&ks);
                let lsd = DBuf::from(&sums);
                let counts = DBuf::from(&vec![-1i32; rows]);
                let idx = DBuf::from(&vec![-1i32; rows * n]);
                let wsb = unsafe { kve_cuda_select_workspace_size(groups as i64) };
                let ws = DBuf::<u8>::new(wsb);
                ck(
                    unsafe {
                        kve_cuda_select(
                            sd.ptr(),
                            n as i64,
                            n as i64,
                            groups as i64,
                            rpg as i64,
                            kd.ptr(),
                            0,
                            if norm { lsd.ptr() } else { null() },
                            hkv as i64,
                            counts.ptr(),
                            idx.ptr(),
                            n as i64,
                            ws.vptr(),
                            wsb,
                            null_mut(),
                        )
                    },
                    "select",
                );
                let want = ref_select(
                    &s,
                    n,
                    groups,
                    rpg,
                    &ks,
                    if norm { Some((&sums, hkv)) } else { None },
                );
                let (gc, gi) = (counts.download(), idx.download());
                for r in 0..rows {
                    let got = &gi[r * n..r * n + gc[r].max(0) as usize];
                    assert_eq!(gc[r] as usize, want[r].len(), "select count row {r} (layers {layers} hkv {hkv} n {n} mode {mode} ties {ties} norm {norm})");
                    assert_eq!(
                        got,
                        &want[r][..],
                        "select row {r} mode {mode} ties {ties} norm {norm}"
                    );
                }
            }
        }
    }
}

#[test]
fn compact_matches_reference() {
    need_device!();
    let mut rng = Rng::new(8);
    for dt in DTYPES {
        for layout in LAYOUTS {
            for shared in [false, true] {
                let (h, n, d) = (3usize, 257usize, 24usize);
                let x = Tensor::new(dt, layout, [h, n, d], &mut || rng.normal());
                let lists = if shared { 1 } else { h };
                let mut kept = vec![0i32; lists * n];
                let mut counts = vec![0i32; lists];
                for l in 0..lists {
                    let mut c = 0;
                    for t in 0..n {
                        if rng.unif() < 0.3 || t < 5 {
                            kept[l * n + c] = t as i32;
                            c += 1;
                        }
                    }
                    counts[l] = c as i32;
                }
                let max_keep = *counts.iter().max().unwrap() as usize;
                let (kd, cd) = (DBuf::from(&kept), DBuf::from(&counts));
                let kept_ld = if shared { 0 } else { n as i64 };
                // varlen (out of place) first: reads the untouched tensor
                let total: usize = (0..h)
                    .map(|hh| counts[if shared { 0 } else { hh }] as usize)
                    .sum();
                let dst = DBuf::<u8>::new(total * d * dt.size());
                let cu = DBuf::from(&vec![-1i32; h + 1]);
                ck(
                    unsafe {
                        kve_cuda_compact_varlen(
                            &x.view(),
                            kd.ptr(),
                            kept_ld,
                            cd.ptr(),
                            dst.vptr(),
                            cu.ptr(),
                            null_mut(),
                        )
                    },
                    "varlen",
                );
                let cug = cu.download();
                let dstv = dt.decode(&dst.download());
                let mut acc = 0;
                for hh in 0..h {
                    let l = if shared { 0 } else { hh };
                    assert_eq!(cug[hh], acc as i32, "cu_seqlens[{hh}]");
                    for t in 0..counts[l] as usize {
                        let src = kept[l * n + t] as usize;
                        for dd in 0..d {
                            assert_eq!(
                                dstv[(acc + t) * d + dd],
                                x.vals[(hh * n + src) * d + dd],
                                "varlen {dt:?} {layout:?} h{hh} t{t} d{dd}"
                            );
                        }
                    }
                    acc += counts[l] as usize;
                }
                assert_eq!(cug[h], acc as i32);
                // in place
                let wsb = unsafe { kve_cuda_compact_workspace_size(&x.view(), max_keep as i64) };
                let ws = DBuf::<u8>::new(wsb);
                ck(
                    unsafe {
                        kve_cuda_compact(
                            &x.view(),
                            kd.ptr(),
                            kept_ld,
                            cd.ptr(),
                            max_keep as i64,
                            ws.vptr(),
                            wsb,
                            null_mut(),
                        )
                    },
                    "compact",
                );
                let got = x.read_back();
                for hh in 0..h {
                    let l = if shared { 0 } else { hh };
                    for t in 0..n {
                        let src = if t < counts[l] as usize {
                            kept[l * n + t] as usize
                        } else {
                            t
                        };
                        for dd in 0..d {
                            assert_eq!(
                                got[(hh * n + t) * d + dd],
                                x.vals[(hh * n + src) * d + dd],
                                "in place {dt:?} {layout:?} shared {shared} h{hh} t{t} d{dd}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The whole LaProx pipeline of one layer, captured in a CUDA graph and replayed:
/// proves the launchers are capturable and gives the same numbers as eager runs.
#[test]
fn laprox_pipeline_graph_capture_matches_eager() {
    need_device!();
    let mut rng = Rng::new(9);
    let (hq, hkv, w, n, d) = (8usize, 2usize, 16usize, 600usize, 64usize);
    let p = n - w;
    let dt = Dt::Bf16;
    let q = Tensor::new(dt, Layout::HeadMajor, [hq, w, d], &mut || rng.normal());
    let k = Tensor::new(dt, Layout::HeadMajor, [hkv, n, d], &mut || rng.normal());
    let v = Tensor::new(dt, Layout::HeadMajor, [hkv, n, d], &mut || rng.normal());
    let gram: Vec<f32> = (0..hq * d * d)
        .map(|i| {
            if i % (d + 1) == 0 {
                1.0
            } else {
                0.01 * rng.normal()
            }
        })
        .collect();
    let gd = DBuf::from(&gram);
    let ghi = DBuf::<u8>::new(gram.len() * 2);
    ck(
        unsafe {
            kve_cuda_gram_split(
                gd.ptr(),
                gram.len() as i64,
                dt.code(),
                ghi.vptr(),
                null_mut(),
                null_mut(),
            )
        },
        "split",
    );
    let wsb = unsafe { kve_cuda_window_workspace_size(hq as i64, w as i64, n as i64, hkv as i64) };
    let ws = DBuf::<u8>::new(wsb);
    let swsb = unsafe { kve_cuda_select_workspace_size(1) };
    let sws = DBuf::<u8>::new(swsb);
    let (l2, pooled, vo, score) = (
        poisoned(hq * p),
        poisoned(hq * p),
        poisoned(hq * p),
        poisoned(hkv * p),
    );
    let counts = DBuf::from(&vec![-1i32; hkv]);
    let idx = DBuf::from(&vec![-1i32; hkv * p]);
    let kk = (hkv * p / 10) as i64;
    let run = |s: *mut c_void| unsafe {
        ck(
            kve_cuda_window(
                &q.view(),
                &k.view(),
                w as i64,
                null_mut(),
                l2.ptr(),
                null_mut(),
                null_mut(),
                0,
                null(),
                ws.vptr(),
                wsb,
                s,
            ),
            "window",
        );
        ck(
            kve_cuda_pool(
                l2.ptr(),
                p as i64,
                pooled.ptr(),
                p as i64,
                hq as i64,
                p as i64,
                KVE_CUDA_POOL_AVG,
                7,
                1.0,
                s,
            ),
            "pool",
        );
        ck(
            kve_cuda_vonorm(
                &v.view(),
                p as i64,
                ghi.vptr(),
                null(),
                hq as i64,
                0,
                vo.ptr(),
                s,
            ),
            "vonorm",
        );
        ck(
            kve_cuda_head_reduce(
                pooled.ptr(),
                p as i64,
                vo.ptr(),
                p as i64,
                1,
                null(),
                score.ptr(),
                p as i64,
                hq as i64,
                hkv as i64,
                p as i64,
                KVE_CUDA_GQA_SUM,
                s,
            ),
            "reduce",
        );
        ck(
            kve_cuda_select(
                score.ptr(),
                p as i64,
                p as i64,
                1,
                hkv as i64,
                null(),
                kk,
                null(),
                1,
                counts.ptr(),
                idx.ptr(),
                p as i64,
                sws.vptr(),
                swsb,
                s,
            ),
            "select",
        );
    };
    let mut s = null_mut();
    ck(unsafe { rt::cudaStreamCreate(&mut s) }, "stream");
    run(s);
    ck(unsafe { rt::cudaStreamSynchronize(s) }, "sync");
    let (e_score, e_counts, e_idx) = (score.download(), counts.download(), idx.download());
    score.upload(&vec![f32::NAN; hkv * p]);
    counts.upload(&vec![-1; hkv]);
    let mut graph = null_mut();
    let mut exec = null_mut();
    unsafe {
        ck(
            rt::cudaStreamBeginCapture(s, rt::CAPTURE_GLOBAL),
            "begin capture",
        );
        run(s);
        ck(rt::cudaStreamEndCapture(s, &mut graph), "end capture");
        ck(rt::cudaGraphInstantiate(&mut exec, graph, 0), "instantiate");
        ck(rt::cudaGraphLaunch(exec, s), "graph launch");
        ck(rt::cudaGraphLaunch(exec, s), "graph launch twice");
        ck(rt::cudaStreamSynchronize(s), "sync graph");
    }
    assert_eq!(score.download(), e_score, "graph replay scores");
    assert_eq!(counts.download(), e_counts, "graph replay counts");
    assert_eq!(idx.download(), e_idx, "graph replay indices");
    assert_eq!(e_counts.iter().map(|&c| c as i64).sum::<i64>(), kk);
    // reference: f64 LaProx default (pool the attention term, sum over the group)
    let a = ref_attention(&q, &k, w);
    let mut want = vec![0f64; hkv * p];
    for h in 0..hq {
        let col: Vec<f64> = (0..p)
            .map(|i| {
                (0..w)
                    .map(|j| a[(h * w + j) * n + i].powi(2))
                    .sum::<f64>()
                    .sqrt()
            })
            .collect();
        let pooled = ref_pool(&col, KVE_CUDA_POOL_AVG, 7, 1.0);
        for i in 0..p {
            let mut qf = 0f64;
            for r in 0..d {
                for c in 0..d {
                    qf += v.at(h / (hq / hkv), i, r)
                        * (dt.round(gram[(h * d + r) * d + c]) as f64)
                        * v.at(h / (hq / hkv), i, c);
                }
            }
            want[(h / (hq / hkv)) * p + i] += pooled[i] * qf.max(0.0).sqrt();
        }
    }
    assert_close("laprox pipeline", &e_score, &want, 2e-3);
    unsafe {
        rt::cudaGraphExecDestroy(exec);
        rt::cudaGraphDestroy(graph);
        rt::cudaStreamDestroy(s);
    }
}

// ================================================= the core (src/) as reference --

/// Scores `[Hkv][P]` of one layer from the CPU core.
fn core_scores(
    preset: kvevict::Preset,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    gram: Option<&[f32]>,
    w: usize,
) -> Vec<f32> {
    let mut cfg = kvevict::ScoreConfig::preset(preset);
    cfg.window = w as u32;
    let inputs = kvevict::LayerInputs {
        queries: Some(q.core_view()),
        keys: Some(k.core_view()),
        values: Some(v.core_view()),
        gram,
        ..Default::default()
    };
    let shape = kvevict::layer_shape(&cfg, &inputs).expect("layer_shape");
    let mut out = vec![0f32; kvevict::score_len(&cfg, &shape).unwrap()];
    let mut ws = vec![0u8; kvevict::score_workspace_size(&cfg, &shape).unwrap()];
    kvevict::score_layer(&cfg, &inputs, &mut out, &mut ws).expect("score_layer");
    out
}

/// Gram matrices `[Hq][dv][dv]` (f32) from a random `Wo` through the core.
fn core_gram(rng: &mut Rng, hq: usize, hkv: usize, dv: usize, dm: usize) -> Vec<f32> {
    let wo: Vec<f32> = (0..hq * dv * dm).map(|_| 0.1 * rng.normal()).collect();
    let view = kvevict::View::f32_contiguous(&wo, [hq, dv, dm]).unwrap();
    let mut g = vec![0f32; kvevict::gram_len(hq, hkv, dv, false).unwrap()];
    let mut ws = vec![0u8; kvevict::gram_workspace_size(dv, dm).unwrap()];
    kvevict::compute_gram(&view, hkv, false, &mut g, &mut ws).unwrap();
    g
}

/// f64 reference of the three scorer presets (SPEC §3) on one layer:
/// LaProx (avg 7 on ||A||, times sqrt(v G vᵀ), group sum), SnapKV (max 7 on the
/// mean, group mean), LAVa (max 7 on the mean, times max_k ||V_k||_1, group max).
fn ref_scores(which: &str, q: &Tensor, k: &Tensor, v: &Tensor, gram: &[f32], w: usize) -> Vec<f64> {
    let (hq, hkv, n, dv) = (q.ext[0], k.ext[0], k.ext[1], v.ext[2]);
    let (g, p) = (hq / hkv, n - w);
    let a = ref_attention(q, k, w);
    let mut out = vec![0f64; hkv * p];
    for hk in 0..hkv {
        let c: f64 = (0..p)
            .map(|i| (0..dv).map(|d| v.at(hk, i, d).abs()).sum::<f64>())
            .fold(0.0, f64::max);
        let mut per_head = Vec::new();
        for hh in 0..g {
            let h = hk * g + hh;
            let col = |f: &dyn Fn(f64) -> f64| -> Vec<f64> {
                (0..p)
                    .map(|i| (0..w).map(|j| f(a[(h * w + j) * n + i])).sum::<f64>())
                    .collect()
            };
            let s: Vec<f64> = match which {
                "laprox" => {
                    let l2: Vec<f64> = col(&|x| x * x).iter().map(|x| x.sqrt()).collect();
                    let pooled = ref_pool(&l2, KVE_CUDA_POOL_AVG, 7, 1.0);
                    (0..p)
                        .map(|i| {
                            let mut qf = 0f64;
                            for r in 0..dv {
                                for cc in 0..dv {
                                    qf += v.at(hk, i, r)
                                        * gram[(h * dv + r) * dv + cc] as f64
                                        * v.at(hk, i, cc);
                                }
                            }
                            pooled[i] * qf.max(0.0).sqrt()
                        })
                        .collect()
                }
                _ => {
                    let mean: Vec<f64> = col(&|x| x).iter().map(|x| x / w as f64).collect();
                    let pooled = ref_pool(&mean, KVE_CUDA_POOL_MAX, 7, 1.0);
                    if which == "lava" {
                        pooled.iter().map(|x| x * c).collect()
                    } else {
                        pooled
                    }
                }
            };
            per_head.push(s);
        }
        for i in 0..p {
            let xs: Vec<f64> = per_head.iter().map(|s| s[i]).collect();
            out[hk * p + i] = match which {
                "laprox" => gqa(KVE_CUDA_GQA_SUM, &xs),
                "lava" => gqa(KVE_CUDA_GQA_MAX, &xs),
                _ => gqa(KVE_CUDA_GQA_MEAN, &xs),
            };
        }
    }
    out
}

/// The core's kept prefix positions per (layer, head) for a global or uniform selection.
fn core_select(
    scores: &[f32],
    layers: usize,
    hkv: usize,
    p: usize,
    global: bool,
    budget: u64,
) -> Vec<Vec<i32>> {
    use kvevict::{AllocatorKind, Granularity, ModelScores, SelectConfig};
    let alloc = if global {
        AllocatorKind::Global
    } else {
        AllocatorKind::Uniform
    };
    let cfg = SelectConfig::new(alloc, Granularity::Head, budget);
    let window = 1; // the core appends the window's positions; we read only i < p
    let n = p + window;
    let m = ModelScores {
        scores,
        layers,
        hkv,
        n,
        window,
    };
    let (no, ni) = kvevict::select_output_len(&cfg, layers, hkv, n, window).unwrap();
    let mut off = vec![0u64; no];
    let mut idx = vec![0u32; ni];
    let mut ws = vec![0u8; kvevict::select_workspace_size(&cfg, layers, hkv, n, window).unwrap()];
    kvevict::select_model(&cfg, &m, &mut off, &mut idx, &mut ws).expect("select_model");
    (0..layers * hkv)
        .map(|u| {
            idx[off[u] as usize..off[u + 1] as usize]
                .iter()
                .filter(|&&i| (i as usize) < p)
                .map(|&i| i as i32)
                .collect()
        })
        .collect()
}

fn layer_sums(s: &[f32], layers: usize, per_layer: usize) -> Vec<f64> {
    (0..layers)
        .map(|l| {
            s[l * per_layer..(l + 1) * per_layer]
                .iter()
                .map(|&x| (x as f64).abs())
                .sum()
        })
        .collect()
}

/// CPU only (runs without a GPU): the f64 references of this file agree with the
/// core, so a GPU run that matches them also matches the core.
#[test]
fn references_agree_with_core_on_cpu() {
    let mut rng = Rng::new(20);
    for &(hq, hkv, w, n, d) in &[(4usize, 2usize, 6usize, 90usize, 16usize), (3, 1, 4, 50, 8)] {
        let q = Tensor::host(Dt::F32, Layout::HeadMajor, [hq, w, d], &mut || {
            2.0 * rng.normal()
        });
        let k = Tensor::host(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
            rng.normal()
        });
        let v = Tensor::host(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
            rng.normal()
        });
        let gram = core_gram(&mut rng, hq, hkv, d, 24);
        for (name, preset) in [
            ("laprox", kvevict::Preset::LaProx),
            ("snapkv", kvevict::Preset::SnapKv),
            ("lava", kvevict::Preset::Lava),
        ] {
            let core = core_scores(preset, &q, &k, &v, Some(&gram), w);
            let want = ref_scores(name, &q, &k, &v, &gram, w);
            assert_close(
                &format!("core vs f64 reference: {name} hq{hq} hkv{hkv}"),
                &core,
                &want,
                1e-4,
            );
        }
    }
    // KNorm and StreamingLLM (no attention): the references of the baseline launchers
    for &(hkv, n, d, w) in &[(2usize, 60usize, 16usize, 5usize), (3, 33, 7, 1)] {
        let (hq, p) = (hkv, n - w);
        let q = Tensor::host(Dt::F32, Layout::HeadMajor, [hq, w, d], &mut || rng.normal());
        let k = Tensor::host(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
            rng.normal()
        });
        let v = Tensor::host(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
            rng.normal()
        });
        let core = core_scores(kvevict::Preset::KNorm, &q, &k, &v, None, w);
        assert_close(
            "core vs f64 reference: knorm",
            &core,
            &ref_knorm(&k, p),
            1e-6,
        );
        assert_eq!(core, core_knorm(&k, p), "core_knorm helper");
        let core = core_scores(kvevict::Preset::StreamingLlm, &q, &k, &v, None, w);
        let sinks = kvevict::ScoreConfig::preset(kvevict::Preset::StreamingLlm).sinks as usize;
        assert_eq!(
            core,
            ref_sinks(hkv, p, sinks)
                .iter()
                .map(|&x| x as f32)
                .collect::<Vec<f32>>(),
            "core vs reference: streaming sinks"
        );
    }
    // row LSE: this file's f64 reference == the core's window_row_lse
    for &(hq, hkv, w, n, d) in &[(4usize, 2usize, 6usize, 90usize, 16usize), (3, 1, 4, 50, 8)] {
        let q = Tensor::host(Dt::F32, Layout::HeadMajor, [hq, w, d], &mut || {
            2.0 * rng.normal()
        });
        let k = Tensor::host(Dt::F32, Layout::HeadMajor, [hkv, n, d], &mut || {
            rng.normal()
        });
        let shape = kvevict::LayerShape {
            hq,
            hkv,
            n,
            dk: d,
            dv: d,
        };
        let mut ws = vec![0u8; kvevict::window_row_lse_workspace_size(&shape, w as u32).unwrap()];
        let mut core = vec![0f32; hq * w];
        kvevict::window_row_lse(&q.core_view(), &k.core_view(), w as u32, &mut core, &mut ws)
            .expect("window_row_lse");
        assert_close(
            &format!("core vs f64 reference: row lse hq{hq} hkv{hkv}"),
            &core,
            &ref_row_lse(&q, &k, w),
            1e-6,
        );
    }
    // selection: this file's reference rule == the core's (global with layer sums, uniform)
    for &(layers, hkv, p) in &[(3usize, 2usize, 200usize), (2, 4, 31)] {
        for ties in [false, true] {
            let s: Vec<f32> = (0..layers * hkv * p)
                .map(|_| {
                    if ties {
                        rng.below(5) as f32
                    } else {
                        rng.unif()
                    }
                })
                .collect();
            let budget = 1 + rng.below(p) as u64;
            let sums = layer_sums(&s, layers, hkv * p);
            let core = core_select(&s, layers, hkv, p, true, budget);
            let want = ref_select(
                &s,
                p,
                1,
                layers * hkv,
                &[(layers * hkv) as i64 * budget as i64],
                Some((&sums, hkv)),
            );
            assert_eq!(core, want, "global select: core vs reference (ties {ties})");
            let core = core_select(&s, layers, hkv, p, false, budget);
            let ks = vec![budget as i64; layers * hkv];
            let want = ref_select(&s, p, layers * hkv, 1, &ks, None);
            assert_eq!(
                core, want,
                "uniform select: core vs reference (ties {ties})"
            );
        }
    }
}

/// GPU scorer pipelines (as an engine would chain the launchers) against the core's
/// score_layer on the same inputs: LaProx, SnapKV, LAVa.
#[test]
fn gpu_scores_match_core() {
    need_device!();
    let mut rng = Rng::new(21);
    for dt in DTYPES {
        let (hq, hkv, w, n, d) = (8usize, 2usize, 12usize, 400usize, 64usize);
        let (g, p) = (hq / hkv, n - w);
        let q = Tensor::new(dt, Layout::HeadMajor, [hq, w, d], &mut || {
            2.0 * rng.normal()
        });
        let k = Tensor::new(dt, Layout::TokenMajor, [hkv, n, d], &mut || rng.normal());
        let v = Tensor::new(dt, Layout::Transposed, [hkv, n, d], &mut || rng.normal());
        let gram = core_gram(&mut rng, hq, hkv, d, 48);
        let gd = DBuf::from(&gram);
        let (ghi, glo) = (
            DBuf::<u8>::new(gram.len() * dt.size()),
            DBuf::<u8>::new(gram.len() * dt.size()),
        );
        ck(
            unsafe {
                kve_cuda_gram_split(
                    gd.ptr(),
                    gram.len() as i64,
                    dt.code(),
                    ghi.vptr(),
                    glo.vptr(),
                    null_mut(),
                )
            },
            "split",
        );
        let wsb =
            unsafe { kve_cuda_window_workspace_size(hq as i64, w as i64, n as i64, hkv as i64) };
        let ws = DBuf::<u8>::new(wsb);
        let (mean, l2, pooled, vo, fac) = (
            poisoned(hq * p),
            poisoned(hq * p),
            poisoned(hq * p),
            poisoned(hq * p),
            poisoned(hkv),
        );
        unsafe {
            ck(
                kve_cuda_window(
                    &q.view(),
                    &k.view(),
                    w as i64,
                    mean.ptr(),
                    l2.ptr(),
                    null_mut(),
                    null_mut(),
                    0,
                    null(),
                    ws.vptr(),
                    wsb,
                    null_mut(),
                ),
                "window",
            );
            ck(
                kve_cuda_vonorm(
                    &v.view(),
                    p as i64,
                    ghi.vptr(),
                    if dt == Dt::F32 { null() } else { glo.vptr() },
                    hq as i64,
                    0,
                    vo.ptr(),
                    null_mut(),
                ),
                "vonorm",
            );
            ck(
                kve_cuda_lava_factor(&v.view(), p as i64, fac.ptr(), null_mut()),
                "lava factor",
            );
        }
        for (name, preset) in [
            ("laprox", kvevict::Preset::LaProx),
            ("snapkv", kvevict::Preset::SnapKv),
            ("lava", kvevict::Preset::Lava),
        ] {
            let out = poisoned(hkv * p);
            unsafe {
                match name {
                    "laprox" => {
                        ck(
                            kve_cuda_pool(
                                l2.ptr(),
                                p as i64,
                                pooled.ptr(),
                                p as i64,
                                hq as i64,
                                p as i64,
                                KVE_CUDA_POOL_AVG,
                                7,
                                1.0,
                                null_mut(),
                            ),
                            "pool",
                        );
                        ck(
                            kve_cuda_head_reduce(
                                pooled.ptr(),
                                p as i64,
                                vo.ptr(),
                                p as i64,
                                1,
                                null(),
                                out.ptr(),
                                p as i64,
                                hq as i64,
                                hkv as i64,
                                p as i64,
                                KVE_CUDA_GQA_SUM,
                                null_mut(),
                            ),
                            "reduce",
                        );
                    }
                    "snapkv" => {
                        ck(
                            kve_cuda_pool(
                                mean.ptr(),
                                p as i64,
                                pooled.ptr(),
                                p as i64,
                                hq as i64,
                                p as i64,
                                KVE_CUDA_POOL_MAX,
                                7,
                                1.0,
                                null_mut(),
                            ),
                            "pool",
                        );
                        ck(
                            kve_cuda_head_reduce(
                                pooled.ptr(),
                                p as i64,
                                null(),
                                p as i64,
                                0,
                                null(),
                                out.ptr(),
                                p as i64,
                                hq as i64,
                                hkv as i64,
                                p as i64,
                                KVE_CUDA_GQA_MEAN,
                                null_mut(),
                            ),
                            "reduce",
                        );
                    }
                    _ => {
                        ck(
                            kve_cuda_pool(
                                mean.ptr(),
                                p as i64,
                                pooled.ptr(),
                                p as i64,
                                hq as i64,
                                p as i64,
                                KVE_CUDA_POOL_MAX,
                                7,
                                1.0,
                                null_mut(),
                            ),
                            "pool",
                        );
                        ck(
                            kve_cuda_head_reduce(
                                pooled.ptr(),
                                p as i64,
                                null(),
                                p as i64,
                                0,
                                fac.ptr(),
                                out.ptr(),
                                p as i64,
                                hq as i64,
                                hkv as i64,
                                p as i64,
                                KVE_CUDA_GQA_MAX,
                                null_mut(),
                            ),
                            "reduce",
                        );
                    }
                }
            }
            let core: Vec<f64> = core_scores(preset, &q, &k, &v, Some(&gram), w)
                .iter()
                .map(|&x| x as f64)
                .collect();
            let _ = g;
            assert_close(
                &format!("GPU vs core: {name} {dt:?}"),
                &out.download(),
                &core,
                2e-3,
            );
        }
    }
}

/// GPU selection against the core's select_model (global with layer sums; uniform):
/// identical kept sets expected; overlap printed.
#[test]
fn gpu_select_matches_core() {
    need_device!();
    let mut rng = Rng::new(22);
    let (layers, hkv, p) = (6usize, 4usize, 3000usize);
    let rows = layers * hkv;
    for global in [true, false] {
        let s: Vec<f32> = (0..rows * p).map(|_| rng.unif() * rng.unif()).collect();
        let budget = 1 + rng.below(p / 3) as u64;
        let core = core_select(&s, layers, hkv, p, global, budget);
        let sd = DBuf::from(&s);
        let wsb_s = unsafe { kve_cuda_layer_stats_workspace_size(layers as i64, (hkv * p) as i64) };
        let ws_s = DBuf::<u8>::new(wsb_s);
        let sums = DBuf::from(&vec![f64::NAN; layers]);
        let (groups, rpg, kall) = if global {
            (1, rows, (rows as u64 * budget) as i64)
        } else {
            (rows, 1, budget as i64)
        };
        let wsb = unsafe { kve_cuda_select_workspace_size(groups as i64) };
        let ws = DBuf::<u8>::new(wsb);
        let counts = DBuf::from(&vec![-1i32; rows]);
        let idx = DBuf::from(&vec![-1i32; rows * p]);
        unsafe {
            ck(
                kve_cuda_layer_stats(
                    sd.ptr(),
                    (hkv * p) as i64,
                    (hkv * p) as i64,
                    layers as i64,
                    sums.ptr(),
                    null_mut(),
                    ws_s.vptr(),
                    wsb_s,
                    null_mut(),
                ),
                "layer_stats",
            );
            ck(
                kve_cuda_select(
                    sd.ptr(),
                    p as i64,
                    p as i64,
                    groups as i64,
                    rpg as i64,
                    null(),
                    kall,
                    if global { sums.ptr() } else { null() },
                    hkv as i64,
                    counts.ptr(),
                    idx.ptr(),
                    p as i64,
                    ws.vptr(),
                    wsb,
                    null_mut(),
                ),
                "select",
            );
        }
        let (gc, gi) = (counts.download(), idx.download());
        let (mut both, mut total) = (0usize, 0usize);
        let mut exact = true;
        for r in 0..rows {
            let got: std::collections::BTreeSet<i32> =
                gi[r * p..r * p + gc[r] as usize].iter().cloned().collect();
            let want: std::collections::BTreeSet<i32> = core[r].iter().cloned().collect();
            both += got.intersection(&want).count();
            total += want.len();
            exact &= got == want;
        }
        let overlap = both as f64 / total.max(1) as f64;
        println!("GPU vs core select (global {global}, budget {budget}): overlap {overlap:.6}, exact {exact}");
        assert_eq!(
            gc.iter().map(|&c| c as usize).sum::<usize>(),
            total,
            "kept count"
        );
        assert!(overlap >= 0.999, "overlap {overlap}");
    }
}

/// CPU + GPU split of one model-wide selection (SPEC §4 "Selection across devices"):
/// layers [0, split) on the GPU (kve_cuda_shard_count / _select), the rest on the CPU
/// (the core's count_shard / select_shard), histograms added on the host, the core's
/// ShardSearch stepping. Must equal select_model over the whole model exactly.
#[test]
fn gpu_and_cpu_shards_match_select_model() {
    need_device!();
    use kvevict::shard::{
        count_shard, search_new, select_shard, shard_output_len, shard_workspace_size,
    };
    use kvevict::{AllocatorKind, Granularity, ModelScores, SelectConfig};
    let mut rng = Rng::new(23);
    for &(layers, hkv, p, split) in &[(5usize, 3usize, 700usize, 2usize), (2, 2, 40, 1)] {
        for ties in [false, true] {
            let (window, n) = (1usize, p + 1);
            let s: Vec<f32> = (0..layers * hkv * p)
                .map(|_| {
                    if ties {
                        rng.below(6) as f32 * 0.5
                    } else {
                        rng.unif()
                    }
                })
                .collect();
            let budget = 1 + rng.below(p) as u64;
            let cfg = SelectConfig::new(AllocatorKind::Global, Granularity::Head, budget);
            let mut search = search_new(&cfg, layers, hkv, n, window).unwrap();
            let gpu_rows = split * hkv;
            let sd = DBuf::from(&s[..gpu_rows * p]);
            let lsd = DBuf::from(&layer_sums(&s[..gpu_rows * p], split, hkv * p));
            let hist = DBuf::<u64>::new(256);
            let cpu = ModelScores {
                scores: &s[gpu_rows * p..],
                layers: layers - split,
                hkv,
                n,
                window,
            };
            let mut ws =
                vec![0u8; shard_workspace_size(&cfg, layers - split, hkv, n, window).unwrap()];
            let mut rounds = 0;
            while !search.done {
                hist.upload(&[0u64; 256]);
                ck(
                    unsafe {
                        kve_cuda_shard_count(
                            sd.ptr(),
                            p as i64,
                            p as i64,
                            gpu_rows as i64,
                            0,
                            lsd.ptr(),
                            hkv as i64,
                            (search.prefix >> 64) as u64,
                            search.prefix as u64,
                            search.bits,
                            hist.ptr(),
                            null_mut(),
                        )
                    },
                    "shard_count",
                );
                let g = hist.download();
                let mut h = kvevict::select::Histogram([0u64; 256]);
                h.0.copy_from_slice(&g);
                count_shard(&cfg, &cpu, split, &search, &mut h, &mut ws).unwrap();
                search.step(&h);
                rounds += 1;
                assert!(rounds <= 13, "search does not end");
            }
            let counts = DBuf::from(&vec![-1i32; gpu_rows]);
            let idx = DBuf::from(&vec![-1i32; gpu_rows * p]);
            ck(
                unsafe {
                    kve_cuda_shard_select(
                        sd.ptr(),
                        p as i64,
                        p as i64,
                        gpu_rows as i64,
                        0,
                        lsd.ptr(),
                        hkv as i64,
                        (search.threshold >> 64) as u64,
                        search.threshold as u64,
                        counts.ptr(),
                        idx.ptr(),
                        p as i64,
                        null_mut(),
                    )
                },
                "shard_select",
            );
            let (no, ni) = shard_output_len(layers - split, hkv, n).unwrap();
            let (mut off, mut cidx) = (vec![0u64; no], vec![0u32; ni]);
            select_shard(&cfg, &cpu, split, &search, &mut off, &mut cidx, &mut ws).unwrap();
            let want = core_select(&s, layers, hkv, p, true, budget);
            let (gc, gi) = (counts.download(), idx.download());
            for r in 0..layers * hkv {
                let got: Vec<i32> = if r < gpu_rows {
                    gi[r * p..r * p + gc[r] as usize].to_vec()
                } else {
                    let u = r - gpu_rows;
                    cidx[off[u] as usize..off[u + 1] as usize]
                        .iter()
                        .filter(|&&i| (i as usize) < p)
                        .map(|&i| i as i32)
                        .collect()
                };
                assert_eq!(
                    got, want[r],
                    "unit {r} (layers {layers}, split {split}, ties {ties}, {rounds} rounds)"
                );
            }
        }
    }
}

/// CPU only: the host Cholesky factor reproduces the Gram matrices (L Lᵀ = G, L lower).
#[test]
fn gram_factor_reproduces_gram_on_cpu() {
    let mut rng = Rng::new(30);
    for &(hq, hkv, dv, dm) in &[(4usize, 2usize, 64usize, 200usize), (2, 1, 48, 32)] {
        // dm < dv in the second case: rank-deficient (semi-definite) Grams
        let g = core_gram(&mut rng, hq, hkv, dv, dm);
        let mut l = vec![f32::NAN; g.len()];
        assert_eq!(
            unsafe { kve_cuda_gram_factor(g.as_ptr(), hq as i64, dv as i64, l.as_mut_ptr()) },
            0
        );
        for m in 0..hq {
            let lm = &l[m * dv * dv..(m + 1) * dv * dv];
            let mut want = Vec::new();
            let mut got = Vec::new();
            for r in 0..dv {
                for c in 0..dv {
                    if c > r {
                        assert_eq!(lm[r * dv + c], 0.0, "upper triangle");
                    }
                    let s: f64 = (0..dv)
                        .map(|k| lm[r * dv + k] as f64 * lm[c * dv + k] as f64)
                        .sum();
                    got.push(s as f32);
                    want.push(g[m * dv * dv + r * dv + c] as f64);
                }
            }
            let tol = if dm >= dv { 1e-5 } else { 1e-4 };
            assert_close(
                &format!("L Lᵀ = G (dv {dv}, D {dm}, head {m})"),
                &got,
                &want,
                tol,
            );
        }
    }
    // not PSD: rejected
    let bad = vec![1.0f32, 2.0, 2.0, 1.0];
    let mut out = vec![0f32; 4];
    assert_eq!(
        unsafe { kve_cuda_gram_factor(bad.as_ptr(), 1, 2, out.as_mut_ptr()) },
        1
    );
}

#[test]
fn vonorm_factor_matches_reference() {
    need_device!();
    let mut rng = Rng::new(31);
    for dt in DTYPES {
        for &(hkv, gpk, n, dv) in &[
            (2usize, 2usize, 300usize, 128usize),
            (1, 3, 77, 64),
            (1, 1, 50, 200),
        ] {
            for split in [false, true] {
                if dt == Dt::F32 && split {
                    continue;
                }
                let layout = LAYOUTS[rng.below(4)];
                let v = Tensor::new(dt, layout, [hkv, n, dv], &mut || rng.normal());
                let ngram = hkv * gpk;
                let gram = core_gram(&mut rng, ngram, ngram, dv, 2 * dv);
                let mut l = vec![0f32; gram.len()];
                assert_eq!(
                    unsafe {
                        kve_cuda_gram_factor(gram.as_ptr(), ngram as i64, dv as i64, l.as_mut_ptr())
                    },
                    0
                );
                // garbage above the diagonal must be ignored
                for m in 0..ngram {
                    for r in 0..dv {
                        for c in r + 1..dv {
                            l[(m * dv + r) * dv + c] = 1e3;
                        }
                    }
                }
                let ld = DBuf::from(&l);
                let (hi, lo) = (
                    DBuf::<u8>::new(l.len() * dt.size()),
                    DBuf::<u8>::new(l.len() * dt.size()),
                );
                ck(
                    unsafe {
                        kve_cuda_gram_split(
                            ld.ptr(),
                            l.len() as i64,
                            dt.code(),
                            hi.vptr(),
                            if split { lo.vptr() } else { null_mut() },
                            null_mut(),
                        )
                    },
                    "split",
                );
                let out = poisoned(ngram * n);
                ck(
                    unsafe {
                        kve_cuda_vonorm_factor(
                            &v.view(),
                            n as i64,
                            hi.vptr(),
                            if split { lo.vptr() } else { null() },
                            ngram as i64,
                            0,
                            out.ptr(),
                            null_mut(),
                        )
                    },
                    "vonorm_factor",
                );
                let mut want = vec![0f64; ngram * n];
                for m in 0..ngram {
                    let hk = m / gpk;
                    for i in 0..n {
                        let mut s = 0f64;
                        for r in 0..dv {
                            for c in 0..dv {
                                s += v.at(hk, i, r)
                                    * gram[(m * dv + r) * dv + c] as f64
                                    * v.at(hk, i, c);
                            }
                        }
                        want[m * n + i] = s;
                    }
                }
                let tol = if split || dt == Dt::F32 { 1e-4 } else { 5e-3 };
                assert_close(
                    &format!("vonorm_factor {dt:?} {layout:?} dv{dv} split{split}"),
                    &out.download(),
                    &want,
                    tol,
                );
            }
        }
    }
}

// ============================================= baselines and budgets (no attention) --

/// f64 KNorm: -||K[h,i]||_2 for i < prefix, [heads][prefix].
fn ref_knorm(k: &Tensor, prefix: usize) -> Vec<f64> {
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
fn ref_sinks(rows: usize, n: usize, sinks: usize) -> Vec<f64> {
    (0..rows * n)
        .map(|e| if e % n < sinks { 1.0 } else { 0.0 })
        .collect()
}

/// Random ascending kept lists over [0, n): (lists [rows][ld], counts); row 0 empty.
fn random_lists(rng: &mut Rng, rows: usize, n: usize, ld: usize) -> (Vec<i32>, Vec<i32>) {
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

/// The core's KNorm scores of the first `prefix` tokens (window = the rest; keys only).
fn core_knorm(k: &Tensor, prefix: usize) -> Vec<f32> {
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

#[test]
fn knorm_matches_reference() {
    need_device!();
    let mut rng = Rng::new(40);
    for dt in DTYPES {
        for layout in LAYOUTS {
            for &(h, n, d) in &[(3usize, 700usize, 72usize), (2, 300, 128), (1, 50, 5)] {
                let prefix = 1 + rng.below(n - 1); // < n: the core needs a window
                let k = Tensor::new(dt, layout, [h, n, d], &mut || rng.normal());
                let ld = prefix + 3;
                let out = poisoned(h * ld);
                ck(
                    unsafe {
                        kve_cuda_knorm(&k.view(), prefix as i64, out.ptr(), ld as i64, null_mut())
                    },
                    "knorm",
                );
                let what = format!("knorm {dt:?} {layout:?} h{h} n{n} d{d} prefix{prefix}");
                let got = unstride(&what, &out.download(), h, prefix, ld);
                assert_close(&what, &got, &ref_knorm(&k, prefix), 1e-5);
                // the core's f32 sum order: bit for bit
                assert_eq!(got, core_knorm(&k, prefix), "{what}: vs the core");
            }
        }
    }
}

#[test]
fn sink_scores_match_reference() {
    need_device!();
    for &(rows, n, sinks) in &[
        (6usize, 1000usize, 4usize),
        (3, 17, 0),
        (2, 5, 9),
        (1, 300, 300),
    ] {
        let ld = n + 2;
        let out = poisoned(rows * ld);
        ck(
            unsafe {
                kve_cuda_sink_scores(
                    out.ptr(),
                    rows as i64,
                    n as i64,
                    ld as i64,
                    sinks as i64,
                    null_mut(),
                )
            },
            "sink_scores",
        );
        let what = format!("sink_scores rows{rows} n{n} sinks{sinks}");
        let got = unstride(&what, &out.download(), rows, n, ld);
        let want = ref_sinks(rows, n, sinks);
        assert_eq!(
            got,
            want.iter().map(|&x| x as f32).collect::<Vec<f32>>(),
            "{what}"
        );
        // the selection keeps the sinks and the most recent tokens (later position first)
        if n >= sinks + 10 {
            let keep = sinks + 10;
            let wsb = unsafe { kve_cuda_select_workspace_size(rows as i64) };
            let ws = DBuf::<u8>::new(wsb);
            let counts = DBuf::from(&vec![-1i32; rows]);
            let idx = DBuf::from(&vec![-1i32; rows * n]);
            ck(
                unsafe {
                    kve_cuda_select(
                        out.ptr(),
                        ld as i64,
                        n as i64,
                        rows as i64,
                        1,
                        null(),
                        keep as i64,
                        null(),
                        1,
                        counts.ptr(),
                        idx.ptr(),
                        n as i64,
                        ws.vptr(),
                        wsb,
                        null_mut(),
                    )
                },
                "select sinks",
            );
            let (gc, gi) = (counts.download(), idx.download());
            let want: Vec<i32> = (0..sinks).chain(n - 10..n).map(|i| i as i32).collect();
            for r in 0..rows {
                assert_eq!(gc[r] as usize, keep, "{what}: kept count row {r}");
                assert_eq!(&gi[r * n..r * n + keep], &want[..], "{what}: kept row {r}");
            }
        }
    }
}

#[test]
fn critical_combine_matches_reference() {
    need_device!();
    let mut rng = Rng::new(41);
    let (rows, n) = (5usize, 300usize);
    let (ld_b, ld_l, ld_o, idx_ld) = (n + 1, n + 2, n + 3, n + 4);
    let base: Vec<f32> = (0..rows * n).map(|_| rng.unif() * rng.unif()).collect();
    let l1: Vec<f32> = (0..rows * n).map(|_| 3.0 * rng.unif()).collect();
    // the core's second stage in f32: (s + 1e-4) · l1, forced positions f32::MAX
    let combine = |forced: &dyn Fn(usize, usize) -> bool| -> Vec<f32> {
        (0..rows * n)
            .map(|e| {
                let (r, i) = (e / n, e % n);
                if forced(r, i) {
                    f32::MAX
                } else {
                    (base[e] + 1e-4) * l1[e]
                }
            })
            .collect()
    };
    let (bd, ld) = (
        DBuf::from(&strided(&base, rows, n, ld_b)),
        DBuf::from(&strided(&l1, rows, n, ld_l)),
    );
    // 1. random first-stage lists, every array strided
    let (idx, counts) = random_lists(&mut rng, rows, n, idx_ld);
    let (id, cd) = (DBuf::from(&idx), DBuf::from(&counts));
    let out = poisoned(rows * ld_o);
    ck(
        unsafe {
            kve_cuda_critical_combine(
                bd.ptr(),
                ld_b as i64,
                ld.ptr(),
                ld_l as i64,
                cd.ptr(),
                id.ptr(),
                idx_ld as i64,
                rows as i64,
                n as i64,
                out.ptr(),
                ld_o as i64,
                null_mut(),
            )
        },
        "critical_combine",
    );
    let got = unstride("critical_combine", &out.download(), rows, n, ld_o);
    let want =
        combine(&|r, i| idx[r * idx_ld..r * idx_ld + counts[r] as usize].contains(&(i as i32)));
    assert_eq!(got, want, "critical_combine (strided, random lists)");
    // 2. in place, first stage from kve_cuda_select (top `first` of each row), as the core
    let first = 1 + rng.below(n / 4);
    let inplace = DBuf::from(&strided(&base, rows, n, ld_b));
    let wsb = unsafe { kve_cuda_select_workspace_size(rows as i64) };
    let ws = DBuf::<u8>::new(wsb);
    let (kc, ki) = (
        DBuf::from(&vec![-1i32; rows]),
        DBuf::from(&vec![-1i32; rows * n]),
    );
    unsafe {
        ck(
            kve_cuda_select(
                inplace.ptr(),
                ld_b as i64,
                n as i64,
                rows as i64,
                1,
                null(),
                first as i64,
                null(),
                1,
                kc.ptr(),
                ki.ptr(),
                n as i64,
                ws.vptr(),
                wsb,
                null_mut(),
            ),
            "select first stage",
        );
        ck(
            kve_cuda_critical_combine(
                inplace.ptr(),
                ld_b as i64,
                ld.ptr(),
                ld_l as i64,
                kc.ptr(),
                ki.ptr(),
                n as i64,
                rows as i64,
                n as i64,
                inplace.ptr(),
                ld_b as i64,
                null_mut(),
            ),
            "critical_combine in place",
        );
    }
    let first_stage = ref_select(&base, n, rows, 1, &vec![first as i64; rows], None);
    let got = unstride(
        "critical_combine in place",
        &inplace.download(),
        rows,
        n,
        ld_b,
    );
    let want = combine(&|r, i| first_stage[r].contains(&(i as i32)));
    assert_eq!(
        got, want,
        "critical_combine in place after select (first {first})"
    );
}

#[test]
fn mark_forced_matches_reference() {
    need_device!();
    let mut rng = Rng::new(42);
    let (rows, n) = (4usize, 400usize);
    let (ld, idx_ld) = (n + 5, n + 1);
    let s: Vec<f32> = (0..rows * ld).map(|_| rng.unif()).collect();
    let (idx, counts) = random_lists(&mut rng, rows, n, idx_ld);
    let (sd, id, cd) = (DBuf::from(&s), DBuf::from(&idx), DBuf::from(&counts));
    ck(
        unsafe {
            kve_cuda_mark_forced(
                sd.ptr(),
                ld as i64,
                rows as i64,
                cd.ptr(),
                id.ptr(),
                idx_ld as i64,
                null_mut(),
            )
        },
        "mark_forced",
    );
    let mut want = s.clone();
    for r in 0..rows {
        for t in 0..counts[r] as usize {
            want[r * ld + idx[r * idx_ld + t] as usize] = f32::INFINITY;
        }
    }
    assert_eq!(sd.download(), want, "mark_forced");
    // a select of exactly counts[r] per row then keeps the forced lists
    let kd = DBuf::from(&counts.iter().map(|&c| c as i64).collect::<Vec<i64>>());
    let wsb = unsafe { kve_cuda_select_workspace_size(rows as i64) };
    let ws = DBuf::<u8>::new(wsb);
    let (kc, ki) = (
        DBuf::from(&vec![-1i32; rows]),
        DBuf::from(&vec![-1i32; rows * n]),
    );
    ck(
        unsafe {
            kve_cuda_select(
                sd.ptr(),
                ld as i64,
                n as i64,
                rows as i64,
                1,
                kd.ptr(),
                0,
                null(),
                1,
                kc.ptr(),
                ki.ptr(),
                n as i64,
                ws.vptr(),
                wsb,
                null_mut(),
            )
        },
        "select forced",
    );
    let (gc, gi) = (kc.download(), ki.download());
    for r in 0..rows {
        let c = counts[r] as usize;
        assert_eq!(gc[r] as usize, c, "forced count row {r}");
        assert_eq!(
            &gi[r * n..r * n + c],
            &idx[r * idx_ld..r * idx_ld + c],
            "forced list row {r}"
        );
    }
}

#[test]
fn broadcast_lists_matches_reference() {
    need_device!();
    let mut rng = Rng::new(43);
    for &(src_rows, reps, src_ld, idx_ld) in &[(3usize, 4usize, 50usize, 64usize), (2, 1, 30, 30)] {
        let (mut idx, mut counts) = random_lists(&mut rng, src_rows, src_ld, src_ld);
        counts[src_rows - 1] = src_ld as i32; // one full list
        for t in 0..src_ld {
            idx[(src_rows - 1) * src_ld + t] = t as i32;
        }
        let (sid, scd) = (DBuf::from(&idx), DBuf::from(&counts));
        let rows = src_rows * reps;
        let (oc, oi) = (
            DBuf::from(&vec![-7i32; rows]),
            DBuf::from(&vec![-7i32; rows * idx_ld]),
        );
        ck(
            unsafe {
                kve_cuda_broadcast_lists(
                    scd.ptr(),
                    sid.ptr(),
                    src_ld as i64,
                    src_rows as i64,
                    reps as i64,
                    oc.ptr(),
                    oi.ptr(),
                    idx_ld as i64,
                    null_mut(),
                )
            },
            "broadcast_lists",
        );
        let mut want_c = vec![0i32; rows];
        let mut want_i = vec![-7i32; rows * idx_ld];
        for u in 0..rows {
            let r = u / reps;
            want_c[u] = counts[r];
            for t in 0..counts[r] as usize {
                want_i[u * idx_ld + t] = idx[r * src_ld + t];
            }
        }
        assert_eq!(oc.download(), want_c, "broadcast counts (reps {reps})");
        assert_eq!(oi.download(), want_i, "broadcast lists (reps {reps})");
    }
}

#[test]
fn append_range_matches_reference() {
    need_device!();
    let mut rng = Rng::new(47);
    let (rows, ld, start, count) = (300usize, 80usize, 50usize, 30usize);
    // prefix lists of up to ld - count entries (the caller's guarantee), one empty
    let (mut idx, mut counts) = random_lists(&mut rng, rows, ld - count, ld);
    counts[0] = 0;
    let (di, dc) = (DBuf::from(&idx), DBuf::from(&counts));
    ck(
        unsafe {
            kve_cuda_append_range(
                dc.ptr(),
                di.ptr(),
                ld as i64,
                rows as i64,
                start as i64,
                count as i64,
                null_mut(),
            )
        },
        "append_range",
    );
    for r in 0..rows {
        let c = counts[r] as usize;
        for t in 0..count {
            idx[r * ld + c + t] = (start + t) as i32;
        }
        counts[r] += count as i32;
    }
    assert_eq!(dc.download(), counts, "append_range counts");
    assert_eq!(di.download(), idx, "append_range lists");
}

/// The core's budgets (src/budget, as select_model uses them): (k_layer, k_unit).
#[allow(clippy::too_many_arguments)]
fn core_budgets(
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

#[test]
fn layer_budgets_match_core_exactly() {
    need_device!();
    let mut rng = Rng::new(44);
    // (layers, per_layer, p, budget, beta, alpha)
    let cases: &[(usize, usize, u64, u64, u32, f32)] = &[
        (32, 8, 4000, 400, 20, 0.2),
        (1, 4, 100, 1000, 20, 0.5),
        (7, 3, 1 << 40, (1 << 39) + 12345, 3, 1.0),
        (5, 2, 50, 45, 1, 0.0),
        (12, 1, 1000, u64::MAX, 20, 0.3),
        (3, 5, 0, 10, 20, 0.2),
        (4, 8, 64, 0, 7, 0.2),
        (9, 4, 333, 100, 2, 0.7),
        (6, 1, 1 << 50, u64::MAX, 20, 0.25),
    ];
    for (ci, &(layers, per, p, budget, beta, alpha)) in cases.iter().enumerate() {
        // entropies: random, a zero, a negative (counts as 0); case 3 all zero (equal
        // split); case 7 skewed (one layer hits its cap, the excess moves on)
        let weights: Vec<f64> = (0..layers)
            .map(|l| match (ci, l) {
                (3, _) => 0.0,
                (7, 0) => 1e3,
                (_, 1) => 0.0,
                (_, 2) => -1.0,
                _ => 3.0 * rng.unif() as f64 + rng.unif() as f64 * 1e-7,
            })
            .collect();
        let wd = DBuf::from(&weights);
        for mode in [
            KVE_CUDA_BUDGET_UNIFORM,
            KVE_CUDA_BUDGET_PYRAMID,
            KVE_CUDA_BUDGET_ADA,
            KVE_CUDA_BUDGET_LAVA,
        ] {
            let (want_l, want_u) =
                core_budgets(mode, &weights, layers, per, p, budget, beta, alpha);
            for with_units in [true, false] {
                let kl = DBuf::from(&vec![-1i64; layers]);
                let ku = DBuf::from(&vec![-1i64; layers * per]);
                ck(
                    unsafe {
                        kve_cuda_layer_budgets(
                            mode,
                            if mode == KVE_CUDA_BUDGET_LAVA {
                                wd.ptr()
                            } else {
                                null()
                            },
                            layers as i64,
                            per as i64,
                            p as i64,
                            budget,
                            beta,
                            alpha,
                            kl.ptr(),
                            if with_units { ku.ptr() } else { null_mut() },
                            null_mut(),
                        )
                    },
                    "layer_budgets",
                );
                let what = format!(
                    "layer_budgets mode {mode} layers {layers} per {per} p {p} budget {budget} beta {beta} alpha {alpha}"
                );
                assert_eq!(kl.download(), want_l, "{what}: k_layer");
                let units = ku.download();
                if with_units {
                    assert_eq!(units, want_u, "{what}: k_unit");
                } else {
                    assert!(
                        units.iter().all(|&u| u == -1),
                        "{what}: k_unit NULL written"
                    );
                }
            }
        }
    }
    // capturable: LAVa budgets in a CUDA graph, replayed twice
    let (layers, per, p) = (8usize, 4usize, 500u64);
    let weights: Vec<f64> = (0..layers).map(|_| rng.unif() as f64).collect();
    let wd = DBuf::from(&weights);
    let (kl, ku) = (
        DBuf::from(&vec![-1i64; layers]),
        DBuf::from(&vec![-1i64; layers * per]),
    );
    in_graph(&|s| {
        ck(
            unsafe {
                kve_cuda_layer_budgets(
                    KVE_CUDA_BUDGET_LAVA,
                    wd.ptr(),
                    layers as i64,
                    per as i64,
                    p as i64,
                    100,
                    20,
                    0.2,
                    kl.ptr(),
                    ku.ptr(),
                    s,
                )
            },
            "layer_budgets in a graph",
        )
    });
    let (want_l, want_u) =
        core_budgets(KVE_CUDA_BUDGET_LAVA, &weights, layers, per, p, 100, 20, 0.2);
    assert_eq!(kl.download(), want_l, "graph k_layer");
    assert_eq!(ku.download(), want_u, "graph k_unit");
}
