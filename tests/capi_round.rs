//! `kve_evictor_run_round` (`src/capi/round.rs`): one call that runs a whole round over an
//! engine's cache as the engine holds it (every layer's K/V over a whole cell stream, the
//! sequence's cells named by index, in position order), against the step-by-step calls it
//! replaces (`kve_evictor_begin`, `_mark_cells`, `_score_layer` per layer on the same rows
//! given as strided views, `_select`, `_kept_cells`): the same kept cells and the same
//! context bytes (bit-identical scores, marks and state), for f16 (V transposed, as
//! llama.cpp stores it without flash attention), q8_0 and q4_0 caches, a stream shared by
//! two sequences whose cells interleave out of order. The layers' tensors given by the
//! engine's `fill` callback, one layer at a time (the stream's views, or a copy of one
//! layer in one reused buffer), give the same kept cells and context bytes; a failing
//! callback ends the round with `KVE_ERR_CALLBACK`. Hostile input: a named status.

use half::f16;
use kvevict::capi::*;
use kvevict::Evictor;
use std::ffi::c_void;

#[path = "capi_common/round_shape.rs"]
mod round_shape;
use round_shape::*;

// include/kvevict.h's defines (generated from the core's enums, not Rust constants)
const KVE_DTYPE_F32: u32 = 0;
const KVE_DTYPE_F16: u32 = 1;
const KVE_DTYPE_Q8_0: u32 = 3;
const KVE_DTYPE_Q4_0: u32 = 4;
const KVE_PRESET_SNAPKV: u32 = 0;
const KVE_PRESET_LAPROX_SPAN: u32 = 4;
const KVE_PRESET_CRITICALKV: u32 = 5;
const KVE_PRESET_STREAMINGLLM: u32 = 6;
const KVE_PRESET_KNORM: u32 = 7;
const KVE_PRESET_UNIQUENESS: u32 = 9;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
    }
}

fn block_bytes(dt: u32) -> usize {
    match dt {
        KVE_DTYPE_Q8_0 => 34,
        KVE_DTYPE_Q4_0 => 18,
        _ => 2,
    }
}
fn values_per_unit(dt: u32) -> usize {
    if dt == KVE_DTYPE_F16 {
        1
    } else {
        32
    }
}

/// One K or V tensor of the stream: `[HKV, S, D]`, token-major rows (or, `trans`, V as
/// llama.cpp stores it without flash attention: element (h, s, d) at (h*D + d)*S + s).
struct Kv {
    bytes: Vec<u16>, // 2-byte aligned storage
    dt: u32,
    trans: bool,
}

impl Kv {
    fn new(r: &mut Rng, dt: u32, trans: bool) -> Kv {
        let values = HKV * S * D;
        let units = values / values_per_unit(dt);
        let mut b = vec![0u8; units * block_bytes(dt)];
        for u in 0..units {
            let x = &mut b[u * block_bytes(dt)..(u + 1) * block_bytes(dt)];
            let scale = f16::from_f32(if dt == KVE_DTYPE_F16 {
                r.f()
            } else {
                0.01 + 0.05 * r.f().abs()
            });
            x[..2].copy_from_slice(&scale.to_bits().to_le_bytes());
            for q in x[2..].iter_mut() {
                *q = r.next() as u8;
            }
        }
        let mut bytes = vec![0u16; b.len() / 2];
        for (i, w) in bytes.iter_mut().enumerate() {
            *w = u16::from_le_bytes([b[2 * i], b[2 * i + 1]]);
        }
        Kv { bytes, dt, trans }
    }
    fn raw(&self) -> &[u8] {
        // SAFETY: plain bytes of a live Vec<u16>.
        unsafe {
            std::slice::from_raw_parts(self.bytes.as_ptr() as *const u8, self.bytes.len() * 2)
        }
    }
    fn stride(&self) -> [u64; 3] {
        match self.trans {
            true => [(D * S) as u64, 1, S as u64],
            false => [D as u64, (HKV * D) as u64, 1],
        }
    }
    /// The whole stream, as the engine hands it to `kve_evictor_run_round`.
    fn stream(&self) -> kve_tensor {
        tensor(self.raw(), self.dt, [HKV, S, D], self.stride())
    }
    /// The rows of `cells` in their order as a dense `[HKV, n, D]` tensor of the same
    /// dtype (raw bytes): what an engine copies for the step-by-step calls.
    fn gathered(&self, cells: &[u32]) -> Vec<u16> {
        let n = cells.len();
        let per = values_per_unit(self.dt);
        let ub = block_bytes(self.dt);
        let mut out = vec![0u8; HKV * n * D / per * ub];
        let src = self.raw();
        let st = self.stride();
        for h in 0..HKV {
            for (i, &c) in cells.iter().enumerate() {
                for d in 0..D / per {
                    let from = (h * st[0] as usize
                        + c as usize * st[1] as usize
                        + d * per * st[2] as usize)
                        / per
                        * ub;
                    let to = ((h * n + i) * D + d * per) / per * ub;
                    out[to..to + ub].copy_from_slice(&src[from..from + ub]);
                }
            }
        }
        out.chunks(2)
            .map(|w| u16::from_le_bytes([w[0], w[1]]))
            .collect()
    }
}

fn tensor(b: &[u8], dt: u32, e: [usize; 3], stride: [u64; 3]) -> kve_tensor {
    kve_tensor {
        data: b.as_ptr() as *const c_void,
        len: (b.len() / block_bytes(dt) * values_per_unit(dt)) as u64,
        dtype: dt,
        pad: 0,
        extent: e.map(|x| x as u64),
        stride,
    }
}

