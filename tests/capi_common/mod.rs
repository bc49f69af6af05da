//! Helpers of the C-ABI tests (`capi_hostile`, `capi_contract.rs`, `capi_evictor.rs`,
//! `capi_cuda`): a small valid layer, parameter structs from the init functions, canaries,
//! status names and a paged pool's layout.
#![allow(dead_code)]

use kvevict::capi::*;
use std::ffi::{c_void, CStr};

pub const CANARY: u32 = 0xA5A5_A5A5;
pub const HQ: usize = 4;
pub const HKV: usize = 2;
pub const N: usize = 40;
pub const D: usize = 8;
pub const W: usize = 8;
pub const P: usize = N - W;
/// C values of `KVE_PRESET_*`, `KVE_ALLOCATOR_*` and `KVE_GRANULARITY_*` (include/kvevict.h).
pub const PRESET_LAPROX: u32 = 3;
pub const PRESET_CRITICALKV: u32 = 5;
pub const UNIFORM: u32 = 0;
pub const GLOBAL: u32 = 4;
pub const HEAD: u32 = 0;
pub const LAYER: u32 = 1;

pub fn rnd(seed: &mut u64) -> f32 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    ((*seed >> 40) & 0xFFFF) as f32 / 32768.0 - 1.0
}

pub fn data(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..len).map(|_| rnd(&mut s)).collect()
}

pub fn canary_f32(len: usize) -> Vec<f32> {
    vec![f32::from_bits(CANARY); len]
}

pub fn untouched_f32(v: &[f32]) -> bool {
    v.iter().all(|x| x.to_bits() == CANARY)
}

pub fn tensor(p: *const f32, len: usize, extent: [usize; 3], stride: [usize; 3]) -> kve_tensor {
    kve_tensor {
        data: p as *const c_void,
        len: len as u64,
        dtype: 0,
        pad: 0,
        extent: extent.map(|x| x as u64),
        stride: stride.map(|x| x as u64),
    }
}

pub fn contiguous(v: &[f32], e: [usize; 3]) -> kve_tensor {
    tensor(v.as_ptr(), v.len(), e, [e[1] * e[2], e[2], 1])
}

/// A struct from its `*_init` entry point, called as `init(ptr, sizeof)`; it must succeed.
pub fn init_struct<T>(init: impl FnOnce(*mut T, u32) -> i32) -> T {
    let mut p = std::mem::MaybeUninit::<T>::uninit();
    assert_eq!(
        init(p.as_mut_ptr(), std::mem::size_of::<T>() as u32),
        KVE_OK
    );
    // SAFETY: the init entry point succeeded: it wrote the whole struct.
    unsafe { p.assume_init() }
}

/// A workspace of the bytes a `*_workspace_size` entry point reports (`size(&mut bytes)`, which
/// must succeed).
pub fn workspace(size: impl FnOnce(&mut u64) -> i32) -> Vec<u8> {
    let mut bytes = 0u64;
    assert_eq!(size(&mut bytes), KVE_OK);
    vec![0u8; bytes as usize]
}

/// `call(out, out_len, workspace, workspace_bytes)` over `out` and `ws`: the output and
/// workspace arguments that end most entry points' lists. Its status.
pub fn into_out<T>(
    out: &mut [T],
    ws: &mut [u8],
    call: impl FnOnce(*mut T, u64, *mut c_void, u64) -> i32,
) -> i32 {
    call(
        out.as_mut_ptr(),
        out.len() as u64,
        ws.as_mut_ptr().cast(),
        ws.len() as u64,
    )
}

/// `kve_window_row_lse` of `queries` `[Hq][wq][d]` over `keys` `[Hkv][n][d]`, its workspace
/// sized by `kve_window_row_lse_workspace_size` (both must succeed): `[Hq][min(window, n)]`.
pub fn window_row_lse(queries: &kve_tensor, keys: &kve_tensor, window: u32) -> Vec<f32> {
    let ([hq, _, d], [hkv, n, _]) = (queries.extent, keys.extent);
    // SAFETY: an out-parameter, then the caller's tensors and buffers of the sizes passed.
    unsafe {
        let mut ws =
            workspace(|bytes| kve_window_row_lse_workspace_size(hq, hkv, n, d, window, bytes));
        let mut lse = vec![0f32; (hq * n.min(window as u64)) as usize];
        let st = into_out(&mut lse, &mut ws, |o, len, w, bytes| {
            kve_window_row_lse(queries, keys, window, o, len, w, bytes)
        });
        assert_eq!(st, KVE_OK);
        lse
    }
}

