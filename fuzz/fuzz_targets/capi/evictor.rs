//! The evictor (`kve_evictor_*`, or `kve_cuda_evictor_*` on the emulator): a random
//! sequence of calls on one context (op 12).

use crate::harness::*;
use kvevict::capi::*;
use std::ffi::{c_char, c_void};

/// The fuzz round's layers for `kve_evictor_round.fill` (the V2 form of call 13).
struct FillData {
    ks: Vec<kve_tensor>,
    vs: Vec<kve_tensor>,
    qs: Vec<kve_tensor>,
    values: bool,
    fail_at: u64,
    wo: bool,
    calls: u64,
    failed: bool,
}

/// Gives layer `layer`'s tensors from `FillData` (absent where it has none), or fails at
/// `fail_at`; asserts it is never called again after a failure.
unsafe extern "C" fn fuzz_fill(user: *mut c_void, layer: u64, out: *mut kve_evictor_layer) -> i32 {
    let d = unsafe { &mut *user.cast::<FillData>() };
    assert!(!d.failed, "fill called again after it failed");
    d.calls += 1;
    if layer == d.fail_at {
        d.failed = true;
        return 7;
    }
    let o = unsafe { &mut *out };
    let i = layer as usize;
    if let Some(k) = d.ks.get(i) {
        o.keys = *k;
    }
    if let Some(v) = d.vs.get(i).filter(|_| d.values) {
        o.values = *v;
    }
    if let Some(q) = d.qs.get(i) {
        o.queries = *q;
    }
    if d.wo {
        o.wo = o.keys;
    }
    0
}

/// An evictor's host form or device form (its host context and device block, the
/// device block registered with the emulator).
enum Ev {
    Host(*mut kve_evictor),
    // (the registration is held while the device block lives)
    Device(
        *mut kve_cuda_evictor,
        Vec<u64>,
        Vec<u64>,
        #[allow(dead_code)] Registered,
    ),
}

impl Ev {
    /// What a refused call leaves as it was: the host form's context bytes (its
    /// workspace aside); the device form's host context and device block.
    fn snapshot(&self) -> Vec<u8> {
        match self {
            Ev::Host(ev) => unsafe { kvevict::Evictor::from_block(*ev as *mut u8) }
                .unwrap()
                .context_bytes()
                .to_vec(),
            Ev::Device(_, host, dev, _) => {
                let b = |v: &Vec<u64>| unsafe {
                    std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 8).to_vec()
                };
                [b(host), b(dev)].concat()
            }
        }
    }
}

/// `round` on a fresh host evictor of config `c` (its fill data reset): the status and,
/// on success, the kept cells.
unsafe fn host_twin_round(
    c: &kve_evictor_config,
    seq: u64,
    round: &kve_evictor_round,
    fd: &mut FillData,
    max: usize,
) -> (i32, Vec<u32>) {
    let mut bytes = 0u64;
    let st = kve_evictor_size(c, &mut bytes);
    if st != KVE_OK {
        return (st, Vec::new());
    }
    let mut mem = vec![0u64; bytes as usize / 8 + 1];
    let mut ev = std::ptr::null_mut();
    let st = kve_evictor_init(mem.as_mut_ptr() as *mut c_void, bytes, c, &mut ev);
    if st != KVE_OK {
        return (st, Vec::new());
    }
    (fd.calls, fd.failed) = (0, false);
    let (mut kept, mut count) = (vec![0u32; max], 0u64);
    let st = kve_evictor_run_round(ev, seq, round, kept.as_mut_ptr(), max as u64, &mut count);
    kept.truncate(if st == KVE_OK { count as usize } else { 0 });
    (st, kept)
}