fn f32_tensor(v: &[f32], e: [usize; 3]) -> kve_tensor {
    kve_tensor {
        data: v.as_ptr() as *const c_void,
        len: v.len() as u64,
        dtype: KVE_DTYPE_F32,
        pad: 0,
        extent: e.map(|x| x as u64),
        stride: [(e[1] * e[2]) as u64, e[2] as u64, 1],
    }
}

fn u16_bytes(v: &[u16]) -> &[u8] {
    // SAFETY: plain bytes of a live slice.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 2) }
}

struct Cache {
    k: Vec<Kv>,
    v: Vec<Kv>,
    q: Vec<Vec<f32>>, // [HQ, W, D] per layer
    wo: Vec<Vec<f32>>,
    w: usize,
}

impl Cache {
    fn new(seed: u64, dt: u32, w: usize) -> Cache {
        let mut r = Rng(seed);
        let trans = dt == KVE_DTYPE_F16; // ggml quantizes V only untransposed (flash attention)
        Cache {
            k: (0..L).map(|_| Kv::new(&mut r, dt, false)).collect(),
            v: (0..L).map(|_| Kv::new(&mut r, dt, trans)).collect(),
            q: (0..L)
                .map(|_| (0..HQ * w * D).map(|_| r.f()).collect())
                .collect(),
            wo: (0..L)
                .map(|_| (0..HQ * D * DM).map(|_| r.f()).collect())
                .collect(),
            w,
        }
    }
}

fn config(preset: u32, paged: bool) -> kve_evictor_config {
    let mut c = std::mem::MaybeUninit::<kve_evictor_config>::uninit();
    // SAFETY: a writable struct of the size passed.
    assert_eq!(
        unsafe { kve_evictor_config_init(c.as_mut_ptr(), KVE_EVICTOR_CONFIG_V2_SIZE, preset) },
        KVE_OK
    );
    // SAFETY: initialised above.
    let mut c = unsafe { c.assume_init() };
    (c.layers, c.hq, c.hkv, c.dk, c.dv, c.d_model) = (
        L as u64, HQ as u64, HKV as u64, D as u64, D as u64, DM as u64,
    );
    c.max_cells = MAX as u64;
    c.max_seqs = 2;
    c.granularity = kvevict::Granularity::Token as u32;
    c.policy = KVE_POLICY_EXPLICIT;
    c.window = 8;
    c.paged = paged as u32;
    c.paged_dtype = KVE_DTYPE_F16;
    c
}

fn evictor(c: &kve_evictor_config) -> *mut kve_evictor {
    let mut bytes = 0u64;
    // SAFETY: valid pointers.
    assert_eq!(unsafe { kve_evictor_size(c, &mut bytes) }, KVE_OK);
    let mem: &'static mut [u8] = Box::leak(vec![0x33u8; bytes as usize].into_boxed_slice());
    let mut ev = std::ptr::null_mut();
    // SAFETY: `bytes` writable bytes.
    assert_eq!(
        unsafe { kve_evictor_init(mem.as_mut_ptr() as *mut c_void, bytes, c, &mut ev) },
        KVE_OK
    );
    ev
}

/// A copy of `ev`'s block (its header's padding bytes included), a context of its own.
fn clone_of(ev: *mut kve_evictor) -> *mut kve_evictor {
    // SAFETY: a live context from `evictor`.
    let (s, e) = unsafe { Evictor::from_block(ev as *mut u8) }
        .unwrap()
        .byte_range();
    let mem: &'static mut [u8] = Box::leak(vec![0u8; e - s + 64].into_boxed_slice());
    let off = mem.as_ptr().align_offset(64);
    // SAFETY: `e - s` readable bytes at `s`, a distinct buffer with room after `off`.
    unsafe { std::ptr::copy_nonoverlapping(s as *const u8, mem.as_mut_ptr().add(off), e - s) };
    mem[off..].as_mut_ptr() as *mut kve_evictor
}

fn context(ev: *mut kve_evictor) -> Vec<u8> {
    // SAFETY: a live context from `evictor`.
    unsafe { Evictor::from_block(ev as *mut u8) }
        .unwrap()
        .context_bytes()
        .to_vec()
}

fn requirements(ev: *mut kve_evictor) -> kve_evictor_requirements {
    let mut r = std::mem::MaybeUninit::<kve_evictor_requirements>::zeroed();
    // SAFETY: a live context, a writable struct of the size passed.
    let st = unsafe {
        kve_evictor_get_requirements(ev, r.as_mut_ptr(), KVE_EVICTOR_REQUIREMENTS_V1_SIZE)
    };
    assert_eq!(st, KVE_OK);
    // SAFETY: written above.
    unsafe { r.assume_init() }
}

/// Wo handed over once, when the method reads it so.
fn give_wo(ev: *mut kve_evictor, c: &Cache) {
    if requirements(ev).wo == KVE_WO_ONCE {
        for l in 0..L {
            let t = f32_tensor(&c.wo[l], [HQ, D, DM]);
            // SAFETY: a live context and tensor.
            assert_eq!(
                unsafe { kve_evictor_set_output_projection(ev, l as u64, &t) },
                KVE_OK
            );
        }
    }
}

