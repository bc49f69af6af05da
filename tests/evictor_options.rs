//! An engine's eviction options through C (`kve_evictor_options_apply`, `kve_preset_list`)
//! and the Walsh–Hadamard rotation (`kve_hadamard_blocks`): what the llama.cpp fork's
//! adapter computed itself before (issue 27), now the library's, checked against the
//! config built by hand, the messages of every refusal, and an f64 reference.

use kvevict::capi::*;
use std::ffi::{c_char, CStr, CString};

fn names(flags: u32) -> Vec<String> {
    // SAFETY: a static NUL-terminated string.
    let s = unsafe { CStr::from_ptr(kve_preset_list(flags)) };
    s.to_str().unwrap().split(", ").map(str::to_owned).collect()
}

fn preset_names() -> Vec<String> {
    (0..kve_preset_count())
        // SAFETY: a static NUL-terminated string for a known preset.
        .map(|p| {
            unsafe { CStr::from_ptr(kve_preset_name(p)) }
                .to_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[test]
fn the_method_lists_are_the_preset_table() {
    let all = preset_names();
    assert_eq!(names(0), all);
    let offered: Vec<String> = all.iter().filter(|n| *n != "criticalkv").cloned().collect();
    assert_eq!(names(KVE_OPTIONS_NO_WO_EVERY_ROUND), offered);
    assert!(offered.iter().any(|n| n == "uniqueness") && offered.len() == all.len() - 1);
    // other flags do not change the list
    assert_eq!(names(KVE_OPTIONS_TOKEN_CELLS), all);
}

/// The options of an engine like llama.cpp's (`flags`: both).
#[derive(Clone, Copy)]
struct Opts<'a> {
    method: Option<&'a str>,
    window: u32,
    keep: f64,
    max_cells: u64,
    evict_to: f64,
    links: f32,
    flags: u32,
}

const BOTH: u32 = KVE_OPTIONS_NO_WO_EVERY_ROUND | KVE_OPTIONS_TOKEN_CELLS;

impl Default for Opts<'_> {
    fn default() -> Self {
        Opts {
            method: None,
            window: 0,
            keep: 0.0,
            max_cells: 0,
            evict_to: 0.75,
            links: 0.0,
            flags: BOTH,
        }
    }
}

/// `kve_evictor_options_apply`: the status, the config, the requirements, the message.
fn apply(
    o: Opts,
) -> (
    i32,
    kve_evictor_config,
    kve_evictor_requirements,
    Option<String>,
) {
    let name = o.method.map(|m| CString::new(m).unwrap());
    let opts = kve_evictor_options {
        struct_size: KVE_EVICTOR_OPTIONS_V1_SIZE,
        flags: o.flags,
        method: name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()),
        max_cells: o.max_cells,
        window: o.window,
        link_threshold: o.links,
        keep_ratio: o.keep,
        evict_to: o.evict_to,
    };
    // canaries: a refusal writes neither
    let mut c = hand(0);
    c.window = 12345;
    let mut req = kve_evictor_requirements {
        struct_size: 0,
        queries: 7,
        values: 7,
        wo: 7,
        row_lse_helps: 7,
        window: 7,
        granularity: 7,
    };
    let mut msg: *const c_char = 1 as *const c_char;
    // SAFETY: valid pointers of the sizes passed.
    let st = unsafe {
        kve_evictor_options_apply(
            &opts,
            &mut c,
            KVE_EVICTOR_CONFIG_V2_SIZE,
            &mut req,
            KVE_EVICTOR_REQUIREMENTS_V1_SIZE,
            &mut msg,
        )
    };
    let m = (!msg.is_null()).then(|| {
        // SAFETY: a static NUL-terminated string on a refusal.
        unsafe { CStr::from_ptr(msg) }.to_str().unwrap().to_owned()
    });
    if st != KVE_OK {
        assert_eq!(
            (c.window, req.window),
            (12345, 7),
            "a refusal wrote an output"
        );
    }
    (st, c, req, m)
}

