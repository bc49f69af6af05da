//! The evictor's C entry points (`src/capi/evictor.rs`): the preset name table, a whole
//! round through C giving the Rust evictor's kept sets, and hostile input on every entry
//! point: a clear status, the context (workspace aside) and every output unchanged.
#![allow(unused_macros)] // capi_common's helpers serve several test files

mod capi_common;

use capi_common::{contiguous, data, D, HKV, HQ};
use kvevict::capi::*;
use kvevict::evictor::{Budget, EvictorConfig, LayerViews, ModelDims};
use kvevict::{Evictor, Granularity, Preset, View};
use std::ffi::{c_void, CStr};

const L: usize = 2;
const N: usize = 60;

fn config(preset: u32) -> kve_evictor_config {
    let mut c = std::mem::MaybeUninit::<kve_evictor_config>::uninit();
    // SAFETY: a writable struct of the size passed.
    let st = unsafe { kve_evictor_config_init(c.as_mut_ptr(), KVE_EVICTOR_CONFIG_V1_SIZE, preset) };
    assert_eq!(st, KVE_OK);
    // SAFETY: initialised by the call above.
    let mut c = unsafe { c.assume_init() };
    (c.layers, c.hq, c.hkv, c.dk, c.dv, c.d_model) =
        (L as u64, HQ as u64, HKV as u64, D as u64, D as u64, 16);
    c.max_cells = N as u64;
    c.max_seqs = 2;
    c.granularity = Granularity::Token as u32;
    c
}

/// An evictor in a leaked buffer (one byte off alignment: the library aligns inside).
fn evictor(c: &kve_evictor_config) -> *mut kve_evictor {
    let mut bytes = 0u64;
    // SAFETY: valid pointers.
    assert_eq!(unsafe { kve_evictor_size(c, &mut bytes) }, KVE_OK);
    let mem: &'static mut [u8] = Box::leak(vec![0x33u8; bytes as usize + 1].into_boxed_slice());
    let mut ev = std::ptr::null_mut();
    // SAFETY: `bytes` writable bytes at mem + 1.
    let st = unsafe { kve_evictor_init(mem.as_mut_ptr().add(1) as *mut c_void, bytes, c, &mut ev) };
    assert_eq!(st, KVE_OK);
    ev
}

/// A SnapKV evictor of window 8.
fn snapkv_evictor() -> *mut kve_evictor {
    let mut c = config(Preset::SnapKv as u32);
    c.window = 8;
    evictor(&c)
}

/// The context bytes (workspace aside), through the Rust view of the same block.
fn context(ev: *mut kve_evictor) -> Vec<u8> {
    // SAFETY: a live context from `evictor`.
    unsafe { Evictor::from_block(ev as *mut u8) }
        .unwrap()
        .context_bytes()
        .to_vec()
}

/// `kve_evictor_kept_cells` / `kve_evictor_evicted_cells`.
type CellsFn = unsafe extern "C" fn(*mut kve_evictor, u64, *mut u32, u64, *mut u64) -> i32;

/// The cells `f` reports for `seq` (read into a buffer of `N`; the call must succeed).
fn cells_of(f: CellsFn, ev: *mut kve_evictor, seq: u64) -> Vec<u32> {
    let (mut cells, mut count) = (vec![0u32; N], 0u64);
    // SAFETY: a live context from `evictor`, a buffer of `N` and an out-count.
    let st = unsafe { f(ev, seq, cells.as_mut_ptr(), N as u64, &mut count) };
    assert_eq!(st, KVE_OK);
    cells.truncate(count as usize);
    cells
}

/// `f` returns `want` and leaves the context as it was.
fn refused(ev: *mut kve_evictor, want: i32, f: impl FnOnce() -> i32) {
    let before = context(ev);
    let got = f();
    assert_eq!(got, want, "{:?} != {:?}", name(got), name(want));
    assert!(
        context(ev) == before,
        "the context changed on {:?}",
        name(want)
    );
}

fn name(s: i32) -> &'static str {
    // SAFETY: a static NUL-terminated string.
    unsafe { CStr::from_ptr(kve_status_name(s)) }
        .to_str()
        .unwrap()
}

