//! A model with sliding-window layers: Gemma 3 270M (5 of every 6 layers attend to the last
//! 512 tokens only; llama.cpp gives it an iSWA cache, a small cache for those layers beside the
//! full-attention layers' one). Eviction works on the full-attention layers' cache, scored from
//! those layers alone; the sliding-window layers keep their window as upstream. Needs
//! `KVEVICT_LLAMA_GEMMA` (scripts/setup_llama.sh prints it); skipped without it unless
//! `KVEVICT_FORK_REQUIRED=1`.

use super::*;

fn gemma() -> Option<Setup> {
    let s = setup()?;
    match std::env::var_os("KVEVICT_LLAMA_GEMMA").map(PathBuf::from) {
        Some(model) if model.is_file() => Some(Setup { bin: s.bin, model }),
        _ if std::env::var("KVEVICT_FORK_REQUIRED").is_ok_and(|v| v == "1") => {
            panic!("KVEVICT_LLAMA_GEMMA does not point at the Gemma 3 270M GGUF")
        }
        _ => {
            eprintln!("SKIPPED: set KVEVICT_LLAMA_GEMMA (scripts/setup_llama.sh prints it)");
            None
        }
    }
}

/// One-shot keep ratio and a decode-time cell budget on Gemma 3's iSWA cache: the cells of its
/// full-attention layers go down to what was asked, their span (`n_kv`) with them, nothing is
/// logged as a problem, and the budget is never passed; the answers are printed beside the full
/// cache's, and the budget run (128 cells of ~1,000, the sliding-window layers seeing their last
/// 512 tokens in full) must answer as the full cache does.
#[test]
fn sliding_window_models_evict_their_full_attention_layers() {
    let Some(s) = gemma() else { return };
    let common = ["--needle", "0.5", "--seed", "3", "--ctx-tokens", "1000"];
    let full = needle_with(&s, &common, &["--kv-evict", "full"]);
    let keep = needle_with(
        &s,
        &common,
        &["--kv-evict", "laprox-span", "--kv-keep", "0.1"],
    );
    let (before, after) = (keep.num("cells_before"), keep.num("cells_after"));
    println!(
        "Gemma 3 270M, keep 0.1: {before} -> {after} cells, n_kv {} -> {}, {} of {} layers captured, \
         log problems {}, answer {:?} (full cache {:?})",
        keep.num("n_kv_before"),
        keep.num("n_kv_after"),
        keep.num("capture_layers"),
        keep.num("n_layer"),
        keep.num("log_problems"),
        keep.get("answer"),
        full.get("answer")
    );
    assert!(before > 900.0, "the prompt's cells: {before}");
    assert!(
        after < 0.11 * before + 8.0 && after > 0.05 * before,
        "{before} -> {after}"
    );
    assert!(
        keep.num("n_kv_after") <= (after / 32.0).ceil() * 32.0,
        "the compacted span"
    );
    assert_eq!(keep.num("log_problems"), 0.0, "warnings or errors logged");
    // the query rings: the full-attention layers' alone (3 of Gemma 3 270M's 18)
    assert!(
        keep.num("capture_layers") > 0.0 && keep.num("capture_layers") < keep.num("n_layer"),
        "layers captured"
    );

    let budget = needle_with(
        &s,
        &common,
        &[
            "--kv-evict",
            "laprox-span",
            "--kv-max-cells",
            "128",
            "--kv-evict-to",
            "0.75",
        ],
    );
    println!(
        "Gemma 3 270M, --kv-max-cells 128: {} evictions, most cells held {}, {} at the end, {} allocated, \
         log problems {}, answer {:?} (full cache {:?})",
        budget.num("evictions"),
        budget.num("most_held"),
        budget.num("cells_end"),
        budget.num("alloc_cells"),
        budget.num("log_problems"),
        budget.get("answer"),
        full.get("answer")
    );
    assert!(
        budget.num("evictions") >= 20.0,
        "the budget evicts as the prompt is placed"
    );
    assert!(
        budget.num("most_held") <= 128.0 && budget.num("most_held") > 96.0,
        "the budget is reached, never passed"
    );
    assert_eq!(budget.num("log_problems"), 0.0, "warnings or errors logged");
    // the full-attention layers' cache: the budget, or the sliding-window layers' window and a
    // ubatch when that is larger (both caches are sized from one number), never the context
    assert!(
        budget.num("alloc_cells") <= 1024.0,
        "KV allocation: {}",
        budget.num("alloc_cells")
    );
    if full.num("recovered") == 1.0 {
        assert_eq!(
            budget.num("recovered"),
            1.0,
            "the budget run answers as the full cache"
        );
    }
}
