//! Bad settings refused at startup; every library method listed in `--help` and the messages.

use super::*;

#[test]
fn bad_eviction_settings_are_refused_at_startup() {
    let s = fork_or_skip!();
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
                "a selection with a flat forward post-pool",
            );
        }
        refused(
            &s,
            exe,
            &["--kv-evict-links", "0.5"],
            "value links need eviction",
        );
        refused(
            &s,
            exe,
            &["--kv-mark-prompts"],
            "(--kv-mark-prompts) needs eviction",
        );
    }
    // the needle tool checks the same way before loading anything
    refused(
        &s,
        "llama-kvevict-needle",
        &["--kv-evict", "knorm", "--kv-evict-links", "0.5"],
        "a selection with a flat forward post-pool",
    );
    refused(
        &s,
        "llama-kvevict-needle",
        &["--kv-evict-links", "nan"],
        "value-link threshold must be a number <= 1",
    );
}

/// Issue 27, finding 6: `--help` and the unknown-method message list every scoring preset the
/// library's header defines (`KVE_PRESET_*`, read here from include/kvevict.h: criticalkv named as
/// not offered), and `llama-kvevict-needle --help` prints its usage and methods.
#[test]
fn every_library_method_is_listed_and_the_needle_tool_has_help() {
    let s = fork_or_skip!();
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
