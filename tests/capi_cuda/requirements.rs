use super::*;

// ------------------------------------------------------------- the requirements table

/// A change to a layer's input descriptors.
type Edit = dyn Fn(&mut kve_layer_inputs);

/// A small f32 layer (4 query heads, 2 KV heads, 80 tokens, dim 16) for status checks.
fn small_layer(seed: u64) -> Layer {
    layer(
        Dt::F32,
        Layout::HeadMajor,
        Layout::HeadMajor,
        4,
        2,
        80,
        16,
        seed,
    )
}

/// `kve_score_layer` and `kve_cuda_score_layer` on one layer's inputs changed by `edit`
/// (the same change to the host and the device descriptors): their two statuses.
fn host_and_device_status(l: &Layer, p: &kve_score_params, edit: &Edit) -> (i32, i32) {
    let d = l.k.ext[2] as u64;
    let (hq, hkv, n) = (l.hq as u64, l.hkv as u64, l.n as u64);
    let (mut hb, mut db) = (0u64, 0u64);
    unsafe {
        assert_eq!(
            kve_score_workspace_size(p, hq, hkv, n, d, d, &mut hb),
            KVE_OK
        );
        assert_eq!(
            kve_cuda_score_workspace_size(p, hq, hkv, n, d, d, &mut db),
            KVE_OK
        );
        let len = l.hkv * l.n;
        let mut hin = inputs(l, p, Vals::Gram, None, false);
        let mut din = inputs(l, p, Vals::Gram, None, true);
        edit(&mut hin);
        edit(&mut din);
        let mut out = vec![0f32; len];
        let mut ws = vec![0u8; hb as usize];
        let host = kve_score_layer(
            p,
            &hin,
            out.as_mut_ptr(),
            len as u64,
            ws.as_mut_ptr() as *mut c_void,
            hb,
        );
        let (dout, dws) = (Buf::new(len * 4), Buf::new(db as usize));
        let device = score_into(p, &din, &dout, len, &dws, db);
        (host, device)
    }
}

/// Each scorer's row of `kvevict::score::requirements` is what the host and the device
/// read: without an input the row names, both refuse with `KVE_ERR_NULL_POINTER`; without
/// one it does not name, both score. So the table, the host checks and the device checks
/// cannot drift apart unseen.
#[test]
fn requirements_table_is_what_host_and_device_read() {
    use kvevict::score::requirements::{requirements, ValueInput};
    need_device!();
    let l = small_layer(11);
    let statuses = |p: &kve_score_params, edit: &Edit| host_and_device_status(&l, p, edit);
    let presets = [
        Preset::SnapKv,
        Preset::Lava,
        Preset::LaProx,
        Preset::CriticalKv,
        Preset::StreamingLlm,
        Preset::KNorm,
        Preset::Tova,
    ];
    let mut cases = 0;
    for preset in presets {
        let p = score_params(|_| {}, preset);
        let req = requirements(ScorerKind::from_u32(p.scorer).unwrap());
        let want = |needed: bool| if needed { KVE_ERR_NULL_POINTER } else { KVE_OK };
        let removals: [(&str, i32, &Edit); 5] = [
            ("nothing", KVE_OK, &|_| {}),
            ("queries", want(req.queries), &|i| {
                i.queries = kve_tensor::NONE
            }),
            ("values", want(req.values != ValueInput::None), &|i| {
                i.values = kve_tensor::NONE
            }),
            (
                "gram",
                want(req.values == ValueInput::ValuesOrForms),
                &|i| {
                    i.gram = null();
                    i.gram_len = 0;
                },
            ),
            ("value_l1", want(req.value_l1), &|i| {
                i.value_l1 = null();
                i.value_l1_len = 0;
            }),
        ];
        for (what, expected, edit) in removals {
            let (host, device) = statuses(&p, edit);
            assert_eq!(host, expected, "{preset:?} without {what}: host");
            assert_eq!(device, expected, "{preset:?} without {what}: device");
            cases += 1;
        }
    }
    println!("requirements: {cases} cases, host == device == the table for each");
}

