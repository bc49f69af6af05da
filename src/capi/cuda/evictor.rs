//! The evictor's device form for C (`src/evictor/device.rs`): `kve_cuda_evictor_*`, the
//! host evictor's calls one for one with a `stream` last where something is enqueued;
//! the same `kve_evictor_config`, `kve_evictor_layer` (device tensors), requirements and
//! stats structs. Converts and checks, as the rest of the C layer. Without feature
//! `cuda` every entry point answers `KVE_ERR_NOT_BUILT_WITH_CUDA`.

use super::super::evictor::kve_evictor_stats;
use super::super::evictor::{
    kve_evictor_config, kve_evictor_layer, kve_evictor_paged_layer, kve_evictor_requirements,
};
use super::super::kve_tensor;
use super::super::paged::kve_paged_layout;
use super::super::round::kve_evictor_round;
use core::ffi::c_void;

#[cfg(feature = "cuda")]
use {
    super::super::evictor::{
        evictor_config, write_requirements, write_stats, KVE_EVICTOR_LAYER_V1_SIZE,
        KVE_EVICTOR_PAGED_LAYER_V1_SIZE, NO_LAYER, NO_PAGED_LAYER,
    },
    super::super::paged::PagedPool,
    super::super::params::read_ext,
    super::super::round::RoundArgs,
    super::super::{
        check_alias, out_param, span_ptr, span_sized, to_status, to_usize, tri, Buf, Span,
    },
    super::super::{Tensor as HostTensor, KVE_ERR_INVALID_ARGUMENT, KVE_OK},
    super::imp::tensor,
    crate::device::{self, Floats},
    crate::error::{Error, Result},
    crate::evictor::device::{DeviceEvictor, DeviceLayerViews, DevicePagedLayerViews, DevicePool},
};

/// An evictor's device form: a pointer into the host memory given to
/// `kve_cuda_evictor_init` (its tensors live in the device block given there).
pub struct kve_cuda_evictor {
    _opaque: [u8; 0],
}

/// The evictor at `ev` and its two spans (context, device block).
#[cfg(feature = "cuda")]
unsafe fn attach<'a>(ev: *const kve_cuda_evictor) -> Result<(DeviceEvictor<'a>, Span, Span)> {
    // SAFETY: NULL or a context kve_cuda_evictor_init returned (the caller's contract);
    // from_block checks NULL, alignment and the magic.
    let e = unsafe { DeviceEvictor::from_block(ev as *mut u8)? };
    let (h, d) = e.spans();
    Ok((e, h, d))
}

/// `f` (commit, reset, unprotect: a sequence and nothing more) on sequence `seq` of the
/// context, its status.
///
/// # Safety
/// `ev` as [`attach`]'s.
#[cfg(feature = "cuda")]
unsafe fn on_seq<'a>(
    ev: *const kve_cuda_evictor,
    seq: u64,
    f: fn(&mut DeviceEvictor<'a>, usize) -> Result<()>,
) -> i32 {
    // SAFETY: the caller's context; attach checks it.
    let (mut e, _, _) = tri!(unsafe { attach(ev) });
    to_status(f(&mut e, tri!(to_usize(seq))))
}

/// Host bytes of the context (`*host_bytes`, any alignment, 64 bytes of slack included)
/// and device bytes of the block (`*device_bytes`, 256-byte aligned) for `config`. Methods
/// that read `Wo` every round (CriticalKV) are not on the device:
/// `KVE_ERR_INVALID_ARGUMENT`. Writes only the two sizes.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_size(
    config: *const kve_evictor_config,
    host_bytes: *mut u64,
    device_bytes: *mut u64,
) -> i32 {
    cuda_only!({
        let mut h = tri!(out_param(host_bytes));
        let mut d = tri!(out_param(device_bytes));
        // SAFETY: NULL or the caller's config; evictor_config checks it.
        let (cfg, spans) = tri!(unsafe { evictor_config(config) });
        tri!(check_alias(&[h.span, d.span], &spans));
        let s = tri!(DeviceEvictor::memory_size(&cfg));
        // SAFETY: out_param checked both; one element each.
        unsafe {
            h.slice_mut()[0] = s.host as u64;
            d.slice_mut()[0] = s.device as u64;
        }
        KVE_OK
    })
}

