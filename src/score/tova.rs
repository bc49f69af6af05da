//! TOVA (SPEC §3): the last query's attention (w = 1), mean over every query head of the
//! layer; the same score for every KV head.
use super::Bufs;

pub(super) fn accumulate(sum: &[f32], g: usize, hq: usize, p: usize, bufs: &mut Bufs) {
    let inv = 1.0 / hq as f32;
    for a in 0..g {
        for (o, &v) in bufs.tmp_b[..p].iter_mut().zip(&sum[a * p..(a + 1) * p]) {
            *o += v * inv;
        }
    }
}

pub(super) fn finish(bufs: &Bufs, hkv: usize, p: usize, out: &mut [f32]) {
    for kh in 0..hkv {
        out[kh * p..(kh + 1) * p].copy_from_slice(&bufs.tmp_b[..p]);
    }
}