/// The step-by-step round on `cells` (rows copied dense, in their order).
fn stepwise(
    ev: *mut kve_evictor,
    seq: u64,
    c: &Cache,
    cells: &[u32],
    target: u64,
    marks: Option<&[u8]>,
) -> Vec<u32> {
    let n = cells.len();
    let req = requirements(ev);
    // SAFETY: a live context; buffers as the calls describe them.
    unsafe {
        assert_eq!(kve_evictor_begin(ev, seq, n as u64, target), KVE_OK);
        if let Some(m) = marks {
            assert_eq!(
                kve_evictor_mark_cells(ev, seq, m.as_ptr(), n as u64, 0.5),
                KVE_OK
            );
        }
        let wq = c.w.min(n);
        for l in 0..L {
            let kg = c.k[l].gathered(cells);
            let vg = c.v[l].gathered(cells);
            let mut x = std::mem::MaybeUninit::<kve_evictor_layer>::uninit();
            assert_eq!(
                kve_evictor_layer_init(x.as_mut_ptr(), KVE_EVICTOR_LAYER_V1_SIZE),
                KVE_OK
            );
            let mut x = x.assume_init();
            let dense = [(D * n) as u64, D as u64, 1];
            x.keys = tensor(u16_bytes(&kg), c.k[l].dt, [HKV, n, D], dense);
            if req.values != 0 {
                x.values = tensor(u16_bytes(&vg), c.v[l].dt, [HKV, n, D], dense);
            }
            if req.queries != 0 {
                x.queries = queries(c, l, wq);
            }
            assert_eq!(kve_evictor_score_layer(ev, seq, l as u64, &x), KVE_OK);
        }
        let mut count = 0u64;
        assert_eq!(kve_evictor_select(ev, seq, &mut count), KVE_OK);
        let mut kept = vec![0u32; n];
        assert_eq!(
            kve_evictor_kept_cells(ev, seq, kept.as_mut_ptr(), n as u64, &mut count),
            KVE_OK
        );
        kept.truncate(count as usize);
        kept
    }
}

/// Layer l's last `wq` window queries.
fn queries(c: &Cache, l: usize, wq: usize) -> kve_tensor {
    let mut t = f32_tensor(&c.q[l], [HQ, c.w, D]);
    t.extent[1] = wq as u64;
    t.data = c.q[l][(c.w - wq) * D..].as_ptr() as *const c_void;
    t.len -= ((c.w - wq) * D) as u64;
    t
}

struct Round {
    keys: Vec<kve_tensor>,
    values: Vec<kve_tensor>,
    queries: Vec<kve_tensor>,
    r: kve_evictor_round,
}

fn round(c: &Cache, cells: &[u32], target: u64, marks: Option<&[u8]>) -> Round {
    let mut r = std::mem::MaybeUninit::<kve_evictor_round>::uninit();
    // SAFETY: a writable struct of the size passed.
    assert_eq!(
        unsafe { kve_evictor_round_init(r.as_mut_ptr(), KVE_EVICTOR_ROUND_V2_SIZE) },
        KVE_OK
    );
    // SAFETY: initialised above.
    let mut r = unsafe { r.assume_init() };
    let wq = c.w.min(cells.len());
    let keys: Vec<_> = c.k.iter().map(Kv::stream).collect();
    let values: Vec<_> = c.v.iter().map(Kv::stream).collect();
    let queries: Vec<_> = (0..L).map(|l| queries(c, l, wq)).collect();
    (r.cells, r.n_cells, r.target) = (cells.as_ptr(), cells.len() as u64, target);
    (r.n_keys, r.n_values, r.n_queries) = (L as u64, L as u64, L as u64);
    if let Some(m) = marks {
        (r.marks, r.n_marks, r.mark_share) = (m.as_ptr(), m.len() as u64, 0.5);
    }
    Round {
        keys,
        values,
        queries,
        r,
    }
}

/// `kve_evictor_run_round` with the tensors of `x`: its status, the kept cells.
fn run(ev: *mut kve_evictor, seq: u64, x: &mut Round, cap: usize) -> (i32, Vec<u32>, u64) {
    x.r.keys = x.keys.as_ptr();
    x.r.values = x.values.as_ptr();
    x.r.queries = x.queries.as_ptr();
    call(ev, seq, &x.r, cap)
}

/// `kve_evictor_run_round` on `r` (its pointers into live buffers), `kept` with room for
/// `cap`: its status, the kept cells, the count.
fn call(ev: *mut kve_evictor, seq: u64, r: &kve_evictor_round, cap: usize) -> (i32, Vec<u32>, u64) {
    let mut kept = vec![u32::MAX; cap.max(1)];
    let mut count = u64::MAX;
    // SAFETY: a live context; every pointer of `r` into live buffers (the caller's word).
    let st =
        unsafe { kve_evictor_run_round(ev, seq, r, kept.as_mut_ptr(), cap as u64, &mut count) };
    if st == KVE_OK {
        kept.truncate(count as usize);
    }
    (st, kept, count)
}

/// Two sequences sharing the stream: their cells interleave, in position order neither
/// ascending nor the same as each other's; the rest of the stream is free or another's.
fn two_sequences(seed: u64) -> [Vec<u32>; 2] {
    let mut r = Rng(seed);
    let mut all: Vec<u32> = (0..S as u32).collect();
    r.shuffle(&mut all);
    [all[..MAX].to_vec(), all[MAX..MAX + 17].to_vec()]
}

const PRESETS: &[u32] = &[
    KVE_PRESET_SNAPKV,
    KVE_PRESET_LAPROX_SPAN,
    KVE_PRESET_CRITICALKV,
    KVE_PRESET_KNORM,
    KVE_PRESET_UNIQUENESS,
    KVE_PRESET_STREAMINGLLM,
];