/// Start an evictor's device form: its context in `memory` (host, `bytes` from
/// `kve_cuda_evictor_size`), its tensors in `device_memory` (`device_bytes`, 256-byte
/// aligned, e.g. from cudaMalloc; not touched here), and set `*evictor`. No teardown:
/// the caller frees both. Writes `memory` and `*evictor` only on success.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_init(
    memory: *mut c_void,
    bytes: u64,
    device_memory: *mut c_void,
    device_bytes: u64,
    config: *const kve_evictor_config,
    evictor: *mut *mut kve_cuda_evictor,
) -> i32 {
    cuda_only!({
        let mut out = tri!(out_param(evictor));
        let mut mem = tri!(Buf::new(memory as *const u8, bytes));
        // SAFETY: NULL or the caller's config; evictor_config checks it.
        let (cfg, spans) = tri!(unsafe { evictor_config(config) });
        tri!(check_alias(&[out.span, mem.span], &spans));
        // SAFETY: Buf::new checked the host memory, unaliased; the device block is the
        // caller's (the contract), checked for NULL, alignment, size and overlap.
        let mut ev = tri!(unsafe {
            DeviceEvictor::init(mem.slice_mut(), device_memory, device_bytes, &cfg)
        });
        // SAFETY: out_param checked it; one element.
        unsafe { out.slice_mut()[0] = ev.as_ptr() as *mut kve_cuda_evictor };
        KVE_OK
    })
}

/// As `kve_evictor_get_requirements`.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_get_requirements(
    evictor: *const kve_cuda_evictor,
    out: *mut kve_evictor_requirements,
    struct_size: u32,
) -> i32 {
    cuda_only!({
        // SAFETY: the caller's context; attach checks it.
        let (ev, ctx, _) = tri!(unsafe { attach(evictor) });
        tri!(check_alias(&[span_sized(out, struct_size)], &[ctx]));
        // SAFETY: NULL or `struct_size` writable bytes (the caller's contract).
        unsafe { write_requirements(ev.needs(), out, struct_size) }
    })
}

/// Set `layer`'s output projection `wo` (`[Hq, dv, D]`, HOST memory) for a method with
/// `KVE_WO_ONCE`: its Gram blocks are computed on the host and uploaded to the device
/// block on `stream`, which is synchronised (a setup call, not capturable).
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_set_output_projection(
    evictor: *mut kve_cuda_evictor,
    layer: u64,
    wo: *const kve_tensor,
    stream: *mut c_void,
) -> i32 {
    cuda_only!({
        // SAFETY: the caller's context; attach checks it.
        let (mut ev, ctx, _) = tri!(unsafe { attach(evictor) });
        // SAFETY: NULL or the caller's descriptor; from_ptr checks it.
        let t = tri!(unsafe { HostTensor::from_ptr(wo) });
        tri!(check_alias(&[ctx], &[t.span, span_ptr(wo)]));
        // SAFETY: checked by Tensor::new; host memory the context does not overlap.
        let view = tri!(unsafe { t.view() });
        // SAFETY: the caller's stream.
        to_status(unsafe { ev.set_output_projection(tri!(to_usize(layer)), &view, stream) })
    })
}

/// As `kve_evictor_observe_queries`, `queries` in DEVICE memory, enqueued on `stream`
/// (the last `window` rows go to the sequence's ring in the device block, in the
/// queries' dtype: every observation of a (sequence, layer) takes one dtype).
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_observe_queries(
    evictor: *mut kve_cuda_evictor,
    seq: u64,
    layer: u64,
    queries: *const kve_tensor,
    stream: *mut c_void,
) -> i32 {
    cuda_only!({
        // SAFETY: the caller's context; attach checks it.
        let (mut ev, ctx, _) = tri!(unsafe { attach(evictor) });
        tri!(check_alias(&[ctx], &[span_ptr(queries)]));
        // SAFETY: a host descriptor (NULL and alignment checked by arg).
        let q = tri!(tensor(tri!(unsafe { super::super::arg(queries) })));
        let (s, l) = (tri!(to_usize(seq)), tri!(to_usize(layer)));
        // SAFETY: device memory by this function's contract; the caller's stream.
        to_status(unsafe { ev.observe_queries(s, l, &q, stream) })
    })
}

/// As `kve_evictor_plan` (host only).
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_plan(
    evictor: *mut kve_cuda_evictor,
    seq: u64,
    n_cells: u64,
    target: *mut u64,
) -> i32 {
    cuda_only!({
        let mut o = tri!(out_param(target));
        // SAFETY: the caller's context; attach checks it.
        let (mut ev, ctx, _) = tri!(unsafe { attach(evictor) });
        tri!(check_alias(&[o.span, ctx], &[]));
        let t = tri!(ev.plan(tri!(to_usize(seq)), tri!(to_usize(n_cells))));
        // SAFETY: out_param checked it; one element.
        unsafe { o.slice_mut()[0] = t as u64 };
        KVE_OK
    })
}

