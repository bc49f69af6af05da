// Builds the CUDA kernels in cuda/ under the `cuda` feature; nothing otherwise.
//
// Environment (all optional):
//   NVCC                 path of nvcc (call it by its real path, not a symlink)
//   CUDA_HOME / CUDA_PATH  toolkit root: $CUDA_HOME/bin/nvcc, lib64 or lib
//   KVEVICT_NVCC_VENV    venv made by cuda/install_nvcc.sh (default <repo>/.venv-nvcc)
//   KVEVICT_CUDA_ARCHS   comma/space list of SM numbers, e.g. "90" or "80,86,89,90";
//                        default 80,86,89,90 plus PTX for compute_90
//   KVEVICT_CUDA_LIB_DIR directory holding libcudart_static.a (else found next to nvcc)
//   KVEVICT_KERNEL_CACHE a folder of compiled kernel objects kept between builds (set by
//                        scripts/test.sh): one per source, keyed by its text and the headers it
//                        includes, build.rs, the mode, the compiler's command line and version,
//                        so a fresh clone or another profile links the objects instead of
//                        compiling them again, and a changed source recompiles its object only
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    avx512_cfg();
    #[cfg(feature = "cuda")]
    cuda_build::build();
}

/// `--cfg kvevict_avx512` when the compiler is Rust >= 1.89 (stable AVX-512 intrinsics;
/// the crate's MSRV is 1.75, which builds without the AVX-512 Q·Kᵀ kernel).
fn avx512_cfg() {
    println!("cargo:rustc-check-cfg=cfg(kvevict_avx512)");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let minor = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        // "rustc 1.95.0 (...)"
        .and_then(|v| {
            v.split_whitespace()
                .nth(1)?
                .split('.')
                .nth(1)?
                .parse::<u32>()
                .ok()
        });
    if minor.is_some_and(|m| m >= 89) {
        println!("cargo:rustc-cfg=kvevict_avx512");
    }
}

#[cfg(feature = "cuda")]
mod cuda_build {
    use std::env;
    use std::path::{Path, PathBuf};

    const SOURCES: &[&str] = &[
        "device.cu",
        "window.cu",
        "lava.cu",
        "vonorm.cu",
        "pool.cu",
        "combine.cu",
        "stats.cu",
        "select.cu",
        "shard.cu",
        "compact.cu",
        "baselines.cu",
        "budgets.cu",
        "stream.cu",
        "uniqueness.cu",
        "links.cu",
        "evictor.cu",
        "paged.cu",
    ];
    const HEADERS: &[&str] = &[
        "kvevict_cuda.h",
        "common.cuh",
        "mma.cuh",
        "tile_loads.cuh",
        "tile_async.cuh",
    ];

    fn fail(msg: &str) -> ! {
        eprintln!("kvevict build.rs: {msg}");
        std::process::exit(1);
    }