pub fn score_params(preset: u32) -> kve_score_params {
    // SAFETY: a writable struct of the size passed.
    let mut p = init_struct(|p, size| unsafe { kve_score_params_init(p, size, preset) });
    p.window = W as u32;
    p
}

pub fn select_params(alloc: u32, gran: u32, budget: u64) -> kve_select_params {
    // SAFETY: a writable struct of the size passed.
    init_struct(|p, size| unsafe { kve_select_params_init(p, size, alloc, gran, budget) })
}

/// A valid SnapKV layer: queries, keys, values and buffers.
pub struct Layer {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub out: Vec<f32>,
    pub ws: Vec<u8>,
}

impl Layer {
    pub fn new() -> Layer {
        let sp = score_params(0);
        let mut ws = 0u64;
        let st = unsafe {
            kve_score_workspace_size(
                &sp, HQ as u64, HKV as u64, N as u64, D as u64, D as u64, &mut ws,
            )
        };
        assert_eq!(st, KVE_OK);
        Layer {
            q: data(HQ * W * D, 1),
            k: data(HKV * N * D, 2),
            v: data(HKV * N * D, 3),
            out: canary_f32(HKV * P),
            ws: vec![0; ws as usize],
        }
    }
    pub fn inputs(&self) -> kve_layer_inputs {
        // SAFETY: a writable struct of the size passed.
        let mut i: kve_layer_inputs =
            init_struct(|i, size| unsafe { kve_layer_inputs_init(i, size) });
        i.queries = contiguous(&self.q, [HQ, W, D]);
        i.keys = contiguous(&self.k, [HKV, N, D]);
        i.values = contiguous(&self.v, [HKV, N, D]);
        i
    }
    /// Score with `sp` and `inp`, return the status; the output must be untouched unless OK.
    pub fn score(&mut self, sp: &kve_score_params, inp: &kve_layer_inputs) -> i32 {
        self.out.fill(f32::from_bits(CANARY));
        let st = unsafe {
            kve_score_layer(
                sp,
                inp,
                self.out.as_mut_ptr(),
                self.out.len() as u64,
                self.ws.as_mut_ptr() as *mut c_void,
                self.ws.len() as u64,
            )
        };
        if st != KVE_OK {
            assert!(
                untouched_f32(&self.out),
                "status {st} but the output was written"
            );
        }
        st
    }
    /// The hostile-input cases of one parameter struct: each case is one change (`edit`) to
    /// this layer's valid inputs and the status `sp` must give on them (through [`score`],
    /// so the output is checked untouched on every refusal).
    ///
    /// [`score`]: Layer::score
    pub fn check_edits(
        &mut self,
        sp: &kve_score_params,
        cases: &[(fn(&mut kve_layer_inputs), i32)],
    ) {
        for (k, &(edit, want)) in cases.iter().enumerate() {
            let mut inp = self.inputs();
            edit(&mut inp);
            assert_eq!(name(self.score(sp, &inp)), name(want), "case {k}");
        }
    }
}

pub fn name(st: i32) -> String {
    unsafe { CStr::from_ptr(kve_status_name(st)) }
        .to_string_lossy()
        .into_owned()
}

/// `$st` is the status `$want` (compared by name, so a failure says which).
#[allow(unused_macros)] // not every including test uses it
macro_rules! expect {
    ($st:expr, $want:expr) => {{
        let st = $st;
        assert_eq!(name(st), name($want), "{}", stringify!($st));
    }};
}