/// The same bad descriptor gives the same status on the host and on the device: both
/// check tensors with one function (`Tensor::new` of the C layer) and shapes with the
/// same rules, so a caller's error handling does not depend on where it scores.
#[test]
fn host_and_device_refuse_bad_inputs_alike() {
    need_device!();
    let l = small_layer(13);
    let lse = [0f32; 3];
    let lse_ptr = lse.as_ptr() as usize;
    let edits: [(&str, &Edit); 16] = [
        ("keys dtype", &|i| i.keys.dtype = 9),
        ("keys pad", &|i| i.keys.pad = 1),
        ("keys len", &|i| i.keys.len -= 1),
        ("keys misaligned", &|i| {
            i.keys.data = (i.keys.data as *const u8).wrapping_add(2) as *const c_void
        }),
        ("keys heads 0", &|i| i.keys.extent[0] = 0),
        ("keys tokens past 2^31", &|i| {
            i.keys.extent[1] = (1 << 31) + 1
        }),
        ("queries dim", &|i| i.queries.extent[2] -= 1),
        ("queries rows", &|i| i.queries.extent[1] = 1),
        ("queries heads", &|i| i.queries.extent[0] = 3),
        ("queries absent", &|i| i.queries = kve_tensor::NONE),
        ("values tokens", &|i| i.values.extent[1] -= 1),
        ("values heads", &|i| i.values.extent[0] = 1),
        ("reserved", &|i| i.reserved = 1),
        ("struct size", &|i| i.struct_size = 7),
        ("row_lse length", &move |i| {
            i.row_lse = lse_ptr as *const f32;
            i.row_lse_len = 3;
        }),
        ("value_l1 short", &|i| i.value_l1_len = 3),
    ];
    let mut cases = 0;
    for preset in [
        Preset::SnapKv,
        Preset::Lava,
        Preset::LaProx,
        Preset::CriticalKv,
        Preset::KNorm,
    ] {
        let p = score_params(|_| {}, preset);
        for (what, edit) in edits {
            let (host, device) = host_and_device_status(&l, &p, edit);
            assert_eq!(
                host, device,
                "{preset:?}, {what}: host {host}, device {device}"
            );
            cases += 1;
        }
    }
    println!("bad inputs: {cases} cases, the same status on host and device");
}

/// The same bad scores descriptor gives the same status to `kve_select_model` and
/// `kve_cuda_select_model` (one `ModelShape` check, the same length rule): every output
/// is sized by its own size queries, so only the descriptor differs from a valid call.
#[test]
fn host_and_device_select_refuse_bad_scores_alike() {
    type ScoresEdit = dyn Fn(&mut kve_model_scores);
    need_device!();
    let (layers, hkv, n, w) = (2u64, 2u64, 40u64, 8u64);
    let len = (layers * hkv * (n - w)) as usize;
    let vals: Vec<f32> = (0..len).map(|i| ((i * 37) % 11) as f32).collect();
    let dscores = Buf::bytes_of(&vals);
    let statuses = |p: &kve_select_params, edit: &ScoresEdit| unsafe {
        let mut hm = kve_model_scores {
            scores: vals.as_ptr(),
            len: len as u64,
            layers,
            hkv,
            n,
            window: w,
        };
        let mut dm = kve_model_scores {
            scores: dscores.ptr_as(),
            ..hm
        };
        edit(&mut hm);
        edit(&mut dm);
        let host = host_select_call(p, &hm).0;
        // device outputs and workspace as its size query gives them for the edited shape
        let (l, h, nn, ww) = (dm.layers, dm.hkv, dm.n, dm.window);
        let mut db = 0u64;
        kve_cuda_select_model_workspace_size(p, l, h, nn, ww, &mut db);
        let units = (l * h).min(64) as usize;
        let ld = (nn as usize).clamp(1, 64);
        let (counts, idx) = (Buf::new(units * 4), Buf::new(units * ld * 4));
        let dws = Buf::new(db as usize);
        let device = kve_cuda_select_model(
            p,
            &dm,
            counts.ptr_as(),
            units as u64,
            idx.ptr_as(),
            ld as u64,
            (units * ld) as u64,
            dws.ptr_as(),
            db,
            null_mut(),
        );
        (host, device)
    };
    let edits: [(&str, &ScoresEdit); 12] = [
        ("nothing", &|_| {}),
        ("scores null", &|m| m.scores = null()),
        ("scores misaligned", &|m| {
            m.scores = (m.scores as *const u8).wrapping_add(2) as *const f32
        }),
        ("len short", &|m| m.len -= 1),
        ("len 0", &|m| m.len = 0),
        ("layers 0", &|m| m.layers = 0),
        ("hkv 0", &|m| m.hkv = 0),
        ("n 0", &|m| m.n = 0),
        ("n past 2^31", &|m| m.n = (1 << 31) + 1),
        ("layers past 2^20", &|m| m.layers = (1 << 20) + 1),
        ("window past n", &|m| m.window = 1000),
        ("window 0", &|m| m.window = 0),
    ];
    let mut cases = 0;
    for (alloc, gran) in [
        (AllocatorKind::Uniform, Granularity::Head),
        (AllocatorKind::Ada, Granularity::Head),
        (AllocatorKind::Global, Granularity::Layer),
    ] {
        let p = select_params(alloc, gran, 8);
        for (what, edit) in edits {
            let (host, device) = statuses(&p, edit);
            assert_eq!(
                host, device,
                "{alloc:?} {gran:?}, {what}: host {host}, device {device}"
            );
            // (window past n leaves P = 0: the exact-length contract then wants len 0)
            let valid = matches!(what, "nothing");
            assert_eq!(
                host == KVE_OK,
                valid,
                "{alloc:?} {gran:?}, {what}: status {host}"
            );
            cases += 1;
        }
    }
    println!("bad scores: {cases} cases, the same status on host and device");
}
