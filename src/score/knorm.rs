//! KNorm (SPEC §3): `-||K[kh,i]||_2`, no queries needed.
use super::Bufs;
use crate::view::View;

pub(super) fn keys_finite(keys: &View, bufs: &mut Bufs) -> bool {
    let [hkv, n, dk] = keys.extent();
    for kh in 0..hkv {
        for t in 0..n {
            keys.load_row(kh, t, bufs.row);
            if bufs.row[..dk].iter().any(|v| !v.is_finite()) {
                return false;
            }
        }
    }
    true
}

pub(super) fn score(keys: &View, kh: usize, bufs: &mut Bufs, dst: &mut [f32]) {
    let dk = keys.extent()[2];
    for (t, v) in dst.iter_mut().enumerate() {
        keys.load_row(kh, t, bufs.row);
        let s: f32 = bufs.row[..dk].iter().map(|x| x * x).sum();
        *v = -libm::sqrtf(s);
    }
}