/// `kve_select_shard` of `shard` (its layers from `first`) under `search` into `off`, `idx`
/// and the workspace `(pointer, bytes)`: the status.
///
/// # Safety
/// The workspace is writable for its bytes, or what the call must refuse.
pub unsafe fn select_shard(
    sel: &kve_select_params,
    (shard, first): (&kve_model_scores, usize),
    search: &kve_search,
    off: &mut [u64],
    idx: &mut [u32],
    (wp, wl): (*mut c_void, u64),
) -> i32 {
    let (ol, il) = (off.len() as u64, idx.len() as u64);
    // SAFETY: the outputs as they are, the workspace the caller's.
    unsafe {
        let (o, i) = (off.as_mut_ptr(), idx.as_mut_ptr());
        kve_select_shard(sel, shard, first as u64, search, o, ol, i, il, wp, wl)
    }
}

pub fn select(
    sel: &kve_select_params,
    scores: &[f32],
    layers: usize,
    n: usize,
    w: usize,
) -> (i32, Vec<u64>, Vec<u32>) {
    select_linked(sel, scores, layers, n, w, None)
}

/// [`select`] through `kve_select_model_linked` when `links` = (pointer, length, threshold)
/// is given; outputs untouched on error.
pub fn select_linked(
    sel: &kve_select_params,
    scores: &[f32],
    layers: usize,
    n: usize,
    w: usize,
    links: Option<(*const f32, u64, f32)>,
) -> (i32, Vec<u64>, Vec<u32>) {
    let (mut ol, mut il, mut wl) = (0u64, 0u64, 0u64);
    unsafe {
        assert_eq!(
            kve_select_output_len(
                sel,
                layers as u64,
                HKV as u64,
                n as u64,
                w as u64,
                &mut ol,
                &mut il
            ),
            KVE_OK
        );
        assert_eq!(
            kve_select_workspace_size(sel, layers as u64, HKV as u64, n as u64, w as u64, &mut wl),
            KVE_OK
        );
    }
    let mut off = vec![CANARY as u64; ol as usize];
    let mut idx = vec![CANARY; il as usize];
    let mut ws = vec![0u8; wl as usize];
    let ms = kve_model_scores::of(&scores, layers as u64, HKV as u64, n as u64, w as u64);
    let (o, i, wsp) = (off.as_mut_ptr(), idx.as_mut_ptr(), ws.as_mut_ptr() as _);
    let st = unsafe {
        match links {
            None => kve_select_model(sel, &ms, o, ol, i, il, wsp, wl),
            Some((l, len, thr)) => {
                kve_select_model_linked(sel, &ms, l, len, thr, o, ol, i, il, wsp, wl)
            }
        }
    };
    if st != KVE_OK {
        assert!(off.iter().all(|&x| x == CANARY as u64) && idx.iter().all(|&x| x == CANARY));
    }
    (st, off, idx)
}

/// The layout of a one-layer f32 pool of K and V of `kind` (a `kvevict::PagedKind`) of `len`
/// floats at `data` (host or device memory, not dereferenced): K (`kv = 0`) or V (1).
pub fn paged_f32_layout(
    kind: kvevict::PagedKind,
    data: *const c_void,
    len: usize,
    [nb, bs, hkv, d]: [usize; 4],
    kv: u32,
) -> kve_paged_layout {
    let mut out = std::mem::MaybeUninit::<kve_paged_layout>::uninit();
    // SAFETY: a writable struct; the pool's pointer and length (not dereferenced).
    let st = unsafe {
        kve_paged_layout_init(
            out.as_mut_ptr(),
            kind as u32,
            data,
            len as u64,
            kvevict::DType::F32 as u32,
            nb as u64,
            bs as u64,
            hkv as u64,
            d as u64,
            1,
            0,
            kv,
        )
    };
    assert_eq!(st, KVE_OK);
    // SAFETY: initialised by the call above.
    unsafe { out.assume_init() }
}

/// `kve_gram_len` of `hq` query heads over `hkv` KV heads, values of `dv`, `cross` 0 or 1
/// (it must succeed).
pub fn gram_len(hq: usize, hkv: usize, dv: usize, cross: u32) -> u64 {
    let mut len = 0u64;
    // SAFETY: a host out-parameter.
    let st = unsafe { kve_gram_len(hq as u64, hkv as u64, dv as u64, cross, &mut len) };
    assert_eq!(st, KVE_OK);
    len
}
