//! `llama-server`'s chat path with a keep ratio: what is new is compressed, the needle kept.

use super::*;

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
    let s = fork_or_skip!();
    let (_server, port, log_path) = keep_ratio_server(&s, "chat-keep", None, false);
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

/// One slot, `--kv-keep 0.1` (with `--kv-evict METHOD`, or the server's default method), the
/// server's default window.
fn keep_ratio_server(
    s: &Setup,
    name: &str,
    method: Option<&str>,
    trace: bool,
) -> (Server, u16, PathBuf) {
    let mut args = vec!["-c", "4096", "-t", "2"];
    if let Some(m) = method {
        args.extend(["--kv-evict", m]);
    }
    args.extend(["--kv-keep", "0.1"]);
    start_server_with(s, name, &args, Some("1"), trace)
}

/// Issue 27, finding 4: the context in turn 1, the question in turn 2, `uniqueness --kv-keep 0.1`,
/// through `/v1/chat/completions`, on needle contexts of several seeds. Turn 1 is compressed to a
/// tenth once; turn 2 adds fewer than 64 new cells, so the compressed cache is not compressed
/// again (it was: `200 -> 20 cells` before the answer), and the answer holds the pass key.
#[test]
fn server_chat_context_then_question_keeps_the_needle() {
    let s = fork_or_skip!();
    let (_server, port, log_path) =
        keep_ratio_server(&s, "chat-two-turns", Some("uniqueness"), false);
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
    let s = fork_or_skip!();
    let (_server, port, log_path) =
        keep_ratio_server(&s, "chat-one-message", Some("laprox-span"), true);
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
