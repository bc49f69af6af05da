//! Smoke test of `eval/decode/kvevict_decode_bench` (issue 28), the decode-time benchmark tool
//! against the llama.cpp fork: built here with `eval/decode/build.sh` against the fork's build,
//! run on a tiny text and a tiny conversation with a 64-cell budget (seconds, not a benchmark):
//!
//! - streaming perplexity through the fork's budget: evictions happen, never more than the
//!   budget held, every token past the budget scored; llama.cpp's context shift at the same
//!   cell count shifts and holds less than the budget;
//! - conversation recall: every question answered at each checkpoint, from the same cells;
//! - `--kept` (what the cache holds of each fact when asked) and the diagnosis's oracle marks
//!   (`--mark values`);
//! - the engine's marks: user turns (`--mark user`), llama-server's prompt-batch proxy
//!   (`--mark prompt`, with `--mark-cap`; in ppl mode the first tokens as the prompt's, which
//!   changes what is kept), the marked budget split over the turns (`--mark-split spans`), each
//!   message's range its own (`--mark-ranges messages`), the fork's own marks of each prompt
//!   (`--mark-split prompts`, llama-server's `--kv-mark-prompts`), a share the fork refuses said and exit 1;
//! - bad input said and finished (exit 0): a budget not above the window (refused, with the
//!   fork's reason), a text shorter than the budget, a conversation that never exceeds it.
//!
//! Needs `KVEVICT_FORK_BIN` (the fork's build/bin, llama_fork/build.sh prints it) and
//! `KVEVICT_LLAMA_MODEL` (SmolLM2-135M-Instruct Q4_1); skips with a message without them.

use std::path::{Path, PathBuf};
use std::process::Command;

fn setup() -> Option<(PathBuf, PathBuf)> {
    let bin = std::env::var_os("KVEVICT_FORK_BIN").map(PathBuf::from);
    let model = std::env::var_os("KVEVICT_LLAMA_MODEL").map(PathBuf::from);
    match (bin, model) {
        (Some(bin), Some(model)) if bin.join("libllama.so").is_file() && model.is_file() => {
            // the fork's folder: <dir>/build/bin
            let fork = bin.parent()?.parent()?.to_path_buf();
            if !fork.join("src/include/llama.h").is_file() {
                eprintln!(
                    "SKIPPED tests/decode_bench.rs: no llama.h under {}",
                    fork.display()
                );
                return None;
            }
            let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kvevict_decode_bench");
            let st = Command::new("bash")
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("eval/decode/build.sh"))
                .env("KVEVICT_FORK_DIR", &fork)
                .env("KVEVICT_DECODE_OUT", &out)
                .status()
                .expect("bash");
            assert!(st.success(), "eval/decode/build.sh failed");
            Some((out, model))
        }
        _ => {
            eprintln!(
                "SKIPPED tests/decode_bench.rs: set KVEVICT_FORK_BIN (llama_fork/build.sh) and KVEVICT_LLAMA_MODEL"
            );
            None
        }
    }
}

/// The tool's JSON lines (flat objects), as (key, raw value) lists.
fn run(tool: &Path, args: &[&str]) -> Vec<Vec<(String, String)>> {
    let o = Command::new(tool)
        .args(args)
        .output()
        .expect("run the tool");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{args:?} failed: {err}");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| parse(l))
        .collect()
}

/// The tool run on bad input: exit 1, `said` on stderr.
fn fails(tool: &Path, args: &[&str], said: &str) {
    let o = Command::new(tool)
        .args(args)
        .output()
        .expect("run the tool");
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains(said), "{o:?}");
}

fn parse(line: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let b = line.trim().trim_start_matches('{').trim_end_matches('}');
    let (mut key, mut cur, mut in_str, mut esc, mut is_key) =
        (String::new(), String::new(), false, false, true);
    for c in b.chars() {
        if in_str {
            if esc {
                esc = false;
                cur.push(c);
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
            } else {
                cur.push(c);
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            ':' if is_key => {
                key = std::mem::take(&mut cur);
                is_key = false;
            }
            ',' => {
                out.push((std::mem::take(&mut key), std::mem::take(&mut cur)));
                is_key = true;
            }
            _ => cur.push(c),
        }
    }
    out.push((key, cur));
    out
}

fn get<'a>(r: &'a [(String, String)], k: &str) -> &'a str {
    r.iter()
        .find(|(a, _)| a == k)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {k} in {r:?}"))
}
fn num(r: &[(String, String)], k: &str) -> f64 {
    get(r, k)
        .parse()
        .unwrap_or_else(|_| panic!("{k} not a number in {r:?}"))
}