/// As `kve_evictor_begin` (host bookkeeping: nothing enqueued).
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_begin(
    evictor: *mut kve_cuda_evictor,
    seq: u64,
    n_cells: u64,
    target: u64,
) -> i32 {
    cuda_only!({
        // SAFETY: the caller's context; attach checks it.
        let (mut ev, _, _) = tri!(unsafe { attach(evictor) });
        let (s, n, t) = (
            tri!(to_usize(seq)),
            tri!(to_usize(n_cells)),
            tri!(to_usize(target)),
        );
        to_status(ev.begin(s, n, t))
    })
}

/// As `kve_evictor_score_layer`, on `stream`: `views` (host struct, from
/// `kve_evictor_layer_init`) holds DEVICE tensors; its `wo` must be absent and its
/// `row_lse` is device floats. Checked on the host before anything is enqueued.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_score_layer(
    evictor: *mut kve_cuda_evictor,
    seq: u64,
    layer: u64,
    views: *const kve_evictor_layer,
    stream: *mut c_void,
) -> i32 {
    cuda_only!({
        // SAFETY: the caller's context; attach checks it.
        let (mut ev, ctx, _) = tri!(unsafe { attach(evictor) });
        // SAFETY: NULL or the caller's struct; read_ext checks NULL, alignment, struct_size.
        let l = tri!(unsafe { read_ext(views, KVE_EVICTOR_LAYER_V1_SIZE, NO_LAYER) });
        if l.reserved != 0 || !l.wo.data.is_null() {
            return KVE_ERR_INVALID_ARGUMENT;
        }
        tri!(check_alias(&[ctx], &[span_sized(views, l.struct_size)]));
        let opt = |t: &kve_tensor| match t.data.is_null() {
            true => Ok(None),
            false => tensor(t).map(Some),
        };
        let v = DeviceLayerViews {
            keys: tri!(tensor(&l.keys)),
            values: tri!(opt(&l.values)),
            queries: tri!(opt(&l.queries)),
            row_lse: Floats {
                ptr: l.row_lse,
                len: l.row_lse_len,
            },
        };
        let (s, ly) = (tri!(to_usize(seq)), tri!(to_usize(layer)));
        // SAFETY: device tensors by this function's contract; the caller's stream.
        to_status(unsafe { ev.score_layer(s, ly, &v, stream) })
    })
}

/// A `kve_paged_layout` whose `data` is DEVICE memory, checked as the host's pools.
#[cfg(feature = "cuda")]
unsafe fn device_pool(p: *const kve_paged_layout) -> Result<DevicePool> {
    // SAFETY: NULL or the caller's layout; from_ptr checks it (no access through `data`).
    let (ptr, len, layout) = unsafe { PagedPool::from_ptr(p)? }.parts();
    Ok(DevicePool {
        data: ptr as *mut c_void,
        len,
        layout,
    })
}

