//! Hostile `kve_tensor` descriptors of the block-quantized dtypes (`Q8`,
//! `Q4`): every layout that is not whole-block rows, a misaligned or short
//! buffer, is refused with its status and nothing written (scores, compaction); paged pools
//! and an evictor's paged dtype refuse the block types (`KVE_ERR_UNSUPPORTED_DTYPE`, with a
//! message); a valid quantized descriptor scores as its dequantized f32 tensor does.

use super::*;
use half::f16;

const DQ: usize = 64; // a row of two blocks
const Q8: u32 = kvevict::DType::Q8_0 as u32;
const Q4: u32 = kvevict::DType::Q4_0 as u32;

/// ggml blocks for `values` values (scale 1/64 .. 1/32, random quants), in 2-byte aligned
/// storage.
fn blocks(dt: u32, values: usize, seed: u64) -> Vec<u16> {
    let bb = if dt == Q8 { 34 } else { 18 };
    let mut s = seed | 1;
    let mut b = vec![0u8; values / 32 * bb];
    for blk in b.chunks_exact_mut(bb) {
        let d = f16::from_f32((1.0 + (rnd(&mut s) + 1.0) * 0.5) / 64.0);
        blk[..2].copy_from_slice(&d.to_bits().to_le_bytes());
        for q in &mut blk[2..] {
            *q = (rnd(&mut s) * 127.0) as i8 as u8;
        }
    }
    b.chunks_exact(2)
        .map(|c| u16::from_ne_bytes([c[0], c[1]]))
        .collect()
}