const TEXT: &str = "The river rose slowly through the night, and by morning the lower fields were under water. \
The farmers moved their animals to the hill behind the church, where the old stone wall kept the wind away. \
Children carried bread and blankets up the path, and the baker kept his oven burning until noon. \
When the rain stopped, the water went down as quietly as it had come, leaving mud, broken fences and a smell of wet hay. \
Nobody in the village could remember a flood like it, although the oldest woman said her mother had told of one. \
In the weeks that followed, everyone helped to rebuild the fences, and the council paid for a new bridge over the stream. ";

#[test]
fn the_tool_measures_under_a_budget_and_says_what_it_cannot_do() {
    let Some((tool, model)) = setup() else { return };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("decode_bench");
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("text.txt");
    std::fs::write(&text, TEXT.repeat(2)).unwrap();
    let (m, t) = (model.to_str().unwrap(), text.to_str().unwrap());
    let ppl = |method: &str, budget: &str| {
        let mut v = run(
            &tool,
            &[
                "-m", m, "--mode", "ppl", "--input", t, "--method", method, "--budget", budget,
            ],
        );
        assert_eq!(v.len(), 1);
        v.remove(0)
    };
    let full = ppl("full", "0");
    let n = num(&full, "tokens");
    assert!(n > 200.0, "{full:?}");
    for method in ["uniqueness", "tova"] {
        let r = ppl(method, "64");
        assert_eq!(get(&r, "status"), "ok", "{r:?}");
        assert!(num(&r, "evictions") >= 2.0, "{method}: {r:?}");
        assert!(num(&r, "most_cells") <= 64.0, "{method}: {r:?}");
        assert_eq!(num(&r, "scored"), n - 64.0, "{method}: {r:?}");
        assert!(num(&r, "nll").is_finite() && num(&r, "nll") > 0.0, "{r:?}");
        // the fork's eviction time is inside the decode time it is a share of
        assert!(num(&r, "evict_ms") <= num(&r, "decode_wall_ms"), "{r:?}");
    }
    // llama-server's proxy on a generation after a prompt: the first 64 tokens marked as the
    // prompt's; the budget still holds, and the marked cells change what is kept
    let plain = ppl("laprox-span", "64");
    let mut v = run(
        &tool,
        &[
            "-m",
            m,
            "--mode",
            "ppl",
            "--input",
            t,
            "--method",
            "laprox-span",
            "--budget",
            "64",
            "--mark",
            "prompt",
            "--mark-share",
            "0.75",
            "--prompt-tokens",
            "64",
        ],
    );
    let pm = v.remove(0);
    assert_eq!(get(&pm, "status"), "ok", "{pm:?}");
    assert!(num(&pm, "most_cells") <= 64.0, "{pm:?}");
    assert_eq!(num(&pm, "scored"), num(&plain, "scored"), "{pm:?}");
    assert_ne!(num(&pm, "nll"), num(&plain, "nll"), "{pm:?} {plain:?}");
    let cs = ppl("ctxshift", "64");
    assert_eq!(get(&cs, "status"), "ok", "{cs:?}");
    assert!(
        num(&cs, "shifts") >= 2.0 && num(&cs, "most_cells") < 64.0,
        "{cs:?}"
    );
    // bad input: said, recorded, exit 0 (a budget within laprox-span's window of 8; TOVA's
    // window of 1 fits a budget of 4)
    let small = ppl("laprox-span", "4");
    assert_eq!(get(&small, "status"), "refused", "{small:?}");
    assert!(get(&small, "note").contains("window"), "{small:?}");
    let long = ppl("uniqueness", "4096");
    assert_eq!(get(&long, "status"), "no-tokens-scored", "{long:?}");
    assert!(
        get(&long, "note").contains("does not exceed the budget"),
        "{long:?}"
    );
    assert_eq!(num(&long, "evictions"), 0.0);

    // a conversation: a fact, filler turns, two checkpoints
    let chat = dir.join("chat.tsv");
    let mut s = String::from("M\tsystem\tYou are a helpful assistant.\nM\tuser\tMy dog is called Biscuit.\nM\tassistant\tNoted.\n");
    for i in 0..6 {
        s += &format!(
            "M\tuser\tTell me about the flood, part {i}.\nM\tassistant\t{}\n",
            &TEXT[..300]
        );
    }
    s += "Q\tdog\tWhat is my dog called?\tYour dog is called\t Biscuit\t Pepper\t Rocky\n";
    std::fs::write(&chat, s).unwrap();
    let c = chat.to_str().unwrap();
    let chat_args = |method: &'static str, budget: &'static str, extra: &[&'static str]| {
        let mut a = vec!["-m", m, "--mode", "chat", "--input", c, "--method", method];
        a.extend(["--budget", budget]);
        a.extend(extra);
        a
    };
    // every run below: two checkpoints of one question, then its own flags
    let checkpoints = ["--at", "150,300", "--gen", "4"];
    // the engine's marks (llama_kv_evict_mark, last): the user and system turns marked, every
    // kept cell reserved for them where they fit; the budget still holds
    let marks = ["--mark", "user", "--mark-share", "1"];
    // llama-server's proxy (every prompt batch's tokens: all but the assistant's replies), the
    // oldest 40 marked tokens only
    let prompt_marks = [
        "--mark",
        "prompt",
        "--mark-share",
        "0.75",
        "--mark-cap",
        "40",
    ];
    // the marked budget split over the marked turns (the fork's kv_evict_mark_split 1)
    let split_marks = [
        "--mark",
        "user",
        "--mark-share",
        "1",
        "--mark-split",
        "spans",
    ];
    // each message's range its own (`--mark-ranges messages`: the system prompt and the first
    // user turn two spans, also inside Gemma's first turn), value links inside the spans
    let message_marks = [
        &split_marks[..],
        &["--links", "0.5", "--mark-ranges", "messages"],
        &["--chat-template", "gemma"],
    ]
    .concat();
    // llama-server's --kv-mark-prompts (`--mark-split prompts`): the fork marks each prompt (each
    // multi-token decode) itself, the tool feeds the replies a token a call, value links inside the spans
    let server_marks = ["--mark-split", "prompts", "--links", "0.5"];
    // another template than the model's (a GGUF without one, e.g. Gemma 3 270M's: `--chat-template gemma`);
    // Gemma's writes the system turn with the first user turn (an empty first turn's text: the BOS)
    let gemma = ["--chat-template", "gemma"];
    for (method, budget, extra) in [
        ("uniqueness", "64", &[][..]),
        ("ctxshift", "64", &[][..]),
        ("uniqueness", "64", &marks[..]),
        ("uniqueness", "64", &split_marks[..]),
        ("uniqueness", "64", &message_marks[..]),
        ("laprox-span", "64", &prompt_marks[..]),
        ("uniqueness", "64", &server_marks[..]),
        ("uniqueness", "64", &gemma[..]),
    ] {
        let mut args = chat_args(method, budget, &checkpoints);
        args.extend(extra);
        let v = run(&tool, &args);
        assert_eq!(
            v.len(),
            3,
            "two checkpoints of one question, then the summary: {v:?}"
        );
        for q in &v[..2] {
            assert_eq!(get(q, "status"), "ok", "{q:?}");
            assert!(num(q, "lp_value") < 0.0, "{q:?}");
            assert!(num(q, "cells") <= 64.0, "{q:?}");
        }
        assert!(
            num(&v[0], "history") >= 150.0 && num(&v[1], "history") >= 300.0,
            "{v:?}"
        );
        assert_eq!(num(&v[2], "asked"), 2.0);
        // the summary's field, the option that sets it, its value when not given
        for (field, option, default) in [
            ("mark", "--mark", "none"),
            ("mark_split", "--mark-split", "none"),
            ("mark_ranges", "--mark-ranges", "merged"),
            ("template", "--chat-template", "model"),
        ] {
            let given = extra.iter().position(|&x| x == option);
            let want = given.map_or(default, |i| extra[i + 1]);
            assert_eq!(get(&v[2], field), want, "{v:?}");
        }
    }
    // a share outside [0, 1] is refused by the fork (LLAMA_KV_EVICT_ERR_ARG), said and exit 1
    fails(
        &tool,
        &chat_args("uniqueness", "64", &["--mark", "user", "--mark-share", "2"]),
        "llama_kv_evict_mark",
    );
    // the fork's own prompt marks take no marks of the tool's: said, exit 2
    let o = Command::new(&tool)
        .args(chat_args(
            "uniqueness",
            "64",
            &["--mark", "user", "--mark-split", "prompts"],
        ))
        .output()
        .expect("run the tool");
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("without --mark"),
        "{o:?}"
    );
    let v = run(&tool, &chat_args("uniqueness", "2048", &[]));
    assert!(
        get(v.last().unwrap(), "note").contains("never exceeds the budget"),
        "{v:?}"
    );

    // where the facts are told (`F id i`: the message that tells question id's fact): a
    // checkpoint asks only the facts told before it, and a fact told after the first
    // `--facts-by` tokens is said (the run goes on)
    let late = dir.join("late.tsv");
    let mut s = String::from("M\tsystem\tYou are a helpful assistant.\nM\tuser\tMy dog is called Biscuit.\nM\tassistant\tNoted.\n");
    let filler = |s: &mut String, n: usize| {
        for i in 0..n {
            *s += &format!(
                "M\tuser\tTell me about the flood, part {i}.\nM\tassistant\t{}\n",
                &TEXT[..300]
            );
        }
    };
    filler(&mut s, 2);
    s += "M\tuser\tMy cat is called Tofu.\nM\tassistant\tNoted.\n";
    filler(&mut s, 4);
    s += "Q\tdog\tWhat is my dog called?\tYour dog is called\t Biscuit\t Pepper\t Rocky\n";
    s += "Q\tcat\tWhat is my cat called?\tYour cat is called\t Tofu\t Sprout\t Quill\n";
    s += "F\tdog\t1\nF\tcat\t7\n";
    std::fs::write(&late, s).unwrap();
    let l = late.to_str().unwrap();
    let v = run(
        &tool,
        &[
            "-m",
            m,
            "--mode",
            "chat",
            "--input",
            l,
            "--method",
            "uniqueness",
            "--budget",
            "64",
            "--at",
            "100,400",
            "--gen",
            "4",
            "--facts-by",
            "64",
        ],
    );
    assert_eq!(
        v.len(),
        4,
        "the dog at the first checkpoint, both at the second, the summary: {v:?}"
    );
    assert_eq!(get(&v[0], "question"), "dog", "{v:?}");
    assert!(
        num(&v[0], "told") > 0.0 && num(&v[0], "told") <= 64.0,
        "{v:?}"
    );
    let cat_told = num(&v[2], "told");
    assert_eq!(get(&v[2], "question"), "cat", "{v:?}");
    assert!(
        cat_told > num(&v[0], "history") && cat_told <= num(&v[2], "history"),
        "{v:?}"
    );
    let sum = &v[3];
    assert_eq!(num(sum, "asked"), 3.0, "{sum:?}");
    assert_eq!(num(sum, "facts_end"), cat_told, "{sum:?}");
    let note = get(sum, "note");
    assert!(
        note.contains("not every fact is told within the first 64 tokens: cat"),
        "{note}"
    );
    assert!(note.contains("not told yet: cat"), "{note}");
    // `--kept` (the diagnosis of design §3c, eighth pass): how many cells of the fact's turn and of
    // its value the cache holds when asked, read from the saved state. The full cache holds every
    // one; under a budget, the oracle marks of the values alone with every kept cell reserved for
    // them (`--mark values --mark-share 1`) hold the value's cells, and the budget still holds
    let kept = dir.join("kept.tsv");
    std::fs::write(
        &kept,
        std::fs::read_to_string(&late)
            .unwrap()
            .replace("F\tcat\t7\n", "")
            .replace(
                "Q\tcat\tWhat is my cat called?\tYour cat is called\t Tofu\t Sprout\t Quill\n",
                "",
            ),
    )
    .unwrap();
    let k = kept.to_str().unwrap();
    for (method, extra) in [
        ("full", &[][..]),
        ("uniqueness", &["--mark", "values", "--mark-share", "1"][..]),
    ] {
        let mut a = vec![
            "-m", m, "--mode", "chat", "--input", k, "--method", method, "--budget", "64", "--at",
            "300", "--gen", "4", "--kept",
        ];
        a.extend(extra);
        let v = run(&tool, &a);
        assert_eq!(v.len(), 2, "one question, then the summary: {v:?}");
        let q = &v[0];
        assert_eq!(get(q, "question"), "dog", "{q:?}");
        let (fc, vc) = (num(q, "fact_cells"), num(q, "value_cells"));
        assert!(
            fc > vc && vc >= 1.0,
            "the turn holds the value's tokens: {q:?}"
        );
        assert_eq!(num(q, "value_held"), vc, "{q:?}");
        if method == "full" {
            assert_eq!(num(q, "held"), num(q, "history"), "{q:?}");
            assert_eq!(num(q, "fact_held"), fc, "{q:?}");
        } else {
            assert!(num(q, "held") <= 64.0 && num(q, "cells") <= 64.0, "{q:?}");
        }
    }
    // a record naming no question is bad input: said, exit 1
    std::fs::write(
        &late,
        std::fs::read_to_string(&late).unwrap() + "F\tfish\t1\n",
    )
    .unwrap();
    fails(
        &tool,
        &["-m", m, "--mode", "chat", "--input", l, "--method", "full"],
        "bad record: F fish",
    );
}
