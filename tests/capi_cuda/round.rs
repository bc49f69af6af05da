//! `kve_cuda_evictor_run_round`, the device form of `kve_evictor_run_round`, against the
//! host call on the same cache: each layer's K/V over a whole cell stream in device memory
//! (f16 with V transposed as llama.cpp stores it without flash attention, f32 and bf16
//! token rows), the sequence's cells named by index out of order (gathered on the device),
//! or the round's cells themselves (`cells` NULL); window queries in host memory (uploaded
//! by the library in the keys' dtype: values exact in that dtype, so both forms score the
//! same numbers). The same kept cells for every preset the device form runs, from the
//! arrays, from the engine's `fill` (one layer at a time) and with the first release's
//! struct; a failing `fill` ends the round with `KVE_ERR_CALLBACK`; hostile structs get
//! the host call's status and write nothing on the device; marks, a quantized device cache,
//! a context without paged views for `cells`, and a per-head selection are refused before
//! the round begins.

use super::*;
use kvevict::capi::kve_cuda_evictor;

#[path = "../capi_common/round_shape.rs"]
mod round_shape;
use round_shape::*;
const W: usize = 8;

/// One cache: per layer K and V `[HKV, cells, D]` (host bytes and device copy), window
/// queries `[HQ, W, D]` exact in `dt`, `Wo`.
struct Cache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    q: Vec<Vec<f32>>,
    wo: Vec<Vec<f32>>,
}

impl Cache {
    fn new(rng: &mut Rng, dt: Dt, v_layout: Layout, cells: usize) -> Cache {
        let e = [HKV, cells, D];
        Cache {
            k: (0..L)
                .map(|_| Tensor::new(dt, Layout::TokenRows, e, rng, 1.0))
                .collect(),
            v: (0..L)
                .map(|_| Tensor::new(dt, v_layout, e, rng, 1.0))
                .collect(),
            q: (0..L)
                .map(|_| {
                    rng.normals(HQ * W * D, 1.0)
                        .into_iter()
                        .map(|x| dt.round(x))
                        .collect()
                })
                .collect(),
            wo: (0..L).map(|_| rng.normals(HQ * D * DM, 0.2)).collect(),
        }
    }
}

fn f32_tensor(v: &[f32], e: [usize; 3]) -> kve_tensor {
    kve_tensor {
        data: v.as_ptr() as *const c_void,
        len: v.len() as u64,
        dtype: kvevict::DType::F32 as u32,
        pad: 0,
        extent: e.map(|x| x as u64),
        stride: [(e[1] * e[2]) as u64, e[2] as u64, 1],
    }
}

fn config(preset: u32, dt: Dt, paged: bool) -> kve_evictor_config {
    let mut c = std::mem::MaybeUninit::<kve_evictor_config>::uninit();
    // SAFETY: a writable struct of the size passed.
    let st = unsafe { kve_evictor_config_init(c.as_mut_ptr(), KVE_EVICTOR_CONFIG_V2_SIZE, preset) };
    assert_eq!(st, KVE_OK);
    // SAFETY: initialised above.
    let mut c = unsafe { c.assume_init() };
    (c.layers, c.hq, c.hkv, c.dk, c.dv, c.d_model) = (
        L as u64, HQ as u64, HKV as u64, D as u64, D as u64, DM as u64,
    );
    (c.max_cells, c.max_seqs, c.granularity) = (MAX as u64, 2, Granularity::Token as u32);
    (c.policy, c.window) = (KVE_POLICY_EXPLICIT, W as u32);
    (c.paged, c.paged_dtype) = (paged as u32, dt.code() as u32);
    c
}

/// The host and the device form of one configuration (Wo handed to both).
struct Pair {
    he: *mut kve_evictor,
    de: *mut kve_cuda_evictor,
    block: Buf,
    _mem: (Vec<u8>, Vec<u8>),
}

