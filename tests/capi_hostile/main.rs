//! Hostile input through the C ABI, called from Rust: every class returns its documented
//! status and leaves canary-filled caller buffers untouched. One module per group of entry
//! points: `classes` (the scorer, selection and compaction entry points, one test per class of
//! hostile input), `search` (`kve_search_*`, shards), `cuda` (the device entry points without
//! CUDA), `stream` (`kve_stream_*`, the selection's size queries).

use kvevict::capi::*;
use std::ffi::{c_void, CStr};
use std::ptr::{null, null_mut};

#[macro_use]
#[path = "../capi_common/mod.rs"]
mod capi_common;
use capi_common::*;

mod classes;
mod cuda;
mod quantized;
mod search;
mod stream;

#[test]
fn baseline_is_ok() {
    let mut l = Layer::new();
    let inp = l.inputs();
    expect!(l.score(&score_params(0), &inp), KVE_OK);
    assert!(l.out.iter().all(|x| x.is_finite() && *x >= 0.0));
}

#[test]
fn status_strings() {
    for &(code, n, m) in STATUSES {
        assert_eq!(name(code), n.trim_end_matches('\0'));
        let msg = unsafe { CStr::from_ptr(kve_status_message(code)) }
            .to_str()
            .unwrap();
        assert_eq!(msg, m.trim_end_matches('\0'));
        assert!(!msg.is_empty());
    }
    assert_eq!(name(-1), "KVE_UNKNOWN_STATUS");
    assert_eq!(name(i32::MAX), "KVE_UNKNOWN_STATUS");
    // core messages and the C table agree
    use kvevict::Error;
    for e in [
        Error::NullPointer,
        Error::Aliasing,
        Error::NonFinite,
        Error::ShapeMismatch,
    ] {
        let code = status_of(e);
        let msg = unsafe { CStr::from_ptr(kve_status_message(code)) }
            .to_str()
            .unwrap();
        assert_eq!(msg, e.message());
    }
    assert_eq!(
        kve_version(),
        KVE_VERSION_MAJOR * 10000 + KVE_VERSION_MINOR * 100 + KVE_VERSION_PATCH
    );
    let v = unsafe { CStr::from_ptr(kve_version_string()) }
        .to_str()
        .unwrap();
    assert_eq!(v, env!("CARGO_PKG_VERSION"));
}
