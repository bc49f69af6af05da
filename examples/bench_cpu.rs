//! CPU benchmark of `score_layer` for one layer (issue 2; not a timed test).
//!
//! Shapes: SmolLM2 (Hq=9, Hkv=3, d=64, f32) and Llama-3-8B (Hq=32, Hkv=8, d=128, f16),
//! head-major `[H, N, d]` tensors of synthetic data (fixed seed, so every run scores the
//! same inputs). Single-threaded. Each case runs `--reps` times; the minimum is reported.
//!
//!   cargo run --release --example bench_cpu -- [--reps 5] [--n 4096,32768]
//!       [--shapes smol,llama] [--scorers snapkv,laprox,...] [--dump DIR] [--load CASEDIR]
//!   cargo run --release --example bench_cpu -- --arm    # what to run on an ARM machine
//!
//! With `--dump DIR` the inputs (and our scores) go to `DIR/<shape>-<N>/` (raw little-endian
//! arrays, described by `meta.txt`); `--reps 0` only makes and dumps them. `--load CASEDIR`
//! times a dumped case instead of making one. Each scorer prints a human line and a
//! tab-separated `RESULT` line. `scripts/bench_cpu.sh` dumps the cases, then
//! `bench/numpy_ref.py` alternates `--load` runs of this binary with numpy runs of the same
//! math (several rounds, minimum per side), checks the scores and prints the table.
//! `uniqueness` (every pair of tokens) runs only for N <= 8192. `read` is not a scorer: the
//! rate of reading the key buffer with plain vector loops (the memory bound of KNorm and
//! TOVA), a `READ` line.

use half::f16;
use kvevict::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

const SCORERS: &[&str] = &[
    "snapkv",
    "snapkv+lse",
    "snapkv-kvpress",
    "lava",
    "laprox",
    "laprox-cached",
    "laprox-cached+lse",
    "criticalkv",
    "knorm",
    "tova",
    "streamingllm",
    "value-forms",
    "snapkv-w8",
    "laprox-cached-w8",
    "uniqueness",
    "read",
];

/// Uniqueness compares every pair of tokens (`O(N²)`): cases above this N skip it (at
/// N = 32k one Llama layer would take tens of seconds per run, numpy's more).
const UNIQUENESS_MAX_N: usize = 8192;

/// Window queries given per head (the largest preset window).
const WQ: usize = 64;

#[derive(Clone, Copy)]
struct Shape {
    name: &'static str,
    hq: usize,
    hkv: usize,
    d: usize,
    f16: bool,
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "smol",
        hq: 9,
        hkv: 3,
        d: 64,
        f16: false,
    },
    Shape {
        name: "llama",
        hq: 32,
        hkv: 8,
        d: 128,
        f16: true,
    },
];

/// xorshift64*: fixed-seed, fast, good enough for benchmark data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn unif(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Approximately N(0, 1) (Irwin–Hall with 4 terms, scaled).
    fn gauss(&mut self) -> f32 {
        (self.unif() + self.unif() + self.unif() + self.unif() - 2.0) * 1.732_050_8
    }
}