fn pair(c: &kve_evictor_config, cache: &Cache) -> Pair {
    let (mut hb, mut ch, mut cd) = (0u64, 0u64, 0u64);
    // SAFETY: valid pointers and sizes throughout.
    unsafe {
        assert_eq!(kve_evictor_size(c, &mut hb), KVE_OK);
        assert_eq!(kve_cuda_evictor_size(c, &mut ch, &mut cd), KVE_OK);
        let mut hmem = vec![0u8; hb as usize];
        let mut dmem = vec![0u8; ch as usize];
        let block = Buf::new(cd as usize);
        let (mut he, mut de) = (null_mut(), null_mut());
        assert_eq!(
            kve_evictor_init(hmem.as_mut_ptr() as _, hb, c, &mut he),
            KVE_OK
        );
        let st = kve_cuda_evictor_init(dmem.as_mut_ptr() as _, ch, block.vptr(), cd, c, &mut de);
        assert_eq!(st, KVE_OK);
        let mut req = std::mem::MaybeUninit::<kve_evictor_requirements>::zeroed();
        let st =
            kve_evictor_get_requirements(he, req.as_mut_ptr(), KVE_EVICTOR_REQUIREMENTS_V1_SIZE);
        assert_eq!(st, KVE_OK);
        let req = req.assume_init();
        if req.wo == KVE_WO_ONCE {
            for l in 0..L {
                let t = f32_tensor(&cache.wo[l], [HQ, D, DM]);
                assert_eq!(kve_evictor_set_output_projection(he, l as u64, &t), KVE_OK);
                let st = kve_cuda_evictor_set_output_projection(de, l as u64, &t, null_mut());
                assert_eq!(st, KVE_OK);
            }
        }
        Pair {
            he,
            de,
            block,
            _mem: (hmem, dmem),
        }
    }
}

/// A round's struct and the descriptors it points to (host or device K/V).
struct Round {
    keys: Vec<kve_tensor>,
    values: Vec<kve_tensor>,
    queries: Vec<kve_tensor>,
    r: kve_evictor_round,
}

fn round(
    c: &Cache,
    cells: Option<&[u32]>,
    n: usize,
    target: u64,
    device: bool,
    size: u32,
) -> Round {
    let mut r = std::mem::MaybeUninit::<kve_evictor_round>::uninit();
    // SAFETY: a writable struct of the size passed (V2: room for every field).
    assert_eq!(
        unsafe { kve_evictor_round_init(r.as_mut_ptr(), KVE_EVICTOR_ROUND_V2_SIZE) },
        KVE_OK
    );
    // SAFETY: initialised above.
    let mut r = unsafe { r.assume_init() };
    r.struct_size = size;
    (r.cells, r.n_cells, r.target) = (cells.map_or(null(), |c| c.as_ptr()), n as u64, target);
    (r.n_keys, r.n_values, r.n_queries) = (L as u64, L as u64, L as u64);
    Round {
        keys: c.k.iter().map(|t| t.desc(device)).collect(),
        values: c.v.iter().map(|t| t.desc(device)).collect(),
        queries: c.q.iter().map(|q| f32_tensor(q, [HQ, W, D])).collect(),
        r,
    }
}

/// The host and the device [`round`] of `cells` (`MAX` of them, target 20, V2).
fn host_and_device(c: &Cache, cells: &[u32]) -> (Round, Round) {
    let r = |device| round(c, Some(cells), MAX, 20, device, KVE_EVICTOR_ROUND_V2_SIZE);
    (r(false), r(true))
}

impl Round {
    fn ready(&mut self) -> &kve_evictor_round {
        (self.r.keys, self.r.values, self.r.queries) = (
            self.keys.as_ptr(),
            self.values.as_ptr(),
            self.queries.as_ptr(),
        );
        &self.r
    }
}

