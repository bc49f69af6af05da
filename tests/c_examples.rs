//! Builds the C examples in `c_examples/` against the static and shared libraries, runs
//! them and checks what they print; installs with `scripts/install.sh` and builds the
//! CMake consumer project with `find_package(kvevict)`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The folder holding libkvevict.a and libkvevict.so of the cargo invocation that built this
/// test: cargo builds the library's every crate type (rlib, staticlib, cdylib) beside the test
/// binaries, in `target/<profile>/deps`, with this test's features. Linking those (instead of
/// running `cargo build --lib` again, which compiled the whole crate a second time in another
/// profile, ~100 s of CPU per feature set in scripts/test.sh) tests the same library. A library
/// of other features left there by a later build would fail `cuda_device`, which checks the
/// CUDA line against this test's features.
fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        let dir = exe.parent().expect("the test binary's folder").to_path_buf();
        for f in ["libkvevict.a", "libkvevict.so"] {
            assert!(
                dir.join(f).is_file(),
                "no {f} beside the test binary in {} (cargo builds the library's crate types there)",
                dir.display()
            );
        }
        dir
    })
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvevict-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

const STRICT: &[&str] = &[
    "-std=c99",
    "-Wall",
    "-Wextra",
    "-pedantic",
    "-Werror",
    "-O1",
];
const NATIVE: &[&str] = &["-lpthread", "-ldl", "-lm", "-lrt", "-lutil"];

/// Compile `c_examples/NAME.c` against the static library and run it.
fn example(name: &str, defines: &[&str]) -> String {
    let dir = tmp(name);
    let exe = dir.join(name);
    let mut cc = Command::new("gcc");
    cc.args(STRICT)
        .args(defines)
        .arg("-I")
        .arg(root().join("include"))
        .arg(root().join(format!("c_examples/{name}.c")))
        .arg(lib_dir().join("libkvevict.a"))
        .args(NATIVE)
        .arg("-o")
        .arg(&exe);
    if cfg!(feature = "cuda") {
        cc.args(["-lstdc++"]);
    }
    run(&mut cc);
    let out = run(&mut Command::new(&exe));
    let _ = std::fs::remove_dir_all(&dir);
    out
}

fn line<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{out}"))
}

fn numbers(s: &str) -> Vec<u64> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter(|t| !t.is_empty())
        .map(|t| t.parse().unwrap())
        .collect()
}

#[test]
fn llama_cpp_layout() {
    let out = example("llama_cpp_layout", &[]);
    assert!(
        line(&out, "budget:").contains("keep 16 of 168 prefix cells"),
        "{out}"
    );
    let kept = numbers(line(&out, "kept prefix cells:"));
    assert_eq!(kept.len(), 16, "{out}");
    assert!(kept.windows(2).all(|w| w[0] < w[1]));
    let ev = line(&out, "evicting ");
    let nums = numbers(ev);
    assert_eq!(&nums[..2], &[152, 200], "{out}");
    let evicted = &nums[2..];
    assert_eq!(evicted.len(), 152);
    // kept and evicted partition the prefix
    let mut all: Vec<u64> = kept.iter().chain(evicted).copied().collect();
    all.sort();
    assert_eq!(all, (0..168).collect::<Vec<_>>());
    assert!(out.contains("needle cells kept: 3 of 3"), "{out}");
    // the value after the needle is longer than the 9-cell continuation: links keep it
    let run = numbers(line(&out, "value run cells kept:"));
    assert_eq!(&run[..2], &[12, 12], "{out}");
    assert!(run[2] < 12, "{out}");
}

#[test]
fn varlen_heads() {
    let out = example("varlen_heads", &[]);
    assert!(out.contains("compaction check: ok"), "{out}");
    // LAVa's budget: 3 layers x 4 heads x 24 prefix + window 16 each = 480
    assert!(
        line(&out, "LAVa").contains("kept 480 rows of 1152"),
        "{out}"
    );
    for l in 0..3 {
        let s = line(&out, &format!("layer {l}:"));
        let (lens, cu) = s.split_once('|').unwrap();
        let lens = numbers(lens.split_once(':').unwrap().1);
        let cu = numbers(cu);
        assert_eq!(lens.len(), 4);
        assert_eq!(cu.len(), 5);
        assert_eq!(cu[0], 0);
        for h in 0..4 {
            assert_eq!(cu[h + 1] - cu[h], lens[h]);
            assert!(lens[h] >= 16, "every head keeps its window: {s}");
        }
        assert_eq!(cu[4], 160, "layer budget 4 x 24 + window 4 x 16: {s}");
        assert!(
            lens.iter().any(|&x| x != lens[0]),
            "ragged heads expected: {s}"
        );
    }
}