fn same_as_stepwise(dt: u32) {
    let mut compared = 0;
    for (pi, &preset) in PRESETS.iter().enumerate() {
        let cfg = config(preset, true);
        let mut bytes = 0u64;
        // SAFETY: valid pointers.
        let st = unsafe { kve_evictor_size(&cfg, &mut bytes) };
        assert_eq!(st, KVE_OK, "preset {preset}");
        let a = evictor(&cfg);
        let b = clone_of(a);
        if requirements(a).wo == KVE_WO_EVERY_ROUND {
            continue;
        }
        let c = Cache::new(
            7 + pi as u64 + dt as u64 * 100,
            dt,
            requirements(a).window.max(1) as usize,
        );
        give_wo(a, &c);
        give_wo(b, &c);
        let seqs = two_sequences(3 + pi as u64);
        for (seq, cells) in seqs.iter().enumerate() {
            let marks: Vec<u8> = (0..cells.len()).map(|i| (i % 3 == 0) as u8).collect();
            // the same marks by position: cell i at position 3i + 7, ranges over i in
            // [0, 10) and [20, 25) (and a range holding no cell); a range's cells are flagged
            // with its index + 1 (its span for KVE_MARK_SPLIT_SPANS), the same context bytes
            let positions: Vec<i32> = (0..cells.len() as i32).map(|i| 3 * i + 7).collect();
            let ranges = [7, 37, 67, 82, -5, 0];
            let by_pos: Vec<u8> = (0..cells.len())
                .map(|i| {
                    if i < 10 {
                        1
                    } else {
                        2 * (20..25).contains(&i) as u8
                    }
                })
                .collect();
            for (m, pos) in [
                (None, false),
                (Some(&marks[..]), false),
                (Some(&by_pos[..]), true),
            ] {
                let target = (cells.len() / 2) as u64;
                let want = stepwise(a, seq as u64, &c, cells, target, m);
                let mut x = round(&c, cells, target, if pos { None } else { m });
                if pos {
                    (x.r.positions, x.r.n_positions) = (positions.as_ptr(), positions.len() as u64);
                    (x.r.mark_ranges, x.r.n_mark_ranges) = (ranges.as_ptr(), ranges.len() as u64);
                    x.r.mark_share = 0.5;
                }
                let (st, got, _) = run(b, seq as u64, &mut x, cells.len());
                assert_eq!(st, KVE_OK, "preset {preset} dtype {dt}");
                assert_eq!(got, want, "preset {preset} dtype {dt} seq {seq}");
                assert!(
                    got.len() < cells.len() && !got.is_empty(),
                    "{} of {}",
                    got.len(),
                    cells.len()
                );
                let (ca, cb) = (context(a), context(b));
                let first = ca.iter().zip(&cb).position(|(x, y)| x != y);
                assert!(
                    ca == cb && first.is_none(),
                    "first difference at {first:?} of {}",
                    ca.len()
                );
                assert!(
                    context(a) == context(b),
                    "context bytes differ: preset {preset} dtype {dt} seq {seq}"
                );
                compared += 1;
            }
            // SAFETY: live contexts with a selected round on `seq`.
            unsafe {
                assert_eq!(kve_evictor_commit(a, seq as u64), KVE_OK);
                assert_eq!(kve_evictor_commit(b, seq as u64), KVE_OK);
            }
            assert!(context(a) == context(b));
        }
    }
    assert!(
        compared >= 2 * 2 * (PRESETS.len() - 1),
        "{compared} rounds compared"
    );
}

#[test]
fn run_round_equals_the_stepwise_calls_f16_transposed_v() {
    same_as_stepwise(KVE_DTYPE_F16);
}

#[test]
fn run_round_equals_the_stepwise_calls_q8_0() {
    same_as_stepwise(KVE_DTYPE_Q8_0);
}

#[test]
fn run_round_equals_the_stepwise_calls_q4_0() {
    same_as_stepwise(KVE_DTYPE_Q4_0);
}

/// `cells` NULL: K/V the engine gives dense in position order (a copy), scored as they are
/// by a context without a gather area: the same as the step-by-step calls.
#[test]
fn a_dense_round_equals_the_stepwise_calls() {
    for dt in [KVE_DTYPE_F16, KVE_DTYPE_Q8_0] {
        let cfg = config(KVE_PRESET_LAPROX_SPAN, false);
        let a = evictor(&cfg);
        let b = clone_of(a);
        let c = Cache::new(21 + dt as u64, dt, 8);
        give_wo(a, &c);
        give_wo(b, &c);
        let [cells, _] = two_sequences(4);
        let n = cells.len();
        let want = stepwise(a, 0, &c, &cells, 12, None);
        let kg: Vec<Vec<u16>> = c.k.iter().map(|k| k.gathered(&cells)).collect();
        let vg: Vec<Vec<u16>> = c.v.iter().map(|v| v.gathered(&cells)).collect();
        let dense =
            |g: &Vec<u16>| tensor(u16_bytes(g), dt, [HKV, n, D], [(D * n) as u64, D as u64, 1]);
        let mut x = round(&c, &cells, 12, None);
        x.keys = kg.iter().map(dense).collect();
        x.values = vg.iter().map(dense).collect();
        x.r.cells = std::ptr::null();
        let (st, got, _) = run(b, 0, &mut x, n);
        assert_eq!(st, KVE_OK);
        assert_eq!(got, want);
        assert!(context(a) == context(b));
        // a dense tensor of another length
        let mut x = round(&c, &cells, 12, None);
        x.keys = kg.iter().map(dense).collect();
        x.r.cells = std::ptr::null();
        let before = context(b);
        assert_eq!(run(b, 0, &mut x, n).0, KVE_ERR_SHAPE_MISMATCH);
        assert!(context(b) == before);
    }
}

