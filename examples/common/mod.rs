//! What the benchmark examples share (each includes it with `mod common;`).

/// The tests' xorshift64 data source (`tests/xorshift`), one generator for both.
#[path = "../../tests/xorshift/mod.rs"]
mod xorshift;
#[allow(unused_imports)] // not every example draws random data
pub use xorshift::Rng;

/// The value after `name` on the command line, else `default`.
pub fn arg(name: &str, default: &str) -> String {
    let a: Vec<String> = std::env::args().collect();
    a.iter()
        .position(|x| x == name)
        .and_then(|i| a.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}