    /// nvcc: $NVCC, $CUDA_HOME/bin/nvcc, the project's nvcc venv, then PATH.
    fn find_nvcc(root: &Path) -> PathBuf {
        if let Some(p) = env::var_os("NVCC") {
            return PathBuf::from(p);
        }
        for var in ["CUDA_HOME", "CUDA_PATH"] {
            if let Some(h) = env::var_os(var) {
                let p = PathBuf::from(h).join("bin").join("nvcc");
                if p.is_file() {
                    return p;
                }
            }
        }
        let venv = env::var_os("KVEVICT_NVCC_VENV")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join(".venv-nvcc"));
        if let Ok(rd) = std::fs::read_dir(venv.join("lib")) {
            for e in rd.flatten() {
                let p = e.path().join("site-packages/nvidia/cu13/bin/nvcc");
                if p.is_file() {
                    return p;
                }
            }
        }
        if let Some(path) = env::var_os("PATH") {
            for d in env::split_paths(&path) {
                let p = d.join("nvcc");
                if p.is_file() {
                    return p;
                }
            }
        }
        fail("nvcc not found: set NVCC or CUDA_HOME, or run cuda/install_nvcc.sh");
    }

    /// The directory with libcudart_static.a: next to nvcc (lib, lib64, or the
    /// toolkit's targets/<arch>-linux/lib), or $KVEVICT_CUDA_LIB_DIR.
    fn find_lib_dir(nvcc: &Path) -> PathBuf {
        if let Some(d) = env::var_os("KVEVICT_CUDA_LIB_DIR") {
            return PathBuf::from(d);
        }
        let real = std::fs::canonicalize(nvcc).unwrap_or_else(|_| nvcc.to_path_buf());
        let root = real
            .parent()
            .and_then(|b| b.parent())
            .map(Path::to_path_buf);
        let mut cands = Vec::new();
        if let Some(r) = root {
            cands.push(r.join("lib"));
            cands.push(r.join("lib64"));
            cands.push(r.join("targets/x86_64-linux/lib"));
            cands.push(r.join("targets/sbsa-linux/lib"));
        }
        for c in &cands {
            if c.join("libcudart_static.a").is_file() {
                return c.clone();
            }
        }
        fail(&format!(
            "libcudart_static.a not found next to {} (set KVEVICT_CUDA_LIB_DIR)",
            nvcc.display()
        ));
    }

    fn archs() -> (Vec<u32>, Option<u32>) {
        match env::var("KVEVICT_CUDA_ARCHS") {
            Ok(s) if !s.trim().is_empty() => {
                let v: Vec<u32> = s
                    .split(|c: char| c == ',' || c.is_whitespace() || c == ';')
                    .filter(|t| !t.is_empty())
                    .map(|t| {
                        t.trim_start_matches("sm_")
                            .trim_start_matches("compute_")
                            .parse()
                            .unwrap_or_else(|_| fail(&format!("bad KVEVICT_CUDA_ARCHS entry {t}")))
                    })
                    .collect();
                if v.iter().any(|&a| a < 80) {
                    fail("KVEVICT_CUDA_ARCHS: the kernels need sm_80 or newer (bf16 tensor cores)");
                }
                (v, None)
            }
            _ => (vec![80, 86, 89, 90], Some(90)),
        }
    }

    pub fn build() {
        let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()));
        let cuda_dir = root.join("cuda");
        if env::var_os("CARGO_FEATURE_CUDA_EMU").is_some() {
            return emu_build(&cuda_dir);
        }
        for v in [
            "NVCC",
            "CUDA_HOME",
            "CUDA_PATH",
            "KVEVICT_NVCC_VENV",
            "KVEVICT_CUDA_ARCHS",
            "KVEVICT_CUDA_LIB_DIR",
        ] {
            println!("cargo:rerun-if-env-changed={v}");
        }
        for f in SOURCES.iter().chain(HEADERS) {
            println!("cargo:rerun-if-changed=cuda/{f}");
        }

        let nvcc = find_nvcc(&root);
        let lib_dir = find_lib_dir(&nvcc);
        // cc reads the NVCC variable for the CUDA compiler.
        env::set_var("NVCC", &nvcc);

        let mut b = cc::Build::new();
        b.cuda(true)
            .cudart("none") // linked below, as a static library bundled into our staticlib
            .debug(false) // else nvcc gets -G (device debug: no optimisation)
            .opt_level(3)
            .include(&cuda_dir)
            .flag("-std=c++17")
            .warnings(false);
        let (list, ptx) = archs();
        for a in &list {
            b.flag(format!("-gencode=arch=compute_{a},code=sm_{a}"));
        }
        if let Some(p) = ptx {
            b.flag(format!("-gencode=arch=compute_{p},code=compute_{p}"));
        }
        let sources: Vec<PathBuf> = SOURCES.iter().map(|f| cuda_dir.join(f)).collect();
        compile_cached(
            &b,
            "kvevict_cuda",
            &sources,
            &[cuda_dir.clone()],
            &format!("nvcc {list:?} {ptx:?}"),
            true,
        );

        println!("cargo:rustc-link-search=native={}", lib_dir.display());
        println!("cargo:rustc-link-lib=static=cudart_static");
        for l in ["dl", "rt", "pthread"] {
            println!("cargo:rustc-link-lib={l}");
        }
        println!("cargo:rustc-env=KVEVICT_CUDA_LIB_DIR={}", lib_dir.display());
    }

    const EMU_FILES: &[&str] = &[
        "emu.cpp",
        "cuda_runtime.h",
        "emu_device.h",
        "cuda_fp16.h",
        "cuda_bf16.h",
        "mma.h",
        "cuda_pipeline.h",
    ];

    /// Feature `cuda-emu`: the same kernels compiled by the host C++ compiler against
    /// cuda/emu (the runtime and device language on the CPU), no nvcc, no cudart.
    fn emu_build(cuda_dir: &Path) {
        let emu_dir = cuda_dir.join("emu");
        for f in SOURCES.iter().chain(HEADERS) {
            println!("cargo:rerun-if-changed=cuda/{f}");
        }
        for f in EMU_FILES {
            println!("cargo:rerun-if-changed=cuda/emu/{f}");
        }
        let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("emu");
        std::fs::create_dir_all(&out).unwrap_or_else(|e| fail(&format!("{}: {e}", out.display())));
        let mut b = cc::Build::new();
        b.cpp(true)
            .opt_level(2)
            .debug(true)
            .include(&emu_dir) // first: its cuda_runtime.h, cuda_fp16.h, mma.h
            .include(cuda_dir)
            .flag("-std=c++17")
            .flag("-ffp-contract=off") // no fusing the device code does not do
            .flag("-fno-strict-aliasing")
            .warnings(false);
        let mut sources = Vec::new();
        for f in SOURCES {
            let src = std::fs::read_to_string(cuda_dir.join(f))
                .unwrap_or_else(|e| fail(&format!("cuda/{f}: {e}")));
            let dst = out.join(f.replace(".cu", ".cpp"));
            let text = format!("#line 1 \"cuda/{f}\"\n{}", emu_shared_rewrite(&src));
            // (rewritten only when changed: the file's mtime stays that of its last content)
            if std::fs::read_to_string(&dst).ok().as_deref() != Some(text.as_str()) {
                std::fs::write(&dst, text)
                    .unwrap_or_else(|e| fail(&format!("{}: {e}", dst.display())));
            }
            sources.push(dst);
        }
        sources.push(emu_dir.join("emu.cpp"));
        // KVEVICT_EMU_SANITIZE=undefined: the kernels under UBSan (misaligned vector
        // loads and stores, which fault on a GPU; out-of-bounds static shared arrays;
        // integer overflow), the first finding aborts.
        println!("cargo:rerun-if-env-changed=KVEVICT_EMU_SANITIZE");
        let san = env::var("KVEVICT_EMU_SANITIZE").unwrap_or_default();
        match san.as_str() {
            "" => {}
            "undefined" => {
                b.flag("-fsanitize=undefined")
                    .flag("-fno-sanitize-recover=all")
                    .flag("-fno-omit-frame-pointer");
            }
            other => fail(&format!(
                "KVEVICT_EMU_SANITIZE={other}: only \"undefined\" is supported"
            )),
        }
        compile_cached(
            &b,
            "kvevict_cuda",
            &sources,
            &[emu_dir.clone(), cuda_dir.to_path_buf()],
            format!("emu {san}").trim_end(),
            false,
        );
        if san == "undefined" {
            let cxx = b.get_compiler();
            let out = std::process::Command::new(cxx.path())
                .arg("-print-file-name=libubsan.so")
                .output()
                .unwrap_or_else(|e| fail(&format!("asking the C++ compiler for libubsan: {e}")));
            let lib = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string());
            match lib.parent() {
                Some(d) if lib.is_absolute() => {
                    println!("cargo:rustc-link-search=native={}", d.display())
                }
                _ => fail("libubsan not found (KVEVICT_EMU_SANITIZE=undefined)"),
            }
            println!("cargo:rustc-link-lib=dylib=ubsan");
        }
    }

    /// The kernels as `lib<name>.a` in OUT_DIR: every source compiled to its own object (`jobs`
    /// compiles at a time: cargo's NUM_JOBS), archived, and for nvcc (relocatable device code,
    /// `--device-c`, as cc gives more than one .cu file) device-linked into the archive as cc's
    /// `compile` does. With `KVEVICT_KERNEL_CACHE` set, an object is taken from there when a build
    /// with the same key left it, so a changed source recompiles its own object only, in every
    /// build mode. An object's key hashes: `what` (the mode: nvcc archs, emu, emu + UBSan), build.rs,
    /// the compiler's path, full argument list (flags from the environment included, the clone's
    /// and OUT_DIR's paths made relative) and `--version`, the source's name and text, and the name
    /// and text of every file of `dirs` it includes, transitively (`includes`: a header change
    /// misses every object that includes it). The device-link object's key hashes the objects'
    /// keys. Cache files are written to a temporary name, then renamed: a concurrent build never
    /// reads half of one; a hit's mtime is set to now (its last use, for clean-ups).
    fn compile_cached(
        b: &cc::Build,
        name: &str,
        sources: &[PathBuf],
        dirs: &[PathBuf],
        what: &str,
        nvcc: bool,
    ) {
        println!("cargo:rerun-if-env-changed=KVEVICT_KERNEL_CACHE");
        let cache = env::var_os("KVEVICT_KERNEL_CACHE")
            .filter(|c| !c.is_empty())
            .map(PathBuf::from);
        if let Some(c) = &cache {
            let _ = std::fs::create_dir_all(c); // (none made: every store fails, every object compiles)
        }
        let tool = b.get_compiler();
        let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()));
        let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
        let objdir = out.join(format!("{name}-objects"));
        std::fs::create_dir_all(&objdir)
            .unwrap_or_else(|e| fail(&format!("{}: {e}", objdir.display())));
        let (root_s, out_s) = (root.to_string_lossy(), out.to_string_lossy());
        let rel = |p: &Path| {
            p.to_string_lossy()
                .replace(&*out_s, "<out>")
                .replace(&*root_s, "<root>")
        };
        let mut base = Fnv::new();
        base.add(b"kernel object v1");
        base.add(what.as_bytes());
        base.add(&std::fs::read(root.join("build.rs")).unwrap_or_default());
        base.add(tool.path().as_os_str().as_encoded_bytes());
        // (the clone's and OUT_DIR's paths left out: a fresh clone elsewhere hits the same entry)
        for a in tool.args() {
            base.add(rel(Path::new(a)).as_bytes());
        }
        base.add(
            &std::process::Command::new(tool.path())
                .arg("--version")
                .output()
                .map(|o| o.stdout)
                .unwrap_or_default(),
        );
        // (source, object, key), and the sources to compile
        let mut objects = Vec::new();
        let mut todo = Vec::new();
        for src in sources {
            let mut h = base.clone();
            h.add(src.file_name().unwrap_or_default().as_encoded_bytes());
            h.add(&read(src));
            for dep in includes(src, dirs) {
                // (a header that the lists in `build` and `emu_build` miss still reruns this)
                println!("cargo:rerun-if-changed={}", dep.display());
                h.add(rel(&dep).as_bytes());
                h.add(&read(&dep));
            }
            let stem = src.file_stem().unwrap_or_default().to_string_lossy();
            let obj = objdir.join(format!("{stem}.o"));
            let entry = cache
                .as_ref()
                .map(|c| c.join(format!("{name}-{stem}-{:016x}.o", h.0)));
            if !entry.as_ref().is_some_and(|e| take(e, &obj)) {
                todo.push((src.clone(), obj.clone(), entry));
            }
            objects.push((obj, h.0));
        }
        let jobs = env::var("NUM_JOBS")
            .ok()
            .and_then(|j| j.parse::<usize>().ok())
            .unwrap_or(1)
            .max(1);
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..jobs.min(todo.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((src, obj, entry)) = todo.get(i) else {
                        break;
                    };
                    let mut cmd = tool.to_command();
                    cmd.arg("-c");
                    if nvcc {
                        cmd.arg("--device-c");
                    }
                    cmd.arg("-o").arg(obj).arg(src);
                    run(&mut cmd);
                    if let Some(e) = entry {
                        store(obj, e);
                    }
                });
            }
        });
        eprintln!(
            "kvevict build.rs: {name} ({what}): {} of {} objects compiled, the rest from the kernel cache",
            todo.len(),
            sources.len()
        );
        let lib = out.join(format!("lib{name}.a"));
        let _ = std::fs::remove_file(&lib);
        let mut ar = b.get_archiver();
        ar.arg("crs").arg(&lib);
        ar.args(objects.iter().map(|o| &o.0));
        run(&mut ar);
        if nvcc {
            // the device link of every object's relocatable device code, one more object
            let mut h = base.clone();
            h.add(b"device link");
            for o in &objects {
                h.add(&o.1.to_le_bytes());
            }
            let dlink = objdir.join(format!("{name}_dlink.o"));
            let entry = cache
                .as_ref()
                .map(|c| c.join(format!("{name}-dlink-{:016x}.o", h.0)));
            if !entry.as_ref().is_some_and(|e| take(e, &dlink)) {
                let mut cmd = tool.to_command();
                cmd.arg("--device-link").arg("-o").arg(&dlink).arg(&lib);
                run(&mut cmd);
                if let Some(e) = entry {
                    store(&dlink, &e);
                }
            }
            let mut ar = b.get_archiver();
            ar.arg("rs").arg(&lib).arg(&dlink);
            run(&mut ar);
        }
        println!("cargo:rustc-link-lib=static={name}");
        println!("cargo:rustc-link-search=native={}", out.display());
        println!("cargo:rustc-link-lib=stdc++");
    }

    /// FNV-1a, 64 bits, over length-prefixed parts
    #[derive(Clone)]
    struct Fnv(u64);
    impl Fnv {
        fn new() -> Self {
            Fnv(0xcbf2_9ce4_8422_2325)
        }
        fn add(&mut self, bytes: &[u8]) {
            for &x in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
                self.0 = (self.0 ^ x as u64).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }

    fn read(f: &Path) -> Vec<u8> {
        std::fs::read(f).unwrap_or_else(|e| fail(&format!("{}: {e}", f.display())))
    }

    fn run(cmd: &mut std::process::Command) {
        match cmd.status() {
            Ok(s) if s.success() => {}
            Ok(s) => fail(&format!("{cmd:?}: {s}")),
            Err(e) => fail(&format!("{cmd:?}: {e}")),
        }
    }

    /// A cached file copied to `dst` (true), its mtime set to now (its last use).
    fn take(entry: &Path, dst: &Path) -> bool {
        if std::fs::copy(entry, dst).is_err() {
            return false;
        }
        let _ = std::fs::File::options()
            .write(true)
            .open(entry)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        true
    }

    /// `src` stored as `entry` (through a temporary name; a failure only loses the entry).
    fn store(src: &Path, entry: &Path) {
        let tmp = entry.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::copy(src, &tmp)
            .and_then(|_| std::fs::rename(&tmp, entry))
            .is_err()
        {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// Every file under `dirs` that `src` includes, directly or through another: `#include "f"`
    /// looked up in the including file's folder, then in `dirs` in order; `#include <f>` in
    /// `dirs` (a name found in none is the compiler's own, which its version stands for). Every
    /// `#include` line counts, also one in an `#if` branch or a comment (more than needed, never
    /// less). An `#include` of any other form (a macro, `#include_next`) cannot be followed: then
    /// every file in `dirs` counts. Sorted, each once.
    fn includes(src: &Path, dirs: &[PathBuf]) -> Vec<PathBuf> {
        let mut seen = std::collections::BTreeSet::new();
        let mut stack = vec![src.to_path_buf()];
        while let Some(f) = stack.pop() {
            let text = String::from_utf8_lossy(&read(&f)).into_owned();
            for line in text.lines() {
                let Some(rest) = line.trim_start().strip_prefix('#') else {
                    continue;
                };
                let Some(rest) = rest.trim_start().strip_prefix("include") else {
                    continue;
                };
                let rest = rest.trim_start();
                let (quoted, close) = match rest.chars().next() {
                    Some('"') => (true, '"'),
                    Some('<') => (false, '>'),
                    _ => return every_file(dirs),
                };
                let Some((inc, _)) = rest[1..].split_once(close) else {
                    return every_file(dirs);
                };
                let here = f.parent().map(Path::to_path_buf);
                let found = quoted
                    .then_some(here)
                    .flatten()
                    .into_iter()
                    .chain(dirs.iter().cloned())
                    .map(|d| d.join(inc))
                    .find(|p| p.is_file());
                if let Some(p) = found {
                    if seen.insert(p.clone()) {
                        stack.push(p);
                    }
                }
            }
        }
        seen.remove(src);
        seen.into_iter().collect()
    }

    fn every_file(dirs: &[PathBuf]) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = dirs
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flat_map(|rd| rd.flatten().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        v.sort();
        v
    }

    /// `extern __shared__ [__align__(n)] T name[];` (dynamic shared memory, which C++
    /// cannot declare) becomes `T* name = (T*)kve_emu::dyn_smem();`, the current block's.
    fn emu_shared_rewrite(src: &str) -> String {
        let mut o = String::with_capacity(src.len());
        for line in src.lines() {
            let Some(at) = line.find("extern __shared__") else {
                o.push_str(line);
                o.push('\n');
                continue;
            };
            let mut rest = line[at + "extern __shared__".len()..].trim_start();
            if let Some(r) = rest.strip_prefix("__align__(") {
                rest = r.split_once(')').map(|x| x.1).unwrap_or(r).trim_start();
            }
            let Some((decl, tail)) = rest.split_once("[];") else {
                fail(&format!(
                    "cuda-emu: cannot read the shared-memory declaration {line:?}"
                ));
            };
            let decl = decl.trim_end();
            let cut = decl
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or_else(|| fail(&format!("cuda-emu: no type in {line:?}")));
            let (ty, name) = (decl[..cut + 1].trim(), &decl[cut + 1..]);
            o.push_str(&line[..at]);
            o.push_str(&format!(
                "{ty}* {name} = reinterpret_cast<{ty}*>(kve_emu::dyn_smem());{tail}\n"
            ));
        }
        o
    }
}
