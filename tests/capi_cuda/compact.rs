use super::*;

// ------------------------------------------------- batched in-place compaction --

/// One tensor of a compaction batch: its device copy, host copy and list rows.
struct Compacted {
    t: Tensor,
    /// First list row (unit) of the tensor's heads; `None`: one shared list (kept_ld 0).
    unit: Option<usize>,
}

/// The host C API's compaction of `t` with the lists `lists[unit ..]` (or `shared`).
fn host_compacted(c: &Compacted, lists: &[Vec<u32>], shared: &[u32]) -> Vec<u8> {
    let mut bytes = c.t.bytes.clone();
    let heads = c.t.ext[0];
    let (mut off, mut idx) = (vec![0u64], Vec::new());
    for h in 0..heads {
        let l: &[u32] = match c.unit {
            Some(u) => &lists[u + h],
            None => shared,
        };
        idx.extend_from_slice(l);
        off.push(idx.len() as u64);
    }
    let mut d = c.t.desc(false);
    d.data = bytes.as_mut_ptr() as *const c_void;
    let st = unsafe {
        kve_compact_in_place(
            &d,
            off.as_ptr(),
            off.len() as u64,
            idx.as_ptr(),
            idx.len() as u64,
            null_mut(),
            0,
        )
    };
    assert_eq!(st, KVE_OK, "host compaction");
    bytes
}