/// As `kve_evictor_score_layer_paged`, on `stream`, for a context configured with
/// `paged = 1`: `views` (host struct, from `kve_evictor_paged_layer_init`) holds pools
/// in DEVICE memory (`keys.data`, `values.data`), the block table in HOST memory, and as
/// `kve_cuda_evictor_score_layer` a device `queries` tensor (or none: the ring), device
/// `row_lse` floats and no `wo`. The table is checked on the host with the host form's
/// check (the same statuses: `KVE_ERR_SHAPE_MISMATCH` short, `KVE_ERR_OUT_OF_BOUNDS` an
/// entry past the pool, `KVE_ERR_ALIASING` a repeat; nothing enqueued on error), then its
/// used entries are copied to the device block on `stream` (keep them unchanged until the
/// stream passes the call; from pageable memory the copy is not graph-capturable), K (and
/// V) gathered there and scored: kept lists bit-identical to the contiguous call's.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_score_layer_paged(
    evictor: *mut kve_cuda_evictor,
    seq: u64,
    layer: u64,
    views: *const kve_evictor_paged_layer,
    stream: *mut c_void,
) -> i32 {
    cuda_only!({
        // SAFETY: the caller's context; attach checks it.
        let (mut ev, ctx, _) = tri!(unsafe { attach(evictor) });
        // SAFETY: NULL or the caller's struct; read_ext checks NULL, alignment, struct_size.
        let l = tri!(unsafe { read_ext(views, KVE_EVICTOR_PAGED_LAYER_V1_SIZE, NO_PAGED_LAYER) });
        if l.reserved != 0 || !l.wo.data.is_null() {
            return KVE_ERR_INVALID_ARGUMENT;
        }
        // SAFETY: a struct on the stack, read from the caller's.
        let k = tri!(unsafe { device_pool(&l.keys) });
        let v = match l.values.data.is_null() {
            true => None,
            // SAFETY: as above.
            false => Some(tri!(unsafe { device_pool(&l.values) })),
        };
        let t = tri!(Buf::new(l.table, l.table_len));
        tri!(check_alias(
            &[ctx],
            &[span_sized(views, l.struct_size), t.span]
        ));
        let q = match l.queries.data.is_null() {
            true => None,
            false => Some(tri!(tensor(&l.queries))),
        };
        let pv = DevicePagedLayerViews {
            keys: k,
            values: v,
            // SAFETY: Buf::new checked the table; the context does not overlap it.
            table: unsafe { t.slice() },
            queries: q,
            row_lse: Floats {
                ptr: l.row_lse,
                len: l.row_lse_len,
            },
        };
        let (s, ly) = (tri!(to_usize(seq)), tri!(to_usize(layer)));
        // SAFETY: device pools and tensors by this function's contract; the caller's stream.
        to_status(unsafe { ev.score_layer_paged(s, ly, &pv, stream) })
    })
}

/// As `kve_evictor_compact_paged`, on `stream`, for a context configured with `paged =
/// 1`: `kv` is a pool in DEVICE memory (written through `kv->data`; `heads == Hkv`, `dim`
/// dk or dv), `table` HOST memory checked as in `kve_cuda_evictor_score_layer_paged` and
/// copied to the device block. `*blocks_freed`: as the host call's when the selection is
/// rectangular (token granularity or the uniform allocator); `UINT64_MAX` for the other
/// allocators, whose counts stay on the device (nothing is read back). On error nothing
/// is enqueued and `*blocks_freed` is as it was.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_compact_paged(
    evictor: *mut kve_cuda_evictor,
    seq: u64,
    layer: u64,
    kv: *const kve_paged_layout,
    table: *const u32,
    table_len: u64,
    blocks_freed: *mut u64,
    stream: *mut c_void,
) -> i32 {
    cuda_only!({
        // SAFETY: the caller's context; attach checks it.
        let (mut ev, ctx, _) = tri!(unsafe { attach(evictor) });
        // SAFETY: NULL or the caller's layout; device_pool checks it.
        let p = tri!(unsafe { device_pool(kv) });
        let t = tri!(Buf::new(table, table_len));
        let mut bf = tri!(out_param(blocks_freed));
        tri!(check_alias(&[ctx, bf.span], &[span_ptr(kv), t.span]));
        let (s, l) = (tri!(to_usize(seq)), tri!(to_usize(layer)));
        // SAFETY: Buf::new checked the table; no output overlaps it.
        let table = unsafe { t.slice() };
        // SAFETY: device memory the caller lets us write (this function's contract).
        let r = tri!(unsafe { ev.compact_paged(s, l, &p, table, stream) });
        // SAFETY: out_param checked it; check_alias: it overlaps no other argument.
        unsafe { bf.slice_mut()[0] = r.map_or(u64::MAX, |r| r.blocks_freed as u64) };
        KVE_OK
    })
}

/// As `kve_evictor_select`, on `stream`. `*kept_cells`: the cells every (layer, KV head)
/// keeps when the selection is rectangular (token granularity, or the uniform
/// allocator: the round's target); `UINT64_MAX` for the other allocators, whose counts
/// stay on the device (`kve_cuda_evictor_kept_lists`): nothing is read back.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_select(
    evictor: *mut kve_cuda_evictor,
    seq: u64,
    kept_cells: *mut u64,
    stream: *mut c_void,
) -> i32 {
    cuda_only!({
        let mut o = tri!(out_param(kept_cells));
        // SAFETY: the caller's context; attach checks it.
        let (mut ev, ctx, _) = tri!(unsafe { attach(evictor) });
        tri!(check_alias(&[o.span, ctx], &[]));
        // SAFETY: the caller's stream.
        let k = tri!(unsafe { ev.select(tri!(to_usize(seq)), stream) });
        // SAFETY: out_param checked it; one element.
        unsafe { o.slice_mut()[0] = k.map_or(u64::MAX, |k| k as u64) };
        KVE_OK
    })
}