#[test]
fn paged_blocks() {
    let out = example("paged_blocks", &[]);
    assert!(out.contains("compaction check: ok"), "{out}");
    let k = numbers(line(&out, "kept "));
    assert_eq!(&k[1..], &[150, 8, 142], "{out}");
    // a quarter of the prefix (35 of 142) and the window
    assert_eq!(k[0], 35 + 8, "{out}");
    let f = numbers(line(&out, "blocks freed:"));
    assert_eq!(f[1], 10, "{out}");
    assert_eq!(f[0], 10 - k[0].div_ceil(16), "{out}");
    // "table0[3..10]": the digits of "table0" come first
    assert_eq!(&f[2..], &[0, 10 - f[0], 10], "{out}");
    let pos = numbers(line(&out, "first kept positions:"));
    assert!(pos[0] < pos[1] && pos[1] < pos[2], "{out}");
    assert_eq!(pos[3], 149, "the window is kept: {out}");
}

#[test]
fn cuda_device() {
    let out = if cfg!(feature = "cuda") {
        // the CUDA runtime (cudart_static) is bundled into libkvevict.a: no -lcudart
        example("cuda_device", &["-DKVE_EXAMPLE_WITH_CUDA"])
    } else {
        example("cuda_device", &[])
    };
    if cfg!(feature = "cuda") && out.contains("skipped: no CUDA device") {
        return;
    }
    if cfg!(feature = "cuda") {
        let l = line(&out, "LaProx-span on the device:");
        println!("{l}");
        let v = numbers(l);
        // kept, of P, host kept, in common
        assert_eq!(v[0], v[2], "{out}");
        assert!(v[3] + 2 >= v[2], "{out}");
        assert!(l.ends_with("compacted K rows correct"), "{out}");
    } else {
        assert!(out.contains("skipped: library built without CUDA"), "{out}");
    }
}

