//! cuda/compact.cu: in-place, batched and varlen compaction of K/V rows.

use super::*;

#[test]
fn compact_matches_reference() {
    let mut rng = device_rng!(8);
    for (dt, layout) in dtype_layouts() {
        for shared in [false, true] {
            let (h, n, d) = (3usize, 257usize, 24usize);
            let x = Tensor::normal(&mut rng, dt, layout, [h, n, d]);
            let lists = if shared { 1 } else { h };
            let mut kept = vec![0i32; lists * n];
            let mut counts = vec![0i32; lists];
            for l in 0..lists {
                let mut c = 0;
                for t in 0..n {
                    if rng.unif() < 0.3 || t < 5 {
                        kept[l * n + c] = t as i32;
                        c += 1;
                    }
                }
                counts[l] = c as i32;
            }
            let max_keep = *counts.iter().max().unwrap() as usize;
            let (kd, cd) = (DBuf::from(&kept), DBuf::from(&counts));
            let kept_ld = if shared { 0 } else { n as i64 };
            // varlen (out of place) first: reads the untouched tensor
            let total: usize = (0..h)
                .map(|hh| counts[if shared { 0 } else { hh }] as usize)
                .sum();
            let dst = DBuf::<u8>::new(total * d * dt.size());
            let cu = DBuf::from(&vec![-1i32; h + 1]);
            ck(
                unsafe {
                    kve_cuda_compact_varlen(
                        &x.view(),
                        kd.ptr(),
                        kept_ld,
                        cd.ptr(),
                        dst.vptr(),
                        cu.ptr(),
                        null_mut(),
                    )
                },
                "varlen",
            );
            let cug = cu.download();
            let dstv = dt.decode(&dst.download());
            let mut acc = 0;
            for hh in 0..h {
                let l = if shared { 0 } else { hh };
                assert_eq!(cug[hh], acc as i32, "cu_seqlens[{hh}]");
                for t in 0..counts[l] as usize {
                    let src = kept[l * n + t] as usize;
                    for dd in 0..d {
                        assert_eq!(
                            dstv[(acc + t) * d + dd],
                            x.vals[(hh * n + src) * d + dd],
                            "varlen {dt:?} {layout:?} h{hh} t{t} d{dd}"
                        );
                    }
                }
                acc += counts[l] as usize;
            }
            assert_eq!(cug[h], acc as i32);
            // in place
            let wsb = unsafe { kve_cuda_compact_workspace_size(&x.view(), max_keep as i64) };
            let ws = DBuf::<u8>::new(wsb);
            ck(
                unsafe {
                    kve_cuda_compact(
                        &x.view(),
                        kd.ptr(),
                        kept_ld,
                        cd.ptr(),
                        max_keep as i64,
                        ws.vptr(),
                        wsb,
                        null_mut(),
                    )
                },
                "compact",
            );
            let what = format!("in place {dt:?} {layout:?} shared {shared}");
            assert_compacted(&what, &x, &kept, &counts, shared);
        }
    }
}

/// Each head of `x` as compacted in place: row `t < count` holds the old row `kept[t]`,
/// the rest is unchanged (`shared`: one list for every head; lists `n` apart otherwise).
#[track_caller]
fn assert_compacted(what: &str, x: &Tensor, kept: &[i32], counts: &[i32], shared: bool) {
    let [h, n, d] = x.ext;
    let got = x.read_back();
    for hh in 0..h {
        let l = if shared { 0 } else { hh };
        for t in 0..n {
            let src = if t < counts[l] as usize {
                kept[l * n + t] as usize
            } else {
                t
            };
            for dd in 0..d {
                let (a, b) = (got[(hh * n + t) * d + dd], x.vals[(hh * n + src) * d + dd]);
                assert_eq!(a, b, "{what} h{hh} t{t} d{dd}");
            }
        }
    }
}