/// `kve_evictor_config_init` of `preset`, the one-cell model the options' config carries.
fn hand(preset: u32) -> kve_evictor_config {
    let mut c = std::mem::MaybeUninit::<kve_evictor_config>::uninit();
    // SAFETY: a writable struct of the size passed.
    let st = unsafe { kve_evictor_config_init(c.as_mut_ptr(), KVE_EVICTOR_CONFIG_V2_SIZE, preset) };
    assert_eq!(st, KVE_OK);
    // SAFETY: initialised by the call above.
    let mut c = unsafe { c.assume_init() };
    (c.layers, c.hq, c.hkv, c.dk, c.dv, c.d_model, c.max_cells) = (1, 1, 1, 1, 1, 1, 1);
    c
}

/// The fields two configs must agree on (the struct holds pointers: compared by field).
fn fields(c: &kve_evictor_config) -> String {
    format!(
        "{} {} {} {} {} {} {} {} {} {} {} {} {} {}",
        c.preset,
        c.window,
        c.granularity,
        c.policy,
        c.link_threshold,
        c.keep_ratio,
        c.min_keep,
        c.high,
        c.low,
        c.max_cells,
        c.max_seqs,
        c.layers,
        c.paged,
        c.score.is_null() && c.select.is_null()
    )
}

#[test]
fn options_give_the_config_an_engine_built_by_hand() {
    let preset = |n: &str| {
        let mut p = 0u32;
        let c = CString::new(n).unwrap();
        // SAFETY: a NUL-terminated name and an out-param.
        assert_eq!(unsafe { kve_preset_from_name(c.as_ptr(), &mut p) }, KVE_OK);
        p
    };
    // (the llama.cpp fork's evictor_config + requirements_of before issue 27's move)
    for (o, policy, keep, high, low) in [
        // a keep ratio without a method: laprox-span
        (
            Opts {
                keep: 0.1,
                ..Default::default()
            },
            KVE_POLICY_KEEP_RATIO,
            0.1,
            0,
            0,
        ),
        // a budget: floor(300 * 0.75) = 225
        (
            Opts {
                method: Some("tova-decay"),
                max_cells: 300,
                ..Default::default()
            },
            KVE_POLICY_CELLS,
            0.0,
            300,
            225,
        ),
        // both: the keep ratio's policy, the budget's bounds for the engine
        (
            Opts {
                method: Some("uniqueness"),
                keep: 0.5,
                max_cells: 257,
                evict_to: 0.5,
                links: 0.5,
                ..Default::default()
            },
            KVE_POLICY_KEEP_RATIO,
            0.5,
            257,
            128,
        ),
        // neither: explicit rounds of the default method; a window
        (
            Opts {
                window: 32,
                ..Default::default()
            },
            KVE_POLICY_EXPLICIT,
            0.0,
            0,
            0,
        ),
    ] {
        let (st, c, req, msg) = apply(o);
        assert_eq!((st, msg), (KVE_OK, None));
        let p = preset(o.method.unwrap_or("laprox-span"));
        let mut want = hand(p);
        want.window = o.window;
        want.granularity = kvevict::Granularity::Token as u32;
        want.link_threshold = o.links.max(0.0);
        want.policy = policy;
        if policy == KVE_POLICY_KEEP_RATIO {
            want.keep_ratio = keep;
        }
        (want.high, want.low) = (high, low);
        assert_eq!(fields(&c), fields(&want));
        // the requirements are kve_evictor_config_check's of the same config
        let mut r2 = req;
        let mut m: *const c_char = std::ptr::null();
        // SAFETY: valid pointers.
        let st = unsafe {
            kve_evictor_config_check(&want, &mut r2, KVE_EVICTOR_REQUIREMENTS_V1_SIZE, &mut m)
        };
        assert_eq!((st, r2), (KVE_OK, req));
        assert_eq!(req.window, if o.window > 0 { o.window } else { req.window });
        assert_eq!(req.granularity, (kvevict::Granularity::Token as u32));
        // a real shape on it makes an evictor
        let mut full = c;
        (
            full.layers,
            full.hq,
            full.hkv,
            full.dk,
            full.dv,
            full.d_model,
        ) = (2, 4, 2, 8, 8, 32);
        (full.max_cells, full.max_seqs) = (512, 3);
        let mut bytes = 0u64;
        // SAFETY: valid pointers.
        assert_eq!(unsafe { kve_evictor_size(&full, &mut bytes) }, KVE_OK);
        assert!(bytes > 0);
    }
    // without the token flag the preset's granularity stays
    let (st, c, _, _) = apply(Opts {
        method: Some("snapkv"),
        flags: 0,
        ..Default::default()
    });
    assert_eq!(
        (st, c.granularity),
        (KVE_OK, KVE_EVICTOR_PRESET_GRANULARITY)
    );
    // criticalkv is accepted by an engine that gives Wo every round
    let (st, c, req, _) = apply(Opts {
        method: Some("criticalkv"),
        flags: 0,
        ..Default::default()
    });
    assert_eq!(
        (st, c.preset, req.wo),
        (KVE_OK, preset("criticalkv"), KVE_WO_EVERY_ROUND)
    );
}