/// `kve_evictor_run_round` (host) or `kve_cuda_evictor_run_round` (`de`): status, kept.
fn run(p: &Pair, device: bool, seq: u64, r: &kve_evictor_round, cap: usize) -> (i32, Vec<u32>) {
    let mut kept = vec![u32::MAX; cap.max(1)];
    let mut count = u64::MAX;
    // SAFETY: live contexts; every pointer of `r` into live buffers.
    let st = unsafe {
        match device {
            true => kve_cuda_evictor_run_round(
                p.de,
                seq,
                r,
                kept.as_mut_ptr(),
                cap as u64,
                &mut count,
                null_mut(),
            ),
            false => kve_evictor_run_round(p.he, seq, r, kept.as_mut_ptr(), cap as u64, &mut count),
        }
    };
    if st == KVE_OK {
        kept.truncate(count as usize);
    }
    (st, kept)
}

/// The sequence's cells: `MAX` of the stream's, shuffled (neither ascending nor dense).
fn cells_of(rng: &mut Rng) -> Vec<u32> {
    let mut all: Vec<u32> = (0..S as u32).collect();
    for i in (1..all.len()).rev() {
        all.swap(i, rng.below(i + 1));
    }
    all.truncate(MAX);
    all
}

const PRESETS: [Preset; 5] = [
    Preset::SnapKv,
    Preset::LaProxSpan,
    Preset::KNorm,
    Preset::Uniqueness,
    Preset::StreamingLlm,
];

#[test]
fn device_round_keeps_the_host_rounds_cells() {
    let mut rng = device_rng!(2727);
    let mut compared = 0;
    for (dt, vl) in [
        (Dt::F16, Layout::Transposed),
        (Dt::F32, Layout::TokenRows),
        (Dt::Bf16, Layout::TokenRows),
    ] {
        for preset in PRESETS {
            for dense in [false, true] {
                let tag = format!("{preset:?} {dt:?} V {vl:?} dense {dense}");
                let n = if dense { 30 } else { MAX };
                let cache = Cache::new(&mut rng, dt, vl, if dense { n } else { S });
                let cells = cells_of(&mut rng);
                let p = pair(&config(preset as u32, dt, true), &cache);
                let cells = (!dense).then_some(&cells[..]);
                for (seq, target) in [(0u64, 17u64), (1, 9)] {
                    let mut h = round(&cache, cells, n, target, false, KVE_EVICTOR_ROUND_V2_SIZE);
                    let mut d = round(&cache, cells, n, target, true, KVE_EVICTOR_ROUND_V2_SIZE);
                    let (hs, hk) = run(&p, false, seq, h.ready(), n);
                    let (ds, dk) = run(&p, true, seq, d.ready(), n);
                    assert_eq!((hs, ds), (KVE_OK, KVE_OK), "{tag}: status");
                    assert_eq!(hk.len(), target as usize, "{tag}");
                    assert_eq!(hk, dk, "{tag}: kept cells");
                    // the first release's struct: the same round
                    // SAFETY: live contexts.
                    unsafe { assert_eq!(kve_cuda_evictor_seq_reset(p.de, seq), KVE_OK) };
                    let mut d1 = round(&cache, cells, n, target, true, KVE_EVICTOR_ROUND_V1_SIZE);
                    assert_eq!(
                        run(&p, true, seq, d1.ready(), n),
                        (KVE_OK, hk.clone()),
                        "{tag}: V1"
                    );
                    // SAFETY: live contexts.
                    unsafe {
                        assert_eq!(kve_evictor_commit(p.he, seq), KVE_OK);
                        assert_eq!(kve_cuda_evictor_commit(p.de, seq), KVE_OK);
                    }
                    compared += 1;
                }
            }
        }
    }
    assert_eq!(compared, 3 * PRESETS.len() * 2 * 2);
}

/// What `fill` reads: the descriptors of every layer, and the layer to fail at.
struct Fill<'a> {
    x: &'a Round,
    fail_at: u64,
    asked: Vec<u64>,
}