/// The kept lists of `seq`'s selected round, in the device block (valid until the
/// sequence's next `begin`): unit `u = layer * hkv + h` keeps `(*idx)[u * *idx_ld ..]`,
/// `(*counts)[u]` cells ascending (int32, DEVICE memory; one list for every unit with
/// token granularity) — `kve_cuda_compact_in_place`'s lists. Writes the three only on
/// success.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_kept_lists(
    evictor: *mut kve_cuda_evictor,
    seq: u64,
    counts: *mut *const i32,
    idx: *mut *const i32,
    idx_ld: *mut u64,
) -> i32 {
    cuda_only!({
        let mut c = tri!(out_param(counts));
        let mut i = tri!(out_param(idx));
        let mut ld = tri!(out_param(idx_ld));
        // SAFETY: the caller's context; attach checks it.
        let (mut ev, ctx, _) = tri!(unsafe { attach(evictor) });
        tri!(check_alias(&[c.span, i.span, ld.span, ctx], &[]));
        let k = tri!(ev.kept(tri!(to_usize(seq))));
        // SAFETY: out_param checked all three; one element each.
        unsafe {
            c.slice_mut()[0] = k.counts;
            i.slice_mut()[0] = k.idx;
            ld.slice_mut()[0] = k.idx_ld as u64;
        }
        KVE_OK
    })
}

/// As `kve_evictor_compact`: `kv` is DEVICE memory (written through `kv->data`),
/// compacted in place on `stream`.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_compact(
    evictor: *mut kve_cuda_evictor,
    seq: u64,
    layer: u64,
    kv: *const kve_tensor,
    stream: *mut c_void,
) -> i32 {
    cuda_only!({
        // SAFETY: the caller's context; attach checks it.
        let (mut ev, ctx, _) = tri!(unsafe { attach(evictor) });
        tri!(check_alias(&[ctx], &[span_ptr(kv)]));
        // SAFETY: a host descriptor (NULL and alignment checked by arg).
        let t = tri!(tensor(tri!(unsafe { super::super::arg(kv) })));
        tri!(device::compact::in_place_ok(&t.view));
        let (s, l) = (tri!(to_usize(seq)), tri!(to_usize(layer)));
        // SAFETY: device memory the caller lets us write (this function's contract).
        to_status(unsafe { ev.compact(s, l, &t, stream) })
    })
}