/// A tensor in the dtype of the shape (f32 or f16), head-major contiguous.
enum Data {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl Data {
    fn view(&self, ext: [usize; 3]) -> View<'_> {
        let st = [ext[1] * ext[2], ext[2], 1];
        match self {
            Data::F32(v) => View::f32(v, ext, st).unwrap(),
            Data::F16(v) => View::f16(v, ext, st).unwrap(),
        }
    }
    fn bytes(&self) -> Vec<u8> {
        match self {
            Data::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

fn gen(rng: &mut Rng, len: usize, scale: f32, f16: bool) -> Data {
    if f16 {
        Data::F16(
            (0..len)
                .map(|_| f16::from_f32(rng.gauss() * scale))
                .collect(),
        )
    } else {
        Data::F32((0..len).map(|_| rng.gauss() * scale).collect())
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

struct Case {
    s: Shape,
    n: usize,
    q: Data,
    k: Data,
    v: Data,
    gram: Vec<f32>,
    forms: Vec<f32>,
    l1: Vec<f32>,
}

fn make_case(s: Shape, n: usize) -> Case {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (n as u64) ^ ((s.d as u64) << 32));
    // Keys: a per-head mean direction plus noise (real keys have one), queries scaled so
    // the logits spread over a few units: attention is neither flat nor one-hot.
    let mut k = vec![0f32; s.hkv * n * s.d];
    for h in 0..s.hkv {
        let mean: Vec<f32> = (0..s.d).map(|_| rng.gauss() * 0.5).collect();
        for t in 0..n {
            for c in 0..s.d {
                k[(h * n + t) * s.d + c] = mean[c] + rng.gauss();
            }
        }
    }
    let k = if s.f16 {
        Data::F16(k.iter().map(|&x| f16::from_f32(x)).collect())
    } else {
        Data::F32(k)
    };
    let q = gen(&mut rng, s.hq * WQ * s.d, 1.5, s.f16);
    let v = gen(&mut rng, s.hkv * n * s.d, 1.0, s.f16);
    // Gram from a random Wo [Hq, dv, D], D = Hq·dv (once per model: not timed)
    let dm = s.hq * s.d;
    let wscale = 1.0 / (dm as f32).sqrt();
    let wo: Vec<f32> = (0..s.hq * s.d * dm).map(|_| rng.gauss() * wscale).collect();
    let wov = View::f32_contiguous(&wo, [s.hq, s.d, dm]).unwrap();
    let mut gram = vec![0f32; gram_len(s.hq, s.hkv, s.d, false).unwrap()];
    let mut ws = vec![0u8; gram_workspace_size(s.d, dm).unwrap()];
    compute_gram(&wov, s.hkv, false, &mut gram, &mut ws).unwrap();
    let mut forms = vec![0f32; value_forms_len(s.hq, s.hkv, n, false).unwrap()];
    let vv = v.view([s.hkv, n, s.d]);
    compute_value_forms(&vv, &gram, s.hq, false, 0, n, &mut forms).unwrap();
    // CriticalKV's value L1 norms are an engine-side cache; synthetic positive values here
    // (computing them through Wo is not what is benchmarked).
    let l1: Vec<f32> = (0..s.hkv * n).map(|_| 1.0 + rng.unif()).collect();
    Case {
        s,
        n,
        q,
        k,
        v,
        gram,
        forms,
        l1,
    }
}

/// `<scorer>-w8`: the scorer with an 8-token window (`<scorer>-w8+lse` with both).
/// `<scorer>+lse`: the scorer given the window rows' log-sum-exp (`LayerInputs::row_lse`,
/// computed with `window_row_lse` outside the timed region, as an engine running flash
/// attention would get it for free): one pass over K instead of two.
fn base_name(name: &str) -> (&str, bool) {
    let (b, lse) = match name.strip_suffix("+lse") {
        Some(b) => (b, true),
        None => (name, false),
    };
    (b.strip_suffix("-w8").unwrap_or(b), lse)
}

fn config(full: &str, p: usize) -> ScoreConfig {
    let name = base_name(full).0;
    // the library's preset table; "laprox-cached" is LaProx (its Gram computed once)
    let table_name = if name == "laprox-cached" {
        "laprox"
    } else {
        name
    };
    let preset = kvevict::evictor::preset_from_name(table_name.as_bytes())
        .unwrap_or_else(|_| panic!("unknown scorer {name}"));
    let mut cfg = ScoreConfig::preset(preset);
    if full.contains("-w8") {
        // the window of the best LaProx configuration (README, needle study)
        cfg.window = 8;
    }
    if name == "criticalkv" {
        // half of a 10% budget forced by the base score
        cfg.critical_first_stage = (p / 20) as u32;
    }
    cfg
}

/// CPU time of the calling thread (Linux), seconds; wall time elsewhere. Under a shared
/// machine it leaves out the time the thread waited for a core.
#[cfg(any(target_os = "linux", target_os = "macos"))]
fn thread_cpu_s() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clk: i32, ts: *mut Timespec) -> i32;
    }
    // CLOCK_THREAD_CPUTIME_ID: 3 on Linux, 16 on macOS
    const CLK: i32 = if cfg!(target_os = "macos") { 16 } else { 3 };
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: plain libc call with a valid clock id and a timespec to fill.
    unsafe { clock_gettime(CLK, &mut ts) };
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn thread_cpu_s() -> f64 {
    use std::sync::OnceLock;
    static T0: OnceLock<Instant> = OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_secs_f64()
}

struct Timing {
    wall: Vec<f64>,
    cpu: Vec<f64>,
}

/// `value-forms`: LaProx's cached value forms `v·G·vᵀ` for every token of the layer
/// (`compute_value_forms`, what an engine runs as tokens enter the cache); no window.
fn run_forms(c: &Case, reps: usize) -> (u32, Vec<f32>, Timing) {
    let s = c.s;
    let vv = c.v.view([s.hkv, c.n, s.d]);
    let mut out = vec![0f32; c.forms.len()];
    let mut times = Timing {
        wall: Vec::new(),
        cpu: Vec::new(),
    };
    for _ in 0..reps {
        let c0 = thread_cpu_s();
        let t = Instant::now();
        compute_value_forms(&vv, &c.gram, s.hq, false, 0, c.n, &mut out).unwrap();
        times.wall.push(t.elapsed().as_secs_f64());
        times.cpu.push(thread_cpu_s() - c0);
    }
    (0, out, times)
}

fn run_case(c: &Case, name: &str, reps: usize) -> (u32, Vec<f32>, Timing) {
    if name == "value-forms" {
        return run_forms(c, reps);
    }
    let s = c.s;
    let cfg0 = config(name, c.n);
    let p = c.n - cfg0.window as usize;
    let cfg = config(name, p);
    let (base, with_lse) = base_name(name);
    let q = c.q.view([s.hq, WQ, s.d]);
    let k = c.k.view([s.hkv, c.n, s.d]);
    let lse = if with_lse {
        let shape = LayerShape {
            hq: s.hq,
            hkv: s.hkv,
            n: c.n,
            dk: s.d,
            dv: s.d,
        };
        let w = (cfg.window as usize).min(c.n);
        let mut ws = vec![0u8; window_row_lse_workspace_size(&shape, cfg.window).unwrap()];
        let mut lse = vec![0f32; s.hq * w];
        window_row_lse(&q, &k, cfg.window, &mut lse, &mut ws).unwrap();
        Some(lse)
    } else {
        None
    };
    let name = base;
    let inputs = LayerInputs {
        queries: Some(q),
        keys: Some(k),
        values: Some(c.v.view([s.hkv, c.n, s.d])),
        gram: if name == "laprox" {
            Some(&c.gram)
        } else {
            None
        },
        value_forms: if name == "laprox-cached" {
            Some(&c.forms)
        } else {
            None
        },
        value_l1: if name == "criticalkv" {
            Some(&c.l1)
        } else {
            None
        },
        row_lse: lse.as_deref(),
    };
    let shape = layer_shape(&cfg, &inputs).unwrap();
    let mut ws = vec![0u8; score_workspace_size(&cfg, &shape).unwrap()];
    let mut out = vec![0f32; score_len(&cfg, &shape).unwrap()];
    let mut times = Timing {
        wall: Vec::new(),
        cpu: Vec::new(),
    };
    let mut first: Option<Vec<f32>> = None;
    for _ in 0..reps {
        let c0 = thread_cpu_s();
        let t = Instant::now();
        score_layer(&cfg, &inputs, &mut out, &mut ws).unwrap();
        times.wall.push(t.elapsed().as_secs_f64());
        times.cpu.push(thread_cpu_s() - c0);
        // bit-for-bit deterministic run to run
        match &first {
            None => first = Some(out.clone()),
            Some(f) => assert!(
                f.iter().zip(&out).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: scores differ between runs"
            ),
        }
    }
    (cfg.window, out, times)
}

fn arg_list(args: &[String], key: &str, default: &[&str]) -> Vec<String> {
    match args.iter().position(|a| a == key) {
        Some(i) => args[i + 1].split(',').map(|s| s.to_string()).collect(),
        None => default.iter().map(|s| s.to_string()).collect(),
    }
}

fn dump_case(dir: &Path, c: &Case) {
    fs::create_dir_all(dir).unwrap();
    let s = c.s;
    let dt = if s.f16 { "f16" } else { "f32" };
    fs::write(
        dir.join("meta.txt"),
        format!(
            "shape={}\nhq={}\nhkv={}\nd={}\nn={}\nwq={}\ndtype={}\n",
            s.name, s.hq, s.hkv, s.d, c.n, WQ, dt
        ),
    )
    .unwrap();
    fs::write(dir.join("q.bin"), c.q.bytes()).unwrap();
    fs::write(dir.join("k.bin"), c.k.bytes()).unwrap();
    fs::write(dir.join("v.bin"), c.v.bytes()).unwrap();
    fs::write(dir.join("gram.bin"), f32_bytes(&c.gram)).unwrap();
    fs::write(dir.join("forms.bin"), f32_bytes(&c.forms)).unwrap();
    fs::write(dir.join("l1.bin"), f32_bytes(&c.l1)).unwrap();
}

/// Read a case back from a `--dump` directory.
fn load_case(dir: &Path) -> Case {
    let meta = fs::read_to_string(dir.join("meta.txt")).unwrap();
    let get = |k: &str| -> String {
        meta.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")).map(|v| v.to_string()))
            .unwrap_or_else(|| panic!("{k} missing in meta.txt"))
    };
    let name = get("shape");
    let s = *SHAPES.iter().find(|x| x.name == name).expect("shape");
    let n: usize = get("n").parse().unwrap();
    assert_eq!(get("wq").parse::<usize>().unwrap(), WQ);
    let rd = |f: &str| fs::read(dir.join(f)).unwrap();
    let f32s = |b: Vec<u8>| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let data = |b: Vec<u8>| -> Data {
        if s.f16 {
            Data::F16(
                b.chunks_exact(2)
                    .map(|c| f16::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            )
        } else {
            Data::F32(f32s(b))
        }
    };
    Case {
        s,
        n,
        q: data(rd("q.bin")),
        k: data(rd("k.bin")),
        v: data(rd("v.bin")),
        gram: f32s(rd("gram.bin")),
        forms: f32s(rd("forms.bin")),
        l1: f32s(rd("l1.bin")),
    }
}

/// The key buffer as raw bytes, in its dtype (what KNorm and TOVA read).
fn key_bytes(c: &Case) -> &[u8] {
    match &c.k {
        // SAFETY: f32 and f16 are plain data without padding; the slice covers the Vec's
        // initialised elements only and lives as long as `c`.
        Data::F32(v) => unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 4) },
        // SAFETY: as above.
        Data::F16(v) => unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 2) },
    }
}

