//! The llama.cpp fork (llama_fork/: llama.cpp 0c1e57098 + the patch series, kvevict linked
//! into libllama) end to end on SmolLM2-135M-Instruct Q4_1:
//!
//! - `llama-kvevict-needle` (a tool of the fork): needle prompts (~1000 tokens, the grammar
//!   of c_examples/llama_cpp), the prompt minus its last token prefilled, `llama_kv_evict`
//!   at 10% keep (kvevict scores the cache's own K/V tensors and compacts the kept cells to
//!   the front), then the answer; with flash attention off (V transposed) and on;
//! - the attention span (`n_kv`) on the compacted cache: the kept cells rounded up to the fork's
//!   pad (decode timings printed, measured by llama_fork/bench_decode.py, never asserted);
//! - LaProx's Gram blocks built once per context by its kvevict evictor (`kve_evictor_set_output_projection`);
//! - the window queries captured inside the graph (`ggml_set_rows`), only for methods that read them;
//! - bad input refused by `llama-cli` / `llama-server` at startup, and bad calls of the C
//!   API returning their error without touching the cache;
//! - `llama-server` on loopback with a cell budget smaller than a multi-turn conversation, with
//!   its default `-b`/`-ub`: the KV cache allocated for the budget alone; a prompt longer than
//!   the budget through one `llama_decode` (evictions between its ubatches);
//! - question-agnostic compression (`--agnostic`: the context alone is prefilled and
//!   compressed, the question comes after) with the `uniqueness` method;
//! - the compacted sequence saved with `llama_state_seq_save_file` (about 1/keep smaller) and
//!   loaded into a fresh context, where it answers the same;
//! - the device path (`kve_cuda_*` on the cache's tensors, what a CUDA build runs) forced on the
//!   CPU cache with `KVEVICT_FORK_DEVICE_PATH=1`, against libllama relinked with kvevict's
//!   `cuda-emu` (the real kernels on the CPU emulator; `KVEVICT_FORK_EMU_LIB`, llama_fork/cuda_emu.sh): the same kept cells and K/V
//!   rows (byte-identical state files) and answers as the host path; refused cleanly without it.
//!
//! - the configurations users run (issue 27): llama-server's default `-np` (4 slots, a unified
//!   cache) with a cell budget (a stream per sequence) and with a keep ratio (each sequence
//!   compressed inside the shared stream), two chats at once; `q8_0`/`q4_0` caches (scored on
//!   dequantized, un-rotated rows, compacted as bytes) through the needle tool and the server;
//!   every library method in `--help` and the unknown-method message, one info line per eviction.
//!
//! Needs `KVEVICT_FORK_BIN` (llama_fork/build.sh prints it) and `KVEVICT_LLAMA_MODEL`;
//! skips with a message without them, unless `KVEVICT_FORK_REQUIRED=1`
//! (scripts/test.d/45-llama-fork.sh sets it, so there a missing build fails).

mod result_row;

use result_row::{Row, PROMPTS};
use std::path::{Path, PathBuf};
use std::process::Command;

struct Setup {
    bin: PathBuf,
    model: PathBuf,
}

fn setup() -> Option<Setup> {
    let bin = std::env::var_os("KVEVICT_FORK_BIN").map(PathBuf::from);
    let model = std::env::var_os("KVEVICT_LLAMA_MODEL").map(PathBuf::from);
    let required = std::env::var("KVEVICT_FORK_REQUIRED").is_ok_and(|v| v == "1");
    match (bin, model) {
        (Some(bin), Some(model))
            if bin.join("llama-kvevict-needle").is_file() && model.is_file() =>
        {
            Some(Setup { bin, model })
        }
        _ if required => panic!(
            "KVEVICT_FORK_BIN / KVEVICT_LLAMA_MODEL do not point at the fork's build and the model"
        ),
        _ => {
            eprintln!(
                "SKIPPED tests/llama_fork.rs: set KVEVICT_FORK_BIN (llama_fork/build.sh) and KVEVICT_LLAMA_MODEL, \
                 or run scripts/test.d/45-llama-fork.sh"
            );
            None
        }
    }
}

fn needle(s: &Setup, args: &[&str]) -> Row {
    let mut rows = result_row::run_rows(&s.bin.join("llama-kvevict-needle"), &s.model, args);
    assert_eq!(rows.len(), 1, "one RESULT line");
    rows.remove(0)
}

fn needle_with(s: &Setup, common: &[&str], extra: &[&str]) -> Row {
    needle(s, &[common, extra].concat())
}

/// llama.cpp pads the attention span to a multiple of 256 cells (llama_kv_cache::get_n_kv); the fork
/// pads an evicting context's span to a multiple of 32 when its cache is in CPU memory
/// (`llama_kv_evictor::set_pad`, `LLAMA_KV_EVICT_N_PAD_CPU`), so a compacted cache spans about
/// its kept cells.
const PAD_UPSTREAM: f64 = 256.0;
const PAD_EVICTING: f64 = 32.0;

fn padded(cells: f64, pad: f64) -> f64 {
    (cells / pad).ceil().max(1.0) * pad
}

