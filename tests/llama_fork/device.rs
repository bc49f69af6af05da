//! The device path (`kve_cuda_evictor_*`, what a CUDA build runs) forced on the CPU cache with
//! `KVEVICT_FORK_DEVICE_PATH=1` on libllama relinked with kvevict's `cuda-emu`: against the host path,
//! and what it refuses.

use super::*;

/// The device path (kvevict's device evictor `kve_cuda_evictor_*`: one round,
/// `kve_cuda_evictor_run_round`, scoring and selecting on the device; rows compacted as
/// bytes) against the host path (`kve_evictor_*`), on the cuda-emu relink of libllama:
/// byte-identical compacted state files (same kept cells, same rows moved, same cell
/// metadata) and the same answers.
#[test]
fn device_path_on_the_emulator_matches_the_host_path() {
    let Some((s, lib)) = setup_with_emu("device_path_on_the_emulator_matches_the_host_path") else {
        return;
    };
    let mut table = String::from(
        "flash depth | method       | cells      | host answer | device answer | state files\n",
    );
    // one case per thing the device form reads: LaProx-span (queries, Wo's Gram blocks) with V
    // transposed (flash off: the strided layout) and with V rows (flash on), LAVa (values read),
    // uniqueness (agnostic: no queries), and a q8_0 cache (the device form on a dequantized f32
    // copy of the rows uploaded, compacted as bytes)
    let cases = [
        ("off", "laprox-span", "0.5", "5", &[][..]),
        ("on", "laprox-span", "0.5", "5", &[][..]),
        ("off", "lava", "0.5", "5", &[][..]),
        ("on", "uniqueness", "0.5", "5", &["--agnostic"][..]),
        (
            "on",
            "laprox-span",
            "0.3",
            "3",
            &["-ctk", "q8_0", "-ctv", "q8_0"][..],
        ),
    ];
    for &(flash, method, depth, seed, extra) in &cases {
        let (h, d, _) = host_and_device(&s, &lib, flash, method, (depth, seed, "0.1"), extra);
        table += &format!(
            "{flash:>5} {depth:>5} | {method:<12} {extra:?} | {:>4} -> {:<3} | {:?} | {:?} | identical\n",
            h.get("cells_before"),
            h.get("cells_after"),
            h.get("answer"),
            d.get("answer"),
        );
        if method == "laprox-span" && extra.is_empty() {
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
    let mut files = Vec::new();
    let mut rows = Vec::new();
    for device in [false, true] {
        // one file per call: two tests of this file run host_and_device at once in one
        // process, and a shared name let one's state file be read by the other's reload
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (path, path_str) = state_file(&format!("dev-{call}-{device}"));
        let mut args = at(
            depth,
            seed,
            &[
                "--flash-attn",
                flash,
                "--kv-evict",
                method,
                "--kv-keep",
                keep,
                "--state-file",
                &path_str,
            ],
        );
        args.extend_from_slice(extra);
        let (row, err, ok) = needle_path(s, Some(lib), device, &args);
        let tail: String = err.lines().rev().take(5).collect::<Vec<_>>().join("\n");
        assert!(
            ok,
            "{method} {extra:?} flash {flash} depth {depth} device {device} failed:\n{tail}"
        );
        // (in place, or on a dequantized copy: "... kve_cuda_* on a dequantized copy")
        let tag = if device {
            "device path, kve_cuda_*"
        } else {
            "host path, "
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

/// A ~1000-token prompt (context and question) through ONE `llama_decode` call under a 256-cell
/// budget (`llama-kvevict-needle --kv-max-cells`): libllama places it ubatch by ubatch, evicting
/// between them, so the cache is allocated for the budget alone (not budget + batch) and never
/// holds more than the budget; n_ubatch is capped to what an eviction to 0.75 frees (64), also
/// from the default 512. Host path with flash attention off and on; host and device path
/// (cuda-emu) with it off evict the same cells and answer the same; with a budget above the prompt (no eviction) the
/// ubatch-by-ubatch placement answers the needle like the full cache.
#[test]
fn a_prompt_longer_than_the_budget_streams_through_one_decode() {
    let s = fork_or_skip!();
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
        // the device path (12 evictions on the emulator) with V transposed only: its layouts are
        // device_path_on_the_emulator_matches_the_host_path's
        let paths: &[bool] = if lib.is_some() && flash == "off" {
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
            rows.push((flash, r));
        }
    }
    // the host and device paths keep the same cells: same evictions, cells and answer (the pairs of
    // one configuration: without the emulator's relink each configuration has its host row only)
    for pair in rows.chunks(2).filter(|p| p.len() == 2 && p[0].0 == p[1].0) {
        let pair = [&pair[0].1, &pair[1].1];
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

/// Forced onto the device path, a libllama whose kvevict has no CUDA refuses the eviction when the
/// context is made, with a clear message, and the host path of the same binary still runs.
#[test]
fn device_path_without_cuda_is_refused() {
    let s = fork_or_skip!();
    let args = at(
        "0.3",
        "3",
        &["--kv-evict", "laprox-span", "--kv-keep", "0.1"],
    );
    let (row, err, ok) = needle_path(&s, None, true, &args);
    assert!(
        !ok && row.is_none(),
        "the device path ran without CUDA in kvevict"
    );
    assert!(
        err.contains("kvevict was built without CUDA")
            && err.contains("KV eviction: cannot set up kvevict for this cache"),
        "no clear refusal in:\n{}",
        err.lines().rev().take(5).collect::<Vec<_>>().join("\n")
    );
    // the host path of the same binary works (a short prompt: the same prompt's host-path run is
    // needle_at_ten_percent_compacts_the_cache's)
    let short = [&args[..], &["--ctx-tokens", "200"]].concat();
    let (row, _, ok) = needle_path(&s, None, false, &short);
    assert!(ok && row.is_some_and(|r| r.num("cells_after") > 0.0));
}

/// `kv_evict_mark_split` 2 (`--kv-mark-prompts`: the adapter marks each prompt's messages) on the
/// device path, which takes no marks: refused when the context is made, with a clear message; the
/// host path of the same binary runs it.
#[test]
fn prompt_marks_on_the_device_path_are_refused() {
    let Some((s, lib)) = setup_with_emu("prompt_marks_on_the_device_path_are_refused") else {
        return;
    };
    let args = at(
        "0.3",
        "3",
        &[
            "--kv-evict",
            "uniqueness",
            "--kv-keep",
            "0.1",
            "--ctx-tokens",
            "200",
            "--mark-split",
            "prompts",
        ],
    );
    let (row, err, ok) = needle_path(&s, Some(&lib), true, &args);
    assert!(!ok && row.is_none(), "the device path took prompt marks");
    assert!(
        err.contains("the device path takes no marks")
            && err.contains("KV eviction: cannot set up kvevict for this cache"),
        "no clear refusal in:\n{}",
        err.lines().rev().take(5).collect::<Vec<_>>().join("\n")
    );
    let (row, _, ok) = needle_path(&s, Some(&lib), false, &args);
    assert!(ok && row.is_some_and(|r| r.num("cells_after") > 0.0));
}

/// Value links (`--kv-evict-links`) on the device path: kvevict's device evictor accumulates the
/// links and runs the linked selection on the device, so the cuda-emu relink evicts the same
/// cells, writes a byte-identical state file and answers as the host path does (the links matter
/// at 2.5 % keep with a 7-digit key: a key cut in its middle is a wrong answer).
#[test]
fn value_links_on_the_device_path_match_the_host_path() {
    let Some((s, lib)) = setup_with_emu("value_links_on_the_device_path_match_the_host_path")
    else {
        return;
    };
    let extra = ["--key-digits", "7", "--kv-evict-links", "0.5"];
    let (h, d, _) = host_and_device(
        &s,
        &lib,
        "off",
        "laprox-span",
        ("0.5", "5", "0.025"),
        &extra,
    );
    println!(
        "value links, keep 0.025: host {:?} -> {:?} cells, answer {:?}; device the same ({:?})",
        h.get("cells_before"),
        h.get("cells_after"),
        h.get("answer"),
        d.get("answer")
    );
}