unsafe extern "C" fn fill(user: *mut c_void, layer: u64, out: *mut kve_evictor_layer) -> i32 {
    // SAFETY: `user` is the test's Fill, `out` the library's struct.
    let (f, out) = unsafe { (&mut *(user as *mut Fill), &mut *out) };
    f.asked.push(layer);
    if layer == f.fail_at {
        return 3;
    }
    let l = layer as usize;
    (out.keys, out.values, out.queries) = (f.x.keys[l], f.x.values[l], f.x.queries[l]);
    0
}

const FILL: kve_evictor_fill_fn = Some(fill);

#[test]
fn device_round_from_fill_and_a_failing_fill() {
    let mut rng = device_rng!(2728);
    for preset in [Preset::SnapKv, Preset::LaProxSpan] {
        let cache = Cache::new(&mut rng, Dt::F16, Layout::Transposed, S);
        let cells = cells_of(&mut rng);
        let p = pair(&config(preset as u32, Dt::F16, true), &cache);
        let (mut h, x) = host_and_device(&cache, &cells);
        let (hs, hk) = run(&p, false, 0, h.ready(), MAX);
        assert_eq!(hs, KVE_OK);
        for fail_at in [u64::MAX, 1] {
            let mut f = Fill {
                x: &x,
                fail_at,
                asked: vec![],
            };
            let mut r = x.r;
            (r.n_keys, r.n_values, r.n_queries) = (0, 0, 0);
            (r.fill, r.fill_layers, r.user) = (FILL, L as u64, &mut f as *mut Fill as *mut c_void);
            // SAFETY: live contexts.
            unsafe { assert_eq!(kve_cuda_evictor_seq_reset(p.de, 0), KVE_OK) };
            let (st, kept) = run(&p, true, 0, &r, MAX);
            match fail_at {
                u64::MAX => {
                    assert_eq!((st, &kept), (KVE_OK, &hk), "{preset:?}: fill");
                    assert_eq!(
                        f.asked,
                        [0, 1],
                        "{preset:?}: each layer asked once, in order"
                    );
                }
                _ => {
                    assert_eq!(st, KVE_ERR_CALLBACK, "{preset:?}: failing fill");
                    assert_eq!(f.asked, [0, 1], "{preset:?}: not asked again");
                }
            }
        }
    }
}

