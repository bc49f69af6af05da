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
//! The needle tests that compare methods on one prompt run them from one prefill
//! (`--kv-evict A,B,...`: the first entry's context prefills, the later entries load its
//! prefilled sequence; `needle_entries`), checked against separate runs
//! (`one_prefill_for_several_entries_matches_separate_runs`).
//!
//! Needs `KVEVICT_FORK_BIN` (llama_fork/build.sh prints it) and `KVEVICT_LLAMA_MODEL`;
//! skips with a message without them, unless `KVEVICT_FORK_REQUIRED=1`
//! (scripts/test.d/60-llama-fork.sh sets it, so there a missing build fails).

#[path = "../result_row/mod.rs"]
mod result_row;

/// The fork's [`Setup`], or return from the test (no fork or model: `setup` says so, and
/// fails instead with `KVEVICT_FORK_REQUIRED=1`).
macro_rules! fork_or_skip {
    () => {
        match setup() {
            Some(s) => s,
            None => return,
        }
    };
}

mod chat;
mod device;
mod needle;
mod refusals;
mod server;
mod sliding_window;
mod state;

use result_row::{report, Row, PROMPTS};

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
                "SKIPPED tests/llama_fork/: set KVEVICT_FORK_BIN (llama_fork/build.sh) and KVEVICT_LLAMA_MODEL, \
                 or run scripts/test.d/60-llama-fork.sh"
            );
            None
        }
    }
}

/// `-t N -tb N` with `KVEVICT_FORK_THREADS=N`, nothing without: appended after a test's own
/// arguments (the last `-t` counts), so every llama-kvevict-needle, llama-cli and llama-server
/// that runs a model uses N threads. scripts/test.d/60-llama-fork.sh sets 1 and runs two tests at
/// once (`--test-threads 2`): on 2 cores that keeps both busy through each test's single-threaded
/// parts (model load, kvevict's scoring, the emulator, HTTP turns, decode's per-token barriers);
/// ggml's CPU results do not depend on the thread count (each row is one thread's).
fn thread_args() -> Vec<String> {
    match std::env::var("KVEVICT_FORK_THREADS") {
        Ok(n) if !n.is_empty() => {
            assert!(
                n.parse::<u32>().is_ok_and(|n| n > 0),
                "KVEVICT_FORK_THREADS={n}"
            );
            vec!["-t".into(), n.clone(), "-tb".into(), n]
        }
        _ => Vec::new(),
    }
}

/// llama-kvevict-needle's RESULT rows (with `thread_args`).
fn needle_rows(s: &Setup, args: &[&str]) -> Vec<Row> {
    let threads = thread_args();
    let args: Vec<&str> = args
        .iter()
        .copied()
        .chain(threads.iter().map(String::as_str))
        .collect();
    result_row::run_rows(&s.bin.join("llama-kvevict-needle"), &s.model, &args)
}

fn needle(s: &Setup, args: &[&str]) -> Row {
    let mut rows = needle_rows(s, args);
    assert_eq!(rows.len(), 1, "one RESULT line");
    rows.remove(0)
}

/// `--kv-evict` with several entries (`METHOD`, `full`, `METHOD+holes`), `common` before it: the
/// prompt prefilled once, in the first entry's context; every later entry loads that prefilled
/// sequence into a fresh context of its own and must read no window queries (the tool refuses
/// one that does). One RESULT row per entry, in order, each what a run of that entry alone gives
/// (`one_prefill_for_several_entries_matches_separate_runs`).
fn needle_entries(s: &Setup, common: &[&str], entries: &[&str]) -> Vec<Row> {
    let list = entries.join(",");
    let rows = needle_rows(s, &[common, &["--kv-evict", &list]].concat());
    check_entries(&rows, entries);
    rows
}

/// The rows of a run with the `--kv-evict` entries `entries`: one each, in order, the first
/// prefilled, the later ones on its prefilled sequence.
fn check_entries(rows: &[Row], entries: &[&str]) {
    assert_eq!(rows.len(), entries.len(), "one RESULT line per entry");
    for (i, (r, e)) in rows.iter().zip(entries).enumerate() {
        assert_eq!(r.num("entry"), i as f64, "{e}: entry");
        assert_eq!(r.get("method"), e.trim_end_matches("+holes"), "entry {i}");
        assert_eq!(r.num("holes") == 1.0, e.ends_with("+holes"), "{e}: holes");
        assert_eq!(r.num("prefilled") == 1.0, i == 0, "{e}: prefilled");
    }
}

