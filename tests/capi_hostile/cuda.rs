use super::*;

#[test]
fn cuda_entry_points_without_cuda() {
    if cfg!(feature = "cuda") {
        return;
    }
    // (kve_cuda_get_device_count: tests/capi_contract.rs)
    let mut b = 0u64;
    let statuses = unsafe {
        [
            kve_cuda_score_layer(null(), null(), null_mut(), 0, null_mut(), 0, null_mut()),
            kve_cuda_select_model(
                null(),
                null(),
                null_mut(),
                0,
                null_mut(),
                0,
                0,
                null_mut(),
                0,
                null_mut(),
            ),
            kve_cuda_compact_in_place(null(), null(), 0, null(), 0, null_mut(), 0, null_mut()),
            kve_cuda_compact_to_varlen(
                null(),
                null(),
                0,
                null(),
                null_mut(),
                null_mut(),
                null_mut(),
            ),
            kve_cuda_compact_batch_in_place_workspace_size(null(), 0, 0, &mut b),
            kve_cuda_compact_batch_in_place(null(), 0, 0, null_mut(), 0, null_mut()),
            kve_cuda_prepare_gram_size(0, 0, 0, &mut b),
            kve_cuda_prepare_gram(null(), 0, 0, 0, null_mut(), 0, null_mut()),
            kve_cuda_score_layer_prepared(
                null(),
                null(),
                null(),
                0,
                0,
                null_mut(),
                0,
                null_mut(),
                0,
                null_mut(),
            ),
        ]
    };
    for (k, st) in statuses.into_iter().enumerate() {
        assert_eq!(
            name(st),
            name(KVE_ERR_NOT_BUILT_WITH_CUDA),
            "entry point {k}"
        );
    }
    assert_eq!(b, 0, "a stub wrote");
}