#[test]
fn refused_options_say_what_to_change() {
    let refused = |o: Opts, status: i32, says: &str| {
        let (st, _, _, msg) = apply(o);
        let msg = msg.unwrap_or_default();
        assert_eq!(st, status, "{msg}");
        assert!(msg.contains(says), "{says:?} not in {msg:?}");
        msg
    };
    let d = Opts::default;
    let links = "value-link threshold must be a number <= 1";
    for t in [f32::NAN, 1.5, f32::INFINITY] {
        refused(
            Opts {
                keep: 0.1,
                links: t,
                ..d()
            },
            KVE_ERR_INVALID_ARGUMENT,
            links,
        );
        refused(Opts { links: t, ..d() }, KVE_ERR_INVALID_ARGUMENT, links);
    }
    // an unknown method lists the known ones (criticalkv only where the engine gives Wo)
    let m = refused(
        Opts {
            method: Some("bogus"),
            ..d()
        },
        KVE_ERR_BAD_ENUM,
        "unknown eviction method (known: ",
    );
    assert!(m.contains("uniqueness") && !m.contains("criticalkv"), "{m}");
    let m = refused(
        Opts {
            method: Some("bogus"),
            flags: 0,
            ..d()
        },
        KVE_ERR_BAD_ENUM,
        "criticalkv",
    );
    assert!(m.contains("laprox-span, criticalkv, streamingllm"), "{m}");
    let long = "laprox-span-laprox-span-laprox-span-laprox-span";
    refused(
        Opts {
            method: Some(long),
            ..d()
        },
        KVE_ERR_BAD_ENUM,
        "unknown eviction method",
    );
    let m = refused(
        Opts {
            method: Some("criticalkv"),
            ..d()
        },
        KVE_ERR_INVALID_ARGUMENT,
        "reads Wo at every round",
    );
    assert!(
        m.contains("(offered: snapkv,") && !m.contains(": criticalkv"),
        "{m}"
    );
    refused(
        Opts {
            window: 4097,
            ..d()
        },
        KVE_ERR_INVALID_ARGUMENT,
        "at most 4096",
    );
    assert_eq!(
        apply(Opts {
            window: 4096,
            ..d()
        })
        .0,
        KVE_OK
    );
    for k in [f64::NAN, 1.5, -0.1] {
        refused(
            Opts { keep: k, ..d() },
            KVE_ERR_INVALID_ARGUMENT,
            "keep ratio must be in (0, 1]",
        );
    }
    for e in [0.0, 1.0, f64::NAN] {
        refused(
            Opts {
                max_cells: 256,
                evict_to: e,
                ..d()
            },
            KVE_ERR_INVALID_ARGUMENT,
            "evict-to fraction must be in (0, 1)",
        );
    }
    // laprox-span's window is 8 (the preset's): a budget of 8 cannot hold it
    refused(
        Opts {
            max_cells: 8,
            ..d()
        },
        KVE_ERR_INVALID_ARGUMENT,
        "budget must be larger than the observation window",
    );
    refused(
        Opts {
            max_cells: 10,
            window: 4,
            evict_to: 0.3,
            ..d()
        },
        KVE_ERR_INVALID_ARGUMENT,
        "must exceed the observation window",
    );
    assert_eq!(
        apply(Opts {
            max_cells: 10,
            window: 4,
            evict_to: 0.5,
            ..d()
        })
        .0,
        KVE_OK
    );
    // the evictor's own checks: links need a flat forward post-pool
    for m in ["snapkv", "streamingllm", "lava"] {
        refused(
            Opts {
                method: Some(m),
                keep: 0.1,
                links: 0.5,
                ..d()
            },
            KVE_ERR_INVALID_ARGUMENT,
            "a selection with a flat forward post-pool",
        );
    }
    refused(
        Opts {
            method: Some("tova"),
            window: 4,
            ..d()
        },
        KVE_ERR_INVALID_ARGUMENT,
        "window 1",
    );
    refused(
        Opts { flags: 4, ..d() },
        KVE_ERR_INVALID_ARGUMENT,
        "unknown option flags",
    );
}