#[test]
fn needle_at_ten_percent_compacts_the_cache() {
    let Some(s) = setup() else {
        return;
    };
    let mut table = String::from(
        "flash depth seed | method       | cells      | n_kv       | kvevict ms | answer\n",
    );
    let mut failures = Vec::new();
    for flash in ["off", "on"] {
        let (mut full_exact, mut span_exact, mut span_key) = (0, 0, 0);
        for (depth, seed) in PROMPTS {
            let common = ["--needle", depth, "--seed", seed, "--flash-attn", flash];
            let full = needle_with(&s, &common, &["--kv-evict", "full"]);
            let span = needle_with(
                &s,
                &common,
                &["--kv-evict", "laprox-span", "--kv-keep", "0.1"],
            );
            let stream = needle_with(
                &s,
                &common,
                &["--kv-evict", "streamingllm", "--kv-keep", "0.1"],
            );
            assert_eq!(
                full.num("bad_calls_ok"),
                1.0,
                "no-state calls must fail cleanly"
            );
            for r in [&span, &stream] {
                let m = r.get("method");
                let before = r.num("cells_before");
                let after = r.num("cells_after");
                // 10% of the cache, window inside (kvpress's accounting)
                assert_eq!(before, full.num("prompt") - 1.0, "{m}: cells before");
                assert_eq!(after, (before * 0.1).floor(), "{m}: cells kept");
                assert_eq!(r.num("evicted"), before - after, "{m}: evicted");
                // compaction: the attention span is the kept cells, padded as llama.cpp pads
                assert_eq!(
                    r.num("n_kv_before"),
                    padded(before, PAD_EVICTING),
                    "{m}: n_kv before"
                );
                assert_eq!(
                    r.num("n_kv_after"),
                    padded(after, PAD_EVICTING),
                    "{m}: n_kv after"
                );
                assert_eq!(
                    r.num("bad_calls_ok"),
                    1.0,
                    "{m}: bad calls must fail cleanly"
                );
                let verdict = r.verdict();
                table += &format!(
                    "{flash:>5} {depth:>5} {seed:>4} | {m:<12} | {before:>4} -> {after:<3} | {:>4} -> {:<3} | {:>10.1} | {:?} {verdict}\n",
                    r.get("n_kv_before"),
                    r.get("n_kv_after"),
                    r.num("evict_ms"),
                    r.get("answer"),
                );
            }
            table += &format!("{flash:>5} {depth:>5} {seed:>4} | full         |            |            |            | {:?}\n", full.get("answer"));
            full_exact += (full.num("correct") == 1.0) as i32;
            span_exact += (span.num("correct") == 1.0) as i32;
            span_key += (span.num("recovered") == 1.0) as i32;
            if full.num("correct") != 1.0 {
                failures.push(format!(
                    "flash {flash} depth {depth}: full cache answered {:?}",
                    full.get("answer")
                ));
            }
            if span.num("recovered") != 1.0 {
                failures.push(format!(
                    "flash {flash} depth {depth}: laprox-span answered {:?}",
                    span.get("answer")
                ));
            }
            if stream.num("recovered") != 0.0 {
                failures.push(format!("flash {flash} depth {depth}: streamingllm kept the key (the needle is outside its sink+window)"));
            }
        }
        table += &format!(
            "flash {flash}: full exact {full_exact}/{n}; laprox-span at 10%: exact {span_exact}/{n}, key recovered {span_key}/{n}\n",
            n = PROMPTS.len()
        );
        // issue 12's target: at 10% keep, at least as many exact answers as the full cache
        if span_exact < full_exact {
            failures.push(format!(
                "flash {flash}: laprox-span exact on {span_exact}, the full cache on {full_exact}"
            ));
        }
    }
    println!("{table}");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Issue 11's llama.cpp step: compress the context before the question exists. The
/// question-agnostic `uniqueness` scorer (no window queries read) must answer every prompt
/// the full cache answers at 10 % keep; the question-aware default is printed beside it.
#[test]
fn agnostic_compression_keeps_the_needle() {
    let Some(s) = setup() else {
        return;
    };
    let mut table = String::from("flash depth | full | uniqueness 10% | laprox-span 10%\n");
    let mut failures = Vec::new();
    for flash in ["off", "on"] {
        let (mut full_ok, mut uniq_ok) = (0, 0);
        for (depth, seed) in PROMPTS {
            let common = [
                "--needle",
                depth,
                "--seed",
                seed,
                "--flash-attn",
                flash,
                "--agnostic",
            ];
            let full = needle_with(&s, &common, &["--kv-evict", "full"]);
            let uniq = needle_with(
                &s,
                &common,
                &["--kv-evict", "uniqueness", "--kv-keep", "0.1"],
            );
            let span = needle_with(
                &s,
                &common,
                &["--kv-evict", "laprox-span", "--kv-keep", "0.1"],
            );
            for r in [&uniq, &span] {
                assert_eq!(r.num("agnostic"), 1.0);
                let before = r.num("cells_before");
                // the context alone was prefilled: the question is not in the cache yet
                assert!(
                    before < full.num("prompt") - 1.0,
                    "agnostic: question prefilled"
                );
                assert_eq!(r.num("cells_after"), (before * 0.1).floor(), "cells kept");
                assert_eq!(
                    r.num("n_kv_after"),
                    padded(r.num("cells_after"), PAD_EVICTING),
                    "compacted"
                );
            }
            table += &format!(
                "{flash:>5} {depth:>5} | {} | {} ({:.0} ms) | {}\n",
                full.verdict(),
                uniq.verdict(),
                uniq.num("score_ms"),
                span.verdict()
            );
            let (f, u) = (full.num("correct") == 1.0, uniq.num("correct") == 1.0);
            full_ok += f as i32;
            uniq_ok += (f && u) as i32;
            if f && !u {
                failures.push(format!(
                    "flash {flash} depth {depth}: uniqueness answered {:?}",
                    uniq.get("answer")
                ));
            }
        }
        table += &format!(
            "flash {flash}: uniqueness exact on {uniq_ok} of the full cache's {full_ok}\n"
        );
    }
    println!("{table}");
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn compacted_state_file_is_smaller_and_answers_the_same() {
    let Some(s) = setup() else {
        return;
    };
    let dir = std::env::temp_dir();
    let mut lines = Vec::new();
    // question-aware (flash off) and question-agnostic (uniqueness, flash on) compression at 10%
    for (flash, extra) in [
        ("off", ["--kv-evict", "laprox-span"]),
        ("on", ["--kv-evict", "uniqueness"]),
    ] {
        let path = dir.join(format!("kvevict-state-{}-{flash}.bin", std::process::id()));
        let path_str = path.to_str().unwrap().to_string();
        let mut args = vec![
            "--needle",
            "0.3",
            "--seed",
            "3",
            "--flash-attn",
            flash,
            "--kv-keep",
            "0.1",
            "--state-file",
            &path_str,
        ];
        args.extend(extra);
        if extra[1] == "uniqueness" {
            args.push("--agnostic");
        }
        let r = needle(&s, &args);
        let (full, small) = (r.num("state_full_bytes"), r.num("state_bytes"));
        let cells = r.num("cells_before") / r.num("cells_after");
        // the files on disk are what the tool reported
        assert_eq!(std::fs::metadata(&path).unwrap().len() as f64, small);
        let full_path = format!("{path_str}.full");
        assert_eq!(std::fs::metadata(&full_path).unwrap().len() as f64, full);
        remove_state_files(&path_str);
        lines.push(format!(
            "{} flash {flash}: state file {small} bytes, uncompressed {full} bytes ({:.2}x smaller; cells {} -> {}); answer {:?}, after reload {:?}",
            r.get("method"),
            full / small,
            r.num("cells_before"),
            r.num("cells_after"),
            r.get("answer"),
            r.get("reload_answer"),
        ));
        // K/V rows dominate the file: it shrinks as the cells do (the token list and header aside)
        assert!(
            full / small > 0.97 * cells && full / small < 1.03 * cells,
            "state file {full} -> {small} bytes, cells shrank {cells:.2}x"
        );
        assert!(!r.get("answer").is_empty(), "no answer");
        assert_eq!(
            r.get("reload_answer"),
            r.get("answer"),
            "the reloaded compacted state must answer the same"
        );
    }
    println!("{}", lines.join("\n"));
}

/// Decode on the compacted cache spans the kept cells rounded up to the fork's pad (32), not the
/// 256 upstream pads to, nor the whole prompt as holes leave it; flash attention off and on. The
/// timings are printed (llama_fork/bench_decode.py measures the speed-up, interleaved over rounds),
/// never asserted.
#[test]
fn decode_on_the_compacted_cache_spans_the_kept_cells() {
    let Some(s) = setup() else {
        return;
    };
    for flash in ["off", "on"] {
        let common = [
            "--needle",
            "0.5",
            "--seed",
            "5",
            "--bench",
            "64",
            "-t",
            "1",
            "--flash-attn",
            flash,
        ];
        let full = needle_with(&s, &common, &["--kv-evict", "full"]);
        let span = needle_with(
            &s,
            &common,
            &["--kv-evict", "laprox-span", "--kv-keep", "0.1"],
        );
        // the same number of cells removed with llama_memory_seq_rm: holes, the span stays
        let holes = needle_with(
            &s,
            &common,
            &["--kv-evict", "laprox-span", "--kv-keep", "0.1", "--holes"],
        );
        let (f, c, h) = (
            full.num("cpu_ms_per_tok"),
            span.num("cpu_ms_per_tok"),
            holes.num("cpu_ms_per_tok"),
        );
        println!(
            "flash {flash}, decode after a {}-token prompt, 64 tokens, -t 1: full {:.2} ms CPU/token ({:.1} tokens/s wall), \
             holes ({} cells, n_kv {}) {:.2} ms CPU/token ({:.1} tokens/s wall), \
             compacted to {} cells (n_kv {} -> {}) {:.2} ms CPU/token ({:.1} tokens/s wall): {:.2}x full, {:.2}x holes",
            full.get("prompt"),
            f,
            full.num("tok_s"),
            holes.get("cells_end"),
            holes.get("n_kv_end"),
            h,
            holes.num("tok_s"),
            span.get("cells_end"),
            span.get("n_kv_after"),
            span.get("n_kv_end"),
            c,
            span.num("tok_s"),
            f / c,
            h / c
        );
        assert_eq!(
            holes.num("cells_after"),
            span.num("cells_after"),
            "holes and compaction keep as many cells"
        );
        assert!(
            holes.num("n_kv_end") >= 1024.0,
            "holes leave the span as it was, got {}",
            holes.get("n_kv_end")
        );
        // right after compaction and after 64 more tokens: the kept cells, rounded up to the pad
        for (cells, n_kv) in [("cells_after", "n_kv_after"), ("cells_end", "n_kv_end")] {
            assert_eq!(
                span.num(n_kv),
                padded(span.num(cells), PAD_EVICTING),
                "flash {flash}: {n_kv} for {} cells",
                span.get(cells)
            );
        }
        assert!(
            span.num("n_kv_after") < padded(span.num("cells_after"), PAD_UPSTREAM),
            "flash {flash}: the compacted span {} is not below upstream's padding",
            span.get("n_kv_after")
        );
    }
}

/// LaProx's Gram blocks: each evicting context's kvevict evictor takes every layer's `Wo` once
/// (`kve_evictor_set_output_projection`, at its first eviction) and keeps the blocks; a second
/// context of the same model builds its own once and evicts the same prompt to as many cells.
#[test]
fn laprox_gram_blocks_are_built_once_per_context() {
    let Some(s) = setup() else {
        return;
    };
    let r = needle(
        &s,
        &[
            "--needle",
            "0.5",
            "--seed",
            "5",
            "--kv-evict",
            "laprox-span",
            "--kv-keep",
            "0.1",
            "--again",
        ],
    );
    println!(
        "first context: prefill {} ms, kvevict {} ms (score {} ms, Gram blocks {} ms); second: prefill {} ms, \
         kvevict {} ms (score {} ms)",
        r.get("prefill_ms"),
        r.get("evict_ms"),
        r.get("score_ms"),
        r.get("gram_ms"),
        r.get("again_prefill_ms"),
        r.get("again_evict_ms"),
        r.get("again_score_ms")
    );
    assert_eq!(r.num("grams"), 1.0, "the first eviction builds the blocks");
    assert_eq!(
        r.num("again_grams"),
        1.0,
        "a second context builds its own, once"
    );
    assert_eq!(r.num("again_cells_after"), r.num("cells_after"));
    assert_eq!(r.num("correct"), 1.0, "answer {:?}", r.get("answer"));
}

/// The window queries (every layer's post-RoPE `Qcur`) are captured by one `ggml_set_rows` node per
/// layer inside the graph, into a ring per sequence (`llama_kv_evictor::graph_node`), not by a
/// scheduler eval callback (which split every decode graph at each captured node, ~0.3 ms a token),
/// and only when the method reads queries: the tool reports the layers captured, from libllama's
/// log. A method that reads none (uniqueness, knorm) captures nothing; one that reads
/// them captures every layer, one-shot and under a decode-time budget, where ubatches of 5 tokens
/// (fewer than the 8-token window) make each eviction's window span several ubatches: every
/// eviction finds its queries (a missing one is an error in the log and a failed eviction).
#[test]
fn window_queries_are_captured_in_the_graph_when_the_method_reads_them() {
    let Some(s) = setup() else {
        return;
    };
    let common = [
        "--needle",
        "0.5",
        "--seed",
        "3",
        "--ctx-tokens",
        "200",
        "-n",
        "4",
        "-t",
        "2",
    ];
    for (method, reads_queries) in [
        ("laprox-span", true),
        ("tova", true),
        ("uniqueness", false),
        ("knorm", false),
    ] {
        let r = needle_with(&s, &common, &["--kv-evict", method, "--kv-keep", "0.25"]);
        println!(
            "{method} one-shot: {} of {} layers captured, cells {} -> {}, log problems {}, answer {:?}",
            r.num("capture_layers"),
            r.num("n_layer"),
            r.num("cells_before"),
            r.num("cells_after"),
            r.num("log_problems"),
            r.get("answer")
        );
        let want = if reads_queries { r.num("n_layer") } else { 0.0 };
        assert_eq!(r.num("capture_layers"), want, "{method}: layers captured");
        assert!(
            r.num("cells_after") < r.num("cells_before"),
            "{method}: evicted"
        );
        assert_eq!(r.num("log_problems"), 0.0, "{method}: warnings or errors");
    }
    for (method, reads_queries) in [("laprox-span", true), ("uniqueness", false)] {
        let r = needle_with(
            &s,
            &common,
            &[
                "--kv-evict",
                method,
                "--kv-max-cells",
                "64",
                "--kv-evict-to",
                "0.75",
                "-ub",
                "5",
            ],
        );
        println!(
            "{method} under --kv-max-cells 64, -ub 5: {} of {} layers captured, {} evictions, most held {}, \
             log problems {}, answer {:?}",
            r.num("capture_layers"),
            r.num("n_layer"),
            r.num("evictions"),
            r.num("most_held"),
            r.num("log_problems"),
            r.get("answer")
        );
        let want = if reads_queries { r.num("n_layer") } else { 0.0 };
        assert_eq!(r.num("capture_layers"), want, "{method}: layers captured");
        assert_eq!(r.num("n_ubatch"), 5.0);
        // (ubatches of 5 from 48 cells: 63 held at most)
        assert!(
            r.num("most_held") <= 64.0 && r.num("most_held") > 64.0 - 5.0,
            "{method}: the budget is reached and never passed: {}",
            r.num("most_held")
        );
        // (prompt - 64) / 16 cells to free at 16 per eviction, at least
        assert!(
            r.num("evictions") >= ((r.num("prompt") - 64.0) / 16.0).floor(),
            "{method}: {} evictions",
            r.num("evictions")
        );
        assert_eq!(r.num("log_problems"), 0.0, "{method}: warnings or errors");
    }
}

/// llama-kvevict-needle -v with libllama from `lib` (LD_LIBRARY_PATH goes ahead of the binary's
/// RUNPATH) and the device path forced or not: (RESULT row if it ran, stderr, success).
fn needle_path(
    s: &Setup,
    lib: Option<&Path>,
    device: bool,
    args: &[&str],
) -> (Option<Row>, String, bool) {
    let mut c = Command::new(s.bin.join("llama-kvevict-needle"));
    c.arg("-m").arg(&s.model).args(args).arg("-v");
    if let Some(lib) = lib {
        c.env("LD_LIBRARY_PATH", lib);
    }
    if device {
        c.env("KVEVICT_FORK_DEVICE_PATH", "1");
    } else {
        c.env_remove("KVEVICT_FORK_DEVICE_PATH");
    }
    let o = c.output().expect("run llama-kvevict-needle");
    let row = String::from_utf8_lossy(&o.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("RESULT ").map(Row::parse));
    (
        row,
        String::from_utf8_lossy(&o.stderr).to_string(),
        o.status.success(),
    )
}

/// The device path (`kve_cuda_*` scoring into device workspaces, device selection, device
/// compaction of the K/V rows) against the host path, on the cuda-emu relink of libllama:
/// byte-identical compacted state files (same kept cells, same rows moved, same cell metadata)
/// and the same answers, flash attention off (V transposed) and on.
/// The cuda-emu relink of libllama (`KVEVICT_FORK_EMU_LIB`, llama_fork/cuda_emu.sh), or None
/// with a printed line (a failure under `KVEVICT_FORK_REQUIRED=1`).
fn emu_lib(test: &str) -> Option<PathBuf> {
    let Some(lib) = std::env::var_os("KVEVICT_FORK_EMU_LIB").map(PathBuf::from) else {
        assert!(
            std::env::var("KVEVICT_FORK_REQUIRED").map_or(true, |v| v != "1"),
            "KVEVICT_FORK_EMU_LIB is not set (llama_fork/cuda_emu.sh prints it)"
        );
        eprintln!("SKIPPED {test}: set KVEVICT_FORK_EMU_LIB (llama_fork/cuda_emu.sh)");
        return None;
    };
    assert!(
        lib.join("libllama.so.0").is_file(),
        "no libllama.so.0 in {lib:?}"
    );
    Some(lib)
}

/// The fork's build and the cuda-emu relink, or None (skipped, see `setup` and `emu_lib`).
fn setup_with_emu(test: &str) -> Option<(Setup, PathBuf)> {
    let s = setup()?;
    Some((s, emu_lib(test)?))
}

#[test]
fn device_path_on_the_emulator_matches_the_host_path() {
    let Some((s, lib)) = setup_with_emu("device_path_on_the_emulator_matches_the_host_path") else {
        return;
    };
    let mut table = String::from(
        "flash depth | method       | cells      | host answer | device answer | state files\n",
    );
    // LaProx-span on every prompt with V transposed (flash off: the strided layout), one prompt
    // with V rows (flash on); both: LAVa (values read) and uniqueness (agnostic: no queries)
    let mut cases: Vec<(&str, &str, &str, &str)> = PROMPTS
        .iter()
        .map(|&(d, sd)| ("off", "laprox-span", d, sd))
        .collect();
    for flash in ["off", "on"] {
        if flash == "on" {
            cases.push((flash, "laprox-span", "0.5", "5"));
        }
        cases.extend([
            (flash, "lava", "0.5", "5"),
            (flash, "uniqueness", "0.5", "5"),
        ]);
    }
    for &(flash, method, depth, seed) in &cases {
        let extra: &[&str] = if method == "uniqueness" {
            &["--agnostic"]
        } else {
            &[]
        };
        let (h, d, _) = host_and_device(&s, &lib, flash, method, (depth, seed, "0.1"), extra);
        table += &format!(
            "{flash:>5} {depth:>5} | {method:<12} | {:>4} -> {:<3} | {:?} | {:?} | identical\n",
            h.get("cells_before"),
            h.get("cells_after"),
            h.get("answer"),
            d.get("answer"),
        );
        if method == "laprox-span" {
            assert_eq!(
                d.num("recovered"),
                1.0,
                "device path, flash {flash} depth {depth}: {:?}",
                d.get("answer")
            );
        }
    }
    println!("{table}");
}

/// One needle prompt on the host path and on the device path of the cuda-emu relink, each
/// saving its compacted state: asserts that both ran on the path asked for (the log line of
/// `llama_kv_evictor::evict` names it), gave the same cells, n_kv and answers, and wrote
/// byte-identical state files (same kept cells, same rows moved, same cell metadata); returns
/// the host's and the device's RESULT rows and the (common) state file.
fn host_and_device(
    s: &Setup,
    lib: &Path,
    flash: &str,
    method: &str,
    (depth, seed, keep): (&str, &str, &str),
    extra: &[&str],
) -> (Row, Row, Vec<u8>) {
    let dir = std::env::temp_dir();
    let mut files = Vec::new();
    let mut rows = Vec::new();
    for device in [false, true] {
        let path = dir.join(format!("kvevict-dev-{}-{device}.bin", std::process::id()));
        let path_str = path.to_str().unwrap().to_string();
        let mut args = vec![
            "--needle",
            depth,
            "--seed",
            seed,
            "--flash-attn",
            flash,
            "--kv-evict",
            method,
            "--kv-keep",
            keep,
            "--state-file",
            &path_str,
        ];
        args.extend_from_slice(extra);
        let (row, err, ok) = needle_path(s, Some(lib), device, &args);
        let tail: String = err.lines().rev().take(5).collect::<Vec<_>>().join("\n");
        assert!(
            ok,
            "{method} {extra:?} flash {flash} depth {depth} device {device} failed:\n{tail}"
        );
        let tag = if device {
            "device path, kve_cuda_*"
        } else {
            "host path, kve_*"
        };
        assert!(
            err.contains(tag),
            "{method} device {device}: no {tag:?} in the log"
        );
        files.push(std::fs::read(&path).unwrap());
        remove_state_files(&path_str);
        rows.push(row.expect("a RESULT line"));
    }
    let (h, d) = (&rows[0], &rows[1]);
    for k in [
        "cells_before",
        "cells_after",
        "evicted",
        "n_kv_after",
        "answer",
        "reload_answer",
    ] {
        assert_eq!(
            h.get(k),
            d.get(k),
            "{method} {extra:?} flash {flash} depth {depth}: {k}"
        );
    }
    assert!(
        files[0] == files[1],
        "{method} {extra:?} flash {flash} depth {depth}: the compacted state files differ"
    );
    let d = rows.pop().unwrap();
    (rows.pop().unwrap(), d, files.pop().unwrap())
}

/// Forced onto the device path, a libllama whose kvevict has no CUDA refuses the eviction with a
/// clear message (the tool then stops), and the host path of the same binary still runs.
/// A ~1000-token prompt (context and question) through ONE `llama_decode` call under a 256-cell
/// budget (`llama-kvevict-needle --kv-max-cells`): libllama places it ubatch by ubatch, evicting
/// between them, so the cache is allocated for the budget alone (not budget + batch) and never
/// holds more than the budget; n_ubatch is capped to what an eviction to 0.75 frees (64), also
/// from the default 512. Host and device path (cuda-emu), flash attention off and on, evict
/// the same cells and answer the same; with a budget above the prompt (no eviction) the
/// ubatch-by-ubatch placement answers the needle like the full cache.
#[test]
fn a_prompt_longer_than_the_budget_streams_through_one_decode() {
    let Some(s) = setup() else {
        return;
    };
    const BUDGET: f64 = 256.0;
    let lib = emu_lib("a_prompt_longer_than_the_budget_streams_through_one_decode");
    let common = ["--needle", "0.5", "--seed", "5", "-n", "8", "-t", "2"];
    let mut rows = Vec::new();
    for (flash, ub) in [("off", Some("64")), ("on", None)] {
        let mut args = [
            &common[..],
            &["--kv-max-cells", "256", "--flash-attn", flash],
        ]
        .concat();
        if let Some(ub) = ub {
            args.extend(["-ub", ub]);
        }
        let paths: &[bool] = if lib.is_some() {
            &[false, true]
        } else {
            &[false]
        };
        for &device in paths {
            let (row, err, ok) = needle_path(&s, lib.as_deref().filter(|_| device), device, &args);
            let r = row
                .filter(|_| ok)
                .unwrap_or_else(|| panic!("{args:?} device {device} failed:\n{err}"));
            println!(
                "budget 256, flash {flash}, -ub {}, {} path: prompt {} tokens in one decode, n_ubatch {}, allocated {} cells, \
                 most held {}, {} evictions, {} cells at the end, answer {:?}",
                ub.unwrap_or("512 (default)"),
                if device { "device" } else { "host" },
                r.num("prompt"),
                r.num("n_ubatch"),
                r.num("alloc_cells"),
                r.num("most_held"),
                r.num("evictions"),
                r.num("cells_end"),
                r.get("answer")
            );
            assert!(
                r.num("prompt") > 3.0 * BUDGET,
                "the prompt must be far longer than the budget"
            );
            assert_eq!(
                r.num("n_ubatch"),
                64.0,
                "n_ubatch capped to what an eviction frees"
            );
            assert_eq!(
                r.num("alloc_cells"),
                BUDGET,
                "KV cells allocated: the budget alone"
            );
            assert_eq!(
                r.num("most_held"),
                BUDGET,
                "the budget is reached and never passed"
            );
            assert!(r.num("cells_end") <= BUDGET);
            // (prompt - budget) / 64 cells to free at 64 per eviction, at least
            assert!(r.num("evictions") >= ((r.num("prompt") - BUDGET) / 64.0).floor());
            assert_eq!(
                r.num("log_problems"),
                0.0,
                "warnings or errors logged:\n{err}"
            );
            assert_eq!(
                r.num("device_evictions"),
                if device { r.num("evictions") } else { 0.0 },
                "path taken:\n{err}"
            );
            rows.push(r);
        }
    }
    // the host and device paths keep the same cells: same evictions, cells and answer
    for pair in rows.chunks(2).filter(|p| p.len() == 2) {
        for k in ["evictions", "cells_end", "answer"] {
            assert_eq!(pair[0].get(k), pair[1].get(k), "host vs device path: {k}");
        }
    }
    // placed ubatch by ubatch but nothing evicted (budget above the prompt): the full cache's answer
    let r = needle(
        &s,
        &[&common[..], &["--kv-max-cells", "2048", "-ub", "64"]].concat(),
    );
    println!(
        "budget 2048 (above the prompt), -ub 64: {} evictions, most held {}, answer {:?} ({})",
        r.num("evictions"),
        r.num("most_held"),
        r.get("answer"),
        r.verdict()
    );
    assert_eq!(r.num("evictions"), 0.0);
    assert!(
        r.num("correct") == 1.0,
        "needle lost without eviction: {:?}",
        r.get("answer")
    );
}

#[test]
fn device_path_without_cuda_is_refused() {
    let Some(s) = setup() else {
        return;
    };
    let args = [
        "--needle",
        "0.3",
        "--seed",
        "3",
        "--kv-evict",
        "laprox-span",
        "--kv-keep",
        "0.1",
    ];
    let (row, err, ok) = needle_path(&s, None, true, &args);
    assert!(
        !ok && row.is_none(),
        "the device path ran without CUDA in kvevict"
    );
    assert!(
        err.contains("kvevict was built without CUDA") && err.contains("llama_kv_evict failed"),
        "no clear refusal in:\n{}",
        err.lines().rev().take(5).collect::<Vec<_>>().join("\n")
    );
    // the host path of the same binary works
    let (row, _, ok) = needle_path(&s, None, false, &args);
    assert!(ok && row.is_some_and(|r| r.num("cells_after") > 0.0));
}

fn refused(s: &Setup, exe: &str, args: &[&str], message: &str) {
    let o = Command::new(s.bin.join(exe))
        .arg("-m")
        .arg(&s.model)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {exe}: {e}"));
    let err = String::from_utf8_lossy(&o.stderr).to_string() + &String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success(), "{exe} {args:?} was accepted");
    assert!(
        err.contains(message),
        "{exe} {args:?}: no {message:?} in:\n{err}"
    );
}

#[test]
fn bad_eviction_settings_are_refused_at_startup() {
    let Some(s) = setup() else {
        return;
    };
    for exe in ["llama-cli", "llama-server"] {
        refused(
            &s,
            exe,
            &["--kv-evict", "bogus"],
            "unknown --kv-evict method 'bogus'",
        );
        refused(
            &s,
            exe,
            &["--kv-keep", "1.5"],
            "--kv-keep must be in (0, 1]",
        );
        refused(&s, exe, &["--kv-keep", "0"], "--kv-keep must be in (0, 1]");
        refused(
            &s,
            exe,
            &["--kv-keep", "nan"],
            "--kv-keep must be in (0, 1]",
        );
        refused(
            &s,
            exe,
            &["--kv-max-cells", "8"],
            "budget must be larger than the observation window",
        );
        refused(
            &s,
            exe,
            &[
                "--kv-max-cells",
                "10",
                "--kv-window",
                "4",
                "--kv-evict-to",
                "0.3",
            ],
            "must exceed the observation window",
        );
        refused(
            &s,
            exe,
            &["--kv-max-cells", "256", "--kv-evict-to", "1"],
            "evict-to fraction must be in (0, 1)",
        );
        // value links: a threshold that is a number <= 1, a method with a forward post-pool
        for bad in ["nan", "1.5", "inf"] {
            refused(
                &s,
                exe,
                &["--kv-keep", "0.1", "--kv-evict-links", bad],
                "value-link threshold must be a number <= 1",
            );
        }
        for method in ["snapkv", "streamingllm", "lava"] {
            refused(
                &s,
                exe,
                &[
                    "--kv-evict",
                    method,
                    "--kv-keep",
                    "0.1",
                    "--kv-evict-links",
                    "0.5",
                ],
                "value links need a method whose selection has a forward post-pool",
            );
        }
        refused(
            &s,
            exe,
            &["--kv-evict-links", "0.5"],
            "value links need eviction",
        );
    }
    // the needle tool checks the same way before loading anything
    refused(
        &s,
        "llama-kvevict-needle",
        &["--kv-evict", "knorm", "--kv-evict-links", "0.5"],
        "value links need a method whose selection has a forward post-pool",
    );
    refused(
        &s,
        "llama-kvevict-needle",
        &["--kv-evict-links", "nan"],
        "value-link threshold must be a number <= 1",
    );
}

/// Value links (`--kv-evict-links 0.5`, kvevict's `kve_select_model_linked`) at 2.5 % keep with
/// 7-digit keys (`--key-digits 7`), LaProx-span, flash attention off: 990 cells -> 24, of which the
/// window takes 8. Without links the forward post-pool's fixed kernel cuts the key's last digits
/// (the numpy eval's finding, 0/19 there); with links the run continues through the digits.
#[test]
fn value_links_keep_a_seven_digit_key() {
    let Some(s) = setup() else {
        return;
    };
    let (mut with, mut without) = (0, 0);
    let mut table = String::from("depth | without links | with links (0.5)\n");
    for &(depth, seed) in &PROMPTS[..3] {
        let common = [
            "--needle",
            depth,
            "--seed",
            seed,
            "--key-digits",
            "7",
            "--kv-evict",
            "laprox-span",
            "--kv-keep",
            "0.025",
        ];
        let plain = needle_with(&s, &common, &[]);
        let linked = needle_with(&s, &common, &["--kv-evict-links", "0.5"]);
        assert_eq!(plain.get("key").len(), 7, "a 7-digit key");
        assert_eq!(linked.num("links"), 0.5);
        assert_eq!(
            linked.num("cells_after"),
            plain.num("cells_after"),
            "links change which cells are kept, not how many"
        );
        without += (plain.num("correct") == 1.0) as i32;
        with += (linked.num("correct") == 1.0) as i32;
        table += &format!(
            "{depth} | {:?} | {:?} (key {})\n",
            plain.get("answer"),
            linked.get("answer"),
            plain.get("key")
        );
    }
    println!("{table}with links {with}/3, without {without}/3");
    assert_eq!(with, 3, "value links lost a 7-digit key:\n{table}");
    assert!(with > without, "links changed no answer:\n{table}");
}

/// Value links on the device path (`kve_cuda_accumulate_value_links` per layer into device
/// sums, `kve_cuda_select_model_linked`) against the host path (`kve_accumulate_value_links`,
/// `kve_select_model_linked`) on the cuda-emu relink, on a prompt where the links change the
/// kept cells (a 7-digit key at 2.5 %, as `value_links_keep_a_seven_digit_key`): LaProx-span with
/// V transposed (flash off) and V rows (flash on), uniqueness question-agnostic; byte-identical
/// compacted states (the same kept cells), same cells and answers, the key kept whole; and the
/// state without links differs (so a path ignoring the links would fail here).
#[test]
fn value_links_on_the_device_path_match_the_host_path() {
    let Some((s, lib)) = setup_with_emu("value_links_on_the_device_path_match_the_host_path")
    else {
        return;
    };
    let prompt = ("0.5", "5", "0.025");
    let linked = ["--key-digits", "7", "--kv-evict-links", "0.5"];
    let agnostic = ["--key-digits", "7", "--kv-evict-links", "0.5", "--agnostic"];
    let mut states = Vec::new();
    for (flash, method, extra) in [
        ("off", "laprox-span", &linked[..]),
        ("on", "laprox-span", &linked[..]),
        ("off", "uniqueness", &agnostic[..]),
    ] {
        let (h, d, state) = host_and_device(&s, &lib, flash, method, prompt, extra);
        assert!(h.num("links") == 0.5 && d.num("links") == 0.5);
        println!(
            "links 0.5, {method} flash {flash}: {} -> {} cells, host {:?}, device {:?}, identical states",
            h.get("cells_before"),
            h.get("cells_after"),
            h.get("answer"),
            d.get("answer")
        );
        if method == "laprox-span" {
            assert_eq!(
                d.num("recovered"),
                1.0,
                "flash {flash}: {:?}",
                d.get("answer")
            );
        }
        states.push(state);
    }
    let (h, _, plain) = host_and_device(&s, &lib, "off", "laprox-span", prompt, &linked[..2]);
    println!(
        "without links, laprox-span flash off: {:?}",
        h.get("answer")
    );
    assert!(plain != states[0], "the links changed no kept cell");
}

/// A sequence state with more cells than `--kv-max-cells` (the uncompressed prompt's state file,
/// ~990 cells) loaded into a context with a 256-cell budget: evicted to 0.75 x 256 = 192 cells as
/// it is read, scored question-agnostically on the state's own K/V bytes (V transposed with
/// flash attention off, token rows with it on), then the question answered on what was kept. A
/// state within the budget is restored whole.
#[test]
fn a_state_larger_than_the_budget_is_evicted_on_restore() {
    let Some(s) = setup() else {
        return;
    };
    let dir = std::env::temp_dir();
    let mut lines = Vec::new();
    for (flash, budget) in [("off", "256"), ("on", "256"), ("off", "2048")] {
        let path = dir.join(format!(
            "kvevict-restore-{}-{flash}-{budget}.bin",
            std::process::id()
        ));
        let path_str = path.to_str().unwrap().to_string();
        let r = needle(
            &s,
            &[
                "--needle",
                "0.5",
                "--seed",
                "5",
                "--flash-attn",
                flash,
                "--kv-keep",
                "0.1",
                "--state-file",
                &path_str,
                "--restore-max-cells",
                budget,
            ],
        );
        remove_state_files(&path_str);
        let (cells, restored) = (r.num("cells_before"), r.num("restore_cells"));
        lines.push(format!(
            "flash {flash}, --kv-max-cells {budget}: state of {cells} cells restored as {restored} ({} evicted); answer {:?} (full cache before compression: key {})",
            r.num("restore_evicted"),
            r.get("restore_answer"),
            r.get("key"),
        ));
        if budget == "256" {
            assert!(cells > 256.0, "the state must exceed the budget");
            assert_eq!(restored, (256.0f64 * 0.75).floor(), "cells after restore");
            assert_eq!(r.num("restore_evicted"), cells - restored);
        } else {
            assert_eq!(
                restored, cells,
                "a state within the budget is restored whole"
            );
            assert_eq!(r.num("restore_evicted"), 0.0);
        }
        assert_eq!(
            r.num("restore_correct"),
            1.0,
            "flash {flash} budget {budget}: restored state answered {:?}, key {}",
            r.get("restore_answer"),
            r.get("key")
        );
    }
    println!("{}", lines.join("\n"));
}

/// The files `--state-file PATH` leaves: PATH, PATH.full, PATH.txt and (with `--restore-max-cells`)
/// PATH.restored.
fn remove_state_files(path: &str) {
    for suffix in ["", ".full", ".txt", ".restored"] {
        let _ = std::fs::remove_file(format!("{path}{suffix}"));
    }
}

/// The restore path (a state over the budget evicted as it is read) keeps exactly the cells a
/// one-shot eviction of the same prefilled sequence keeps: question-agnostic `uniqueness` to 192
/// cells both ways in one run (`llama_kv_evict_to` on the live cache, and its uncompressed state
/// restored under `--kv-max-cells 256 --kv-evict-to 0.75`), on the repetitive filler
/// (`--filler 6,6,5,4`) where a restored slot lost the key: the two sequence state files are
/// byte-identical (same cells, same order, same K/V rows), with flash attention off (V transposed)
/// and on, and the answers are the same. (Where the key is lost there, the one-shot eviction loses
/// it too: the method, see llama_fork/README.md.)
#[test]
fn the_restore_keeps_the_cells_of_a_one_shot_eviction() {
    let Some(s) = setup() else {
        return;
    };
    for flash in ["off", "on"] {
        let path = std::env::temp_dir().join(format!(
            "kvevict-restore-vs-oneshot-{}-{flash}.bin",
            std::process::id()
        ));
        let path_str = path.to_str().unwrap().to_string();
        let r = needle(
            &s,
            &[
                "--needle",
                "0.5",
                "--seed",
                "5",
                "--ctx-tokens",
                "500",
                "--filler",
                "6,6,5,4",
                "--agnostic",
                "--flash-attn",
                flash,
                "--kv-evict",
                "uniqueness",
                "--kv-keep-cells",
                "192",
                "--state-file",
                &path_str,
                "--restore-max-cells",
                "256",
                "--kv-evict-to",
                "0.75",
            ],
        );
        let one_shot = std::fs::read(&path).unwrap();
        let restored = std::fs::read(format!("{path_str}.restored")).unwrap();
        remove_state_files(&path_str);
        println!(
            "flash {flash}: {} cells -> one-shot {}, restored {} ({} bytes each, identical {}); answers {:?} / {:?}",
            r.num("cells_before"),
            r.num("cells_after"),
            r.num("restore_cells"),
            one_shot.len(),
            one_shot == restored,
            r.get("answer"),
            r.get("restore_answer")
        );
        assert!(
            r.num("cells_before") > 256.0,
            "the state must exceed the budget"
        );
        assert_eq!(r.num("cells_after"), 192.0);
        assert_eq!(r.num("restore_cells"), 192.0);
        assert!(
            one_shot == restored,
            "flash {flash}: the restored sequence differs from the one-shot eviction's"
        );
        assert_eq!(r.get("answer"), r.get("restore_answer"));
    }
}

fn json_escape(s: &str) -> String {
    let mut o = String::new();
    for c in s.chars() {
        match c {
            '"' => o += "\\\"",
            '\\' => o += "\\\\",
            '\n' => o += "\\n",
            c if (c as u32) < 0x20 => o += &format!("\\u{:04x}", c as u32),
            c => o.push(c),
        }
    }
    o
}

/// The first string value of `key` in a JSON text (enough for the server's answers).
fn json_string(text: &str, key: &str) -> Option<String> {
    let at = text.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let mut out = String::new();
    let mut it = text[at..].chars();
    while let Some(c) = it.next() {
        match c {
            '"' => return Some(out),
            '\\' => match it.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'u' => {
                    let h: String = it.by_ref().take(4).collect();
                    out.push(char::from_u32(u32::from_str_radix(&h, 16).ok()?).unwrap_or('?'));
                }
                c => out.push(c),
            },
            c => out.push(c),
        }
    }
    None
}