/// `$name(b, pf)`: the bitwise OR of every `$w`-byte vector of `b` (length a multiple of 8
/// vectors): a read of every byte at full width, eight independent chains, with (`pf`) or
/// without a software prefetch 4 KiB ahead (at the vectors `j` for which `$hint(j)`), the
/// chains OR-ed by `$or` and reduced to a u64 by `$reduce` (of the vector `$r`). Expanded
/// inside the function, so every intrinsic runs with its target features.
macro_rules! or_sweep {
    ($(#[$attr:meta])* $name:ident, $w:literal, $zero:ident, $or:ident, $load:ident,
     |$j:ident| $hint:expr, |$r:ident| $reduce:expr) => {
        $(#[$attr])*
        unsafe fn $name(b: &[u8], pf: bool) -> u64 {
            use std::arch::x86_64::*;
            let p = b.as_ptr();
            let mut a = [$zero(); 8];
            let mut i = 0;
            while i + 8 * $w <= b.len() {
                for (j, a) in a.iter_mut().enumerate() {
                    let $j = j;
                    if pf && $hint {
                        // a hint only: never faults, whatever the address
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + 4096 + $w * j) as *const i8);
                    }
                    // SAFETY: i + w·j + w <= i + 8·w <= b.len().
                    *a = $or(*a, unsafe { $load(p.add(i + $w * j) as *const _) });
                }
                i += 8 * $w;
            }
            let mut $r = a[0];
            for x in &a[1..] {
                $r = $or($r, *x);
            }
            $reduce
        }
    };
}