#[test]
fn options_apply_checks_its_pointers_and_sizes() {
    let o = kve_evictor_options {
        struct_size: KVE_EVICTOR_OPTIONS_V1_SIZE,
        flags: 0,
        method: std::ptr::null(),
        max_cells: 0,
        window: 0,
        link_threshold: 0.0,
        keep_ratio: 0.0,
        evict_to: 0.0,
    };
    let mut c = hand(0);
    let mut req = std::mem::MaybeUninit::<kve_evictor_requirements>::zeroed();
    let (cs, rs) = (KVE_EVICTOR_CONFIG_V2_SIZE, KVE_EVICTOR_REQUIREMENTS_V1_SIZE);
    // SAFETY: each call passes valid pointers of the sizes given, or NULL where tested.
    unsafe {
        let nul = std::ptr::null_mut::<kve_evictor_requirements>();
        let nom = std::ptr::null_mut::<*const c_char>();
        assert_eq!(
            kve_evictor_options_apply(&o, &mut c, cs, nul, 0, nom),
            KVE_OK
        );
        assert_eq!(
            kve_evictor_options_apply(std::ptr::null(), &mut c, cs, nul, 0, nom),
            KVE_ERR_NULL_POINTER
        );
        assert_eq!(
            kve_evictor_options_apply(&o, std::ptr::null_mut(), cs, nul, 0, nom),
            KVE_ERR_NULL_POINTER
        );
        let bad = kve_evictor_options {
            struct_size: 8,
            ..o
        };
        assert_ne!(
            kve_evictor_options_apply(&bad, &mut c, cs, nul, 0, nom),
            KVE_OK
        );
        // a bad requirements size writes nothing, the config neither
        c.window = 99;
        let st = kve_evictor_options_apply(&o, &mut c, cs, req.as_mut_ptr(), 3, nom);
        assert_ne!(st, KVE_OK);
        assert_eq!(c.window, 99);
        assert_eq!(
            kve_evictor_options_apply(&o, &mut c, cs, req.as_mut_ptr(), rs, nom),
            KVE_OK
        );
        // the V1 config size is accepted (no paged fields written)
        assert_eq!(
            kve_evictor_options_apply(&o, &mut c, KVE_EVICTOR_CONFIG_V1_SIZE, nul, 0, nom),
            KVE_OK
        );
        // the message pointer may not sit inside the options
        let mut both = [o, o];
        let inside = &mut both[0].method as *mut *const c_char;
        let st = kve_evictor_options_apply(&both[1], &mut c, cs, nul, 0, inside);
        assert_eq!(st, KVE_OK); // (another struct: no overlap)
        let st = kve_evictor_options_apply(&both[0], &mut c, cs, nul, 0, inside);
        assert_eq!(st, KVE_ERR_ALIASING);
    }
}