/// Hostile rounds: each refused with its status before the round begins, the context
/// and the outputs as they were.
#[test]
fn hostile_rounds_are_refused_with_a_named_status() {
    let cfg = config(KVE_PRESET_SNAPKV, true);
    let ev = evictor(&cfg);
    let c = Cache::new(5, KVE_DTYPE_Q8_0, requirements(ev).window as usize);
    let [cells, _] = two_sequences(9);
    let n = cells.len();
    let refused = |want: i32, cells: &[u32], cap: usize, edit: &dyn Fn(&mut Round)| {
        let mut x = round(&c, cells, 10, None);
        edit(&mut x);
        let before = context(ev);
        let (st, kept, count) = run(ev, 0, &mut x, cap);
        assert_eq!(st, want, "got {st}, want {want}");
        assert!(
            kept.iter().all(|&k| k == u32::MAX) && count == u64::MAX,
            "outputs written on {want}"
        );
        assert!(context(ev) == before, "context changed on {want}");
    };
    let none: &dyn Fn(&mut Round) = &|_| {};
    // a cell named twice
    let mut dup = cells.clone();
    dup[5] = dup[20];
    refused(KVE_ERR_ALIASING, &dup, n, none);
    // a cell past the stream
    let mut far = cells.clone();
    far[3] = S as u32;
    refused(KVE_ERR_OUT_OF_BOUNDS, &far, n, none);
    // more cells than the context holds
    let many: Vec<u32> = (0..MAX as u32 + 1).collect();
    refused(KVE_ERR_SHAPE_MISMATCH, &many, MAX + 1, none);
    // no cells
    refused(KVE_ERR_INVALID_ARGUMENT, &[], n, none);
    // the wrong number of layers
    refused(KVE_ERR_SHAPE_MISMATCH, &cells, n, &|x| {
        x.r.n_keys = L as u64 + 1
    });
    refused(KVE_ERR_SHAPE_MISMATCH, &cells, n, &|x| x.r.n_values = 1);
    // marks of another length
    let marks = vec![1u8; n - 1];
    refused(KVE_ERR_SHAPE_MISMATCH, &cells, n, &|x| {
        (x.r.marks, x.r.n_marks) = (marks.as_ptr(), marks.len() as u64)
    });
    // marks by position: a range reversed, an odd count, positions of another length, and
    // with flags too
    let pos: Vec<i32> = (0..n as i32).collect();
    let by = |x: &mut Round, rg: &'static [i32], np: usize| {
        (x.r.positions, x.r.n_positions) = (pos.as_ptr(), np as u64);
        (x.r.mark_ranges, x.r.n_mark_ranges) = (rg.as_ptr(), rg.len() as u64);
    };
    refused(KVE_ERR_INVALID_ARGUMENT, &cells, n, &|x| by(x, &[5, 2], n));
    refused(KVE_ERR_INVALID_ARGUMENT, &cells, n, &|x| {
        by(x, &[1, 2, 3], n)
    });
    refused(KVE_ERR_SHAPE_MISMATCH, &cells, n, &|x| {
        by(x, &[1, 2], n - 1)
    });
    let flags = vec![1u8; n];
    refused(KVE_ERR_INVALID_ARGUMENT, &cells, n, &|x| {
        by(x, &[1, 2], n);
        (x.r.marks, x.r.n_marks) = (flags.as_ptr(), n as u64)
    });
    // a marks' share outside [0, 1]
    refused(KVE_ERR_INVALID_ARGUMENT, &cells, n, &|x| {
        by(x, &[1, 2], n);
        x.r.mark_share = 1.5
    });
    // reserved fields
    refused(KVE_ERR_INVALID_ARGUMENT, &cells, n, &|x| x.r.reserved = 1);
    refused(KVE_ERR_INVALID_ARGUMENT, &cells, n, &|x| x.r.mark_split = 2);
    // an unknown struct size
    refused(KVE_ERR_INVALID_ARGUMENT, &cells, n, &|x| {
        x.r.struct_size = 12
    });
    // a tensor shorter than the stream it claims
    refused(KVE_ERR_OUT_OF_BOUNDS, &cells, n, &|x| x.keys[1].len /= 2);
    // a stream narrower than the cells named
    refused(KVE_ERR_OUT_OF_BOUNDS, &cells, n, &|x| {
        x.values[0].extent[1] = 8
    });
    // keys missing
    let mut x = round(&c, &cells, 10, None);
    x.r.keys = std::ptr::null();
    let (mut kept, mut count) = (vec![0u32; n], 0u64);
    // SAFETY: a live context; the keys pointer is NULL on purpose.
    let st = unsafe { kve_evictor_run_round(ev, 0, &x.r, kept.as_mut_ptr(), n as u64, &mut count) };
    assert_eq!(st, KVE_ERR_NULL_POINTER);
    // the kept cells written over the cell list
    let mut x = round(&c, &cells, 10, None);
    (x.r.keys, x.r.values, x.r.queries) = (x.keys.as_ptr(), x.values.as_ptr(), x.queries.as_ptr());
    let mut own = cells.clone();
    x.r.cells = own.as_ptr();
    // SAFETY: a live context; `kept` overlaps the cells on purpose.
    let st = unsafe { kve_evictor_run_round(ev, 0, &x.r, own.as_mut_ptr(), n as u64, &mut count) };
    assert_eq!(st, KVE_ERR_ALIASING);
    // a context without a gather area
    let plain = evictor(&config(KVE_PRESET_SNAPKV, false));
    let mut x = round(&c, &cells, 10, None);
    assert_eq!(run(plain, 0, &mut x, n).0, KVE_ERR_INVALID_ARGUMENT);
    // too small an output (room for fewer than every cell, though the 10 kept would fit):
    // refused before the round begins
    refused(KVE_ERR_OUTPUT_TOO_SMALL, &cells, 3, none);
    refused(KVE_ERR_OUTPUT_TOO_SMALL, &cells, n - 1, none);
    // and with room, the same round succeeds
    let mut x = round(&c, &cells, 10, None);
    let (st, kept, _) = run(ev, 0, &mut x, n);
    assert_eq!(st, KVE_OK);
    assert_eq!(kept.len(), 10);
}