or_sweep!(
    /// On 64-byte vectors, every one prefetched.
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[cfg(all(target_arch = "x86_64", kvevict_avx512))]
    #[allow(clippy::incompatible_msrv)] // built with Rust >= 1.89 only (build.rs's cfg)
    #[target_feature(enable = "avx512f,avx2")]
    or_sweep_512, 64, _mm512_setzero_si512, _mm512_or_si512, _mm512_loadu_si512,
    |_j| true,
    |r| _mm512_reduce_or_epi64(r) as u64
);

or_sweep!(
    /// On 32-byte vectors, every other one prefetched (one a 64-byte line).
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    or_sweep_256, 32, _mm256_setzero_si256, _mm256_or_si256, _mm256_loadu_si256,
    |j| j % 2 == 0,
    |r| (_mm256_extract_epi64::<0>(r)
        | _mm256_extract_epi64::<1>(r)
        | _mm256_extract_epi64::<2>(r)
        | _mm256_extract_epi64::<3>(r)) as u64
);

/// `read`: the rate of reading the key buffer once, the memory bound of KNorm and TOVA: for
/// each of the read loops this CPU runs (AVX-512 / AVX2 OR-sweeps, with and without a
/// software prefetch; plain u64 ORs elsewhere), the minimum thread CPU time over `reps`
/// sweeps, loops alternating; prints `READ <case> <bytes> <best s> <loop>`.
fn run_read(case: &str, c: &Case, reps: usize) {
    let b = key_bytes(c);
    let b = &b[..b.len() / 512 * 512];
    type Sweep<'a> = Box<dyn Fn() -> u64 + 'a>;
    let mut loops: Vec<(&str, Sweep)> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        #[cfg(kvevict_avx512)]
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512 F (and so AVX2; checked just above).
            loops.push((
                "avx512",
                Box::new(move || unsafe { or_sweep_512(b, false) }),
            ));
            // SAFETY: as above.
            loops.push((
                "avx512+pf",
                Box::new(move || unsafe { or_sweep_512(b, true) }),
            ));
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            loops.push(("avx2", Box::new(move || unsafe { or_sweep_256(b, false) })));
            // SAFETY: as above.
            loops.push((
                "avx2+pf",
                Box::new(move || unsafe { or_sweep_256(b, true) }),
            ));
        }
    }
    loops.push((
        "u64",
        Box::new(move || {
            b.chunks_exact(8)
                .fold(0u64, |a, w| a | u64::from_le_bytes(w.try_into().unwrap()))
        }),
    ));
    let mut best = vec![f64::INFINITY; loops.len()];
    let mut sink = 0u64;
    for _ in 0..reps {
        for (i, (_, f)) in loops.iter().enumerate() {
            let c0 = thread_cpu_s();
            sink |= std::hint::black_box(f());
            best[i] = best[i].min(thread_cpu_s() - c0);
        }
    }
    let (i, t) = best.iter().enumerate().fold(
        (0, f64::INFINITY),
        |m, (i, &t)| if t < m.1 { (i, t) } else { m },
    );
    println!(
        "{case:<12} read of the keys: {:.1} GB/s ({}; {sink:x})",
        b.len() as f64 / t / 1e9,
        loops[i].0
    );
    println!("READ\t{case}\t{}\t{t:.6}\t{}", b.len(), loops[i].0);
}

