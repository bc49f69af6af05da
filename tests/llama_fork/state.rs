//! Sequence states restored into a context with a cell budget (the needle tool and llama-server's slots).

use super::*;

/// The restore tests' needle prompt (depth 0.5, seed 5) and `rest`.
fn restore_args<'a>(rest: &[&'a str]) -> Vec<&'a str> {
    at("0.5", "5", rest)
}

/// A sequence state with more cells than `--kv-max-cells` (the uncompressed prompt's state file,
/// ~990 cells) loaded into a context with a 256-cell budget: evicted to 0.75 x 256 = 192 cells as
/// it is read, scored question-agnostically on the state's own K/V bytes (V transposed with
/// flash attention off, token rows with it on; a q8_0 cache scored on its dequantized rows), then the
/// question answered on what was kept. A state within the budget is restored whole.
#[test]
fn a_state_larger_than_the_budget_is_evicted_on_restore() {
    let s = fork_or_skip!();
    let mut lines = Vec::new();
    for (flash, budget, cache) in [
        ("off", "256", "f16"),
        ("on", "256", "f16"),
        ("on", "256", "q8_0"),
        ("off", "2048", "f16"),
    ] {
        let (_, path_str) = state_file(&format!("restore-{flash}-{budget}-{cache}"));
        let r = needle(
            &s,
            &restore_args(
                &[
                    &keep_and_save(flash, &path_str)[..],
                    &["--restore-max-cells", budget, "-ctk", cache, "-ctv", cache],
                ]
                .concat(),
            ),
        );
        remove_state_files(&path_str);
        let (cells, restored) = (r.num("cells_before"), r.num("restore_cells"));
        lines.push(format!(
            "{cache} cache, flash {flash}, --kv-max-cells {budget}: state of {cells} cells restored as {restored} ({} evicted); answer {:?} (full cache before compression: key {})",
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
    let s = fork_or_skip!();
    for flash in ["off", "on"] {
        let (path, path_str) = state_file(&format!("restore-vs-oneshot-{flash}"));
        let r = needle(
            &s,
            &restore_args(&[
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
            ]),
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

/// Prompt caches moved between servers over HTTP, as a user would: a server without a budget
/// prefills two needle contexts and saves its slot after each (`/slots/0?action=save`, the whole
/// cache); a second server with `--kv-max-cells 256` restores each (`?action=restore`): libllama
/// evicts the restored state to 0.75 x 256 cells as it reads it (question-agnostic `uniqueness`
/// on the state's own K/V), the server reuses the restored tokens as the prompt's prefix (only
/// the question is processed) and answers as the full cache did. A restore of a missing file
/// gets its error and the server goes on.
#[test]
fn server_restores_a_saved_slot_into_its_budget() {
    let s = fork_or_skip!();
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

/// A restored state that fits the budget but whose answer does not (494 cells under
/// `--kv-max-cells 497`, then the question's last token and 8 generated ones): the sequence
/// must evict before it has decoded a window of its own, so the method's window queries do
/// not exist. Its cells are scored as a restored state's are (question-agnostic
/// `uniqueness`, a host evictor, in place on the host cache) instead of the eviction being deferred, which
/// left the ubatch no cell and failed the decode (llama-server's prompt cache restoring a
/// conversation into another slot: "Context size has been exceeded"). Host and device paths.
#[test]
fn a_restored_sequence_without_window_queries_still_evicts() {
    let s = fork_or_skip!();
    let lib = emu_lib("a_restored_sequence_without_window_queries_still_evicts");
    let (_, path_str) = state_file("restore-edge");
    let args = restore_args(&[
        "--ctx-tokens",
        "500",
        "--kv-keep",
        "0.1",
        "--state-file",
        &path_str,
        "--restore-max-cells",
        "497",
    ]);
    let paths: &[bool] = if lib.is_some() {
        &[false, true]
    } else {
        &[false]
    };
    for &device in paths {
        let (row, err, ok) = needle_path(&s, lib.as_deref().filter(|_| device), device, &args);
        remove_state_files(&path_str);
        let r = row
            .filter(|_| ok)
            .unwrap_or_else(|| panic!("device {device} failed:\n{err}"));
        let cells = r.num("cells_before");
        assert!(
            cells <= 497.0 && cells + 1.0 + 8.0 > 497.0,
            "the budget must fit the state ({cells} cells) and not its answer"
        );
        assert_eq!(r.num("restore_cells"), cells, "restored whole");
        let fallback: Vec<&str> = err
            .lines()
            .filter(|l| {
                l.contains(
                    "window queries captured (cells copied or restored): scored with 'uniqueness'",
                )
            })
            .collect();
        let evicted: Vec<&str> = err
            .lines()
            .filter(|l| {
                l.contains("evict: seq 0: 497 -> 372 cells") && l.contains("host path, kve_*")
            })
            .collect();
        println!(
            "{} path: state of {cells} cells restored whole under --kv-max-cells 497; {fallback:?}; {evicted:?}; answer {:?} (key {})",
            if device { "device" } else { "host" },
            r.get("restore_answer"),
            r.get("key")
        );
        assert_eq!(fallback.len(), 1, "{err}");
        assert_eq!(evicted.len(), 1, "{err}");
        assert_eq!(
            r.num("restore_correct"),
            1.0,
            "answer {:?}",
            r.get("restore_answer")
        );
    }
}