/// What the `fill` callback of these tests gives: per layer the tensors of `layers` (or,
/// `copy`, layer l's rows of `cells` copied dense into `buf`, one buffer reused for every
/// layer), the layers it was asked for, a layer at which it fails, an edit of its output.
struct Fill<'a> {
    keys: Vec<kve_tensor>,
    values: Vec<kve_tensor>,
    queries: Vec<kve_tensor>,
    copy: Option<(&'a Cache, &'a [u32])>,
    buf: [Vec<u16>; 2],
    asked: Vec<u64>,
    fail_at: Option<u64>,
    edit: Option<&'a dyn Fn(&mut kve_evictor_layer)>,
}

impl<'a> Fill<'a> {
    fn new(x: &Round) -> Fill<'a> {
        Fill {
            keys: x.keys.clone(),
            values: x.values.clone(),
            queries: x.queries.clone(),
            copy: None,
            buf: [vec![], vec![]],
            asked: vec![],
            fail_at: None,
            edit: None,
        }
    }
}

unsafe extern "C" fn fill_cb(user: *mut c_void, layer: u64, out: *mut kve_evictor_layer) -> i32 {
    // SAFETY: `user` is the test's `Fill`, `out` the library's layer struct.
    let (f, out) = unsafe { (&mut *(user as *mut Fill), &mut *out) };
    f.asked.push(layer);
    if f.fail_at == Some(layer) {
        return -7;
    }
    let l = layer as usize;
    match f.copy {
        Some((c, cells)) => {
            let n = cells.len();
            let dense = [(D * n) as u64, D as u64, 1];
            // one buffer per tensor, overwritten for every layer
            f.buf = [c.k[l].gathered(cells), c.v[l].gathered(cells)];
            out.keys = tensor(u16_bytes(&f.buf[0]), c.k[l].dt, [HKV, n, D], dense);
            out.values = tensor(u16_bytes(&f.buf[1]), c.v[l].dt, [HKV, n, D], dense);
        }
        None => (out.keys, out.values) = (f.keys[l], f.values[l]),
    }
    out.queries = f.queries[l];
    if let Some(e) = f.edit {
        e(out);
    }
    0
}

/// `x` set to take its tensors from `f` through the callback (no arrays).
fn set_fill(x: &mut Round, f: &mut Fill) {
    (x.r.n_keys, x.r.n_values, x.r.n_queries) = (0, 0, 0);
    x.r.fill = Some(fill_cb);
    x.r.fill_layers = L as u64;
    x.r.user = f as *mut Fill as *mut c_void;
}

/// `x`'s round with its tensors from `f` through the callback (no arrays).
fn run_filled(
    ev: *mut kve_evictor,
    seq: u64,
    x: &mut Round,
    f: &mut Fill,
    cap: usize,
) -> (i32, Vec<u32>, u64) {
    set_fill(x, f);
    // `fill_cb` reads `f`, whose pointers are into live buffers
    call(ev, seq, &x.r, cap)
}