/// Time every scorer on one case; print a human line and a `RESULT` line per scorer
/// (tab-separated: case, scorer, window, min wall s, median wall s, min thread-CPU s, the
/// kernel build that ran: AVX-512, AVX2, NEON or portable), and
/// with `out_dir` write the scores to `out_dir/scores_<scorer>.bin`.
fn bench_case(case: &str, c: &Case, scorers: &[String], reps: usize, out_dir: Option<&Path>) {
    for name in scorers {
        if name == "read" {
            run_read(case, c, reps);
            continue;
        }
        if name == "uniqueness" && c.n > UNIQUENESS_MAX_N {
            eprintln!("{case:<12} {name:<15} skipped: N > {UNIQUENESS_MAX_N} (quadratic)");
            continue;
        }
        let (window, out, times) = run_case(c, name, reps);
        let mut sorted = times.wall.clone();
        sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let (tmin, tmed) = (sorted[0], sorted[sorted.len() / 2]);
        let cmin = times.cpu.iter().cloned().fold(f64::INFINITY, f64::min);
        let kernel = kvevict::numerics::kernel_name();
        println!(
            "{case:<12} {name:<15} w={:<3} min {:>9.3} ms  median {:>9.3} ms  cpu {:>9.3} ms  {:>8.3} Mtok/s  [{kernel}]",
            window,
            tmin * 1e3,
            tmed * 1e3,
            cmin * 1e3,
            c.n as f64 / cmin / 1e6
        );
        println!("RESULT\t{case}\t{name}\t{window}\t{tmin:.6}\t{tmed:.6}\t{cmin:.6}\t{kernel}");
        if let Some(d) = out_dir {
            fs::write(d.join(format!("scores_{name}.bin")), f32_bytes(&out)).unwrap();
        }
    }
}