/// `kve_cuda_compact_batch`: 35 tensors (two launch pairs: 32 + 3) of every dtype and
/// layout, K and V of a "layer" sharing its lists, some layers with one shared list, each
/// compacted as `kve_cuda_compact` would (rows moved, the rest untouched); the workspace is
/// the largest pair's; a bad item anywhere refuses the whole call, nothing written.
#[test]
fn compact_batch_matches_reference() {
    let mut rng = device_rng!(33);
    let (h, n, d) = (2usize, 150usize, 16usize);
    let mut tensors = Vec::new();
    let mut lists = Vec::new();
    for i in 0..35 {
        let (dt, layout) = (DTYPES[i % DTYPES.len()], LAYOUTS[(i / 2) % LAYOUTS.len()]);
        tensors.push(Tensor::normal(&mut rng, dt, layout, [h, n, d]));
        if i % 2 == 0 {
            let shared = i % 6 == 4;
            let (kept, counts) = random_lists(&mut rng, if shared { 1 } else { h }, n, n);
            lists.push((
                shared,
                kept.clone(),
                counts.clone(),
                DBuf::from(&kept),
                DBuf::from(&counts),
            ));
        }
    }
    let items: Vec<KveCudaCompactItem> = tensors
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let (shared, _, _, kd, cd) = &lists[i / 2];
            KveCudaCompactItem {
                x: x.view(),
                kept: kd.ptr(),
                kept_ld: if *shared { 0 } else { n as i64 },
                counts: cd.ptr(),
            }
        })
        .collect();
    let max_keep = lists
        .iter()
        .flat_map(|l| l.2.iter())
        .copied()
        .max()
        .unwrap() as i64;
    // SAFETY: a pure host function of the descriptors.
    let wsb = unsafe { kve_cuda_compact_batch_workspace_size(items.as_ptr(), 35, max_keep) };
    let pair: usize = items[..32]
        .iter()
        // SAFETY: as above.
        .map(|it| unsafe { kve_cuda_compact_workspace_size(&it.x, max_keep) }.div_ceil(256) * 256)
        .sum();
    assert_eq!(wsb, pair, "the workspace is the first (largest) pair's");
    let ws = DBuf::<u8>::new(wsb);
    let before: Vec<Vec<f32>> = tensors.iter().map(|x| x.read_back()).collect();
    // refusals: nothing moves
    let mut bad = items.clone();
    bad[33].kept_ld = max_keep - 1;
    let stream = null_stream();
    // SAFETY: device buffers of the declared sizes; refused calls touch none.
    unsafe {
        let refused = [
            (
                "an item's kept_ld < max_keep",
                kve_cuda_compact_batch(bad.as_ptr(), 35, max_keep, ws.vptr(), wsb, stream),
            ),
            (
                "workspace too small",
                kve_cuda_compact_batch(items.as_ptr(), 35, max_keep, ws.vptr(), wsb - 1, stream),
            ),
            (
                "no workspace",
                kve_cuda_compact_batch(items.as_ptr(), 35, max_keep, null_mut(), wsb, stream),
            ),
            (
                "no items",
                kve_cuda_compact_batch(null(), 35, max_keep, ws.vptr(), wsb, stream),
            ),
            (
                "n_items < 0",
                kve_cuda_compact_batch(items.as_ptr(), -1, max_keep, ws.vptr(), wsb, stream),
            ),
        ];
        for (what, rc) in refused {
            assert_eq!(rc, 1, "{what}");
        }
        assert_eq!(
            kve_cuda_compact_batch(null(), 0, max_keep, null_mut(), 0, stream),
            0,
            "empty"
        );
    }
    for (i, x) in tensors.iter().enumerate() {
        assert_eq!(
            x.read_back(),
            before[i],
            "tensor {i}: nothing written on refusal"
        );
    }
    // SAFETY: as above.
    ck(
        unsafe { kve_cuda_compact_batch(items.as_ptr(), 35, max_keep, ws.vptr(), wsb, stream) },
        "compact_batch",
    );
    for (i, x) in tensors.iter().enumerate() {
        let (shared, kept, counts, _, _) = &lists[i / 2];
        let what = format!("tensor {i} ({:?})", items[i].x.dtype);
        assert_compacted(&what, x, kept, counts, *shared);
    }
}