/// The callback's round equals the arrays' round: kept cells and context bytes, over the
/// stream (cells by index) and over a copy of one layer at a time (`cells` NULL), for
/// f16 (V transposed), q8_0 and q4_0, every preset, with marks; the callback is asked for
/// each layer once, in order.
#[test]
fn a_filled_round_equals_the_arrays_round() {
    let mut compared = 0;
    for dt in [KVE_DTYPE_F16, KVE_DTYPE_Q8_0, KVE_DTYPE_Q4_0] {
        for (pi, &preset) in PRESETS.iter().enumerate() {
            for copy in [false, true] {
                let a = evictor(&config(preset, !copy));
                if requirements(a).wo == KVE_WO_EVERY_ROUND {
                    continue;
                }
                let b = clone_of(a);
                let c = Cache::new(
                    40 + pi as u64 + dt as u64,
                    dt,
                    requirements(a).window.max(1) as usize,
                );
                give_wo(a, &c);
                give_wo(b, &c);
                for (seq, cells) in two_sequences(11 + pi as u64).iter().enumerate() {
                    let marks: Vec<u8> = (0..cells.len()).map(|i| (i % 4 == 1) as u8).collect();
                    let target = (cells.len() / 3) as u64;
                    let mut x = round(&c, cells, target, Some(&marks));
                    if copy {
                        let n = cells.len();
                        let d = [(D * n) as u64, D as u64, 1];
                        let gk: Vec<Vec<u16>> = c.k.iter().map(|k| k.gathered(cells)).collect();
                        let gv: Vec<Vec<u16>> = c.v.iter().map(|v| v.gathered(cells)).collect();
                        x.keys = gk
                            .iter()
                            .map(|g| tensor(u16_bytes(g), dt, [HKV, n, D], d))
                            .collect();
                        x.values = gv
                            .iter()
                            .map(|g| tensor(u16_bytes(g), dt, [HKV, n, D], d))
                            .collect();
                        x.r.cells = std::ptr::null();
                        let want = run(a, seq as u64, &mut x, n);
                        let mut y = round(&c, cells, target, Some(&marks));
                        y.r.cells = std::ptr::null();
                        let mut f = Fill::new(&y);
                        f.copy = Some((&c, &cells[..]));
                        let got = run_filled(b, seq as u64, &mut y, &mut f, n);
                        assert_eq!(want.0, KVE_OK);
                        assert_eq!(got, want, "preset {preset} dtype {dt} copy");
                        assert_eq!(f.asked, (0..L as u64).collect::<Vec<_>>());
                    } else {
                        let want = run(a, seq as u64, &mut x, cells.len());
                        let mut y = round(&c, cells, target, Some(&marks));
                        let mut f = Fill::new(&y);
                        let got = run_filled(b, seq as u64, &mut y, &mut f, cells.len());
                        assert_eq!(want.0, KVE_OK);
                        assert_eq!(got, want, "preset {preset} dtype {dt}");
                        assert_eq!(f.asked, (0..L as u64).collect::<Vec<_>>());
                    }
                    assert!(
                        context(a) == context(b),
                        "context bytes: preset {preset} dtype {dt}"
                    );
                    // SAFETY: live contexts with a selected round on `seq`.
                    unsafe {
                        assert_eq!(kve_evictor_commit(a, seq as u64), KVE_OK);
                        assert_eq!(kve_evictor_commit(b, seq as u64), KVE_OK);
                    }
                    assert!(context(a) == context(b));
                    compared += 1;
                }
            }
        }
    }
    assert!(
        compared >= 3 * 2 * 2 * (PRESETS.len() - 1),
        "{compared} rounds compared"
    );
}

/// A callback returning nonzero ends the round with `KVE_ERR_CALLBACK`: it is not asked
/// again, `kept` and `count` are not written, and the next round on the sequence runs as
/// on a context that never saw the failed one.
#[test]
fn a_failing_callback_ends_the_round_with_its_status() {
    for fail_at in 0..L as u64 {
        let cfg = config(KVE_PRESET_LAPROX_SPAN, true);
        let a = evictor(&cfg);
        let c = Cache::new(77, KVE_DTYPE_Q8_0, requirements(a).window as usize);
        give_wo(a, &c);
        let b = clone_of(a);
        let [cells, _] = two_sequences(5);
        let mut x = round(&c, &cells, 9, None);
        let mut f = Fill::new(&x);
        f.fail_at = Some(fail_at);
        let (st, kept, count) = run_filled(b, 0, &mut x, &mut f, cells.len());
        assert_eq!(st, KVE_ERR_CALLBACK);
        assert!(kept.iter().all(|&k| k == u32::MAX) && count == u64::MAX);
        assert_eq!(f.asked, (0..=fail_at).collect::<Vec<_>>());
        // the next round starts clean: as the round on the untouched context
        let want = run(a, 0, &mut round(&c, &cells, 9, None), cells.len());
        let mut y = round(&c, &cells, 9, None);
        let mut g = Fill::new(&y);
        let got = run_filled(b, 0, &mut y, &mut g, cells.len());
        assert_eq!(want.0, KVE_OK);
        assert_eq!(got, want);
        assert!(context(a) == context(b));
    }
}

