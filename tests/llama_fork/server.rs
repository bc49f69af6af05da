//! `llama-server` under a cell budget: long conversations, the default slots, a q8_0 cache, a soak.

use super::*;

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

/// The cell budget (`--kv-max-cells`) of every test here.
const BUDGET: u32 = 256;

/// `start_server_with` on a `ctx`-token context, 2 threads, `args`, then `--kv-max-cells BUDGET`
/// (libllama's info lines logged).
fn budget_server(
    s: &Setup,
    name: &str,
    ctx: &str,
    args: &[&str],
    np: Option<&str>,
) -> (Server, u16, PathBuf) {
    let budget = BUDGET.to_string();
    let args = [&["-c", ctx, "-t", "2"], args, &["--kv-max-cells", &budget]].concat();
    start_server_with(s, name, &args, np, true)
}

/// With the configuration that remembers the user's turns (design §3c, eleventh and twelfth passes):
/// `uniqueness`, value links and `--kv-mark-prompts` (each request's new prompt text a marked span of
/// its own); the default method under a budget is covered by the default-slot tests below.
#[test]
fn server_holds_a_cell_budget_over_a_long_conversation() {
    let remember = [
        "--kv-evict",
        "uniqueness",
        "--kv-evict-links",
        "0.5",
        "--kv-mark-prompts",
        "--kv-evict-to",
        "0.75",
    ];
    let s = fork_or_skip!();
    // a 4096-token context (positions keep growing) whose sequence may hold at most BUDGET cells,
    // with llama-server's default -b (2048) and -ub (512): libllama places a batch ubatch by ubatch,
    // evicting between them, and caps n_ubatch to the 64 cells an eviction to 0.75 * BUDGET frees,
    // so the cache allocates BUDGET cells, not BUDGET + n_batch (2304) or BUDGET + n_ubatch
    let (_server, port, log_path) = budget_server(&s, "conversation", "4096", &remember, Some("1"));
    let t0 = std::time::Instant::now();

    // the later topics are for when the answers come out short: the conversation goes on
    // until its history is 4x the budget (the model's answers set its length, not the test)
    let topics: Vec<&str> = TOPICS_A
        .iter()
        .chain(&TOPICS_B)
        .chain(&TOPICS_C)
        .copied()
        .collect();
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
            "{{\"messages\":{},\"max_tokens\":64,\"temperature\":0}}",
            messages_json(messages)
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
    // "... most cells held N; R marked ranges; host path, kve_*)": the digits after the label
    let most = |l: &str| -> u32 {
        let tail = l.rsplit("most cells held ").next().unwrap();
        let digits: String = tail.chars().take_while(|c| c.is_ascii_digit()).collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("no cell count in {l:?}"))
    };
    let held = held_lines.iter().map(|l| most(l)).max().unwrap_or(0);
    // the marks: each request's prompt text a range, so the later evictions see several (the server reuses
    // the cached prefix after an eviction and decodes only what is new)
    let ranges: Vec<u32> = evictions
        .iter()
        .map(|l| {
            let head = l.split(" marked ranges").next().unwrap();
            let digits: String = head.rsplit("; ").next().unwrap().chars().collect();
            digits
                .parse()
                .unwrap_or_else(|_| panic!("no marked ranges in {l:?}"))
        })
        .collect();
    let kv_bytes_per_cell = 30 * 2 * 192 * 2; // SmolLM2: layers x (K, V) x n_embd_k_gqa x f16
                                              // the allocation llama.cpp logs: "llama_kv_cache: size =    7.03 MiB (   320 cells, ..."
    let (alloc_mib, alloc_cells) = kv_allocation(&log_text);
    println!(
        "llama-server (default -b 2048 -ub 512), {} turns over /v1/chat/completions in {secs:.1} s: history {history_tokens} tokens, budget {BUDGET} cells \
         (cells in use: {:.1} MiB of f16 K+V at most, against {:.1} MiB for the whole history; allocated {alloc_cells} cells, \
         {alloc_mib:.2} MiB, against {:.1} MiB for -c 4096), {} evictions, most cells held {held}, marked ranges {ranges:?}; \
         last answer {last:?} (green recalled: {})",
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
        ranges.iter().max().copied().unwrap_or(0) >= 4,
        "--kv-mark-prompts: the evictions saw fewer than 4 marked ranges ({ranges:?}):\n{log_text}"
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

const TOPICS_C: [&str; 6] = [
    "lanterns",
    "coral reefs",
    "windmills",
    "honey",
    "glass",
    "trains",
];

/// Issue 27, finding 1: llama-server's defaults (`-np` auto: 4 slots, a unified cache) with a cell
/// budget, two conversations at once. The budget is per sequence, so each gets a stream of its own
/// (`kv_unified off`, logged): every eviction succeeds, no sequence holds more than the budget, and
/// the cache is allocated for 4 x the budget, not `-c`.
#[test]
fn server_default_slots_hold_a_budget_per_sequence() {
    let s = fork_or_skip!();
    // (no -np: llama-server's default slots)
    let (_server, port, log_path) = budget_server(&s, "default-slots-budget", "4096", &[], None);
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
    let s = fork_or_skip!();
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

/// Issue 27, finding 2, through llama-server: `-ctk q8_0 -ctv q8_0` with a cell budget over a
/// conversation 1.5x the budget: every eviction succeeds, no sequence holds more than the budget and
/// the cache is allocated for the budget (q8_0 rows: 34 bytes per 32 values).
#[test]
fn server_holds_a_budget_with_a_q8_0_cache() {
    let s = fork_or_skip!();
    let types = ["-ctk", "q8_0", "-ctv", "q8_0"];
    let (_server, port, log_path) = budget_server(&s, "q8_0-budget", "4096", &types, Some("1"));
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
    let s = fork_or_skip!();
    const CLIENTS: usize = 4;
    const TURNS: usize = 30;
    const WARM_UP: usize = 10;
    // (--cache-ram 0: no host-memory prompt cache of idle slots, which grows by design up to its
    // own limit; the RSS measured is the contexts' and the evictor's)
    let (server, port, log_path) =
        budget_server(&s, "soak", "8192", &["--cache-ram", "0"], Some("4"));
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