/// Edges of compaction on a transposed f16 cache (tokens fastest): the workspace size,
/// refusals that write nothing (workspace too small, kept_ld below max_keep; varlen with
/// kept_ld below the tokens or no destination), varlen per head and with one shared list
/// (kept_ld 0), then in place. (A kept position past the tokens cannot be refused: the
/// kernels cannot see device lists before launching.)
#[test]
fn compact_edges_and_rejections() {
    need_device!();
    let (heads, n, d) = (3usize, 10usize, 4usize);
    let mut e = 0f32;
    let x = Tensor::new(Dt::F16, Layout::Transposed, [heads, n, d], &mut || {
        e += 1.0;
        e
    });
    let at = |v: &[f32], h: usize, t: usize, c: usize| v[(h * n + t) * d + c];
    let kept = [0i32, 2, 5, 9, 1, 3, 4, 0, 7, 8, 9, 0];
    let counts = [4i32, 3, 2];
    let (kd, cd) = (DBuf::from(&kept), DBuf::from(&counts));
    // SAFETY: a pure host function of the view.
    let wsz = unsafe { kve_cuda_compact_workspace_size(&x.view(), 4) };
    assert_eq!(wsz, heads * 4 * d * 2, "compact workspace size");
    let ws = DBuf::<u8>::new(wsz);
    let compact = |kept: &DBuf<i32>, kept_ld: i64, wsb: usize| {
        // SAFETY: device buffers of the declared sizes.
        unsafe {
            kve_cuda_compact(
                &x.view(),
                kept.ptr(),
                kept_ld,
                cd.ptr(),
                4,
                ws.vptr(),
                wsb,
                null_mut(),
            )
        }
    };
    assert_eq!(
        compact(&kd, 4, wsz - 1),
        INVALID,
        "compact: workspace too small"
    );
    assert_eq!(compact(&kd, 3, wsz), INVALID, "compact: kept_ld < max_keep");
    assert_eq!(x.read_back(), x.vals, "compact refused: tensor written");
    // varlen (out of place)
    let cu = DBuf::from(&[-1i32; 4]);
    let dst = DBuf::<u8>::new(9 * d * 2);
    let varlen = |kept: &DBuf<i32>, kept_ld: i64, counts: &DBuf<i32>, dst: *mut c_void| {
        // SAFETY: device buffers of the declared sizes.
        unsafe {
            kve_cuda_compact_varlen(
                &x.view(),
                kept.ptr(),
                kept_ld,
                counts.ptr(),
                dst,
                cu.ptr(),
                null_mut(),
            )
        }
    };
    let kept10: Vec<i32> = (0..heads)
        .flat_map(|h| {
            let mut row = kept[h * 4..h * 4 + 4].to_vec();
            row.resize(10, 0);
            row
        })
        .collect();
    let k10 = DBuf::from(&kept10);
    assert_eq!(
        varlen(&kd, 4, &cd, dst.vptr()),
        INVALID,
        "varlen: kept_ld < tokens"
    );
    assert_eq!(
        varlen(&k10, 10, &cd, null_mut()),
        INVALID,
        "varlen: no destination"
    );
    assert_eq!(
        cu.download(),
        vec![-1; 4],
        "varlen refused: cu_seqlens written"
    );
    ck(varlen(&k10, 10, &cd, dst.vptr()), "varlen");
    let cug = cu.download();
    assert_eq!(cug, vec![0, 4, 7, 9]);
    let got = Dt::F16.decode(&dst.download());
    for h in 0..heads {
        for t in 0..counts[h] as usize {
            for c in 0..d {
                let want = at(&x.vals, h, kept10[h * 10 + t] as usize, c);
                assert_eq!(
                    got[(cug[h] as usize + t) * d + c],
                    want,
                    "varlen h{h} t{t} c{c}"
                );
            }
        }
    }
    // one list for every head (kept_ld 0)
    let (shared, two) = (DBuf::from(&[1i32, 8]), DBuf::from(&[2i32]));
    let dst0 = DBuf::<u8>::new(3 * 2 * d * 2);
    ck(varlen(&shared, 0, &two, dst0.vptr()), "varlen, shared list");
    assert_eq!(cu.download(), vec![0, 2, 4, 6]);
    let got = Dt::F16.decode(&dst0.download());
    for h in 0..heads {
        for (t, src) in [1usize, 8].into_iter().enumerate() {
            for c in 0..d {
                assert_eq!(
                    got[(2 * h + t) * d + c],
                    at(&x.vals, h, src, c),
                    "shared h{h} t{t} c{c}"
                );
            }
        }
    }
    // in place
    ck(compact(&kd, 4, wsz), "compact");
    let y = x.read_back();
    for h in 0..heads {
        for t in 0..n {
            for c in 0..d {
                let src = if t < counts[h] as usize {
                    kept[h * 4 + t] as usize
                } else {
                    t
                };
                assert_eq!(
                    at(&y, h, t, c),
                    at(&x.vals, h, src, c),
                    "in place h{h} t{t} c{c}"
                );
            }
        }
    }
}