/// As `kve_evictor_run_round`, on the device form, enqueued on `stream` and waited for
/// (not capturable): the same `kve_evictor_round` (V1 or V2, `fill` included) and the
/// same statuses, with each layer's `keys` and `values` in DEVICE memory (f32, f16 or
/// bf16: `Q8_0`/`Q4_0` are `KVE_ERR_UNSUPPORTED_DTYPE`; the stream's `[Hkv, S, d]`, V
/// transposed or not, its cells gathered by `cells` on the device in the context's paged
/// gather area, or `cells` NULL: the round's cells themselves) and its `queries` in HOST
/// memory (converted to the keys' dtype and uploaded by the library into its workspace;
/// absent: the ring `kve_cuda_evictor_observe_queries` filled). The kept cells (indices
/// into `round->cells`, ascending) are read back to `kept` (HOST memory) at the end. The
/// device form takes no marks (`n_marks`, `n_mark_ranges` or `mark_split` nonzero:
/// `KVE_ERR_INVALID_ARGUMENT`)
/// and needs token granularity (the round's kept cells one list; `KVE_ERR_INVALID_ARGUMENT`
/// otherwise), both checked before the round begins. The engine then moves the kept rows
/// (or drops the others) itself and calls `kve_cuda_evictor_commit`.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_run_round(
    evictor: *mut kve_cuda_evictor,
    seq: u64,
    round: *const kve_evictor_round,
    kept: *mut u32,
    len: u64,
    count: *mut u64,
    stream: *mut c_void,
) -> i32 {
    cuda_only!({
        let mut c = tri!(out_param(count));
        let mut o = tri!(Buf::new(kept, len));
        // SAFETY: the caller's context; attach checks it.
        let (mut ev, ctx, _) = tri!(unsafe { attach(evictor) });
        let layers = ev.layers();
        // SAFETY: NULL or the caller's struct and buffers; read checks them.
        let a = tri!(unsafe { RoundArgs::read(round, layers, [c.span, o.span, ctx], len) });
        if a.marks.is_some() || !a.ranges.is_empty() || a.r.mark_split != 0 {
            return KVE_ERR_INVALID_ARGUMENT;
        }
        let cells = (!a.dense).then_some(a.cells);
        tri!(ev.check_stream_round(cells));
        // layer l's tensors, checked (device K/V, host queries; no overlap with an
        // output, every cell inside)
        let tensors =
            |l: usize| -> Result<(device::Tensor, Option<device::Tensor>, Option<HostTensor>)> {
                let [k, v, q] = a.layer(l)?;
                let opt = |t: &kve_tensor| match t.data.is_null() {
                    true => Ok(None),
                    false => tensor(t).map(Some),
                };
                let (k, v, q) = (tensor(&k)?, opt(&v)?, HostTensor::optional(&q)?);
                let vs = v.as_ref().map_or(Span::EMPTY, device::Tensor::span);
                check_alias(&a.outputs, &[k.span(), vs, HostTensor::span(&q)])?;
                a.fits(k.view.tokens as usize)?;
                v.as_ref()
                    .map_or(Ok(()), |v| a.fits(v.view.tokens as usize))?;
                Ok((k, v, q))
            };
        if a.r.fill.is_none() {
            for l in 0..layers {
                tri!(tensors(l));
            }
        }
        let s = tri!(to_usize(seq));
        tri!(ev.begin(s, a.n, tri!(to_usize(a.r.target))));
        for l in 0..layers {
            let (k, v, q) = tri!(tensors(l));
            // SAFETY: checked by Tensor::new; host memory no output overlaps.
            let qv = tri!(q.as_ref().map(|q| unsafe { q.view() }).transpose());
            // SAFETY: device tensors by this function's contract; the caller's stream.
            tri!(unsafe {
                ev.score_layer_stream(s, l, &k, v.as_ref(), qv.as_ref(), cells, stream)
            });
        }
        // SAFETY: the caller's stream.
        let k = tri!(tri!(unsafe { ev.select(s, stream) }).ok_or(Error::InvalidArgument));
        // SAFETY: Buf::new checked it; check_alias: it overlaps nothing else; the stream.
        let n = tri!(unsafe { ev.kept_to_host(s, k, o.slice_mut(), stream) });
        // SAFETY: out_param checked it; one element.
        unsafe { c.slice_mut()[0] = n as u64 };
        KVE_OK
    })
}

/// As `kve_evictor_commit` (host bookkeeping). A selection that is not rectangular
/// leaves the sequence ragged: no further round until `kve_cuda_evictor_seq_reset`.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_commit(evictor: *mut kve_cuda_evictor, seq: u64) -> i32 {
    cuda_only!({
        // SAFETY: the caller's context; on_seq attaches and checks it.
        unsafe { on_seq(evictor, seq, DeviceEvictor::commit) }
    })
}

/// As `kve_evictor_seq_reset`.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_seq_reset(
    evictor: *mut kve_cuda_evictor,
    seq: u64,
) -> i32 {
    cuda_only!({
        // SAFETY: the caller's context; on_seq attaches and checks it.
        unsafe { on_seq(evictor, seq, DeviceEvictor::reset) }
    })
}

/// As `kve_evictor_seq_unprotect` (host bookkeeping).
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_seq_unprotect(
    evictor: *mut kve_cuda_evictor,
    seq: u64,
) -> i32 {
    cuda_only!({
        // SAFETY: the caller's context; on_seq attaches and checks it.
        unsafe { on_seq(evictor, seq, DeviceEvictor::unprotect) }
    })
}

/// As `kve_evictor_get_stats`.
#[no_mangle]
pub unsafe extern "C" fn kve_cuda_evictor_get_stats(
    evictor: *mut kve_cuda_evictor,
    seq: u64,
    out: *mut kve_evictor_stats,
    struct_size: u32,
) -> i32 {
    cuda_only!({
        // SAFETY: the caller's context; attach checks it.
        let (mut ev, ctx, _) = tri!(unsafe { attach(evictor) });
        tri!(check_alias(&[span_sized(out, struct_size)], &[ctx]));
        let s = tri!(ev.stats(tri!(to_usize(seq))));
        // SAFETY: NULL or `struct_size` writable bytes (the caller's contract).
        unsafe { write_stats(s, out, struct_size) }
    })
}