/// One HTTP/1.1 request on loopback: (status, body).
fn http(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(600)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((
        status,
        text.split_once("\r\n\r\n")
            .map(|x| x.1.to_string())
            .unwrap_or_default(),
    ))
}

/// (MiB, cells) of the KV cache from llama.cpp's log line
/// `llama_kv_cache: size =    7.03 MiB (   320 cells, 30 layers, ...`.
fn kv_allocation(log: &str) -> (f64, u32) {
    let line = log
        .lines()
        .find(|l| l.contains("llama_kv_cache: size ="))
        .unwrap_or_else(|| panic!("no KV allocation logged:\n{log}"));
    let mib = line
        .split("size =")
        .nth(1)
        .unwrap()
        .split("MiB")
        .next()
        .unwrap();
    let cells = line
        .split('(')
        .nth(1)
        .unwrap()
        .split("cells")
        .next()
        .unwrap();
    (mib.trim().parse().unwrap(), cells.trim().parse().unwrap())
}

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `llama-server` on a free loopback port with one slot, `args` added, libllama's info lines
/// logged (`-lv 4`: each eviction logs one) to a temporary file; returns once `/health`
/// answers 200 (the server is killed when the handle drops).
fn start_server(s: &Setup, name: &str, args: &[&str]) -> (Server, u16, PathBuf) {
    start_server_with(s, name, args, Some("1"), true)
}