#[test]
fn shared_library_links() {
    let dir = tmp("shared");
    let exe = dir.join("varlen_shared");
    run(Command::new("gcc")
        .args(STRICT)
        .arg("-I")
        .arg(root().join("include"))
        .arg(root().join("c_examples/varlen_heads.c"))
        .arg("-L")
        .arg(lib_dir())
        .arg(format!("-Wl,-rpath,{}", lib_dir().display()))
        .args(["-lkvevict", "-lm"])
        .arg("-o")
        .arg(&exe));
    let out = run(&mut Command::new(&exe));
    assert!(out.contains("compaction check: ok"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `cmake` on PATH, or one pip-installed into a venv under the target dir; None if
/// neither works.
fn find_cmake() -> Option<PathBuf> {
    if let Ok(o) = Command::new("cmake").arg("--version").output() {
        if o.status.success() {
            return Some(PathBuf::from("cmake"));
        }
    }
    let venv = lib_dir().join("cmake-venv");
    let bin = venv.join("bin/cmake");
    // a venv's scripts name its python by the path it was made at: one made through another
    // clone's target/ (a symlink to the shared cargo cache) breaks when that clone is gone
    let runs = |b: &PathBuf| {
        Command::new(b)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if bin.exists() && runs(&bin) {
        return Some(bin);
    }
    let _ = std::fs::remove_dir_all(&venv);
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .is_ok_and(|s| s.success())
        && Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "cmake"])
            .status()
            .is_ok_and(|s| s.success());
    if ok && runs(&bin) {
        Some(bin)
    } else {
        None
    }
}

#[test]
fn install_and_cmake_consumer() {
    let prefix = tmp("prefix");
    // the libraries this test links (lib_dir): install.sh installs them as they are
    let mut install = Command::new("bash");
    install
        .arg(root().join("scripts/install.sh"))
        .arg(&prefix)
        .env("KVEVICT_INSTALL_FROM", lib_dir());
    if cfg!(feature = "cuda-emu") {
        install.env("KVEVICT_FEATURES", "cuda-emu");
    } else if cfg!(feature = "cuda") {
        install.env("KVEVICT_FEATURES", "cuda");
    }
    run(&mut install);
    for f in [
        "include/kvevict.h",
        "lib/libkvevict.a",
        "lib/libkvevict.so",
        "lib/pkgconfig/kvevict.pc",
        "lib/cmake/kvevict/kvevictConfig.cmake",
        "lib/cmake/kvevict/kvevictConfigVersion.cmake",
    ] {
        assert!(prefix.join(f).exists(), "{f} not installed");
    }
    let pc = std::fs::read_to_string(prefix.join("lib/pkgconfig/kvevict.pc")).unwrap();
    assert!(
        pc.contains(&format!("Version: {}", env!("CARGO_PKG_VERSION"))) && pc.contains("-lkvevict"),
        "{pc}"
    );
    if let Ok(o) = Command::new("pkg-config")
        .args(["--cflags", "--libs", "kvevict"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
    {
        if o.status.success() {
            let flags = String::from_utf8_lossy(&o.stdout).into_owned();
            assert!(
                flags.contains("-lkvevict") && flags.contains("/include"),
                "{flags}"
            );
        }
    }

    let Some(cmake) = find_cmake() else {
        eprintln!(
            "SKIPPED cmake consumer: no cmake on PATH and `pip install cmake` into a venv failed"
        );
        return;
    };
    let build = tmp("cmake-build");
    run(Command::new(&cmake)
        .arg("-S")
        .arg(root().join("c_examples/cmake_consumer"))
        .arg("-B")
        .arg(&build)
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display())));
    run(Command::new(&cmake).arg("--build").arg(&build));
    for exe in ["consumer", "consumer_static"] {
        let out = run(&mut Command::new(build.join(exe)));
        assert!(
            out.contains("via find_package: kept 1 3 5 6 7"),
            "{exe}: {out}"
        );
    }
    let _ = std::fs::remove_dir_all(&build);
    let _ = std::fs::remove_dir_all(&prefix);
}

/// Lines of `src` that integrate kvevict: those between `/* kvevict: begin */` and
/// `/* kvevict: end */` markers (blank lines aside) and those marked `/* kvevict */`.
fn integration_lines(src: &str) -> usize {
    let mut inside = false;
    let mut count = 0;
    for l in src.lines() {
        if l.contains("/* kvevict: begin */") {
            inside = true;
        } else if l.contains("/* kvevict: end */") {
            inside = false;
        } else if (inside && !l.trim().is_empty()) || l.contains("/* kvevict */") {
            count += 1;
        }
    }
    count
}

#[test]
fn toy_engine() {
    let src = std::fs::read_to_string(root().join("c_examples/toy_engine.c")).unwrap();
    let n = integration_lines(&src);
    assert!(
        (30..=100).contains(&n),
        "integration of the toy engine: {n} lines"
    );
    let out = example("toy_engine", &[]);
    println!("{out}integration: {n} lines");
    assert!(
        line(&out, "stage calls by hand:").contains("same kept set (96 of 96 cells)"),
        "{out}"
    );
    // the prompt of 200 is evicted down to LOW = 96 at once
    assert_eq!(numbers(line(&out, "prefill:")), [200, 96], "{out}");
    // decode: never above HIGH = 128 after a step; evicted to 96 every 33 tokens
    let d = numbers(line(&out, "decoded"));
    assert_eq!(d[0], 150, "{out}");
    assert!(d[1] <= 128 && d[2] <= 128 && d[3] == 128, "{out}");
    let e = numbers(line(&out, "evictions:"));
    assert_eq!(e, [5, 104 + 4 * 33], "{out}");
    // the newest position is the last decoded token: 200 + 150 - 1
    assert_eq!(numbers(line(&out, "oldest and newest"))[1], 349, "{out}");
}

/// Issue 26: c_examples/llama_cpp/kvevict_llama.c runs on the evictor, its eviction part
/// counted as the toy engine's (at most 150 lines), with no preset table of its own: its
/// method names, selections and what to capture all come from the library.
#[test]
fn llama_cpp_integration_lines() {
    let path = root().join("c_examples/llama_cpp/kvevict_llama.c");
    let src = std::fs::read_to_string(path).unwrap();
    let n = integration_lines(&src);
    assert!(
        (60..=150).contains(&n),
        "eviction part of the llama.cpp example: {n} lines"
    );
    println!("c_examples/llama_cpp/kvevict_llama.c: eviction part {n} lines");
    for stage in [
        "kve_score_layer(",
        "kve_select_model",
        "kve_compute_gram(",
        "KVE_PRESET_",
    ] {
        assert!(!src.contains(stage), "the example calls {stage} itself");
    }
    for call in [
        "kve_evictor_plan(",
        "kve_evictor_score_layer(",
        "kve_evictor_compact(",
    ] {
        assert!(src.contains(call), "the example does not call {call}");
    }
}