/// An evictor (host form, or the device form when `device`) from an arbitrary config,
/// then up to 12 arbitrary calls on it with views over the arena (device memory for the
/// device form); returns the last status. A compaction works on a copy of the arena.
pub unsafe fn evictor_calls(r: &mut R, a: &Arena, outs: &mut Vec<Out>, device: bool) -> i32 {
    let mut c: kve_evictor_config = std::mem::zeroed();
    let size = if r.chance(2) {
        KVE_EVICTOR_CONFIG_V1_SIZE
    } else {
        KVE_EVICTOR_CONFIG_V2_SIZE
    };
    if kve_evictor_config_init(&mut c, size, r.enum_val(kve_preset_count())) != KVE_OK {
        c.struct_size = size;
    }
    if size == KVE_EVICTOR_CONFIG_V2_SIZE {
        (c.paged, c.paged_dtype) = (r.u8() as u32 % 3, r.enum_val(5));
    }
    c.preset = r.enum_val(kve_preset_count());
    (c.layers, c.hq, c.hkv) = (r.size(4), r.size(8), r.size(4));
    (c.dk, c.dv, c.d_model) = (r.size(16), r.size(16), r.size(16));
    (c.max_cells, c.max_seqs) = (r.size(96), r.size(3));
    c.window = if r.chance(2) { 0 } else { r.u8() as u32 % 40 };
    c.granularity = if r.chance(2) {
        KVE_EVICTOR_PRESET_GRANULARITY
    } else {
        r.enum_val(3)
    };
    c.policy = r.enum_val(3);
    c.keep_ratio = [0.5, 0.0, 1.0, 1.5, f64::NAN][r.u8() as usize % 5];
    (c.min_keep, c.high, c.low) = (r.size(64), r.size(96), r.size(96));
    c.link_threshold = [0.0, 0.5, f32::NAN][r.u8() as usize % 3];
    let (sp, sl) = (score_params(r), select_params(r));
    let (sp, sl) = (padded(r, sp), padded(r, sl));
    if r.chance(6) {
        c.score = &sp.p;
    }
    if r.chance(6) {
        c.select = &sl.p;
    }
    let sane = r.chance(2);
    if sane {
        // a small valid model and budget (arbitrary ones are almost always refused at
        // init, and the calls after it are the point)
        c.preset = r.u8() as u32 % kve_preset_count();
        c.hkv = 1 + r.u8() as u64 % 2;
        c.hq = c.hkv * (1 + r.u8() as u64 % 2);
        (c.layers, c.dk) = (1 + r.u8() as u64 % 2, 4 << (r.u8() % 2));
        (c.dv, c.d_model) = (c.dk, 8);
        (c.max_cells, c.max_seqs) = (8 + r.u8() as u64 % 56, 1 + r.u8() as u64 % 2);
        c.window = r.u8() as u32 % 8;
        c.keep_ratio = 0.5;
        (c.min_keep, c.high, c.low) = (0, c.max_cells, c.max_cells / 2);
        c.link_threshold = 0.0;
        (c.policy, c.granularity) = (r.u8() as u32 % 3, KVE_EVICTOR_PRESET_GRANULARITY);
        (c.score, c.select) = (std::ptr::null(), std::ptr::null());
        (c.paged, c.paged_dtype) = (c.paged % 2, r.u8() as u32 % 3);
        if device && r.u8() < 192 {
            // what the device round takes: token granularity, and `paged` (a V2 config) for
            // its gather of the round's cells out of the engine's stream
            c.granularity = kvevict::Granularity::Token as u32;
            (c.struct_size, c.paged) = (KVE_EVICTOR_CONFIG_V2_SIZE, 1);
        }
    }
    let (mut bytes, mut dev_bytes) = (CANARY as u64, CANARY as u64);
    let st = if device {
        kve_cuda_evictor_size(&c, &mut bytes, &mut dev_bytes)
    } else {
        kve_evictor_size(&c, &mut bytes)
    };
    if !device {
        // the check without memory: the size's status, a message exactly on a refusal
        let mut msg = 7usize as *const c_char;
        let ck = kve_evictor_config_check(&c, std::ptr::null_mut(), 0, &mut msg);
        assert_eq!(ck, st, "config_check disagrees with evictor_size");
        assert_eq!(msg.is_null(), st == KVE_OK, "config_check message");
    }
    if st != KVE_OK || bytes > (16 << 20) || (device && dev_bytes > (16 << 20)) {
        assert!(
            st == KVE_OK || (bytes == CANARY as u64 && dev_bytes == CANARY as u64),
            "size written on error"
        );
        return st;
    }
    let short = (!sane && r.chance(16)) as u64;
    let mut mem = vec![0u64; bytes as usize / 8 + 1];
    let ev = if device {
        // the device block: 256-byte aligned (cudaMalloc's), registered as device memory
        let mut dmem = vec![0u64; dev_bytes as usize / 8 + 33];
        let dptr = (dmem.as_mut_ptr() as usize).next_multiple_of(256) as *mut c_void;
        let reg = Registered::new(dmem.as_ptr() as *const u8, dmem.len() * 8);
        let dshort = (!sane && r.chance(16)) as u64 * 256;
        let mut ev = std::ptr::null_mut();
        let st = kve_cuda_evictor_init(
            mem.as_mut_ptr() as *mut c_void,
            bytes - short,
            dptr,
            dev_bytes - dshort.min(dev_bytes),
            &c,
            &mut ev,
        );
        if st != KVE_OK {
            assert!(
                ev.is_null() && mem.iter().all(|&w| w == 0) && dmem.iter().all(|&w| w == 0),
                "init wrote on error"
            );
            return st;
        }
        Ev::Device(ev, mem, dmem, reg)
    } else {
        let mut ev = std::ptr::null_mut();
        let st = kve_evictor_init(mem.as_mut_ptr() as *mut c_void, bytes - short, &c, &mut ev);
        if st != KVE_OK {
            assert!(
                ev.is_null() && mem.iter().all(|&w| w == 0),
                "init wrote on error"
            );
            return st;
        }
        Ev::Host(ev)
    };
    let (l, hkv, n) = (c.layers, c.hkv, c.max_cells);
    let mut st = KVE_OK;
    let mut done = Vec::new();
    for nth in 0..1 + r.u8() % 12 {
        let seq = if r.chance(16) {
            r.size(8)
        } else {
            r.u8() as u64 % c.max_seqs
        };
        let layer = if r.chance(16) {
            r.size(8)
        } else {
            r.u8() as u64 % l
        };
        let cells = if !sane && r.chance(8) {
            r.size(128)
        } else {
            1 + r.u8() as u64 % n
        };
        let snap = ev.snapshot();
        let max = (l * hkv * n) as usize + 1;
        let mut own = vec![CANARY; max];
        let len = if r.chance(8) {
            r.u8() as usize % max
        } else {
            max
        } as u64;
        let ptr = if r.chance(40) {
            std::ptr::null_mut()
        } else {
            own.as_mut_ptr()
        };
        let _dev = Registered::new(own.as_ptr() as *const u8, own.len() * 4);
        let out = Out {
            _dev,
            own,
            ptr,
            len,
            in_arena: false,
        };
        let mut count = CANARY as u64;
        let tensor_of = |r: &mut R, e: [u64; 3]| {
            if sane && r.u8() < 224 {
                if let Some(t) = exact(r, a, e) {
                    return t;
                }
            }
            let mut t = tensor(r, a, [8, 96, 16]);
            fit(r, a, &mut t, e);
            t
        };
        // a K or V tensor of `d` dims in a pool over `base` (the arena or a copy), and a
        // sequence's table: mostly distinct entries of the pool, sometimes hostile
        let paged_of = |r: &mut R, base: *const u8, d: u64| {
            let dtype = r.enum_val(5); // q8_0/q4_0 pools: refused
            let es = if dtype == 0 { 4 } else { 2 };
            let off = (r.u8() as usize % 64) * 8;
            let len = (ARENA - off) as u64 / es;
            let (nb, bs) = (r.size(16), r.size(8));
            let h = if r.chance(8) { r.size(4) } else { hkv };
            let d = if r.chance(8) { r.size(16) } else { d };
            let (kind, kv) = (r.enum_val(6), r.u8() as u32 % 2);
            let stacked = matches!(kind, 1 | 2 | 4 | 5);
            let layers = if kind == 5 { 1 + r.u8() as u64 % 3 } else { 1 };
            let mut kl: kve_paged_layout = std::mem::zeroed();
            let data = base.add(off) as *const c_void;
            let kv = if stacked { kv } else { 0 };
            kve_paged_layout_init(&mut kl, kind, data, len, dtype, nb, bs, h, d, layers, 0, kv);
            kl.pad = r.chance(50) as u32;
            kl
        };
        let table_of = |r: &mut R, kl: &kve_paged_layout| -> Vec<u32> {
            let nb = kl.num_blocks.min(64) as u32;
            let bs = kl.block_size.max(1);
            let tl = (cells.min(1 << 12).div_ceil(bs) as usize + r.u8() as usize % 3)
                .saturating_sub(1)
                .min(64);
            let mut t: Vec<u32> = (0..nb.max(1)).collect();
            for i in (1..t.len()).rev() {
                t.swap(i, r.u8() as usize % (i + 1));
            }
            t.resize(tl, 0);
            for e in t.iter_mut() {
                if r.chance(16) {
                    *e = if r.chance(2) {
                        r.u32()
                    } else {
                        r.u8() as u32 % (nb + 1)
                    };
                }
            }
            t
        };
        let mut snap_ok = true;
        let call = r.u8() % 14;
        st = match call {
            0 => {
                let rows = 1 + r.u8() as u64 % 40;
                let q = tensor_of(r, [c.hq, rows, c.dk]);
                match &ev {
                    Ev::Host(e) => kve_evictor_observe_queries(*e, seq, layer, &q),
                    Ev::Device(e, ..) => kve_cuda_evictor_observe_queries(*e, seq, layer, &q, NULL),
                }
            }
            1 => match &ev {
                Ev::Host(e) => kve_evictor_plan(*e, seq, cells, &mut count),
                Ev::Device(e, ..) => kve_cuda_evictor_plan(*e, seq, cells, &mut count),
            },
            2 => match &ev {
                Ev::Host(e) => kve_evictor_begin(*e, seq, cells, r.size(128)),
                Ev::Device(e, ..) => kve_cuda_evictor_begin(*e, seq, cells, r.size(128)),
            },
            3 => {
                let mut v: kve_evictor_layer = std::mem::zeroed();
                kve_evictor_layer_init(&mut v, KVE_EVICTOR_LAYER_V1_SIZE);
                v.keys = tensor_of(r, [hkv, cells, c.dk]);
                v.values = tensor_of(r, [hkv, cells, c.dv]);
                let rows = 1 + r.u8() as u64 % 40;
                v.queries = tensor_of(r, [c.hq, rows, c.dk]);
                v.wo = tensor_of(r, [c.hq, c.dv, c.d_model]);
                v.reserved = (!sane && r.chance(32)) as u32;
                if sane && matches!(ev, Ev::Device(..)) {
                    v.wo = kve_tensor::NONE; // the device form takes Wo once, on the host
                }
                match &ev {
                    Ev::Host(e) => kve_evictor_score_layer(*e, seq, layer, &v),
                    Ev::Device(e, ..) => kve_cuda_evictor_score_layer(*e, seq, layer, &v, NULL),
                }
            }
            4 => match &ev {
                Ev::Host(e) => kve_evictor_select(*e, seq, &mut count),
                Ev::Device(e, ..) => kve_cuda_evictor_select(*e, seq, &mut count, NULL),
            },
            5..=7 if matches!(ev, Ev::Device(..)) => {
                // the device form's kept lists: pointers into its device block
                let Ev::Device(e, _, dmem, _) = &ev else {
                    unreachable!()
                };
                let (mut counts, mut idx, mut ld) =
                    (std::ptr::null(), std::ptr::null(), CANARY as u64);
                let s = kve_cuda_evictor_kept_lists(*e, seq, &mut counts, &mut idx, &mut ld);
                if s != KVE_OK {
                    assert!(
                        counts.is_null() && idx.is_null() && ld == CANARY as u64,
                        "kept lists written on error"
                    );
                } else {
                    let span = dmem.as_ptr() as usize..dmem.as_ptr() as usize + dmem.len() * 8;
                    let units = (l * hkv) as usize;
                    assert!(span.contains(&(counts as usize)) && span.contains(&(idx as usize)));
                    for u in 0..units {
                        let k = *counts.add(u);
                        assert!(k >= 0 && k as u64 <= n && k as u64 <= ld, "kept count {k}");
                        let list = std::slice::from_raw_parts(idx.add(u * ld as usize), k as usize);
                        assert!(
                            list.windows(2).all(|w| w[0] < w[1])
                                && list.iter().all(|&c| c >= 0 && (c as u64) < n),
                            "device kept list ascending, in range"
                        );
                    }
                }
                s
            }
            5 | 6 => {
                let &Ev::Host(ev) = &ev else { unreachable!() };
                let f = if r.chance(2) {
                    kve_evictor_kept_cells
                } else {
                    kve_evictor_evicted_cells
                };
                let s = f(ev, seq, out.ptr, out.len, &mut count);
                if s == KVE_OK && !out.in_arena {
                    let cells = &out.own[..count as usize];
                    assert!(cells.windows(2).all(|w| w[0] < w[1]), "cells ascending");
                }
                s
            }
            7 => {
                let &Ev::Host(ev) = &ev else { unreachable!() };
                let mut offsets = vec![CANARY as u64; (l * hkv + 1) as usize];
                let o_len = if r.chance(8) {
                    offsets.len() as u64 - 1
                } else {
                    offsets.len() as u64
                };
                let s =
                    kve_evictor_kept_lists(ev, seq, offsets.as_mut_ptr(), o_len, out.ptr, out.len);
                if s != KVE_OK {
                    assert!(
                        offsets.iter().all(|&x| x == CANARY as u64),
                        "offsets written on error"
                    );
                } else if !out.in_arena {
                    check_csr(
                        std::slice::from_raw_parts(
                            offsets.as_ptr() as *const u32,
                            offsets.len() * 2,
                        ),
                        offsets.len(),
                        &out.own,
                        (l * hkv) as usize,
                        n,
                    );
                }
                s
            }
            8 => {
                // the same view over a copy of the arena (compaction writes through it)
                let mut copy = a.buf.clone();
                let _dev = Registered::new(copy.as_ptr() as *const u8, copy.len() * 8);
                let mut t = tensor_of(r, [hkv, cells, c.dk]);
                if !t.data.is_null() {
                    let at = t.data as usize - a.base() as usize;
                    t.data = (copy.as_mut_ptr() as *const u8).add(at) as *const c_void;
                }
                match &ev {
                    Ev::Host(e) => kve_evictor_compact(*e, seq, layer, &t),
                    Ev::Device(e, ..) => kve_cuda_evictor_compact(*e, seq, layer, &t, NULL),
                }
            }
            9 => match &ev {
                Ev::Host(e) => kve_evictor_commit(*e, seq),
                Ev::Device(e, ..) => kve_cuda_evictor_commit(*e, seq),
            },
            // paged views: the host form only (the device form's size refuses `paged`)
            11 if !matches!(ev, Ev::Host(_)) => KVE_OK,
            12 if !matches!(ev, Ev::Host(_)) => KVE_OK,
            11 => {
                let &Ev::Host(e) = &ev else { unreachable!() };
                let mut pl: kve_evictor_paged_layer = std::mem::zeroed();
                kve_evictor_paged_layer_init(&mut pl, KVE_EVICTOR_PAGED_LAYER_V1_SIZE);
                pl.keys = paged_of(r, a.base(), c.dk);
                if r.chance(3) {
                    pl.values = paged_of(r, a.base(), c.dv);
                }
                let t = table_of(r, &pl.keys);
                pl.table = if t.is_empty() && r.chance(2) {
                    std::ptr::null()
                } else {
                    t.as_ptr()
                };
                pl.table_len = t.len() as u64;
                let rows = 1 + r.u8() as u64 % 40;
                pl.queries = tensor_of(r, [c.hq, rows, c.dk]);
                pl.reserved = r.chance(32) as u32;
                kve_evictor_score_layer_paged(e, seq, layer, &pl)
            }
            12 => {
                let &Ev::Host(e) = &ev else { unreachable!() };
                // compaction writes through the pool: a copy of the arena
                let mut copy = a.buf.clone();
                let kl = paged_of(r, copy.as_mut_ptr() as *const u8, c.dk);
                let t = table_of(r, &kl);
                let before = copy.clone();
                let mut freed = CANARY as u64;
                let s = kve_evictor_compact_paged(
                    e,
                    seq,
                    layer,
                    &kl,
                    t.as_ptr(),
                    t.len() as u64,
                    &mut freed,
                );
                if s != KVE_OK {
                    assert!(
                        copy == before && freed == CANARY as u64,
                        "paged compaction wrote on error (status {s})"
                    );
                }
                s
            }
            13 => {
                // a whole round over a cell stream: cells by index (mostly distinct, inside
                // the stream) or NULL (dense); K/V/queries per layer, sometimes the wrong count.
                // The device form: K/V over the arena (registered: device memory), queries and
                // the kept cells host memory as the library reads them (marks and per-head
                // granularity refused there, before the round begins)
                // (the harness's own buffers stay small: `cells` may be a hostile size)
                let cells = cells.min(512);
                let stream = cells + r.u8() as u64 % 8;
                let mut ids: Vec<u32> = (0..stream as u32).collect();
                for i in (1..ids.len()).rev() {
                    ids.swap(i, r.u8() as usize % (i + 1));
                }
                ids.truncate(cells as usize);
                ids.sort_unstable();
                if !sane && r.chance(8) && !ids.is_empty() {
                    let i = r.u8() as usize % ids.len();
                    ids[i] = if r.chance(2) { r.u32() } else { ids[0] };
                }
                let dense = r.chance(4);
                let per = |r: &mut R, d: u64| -> Vec<kve_tensor> {
                    let nl = if r.chance(16) { r.u8() as u64 % 4 } else { l };
                    let s = if dense { cells } else { stream };
                    (0..nl).map(|_| tensor_of(r, [hkv, s, d])).collect()
                };
                let (mut ks, mut vs) = (per(r, c.dk), per(r, c.dv));
                if sane && matches!(ev, Ev::Device(..)) && r.u8() < 224 {
                    // the device form scores K and V in the context's paged dtype: mostly given
                    // (only a tensor inside the arena whose f32 reading still fits there; a
                    // hostile one, NULL or outside it, stays as it is)
                    for t in ks.iter_mut().chain(vs.iter_mut()) {
                        let end = (t.data as usize)
                            .checked_sub(a.base() as usize)
                            .and_then(|o| (t.len as usize).checked_mul(4)?.checked_add(o));
                        if t.dtype < 3 && end.is_some_and(|e| e <= ARENA) {
                            t.dtype = c.paged_dtype;
                        }
                    }
                }
                let rows = 1 + r.u8() as u64 % 40;
                let qs: Vec<kve_tensor> = if r.u8() < if sane { 224 } else { 128 } {
                    (0..l).map(|_| tensor_of(r, [c.hq, rows, c.dk])).collect()
                } else {
                    Vec::new()
                };
                let marks: Vec<u8> = (0..cells).map(|_| r.u8() % 2).collect();
                let mut rd: kve_evictor_round = std::mem::zeroed();
                kve_evictor_round_init(&mut rd, KVE_EVICTOR_ROUND_V1_SIZE);
                rd.cells = if dense {
                    std::ptr::null()
                } else {
                    ids.as_ptr()
                };
                rd.n_cells = ids.len() as u64;
                (rd.keys, rd.n_keys) = (ks.as_ptr(), ks.len() as u64);
                // (values: what LAVa, LaProx and value links read)
                let with_values = |r: &mut R| r.u8() < if sane { 224 } else { 128 };
                if with_values(r) {
                    (rd.values, rd.n_values) = (vs.as_ptr(), vs.len() as u64);
                }
                (rd.queries, rd.n_queries) = (qs.as_ptr(), qs.len() as u64);
                if r.chance(4) {
                    (rd.marks, rd.n_marks) = (marks.as_ptr(), marks.len() as u64);
                }
                // a sane round's target is below its cells (0 or all of them: refused or nothing to do)
                rd.target = match sane && r.u8() < 224 {
                    true => 1 + r.u8() as u64 % (ids.len() as u64 - 1).max(1),
                    false => r.size(128),
                };
                rd.mark_share = if r.chance(16) { 2.0 } else { 0.5 };
                rd.reserved = (!sane && r.chance(32)) as u32;
                // or the layers through the fill callback (V2): the same tensors given one layer
                // at a time, sometimes a failure at some layer, sometimes arrays given as well or
                // a hostile layer count / wo
                let mut fd = FillData {
                    ks,
                    vs,
                    qs,
                    values: with_values(r),
                    fail_at: if r.chance(4) {
                        r.u8() as u64 % (l + 1)
                    } else {
                        u64::MAX
                    },
                    wo: !sane && r.chance(32),
                    calls: 0,
                    failed: false,
                };
                if r.chance(3) {
                    rd.struct_size = KVE_EVICTOR_ROUND_V2_SIZE;
                    if sane || !r.chance(16) {
                        (rd.keys, rd.n_keys, rd.values, rd.n_values) =
                            (std::ptr::null(), 0, std::ptr::null(), 0);
                        (rd.queries, rd.n_queries) = (std::ptr::null(), 0);
                    }
                    rd.fill = Some(fuzz_fill);
                    rd.fill_layers = if r.chance(16) { r.u8() as u64 % 4 } else { l };
                    rd.user = (&mut fd as *mut FillData).cast();
                }
                if r.chance(8) {
                    rd.mark_split = r.u8() as u32 % 3;
                }
                let s = match &ev {
                    Ev::Host(e) => {
                        kve_evictor_run_round(*e, seq, &rd, out.ptr, out.len, &mut count)
                    }
                    Ev::Device(e, ..) => {
                        kve_cuda_evictor_run_round(*e, seq, &rd, out.ptr, out.len, &mut count, NULL)
                    }
                };
                if trace() {
                    // KVEVICT_FUZZ_TRACE=1: which form ran a round and its status (how often a
                    // device round gets past its checks)
                    eprintln!(
                        "round device={} sane={sane} v2={} marks={} split={} status={s}",
                        matches!(ev, Ev::Device(..)),
                        rd.struct_size == KVE_EVICTOR_ROUND_V2_SIZE,
                        rd.n_marks != 0,
                        rd.mark_split
                    );
                }
                if let (Ev::Device(..), true, 0, KVE_OK) = (&ev, sane, nth, s) {
                    // the same round on a fresh host evictor of the same config (the device
                    // context was fresh too: its first call): it keeps as many cells (the host
                    // may refuse what the device takes: NaN/Inf in device buffers are not
                    // detected). The cells themselves are only traced: the two forms sum in
                    // another order, so a near tie may go either way
                    let (n_host, kept_host) = host_twin_round(&c, seq, &rd, &mut fd, max);
                    if trace() {
                        let same = n_host == KVE_OK
                            && !out.in_arena
                            && kept_host[..] == out.own[..kept_host.len().min(count as usize)];
                        eprintln!(
                            "twin host status={n_host} device count={count} dtype={} same={same}",
                            c.paged_dtype
                        );
                    }
                    if n_host == KVE_OK {
                        assert_eq!(
                            kept_host.len() as u64,
                            count,
                            "the device round kept another number of cells than the host round"
                        );
                    }
                }
                if matches!(ev, Ev::Device(..)) && (rd.n_marks != 0 || rd.mark_split != 0) {
                    assert_ne!(s, KVE_OK, "the device round took marks");
                }
                assert!(fd.calls <= l, "fill called past the context's layers");
                if fd.failed {
                    assert_eq!(
                        s, KVE_ERR_CALLBACK,
                        "a failing fill ends the round with KVE_ERR_CALLBACK"
                    );
                }
                if s == KVE_OK && !out.in_arena {
                    let kept = &out.own[..count as usize];
                    assert!(
                        kept.windows(2).all(|w| w[0] < w[1])
                            && kept.iter().all(|&k| (k as u64) < ids.len() as u64),
                        "round's kept cells ascending, in range"
                    );
                }
                if s != KVE_OK {
                    // a round that began may stay begun (docs/c-abi.md); outputs untouched
                    assert!(
                        out.untouched() && count == CANARY as u64,
                        "round output written on error"
                    );
                    snap_ok = false;
                }
                s
            }
            _ => {
                let mut stats: kve_evictor_stats = std::mem::zeroed();
                let size = if r.chance(8) {
                    24
                } else {
                    KVE_EVICTOR_STATS_V1_SIZE
                };
                match &ev {
                    Ev::Host(e) => kve_evictor_get_stats(*e, seq, &mut stats, size),
                    Ev::Device(e, ..) => kve_cuda_evictor_get_stats(*e, seq, &mut stats, size),
                }
            }
        };
        if st != KVE_OK && snap_ok {
            assert!(
                ev.snapshot() == snap,
                "the context changed on error (status {st})"
            );
            assert!(
                out.untouched() && count == CANARY as u64,
                "output written on error"
            );
        }
        if r.chance(4) {
            match &ev {
                Ev::Host(e) => kve_evictor_seq_reset(*e, seq),
                Ev::Device(e, ..) => kve_cuda_evictor_seq_reset(*e, seq),
            };
        }
        // an output a call wrote on success is not one the input's last call (which may
        // fail) must leave untouched: kept alive here, not checked at the end
        if st == KVE_OK {
            done.push(out);
        } else {
            outs.push(out);
        }
    }
    st
}