/// The values of ggml blocks (as ggml's dequantize_row_q8_0 / q4_0 compute them).
fn values(dt: u32, b: &[u16]) -> Vec<f32> {
    let bytes: Vec<u8> = b.iter().flat_map(|x| x.to_ne_bytes()).collect();
    let bb = if dt == Q8 { 34 } else { 18 };
    let mut out = Vec::new();
    for blk in bytes.chunks_exact(bb) {
        let d = f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
        if bb == 34 {
            out.extend(blk[2..].iter().map(|&q| q as i8 as f32 * d));
        } else {
            out.extend(blk[2..].iter().map(|&q| ((q & 15) as i32 - 8) as f32 * d));
            out.extend(blk[2..].iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
        }
    }
    out
}

/// A descriptor of `len` values of `dt` at `p` (a compaction writes through it: pass a
/// pointer from `as_mut_ptr` then).
fn qtensor(p: *const u16, dt: u32, len: usize, e: [usize; 3], s: [usize; 3]) -> kve_tensor {
    kve_tensor {
        dtype: dt,
        ..tensor(p as *const f32, len, e, s)
    }
}

/// A hostile case: what, the change to a valid descriptor, the status.
type Case = (&'static str, Box<dyn Fn(&mut kve_tensor)>, i32);

/// The cases for a valid `[HKV, N, DQ]` head-major quantized tensor of `len` values at `p`.
fn hostile(p: *const u16) -> Vec<Case> {
    let bad = KVE_ERR_INVALID_ARGUMENT;
    let odd = (p as *const u8).wrapping_add(1) as *const c_void;
    let transpose = |t: &mut kve_tensor| {
        t.extent = [HKV as u64, DQ as u64, N as u64];
        t.stride = [(N * DQ) as u64, 1, DQ as u64];
    };
    vec![
        ("len not whole blocks", Box::new(|t| t.len -= 1), bad),
        ("row of 48", Box::new(|t| t.extent[2] = 48), bad),
        ("value stride 2", Box::new(|t| t.stride[2] = 2), bad),
        ("token stride 80", Box::new(|t| t.stride[1] = 80), bad),
        ("head stride 8", Box::new(|t| t.stride[0] = 8), bad),
        ("transposed", Box::new(transpose), bad),
        (
            "past the buffer",
            Box::new(|t| t.len -= 32),
            KVE_ERR_OUT_OF_BOUNDS,
        ),
        (
            "odd address",
            Box::new(move |t| t.data = odd),
            KVE_ERR_MISALIGNED,
        ),
        ("dtype 5", Box::new(|t| t.dtype = 5), KVE_ERR_BAD_ENUM),
        ("pad", Box::new(|t| t.pad = 1), bad),
    ]
}

/// Scores of SnapKV (window 8) and KNorm from `keys` (and f32 queries, values), the status
/// and the output (canaries unless OK).
fn score(preset: u32, keys: kve_tensor, q: &[f32], v: &[f32]) -> (i32, Vec<f32>) {
    let mut sp = score_params(preset);
    sp.window = W as u32;
    let mut ws = 0u64;
    let st = unsafe {
        kve_score_workspace_size(
            &sp, HQ as u64, HKV as u64, N as u64, DQ as u64, DQ as u64, &mut ws,
        )
    };
    assert_eq!(st, KVE_OK);
    let mut ws = vec![0u8; ws as usize];
    let mut inp: kve_layer_inputs =
        init_struct(|i, size| unsafe { kve_layer_inputs_init(i, size) });
    inp.queries = contiguous(q, [HQ, W, DQ]);
    inp.keys = keys;
    inp.values = contiguous(v, [HKV, N, DQ]);
    let mut out = canary_f32(HKV * P);
    let st = unsafe {
        kve_score_layer(
            &sp,
            &inp,
            out.as_mut_ptr(),
            out.len() as u64,
            ws.as_mut_ptr() as *mut c_void,
            ws.len() as u64,
        )
    };
    if st != KVE_OK {
        assert!(
            untouched_f32(&out),
            "status {} but the output was written",
            name(st)
        );
    }
    (st, out)
}

#[test]
fn quantized_keys_score_as_their_values_and_hostile_layouts_are_refused() {
    let q = data(HQ * W * DQ, 5);
    let v = data(HKV * N * DQ, 6);
    for dt in [Q8, Q4] {
        let len = HKV * N * DQ;
        let b = blocks(dt, len, 7);
        let f = values(dt, &b);
        let good = qtensor(b.as_ptr(), dt, len, [HKV, N, DQ], [N * DQ, DQ, 1]);
        for preset in [
            kvevict::Preset::SnapKv as u32,
            kvevict::Preset::KNorm as u32,
        ] {
            let (st, got) = score(preset, good, &q, &v);
            expect!(st, KVE_OK);
            let (st, want) = score(preset, contiguous(&f, [HKV, N, DQ]), &q, &v);
            expect!(st, KVE_OK);
            let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "dtype {dt} preset {preset}");
            for (what, change, want) in hostile(b.as_ptr()) {
                let mut t = good;
                change(&mut t);
                let (st, _) = score(preset, t, &q, &v);
                assert_eq!(name(st), name(want), "dtype {dt}: {what}");
            }
        }
    }
}

#[test]
fn quantized_compaction_refuses_hostile_layouts_with_nothing_moved() {
    for dt in [Q8, Q4] {
        let len = HKV * N * DQ;
        let orig = blocks(dt, len, 9);
        let offsets = [0u64, 3, 5];
        let indices = [1u32, 4, 7, 0, 39];
        let compact = |t: &kve_tensor, lengths: &mut [u32; HKV]| unsafe {
            let (o, i) = (offsets.as_ptr(), indices.as_ptr());
            kve_compact_in_place(t, o, 3, i, 5, lengths.as_mut_ptr(), 2)
        };
        for case in 0..hostile(null()).len() {
            let mut b = orig.clone();
            let (what, change, want) = hostile(b.as_ptr()).swap_remove(case);
            let mut t = qtensor(b.as_mut_ptr(), dt, len, [HKV, N, DQ], [N * DQ, DQ, 1]);
            change(&mut t);
            let mut lengths = [CANARY; HKV];
            assert_eq!(
                name(compact(&t, &mut lengths)),
                name(want),
                "dtype {dt}: {what}"
            );
            assert!(
                b == orig && lengths == [CANARY; HKV],
                "dtype {dt}: {what}: written"
            );
        }
        let mut b = orig.clone();
        // the valid descriptor moves whole rows: row r of head h is row indices[..] of it
        let t = qtensor(b.as_mut_ptr(), dt, len, [HKV, N, DQ], [N * DQ, DQ, 1]);
        let mut lengths = [0u32; HKV];
        let st = compact(&t, &mut lengths);
        expect!(st, KVE_OK);
        assert_eq!(lengths, [3, 2]);
        let row_u16 = DQ / 32 * if dt == Q8 { 17 } else { 9 };
        let row = |v: &[u16], h: usize, t: usize| v[(h * N + t) * row_u16..][..row_u16].to_vec();
        for (h, list) in [(0, &indices[..3]), (1, &indices[3..])] {
            for (r, &t) in list.iter().enumerate() {
                assert_eq!(
                    row(&b, h, r),
                    row(&orig, h, t as usize),
                    "dtype {dt} head {h} row {r}"
                );
            }
        }
        // varlen into a destination of another dtype: refused, nothing written
        let other = if dt == Q8 { Q4 } else { Q8 };
        let dst0 = blocks(other, 8 * DQ, 3);
        let dst = dst0.clone();
        let dt_dst = qtensor(dst.as_ptr(), other, 8 * DQ, [1, 8, DQ], [8 * DQ, DQ, 1]);
        let mut cu = [-1i32; HKV + 1];
        let st = unsafe {
            kve_compact_varlen(
                &t,
                offsets.as_ptr(),
                3,
                indices.as_ptr(),
                5,
                &dt_dst,
                cu.as_mut_ptr(),
                3,
            )
        };
        expect!(st, KVE_ERR_SHAPE_MISMATCH);
        assert!(dst == dst0 && cu == [-1; HKV + 1]);
    }
}

#[test]
fn paged_pools_of_block_types_are_unsupported() {
    let pool = vec![0u16; 4096];
    for dt in [Q8, Q4] {
        let mut out = std::mem::MaybeUninit::<kve_paged_layout>::uninit();
        let st = unsafe {
            kve_paged_layout_init(
                out.as_mut_ptr(),
                kvevict::PagedKind::Nhd as u32,
                pool.as_ptr() as *const c_void,
                4096,
                dt,
                2,
                16,
                2,
                64,
                1,
                0,
                0,
            )
        };
        expect!(st, KVE_ERR_UNSUPPORTED_DTYPE);
        // an f32 pool's layout with the dtype changed afterwards
        let mut l = paged_f32_layout(
            kvevict::PagedKind::Nhd,
            pool.as_ptr() as _,
            4096,
            [2, 16, 2, 64],
            0,
        );
        l.dtype = dt;
        let mut bytes = CANARY as u64;
        let st = unsafe { kve_paged_gather_size(&l, 16, &mut bytes) };
        expect!(st, KVE_ERR_UNSUPPORTED_DTYPE);
        assert_eq!(bytes, CANARY as u64);
        // an evictor for paged pools of a block type: refused, with a message
        let mut cfg: kve_evictor_config = init_struct(|c, size| unsafe {
            kve_evictor_config_init(c, size, kvevict::Preset::SnapKv as u32)
        });
        (cfg.layers, cfg.hq, cfg.hkv, cfg.dk, cfg.dv, cfg.max_cells) = (1, 4, 2, 64, 64, 128);
        (cfg.paged, cfg.paged_dtype) = (1, dt);
        let mut bytes = CANARY as u64;
        expect!(
            unsafe { kve_evictor_size(&cfg, &mut bytes) },
            KVE_ERR_UNSUPPORTED_DTYPE
        );
        assert_eq!(bytes, CANARY as u64);
        let mut msg: *const std::ffi::c_char = null();
        let st = unsafe { kve_evictor_config_check(&cfg, null_mut(), 0, &mut msg) };
        expect!(st, KVE_ERR_UNSUPPORTED_DTYPE);
        let msg = unsafe { CStr::from_ptr(msg) }.to_str().unwrap();
        assert!(msg.contains("Q8_0/Q4_0"), "{msg}");
    }
}