struct Layer {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

fn layers(seed: u64) -> Vec<Layer> {
    (0..L as u64)
        .map(|l| Layer {
            q: data(HQ * N * D, seed + 3 * l),
            k: data(HKV * N * D, seed + 3 * l + 1),
            v: data(HKV * N * D, seed + 3 * l + 2),
        })
        .collect()
}

fn views(x: &Layer) -> kve_evictor_layer {
    let mut v = std::mem::MaybeUninit::<kve_evictor_layer>::uninit();
    // SAFETY: a writable struct of the size passed.
    assert_eq!(
        unsafe { kve_evictor_layer_init(v.as_mut_ptr(), KVE_EVICTOR_LAYER_V1_SIZE) },
        KVE_OK
    );
    // SAFETY: initialised above.
    let mut v = unsafe { v.assume_init() };
    v.keys = contiguous(&x.k, [HKV, N, D]);
    v.values = contiguous(&x.v, [HKV, N, D]);
    v.queries = contiguous(&x.q, [HQ, N, D]);
    v
}

#[test]
fn preset_names_come_from_the_library() {
    assert_eq!(kve_preset_count(), 12);
    for p in 0..kve_preset_count() {
        // SAFETY: a static string for a known preset.
        let n = unsafe { CStr::from_ptr(kve_preset_name(p)) };
        let mut got = 99u32;
        // SAFETY: a NUL-terminated name, a writable u32.
        assert_eq!(
            unsafe { kve_preset_from_name(n.as_ptr(), &mut got) },
            KVE_OK
        );
        assert_eq!(got, p);
        assert_eq!(
            Preset::from_u32(p).map(kvevict::evictor::preset_name),
            Ok(n.to_str().unwrap())
        );
    }
    assert!(kve_preset_name(12).is_null());
    let mut got = CANARY;
    for bad in [
        &b"SnapKV\0"[..],
        b"\0",
        b"laprox-spa\0",
        b"laprox-span-but-much-longer-than-32-bytes\0",
    ] {
        // SAFETY: NUL-terminated.
        assert_eq!(
            unsafe { kve_preset_from_name(bad.as_ptr() as *const _, &mut got) },
            KVE_ERR_BAD_ENUM
        );
    }
    // SAFETY: NULL pointers are rejected before any read.
    unsafe {
        assert_eq!(
            kve_preset_from_name(std::ptr::null(), &mut got),
            KVE_ERR_NULL_POINTER
        );
        assert_eq!(
            kve_preset_from_name(c"knorm".as_ptr(), std::ptr::null_mut()),
            KVE_ERR_NULL_POINTER
        );
    }
    assert_eq!(got, CANARY);
}
const CANARY: u32 = capi_common::CANARY;

#[test]
fn a_round_through_c_gives_the_rust_evictors_kept_set() {
    let xs = layers(5);
    for preset in [Preset::SnapKv, Preset::LaProxSpan, Preset::KNorm] {
        let mut c = config(preset as u32);
        c.policy = KVE_POLICY_KEEP_RATIO;
        c.keep_ratio = 0.5;
        c.min_keep = 4;
        c.window = 8;
        let ev = evictor(&c);
        let mut req = kve_evictor_requirements {
            struct_size: 0,
            queries: 9,
            values: 9,
            wo: 9,
            row_lse_helps: 9,
            window: 0,
            granularity: 9,
        };
        // SAFETY: valid pointers and sizes throughout.
        unsafe {
            assert_eq!(
                kve_evictor_get_requirements(ev, &mut req, KVE_EVICTOR_REQUIREMENTS_V1_SIZE),
                KVE_OK
            );
            if req.wo == KVE_WO_ONCE {
                for l in 0..L {
                    let wo = data(HQ * D * 16, 40 + l as u64);
                    let t = contiguous(&wo, [HQ, D, 16]);
                    assert_eq!(kve_evictor_set_output_projection(ev, l as u64, &t), KVE_OK);
                }
            }
            let mut target = 0u64;
            assert_eq!(kve_evictor_plan(ev, 1, N as u64, &mut target), KVE_OK);
            assert_eq!(target, 30);
            assert_eq!(kve_evictor_begin(ev, 1, N as u64, target), KVE_OK);
            for (l, x) in xs.iter().enumerate() {
                let mut v = views(x);
                if req.queries == 0 {
                    v.queries = kve_tensor::NONE;
                }
                assert_eq!(kve_evictor_score_layer(ev, 1, l as u64, &v), KVE_OK);
            }
            let mut kept = 0u64;
            assert_eq!(kve_evictor_select(ev, 1, &mut kept), KVE_OK);
            assert_eq!(kept, 30);
            let cells = cells_of(kve_evictor_kept_cells, ev, 1);
            let gone = cells_of(kve_evictor_evicted_cells, ev, 1);
            assert_eq!((cells.len(), gone.len()), (30, 30));
            let mut offsets = vec![0u64; L * HKV + 1];
            let mut indices = vec![0u32; L * HKV * N];
            let st = kve_evictor_kept_lists(
                ev,
                1,
                offsets.as_mut_ptr(),
                offsets.len() as u64,
                indices.as_mut_ptr(),
                indices.len() as u64,
            );
            assert_eq!(st, KVE_OK);
            assert_eq!(offsets[L * HKV], (L * HKV * 30) as u64);
            assert_eq!(&indices[..30], &cells[..30]);
            // the same round in Rust
            let want = rust_round(preset, &xs, None);
            assert_eq!(&cells[..30], &want[..], "{preset:?}");
            assert_eq!(kve_evictor_commit(ev, 1), KVE_OK);
            let mut st = kve_evictor_stats {
                struct_size: 0,
                ragged: 9,
                cells: 0,
                protected_cells: 0,
                evictions: 0,
                cells_evicted: 0,
            };
            assert_eq!(
                kve_evictor_get_stats(ev, 1, &mut st, KVE_EVICTOR_STATS_V1_SIZE),
                KVE_OK
            );
            assert_eq!(
                (
                    st.ragged,
                    st.cells,
                    st.protected_cells,
                    st.evictions,
                    st.cells_evicted
                ),
                (0, 30, 30, 1, 30)
            );
            assert_eq!(kve_evictor_seq_reset(ev, 1), KVE_OK);
        }
    }
}

/// The Rust evictor's kept cells (unit 0) of one round to 30 cells, with the engine's marks
/// (flags, share) when `Some`.
fn rust_round(preset: Preset, xs: &[Layer], marks: Option<(&[u8], f32)>) -> Vec<u32> {
    let dims = ModelDims {
        layers: L,
        hq: HQ,
        hkv: HKV,
        dk: D,
        dv: D,
        d_model: 16,
    };
    let mut c = EvictorConfig::new(preset, dims, N, Budget::Explicit);
    c.granularity = Some(Granularity::Token);
    c.window = 8;
    let mut mem = vec![0u8; Evictor::memory_size(&c).unwrap()];
    let mut ev = Evictor::init(&mut mem, &c).unwrap();
    let needs = ev.needs().capture;
    for l in 0..L {
        if needs.wo == kvevict::evictor::WoUse::Once {
            let wo = data(HQ * D * 16, 40 + l as u64);
            ev.set_output_projection(l, &View::f32_contiguous(&wo, [HQ, D, 16]).unwrap())
                .unwrap();
        }
    }
    ev.begin(0, N, 30).unwrap();
    if let Some((flags, share)) = marks {
        ev.mark_cells(0, flags, share).unwrap();
    }
    for (l, x) in xs.iter().enumerate() {
        let v = LayerViews {
            keys: View::f32_contiguous(&x.k, [HKV, N, D]).unwrap(),
            values: Some(View::f32_contiguous(&x.v, [HKV, N, D]).unwrap()),
            queries: needs
                .queries
                .then(|| View::f32_contiguous(&x.q, [HQ, N, D]).unwrap()),
            row_lse: None,
            wo: None,
        };
        ev.score_layer(0, l, &v).unwrap();
    }
    let k = ev.select(0).unwrap();
    k.indices[..k.offsets[1] as usize].to_vec()
}

/// `kve_evictor_config_check` of `c`: its status, message and requirements (`CANARY`
/// where not written).
fn check(c: &kve_evictor_config) -> (i32, Option<String>, kve_evictor_requirements) {
    // SAFETY: plain integers, any bit pattern.
    let mut req: kve_evictor_requirements = unsafe { std::mem::zeroed() };
    req.struct_size = CANARY;
    let mut msg = 7usize as *const std::ffi::c_char;
    let size = KVE_EVICTOR_REQUIREMENTS_V1_SIZE;
    // SAFETY: valid pointers, `req` of the size passed.
    let st = unsafe { kve_evictor_config_check(c, &mut req, size, &mut msg) };
    if st == KVE_OK {
        assert!(msg.is_null());
        return (st, None, req);
    }
    assert_ne!(msg as usize, 7);
    // SAFETY: a static NUL-terminated string (the call's contract).
    let why = unsafe { CStr::from_ptr(msg) }.to_str().unwrap().to_owned();
    (st, Some(why), req)
}

#[test]
fn config_check_says_why_and_gives_the_requirements() {
    for p in 0..kve_preset_count() {
        let c = config(p);
        let (st, why, req) = check(&c);
        assert_eq!((st, why), (KVE_OK, None), "preset {p}");
        // the requirements of the evictor of that config
        let mut want = req;
        // SAFETY: a live evictor, `want` of the size passed.
        let g = unsafe { kve_evictor_get_requirements(evictor(&c), &mut want, req.struct_size) };
        assert_eq!(g, KVE_OK);
        assert_eq!(req, want);
        assert_eq!(req.struct_size, KVE_EVICTOR_REQUIREMENTS_V1_SIZE);
    }
    // what an engine's startup refuses, each with the status kve_evictor_size returns
    let tova = |c: &mut kve_evictor_config| (c.preset, c.window) = (Preset::Tova as u32, 4);
    let links =
        |c: &mut kve_evictor_config| (c.preset, c.link_threshold) = (Preset::SnapKv as u32, 0.5);
    for (edit, word) in [(tova as fn(&mut _), "window"), (links, "post-pool")] {
        let mut c = config(0);
        edit(&mut c);
        let mut bytes = 0u64;
        // SAFETY: valid pointers.
        let want = unsafe { kve_evictor_size(&c, &mut bytes) };
        let (st, why, _) = check(&c);
        assert_eq!(st, want);
        assert_ne!(st, KVE_OK);
        assert!(why.as_deref().unwrap().contains(word), "{why:?}");
    }
    // NULL outputs are allowed; NULL config, a bad requirements size, an output in the config
    let good = config(Preset::LaProxSpan as u32);
    let nul = std::ptr::null_mut();
    // SAFETY: valid or NULL pointers.
    unsafe {
        assert_eq!(
            kve_evictor_config_check(&good, nul, 0, std::ptr::null_mut()),
            KVE_OK
        );
        let mut msg = std::ptr::null();
        let st = kve_evictor_config_check(std::ptr::null(), nul, 0, &mut msg);
        assert_eq!(st, KVE_ERR_NULL_POINTER);
        assert!(!msg.is_null());
        let mut req: kve_evictor_requirements = std::mem::zeroed();
        let mut msg = 7usize as *const std::ffi::c_char;
        assert_eq!(
            kve_evictor_config_check(&good, &mut req, 3, &mut msg),
            KVE_ERR_INVALID_ARGUMENT
        );
        assert_eq!((req.struct_size, msg as usize), (0, 7));
        let mut c = good;
        let inside = std::ptr::addr_of_mut!(c.max_cells) as *mut *const std::ffi::c_char;
        assert_eq!(
            kve_evictor_config_check(&c, nul, 0, inside),
            KVE_ERR_ALIASING
        );
        assert_eq!(c.max_cells, good.max_cells);
    }
}

#[test]
fn hostile_configs_and_memory() {
    let good = config(Preset::LaProx as u32);
    let mut bytes = CANARY as u64;
    let size = |c: &kve_evictor_config, out: *mut u64| unsafe { kve_evictor_size(c, out) };
    type Edit = fn(&mut kve_evictor_config);
    let cases: [(Edit, i32); 11] = [
        (|c| c.struct_size = 100, KVE_ERR_INVALID_ARGUMENT),
        (|c| c.preset = 12, KVE_ERR_BAD_ENUM),
        (|c| c.policy = 3, KVE_ERR_BAD_ENUM),
        (|c| c.granularity = 3, KVE_ERR_BAD_ENUM),
        (|c| c.hq = 5, KVE_ERR_SHAPE_MISMATCH),
        (|c| c.d_model = 0, KVE_ERR_INVALID_ARGUMENT),
        (|c| c.max_seqs = 0, KVE_ERR_INVALID_ARGUMENT),
        (|c| c.max_cells = u64::MAX, KVE_ERR_INVALID_ARGUMENT),
        (|c| c.link_threshold = f32::NAN, KVE_ERR_INVALID_ARGUMENT),
        (
            |c| (c.policy, c.keep_ratio) = (KVE_POLICY_KEEP_RATIO, 2.0),
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (
            |c| (c.policy, c.high, c.low) = (KVE_POLICY_CELLS, 0, 0),
            KVE_ERR_INVALID_ARGUMENT,
        ),
    ];
    for (edit, want) in cases {
        let mut c = good;
        edit(&mut c);
        assert_eq!(size(&c, &mut bytes), want);
        assert_eq!(bytes, CANARY as u64);
        // the check without memory: the same status, a sentence, no requirements written
        let (st, why, req) = check(&c);
        assert_eq!(st, want);
        assert!(why.as_ref().is_some_and(|w| w.len() > 10), "{why:?}");
        assert_eq!(req.struct_size, CANARY);
    }
    // a score params struct of a wrong size behind the pointer
    let mut sp = capi_common::score_params(0);
    sp.struct_size = 12;
    let c = kve_evictor_config { score: &sp, ..good };
    assert_eq!(size(&c, &mut bytes), KVE_ERR_INVALID_ARGUMENT);
    // the output inside the config
    let mut c = good;
    let inside = std::ptr::addr_of_mut!(c.max_cells);
    assert_eq!(size(&c, inside), KVE_ERR_ALIASING);
    assert_eq!(size(&good, std::ptr::null_mut()), KVE_ERR_NULL_POINTER);
    // SAFETY: NULL config.
    assert_eq!(
        unsafe { kve_evictor_size(std::ptr::null(), &mut bytes) },
        KVE_ERR_NULL_POINTER
    );
    assert_eq!(size(&good, &mut bytes), KVE_OK);
    // init: memory short, NULL, the handle inside the memory
    let mut mem = vec![0x5Au8; bytes as usize];
    let mut ev = 7usize as *mut kve_evictor;
    // SAFETY: the lengths passed are those of `mem`.
    unsafe {
        let p = mem.as_mut_ptr() as *mut c_void;
        assert_eq!(
            kve_evictor_init(p, bytes - 1, &good, &mut ev),
            KVE_ERR_WORKSPACE_TOO_SMALL
        );
        assert_eq!(
            kve_evictor_init(std::ptr::null_mut(), bytes, &good, &mut ev),
            KVE_ERR_NULL_POINTER
        );
        let handle = mem.as_mut_ptr().add(8) as *mut *mut kve_evictor;
        assert_eq!(kve_evictor_init(p, bytes, &good, handle), KVE_ERR_ALIASING);
    }
    assert!(mem.iter().all(|&b| b == 0x5A));
    assert_eq!(ev as usize, 7);
}

/// Both size queries answer a huge `max_seqs` by arithmetic: every sequence slot is the same
/// size (a loop over the slots took minutes before the sum overflowed: a fuzz timeout in
/// `kve_cuda_evictor_size`), and a count whose bytes overflow is refused.
#[test]
fn size_queries_scale_with_the_sequence_count() {
    // (host size, device form's host and device sizes); the device form's query gives
    // KVE_ERR_NOT_BUILT_WITH_CUDA without the cuda / cuda-emu feature: checked where it is built
    let sizes = |seqs: u64| {
        let c = kve_evictor_config {
            max_seqs: seqs,
            ..config(Preset::LaProx as u32)
        };
        let (mut host, mut h, mut d) = (0u64, 0u64, 0u64);
        // SAFETY: valid config and outputs.
        let s = unsafe {
            (
                kve_evictor_size(&c, &mut host),
                kve_cuda_evictor_size(&c, &mut h, &mut d),
            )
        };
        (s, host, h, d)
    };
    let one = sizes(1);
    let two = sizes(2);
    let device = one.0 .1 != KVE_ERR_NOT_BUILT_WITH_CUDA;
    let ok = if device {
        KVE_OK
    } else {
        KVE_ERR_NOT_BUILT_WITH_CUDA
    };
    assert_eq!((one.0, two.0), ((KVE_OK, ok), (KVE_OK, ok)));
    let big = 1u64 << 40;
    let (s, host, h, d) = sizes(big);
    assert_eq!(s, (KVE_OK, ok), "2^40 sequence slots: bytes fit in 64 bits");
    // one slot more per sequence, exactly: (n - 1) times (two - one) past one
    assert_eq!(host - one.1, (big - 1) * (two.1 - one.1));
    if device {
        assert_eq!(h - one.2, (big - 1) * (two.2 - one.2));
        // the device block holds per-sequence state too: it grows by one slot per sequence
        assert_eq!(d - one.3, (big - 1) * (two.3 - one.3));
    }
    let (s, ..) = sizes(1u64 << 62);
    assert_ne!(s.0, KVE_OK);
    assert_ne!(s.1, KVE_OK);
}

#[test]
fn hostile_calls_change_nothing() {
    let ev = snapkv_evictor();
    let xs = layers(9);
    let mut out = CANARY as u64;
    let mut junk = vec![0u64; 64];
    let jp = junk.as_mut_ptr() as *mut u8;
    // SAFETY (throughout): every pointer is valid for what it declares, or deliberately
    // NULL, misaligned, or a block init did not write, which the library must refuse.
    unsafe {
        let aligned = jp.add(jp.align_offset(64)) as *mut kve_evictor;
        assert_eq!(
            kve_evictor_plan(std::ptr::null_mut(), 0, 10, &mut out),
            KVE_ERR_NULL_POINTER
        );
        assert_eq!(
            kve_evictor_plan(aligned, 0, 10, &mut out),
            KVE_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            kve_evictor_plan((aligned as *mut u8).add(8) as *mut _, 0, 10, &mut out),
            KVE_ERR_MISALIGNED
        );
        assert_eq!(out, CANARY as u64);
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
            kve_evictor_plan(ev, 2, 10, &mut out)
        });
        refused(ev, KVE_ERR_NULL_POINTER, || {
            kve_evictor_plan(ev, 0, 10, std::ptr::null_mut())
        });
        // an output inside the context
        let inside = (ev as *mut u8).add(256) as *mut u64;
        refused(ev, KVE_ERR_ALIASING, || kve_evictor_plan(ev, 0, 10, inside));
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
            kve_evictor_begin(ev, 0, N as u64 + 1, 10)
        });
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
            kve_evictor_begin(ev, 5, 10, 5)
        });
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || kve_evictor_commit(ev, 0));
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
            kve_evictor_seq_reset(ev, 2)
        });
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
            kve_evictor_seq_unprotect(ev, 2)
        });
        refused(ev, KVE_ERR_NULL_POINTER, || {
            kve_evictor_seq_unprotect(std::ptr::null_mut(), 0)
        });
        let mut n = 0u64;
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
            kve_evictor_select(ev, 0, &mut n)
        });
        let mut st = kve_evictor_stats {
            struct_size: 0,
            ragged: 0,
            cells: 0,
            protected_cells: 0,
            evictions: 0,
            cells_evicted: 0,
        };
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
            kve_evictor_get_stats(ev, 0, &mut st, 24)
        });
        let mut req = kve_evictor_requirements {
            struct_size: 0,
            queries: 0,
            values: 0,
            wo: 0,
            row_lse_helps: 0,
            window: 0,
            granularity: 0,
        };
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
            kve_evictor_get_requirements(ev, &mut req, 32)
        });
        assert_eq!((st.struct_size, req.struct_size), (0, 0));
        // Wo for a method that reads none; queries: shape, the context as a tensor
        let wo = data(HQ * D * 16, 1);
        let t = contiguous(&wo, [HQ, D, 16]);
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
            kve_evictor_set_output_projection(ev, 0, &t)
        });
        let q = contiguous(&xs[0].q, [HQ - 1, N, D]);
        refused(ev, KVE_ERR_SHAPE_MISMATCH, || {
            kve_evictor_observe_queries(ev, 0, 0, &q)
        });
        let ctx = std::slice::from_raw_parts(ev as *const f32, 1024);
        let q = contiguous(ctx, [HQ, 8, D]);
        refused(ev, KVE_ERR_ALIASING, || {
            kve_evictor_observe_queries(ev, 0, 0, &q)
        });
        refused(ev, KVE_ERR_NULL_POINTER, || {
            kve_evictor_observe_queries(ev, 0, 0, std::ptr::null())
        });
        // a round: views hostile
        assert_eq!(kve_evictor_begin(ev, 0, N as u64, 20), KVE_OK);
        let good = views(&xs[0]);
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
            kve_evictor_score_layer(ev, 0, L as u64, &good)
        });
        refused(ev, KVE_ERR_NULL_POINTER, || {
            kve_evictor_score_layer(ev, 0, 0, std::ptr::null())
        });
        for (edit, want) in [
            (
                Box::new(|v: &mut kve_evictor_layer| v.struct_size = 300)
                    as Box<dyn Fn(&mut kve_evictor_layer)>,
                KVE_ERR_INVALID_ARGUMENT,
            ),
            (Box::new(|v| v.reserved = 1), KVE_ERR_INVALID_ARGUMENT),
            (
                Box::new(|v| v.keys = kve_tensor::NONE),
                KVE_ERR_NULL_POINTER,
            ),
            (Box::new(|v| v.keys.dtype = 7), KVE_ERR_BAD_ENUM),
            (
                Box::new(|v| v.keys.extent[1] = N as u64 - 1),
                KVE_ERR_SHAPE_MISMATCH,
            ),
            (Box::new(|v| v.keys.len -= 1), KVE_ERR_OUT_OF_BOUNDS),
            (
                Box::new(|v| v.queries = kve_tensor::NONE),
                KVE_ERR_INVALID_ARGUMENT,
            ), // ring empty
            (
                Box::new(|v| (v.row_lse, v.row_lse_len) = (std::ptr::null(), 3)),
                KVE_ERR_NULL_POINTER,
            ),
            (
                Box::new(|v| {
                    v.queries = contiguous(
                        std::slice::from_raw_parts(ev as *const f32, 4096),
                        [HQ, 8, D],
                    )
                }),
                KVE_ERR_ALIASING,
            ),
        ] {
            let mut v = good;
            edit(&mut v);
            refused(ev, want, || kve_evictor_score_layer(ev, 0, 0, &v));
        }
        let mut nan = xs[0].k.clone();
        nan[3] = f32::NAN;
        let v = kve_evictor_layer {
            keys: contiguous(&nan, [HKV, N, D]),
            ..good
        };
        refused(ev, KVE_ERR_NON_FINITE, || {
            kve_evictor_score_layer(ev, 0, 0, &v)
        });
        assert_eq!(kve_evictor_score_layer(ev, 0, 0, &good), KVE_OK);
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
            kve_evictor_score_layer(ev, 0, 0, &good)
        });
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
            kve_evictor_select(ev, 0, &mut n)
        });
        assert_eq!(kve_evictor_score_layer(ev, 0, 1, &views(&xs[1])), KVE_OK);
        assert_eq!(kve_evictor_select(ev, 0, &mut n), KVE_OK);
        assert_eq!(n, 20);
        // outputs too small or overlapping each other: canaries stay
        let mut cells = vec![CANARY; N];
        let mut count = CANARY as u64;
        refused(ev, KVE_ERR_OUTPUT_TOO_SMALL, || {
            kve_evictor_kept_cells(ev, 0, cells.as_mut_ptr(), 19, &mut count)
        });
        refused(ev, KVE_ERR_OUTPUT_TOO_SMALL, || {
            kve_evictor_evicted_cells(ev, 0, cells.as_mut_ptr(), 39, &mut count)
        });
        let c2 = cells.as_mut_ptr() as *mut u64;
        refused(ev, KVE_ERR_ALIASING, || {
            kve_evictor_kept_cells(ev, 0, cells.as_mut_ptr(), N as u64, c2)
        });
        assert!(cells.iter().all(|&x| x == CANARY) && count == CANARY as u64);
        let mut offsets = vec![CANARY as u64; L * HKV + 1];
        let mut indices = vec![CANARY; L * HKV * 20 - 1];
        refused(ev, KVE_ERR_OUTPUT_TOO_SMALL, || {
            kve_evictor_kept_lists(
                ev,
                0,
                offsets.as_mut_ptr(),
                offsets.len() as u64,
                indices.as_mut_ptr(),
                indices.len() as u64,
            )
        });
        assert!(
            offsets.iter().all(|&x| x == CANARY as u64) && indices.iter().all(|&x| x == CANARY)
        );
        // compaction: wrong shape, the context as the destination
        let mut k = xs[0].k.clone();
        let t = contiguous(&k, [HKV, N - 1, D]);
        refused(ev, KVE_ERR_SHAPE_MISMATCH, || {
            kve_evictor_compact(ev, 0, 0, &t)
        });
        let t = contiguous(
            std::slice::from_raw_parts(ev as *const f32, HKV * N * D),
            [HKV, N, D],
        );
        refused(ev, KVE_ERR_ALIASING, || kve_evictor_compact(ev, 0, 0, &t));
        assert_eq!(k, xs[0].k);
        let t = contiguous(&k, [HKV, N, D]);
        assert_eq!(kve_evictor_compact(ev, 0, 0, &t), KVE_OK);
        k.truncate(1);
        assert_eq!(kve_evictor_commit(ev, 0), KVE_OK);
    }
}