/// Hostile callback rounds: refused with a named status. What is wrong with the struct is
/// refused before the round begins (the callback never asked, the context unchanged); what
/// is wrong with the tensors the callback gives, when it gives them (outputs unwritten).
#[test]
fn hostile_callback_rounds_are_refused_with_a_named_status() {
    let ev = evictor(&config(KVE_PRESET_SNAPKV, true));
    let c = Cache::new(6, KVE_DTYPE_F16, requirements(ev).window as usize);
    let [cells, _] = two_sequences(13);
    let n = cells.len();
    let before_begin = |want: i32, edit: &dyn Fn(&mut Round)| {
        let mut x = round(&c, &cells, 10, None);
        let mut f = Fill::new(&x);
        let before = context(ev);
        set_fill(&mut x, &mut f);
        edit(&mut x);
        let (st, kept, count) = call(ev, 0, &x.r, n);
        assert_eq!(st, want);
        assert!(f.asked.is_empty(), "callback asked on {want}");
        assert!(kept.iter().all(|&k| k == u32::MAX) && count == u64::MAX);
        assert!(context(ev) == before, "context changed on {want}");
    };
    // arrays and the callback both
    before_begin(KVE_ERR_INVALID_ARGUMENT, &|x| {
        (x.r.keys, x.r.n_keys) = (x.keys.as_ptr(), L as u64)
    });
    before_begin(KVE_ERR_INVALID_ARGUMENT, &|x| {
        (x.r.queries, x.r.n_queries) = (x.queries.as_ptr(), L as u64)
    });
    // another layer count, a count without a callback, the pad
    before_begin(KVE_ERR_SHAPE_MISMATCH, &|x| x.r.fill_layers = L as u64 + 1);
    before_begin(KVE_ERR_SHAPE_MISMATCH, &|x| x.r.fill_layers = 0);
    before_begin(KVE_ERR_INVALID_ARGUMENT, &|x| x.r.fill = None);
    before_begin(KVE_ERR_INVALID_ARGUMENT, &|x| x.r.user_pad = 1);
    // no callback, no arrays
    before_begin(KVE_ERR_SHAPE_MISMATCH, &|x| {
        (x.r.fill, x.r.fill_layers) = (None, 0)
    });
    // a V1 struct ends before `fill`: read as no callback, no arrays
    before_begin(KVE_ERR_SHAPE_MISMATCH, &|x| {
        x.r.struct_size = KVE_EVICTOR_ROUND_V1_SIZE
    });
    // a cell list the callback would never be asked for
    let mut dup = cells.clone();
    dup[1] = dup[2];
    before_begin(KVE_ERR_ALIASING, &|x| x.r.cells = dup.as_ptr());

    // what the callback gives, refused when it gives it
    let mut own = vec![u32::MAX; n];
    let own_keys = tensor(
        // SAFETY: plain bytes of `own`, which is `kept` below.
        unsafe { std::slice::from_raw_parts(own.as_ptr() as *const u8, n * 4) },
        KVE_DTYPE_F16,
        [HKV, n / D, D],
        [(n / D * D) as u64, D as u64, 1],
    );
    let edits: Vec<(i32, Box<dyn Fn(&mut kve_evictor_layer)>)> = vec![
        (
            KVE_ERR_NULL_POINTER,
            Box::new(|l| l.keys = kve_tensor::NONE),
        ),
        (KVE_ERR_OUT_OF_BOUNDS, Box::new(|l| l.keys.extent[1] = 4)),
        (KVE_ERR_OUT_OF_BOUNDS, Box::new(|l| l.values.len /= 3)),
        (KVE_ERR_INVALID_ARGUMENT, Box::new(|l| l.struct_size = 8)),
        (KVE_ERR_INVALID_ARGUMENT, Box::new(|l| l.reserved = 1)),
        (KVE_ERR_INVALID_ARGUMENT, Box::new(|l| l.wo = l.keys)),
        (KVE_ERR_INVALID_ARGUMENT, Box::new(|l| l.row_lse_len = 3)),
        (KVE_ERR_BAD_ENUM, Box::new(|l| l.keys.dtype = 99)),
        (KVE_ERR_ALIASING, Box::new(move |l| l.keys = own_keys)),
    ];
    for (want, edit) in &edits {
        let mut x = round(&c, &cells, 10, None);
        let mut f = Fill::new(&x);
        f.edit = Some(&**edit);
        let (kept, mut count) = (own.as_mut_ptr(), u64::MAX);
        set_fill(&mut x, &mut f);
        // SAFETY: a live context; `kept` is `own`, which the last edit aliases on purpose.
        let st = unsafe { kve_evictor_run_round(ev, 0, &x.r, kept, n as u64, &mut count) };
        assert_eq!(st, *want);
        assert_eq!(f.asked, vec![0], "asked again after {want}");
        assert!(own.iter().all(|&k| k == u32::MAX) && count == u64::MAX);
    }
    // and the same round, its callback well behaved, succeeds
    let mut x = round(&c, &cells, 10, None);
    let mut f = Fill::new(&x);
    let (st, kept, _) = run_filled(ev, 0, &mut x, &mut f, n);
    assert_eq!(st, KVE_OK);
    assert_eq!(kept.len(), 10);
}

/// `mark_split` (`KVE_MARK_SPLIT_SPANS`): marks that form one run keep what the default
/// keeps (one span takes the whole marked budget); marks in many runs (every third cell)
/// change some rounds; `tests/marks.rs` checks the rule against the f64 reference.
#[test]
fn mark_split_spans_through_a_round() {
    let mut differs = 0;
    for (pi, &preset) in [KVE_PRESET_SNAPKV, KVE_PRESET_UNIQUENESS]
        .iter()
        .enumerate()
    {
        let ev = evictor(&config(preset, true));
        let c = Cache::new(
            40 + pi as u64,
            KVE_DTYPE_F16,
            requirements(ev).window.max(1) as usize,
        );
        give_wo(ev, &c);
        let cells = &two_sequences(9 + pi as u64)[0];
        let one: Vec<u8> = (0..cells.len())
            .map(|i| (2..20).contains(&i) as u8)
            .collect();
        let runs: Vec<u8> = (0..cells.len()).map(|i| (i % 3 == 0) as u8).collect();
        for (marks, same) in [(&one, true), (&runs, false)] {
            let target = (cells.len() / 3) as u64;
            let mut kept = Vec::new();
            for split in [KVE_MARK_SPLIT_SHARE, KVE_MARK_SPLIT_SPANS] {
                let mut x = round(&c, cells, target, Some(marks));
                x.r.mark_share = 1.0;
                x.r.mark_split = split;
                let (st, got, _) = run(ev, 0, &mut x, cells.len());
                assert_eq!(st, KVE_OK, "preset {preset} split {split}");
                kept.push(got);
            }
            if same {
                assert_eq!(kept[0], kept[1], "preset {preset}: one run");
            } else {
                differs += (kept[0] != kept[1]) as u32;
            }
        }
    }
    assert!(differs > 0, "the spans changed no round");
}