/// The needle tool's arguments for the prompt at `depth` with `seed`, then `rest`.
fn at<'a>(depth: &'a str, seed: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    [&["--needle", depth, "--seed", seed][..], rest].concat()
}

fn needle_with(s: &Setup, common: &[&str], extra: &[&str]) -> Row {
    needle(s, &[common, extra].concat())
}

/// llama-kvevict-needle -v with libllama from `lib` (LD_LIBRARY_PATH goes ahead of the binary's
/// RUNPATH) and the device path forced or not: (RESULT row if it ran, stderr, success).
fn needle_path(
    s: &Setup,
    lib: Option<&Path>,
    device: bool,
    args: &[&str],
) -> (Option<Row>, String, bool) {
    let (rows, err, ok) = needle_path_rows(s, lib, device, args);
    (rows.into_iter().next(), err, ok)
}

/// `needle_path` with every RESULT row (several `--kv-evict` entries).
fn needle_path_rows(
    s: &Setup,
    lib: Option<&Path>,
    device: bool,
    args: &[&str],
) -> (Vec<Row>, String, bool) {
    let mut c = Command::new(s.bin.join("llama-kvevict-needle"));
    c.arg("-m")
        .arg(&s.model)
        .args(args)
        .args(thread_args())
        .arg("-v");
    if let Some(lib) = lib {
        c.env("LD_LIBRARY_PATH", lib);
    }
    if device {
        c.env("KVEVICT_FORK_DEVICE_PATH", "1");
    } else {
        c.env_remove("KVEVICT_FORK_DEVICE_PATH");
    }
    let o = c.output().expect("run llama-kvevict-needle");
    let rows = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT ").map(Row::parse))
        .collect();
    (
        rows,
        String::from_utf8_lossy(&o.stderr).to_string(),
        o.status.success(),
    )
}

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

/// A `--state-file` path of this process in the temporary folder, `kvevict-{what}-{pid}.bin`, as a
/// path and as the tools' argument.
fn state_file(what: &str) -> (std::path::PathBuf, String) {
    let path = std::env::temp_dir().join(format!("kvevict-{what}-{}.bin", std::process::id()));
    let path_str = path.to_str().unwrap().to_string();
    (path, path_str)
}

/// The tool's arguments that compress the prompt to 10 % with flash attention `flash` and save
/// the sequence state to `path` (a [`state_file`]).
fn keep_and_save<'a>(flash: &'a str, path: &'a str) -> [&'a str; 6] {
    [
        "--flash-attn",
        flash,
        "--kv-keep",
        "0.1",
        "--state-file",
        path,
    ]
}

/// The files `--state-file PATH` leaves: PATH, PATH.full, PATH.txt and (with `--restore-max-cells`)
/// PATH.restored.
fn remove_state_files(path: &str) {
    for suffix in ["", ".full", ".txt", ".restored"] {
        let _ = std::fs::remove_file(format!("{path}{suffix}"));
    }
}

/// The positions of the cells a single-stream, one-sequence state file holds
/// (`llama_state_seq_save_file`; llama_fork/state_cells.py reads it the same way).
fn state_positions(path: &str) -> Vec<i32> {
    let b = std::fs::read(path).unwrap();
    let word = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    assert_eq!(word(0), 0x6767_7371, "{path}: not a sequence state file");
    let o = 12 + 4 * word(8) as usize; // after the token list
    assert_eq!(word(o), 1, "{path}: one stream expected");
    (0..word(o + 4) as usize)
        .map(|c| {
            let at = o + 8 + 12 * c; // each cell: position, 1, the sequence
            assert_eq!(word(at + 4), 1, "{path}: a cell of one sequence expected");
            word(at) as i32
        })
        .collect()
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
            .args(thread_args())
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

/// A chat's messages as `/v1/chat/completions` takes them: `[{"role":..,"content":..},..]`.
fn messages_json(messages: &[(String, String)]) -> String {
    let m: Vec<String> = messages
        .iter()
        .map(|(r, c)| format!("{{\"role\":\"{r}\",\"content\":\"{}\"}}", json_escape(c)))
        .collect();
    format!("[{}]", m.join(","))
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
        "{{\"messages\":{},\"max_tokens\":{max_tokens},\"temperature\":0,\"cache_prompt\":{cache_prompt}}}",
        messages_json(messages)
    );
    match http(port, "POST", "/v1/chat/completions", &body) {
        Ok((200, b)) => Ok((
            json_string(&b[b.find("\"message\"").unwrap_or(0)..], "content").unwrap_or_default(),
            json_number(&b, "prompt_tokens").unwrap_or(0.0),
        )),
        other => Err(format!("{other:?}")),
    }
}