/// Without CUDA the device form's entry points answer KVE_ERR_NOT_BUILT_WITH_CUDA, before
/// any other check, and write nothing.
#[test]
fn device_form_without_cuda_is_not_built() {
    if cfg!(feature = "cuda") {
        return;
    }
    let cfg = config(Preset::SnapKv as u32);
    let (mut h, mut d, mut t) = (7u64, 7u64, 7u64);
    let mut ev: *mut kve_cuda_evictor = std::ptr::null_mut();
    let mut mem = vec![7u8; 4096];
    let s = std::ptr::null_mut();
    let e = std::ptr::null_mut::<kve_cuda_evictor>();
    let mut layer = std::mem::MaybeUninit::<kve_evictor_layer>::zeroed();
    let mut req = std::mem::MaybeUninit::<kve_evictor_requirements>::zeroed();
    let mut stats = std::mem::MaybeUninit::<kve_evictor_stats>::zeroed();
    let (mut c, mut i) = (std::ptr::null::<i32>(), std::ptr::null::<i32>());
    // SAFETY: each call returns before reading or writing anything.
    let all = unsafe {
        [
            kve_cuda_evictor_size(&cfg, &mut h, &mut d),
            kve_cuda_evictor_init(mem.as_mut_ptr() as *mut c_void, 4096, s, 0, &cfg, &mut ev),
            kve_cuda_evictor_get_requirements(e, req.as_mut_ptr(), 28),
            kve_cuda_evictor_set_output_projection(e, 0, std::ptr::null(), s),
            kve_cuda_evictor_observe_queries(e, 0, 0, std::ptr::null(), s),
            kve_cuda_evictor_plan(e, 0, 10, &mut t),
            kve_cuda_evictor_begin(e, 0, 10, 5),
            kve_cuda_evictor_score_layer(e, 0, 0, layer.as_mut_ptr(), s),
            kve_cuda_evictor_select(e, 0, &mut t, s),
            kve_cuda_evictor_kept_lists(e, 0, &mut c, &mut i, &mut t),
            kve_cuda_evictor_compact(e, 0, 0, std::ptr::null(), s),
            kve_cuda_evictor_score_layer_paged(e, 0, 0, std::ptr::null(), s),
            kve_cuda_evictor_compact_paged(
                e,
                0,
                0,
                std::ptr::null(),
                std::ptr::null(),
                0,
                &mut t,
                s,
            ),
            kve_cuda_evictor_commit(e, 0),
            kve_cuda_evictor_seq_reset(e, 0),
            kve_cuda_evictor_seq_unprotect(e, 0),
            kve_cuda_evictor_get_stats(e, 0, stats.as_mut_ptr(), 40),
            kve_cuda_evictor_run_round(e, 0, std::ptr::null(), std::ptr::null_mut(), 0, &mut t, s),
        ]
    };
    assert!(
        all.iter().all(|&st| st == KVE_ERR_NOT_BUILT_WITH_CUDA),
        "{all:?}"
    );
    assert_eq!((h, d, t), (7, 7, 7));
    assert!(ev.is_null() && c.is_null() && mem.iter().all(|&b| b == 7));
}