#[test]
fn hostile_device_rounds_are_refused_as_the_host_refuses_them() {
    let mut rng = device_rng!(2729);
    let cache = Cache::new(&mut rng, Dt::F16, Layout::Transposed, S);
    let cells = cells_of(&mut rng);
    let p = pair(&config(Preset::SnapKv as u32, Dt::F16, true), &cache);
    let (mut h, mut d) = host_and_device(&cache, &cells);
    let (hr, dr) = (*h.ready(), *d.ready());
    let mut repeated = cells.clone();
    repeated[5] = repeated[9];
    let mut outside = cells.clone();
    outside[3] = S as u32;
    let mut cases: Vec<(&str, Box<dyn Fn(&mut kve_evictor_round)>, i32)> = vec![
        (
            "struct_size",
            Box::new(|r| r.struct_size = 8),
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (
            "reserved",
            Box::new(|r| r.reserved = 1),
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (
            "no cells",
            Box::new(|r| r.n_cells = 0),
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (
            "too many cells",
            Box::new(|r| r.n_cells = MAX as u64 + 1),
            KVE_ERR_OUTPUT_TOO_SMALL,
        ),
        (
            "one layer",
            Box::new(|r| r.n_keys = 1),
            KVE_ERR_SHAPE_MISMATCH,
        ),
        (
            "fill and arrays",
            Box::new(|r| (r.fill, r.fill_layers) = (FILL, L as u64)),
            KVE_ERR_INVALID_ARGUMENT,
        ),
        (
            "mark_split",
            Box::new(|r| r.mark_split = 2),
            KVE_ERR_INVALID_ARGUMENT,
        ),
    ];
    let (rp, op) = (repeated.as_ptr(), outside.as_ptr());
    cases.push((
        "repeated cell",
        Box::new(move |r| r.cells = rp),
        KVE_ERR_ALIASING,
    ));
    cases.push((
        "cell outside",
        Box::new(move |r| r.cells = op),
        KVE_ERR_OUT_OF_BOUNDS,
    ));
    let before = p.block.download();
    for (what, f, want) in &cases {
        let (mut a, mut b) = (hr, dr);
        f(&mut a);
        f(&mut b);
        let (hs, _) = run(&p, false, 0, &a, MAX);
        let (ds, _) = run(&p, true, 0, &b, MAX);
        assert_eq!(hs, *want, "{what}: host");
        assert_eq!(ds, hs, "{what}: device status as the host's");
    }
    // NULL round and count, a short kept
    let mut count = 0u64;
    let mut kept = vec![0u32; MAX];
    // NULL or short outputs: refused before anything is written
    let cases: [(&str, *const kve_evictor_round, u64, *mut u64, i32); 3] = [
        (
            "NULL round",
            null(),
            MAX as u64,
            &mut count,
            KVE_ERR_NULL_POINTER,
        ),
        (
            "NULL count",
            &dr,
            MAX as u64,
            null_mut(),
            KVE_ERR_NULL_POINTER,
        ),
        (
            "short kept",
            &dr,
            MAX as u64 - 1,
            &mut count,
            KVE_ERR_OUTPUT_TOO_SMALL,
        ),
    ];
    for (what, round, len, cnt, want) in cases {
        // SAFETY: live context; the pointers are NULL or live buffers of at least `len`.
        let st = unsafe {
            kve_cuda_evictor_run_round(p.de, 0, round, kept.as_mut_ptr(), len, cnt, null_mut())
        };
        assert_eq!(st, want, "{what}");
    }
    // the device form's own refusals: marks (cells' flags, ranges or the split), a quantized device cache
    let marks = vec![1u8; MAX];
    let mut b = dr;
    (b.marks, b.n_marks, b.mark_share) = (marks.as_ptr(), MAX as u64, 0.5);
    assert_eq!(
        run(&p, true, 0, &b, MAX).0,
        KVE_ERR_INVALID_ARGUMENT,
        "marks"
    );
    let ranges = [0i32, 4];
    let pos: Vec<i32> = (0..MAX as i32).collect();
    let mut b = dr;
    (b.mark_ranges, b.n_mark_ranges, b.positions, b.n_positions) =
        (ranges.as_ptr(), 2, pos.as_ptr(), MAX as u64);
    b.mark_share = 0.5;
    assert_eq!(
        run(&p, true, 0, &b, MAX).0,
        KVE_ERR_INVALID_ARGUMENT,
        "mark ranges"
    );
    let mut b = dr;
    b.mark_split = KVE_MARK_SPLIT_SPANS;
    assert_eq!(
        run(&p, true, 0, &b, MAX).0,
        KVE_ERR_INVALID_ARGUMENT,
        "mark split"
    );
    let mut q8 = d.keys.clone();
    q8[1].dtype = 3; // KVE_DTYPE_Q8_0
    q8[1].len = (HKV * S * D) as u64;
    q8[1].stride = [D as u64, (HKV * D) as u64, 1];
    let mut b = dr;
    b.keys = q8.as_ptr();
    assert_eq!(
        run(&p, true, 0, &b, MAX).0,
        KVE_ERR_UNSUPPORTED_DTYPE,
        "q8_0 keys"
    );
    assert!(
        p.block.download() == before,
        "a refused round wrote the device block"
    );
    // cells without paged views, and a per-head selection: refused before the round begins
    for (what, paged, gran) in [
        ("not paged", false, Granularity::Token),
        ("per head", true, Granularity::Head),
    ] {
        let mut c = config(Preset::SnapKv as u32, Dt::F16, paged);
        c.granularity = gran as u32;
        let q = pair(&c, &cache);
        assert_eq!(
            run(&q, true, 0, &dr, MAX).0,
            KVE_ERR_INVALID_ARGUMENT,
            "{what}"
        );
    }
}
