//! One source for the CUDA launcher contract: `cuda/kvevict_cuda.h` (what the kernels'
//! launchers are) against the Rust declarations of them, `src/cuda.rs`'s `extern "C"`
//! blocks (the only Rust side: the kernels' plain-Rust double is gone, the emulator runs
//! the kernels themselves). Fails
//! on a launcher missing on either side, a different argument count, argument or return
//! type, a struct whose fields (names, types, order) differ or that is not `#[repr(C)]`,
//! and a `KVE_CUDA_*` constant with another value. Text only: runs in every build (no
//! CUDA feature needed); with a CUDA feature the Rust structs' sizes are checked against
//! the header's C layout too.

use std::collections::BTreeMap;
use std::path::PathBuf;

fn read(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A function: argument types and return type, canonical (Rust spelling: `*const f32`,
/// `i64`, `KveCudaView`, `()`).
#[derive(Debug, PartialEq, Clone)]
struct Sig {
    args: Vec<String>,
    ret: String,
}

#[derive(Debug, Default)]
struct Decls {
    fns: BTreeMap<String, Sig>,
    /// struct name (Rust spelling) -> fields (name, canonical type); `repr_c` for Rust.
    structs: BTreeMap<String, (Vec<(String, String)>, bool)>,
    consts: BTreeMap<String, i64>,
}

/// `kve_cuda_compact_item` -> `KveCudaCompactItem`.
fn camel(c: &str) -> String {
    c.split('_')
        .map(|w| {
            let mut ch = w.chars();
            ch.next()
                .map(|f| f.to_ascii_uppercase().to_string() + ch.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// A C type (`const int32_t*`, `size_t`, `kve_cuda_view`) in Rust spelling.
fn c_type(t: &str) -> String {
    let t = t.replace('*', " * ");
    let words: Vec<&str> = t.split_whitespace().collect();
    let stars = words.iter().filter(|w| **w == "*").count();
    let is_const = words.first() == Some(&"const");
    let base: Vec<&str> = words
        .iter()
        .copied()
        .filter(|w| *w != "*" && *w != "const" && *w != "struct")
        .collect();
    let b = match base.join(" ").as_str() {
        "int" | "int32_t" => "i32".to_string(),
        "int64_t" | "long long" => "i64".into(),
        "uint32_t" | "unsigned" | "unsigned int" => "u32".into(),
        "uint64_t" | "unsigned long long" => "u64".into(),
        "size_t" => "usize".into(),
        "float" => "f32".into(),
        "double" => "f64".into(),
        "void" if stars > 0 => "c_void".into(),
        "void" => "()".into(),
        other if base.len() == 1 => camel(other),
        other => panic!("C type {other:?}"),
    };
    match stars {
        0 => b,
        1 if is_const => format!("*const {b}"),
        1 => format!("*mut {b}"),
        _ => panic!("C type {t:?}: one level of pointer expected"),
    }
}

/// A Rust type as written in src/ in canonical spelling.
fn rust_type(t: &str) -> String {
    let t = t
        .trim()
        .replace("core::ffi::", "")
        .replace("std::ffi::", "");
    let words: Vec<&str> = t.split_whitespace().collect();
    let canon = |w: &str| match w {
        "c_int" => "i32".to_string(),
        "c_uint" => "u32".to_string(),
        "c_float" => "f32".to_string(),
        "c_double" => "f64".to_string(),
        other => other.to_string(),
    };
    match words.as_slice() {
        [p, b] if *p == "*const" || *p == "*mut" => format!("{p} {}", canon(b)),
        [b] => canon(b),
        _ => panic!("Rust type {t:?}"),
    }
}

/// Removes /* */ and // comments.
fn strip_c_comments(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    let mut rest = s;
    loop {
        let block = rest.find("/*");
        let line = rest.find("//");
        match (block, line) {
            (Some(b), l) if l.map_or(true, |l| b < l) => {
                o.push_str(&rest[..b]);
                let end = rest[b + 2..].find("*/").expect("unterminated comment") + b + 4;
                rest = &rest[end..];
            }
            (_, Some(l)) => {
                o.push_str(&rest[..l]);
                rest = &rest[l..];
                rest = rest.find('\n').map_or("", |e| &rest[e..]);
            }
            (None, None) => {
                o.push_str(rest);
                return o;
            }
            (Some(_), None) => unreachable!(),
        }
    }
}

/// Splits `a, b(c, d), e` at top-level commas.
fn split_top(s: &str, sep: char) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0i32);
    for c in s.chars() {
        match c {
            '(' | '{' | '[' | '<' => depth += 1,
            ')' | '}' | ']' | '>' => depth -= 1,
            _ => {}
        }
        if c == sep && depth == 0 {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
        .collect()
}

/// `TYPE NAME` (C declarator: `const float* out`) -> (name, canonical type).
fn c_decl(d: &str) -> (String, String) {
    let d = d.trim();
    let cut = d
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or_else(|| panic!("C declaration {d:?}"));
    (d[cut + 1..].to_string(), c_type(&d[..cut + 1]))
}

fn parse_header(h: &str) -> Decls {
    let mut d = Decls::default();
    let mut body = String::new();
    for line in strip_c_comments(h).lines() {
        let l = line.trim();
        if let Some(def) = l.strip_prefix("#define ") {
            let mut it = def.split_whitespace();
            if let (Some(name), Some(v)) = (it.next(), it.next()) {
                if name.starts_with("KVE_CUDA_") {
                    d.consts
                        .insert(name.into(), v.parse().expect("integer #define"));
                }
            }
        } else if !l.starts_with('#') {
            body.push_str(line);
            body.push('\n');
        }
    }
    let body = body.replace("extern \"C\" {", "");
    // statements end at a ';' outside braces; the extern "C" block's own '}' is dropped
    let (mut stmts, mut cur, mut depth) = (Vec::new(), String::new(), 0i32);
    for c in body.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => continue,
            '}' => depth -= 1,
            _ => {}
        }
        if c == ';' && depth == 0 {
            stmts.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    assert!(
        cur.trim().is_empty(),
        "header ends inside a declaration: {cur:?}"
    );
    for s in stmts {
        let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
        if let Some(rest) = s.strip_prefix("typedef struct ") {
            let (name, rest) = rest.split_once('{').expect("typedef struct NAME {");
            let (fields, alias) = rest.rsplit_once('}').expect("}");
            assert_eq!(
                name.trim(),
                alias.trim(),
                "typedef struct {name} ... {alias}"
            );
            let fields = split_top(fields, ';').iter().map(|f| c_decl(f)).collect();
            d.structs.insert(camel(name.trim()), (fields, true));
        } else if let Some(open) = s.find('(') {
            let (ret_name, args) = (&s[..open], &s[open + 1..]);
            let args = args
                .trim_end()
                .strip_suffix(')')
                .expect("prototype ends with )");
            let (name, ret) = c_decl(ret_name);
            let args = split_top(args, ',').iter().map(|a| c_decl(a).1).collect();
            assert!(
                d.fns.insert(name.clone(), Sig { args, ret }).is_none(),
                "{name} twice"
            );
        } else {
            panic!("cuda/kvevict_cuda.h: cannot read {s:?}");
        }
    }
    d
}

/// Removes `//` comments (doc comments included) from Rust source.
fn strip_rust_comments(s: &str) -> String {
    s.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text from `open` (an opening bracket) to its match, exclusive of both.
fn bracketed(s: &str, open: usize) -> (&str, usize) {
    let (o, c) = match s.as_bytes()[open] {
        b'(' => (b'(', b')'),
        b'{' => (b'{', b'}'),
        x => panic!("not a bracket: {}", x as char),
    };
    let mut depth = 0;
    for (i, &b) in s.as_bytes()[open..].iter().enumerate() {
        if b == o {
            depth += 1;
        } else if b == c {
            depth -= 1;
            if depth == 0 {
                return (&s[open + 1..open + i], open + i + 1);
            }
        }
    }
    panic!("unbalanced {}", o as char);
}

/// Every `fn kve_cuda_*(...) -> T` in `src` (an extern block's declarations).
fn rust_fns(src: &str, d: &mut Decls) {
    let mut at = 0;
    while let Some(i) = src[at..].find("fn kve_cuda_") {
        let start = at + i + 3;
        let open = start + src[start..].find('(').unwrap();
        let name = src[start..open].trim().to_string();
        let (args, after) = bracketed(src, open);
        let tail = &src[after..];
        let end = tail.find([';', '{']).unwrap();
        let ret = tail[..end]
            .trim()
            .strip_prefix("->")
            .map_or("()".to_string(), rust_type);
        let args = split_top(args, ',')
            .iter()
            .map(|a| rust_type(a.split_once(':').expect("name: type").1))
            .collect();
        assert!(
            d.fns.insert(name.clone(), Sig { args, ret }).is_none(),
            "{name} twice"
        );
        at = after;
    }
}

fn parse_rust(src: &str) -> Decls {
    let src = strip_rust_comments(src);
    let mut d = Decls::default();
    // the launchers: the `extern "C"` blocks
    let mut at = 0;
    while let Some(i) = src[at..].find("extern \"C\" {") {
        let open = at + i + "extern \"C\" ".len();
        let (block, after) = bracketed(&src, open);
        rust_fns(block, &mut d);
        at = after;
    }
    // #[repr(C)] structs
    let mut at = 0;
    while let Some(i) = src[at..].find("pub struct ") {
        let s = at + i;
        let name_end = s + src[s..].find('{').unwrap();
        let name = src[s + "pub struct ".len()..name_end].trim().to_string();
        let attrs = &src[src[..s].rfind(['}', ';']).map_or(0, |p| p + 1)..s];
        let (body, after) = bracketed(&src, name_end);
        let fields = split_top(body, ',')
            .iter()
            .map(|f| {
                let (n, t) = f.split_once(':').expect("field: type");
                (
                    n.trim().trim_start_matches("pub ").trim().to_string(),
                    rust_type(t),
                )
            })
            .collect();
        d.structs
            .insert(name, (fields, attrs.contains("#[repr(C)]")));
        at = after;
    }
    // constants
    for l in src.lines() {
        if let Some(rest) = l.trim().strip_prefix("pub const KVE_CUDA_") {
            let (name, v) = rest.split_once(':').unwrap();
            let v = v.split_once('=').unwrap().1.trim().trim_end_matches(';');
            d.consts.insert(
                format!("KVE_CUDA_{}", name.trim()),
                v.parse().expect("integer"),
            );
        }
    }
    d
}

/// Every difference between the header and a Rust side, as lines.
fn diff(h: &Decls, r: &Decls, what: &str, structs_and_consts: bool) -> Vec<String> {
    let mut out = Vec::new();
    for (name, hs) in &h.fns {
        match r.fns.get(name) {
            None => out.push(format!("{name}: in the header, not in {what}")),
            Some(rs) if rs.args.len() != hs.args.len() => out.push(format!(
                "{name}: {} arguments in the header, {} in {what}",
                hs.args.len(),
                rs.args.len()
            )),
            Some(rs) => {
                for (k, (a, b)) in hs.args.iter().zip(&rs.args).enumerate() {
                    if a != b {
                        out.push(format!(
                            "{name}: argument {k} is {a} in the header, {b} in {what}"
                        ));
                    }
                }
                if hs.ret != rs.ret {
                    out.push(format!(
                        "{name}: returns {} in the header, {} in {what}",
                        hs.ret, rs.ret
                    ));
                }
            }
        }
    }
    for name in r.fns.keys().filter(|n| !h.fns.contains_key(*n)) {
        out.push(format!("{name}: in {what}, not in the header"));
    }
    if structs_and_consts {
        for (name, (hf, _)) in &h.structs {
            match r.structs.get(name) {
                None => out.push(format!("struct {name}: in the header, not in {what}")),
                Some((rf, repr_c)) => {
                    if !repr_c {
                        out.push(format!("struct {name}: not #[repr(C)] in {what}"));
                    }
                    if hf != rf {
                        out.push(format!(
                            "struct {name}: fields {hf:?} in the header, {rf:?} in {what}"
                        ));
                    }
                }
            }
        }
        for (name, v) in &h.consts {
            match r.consts.get(name) {
                Some(x) if x == v => {}
                x => out.push(format!("{name}: {v} in the header, {x:?} in {what}")),
            }
        }
        for name in r.consts.keys().filter(|n| !h.consts.contains_key(*n)) {
            out.push(format!("{name}: in {what}, not in the header"));
        }
    }
    out
}

fn header() -> Decls {
    parse_header(&read("cuda/kvevict_cuda.h"))
}

#[test]
fn rust_declarations_match_the_header() {
    let h = header();
    // every prototype was read: lines starting `int kve_cuda_` / `size_t kve_cuda_`
    let protos = read("cuda/kvevict_cuda.h")
        .lines()
        .filter(|l| l.starts_with("int kve_cuda_") || l.starts_with("size_t kve_cuda_"))
        .count();
    assert_eq!(h.fns.len(), protos, "launchers read from the header");
    assert_eq!(h.structs.len(), 3, "{:?}", h.structs.keys());
    let r = parse_rust(&read("src/cuda.rs"));
    let d = diff(&h, &r, "src/cuda.rs", true);
    assert!(
        d.is_empty(),
        "src/cuda.rs against cuda/kvevict_cuda.h:\n{}",
        d.join("\n")
    );
    println!(
        "{} launchers, {} structs, {} constants: src/cuda.rs matches cuda/kvevict_cuda.h",
        h.fns.len(),
        h.structs.len(),
        h.consts.len()
    );
}

/// The check fails on each kind of mismatch (so the tests above can fail).
#[test]
fn a_mismatch_is_caught() {
    let text = read("cuda/kvevict_cuda.h");
    let r = parse_rust(&read("src/cuda.rs"));
    assert!(diff(&parse_header(&text), &r, "rust", true).is_empty());
    for (from, to, want) in [
        // an argument type
        (
            "int64_t w,\n",
            "int w,\n",
            "kve_cuda_window: argument 2 is i32",
        ),
        // an argument's constness
        (
            "const float* row_lse",
            "float* row_lse",
            "kve_cuda_window: argument 8 is *mut f32",
        ),
        // an argument more
        (
            "float* out,\n                         void* stream",
            "float* out, int extra,\n                         void* stream",
            "kve_cuda_lava_factor: 5 arguments",
        ),
        // a return type
        (
            "size_t kve_cuda_select_workspace_size",
            "int kve_cuda_select_workspace_size",
            "returns i32",
        ),
        // a launcher the Rust side lacks
        (
            "int kve_cuda_device_count(int* out);",
            "int kve_cuda_device_count(int* out);\nint kve_cuda_new(void* stream);",
            "kve_cuda_new: in the header",
        ),
        // a struct field's type and order
        (
            "    int32_t dtype;",
            "    int64_t dtype;",
            "struct KveCudaView: fields",
        ),
        (
            "    int64_t tokens;\n    int64_t dim;",
            "    int64_t dim;\n    int64_t tokens;",
            "struct KveCudaView: fields",
        ),
        // a constant
        (
            "#define KVE_CUDA_BF16 2",
            "#define KVE_CUDA_BF16 3",
            "KVE_CUDA_BF16: 3",
        ),
    ] {
        assert!(text.contains(from), "{from:?} not in the header");
        let d = diff(&parse_header(&text.replacen(from, to, 1)), &r, "rust", true);
        assert!(
            d.iter().any(|l| l.contains(want)),
            "{from:?} -> {to:?}: {d:?}"
        );
    }
    // a Rust struct without #[repr(C)]
    let src = read("src/cuda.rs").replacen("#[repr(C)]\n", "", 1);
    let d = diff(&parse_header(&text), &parse_rust(&src), "rust", true);
    assert!(d.iter().any(|l| l.contains("not #[repr(C)]")), "{d:?}");
}

/// With a CUDA feature the Rust structs exist: their sizes are the header's C layout
/// (natural alignment, as x86-64 and aarch64 lay out these fields).
#[cfg(feature = "cuda")]
#[test]
fn struct_sizes_match_the_c_layout() {
    use kvevict::cuda::{KveCudaCompactItem, KveCudaView};
    let h = header();
    fn size_align(h: &Decls, t: &str) -> (usize, usize) {
        if t.starts_with('*') || t == "i64" || t == "u64" || t == "f64" || t == "usize" {
            return (8, 8);
        }
        if t == "i32" || t == "u32" || t == "f32" {
            return (4, 4);
        }
        let (fields, _) = &h.structs[t];
        let (mut off, mut align) = (0usize, 1usize);
        for (_, ft) in fields {
            let (s, a) = size_align(h, ft);
            off = off.next_multiple_of(a) + s;
            align = align.max(a);
        }
        (off.next_multiple_of(align), align)
    }
    assert_eq!(
        size_align(&h, "KveCudaView").0,
        std::mem::size_of::<KveCudaView>()
    );
    assert_eq!(
        size_align(&h, "KveCudaCompactItem").0,
        std::mem::size_of::<KveCudaCompactItem>()
    );
}