/// A `KVE_PAGED_NHD_KV_OUTER` pool (vLLM's FlashAttention layout, one per layer) holding
/// `xs`' K and V through a scattered block table, noise elsewhere.
struct PagedModel {
    pools: Vec<Vec<f32>>,
    table: Vec<u32>,
    nb: usize,
    bs: usize,
}

impl PagedModel {
    fn new(xs: &[Layer], bs: usize) -> PagedModel {
        let used = N.div_ceil(bs);
        let nb = 2 * used + 1;
        // block b of the sequence is pool block (5 b + 3) mod nb (nb odd, 5 coprime)
        let table: Vec<u32> = (0..used).map(|b| ((5 * b + 3) % nb) as u32).collect();
        let mut m = PagedModel {
            pools: vec![],
            table,
            nb,
            bs,
        };
        for (l, x) in xs.iter().enumerate() {
            let mut pool = data(2 * nb * bs * HKV * D, 900 + l as u64);
            for (kv, src) in [&x.k, &x.v].into_iter().enumerate() {
                for h in 0..HKV {
                    for t in 0..N {
                        let at = m.at(kv, t, h);
                        pool[at..at + D].copy_from_slice(&src[(h * N + t) * D..][..D]);
                    }
                }
            }
            m.pools.push(pool);
        }
        m
    }
    /// Element of (K or V, token, head, dim 0).
    fn at(&self, kv: usize, t: usize, h: usize) -> usize {
        let block = self.table[t / self.bs] as usize;
        ((kv * self.nb + block) * self.bs + t % self.bs) * HKV * D + h * D
    }
    fn layout(&self, l: usize, kv: u32) -> kve_paged_layout {
        let p = &self.pools[l];
        let data = p.as_ptr() as *const c_void;
        let kind = kvevict::PagedKind::NhdKvOuter;
        capi_common::paged_f32_layout(kind, data, p.len(), [self.nb, self.bs, HKV, D], kv)
    }
    fn views(&self, l: usize, x: &Layer) -> kve_evictor_paged_layer {
        let mut v = std::mem::MaybeUninit::<kve_evictor_paged_layer>::uninit();
        // SAFETY: a writable struct of the size passed.
        let st = unsafe {
            kve_evictor_paged_layer_init(v.as_mut_ptr(), KVE_EVICTOR_PAGED_LAYER_V1_SIZE)
        };
        assert_eq!(st, KVE_OK);
        // SAFETY: initialised above.
        let mut v = unsafe { v.assume_init() };
        v.keys = self.layout(l, 0);
        v.values = self.layout(l, 1);
        (v.table, v.table_len) = (self.table.as_ptr(), self.table.len() as u64);
        v.queries = contiguous(&x.q, [HQ, N, D]);
        v
    }
}