/// `H x` by the Sylvester matrix in f64: `H[i][j] = (-1)^popcount(i & j) / sqrt(n)`.
fn hadamard_f64(x: &[f32], n: usize) -> Vec<f64> {
    let s = 1.0 / (n as f64).sqrt();
    x.chunks(n)
        .flat_map(|b| {
            (0..n).map(move |i| {
                (0..n)
                    .map(|j| {
                        let sign = if (i & j).count_ones() % 2 == 0 {
                            1.0
                        } else {
                            -1.0
                        };
                        sign * b[j] as f64
                    })
                    .sum::<f64>()
                    * s
            })
        })
        .collect()
}

/// The butterflies as the fork's adapter ran them before (`hadamard_blocks` in
/// `src/llama-kv-evict.cpp`), `1.0f / sqrtf(n)`.
fn hadamard_fork(x: &mut [f32], n: usize) {
    let scale = 1.0f32 / (n as f32).sqrt();
    for b in x.chunks_mut(n) {
        let mut h = 1;
        while h < n {
            for i in (0..n).step_by(2 * h) {
                for j in i..i + h {
                    let (u, v) = (b[j], b[j + h]);
                    b[j] = u + v;
                    b[j + h] = u - v;
                }
            }
            h *= 2;
        }
        b.iter_mut().for_each(|v| *v *= scale);
    }
}

#[test]
fn hadamard_blocks_match_the_matrix_and_the_old_adapter_bit_for_bit() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    };
    for n in [1usize, 2, 4, 8, 32, 64, 128, 256] {
        let x: Vec<f32> = (0..3 * n).map(|_| rnd()).collect();
        let mut y = x.clone();
        // SAFETY: a buffer of the length given.
        assert_eq!(
            unsafe { kve_hadamard_blocks(y.as_mut_ptr(), y.len() as u64, n as u64) },
            KVE_OK
        );
        let mut old = x.clone();
        hadamard_fork(&mut old, n);
        assert_eq!(
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            old.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "block {n}"
        );
        let r = hadamard_f64(&x, n);
        for (a, b) in y.iter().zip(&r) {
            assert!(
                (*a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs()) * (n as f64).sqrt(),
                "block {n}: {a} vs {b}"
            );
        }
        // H H = I
        // SAFETY: as above.
        assert_eq!(
            unsafe { kve_hadamard_blocks(y.as_mut_ptr(), y.len() as u64, n as u64) },
            KVE_OK
        );
        for (a, b) in y.iter().zip(&x) {
            assert!((a - b).abs() <= 1e-5 * (n as f32), "block {n}: {a} vs {b}");
        }
    }
    let mut x = vec![1.0f32; 12];
    // SAFETY: each call's buffer has the length given, or is NULL with 0.
    unsafe {
        for (len, block) in [(12, 3), (12, 8), (12, 0), (10, 4)] {
            assert_eq!(
                kve_hadamard_blocks(x.as_mut_ptr(), len, block),
                KVE_ERR_INVALID_ARGUMENT
            );
        }
        assert_eq!(
            kve_hadamard_blocks(std::ptr::null_mut(), 4, 4),
            KVE_ERR_NULL_POINTER
        );
        assert_eq!(kve_hadamard_blocks(std::ptr::null_mut(), 0, 4), KVE_OK);
    }
    assert!(x.iter().all(|&v| v == 1.0), "refused calls wrote nothing");
}

/// The adapter's former ring rows (`set_rows_input` in `src/llama-kv-evict.cpp`, a map of
/// per-sequence counts and a per-ubatch count of tokens left).
fn ring_rows_fork(counts: &mut [u64], window: u64, seq_of: &[i32]) -> Vec<i64> {
    let n_seqs = counts.len() as u64;
    let scratch = (n_seqs * window) as i64;
    let mut left = std::collections::BTreeMap::<i32, u64>::new();
    for &s in seq_of {
        if s >= 0 && (s as u64) < n_seqs {
            *left.entry(s).or_default() += 1;
        }
    }
    let mut rows = vec![scratch; seq_of.len()];
    for (i, &s) in seq_of.iter().enumerate() {
        if s < 0 || s as u64 >= n_seqs {
            continue;
        }
        let slot = counts[s as usize] % window;
        counts[s as usize] += 1;
        let l = left.get_mut(&s).unwrap();
        *l -= 1;
        if *l < window {
            rows[i] = s as i64 * window as i64 + slot as i64;
        }
    }
    rows
}