/// `--arm`: what to run on an ARM machine (this benchmark cannot measure NEON speed on x86:
/// qemu emulates it).
const ARM_HOWTO: &str = "\
On AArch64 (Apple Silicon, Graviton, Ampere, Raspberry Pi 5) the scorers take the NEON
kernels, chosen at compile time (NEON is part of the AArch64 base architecture; the same
operations per lane as AVX2, so the same scores bit for bit). Speed on ARM is not measured by
this project's CI (x86 only: it runs the NEON tests under qemu-user, which emulates). To
measure it, on the ARM machine, from a checkout of the repository:

  rustup default stable                       # Rust >= 1.75 (cargo build needs no other setup)
  python3 -m venv .venv-bench                 # the script makes it itself when missing
  scripts/bench_cpu.sh --rounds 3 --n 4096    # ~5 min; add 32768 to --n for long caches
  KVEVICT_PORTABLE=1 scripts/bench_cpu.sh --rounds 2 --n 4096 --scorers snapkv,tova,knorm
                                              # the portable kernels, for comparison

Every row of the table names the kernel that ran (its `kernel` column): NEON there, portable
with KVEVICT_PORTABLE=1. The `% of sgemm` column is against numpy's single-thread sgemm
measured in the same run (OpenBLAS, or Accelerate on macOS), so rows compare across machines.
On macOS use `scripts/bench_cpu.sh` the same way (thread CPU time on Linux and macOS).
Please send the table with the machine's name (`lscpu` or `sysctl -n machdep.cpu.brand_string`).";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--arm") {
        println!("{ARM_HOWTO}");
        println!(
            "\nThis machine: {} ({} kernels).",
            std::env::consts::ARCH,
            kvevict::numerics::kernel_name()
        );
        return;
    }
    let reps: usize = arg_list(&args, "--reps", &["5"])[0].parse().unwrap();
    let ns: Vec<usize> = arg_list(&args, "--n", &["4096", "32768"])
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let shapes = arg_list(&args, "--shapes", &["smol", "llama"]);
    let scorers = arg_list(&args, "--scorers", SCORERS);
    let path_arg = |key: &str| {
        args.iter()
            .position(|a| a == key)
            .map(|i| PathBuf::from(&args[i + 1]))
    };
    println!(
        "kvevict {} score_layer, single thread, min of {reps} runs (thread CPU time; wall beside)",
        env!("CARGO_PKG_VERSION")
    );
    if let Some(dir) = path_arg("--load") {
        let c = load_case(&dir);
        let case = dir.file_name().unwrap().to_string_lossy().to_string();
        bench_case(&case, &c, &scorers, reps.max(1), Some(&dir));
        return;
    }
    let dump = path_arg("--dump");
    for sname in &shapes {
        let s = *SHAPES.iter().find(|x| x.name == sname).expect("shape");
        for &n in &ns {
            let t0 = Instant::now();
            let c = make_case(s, n);
            let case = format!("{}-{}", s.name, n);
            eprintln!(
                "[{case}: inputs made in {:.1} s]",
                t0.elapsed().as_secs_f64()
            );
            let dir = dump.as_ref().map(|d| d.join(&case));
            if let Some(d) = &dir {
                dump_case(d, &c);
            }
            if reps > 0 {
                bench_case(&case, &c, &scorers, reps, dir.as_deref());
            }
        }
    }
}