/// A paged round through C: the same kept cells as the strided round, compaction in the
/// pool bit-identical to `kve_evictor_compact` with the trailing blocks reported free;
/// bad tables and layouts refused with the context and the pool unchanged.
#[test]
fn paged_rounds_through_c_match_the_strided_ones() {
    let xs = layers(11);
    for (preset, bs) in [
        (Preset::LaProxSpan, 16),
        (Preset::SnapKv, 7),
        (Preset::KNorm, 1),
    ] {
        let mut cp = std::mem::MaybeUninit::<kve_evictor_config>::uninit();
        // SAFETY: a writable struct of the size passed.
        let st = unsafe {
            kve_evictor_config_init(cp.as_mut_ptr(), KVE_EVICTOR_CONFIG_V2_SIZE, preset as u32)
        };
        assert_eq!(st, KVE_OK);
        // SAFETY: initialised above.
        let mut cp = unsafe { cp.assume_init() };
        let c = config(preset as u32);
        (cp.layers, cp.hq, cp.hkv, cp.dk, cp.dv, cp.d_model) =
            (c.layers, c.hq, c.hkv, c.dk, c.dv, c.d_model);
        (cp.max_cells, cp.max_seqs, cp.granularity) = (c.max_cells, c.max_seqs, c.granularity);
        assert_eq!(cp.paged, 0);
        cp.paged = 1;
        let (a, b) = (evictor(&c), evictor(&cp));
        let mut m = PagedModel::new(&xs, bs);
        let target = 25u64;
        // SAFETY: valid pointers and sizes throughout.
        unsafe {
            for ev in [a, b] {
                for l in 0..L {
                    let wo = data(HQ * D * 16, 40 + l as u64);
                    let t = contiguous(&wo, [HQ, D, 16]);
                    let st = kve_evictor_set_output_projection(ev, l as u64, &t);
                    assert!(st == KVE_OK || st == KVE_ERR_INVALID_ARGUMENT);
                }
                assert_eq!(kve_evictor_begin(ev, 0, N as u64, target), KVE_OK);
            }
            // a strided context refuses paged layers
            let v0 = m.views(0, &xs[0]);
            refused(a, KVE_ERR_INVALID_ARGUMENT, || {
                kve_evictor_score_layer_paged(a, 0, 0, &v0)
            });
            // bad tables: out of the pool, -1 padding, a repeat, too short
            let used = m.table.len();
            let mut bad: Vec<(Vec<u32>, i32)> = vec![];
            let mut t = m.table.clone();
            t[1] = m.nb as u32;
            bad.push((t, KVE_ERR_OUT_OF_BOUNDS));
            let mut t = m.table.clone();
            t[used - 1] = u32::MAX;
            bad.push((t, KVE_ERR_OUT_OF_BOUNDS));
            if used > 1 {
                let mut t = m.table.clone();
                t[used - 1] = t[0];
                bad.push((t, KVE_ERR_ALIASING));
            }
            bad.push((m.table[..used - 1].to_vec(), KVE_ERR_SHAPE_MISMATCH));
            for (t, want) in &bad {
                let mut v = m.views(0, &xs[0]);
                (v.table, v.table_len) = (t.as_ptr(), t.len() as u64);
                refused(b, *want, || kve_evictor_score_layer_paged(b, 0, 0, &v));
            }
            let mut v = m.views(0, &xs[0]);
            v.keys.heads = 1; // not the model's Hkv
            refused(b, KVE_ERR_SHAPE_MISMATCH, || {
                kve_evictor_score_layer_paged(b, 0, 0, &v)
            });
            refused(b, KVE_ERR_NULL_POINTER, || {
                kve_evictor_score_layer_paged(b, 0, 0, std::ptr::null())
            });
            for (l, x) in xs.iter().enumerate() {
                assert_eq!(kve_evictor_score_layer(a, 0, l as u64, &views(x)), KVE_OK);
                let v = m.views(l, x);
                assert_eq!(kve_evictor_score_layer_paged(b, 0, l as u64, &v), KVE_OK);
            }
            let (mut ka, mut kb) = (0u64, 0u64);
            assert_eq!(kve_evictor_select(a, 0, &mut ka), KVE_OK);
            assert_eq!(kve_evictor_select(b, 0, &mut kb), KVE_OK);
            assert_eq!(ka, kb);
            let ca = cells_of(kve_evictor_kept_cells, a, 0);
            assert_eq!(ca, cells_of(kve_evictor_kept_cells, b, 0), "{preset:?}");
            let na = ca.len();
            assert!(na < N);
            // compaction: strided K/V through `a`, the pool through `b`
            let mut freed = 77u64;
            let lay = m.layout(0, 0);
            let mut t = m.table.clone();
            t[0] = m.nb as u32;
            let before = m.pools[0].clone();
            let st =
                kve_evictor_compact_paged(b, 0, 0, &lay, t.as_ptr(), t.len() as u64, &mut freed);
            assert_eq!((st, freed), (KVE_ERR_OUT_OF_BOUNDS, 77));
            assert!(m.pools[0] == before, "written on error");
            for (l, x) in xs.iter().enumerate() {
                for (kv, src) in [&x.k, &x.v].into_iter().enumerate() {
                    let mut strided = src.clone();
                    let tv = contiguous(&strided, [HKV, N, D]);
                    assert_eq!(kve_evictor_compact(a, 0, l as u64, &tv), KVE_OK);
                    strided =
                        std::slice::from_raw_parts(tv.data as *const f32, strided.len()).to_vec();
                    let lay = m.layout(l, kv as u32);
                    let (tp, tl) = (m.table.as_ptr(), m.table.len() as u64);
                    let st = kve_evictor_compact_paged(b, 0, l as u64, &lay, tp, tl, &mut freed);
                    assert_eq!(st, KVE_OK);
                    assert_eq!(freed as usize, N.div_ceil(bs) - na.div_ceil(bs));
                    for h in 0..HKV {
                        for r in 0..na {
                            let at = m.at(kv, r, h);
                            let want = &strided[(h * N + r) * D..][..D];
                            assert!(
                                m.pools[l][at..at + D]
                                    .iter()
                                    .zip(want)
                                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                                "{preset:?} layer {l} kv {kv} head {h} row {r}"
                            );
                        }
                    }
                }
            }
            assert_eq!(kve_evictor_commit(b, 0), KVE_OK);
            // no round: nothing to compact
            let lay = m.layout(0, 0);
            let (tp, tl) = (m.table.as_ptr(), m.table.len() as u64);
            refused(b, KVE_ERR_INVALID_ARGUMENT, || {
                kve_evictor_compact_paged(b, 0, 0, &lay, tp, tl, &mut freed)
            });
            m.pools.clear();
        }
    }
}

