//! One `RESULT {json}` line of the llama.cpp example (tests/llama_cpp.rs) and of the fork's
//! llama-kvevict-needle (tests/llama_fork/), parsed into (key, raw value) pairs.

/// Needle depth and filler seed: every other prompt of the sweep in
/// c_examples/llama_cpp/README.md (depth i/10, seed i), where the full cache answers
/// on depths 0.1 .. 0.9 (not at 0.0 nor 1.0).
pub const PROMPTS: &[(&str, &str)] = &[
    ("0.1", "1"),
    ("0.3", "3"),
    ("0.5", "5"),
    ("0.7", "7"),
    ("0.9", "9"),
];

use std::path::Path;
use std::process::Command;

/// Print a test's table, then fail with its failures, if any.
pub fn report(table: &str, failures: &[String]) {
    println!("{table}");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Runs `exe -m model args…`, asserts it succeeded, echoes its other lines to stderr and
/// returns its RESULT lines.
pub fn run_rows(exe: &Path, model: &Path, args: &[&str]) -> Vec<Row> {
    let name = exe
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().to_string());
    let t0 = std::time::Instant::now();
    let o = Command::new(exe)
        .arg("-m")
        .arg(model)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{name} {args:?} failed ({}):\n{stdout}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!(
        "{name} {} ({:.1} s)",
        args.join(" "),
        t0.elapsed().as_secs_f64()
    );
    for l in stdout.lines().filter(|l| !l.starts_with("RESULT")) {
        eprintln!("  {l}");
    }
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .map(Row::parse)
        .collect()
}

/// One RESULT line, as (key, raw value) pairs.
pub struct Row(Vec<(String, String)>);

impl Row {
    pub fn parse(line: &str) -> Row {
        // flat JSON object of numbers and strings; strings hold no '"' but escaped ones
        let body = line.trim().trim_start_matches('{').trim_end_matches('}');
        let mut out = Vec::new();
        let mut rest = body;
        while let Some(k0) = rest.find('"') {
            let after = &rest[k0 + 1..];
            let k1 = after.find('"').unwrap();
            let key = after[..k1].to_string();
            let mut v = after[k1 + 1..].trim_start_matches(':');
            let val;
            if let Some(s) = v.strip_prefix('"') {
                let mut end = 0;
                let b = s.as_bytes();
                while end < b.len() && !(b[end] == b'"' && (end == 0 || b[end - 1] != b'\\')) {
                    end += 1;
                }
                val = s[..end].to_string();
                v = &s[(end + 1).min(s.len())..];
            } else {
                let end = v.find(',').unwrap_or(v.len());
                val = v[..end].to_string();
                v = &v[end..];
            }
            out.push((key, val));
            rest = v.trim_start_matches(',');
        }
        Row(out)
    }
    /// Every (key, raw value) pair, in the line's order.
    #[allow(dead_code)] // (tests/llama_fork/ only)
    pub fn fields(&self) -> &[(String, String)] {
        &self.0
    }
    pub fn get(&self, k: &str) -> &str {
        self.0
            .iter()
            .find(|(a, _)| a == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no field {k}"))
    }
    pub fn num(&self, k: &str) -> f64 {
        self.get(k)
            .parse()
            .unwrap_or_else(|_| panic!("field {k} is not a number"))
    }
    /// The needle verdict of eval/needle.py's rule: the first digit run is the key
    /// ("exact"), starts with it ("key + more digits"), or neither.
    pub fn verdict(&self) -> &'static str {
        if self.num("correct") == 1.0 {
            "exact"
        } else if self.num("recovered") == 1.0 {
            "key + more digits"
        } else {
            "wrong"
        }
    }
}