/// `start_server` with `-np` given (`None`: llama-server's default, 4 slots in a unified cache)
/// and libllama's info lines logged or not (`trace`: `-lv 4`; else llama-server's default
/// verbosity, what a user sees).
fn start_server_with(
    s: &Setup,
    name: &str,
    args: &[&str],
    np: Option<&str>,
    trace: bool,
) -> (Server, u16, PathBuf) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log_path = std::env::temp_dir().join(format!(
        "kvevict-llama-server-{name}-{}.log",
        std::process::id()
    ));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut server = Server(
        Command::new(s.bin.join("llama-server"))
            .arg("-m")
            .arg(&s.model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(np.map(|n| ["-np", n]).iter().flatten())
            .args(args)
            .args(if trace { &["-lv", "4"][..] } else { &[][..] })
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start llama-server"),
    );
    let t0 = std::time::Instant::now();
    loop {
        if let Ok((200, _)) = http(port, "GET", "/health", "") {
            break;
        }
        if let Ok(Some(status)) = server.0.try_wait() {
            panic!(
                "llama-server exited ({status}):\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        assert!(
            t0.elapsed().as_secs() < 300,
            "llama-server did not come up:\n{}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    (server, port, log_path)
}

#[test]
fn server_holds_a_cell_budget_over_a_long_conversation() {
    let Some(s) = setup() else {
        return;
    };
    const BUDGET: u32 = 256;
    // a 4096-token context (positions keep growing) whose sequence may hold at most BUDGET cells,
    // with llama-server's default -b (2048) and -ub (512): libllama places a batch ubatch by ubatch,
    // evicting between them, and caps n_ubatch to the 64 cells an eviction to 0.75 * BUDGET frees,
    // so the cache allocates BUDGET cells, not BUDGET + n_batch (2304) or BUDGET + n_ubatch
    let budget = BUDGET.to_string();
    let (_server, port, log_path) = start_server(
        &s,
        "conversation",
        &[
            "-c",
            "4096",
            "-t",
            "2",
            "--kv-evict",
            "laprox-span",
            "--kv-max-cells",
            &budget,
            "--kv-evict-to",
            "0.75",
        ],
    );
    let t0 = std::time::Instant::now();

    let topics = [
        "the moon",
        "rivers",
        "bread",
        "owls",
        "glaciers",
        "violins",
        "deserts",
        "bees",
        "lighthouses",
        "tea",
        "volcanoes",
        "chess",
        "maps",
        "whales",
        "clocks",
        "forests",
        "bridges",
        "salt",
        "comets",
        "gardens",
        // more, for when the answers come out short: the conversation goes on until its
        // history is 4x the budget (the model's answers set its length, not the test)
        "harbours",
        "kites",
        "canyons",
        "pianos",
        "lanterns",
        "coral reefs",
        "windmills",
        "honey",
        "glass",
        "trains",
    ];
    const MIN_TURNS: usize = 20;
    let mut messages = vec![(
        "user".to_string(),
        "My name is Alice and my favourite colour is green. Please remember that.".to_string(),
    )];
    let mut errors = Vec::new();
    // the last request's prompt_tokens: the whole conversation (a Cell: the turn closure sets it)
    let history = std::cell::Cell::new(0.0f64);
    let turn = |messages: &mut Vec<(String, String)>, errors: &mut Vec<String>| -> String {
        let body = format!(
            "{{\"messages\":[{}],\"max_tokens\":64,\"temperature\":0}}",
            messages
                .iter()
                .map(|(r, c)| format!("{{\"role\":\"{r}\",\"content\":\"{}\"}}", json_escape(c)))
                .collect::<Vec<_>>()
                .join(",")
        );
        match http(port, "POST", "/v1/chat/completions", &body) {
            Ok((200, b)) => {
                let answer = json_string(&b[b.find("\"message\"").unwrap_or(0)..], "content")
                    .unwrap_or_default();
                if let Some(p) = b.find("\"prompt_tokens\":") {
                    let n: String = b[p + 16..]
                        .chars()
                        .take_while(|c| c.is_ascii_digit())
                        .collect();
                    history.set(n.parse().unwrap_or(0.0));
                }
                if answer.is_empty() {
                    errors.push(format!("turn {}: empty answer: {b}", messages.len()));
                }
                answer
            }
            other => {
                errors.push(format!("turn {}: {other:?}", messages.len()));
                String::new()
            }
        }
    };
    let first = turn(&mut messages, &mut errors);
    messages.push(("assistant".into(), first));
    let mut turns = 1;
    for (i, t) in topics.iter().enumerate() {
        if i >= MIN_TURNS && history.get() >= 4.0 * BUDGET as f64 {
            break;
        }
        if i == MIN_TURNS / 2 {
            // a malformed request gets its error, and the session goes on
            let (status, _) =
                http(port, "POST", "/completion", "{\"prompt\": ").expect("malformed request");
            assert!(
                (400..500).contains(&status) || status == 500,
                "malformed request answered {status}"
            );
        }
        messages.push((
            "user".into(),
            format!("Tell me two facts about {t}, in two sentences."),
        ));
        let a = turn(&mut messages, &mut errors);
        messages.push(("assistant".into(), a));
        turns += 1;
    }
    messages.push(("user".into(), "What is my favourite colour?".into()));
    let last = turn(&mut messages, &mut errors);
    let secs = t0.elapsed().as_secs_f64();
    let history_tokens = history.get();

    let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
    // every eviction ("evict: seq 0: 256 -> 192 cells, ...") and every new high of the cells held
    // after placing a ubatch ("place: seq 0: 256 cells with this ubatch ...") name the most cells held
    let held_lines: Vec<&str> = log_text
        .lines()
        .filter(|l| l.contains("most cells held"))
        .collect();
    let evictions: Vec<&str> = held_lines
        .iter()
        .copied()
        .filter(|l| l.contains("evict: seq "))
        .collect();
    // "... most cells held N; host path, kve_*)" / "... most cells held N)": the digits after the label
    let most = |l: &str| -> u32 {
        let tail = l.rsplit("most cells held ").next().unwrap();
        let digits: String = tail.chars().take_while(|c| c.is_ascii_digit()).collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("no cell count in {l:?}"))
    };
    let held = held_lines.iter().map(|l| most(l)).max().unwrap_or(0);
    let kv_bytes_per_cell = 30 * 2 * 192 * 2; // SmolLM2: layers x (K, V) x n_embd_k_gqa x f16
                                              // the allocation llama.cpp logs: "llama_kv_cache: size =    7.03 MiB (   320 cells, ..."
    let (alloc_mib, alloc_cells) = kv_allocation(&log_text);
    println!(
        "llama-server (default -b 2048 -ub 512), {} turns over /v1/chat/completions in {secs:.1} s: history {history_tokens} tokens, budget {BUDGET} cells \
         (cells in use: {:.1} MiB of f16 K+V at most, against {:.1} MiB for the whole history; allocated {alloc_cells} cells, \
         {alloc_mib:.2} MiB, against {:.1} MiB for -c 4096), {} evictions, most cells held {held}; last answer {last:?} (green recalled: {})",
        turns + 1,
        (BUDGET * kv_bytes_per_cell) as f64 / 1048576.0,
        history_tokens * kv_bytes_per_cell as f64 / 1048576.0,
        (4096 * kv_bytes_per_cell) as f64 / 1048576.0,
        evictions.len(),
        last.to_lowercase().contains("green")
    );
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(
        history_tokens >= 4.0 * BUDGET as f64,
        "the conversation ({history_tokens} tokens) must be 4x the budget"
    );
    assert!(!evictions.is_empty(), "no eviction logged:\n{log_text}");
    assert!(
        held <= BUDGET,
        "a sequence held {held} cells, budget {BUDGET}"
    );
    assert!(
        held_lines.len() > evictions.len(),
        "no ubatch placement logged:\n{log_text}"
    );
    assert!(
        log_text.contains("n_ubatch 512 -> 64"),
        "n_ubatch not capped:\n{log_text}"
    );
    // memory really freed: with the default -b 2048 -ub 512 the cache is allocated for the budget
    // alone, not -c, not the budget plus a batch
    assert_allocated(&log_text, BUDGET, BUDGET * kv_bytes_per_cell);
    let _ = std::fs::remove_file(&log_path);
}

/// The KV allocation llama.cpp logged (`kv_allocation`) is `cells` cells (per stream) of `bytes`
/// bytes in all.
fn assert_allocated(log: &str, cells: u32, bytes: u32) {
    let (alloc_mib, alloc_cells) = kv_allocation(log);
    assert_eq!(alloc_cells, cells, "KV cells allocated (per stream)");
    let bound_mib = bytes as f64 / 1048576.0;
    assert!(
        (alloc_mib - bound_mib).abs() < 0.01,
        "KV allocation {alloc_mib} MiB, expected {bound_mib:.2} MiB"
    );
}

#[test]
fn cli_compresses_once_after_the_prompt() {
    let Some(s) = setup() else {
        return;
    };
    // a ~450-token prompt; --kv-keep 0.1: when the first answer token is decoded, the prompt's
    // cells are compressed to 10% (libllama logs it at verbosity 4)
    let sentences = [
        "The old miller walked past the tall lighthouse.",
        "A curious child remembered the apple orchard.",
    ];
    let mut prompt: String = (0..40)
        .map(|i| sentences[i % 2])
        .collect::<Vec<_>>()
        .join(" ");
    prompt += " The pass key is 46860. Remember it. What is the pass key?";
    let o = Command::new(s.bin.join("llama-cli"))
        .arg("-m")
        .arg(&s.model)
        .args([
            "-p",
            &prompt,
            "-n",
            "8",
            "-st",
            "-t",
            "2",
            "--kv-keep",
            "0.1",
            "-lv",
            "4",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run llama-cli");
    let log = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "llama-cli failed ({}):\n{log}",
        o.status
    );
    let line = log
        .lines()
        .find(|l| l.contains("evict: seq 0: "))
        .unwrap_or_else(|| panic!("no eviction logged:\n{log}"));
    let cells: Vec<f64> = line
        .split("seq 0: ")
        .nth(1)
        .unwrap()
        .split(" cells")
        .next()
        .unwrap()
        .split(" -> ")
        .map(|v| v.trim().parse().unwrap())
        .collect();
    println!("llama-cli --kv-keep 0.1: {line}");
    assert_eq!(
        log.matches("evict: seq 0: ").count(),
        1,
        "one-shot: one eviction"
    );
    // the library's keep ratio: floor(0.1 · new cells), never below its 64-cell floor (min_keep)
    let want = (cells[0] * 0.1).floor().max(64.0).min(cells[0]);
    assert_eq!(cells[1], want, "cells kept");
}

/// A needle context in llama-kvevict-needle's filler grammar and splitmix64 stream (its key for
/// the same seed): 56 sentences (~670 tokens), the pass-key sentence in the middle. Returns
/// (context, key).
fn needle_context(seed: u32) -> (String, String) {
    const SUBJECTS: [&str; 16] = [
        "The old miller",
        "A curious child",
        "The night watchman",
        "The young painter",
        "A quiet traveller",
        "The river pilot",
        "A clever merchant",
        "The village baker",
        "The tired soldier",
        "A wandering poet",
        "The shepherd",
        "The ship's cook",
        "An elderly teacher",
        "The blacksmith",
        "A stranger in a grey coat",
        "The innkeeper",
    ];
    const VERBS: [&str; 16] = [
        "walked past",
        "remembered",
        "painted",
        "looked at",
        "dreamed of",
        "sang about",
        "repaired",
        "visited",
        "waited beside",
        "talked about",
        "cleaned",
        "wrote a letter about",
        "searched for",
        "admired",
        "forgot about",
        "returned to",
    ];
    const OBJECTS: [&str; 16] = [
        "the tall lighthouse",
        "the apple orchard",
        "the narrow harbour",
        "the green hills",
        "the dusty road",
        "the sleepy town",
        "the northern forest",
        "the stone bridge",
        "the quiet library",
        "the windy meadow",
        "the frozen lake",
        "the crowded market",
        "the old chapel",
        "the red barn",
        "the broken mill",
        "the silver river",
    ];
    const TAILS: [&str; 12] = [
        "on a cold evening",
        "in the early morning",
        "before the storm",
        "after a long day",
        "without saying a word",
        "with great patience",
        "during the festival",
        "under a grey sky",
        "while the bells rang",
        "for the last time",
        "as the sun went down",
        "in the spring rain",
    ];
    const SHORT: [&str; 8] = [
        "Life went on as usual.",
        "Nobody seemed to notice.",
        "The air smelled of rain.",
        "The story was told many times.",
        "Everyone agreed it was a good idea.",
        "It was a peaceful place.",
        "The wind kept blowing.",
        "Some things never change.",
    ];
    let mut state = 0x6b76657669637400u64 ^ (seed as u64).wrapping_mul(0x100000001b3);
    let mut pick = |n: usize| -> usize {
        state = state.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    };
    let key = (10000 + pick(90000)).to_string();
    let mut sents: Vec<String> = (0..56)
        .map(|_| {
            if pick(5) == 0 {
                SHORT[pick(8)].to_string()
            } else {
                let (s, v, o, t) = (pick(16), pick(16), pick(16), pick(12));
                format!("{} {} {} {}.", SUBJECTS[s], VERBS[v], OBJECTS[o], TAILS[t])
            }
        })
        .collect();
    sents.insert(28, format!("The pass key is {key}. Remember it."));
    (sents.join(" "), key)
}

/// The JSON number after `"key":` in `text`.
fn json_number(text: &str, key: &str) -> Option<f64> {
    let at = text.find(&format!("\"{key}\":"))? + key.len() + 3;
    let digits: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '-')
        .collect();
    digits.parse().ok()
}

/// Prompt caches moved between servers over HTTP, as a user would: a server without a budget
/// prefills two needle contexts and saves its slot after each (`/slots/0?action=save`, the whole
/// cache); a second server with `--kv-max-cells 256` restores each (`?action=restore`): libllama
/// evicts the restored state to 0.75 x 256 cells as it reads it (question-agnostic `uniqueness`
/// on the state's own K/V), the server reuses the restored tokens as the prompt's prefix (only
/// the question is processed) and answers as the full cache did. A restore of a missing file
/// gets its error and the server goes on.
#[test]
fn server_restores_a_saved_slot_into_its_budget() {
    let Some(s) = setup() else {
        return;
    };
    const QUESTION: &str = "\nQuestion: what is the pass key?\nAnswer: The pass key is";
    let dir = std::env::temp_dir().join(format!("kvevict-slots-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let slot_dir = format!("{}/", dir.display());
    let completion = |port: u16, prompt: &str, n: u32| -> String {
        let body = format!(
            "{{\"prompt\":\"{}\",\"n_predict\":{n},\"cache_prompt\":true,\"temperature\":0}}",
            json_escape(prompt)
        );
        match http(port, "POST", "/completion", &body) {
            Ok((200, b)) => b,
            other => panic!("/completion: {other:?}"),
        }
    };
    let contexts: Vec<(String, String)> = [1, 2].map(needle_context).into();

    // the full cache: prefill a context, save the slot, then ask
    let mut saved = Vec::new();
    {
        let (_server, port, log_path) = start_server(
            &s,
            "save",
            &["-c", "2048", "-t", "2", "--slot-save-path", &slot_dir],
        );
        for (i, (context, key)) in contexts.iter().enumerate() {
            completion(port, context, 1);
            let body = format!("{{\"filename\":\"ctx{i}.bin\"}}");
            let (status, b) = http(port, "POST", "/slots/0?action=save", &body).expect("save");
            assert_eq!(status, 200, "save: {b}");
            let n = json_number(&b, "n_saved").expect("n_saved");
            let answer = json_string(
                &completion(port, &format!("{context}{QUESTION}"), 8),
                "content",
            )
            .unwrap_or_default();
            assert!(
                answer.contains(key.as_str()),
                "the full cache must answer for the test to measure anything: {answer:?}, key {key}"
            );
            saved.push((n, answer));
        }
        let _ = std::fs::remove_file(&log_path);
    }

    let (_server, port, log_path) = start_server(
        &s,
        "restore",
        &[
            "-c",
            "2048",
            "-t",
            "2",
            "--slot-save-path",
            &slot_dir,
            "--kv-evict",
            "uniqueness",
            "--kv-max-cells",
            "256",
            "--kv-evict-to",
            "0.75",
        ],
    );
    let (status, b) = http(
        port,
        "POST",
        "/slots/0?action=restore",
        "{\"filename\":\"missing.bin\"}",
    )
    .expect("restore of a missing file");
    assert!(
        (400..=500).contains(&status),
        "missing file answered {status}: {b}"
    );
    for (i, ((context, key), (n_saved, full_answer))) in contexts.iter().zip(&saved).enumerate() {
        let body = format!("{{\"filename\":\"ctx{i}.bin\"}}");
        let (status, b) = http(port, "POST", "/slots/0?action=restore", &body).expect("restore");
        assert_eq!(status, 200, "restore: {b}");
        assert_eq!(
            json_number(&b, "n_restored"),
            Some(*n_saved),
            "tokens restored"
        );
        let reply = completion(port, &format!("{context}{QUESTION}"), 8);
        let answer = json_string(&reply, "content").unwrap_or_default();
        let processed = json_number(&reply, "prompt_n").expect("timings.prompt_n");
        let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
        let evicted = format!("{n_saved} -> 192 cells");
        let line = log_text
            .lines()
            .find(|l| l.contains("exceeds the KV cell budget 256") && l.contains(&evicted))
            .unwrap_or_else(|| panic!("no restore-time eviction {evicted:?} logged:\n{log_text}"));
        println!(
            "slot {i}: {n_saved} tokens saved by a server without a budget, restored into --kv-max-cells 256: {}; \
             {processed} prompt tokens processed for the question; answer {answer:?} (full cache {full_answer:?})",
            line.split("budget 256: ").nth(1).unwrap_or(line)
        );
        assert!(
            processed < 32.0,
            "the restored prefix was not reused: {processed} prompt tokens processed"
        );
        assert!(
            answer.contains(key.as_str()),
            "restored slot answered {answer:?}, key {key}"
        );
    }
    let _ = std::fs::remove_file(&log_path);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One turn of a chat over `/v1/chat/completions` (temperature 0): the answer and the request's
/// `prompt_tokens` (the whole conversation so far), or what went wrong.
fn chat_turn(
    port: u16,
    messages: &[(String, String)],
    max_tokens: u32,
) -> Result<(String, f64), String> {
    match chat_turn_cached(port, messages, max_tokens, true) {
        Ok((answer, _)) if answer.is_empty() => Err("empty answer".into()),
        r => r,
    }
}

/// A conversation (an opener, then "two facts about" each topic in turn) until its history
/// reaches `min_history` tokens or the topics run out: (turns, history tokens, errors).
fn converse(
    port: u16,
    opener: &str,
    topics: &[&str],
    min_history: f64,
) -> (usize, f64, Vec<String>) {
    let mut messages = vec![("user".to_string(), opener.to_string())];
    let (mut history, mut errors, mut turns) = (0.0, Vec::new(), 0);
    for t in std::iter::once(None).chain(topics.iter().map(Some)) {
        if let Some(t) = t {
            if history >= min_history {
                break;
            }
            messages.push((
                "user".into(),
                format!("Tell me two facts about {t}, in two sentences."),
            ));
        }
        turns += 1;
        match chat_turn(port, &messages, 48) {
            Ok((a, h)) => {
                history = h;
                messages.push(("assistant".into(), a));
            }
            Err(e) => {
                errors.push(format!("turn {turns}: {e}"));
                messages.push(("assistant".into(), "I see.".into()));
            }
        }
    }
    (turns, history, errors)
}

/// Per sequence, the most cells it held, from libllama's lines (`-lv 4`): each eviction
/// (`evict: seq S: A -> B cells`: A held before it) and each new high after placing a ubatch
/// (`place: seq S: X cells with this ubatch`).
fn cells_held_per_seq(log: &str) -> std::collections::BTreeMap<u32, u32> {
    let mut held = std::collections::BTreeMap::new();
    for l in log.lines() {
        for label in ["evict: seq ", "place: seq "] {
            let Some(at) = l.find(label) else { continue };
            let rest = &l[at + label.len()..];
            let seq: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
            let cells: String = rest[seq.len() + 2..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect();
            let (Ok(seq), Ok(cells)) = (seq.parse::<u32>(), cells.parse::<u32>()) else {
                panic!("cannot read {l:?}")
            };
            let e = held.entry(seq).or_insert(0);
            *e = (*e).max(cells);
        }
    }
    held
}

/// The eviction lines a user sees at llama-server's default verbosity (common's info level):
/// `kv eviction: seq S: A -> B cells in T ms (reason)` as (S, A, B).
fn info_evictions(log: &str) -> Vec<(u32, u32, u32)> {
    log.lines()
        .filter_map(|l| {
            let rest = &l[l.find("kv eviction: seq ")? + 17..];
            let (seq, rest) = rest.split_once(": ")?;
            let (a, rest) = rest.split_once(" -> ")?;
            let b = rest.split_whitespace().next()?;
            Some((seq.parse().ok()?, a.parse().ok()?, b.parse().ok()?))
        })
        .collect()
}

/// What a failed or refused eviction logs (never expected in a supported configuration).
fn eviction_failures(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            l.contains("eviction of seq")
                || l.contains("KV eviction needs")
                || l.contains("KV eviction cannot")
                || l.contains("under the KV cell budget")
                || l.contains("no window queries captured")
        })
        .collect()
}

const TOPICS_A: [&str; 12] = [
    "the moon",
    "rivers",
    "bread",
    "owls",
    "glaciers",
    "violins",
    "deserts",
    "bees",
    "lighthouses",
    "tea",
    "volcanoes",
    "chess",
];
const TOPICS_B: [&str; 12] = [
    "maps", "whales", "clocks", "forests", "bridges", "salt", "comets", "gardens", "harbours",
    "kites", "canyons", "pianos",
];

/// Issue 27, finding 1: llama-server's defaults (`-np` auto: 4 slots, a unified cache) with a cell
/// budget, two conversations at once. The budget is per sequence, so each gets a stream of its own
/// (`kv_unified off`, logged): every eviction succeeds, no sequence holds more than the budget, and
/// the cache is allocated for 4 x the budget, not `-c`.
#[test]
fn server_default_slots_hold_a_budget_per_sequence() {
    let Some(s) = setup() else {
        return;
    };
    const BUDGET: u32 = 256;
    let budget = BUDGET.to_string();
    let (_server, port, log_path) = start_server_with(
        &s,
        "default-slots-budget",
        &["-c", "4096", "-t", "2", "--kv-max-cells", &budget],
        None,
        true,
    );
    let t0 = std::time::Instant::now();
    let min_history = 1.5 * BUDGET as f64;
    let (a, b) = std::thread::scope(|sc| {
        let a = sc.spawn(|| converse(port, "My name is Alice. Hello!", &TOPICS_A, min_history));
        let b = sc.spawn(|| {
            converse(
                port,
                "My name is Bob. Good morning!",
                &TOPICS_B,
                min_history,
            )
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let held = cells_held_per_seq(&log);
    let evicted: std::collections::BTreeSet<u32> =
        info_evictions(&log).iter().map(|e| e.0).collect();
    let (alloc_mib, alloc_cells) = kv_allocation(&log);
    let kv_bytes_per_cell = 30 * 2 * 192 * 2; // SmolLM2, f16 K and V
    println!(
        "llama-server, default -np (4 slots), --kv-max-cells {BUDGET}, two chats at once in {:.1} s: \
         {} turns / {} history tokens and {} turns / {} history tokens; sequences evicted {evicted:?}, \
         most cells held per sequence {held:?}; KV allocated {alloc_cells} cells per stream, {alloc_mib:.2} MiB",
        t0.elapsed().as_secs_f64(),
        a.0,
        a.1,
        b.0,
        b.1
    );
    assert!(a.2.is_empty() && b.2.is_empty(), "{:#?} {:#?}", a.2, b.2);
    assert!(
        a.1 >= min_history && b.1 >= min_history,
        "the conversations must pass 1.5x the budget"
    );
    assert!(
        log.contains("one KV stream per sequence (kv_unified off)"),
        "{log}"
    );
    assert_eq!(eviction_failures(&log), Vec::<&str>::new());
    assert!(evicted.len() >= 2, "both conversations evict: {evicted:?}");
    assert!(
        held.values().all(|&h| h <= BUDGET),
        "a sequence held more than {BUDGET} cells: {held:?}"
    );
    // 4 streams of BUDGET cells
    assert_allocated(&log, BUDGET, 4 * BUDGET * kv_bytes_per_cell);
    let _ = std::fs::remove_file(&log_path);
}

/// Issue 27, findings 1 and 6: llama-server's defaults (4 slots sharing one unified stream) with a
/// keep ratio, two conversations at once, at the default verbosity (what a user sees): each
/// sequence is compressed within the shared stream (its rows scored on a copy, its evicted cells
/// freed, the stream compacted; the other sequences' cells kept), one info line per eviction.
#[test]
fn server_default_slots_compress_each_sequence_in_the_unified_cache() {
    let Some(s) = setup() else {
        return;
    };
    let (_server, port, log_path) = start_server_with(
        &s,
        "default-slots-keep",
        &["-c", "4096", "-t", "2", "--kv-keep", "0.5"],
        None,
        false,
    );
    let opener = |name: &str| {
        format!(
            "My name is {name}. I am planning a long walk along the coast next week, with two friends \
             and a dog, and I would like some advice on what to pack, how far to walk each day and \
             where to stop for lunch. Please answer briefly."
        )
    };
    let (a, b) = std::thread::scope(|sc| {
        let a = sc.spawn(|| converse(port, &opener("Alice"), &TOPICS_A[..2], f64::MAX));
        let b = sc.spawn(|| converse(port, &opener("Bob"), &TOPICS_B[..2], f64::MAX));
        (a.join().unwrap(), b.join().unwrap())
    });
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let ev = info_evictions(&log);
    let seqs: std::collections::BTreeSet<u32> = ev.iter().map(|e| e.0).collect();
    println!(
        "llama-server, default -np (unified), --kv-keep 0.5, two chats of {} and {} turns: {} evictions \
         (seq, before, after) {ev:?}",
        a.0,
        b.0,
        ev.len()
    );
    assert!(a.2.is_empty() && b.2.is_empty(), "{:#?} {:#?}", a.2, b.2);
    assert_eq!(eviction_failures(&log), Vec::<&str>::new());
    assert!(
        seqs.len() >= 2,
        "both conversations compressed: {ev:?}\n{log}"
    );
    for &(seq, before, after) in &ev {
        assert!(
            after < before && after as f64 >= 0.5 * before as f64 - 1.0,
            "seq {seq}: {before} -> {after} cells at keep 0.5"
        );
    }
    let _ = std::fs::remove_file(&log_path);
}

/// Issue 27, finding 2: quantized KV caches. The needle prompt at 10 % keep with q8_0 and q4_0 K
/// and V (flash attention on: ggml quantizes V only with it) and with a q8_0 K beside a transposed
/// f16 V (flash attention off): scored on the dequantized rows, rows moved as bytes; every
/// eviction succeeds, and the q8_0 cache answers as its full cache does.
#[test]
fn quantized_caches_are_scored_dequantized_and_compacted_as_bytes() {
    let Some(s) = setup() else {
        return;
    };
    let common = ["--needle", "0.5", "--seed", "5", "--kv-keep", "0.1"];
    let mut table = String::new();
    for (ctk, ctv, flash) in [
        ("q8_0", "q8_0", "on"),
        ("q4_0", "q4_0", "on"),
        ("q8_0", "f16", "off"),
    ] {
        let types = ["-ctk", ctk, "-ctv", ctv, "--flash-attn", flash];
        let full = needle_with(&s, &common, &[&types[..], &["--kv-evict", "full"]].concat());
        let r = needle_with(&s, &common, &types);
        table += &format!(
            "{ctk}/{ctv} flash {flash}: {} -> {} cells (n_kv {} -> {}), log problems {}, answer {:?} (full cache {:?})\n",
            r.num("cells_before"),
            r.num("cells_after"),
            r.num("n_kv_before"),
            r.num("n_kv_after"),
            r.num("log_problems"),
            r.get("answer"),
            full.get("answer")
        );
        assert_eq!(r.num("log_problems"), 0.0, "{ctk}/{ctv}: {table}");
        let (before, after) = (r.num("cells_before"), r.num("cells_after"));
        assert!(
            after < 0.11 * before + 8.0 && after > 0.05 * before,
            "{ctk}/{ctv}: {before} -> {after}"
        );
        assert!(
            r.num("n_kv_after") <= padded(after, PAD_EVICTING),
            "{ctk}/{ctv}: the compacted span: {table}"
        );
        if ctk == "q8_0" && full.num("recovered") == 1.0 {
            assert_eq!(r.num("recovered"), 1.0, "{ctk}/{ctv}: {table}");
        }
    }
    print!("{table}");
}

/// Issue 27, finding 2, through llama-server: `-ctk q8_0 -ctv q8_0` with a cell budget over a
/// conversation 1.5x the budget: every eviction succeeds, no sequence holds more than the budget and
/// the cache is allocated for the budget (q8_0 rows: 34 bytes per 32 values).
#[test]
fn server_holds_a_budget_with_a_q8_0_cache() {
    let Some(s) = setup() else {
        return;
    };
    const BUDGET: u32 = 256;
    let budget = BUDGET.to_string();
    let (_server, port, log_path) = start_server(
        &s,
        "q8_0-budget",
        &[
            "-c",
            "4096",
            "-t",
            "2",
            "-ctk",
            "q8_0",
            "-ctv",
            "q8_0",
            "--kv-max-cells",
            &budget,
        ],
    );
    let (turns, history, errors) = converse(
        port,
        "My name is Alice. Hello!",
        &[TOPICS_A, TOPICS_B].concat(),
        1.5 * BUDGET as f64,
    );
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let held = cells_held_per_seq(&log);
    let ev = info_evictions(&log);
    let (alloc_mib, alloc_cells) = kv_allocation(&log);
    println!(
        "llama-server -np 1 -ctk q8_0 -ctv q8_0 --kv-max-cells {BUDGET}: {turns} turns, {history} history tokens, \
         {} evictions, most cells held {held:?}, KV allocated {alloc_cells} cells, {alloc_mib:.2} MiB",
        ev.len()
    );
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(history >= 1.5 * BUDGET as f64);
    assert_eq!(eviction_failures(&log), Vec::<&str>::new());
    assert!(!ev.is_empty(), "no eviction:\n{log}");
    assert!(held.values().all(|&h| h <= BUDGET), "{held:?}");
    // q8_0: 34 bytes per 32 values; 30 layers, K and V of 192 values a cell
    assert_allocated(&log, BUDGET, BUDGET * 30 * 2 * (192 / 32 * 34));
    let _ = std::fs::remove_file(&log_path);
}

/// Issue 27, finding 6: `--help` and the unknown-method message list every scoring preset the
/// library's header defines (`KVE_PRESET_*`, read here from include/kvevict.h: criticalkv named as
/// not offered), and `llama-kvevict-needle --help` prints its usage and methods.
#[test]
fn every_library_method_is_listed_and_the_needle_tool_has_help() {
    let Some(s) = setup() else {
        return;
    };
    let header =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("include/kvevict.h"))
            .unwrap();
    let names: Vec<String> = header
        .lines()
        .filter_map(|l| l.strip_prefix("#define KVE_PRESET_"))
        .map(|l| {
            l.split_whitespace()
                .next()
                .unwrap()
                .to_lowercase()
                .replace('_', "-")
        })
        .collect();
    assert!(
        names.len() >= 10 && names.iter().any(|n| n == "uniqueness"),
        "{names:?}"
    );
    let out = |exe: &str, args: &[&str]| {
        let o = Command::new(s.bin.join(exe)).args(args).output().unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr),
        )
    };
    for exe in ["llama-server", "llama-cli"] {
        let (_, help) = out(exe, &["--help"]);
        let at = help
            .find("--kv-evict METHOD")
            .expect("--kv-evict in --help");
        let entry = &help[at..help[at..]
            .find("\n--kv-keep")
            .map_or(help.len(), |e| at + e)];
        let (ok, unknown) = out(
            exe,
            &["-m", s.model.to_str().unwrap(), "--kv-evict", "bogus"],
        );
        assert!(
            !ok && unknown.contains("unknown --kv-evict method 'bogus'"),
            "{unknown}"
        );
        for n in &names {
            assert!(
                entry.contains(n.as_str()),
                "{exe} --help omits {n}:\n{entry}"
            );
            if n != "criticalkv" {
                assert!(
                    unknown.contains(n.as_str()),
                    "{exe}: the unknown-method message omits {n}:\n{unknown}"
                );
            }
        }
    }
    let (ok, help) = out("llama-kvevict-needle", &["--help"]);
    assert!(ok && help.contains("usage: llama-kvevict-needle"), "{help}");
    for n in names.iter().filter(|n| *n != "criticalkv") {
        assert!(
            help.contains(n.as_str()),
            "llama-kvevict-needle --help omits {n}:\n{help}"
        );
    }
    let (ok, crit) = out(
        "llama-server",
        &["-m", s.model.to_str().unwrap(), "--kv-evict", "criticalkv"],
    );
    assert!(
        !ok && crit.contains("unknown --kv-evict method 'criticalkv'"),
        "{crit}"
    );
}

/// `chat_turn` with `cache_prompt` set (false: the slot's cells are not reused, the whole prompt
/// is processed again).
fn chat_turn_cached(
    port: u16,
    messages: &[(String, String)],
    max_tokens: u32,
    cache_prompt: bool,
) -> Result<(String, f64), String> {
    let body = format!(
        "{{\"messages\":[{}],\"max_tokens\":{max_tokens},\"temperature\":0,\"cache_prompt\":{cache_prompt}}}",
        messages
            .iter()
            .map(|(r, c)| format!("{{\"role\":\"{r}\",\"content\":\"{}\"}}", json_escape(c)))
            .collect::<Vec<_>>()
            .join(",")
    );
    match http(port, "POST", "/v1/chat/completions", &body) {
        Ok((200, b)) => Ok((
            json_string(&b[b.find("\"message\"").unwrap_or(0)..], "content").unwrap_or_default(),
            json_number(&b, "prompt_tokens").unwrap_or(0.0),
        )),
        other => Err(format!("{other:?}")),
    }
}

/// The evictor's keep-ratio policy (kvevict's `kve_evictor_plan`, `KVE_POLICY_KEEP_RATIO`,
/// `min_keep` 64): a compression keeps `max(floor(new * ratio), 64)` of the cells new since the
/// last one, the cells it kept before stay.
const MIN_KEEP: u32 = 64;

/// Issue 27, finding 3: `--kv-keep 0.1` in a multi-turn chat through `/v1/chat/completions`. The
/// keep ratio is the library's evictor's: a compression keeps a tenth of what is new since the
/// last one, never fewer than 64 of those cells, and the cells kept before are never compressed
/// again. So the short first turn (under 64 tokens with its template) is not cut to the window,
/// each eviction keeps everything the previous one kept plus `max(floor(new / 10), 64)`, and the
/// answers stay on topic.
#[test]
fn server_chat_keep_ratio_compresses_only_what_is_new() {
    let Some(s) = setup() else {
        return;
    };
    let (_server, port, log_path) = start_server_with(
        &s,
        "chat-keep",
        &["-c", "4096", "-t", "2", "--kv-keep", "0.1"],
        Some("1"),
        false,
    );
    let topics = ["the moon", "rivers", "bread", "owls", "volcanoes"];
    let mut messages = vec![(
        "user".to_string(),
        "Hello! My name is Alice. How are you today?".to_string(),
    )];
    let mut answers = Vec::new();
    let mut after_first = None;
    for t in std::iter::once(None).chain(topics.iter().map(Some)) {
        if let Some(t) = t {
            messages.push((
                "user".into(),
                format!("Tell me two facts about {t}, in two sentences."),
            ));
        }
        let (a, prompt) = chat_turn(port, &messages, 48).unwrap_or_else(|e| panic!("{e}"));
        if after_first.is_none() {
            after_first = Some((
                prompt,
                info_evictions(&std::fs::read_to_string(&log_path).unwrap()),
            ));
        }
        answers.push((t.copied(), a.clone()));
        messages.push(("assistant".into(), a));
    }
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let ev = info_evictions(&log);
    println!(
        "llama-server --kv-keep 0.1, {} turns: evictions (seq, before, after) {ev:?}; answers {answers:#?}",
        answers.len()
    );
    let (first_prompt, first_ev) = after_first.unwrap();
    assert!(first_prompt < MIN_KEEP as f64, "the first turn is short");
    assert_eq!(
        first_ev,
        Vec::<(u32, u32, u32)>::new(),
        "the short first turn is not cut"
    );
    assert_eq!(eviction_failures(&log), Vec::<&str>::new());
    assert!(ev.len() >= 2, "the chat passes 64 new cells twice: {ev:?}");
    let mut kept = 0;
    for &(_, before, after) in &ev {
        let new = before - kept;
        assert_eq!(
            after,
            kept + (new / 10).max(MIN_KEEP),
            "{before} -> {after} cells with {kept} kept before: {ev:?}"
        );
        kept = after;
    }
    // sane answers: on the topic asked about
    let on_topic = answers
        .iter()
        .filter_map(|(t, a)| t.map(|t| (t, a)))
        .filter(|(t, a)| {
            let word = t.trim_start_matches("the ");
            a.to_lowercase().contains(&word[..word.len() - 1])
        })
        .count();
    assert!(
        on_topic + 1 >= topics.len(),
        "answers off topic: {answers:#?}"
    );
    let _ = std::fs::remove_file(&log_path);
}

/// One slot, `--kv-evict METHOD --kv-keep 0.1`, the server's default window.
fn keep_ratio_server(s: &Setup, name: &str, method: &str, trace: bool) -> (Server, u16, PathBuf) {
    let args = [
        "-c",
        "4096",
        "-t",
        "2",
        "--kv-evict",
        method,
        "--kv-keep",
        "0.1",
    ];
    start_server_with(s, name, &args, Some("1"), trace)
}

/// Issue 27, finding 4: the context in turn 1, the question in turn 2, `uniqueness --kv-keep 0.1`,
/// through `/v1/chat/completions`, on needle contexts of several seeds. Turn 1 is compressed to a
/// tenth once; turn 2 adds fewer than 64 new cells, so the compressed cache is not compressed
/// again (it was: `200 -> 20 cells` before the answer), and the answer holds the pass key.
#[test]
fn server_chat_context_then_question_keeps_the_needle() {
    let Some(s) = setup() else {
        return;
    };
    let (_server, port, log_path) = keep_ratio_server(&s, "chat-two-turns", "uniqueness", false);
    let mut rows = Vec::new();
    for seed in [21, 22, 23] {
        let (context, key) = needle_context(seed);
        // a new conversation: the slot's cells of the previous one are not reused
        chat_turn_cached(port, &[("user".into(), "Hello.".into())], 4, false).unwrap();
        let n_before = info_evictions(&std::fs::read_to_string(&log_path).unwrap()).len();
        let mut m = vec![("user".to_string(), context)];
        let (reply, _) = chat_turn(port, &m, 16).unwrap_or_else(|e| panic!("{e}"));
        m.push(("assistant".into(), reply));
        m.push((
            "user".into(),
            "What is the pass key? Answer with the number only.".into(),
        ));
        let (answer, prompt) = chat_turn(port, &m, 12).unwrap_or_else(|e| panic!("{e}"));
        let ev = info_evictions(&std::fs::read_to_string(&log_path).unwrap())[n_before..].to_vec();
        rows.push((seed, key.clone(), answer.clone(), prompt, ev.clone()));
        assert_eq!(
            ev.len(),
            1,
            "seed {seed}: one compression, of turn 1: {ev:?}"
        );
        let (_, before, after) = ev[0];
        assert!(
            before as f64 > 0.9 * prompt - 40.0,
            "seed {seed}: turn 1 compressed: {ev:?}"
        );
        assert_eq!(after, before / 10, "seed {seed}: a tenth kept: {ev:?}");
    }
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    println!("llama-server uniqueness --kv-keep 0.1, context then question (seed, key, answer, prompt tokens, evictions): {rows:#?}");
    assert_eq!(eviction_failures(&log), Vec::<&str>::new());
    // before the evictor's policy: 0 of 3 (turn 2 compressed the compressed cache again); measured
    // 2026-12-05: seeds 21 and 23 answered, 22 not (uniqueness keeps 69 of 690 cells here; the
    // 10-seed rate at 1.5k tokens is in docs/results/llama-chat.md)
    let found = rows.iter().filter(|r| r.2.contains(&r.1)).count();
    assert!(
        found + 1 >= rows.len(),
        "the pass key in the answers: {rows:#?}"
    );
    let _ = std::fs::remove_file(&log_path);
}

/// Issue 27, finding 5: one chat message, the needle context then the question, `laprox-span
/// --kv-keep 0.1` through `/v1/chat/completions`. Through the chat template the window's last
/// tokens are template tokens (`<|im_end|>\n<|im_start|>assistant\n`), so llama-server's default
/// window is 32 (with 8 the key was lost on every seed, llama_fork/chat_needle.py); the question
/// is inside it and the pass key is kept and answered.
#[test]
fn server_chat_one_message_question_last_keeps_the_needle() {
    let Some(s) = setup() else {
        return;
    };
    let (_server, port, log_path) = keep_ratio_server(&s, "chat-one-message", "laprox-span", true);
    let mut rows = Vec::new();
    for seed in [31, 32, 33] {
        let (context, key) = needle_context(seed);
        let m = vec![(
            "user".to_string(),
            format!("{context}\n\nWhat is the pass key? Answer with the number only."),
        )];
        let (answer, prompt) =
            chat_turn_cached(port, &m, 12, false).unwrap_or_else(|e| panic!("{e}"));
        rows.push((seed, key, answer, prompt));
    }
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let ev = info_evictions(&log);
    println!("llama-server laprox-span --kv-keep 0.1, one message (seed, key, answer, prompt tokens): {rows:#?}; evictions {ev:?}");
    assert!(
        log.contains("window 32"),
        "llama-server's default window for a question-aware method in the chat path"
    );
    assert_eq!(eviction_failures(&log), Vec::<&str>::new());
    assert_eq!(ev.len(), rows.len(), "one compression per request: {ev:?}");
    for (&(_, before, after), r) in ev.iter().zip(&rows) {
        assert!(
            before as f64 >= r.3 - 1.0 && after == before / 10,
            "{ev:?} {rows:?}"
        );
    }
    let found = rows.iter().filter(|r| r.2.contains(&r.1)).count();
    assert_eq!(found, rows.len(), "the pass key in every answer: {rows:#?}");
    let _ = std::fs::remove_file(&log_path);
}

/// Resident memory of a process in KiB (`VmRSS` of /proc/PID/status).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Every slot's `kv_evict` object from `/slots`: (id, cells, evictions).
fn slots_kv(port: u16) -> Vec<(u32, u32, u32)> {
    let (status, body) = http(port, "GET", "/slots", "").expect("/slots");
    assert_eq!(status, 200, "/slots: {body}");
    body.split("{\"id\":")
        .skip(1)
        .filter_map(|slot| {
            let id = slot
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect::<String>()
                .parse()
                .ok()?;
            let kv = &slot[slot.find("\"kv_evict\":")?..];
            Some((
                id,
                json_number(kv, "cells")? as u32,
                json_number(kv, "evictions")? as u32,
            ))
        })
        .collect()
}

/// Issue 27's bounded soak: 4 clients at once, 30 chat turns each, `-np 4 --kv-max-cells 256`
/// (loopback only; 120 requests, each answer at most 16 tokens; the whole run under an hour).
/// Zero HTTP errors, zero failed evictions, no slot ever over 256 cells (libllama's log of every
/// eviction and placed ubatch, and `/slots`' `kv_evict.cells` after every round), every slot
/// evicting, and the server's RSS flat after warm-up (the first 10 rounds).
#[test]
fn server_soak_four_clients_thirty_turns_under_a_budget() {
    let Some(s) = setup() else {
        return;
    };
    const BUDGET: u32 = 256;
    const CLIENTS: usize = 4;
    const TURNS: usize = 30;
    const WARM_UP: usize = 10;
    let budget = BUDGET.to_string();
    let (server, port, log_path) = start_server_with(
        &s,
        "soak",
        // (--cache-ram 0: no host-memory prompt cache of idle slots, which grows by design up to its
        // own limit; the RSS measured is the contexts' and the evictor's)
        &[
            "-c",
            "8192",
            "-t",
            "2",
            "--cache-ram",
            "0",
            "--kv-max-cells",
            &budget,
        ],
        Some("4"),
        true,
    );
    let pid = server.0.id();
    let t0 = std::time::Instant::now();
    let topics: Vec<&str> = TOPICS_A.iter().chain(TOPICS_B.iter()).copied().collect();
    let mut histories: Vec<Vec<(String, String)>> = (0..CLIENTS)
        .map(|c| {
            vec![(
                "system".to_string(),
                format!("You are talking with client {c}. Be brief."),
            )]
        })
        .collect();
    let (mut errors, mut rss, mut slot_cells) = (Vec::new(), Vec::new(), Vec::new());
    for turn in 0..TURNS {
        assert!(
            t0.elapsed().as_secs() < 3600,
            "the soak is bounded: an hour (a few minutes on an idle machine), at turn {turn}"
        );
        for h in histories.iter_mut() {
            let t = topics[(turn + h.len()) % topics.len()];
            h.push(("user".into(), format!("One fact about {t}, please.")));
        }
        // the clients' turns at once
        let answers: Vec<Result<(String, f64), String>> = std::thread::scope(|sc| {
            let hs: Vec<_> = histories
                .iter()
                .map(|h| sc.spawn(move || chat_turn(port, h, 16)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (c, (h, a)) in histories.iter_mut().zip(answers).enumerate() {
            match a {
                Ok((a, _)) => h.push(("assistant".into(), a)),
                Err(e) => {
                    errors.push(format!("client {c} turn {turn}: {e}"));
                    h.push(("assistant".into(), "I see.".into()));
                }
            }
        }
        let slots = slots_kv(port);
        slot_cells.push(slots.iter().map(|s| s.1).max().unwrap_or(0));
        assert!(
            slots.iter().all(|s| s.1 <= BUDGET),
            "turn {turn}: a slot over {BUDGET} cells: {slots:?}"
        );
        rss.push(rss_kib(pid));
    }
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let held = cells_held_per_seq(&log);
    let slots = slots_kv(port);
    let warm = rss[WARM_UP - 1];
    let after = *rss[WARM_UP..].iter().max().unwrap();
    println!(
        "soak: {CLIENTS} clients x {TURNS} turns, -np 4 --kv-max-cells {BUDGET}, in {:.0} s: {} HTTP errors; most cells \
         held per sequence (log) {held:?}; /slots (id, cells, evictions) at the end {slots:?}; most cells of any slot \
         per turn {slot_cells:?}; RSS (MiB) per turn {:?}",
        t0.elapsed().as_secs_f64(),
        errors.len(),
        rss.iter().map(|r| r / 1024).collect::<Vec<_>>()
    );
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(eviction_failures(&log), Vec::<&str>::new());
    assert!(
        held.values().all(|&h| h <= BUDGET),
        "a sequence held more than {BUDGET} cells: {held:?}"
    );
    assert_eq!(slots.len(), CLIENTS, "{slots:?}");
    assert!(
        slots.iter().all(|s| s.2 > 0),
        "every slot evicts over 30 turns: {slots:?}"
    );
    // flat after warm-up: within 5 % (+ 8 MiB) of the RSS after the warm-up rounds
    assert!(
        after <= warm + warm / 20 + 8 * 1024,
        "RSS grew after warm-up: {warm} KiB -> {after} KiB ({rss:?})"
    );
    let _ = std::fs::remove_file(&log_path);
}