/// `kve_evictor_mark_cells`: a round with marks through C keeps what the Rust evictor keeps
/// with the same marks (and something else than without them); hostile arguments are
/// refused with the context unchanged.
#[test]
fn marks_through_c() {
    let ev = snapkv_evictor();
    let xs = layers(21);
    let mut flags = vec![0u8; N];
    flags[2..14].fill(1);
    flags[30..34].fill(7);
    let round = |marks: Option<(&[u8], f32)>| -> Vec<u32> {
        // SAFETY: a live context, views of live data, buffers of the lengths passed.
        unsafe {
            assert_eq!(kve_evictor_begin(ev, 0, N as u64, 30), KVE_OK);
            if let Some((f, s)) = marks {
                let st = kve_evictor_mark_cells(ev, 0, f.as_ptr(), f.len() as u64, s);
                assert_eq!(st, KVE_OK);
            }
            for (l, x) in xs.iter().enumerate() {
                assert_eq!(kve_evictor_score_layer(ev, 0, l as u64, &views(x)), KVE_OK);
            }
            let mut n = 0u64;
            assert_eq!(kve_evictor_select(ev, 0, &mut n), KVE_OK);
            assert!(n <= 30);
        }
        let kept = cells_of(kve_evictor_kept_cells, ev, 0);
        // SAFETY: a live context.
        assert_eq!(unsafe { kve_evictor_commit(ev, 0) }, KVE_OK);
        kept
    };
    let plain = round(None);
    assert_eq!(plain, rust_round(Preset::SnapKv, &xs, None));
    let marked = round(Some((&flags, KVE_MARK_SHARE_DEFAULT)));
    assert_ne!(marked, plain);
    assert_eq!(
        marked,
        rust_round(Preset::SnapKv, &xs, Some((&flags, KVE_MARK_SHARE_DEFAULT)))
    );
    // the marked cells' share: 11 of the 22 prefix cells
    let kept_marked = marked.iter().filter(|&&i| flags[i as usize] != 0).count();
    assert!(kept_marked >= 11, "{kept_marked}");

    // SAFETY (below): every pointer is valid for what it declares, or deliberately NULL,
    // short, or inside the context, which the library must refuse.
    unsafe {
        let f = flags.as_ptr();
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
            kve_evictor_mark_cells(ev, 0, f, N as u64, 0.5) // no round begun
        });
        assert_eq!(kve_evictor_begin(ev, 0, N as u64, 30), KVE_OK);
        refused(ev, KVE_ERR_NULL_POINTER, || {
            kve_evictor_mark_cells(std::ptr::null_mut(), 0, f, N as u64, 0.5)
        });
        refused(ev, KVE_ERR_NULL_POINTER, || {
            kve_evictor_mark_cells(ev, 0, std::ptr::null(), N as u64, 0.5)
        });
        refused(ev, KVE_ERR_SHAPE_MISMATCH, || {
            kve_evictor_mark_cells(ev, 0, f, N as u64 - 1, 0.5)
        });
        refused(ev, KVE_ERR_SHAPE_MISMATCH, || {
            kve_evictor_mark_cells(ev, 0, std::ptr::null(), 0, 0.5)
        });
        for bad in [f32::NAN, -0.5, 1.01, f32::INFINITY, f32::NEG_INFINITY] {
            refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
                kve_evictor_mark_cells(ev, 0, f, N as u64, bad)
            });
        }
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
            kve_evictor_mark_cells(ev, 2, f, N as u64, 0.5) // no such sequence
        });
        refused(ev, KVE_ERR_INVALID_ARGUMENT, || {
            kve_evictor_mark_cells(ev, 1, f, N as u64, 0.5) // a sequence with no round
        });
        let inside = (ev as *const u8).add(128);
        refused(ev, KVE_ERR_ALIASING, || {
            kve_evictor_mark_cells(ev, 0, inside, N as u64, 0.5)
        });
        refused(ev, KVE_ERR_OVERFLOW, || {
            kve_evictor_mark_cells(ev, 0, f, u64::MAX, 0.5)
        });
    }
}