/// `kve_cuda_compact_batch_in_place` over 37 tensors (two launch pairs), every dtype and
/// layout, K and V of a layer sharing lists and one tensor with a list shared by its heads,
/// equals the host C API's compaction of each tensor; refused calls write nothing.
#[test]
fn compact_batch_in_place_matches_host_compaction() {
    need_device!();
    let (hkv, n, d, layers) = (3usize, 61usize, 8usize, 18usize);
    let mut rng = Rng::new(77);
    let ld = n + 5;
    let units = layers * hkv;
    let mut lists: Vec<Vec<u32>> = Vec::new();
    for u in 0..units {
        // some heads keep everything, one nothing, the rest a random ascending subset
        let keep = match u % 7 {
            0 => n,
            3 => 0,
            _ => 1 + rng.below(n - 1),
        };
        let mut all: Vec<u32> = (0..n as u32).collect();
        for i in 0..n {
            let j = i + rng.below(n - i);
            all.swap(i, j);
        }
        let mut l = all[..keep].to_vec();
        l.sort_unstable();
        lists.push(l);
    }
    let shared: Vec<u32> = (0..n as u32).filter(|i| i % 3 != 1).collect();
    let mut idx = vec![-1i32; units * ld];
    let mut counts = vec![0i32; units];
    for (u, l) in lists.iter().enumerate() {
        counts[u] = l.len() as i32;
        for (t, &i) in l.iter().enumerate() {
            idx[u * ld + t] = i as i32;
        }
    }
    let didx = Buf::bytes_of(&idx);
    let dcounts = Buf::bytes_of(&counts);
    let dshared = Buf::bytes_of(&shared.iter().map(|&i| i as i32).collect::<Vec<_>>());
    let dshared_count = Buf::bytes_of(&[shared.len() as i32]);
    let dts = [Dt::F16, Dt::Bf16, Dt::F32];
    let lays = [Layout::HeadMajor, Layout::TokenRows, Layout::Transposed];
    let mut ts = Vec::new();
    for l in 0..layers {
        for kv in 0..2 {
            let (dt, lay) = (dts[(l + kv) % 3], lays[(l + 2 * kv) % 3]);
            let t = Tensor::new(dt, lay, [hkv, n, d], &mut rng, 1.0);
            ts.push(Compacted {
                t,
                unit: Some(l * hkv),
            });
        }
    }
    // llama.cpp token rows viewed as one head of width hkv*d, one shared list
    ts.push(Compacted {
        t: Tensor::new(Dt::Bf16, Layout::HeadMajor, [1, n, hkv * d], &mut rng, 1.0),
        unit: None,
    });
    let item = |c: &Compacted| kve_compact_item {
        kv: c.t.desc(true),
        kept: match c.unit {
            Some(u) => unsafe { didx.ptr_as::<i32>().add(u * ld) },
            None => dshared.ptr_as(),
        },
        kept_ld: if c.unit.is_some() { ld as u64 } else { 0 },
        counts: match c.unit {
            Some(u) => unsafe { dcounts.ptr_as::<i32>().add(u) },
            None => dshared_count.ptr_as(),
        },
    };
    let items: Vec<kve_compact_item> = ts.iter().map(item).collect();
    assert!(items.len() > 32, "two launch pairs");
    let max_keep = n as u64;
    let mut bytes = 0u64;
    unsafe {
        assert_eq!(
            kve_cuda_compact_batch_in_place_workspace_size(
                items.as_ptr(),
                items.len() as u64,
                max_keep,
                &mut bytes
            ),
            KVE_OK
        );
    }
    assert!(bytes > 0);
    let ws = Buf::new(bytes as usize + 512);
    let call = |its: &[kve_compact_item], ws: *mut c_void, wsb: u64| unsafe {
        kve_cuda_compact_batch_in_place(
            its.as_ptr(),
            its.len() as u64,
            max_keep,
            ws,
            wsb,
            null_mut(),
        )
    };
    let untouched = |what: &str| {
        for c in &ts {
            assert!(
                c.t.dev.download_as::<u8>(c.t.bytes.len()) == c.t.bytes,
                "{what}: a tensor was written"
            );
        }
    };
    // refusals first: nothing may move
    let wsp = ws.ptr_as::<c_void>();
    let mut bad = items.clone();
    bad[33].kv.dtype = 9;
    assert_eq!(call(&bad, wsp, bytes), KVE_ERR_BAD_ENUM);
    let mut bad = items.clone();
    bad[35].kept = null();
    assert_eq!(call(&bad, wsp, bytes), KVE_ERR_NULL_POINTER);
    let mut bad = items.clone();
    bad[34].kept = unsafe { (bad[34].kept as *const u8).add(2) as *const i32 };
    assert_eq!(call(&bad, wsp, bytes), KVE_ERR_MISALIGNED);
    let mut bad = items.clone();
    bad[34].kept_ld = (n - 1) as u64; // below min(max_keep, N)
    assert_eq!(call(&bad, wsp, bytes), KVE_ERR_INVALID_ARGUMENT);
    let mut bad = items.clone();
    bad[36] = bad[2]; // the same tensor twice
    assert_eq!(call(&bad, wsp, bytes), KVE_ERR_ALIASING);
    let mut bad = items.clone();
    bad[30].kept = bad[1].kv.data as *const i32; // a list inside another tensor
    assert_eq!(call(&bad, wsp, bytes), KVE_ERR_ALIASING);
    assert_eq!(
        call(&items, items[5].kv.data as *mut c_void, bytes),
        KVE_ERR_ALIASING
    );
    assert_eq!(call(&items, wsp, bytes - 1), KVE_ERR_WORKSPACE_TOO_SMALL);
    assert_eq!(
        call(
            &items,
            unsafe { (wsp as *mut u8).add(16) } as *mut c_void,
            bytes
        ),
        KVE_ERR_MISALIGNED
    );
    assert_eq!(
        call(&vec![items[0]; 1025], wsp, bytes),
        KVE_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { kve_cuda_compact_batch_in_place(null(), 3, max_keep, wsp, bytes, null_mut()) },
        KVE_ERR_NULL_POINTER
    );
    untouched("refused call");
    assert_eq!(call(&[], null_mut(), 0), KVE_OK);
    assert_eq!(call(&items, wsp, bytes), KVE_OK);
    for (i, c) in ts.iter().enumerate() {
        let want = host_compacted(c, &lists, &shared);
        let got = c.t.dev.download_as::<u8>(c.t.bytes.len());
        assert!(
            got == want,
            "tensor {i} ({:?} {:?}) differs from the host",
            c.t.dt,
            c.t.stride
        );
    }
}
