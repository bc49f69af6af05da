//! `include/kvevict.h` is generated from `src/capi` with cbindgen; this test fails when the
//! committed header is stale (`KVEVICT_BLESS=1` rewrites it) and compiles it as strict C99
//! and C++17.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn generate() -> String {
    let root = root();
    let mut cfg = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    cfg.after_includes = Some(kvevict::capi::header_defines());
    let bindings = cbindgen::Builder::new()
        .with_crate(&root)
        .with_config(cfg)
        .generate()
        .expect("cbindgen failed");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("utf-8 header")
}

#[test]
fn header_is_current() {
    let path = root().join("include/kvevict.h");
    let fresh = generate();
    if std::env::var_os("KVEVICT_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &fresh).expect("write header");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/kvevict.h is stale: regenerate with `KVEVICT_BLESS=1 cargo test --test header`"
    );
}

fn compile(compiler: &str, args: &[&str], src: &Path, dir: &Path) {
    let out = dir.join(format!("{}.o", compiler.replace('+', "x")));
    let st = Command::new(compiler)
        .args(args)
        .arg("-I")
        .arg(root().join("include"))
        .arg("-c")
        .arg(src)
        .arg("-o")
        .arg(&out)
        .output();
    match st {
        Err(e) => panic!("cannot run {compiler}: {e}"),
        Ok(o) => assert!(
            o.status.success(),
            "{compiler} {args:?} rejects the header:\n{}",
            String::from_utf8_lossy(&o.stderr)
        ),
    }
}

#[test]
fn header_compiles_strict() {
    let dir = std::env::temp_dir().join(format!("kvevict-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // every declaration used once, so the compilers see the whole header
    let body = r#"
#include "kvevict.h"
int use_header(void);
int use_header(void) {
    kve_score_params sp;
    kve_select_params sel;
    kve_layer_inputs in;
    kve_tensor t;
    kve_search s;
    kve_histogram h;
    kve_model_scores m;
    uint64_t x = 0;
    int32_t st = kve_score_params_init(&sp, (uint32_t)sizeof sp, KVE_PRESET_LAPROX_SPAN);
    st |= kve_select_params_init(&sel, (uint32_t)sizeof sel, KVE_ALLOCATOR_GLOBAL, KVE_GRANULARITY_TOKEN, 10);
    st |= kve_layer_inputs_init(&in, (uint32_t)sizeof in);
    t.data = 0; t.len = 0; t.dtype = KVE_DTYPE_F16; t.pad = 0;
    t.extent[0] = 1; t.stride[0] = 1;
    m.scores = 0; m.len = 0;
    st |= kve_score_workspace_size(&sp, 1, 1, 1, 1, 1, &x);
    st |= kve_histogram_clear(&h);
    st |= kve_search_init(&s, &sel, 1, 1, 1, 1);
    (void)kve_status_name(st); (void)kve_status_message(KVE_ERR_ALIASING);
    (void)kve_version_string();
    return (int)(kve_version() == KVE_VERSION_NUMBER) + (int)t.dtype + (int)m.len + (int)x;
}
"#;
    let c = dir.join("use.c");
    let cc = dir.join("use.cpp");
    std::fs::write(&c, body).unwrap();
    std::fs::write(&cc, body).unwrap();
    compile(
        "gcc",
        &["-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror"],
        &c,
        &dir,
    );
    compile(
        "g++",
        &["-std=c++17", "-Wall", "-Wextra", "-pedantic", "-Werror"],
        &cc,
        &dir,
    );
    let _ = std::fs::remove_dir_all(&dir);
}