#[test]
fn query_ring_rows_are_the_adapters_and_hold_each_sequences_last_window() {
    let mut seed = 7u64;
    let mut rnd = |m: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % m
    };
    for window in [1u32, 3, 8, 32] {
        let n_seqs = 4usize;
        let (mut counts, mut old) = (vec![0u64; n_seqs], vec![0u64; n_seqs]);
        // what the ring holds: per row the (seq, arrival index) last written there
        let mut ring = vec![None; n_seqs * window as usize + 1];
        for _ubatch in 0..40 {
            let t = 1 + rnd(70) as usize;
            let seq_of: Vec<i32> = (0..t)
                .map(|_| rnd(n_seqs as u64 + 1) as i32 - (rnd(9) == 0) as i32)
                .collect();
            let before = counts.clone();
            let mut rows = vec![-7i64; t + 2];
            // SAFETY: buffers of the lengths given.
            let st = unsafe {
                kve_query_ring_rows(
                    counts.as_mut_ptr(),
                    n_seqs as u64,
                    window,
                    seq_of.as_ptr(),
                    t as u64,
                    rows.as_mut_ptr(),
                    rows.len() as u64,
                )
            };
            assert_eq!(st, KVE_OK);
            assert_eq!(&rows[t..], &[-7, -7], "only n_tokens rows written");
            assert_eq!(
                rows[..t],
                ring_rows_fork(&mut old, window as u64, &seq_of)[..]
            );
            assert_eq!(counts, old);
            // no two tokens of the ubatch share a row but the scratch
            let scratch = (n_seqs * window as usize) as i64;
            let mut seen = std::collections::HashSet::new();
            let mut arrival = before.clone();
            for (&r, &s) in rows[..t].iter().zip(&seq_of) {
                assert!(r == scratch || seen.insert(r), "row {r} written twice");
                if (0..n_seqs as i32).contains(&s) {
                    ring[r as usize] = Some((s, arrival[s as usize]));
                    arrival[s as usize] += 1;
                }
            }
            // each sequence's last min(window, count) queries sit in their slots
            for s in 0..n_seqs {
                for k in counts[s].saturating_sub(window as u64)..counts[s] {
                    let r = s * window as usize + (k % window as u64) as usize;
                    assert_eq!(
                        ring[r],
                        Some((s as i32, k)),
                        "window {window}, seq {s}, query {k}"
                    );
                }
            }
        }
    }
    let (mut c, s, mut r) = ([0u64; 2], [0i32; 3], [0i64; 3]);
    // SAFETY: each call's buffers have the lengths given (or NULL with 0).
    unsafe {
        let (cp, sp, rp) = (c.as_mut_ptr(), s.as_ptr(), r.as_mut_ptr());
        assert_eq!(
            kve_query_ring_rows(cp, 2, 0, sp, 3, rp, 3),
            KVE_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            kve_query_ring_rows(cp, 2, 4, sp, 3, rp, 2),
            KVE_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            kve_query_ring_rows(cp, 2, 4, sp, 3, std::ptr::null_mut(), 3),
            KVE_ERR_NULL_POINTER
        );
        assert_eq!(
            kve_query_ring_rows(cp, 2, 4, cp as *const i32, 3, rp, 3),
            KVE_ERR_ALIASING
        );
        assert_eq!(c, [0, 0], "refused calls advance nothing");
        assert_eq!(kve_query_ring_rows(cp, 2, 4, sp, 3, rp, 3), KVE_OK);
    }
    assert_eq!((c, r), ([3, 0], [0, 1, 2]));
}
