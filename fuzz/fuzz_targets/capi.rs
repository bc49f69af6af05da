//! Drives the C entry points with arbitrary descriptors and data: views over a
//! fuzzer-owned arena with arbitrary offsets (alignment), dtypes, extents, strides and
//! lengths (never more than the arena holds), arbitrary params and enum values, output
//! buffers of arbitrary sizes, sometimes placed inside the inputs.
//!
//! The device entry points (`kve_cuda_score_layer`, `kve_cuda_select_model`) run the real
//! kernels of cuda/ on the CPU emulator (feature `cuda-emu`): the arena and every output
//! and workspace buffer are registered with the emulated runtime as device memory (as
//! `cudaHostRegister`'d mapped memory is on a GPU), so the same arena serves as device
//! memory and the emulator still aborts on a kernel pointer outside every registered
//! buffer.
//!
//! The evictor (`kve_evictor_*`, or its device form `kve_cuda_evictor_*` on the
//! emulator) runs a random sequence of calls on one context built from an arbitrary
//! config: after every refused call the context (its workspace aside; for the device form
//! the host context and the device block) and every output are as they were.
//!
//! The query stream (`kve_stream_*`) runs start to finish: size, start, one to three
//! chunks, then scores, raw statistics or the count, with its descriptors, positions
//! and outputs sometimes placed inside the state, the workspace or the output.
//!
//! The paged entry points (`kve_paged_*`) get a pool layout over the arena (an engine's
//! kind or arbitrary strides), a table (sometimes words of the arena), a gather (checked
//! element by element through the table) or an in-place compaction (blocks freed and
//! kept positions checked).
//!
//! Oracles: no crash, no out-of-bounds access (ASan), and
//! - on error, outputs still hold their canaries and the arena is unchanged;
//! - on success, outputs are well formed (finite host scores, ascending kept lists, ...);
//! - an output overlapping an input never succeeds;
//! - a device call never answers `KVE_ERR_CUDA`: that means a launcher refused arguments
//!   the C layer had accepted (its validation is incomplete; the emulator has sm_90's
//!   shared-memory limit).
//! The harness caps the work of one call (element counts of views with stride 0, which
//! a small buffer can declare legally), not what the library accepts.
//!
//! The files: `capi/harness.rs` (the input's reader, the arena and views over it, outputs,
//! workspaces, params, the checks the drivers share); one module per family of entry points
//! (`host`, `device`, `stream`, `paged`, `evictor`), each op a function the match below calls.
#![no_main]

#[path = "capi/device.rs"]
mod device;
#[path = "capi/evictor.rs"]
mod evictor;
#[path = "capi/harness.rs"]
mod harness;
#[path = "capi/host.rs"]
mod host;
#[path = "capi/paged.rs"]
mod paged;
#[path = "capi/stream.rs"]
mod stream;

use harness::*;
use kvevict::capi::*;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut r = R { d: data, i: 0 };
    let op = r.u8() % 14;
    let mut a = Arena::new(&mut r);
    let mut ck = Checks {
        before: a.bytes().to_vec(),
        outs: Vec::new(),
        dst_in_arena: false,
    };
    // None: the input was past the harness's caps (no oracle to check)
    let st = unsafe {
        match op {
            0 => host::score_layer(&mut r, &mut a, &mut ck),
            1 | 2 | 3 => host::layer_stats(op, &mut r, &mut a, &mut ck),
            4 | 5 => host::select_model(op, &mut r, &mut a, &mut ck),
            6 | 7 => host::compact(op, &mut r, &mut a, &mut ck),
            8 => host::search(&mut r, &mut a),
            9 => device::score_layer(&mut r, &mut a, &mut ck),
            10 => device::select_model(&mut r, &mut a, &mut ck),
            11 => stream::stream(&mut r, &mut a, &mut ck),
            12 => {
                let device = r.chance(2);
                Some(evictor::evictor_calls(&mut r, &a, &mut ck.outs, device))
            }
            13 => paged::paged(&mut r, &mut a, &mut ck),
            _ => unreachable!(),
        }
    };
    let Some(st) = st else { return };
    let Checks {
        before,
        outs,
        dst_in_arena,
    } = ck;
    let _ = kve_status_name(st);
    if st != KVE_OK {
        for o in &outs {
            assert!(o.untouched(), "output written on error (status {st})");
        }
        assert!(
            a.bytes() == &before[..],
            "arena written on error (status {st})"
        );
    } else {
        let arena_changed = a.bytes() != &before[..];
        let wrote_in_arena = dst_in_arena || outs.iter().any(|o| o.in_arena);
        assert!(
            !arena_changed || wrote_in_arena,
            "input arena modified (op {op})"
        );
    }
});
