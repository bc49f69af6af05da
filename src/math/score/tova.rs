//! TOVA (design §3): the last query's attention (w = 1), mean over every query head of the
//! layer; the same score for every KV head.
//!
//! With one window row per query head, the shared window pass ([`crate::window`]) fills
//! at most `g` of each vector's 8 lanes (window rows in lanes) and spends a scalar
//! reduction per key. [`layer`] is that pass laid out for w = 1, reading each key's row in
//! place (f16 converted as loaded) once per KV group for up to 4 heads at a time, each
//! logit summed in the lane order of [`crate::lanes`] (16 elements per FMA, no transpose;
//! the same on AVX-512, AVX2 and the portable kernels). Only the logits' rounding differs
//! from the window pass (its FMA chain runs over `d` in order); the rest is its arithmetic:
//! the same per-chunk max, exp sums in key order from +0 and f64 denominator updates
//! ([`window::fold_row`]), the same probabilities and order of the sum over heads. With a
//! `row_lse`, or when the workspace cannot hold the logits, TOVA takes the window pass.
use super::Bufs;
use crate::error::{Error, Result};
use crate::lanes::dots8;
#[cfg(not(all(feature = "std", target_arch = "x86_64", kvevict_avx512)))]
use crate::numerics::dispatch as dispatch_wide;
use crate::numerics::Simd;
#[cfg(all(feature = "std", target_arch = "x86_64", kvevict_avx512))]
use crate::simd512::dispatch_wide;
use crate::view::{load_rows, DType, View};
use crate::window::{self, CHUNK};
use crate::workspace::Workspace;

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

/// Scratch of [`layer`]: one group's scaled queries `[g][dk]`, its logits `[g][zld]`, a
/// chunk of keys converted to f32 `[CHUNK][dk]` (layouts not read in place, and the last
/// keys when they are not a whole block of 8), and where the workspace has room (`g <= 4`
/// in `score_layer`'s) pass 1's exps `[g][zld]`, which pass 2 reuses.
struct Carve<'s> {
    q: &'s mut [f32],
    z: &'s mut [f32],
    k: &'s mut [f32],
    e: Option<&'s mut [f32]>,
    zld: usize,
}

/// The whole TOVA pass: adds `Σ_kh Σ_a A[kh·g + a, last query, t] / hq` into `acc[t]` for the
/// prefix keys `t < N - 1` (zeroed by the caller), in the order of the window pass +
/// [`accumulate`], with `rmax`/`rsum` (`[hq]`) as its row statistics. `Ok(false)`, with
/// nothing done, when `scratch` cannot hold its buffers (the caller then takes the window
/// pass). NaN/Inf queries or keys (or logits that overflow) are `NonFinite`.
pub(super) fn layer(
    queries: &View,
    keys: &View,
    g: usize,
    scratch: &mut [u8],
    rmax: &mut [f32],
    rsum: &mut [f64],
    acc: &mut [f32],
) -> Result<bool> {
    let [hkv, n, dk] = keys.extent();
    // logits rows padded to whole vectors, plus one vector read past the last key
    let zld = n.div_ceil(8) * 8 + 8;
    let mut ws = Workspace::new(scratch);
    let (Ok(q), Ok(z), Ok(k)) = (
        ws.take_dirty::<f32>(g * dk),
        ws.take_dirty::<f32>(g * zld),
        ws.take_dirty::<f32>(CHUNK * dk),
    ) else {
        return Ok(false);
    };
    // pass 1's exps kept for pass 2 where the workspace has room and `since` (below) holds
    // a mark per row
    let e = ws.take_dirty::<f32>(g * zld).ok().filter(|_| g <= MAX_KEPT);
    let mut marks = [0usize; MAX_KEPT];
    let c = &mut Carve { q, z, k, e, zld };
    let wq = queries.extent()[1];
    let scale = 1.0 / libm::sqrtf(dk as f32);
    let inv_hq = 1.0 / (hkv * g) as f32;
    for kh in 0..hkv {
        for a in 0..g {
            let row = &mut c.q[a * dk..(a + 1) * dk];
            queries.load_row(kh * g + a, wq - 1, row);
            for v in row.iter_mut() {
                if !v.is_finite() {
                    return Err(Error::NonFinite);
                }
                *v *= scale;
            }
        }
        // the logits with pass 1 (row statistics) chunk by chunk as they come, then pass 2
        // (probabilities), each its own function
        let (rm, rs) = (
            &mut rmax[kh * g..(kh + 1) * g],
            &mut rsum[kh * g..(kh + 1) * g],
        );
        let mut since = c.e.is_some().then(|| &mut marks[..g]);
        let sn = since.as_deref_mut();
        dispatch_wide!(fn(keys: &View, kh: usize, g: usize, c: &mut Carve, rm: &mut [f32],
                          rs: &mut [f64], sn: Option<&mut [usize]>) -> Result<()>, S => {
            group_logits::<S>(keys, kh, g, c, rm, rs, sn)
        })?;
        let (zr, kept) = (&c.z[..], c.e.as_deref().zip(since.as_deref()));
        dispatch_wide!(fn(zr: &[f32], zld: usize, n: usize, g: usize, rm: &[f32],
                          rs: &[f64], kept: Option<(&[f32], &[usize])>, inv_hq: f32,
                          acc: &mut [f32]) -> (), S => {
            pass2::<S>(zr, zld, n, g, rm, rs, kept, inv_hq, acc)
        });
    }
    Ok(true)
}

/// Rows per KV group whose pass-1 exps [`layer`] keeps (a `since` mark each); larger
/// groups recompute every exp in pass 2.
const MAX_KEPT: usize = 32;

/// The logits of KV group `kh` (its queries in `c.q`) into `c.z`, chunk by chunk, each
/// chunk's pass 1 ([`pass1_chunk`]) right after its logits, while the next keys stream
/// in: the group's row statistics into `rmax`/`rsum` (`[g]`), `since` as [`pass1_chunk`]
/// says. `NonFinite` when a logit is not finite (NaN/Inf keys, or an overflow).
#[inline(always)]
fn group_logits<S: Simd>(
    keys: &View,
    kh: usize,
    g: usize,
    c: &mut Carve,
    rmax: &mut [f32],
    rsum: &mut [f64],
    mut since: Option<&mut [usize]>,
) -> Result<()> {
    assert!(rmax.len() == g && rsum.len() == g);
    assert!(since.as_ref().map_or(true, |s| s.len() == g) && since.is_some() == c.e.is_some());
    rmax.fill(f32::NEG_INFINITY);
    rsum.fill(0.0);
    let [_, n, dk] = keys.extent();
    let st = keys.stride();
    let zld = c.zld;
    // rows read in place: f32 or f16 with unit element stride
    let dt = keys.dtype();
    let direct = st[2] == 1 && (dt == DType::F32 || dt == DType::F16);
    let es = dt.size();
    // SAFETY (pointer arithmetic only): head kh's first element, inside the view.
    let base = (keys.byte_range().0 as *const u8).wrapping_add(kh * st[0] * es);
    // SAFETY: `S`'s CPU features are present (our dispatch); every key block read is inside
    // the view (keys c0..c0+nt < n, rows `st[1]` apart) or inside `c.k`, every logit written
    // inside `c.z` (row a: zld >= n rounded up to 8, plus 8).
    unsafe {
        #[allow(unused_mut)]
        let (mut bad, mut ok) = (S::zero(), true);
        let mut c0 = 0;
        while c0 < n {
            let nt = CHUNK.min(n - c0);
            let nt8 = nt / 8 * 8;
            let z = c.z.as_mut_ptr().add(c0);
            let q = c.q.as_ptr();
            if direct {
                let k = base.wrapping_add(c0 * st[1] * es);
                // 16 keys per vector where the CPU has AVX-512 (the same bits)
                #[allow(unused_mut)]
                let mut t = 0;
                #[cfg(all(feature = "std", target_arch = "x86_64", kvevict_avx512))]
                if S::AVX2 && dk % 16 == 0 && crate::gemm512::available() {
                    let nt16 = nt / 16 * 16;
                    use crate::tova512::logits as wide;
                    ok &= if dt == DType::F16 {
                        wide::<true>(k, st[1], dk, q, g, z, zld, nt16)
                    } else {
                        wide::<false>(k, st[1], dk, q, g, z, zld, nt16)
                    };
                    t = nt16;
                }
                let (kt, zt) = (k.wrapping_add(t * st[1] * es), z.add(t));
                if dt == DType::F16 {
                    logits::<S, true>(kt, st[1], dk, q, g, zt, zld, nt8 - t, &mut bad);
                } else {
                    logits::<S, false>(kt, st[1], dk, q, g, zt, zld, nt8 - t, &mut bad);
                }
            }
            // other layouts (and the last keys short of a block of 8) as f32 rows in `c.k`,
            // zero rows up to the block's end
            let t0 = if direct { nt8 } else { 0 };
            if t0 < nt {
                let kb = &mut c.k[..(nt - t0).div_ceil(8) * 8 * dk];
                load_rows::<S>(keys, kh, c0 + t0, nt - t0, kb);
                kb[(nt - t0) * dk..].fill(0.0);
                let kp = kb.as_ptr() as *const u8;
                let len = kb.len() / dk;
                logits::<S, false>(kp, dk, dk, q, g, z.add(t0), zld, len, &mut bad);
            }
            // a non-finite logit can make pass 1 fail early: NonFinite all the same
            let kept = c.e.as_deref_mut().zip(since.as_deref_mut());
            pass1_chunk::<S>(&c.z[..], zld, c0, nt, rmax, rsum, kept)?;
            c0 += nt;
        }
        if !ok || S::hsum(bad) != 0.0 {
            // a NaN/Inf key (or an overflowing logit), found through its logits
            return Err(Error::NonFinite);
        }
    }
    if rsum.iter().any(|s| !s.is_finite() || *s <= 0.0) {
        return Err(Error::NonFinite);
    }
    Ok(())
}

/// Pass 1 of the chunk of keys `c0 .. c0 + nt` for the `g` logit rows at `z` (`zld` apart,
/// `rmax.len()` rows), as the window pass does it: the running max, then the sum of the
/// chunk's exps in 8 lanes (lane t mod 8 in key order from +0, then `S::hsum`'s tree),
/// folded into `rmax`/`rsum` ([`window::fold_row`]). With `kept = (e, since)`, the exps go
/// to `e` too, and `since[a]` becomes `c0` when row `a`'s running max rises in this chunk:
/// after the last chunk, every exp from key `since[a]` on is `exp(z − final max)`, pass
/// 2's own value. Rows four at a time, each row's operations in the order above (the rows'
/// chains interleave).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn pass1_chunk<S: Simd>(
    z: &[f32],
    zld: usize,
    c0: usize,
    nt: usize,
    rmax: &mut [f32],
    rsum: &mut [f64],
    mut kept: Option<(&mut [f32], &mut [usize])>,
) -> Result<()> {
    let g = rmax.len();
    assert!(g >= 1 && rsum.len() == g && nt >= 1);
    let end = (g - 1) * zld + (c0 + nt).div_ceil(8) * 8;
    assert!(
        z.len() >= end
            && kept
                .as_ref()
                .map_or(true, |(e, s)| e.len() >= end && s.len() == g)
    );
    let mut a0 = 0;
    while a0 < g {
        let zr = &z[a0 * zld..];
        let k = kept
            .as_mut()
            .map(|(e, s)| (&mut e[a0 * zld..], &mut s[a0..]));
        let (rm, rs) = (&mut rmax[a0..], &mut rsum[a0..]);
        // SAFETY: `S`'s CPU features are present (our callers' dispatch); rows a0 .. a0 + R
        // exist (R <= g - a0) and their vectors up to c0 + nt rounded up to 8 are inside `z`
        // (`e`) (asserted above)
        unsafe {
            match (g - a0).min(4) {
                4 => chunk_rows::<S, 4>(zr, zld, c0, nt, rm, rs, k)?,
                3 => chunk_rows::<S, 3>(zr, zld, c0, nt, rm, rs, k)?,
                2 => chunk_rows::<S, 2>(zr, zld, c0, nt, rm, rs, k)?,
                _ => chunk_rows::<S, 1>(zr, zld, c0, nt, rm, rs, k)?,
            }
        }
        a0 += 4;
    }
    Ok(())
}

/// [`pass1_chunk`] for the first `R` rows at `z`, side by side.
///
/// # Safety
/// `S`'s CPU features are present; `z` (and `kept`'s `e`) hold `R` rows `zld` apart with
/// their vectors up to `c0 + nt` rounded up to 8; `rmax`, `rsum` (and `since`) at least `R`
/// entries.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn chunk_rows<S: Simd, const R: usize>(
    z: &[f32],
    zld: usize,
    c0: usize,
    nt: usize,
    rmax: &mut [f32],
    rsum: &mut [f64],
    mut kept: Option<(&mut [f32], &mut [usize])>,
) -> Result<()> {
    let nt8 = nt / 8 * 8;
    // SAFETY: this fn's contract: every vector read (written) is below c0 + nt rounded up
    // to 8 in one of the R rows
    unsafe {
        let zr: [*const f32; R] = core::array::from_fn(|a| z.as_ptr().add(a * zld + c0));
        let er: Option<[*mut f32; R]> = kept
            .as_mut()
            .map(|(e, _)| core::array::from_fn(|a| e.as_mut_ptr().add(a * zld + c0)));
        let mut mv = [S::splat(f32::NEG_INFINITY); R];
        let mut t = 0;
        while t < nt8 {
            for a in 0..R {
                mv[a] = S::max(mv[a], S::load(zr[a].add(t)));
            }
            t += 8;
        }
        let mut m = [0f32; R];
        let mut lanes = [0f32; 8];
        for a in 0..R {
            S::store(lanes.as_mut_ptr(), mv[a]);
            let mut ma = rmax[a];
            let rest = core::slice::from_raw_parts(zr[a].add(nt8), nt - nt8);
            for &x in lanes.iter().chain(rest) {
                if x > ma {
                    ma = x;
                }
            }
            if let Some((_, since)) = kept.as_mut() {
                if ma > rmax[a] {
                    since[a] = c0;
                }
            }
            m[a] = ma;
        }
        let mv: [S::V; R] = core::array::from_fn(|a| S::splat(m[a]));
        let mut sv = [S::zero(); R];
        let mut t = 0;
        while t < nt {
            for a in 0..R {
                // four vectors (those from `nt` on are zeros, unused)
                let mut x = [S::zero(); 4];
                for (i, x) in x.iter_mut().enumerate() {
                    if t + 8 * i < nt {
                        *x = S::sub(S::load(zr[a].add(t + 8 * i)), mv[a]);
                    }
                }
                for (i, v) in S::exp_neg4(x).into_iter().enumerate() {
                    let t8 = t + 8 * i;
                    if let Some(er) = er {
                        if t8 < nt {
                            S::store(er[a].add(t8), v);
                        }
                    }
                    if t8 + 8 <= nt {
                        sv[a] = S::add(sv[a], v);
                    } else if t8 < nt {
                        // lanes past `nt` (the zero keys' logits) left out: +0 adds exactly
                        S::store(lanes.as_mut_ptr(), v);
                        lanes[nt - t8..].fill(0.0);
                        sv[a] = S::add(sv[a], S::load(lanes.as_ptr()));
                    }
                }
            }
            t += 32;
        }
        for a in 0..R {
            window::fold_row(&mut rmax[a], &mut rsum[a], m[a], S::hsum(sv[a]))?;
        }
    }
    Ok(())
}

/// Pass 2: the probabilities of the prefix keys `t < n − 1` of the `r` rows at `z`, added
/// row by row into `acc` (`exp(z − rmax)·(1/rsum)·inv_hq`); with `kept = (e, since)`, from
/// key `since[a]` on the exp is pass 1's, read from `e` (the same bits), before it (and
/// without `kept`, everywhere) recomputed.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn pass2<S: Simd>(
    z: &[f32],
    zld: usize,
    n: usize,
    r: usize,
    rmax: &[f32],
    rsum: &[f64],
    kept: Option<(&[f32], &[usize])>,
    inv_hq: f32,
    acc: &mut [f32],
) {
    let p = n - 1;
    assert!(r >= 1 && r <= rmax.len() && r <= rsum.len() && acc.len() >= p);
    assert!(z.len() >= (r - 1) * zld + n.div_ceil(8) * 8);
    if let Some((e, since)) = kept {
        assert!(e.len() >= (r - 1) * zld + n.div_ceil(8) * 8 && since.len() >= r);
    }
    let p32 = p / 32 * 32;
    // SAFETY: `S`'s CPU features are present (our dispatch); reads of row a at t < p rounded
    // up to 8 (inside `z`, and `e` from `since[a]` on, only with `kept`), writes of
    // `acc` below p32 (whole vectors) or through `tail`; `zr`/`er` entries past `rr` unread
    unsafe {
        let ih = S::splat(inv_hq);
        // rows 8 at a time; each block of 32 keys takes their terms in row order while its
        // sums stay in registers (one read and write of `acc` per 8 rows): per key, every
        // row's term is added in row order, as one row after the other
        let mut a0 = 0;
        while a0 < r {
            let rr = (r - a0).min(8);
            let mut mv = [S::zero(); 8];
            let mut iv = [S::zero(); 8];
            let mut zr = [z.as_ptr(); 8];
            let mut er = [z.as_ptr(); 8];
            let mut from = [0usize; 8];
            for i in 0..rr {
                let a = a0 + i;
                (mv[i], iv[i]) = (S::splat(rmax[a]), S::splat((1.0 / rsum[a]) as f32));
                zr[i] = z.as_ptr().add(a * zld);
                // keys from `from` on: pass 1's exps (`since` is a multiple of 32); all
                // recomputed without them
                (er[i], from[i]) = match kept {
                    Some((e, since)) => (e.as_ptr().add(a * zld), since[a].min(p32)),
                    None => (zr[i], p32),
                };
            }
            let mut t = 0;
            while t < p32 {
                let o = acc.as_mut_ptr().add(t);
                let mut s: [S::V; 4] = core::array::from_fn(|j| S::load(o.add(8 * j)));
                for i in 0..rr {
                    let e = if t < from[i] {
                        let mut x = [S::zero(); 4];
                        for (j, x) in x.iter_mut().enumerate() {
                            *x = S::min(S::sub(S::load(zr[i].add(t + 8 * j)), mv[i]), S::zero());
                        }
                        S::exp_neg4(x)
                    } else {
                        core::array::from_fn(|j| S::load(er[i].add(t + 8 * j)))
                    };
                    for (s, e) in s.iter_mut().zip(e) {
                        *s = S::add(*s, S::mul(S::mul(e, iv[i]), ih));
                    }
                }
                for (j, s) in s.into_iter().enumerate() {
                    S::store(o.add(8 * j), s);
                }
                t += 32;
            }
            for i in 0..rr {
                let (mv, iv, zr) = (mv[i], iv[i], zr[i]);
                let mut t = p32;
                // the rest 8 at a time, the last keys through a copy of their 8 sums
                while t < p {
                    let mut tail = [0f32; 8];
                    let r = (p - t).min(8);
                    tail[..r].copy_from_slice(&acc[t..t + r]);
                    let (o, x) = (tail.as_mut_ptr(), S::load(zr.add(t)));
                    let pr = S::mul(S::exp_neg(S::min(S::sub(x, mv), S::zero())), iv);
                    S::store(o, S::add(S::load(o), S::mul(pr, ih)));
                    acc[t..t + r].copy_from_slice(&tail[..r]);
                    t += 8;
                }
            }
            a0 += 8;
        }
    }
}

/// Logits `z[a][t] = Σ_d k[t][d]·q[a][d]` (FMAs in the lane order of [`crate::lanes`]) for
/// rows `a < g` and the `nt8` (a multiple of 8) keys at `k` (`ld` elements apart; f16 when
/// `F16`), 8 keys per [`dots8`]; `bad` gains a NaN lane when a logit is not finite.
///
/// # Safety
/// `k` must hold `nt8` readable rows of `dk` elements, `q` `g` rows of `dk` floats, and `z`
/// `g` rows of `nt8` writable floats, `zld` apart.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn logits<S: Simd, const F16: bool>(
    k: *const u8,
    ld: usize,
    dk: usize,
    q: *const f32,
    g: usize,
    z: *mut f32,
    zld: usize,
    nt8: usize,
    bad: &mut S::V,
) {
    let es = if F16 { 2 } else { 4 };
    // SAFETY: this fn's contract; each call below covers keys t .. t+8·B (<= nt8) and
    // rows a0 .. a0+RA (<= g)
    unsafe {
        let mut a0 = 0;
        while a0 < g {
            let (qa, za) = (q.add(a0 * dk), z.add(a0 * zld));
            let mut t = 0;
            macro_rules! blocks {
                ($b:literal, $ra:literal) => {{
                    for i in 0..$b {
                        let (kb, zb) = (k.add((t + 8 * i) * ld * es), za.add(t + 8 * i));
                        for v in dots8::<S, $ra, F16>(kb, ld, dk, qa, zb, zld) {
                            *bad = S::fma(v, S::zero(), *bad);
                        }
                    }
                }};
            }
            // one sweep over the keys for `$ra` rows: 16 keys at a time, then 8
            macro_rules! sweep {
                ($ra:literal) => {{
                    while t + 16 <= nt8 {
                        blocks!(2, $ra);
                        t += 16;
                    }
                    if t < nt8 {
                        blocks!(1, $ra);
                    }
                }};
            }
            // up to 4 rows per sweep
            match (g - a0).min(4) {
                4 => sweep!(4),
                3 => sweep!(3),
                2 => sweep!(2),
                _ => sweep!(1),
            }
            a0 += 4;
        }
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use crate::lanes::tests::KeyLayouts;
    use crate::window::tests::vals;
    use crate::window::{one_pass, one_pass_ready, one_pass_size, scratch_size, Needs, Stats};
    use crate::workspace::WorkspaceSize;
    use std::format;
    use std::vec;

    /// [`layer`] against the window pass it replaces (one pass per group, then
    /// [`accumulate`]): the same row statistics and sums up to the logits' rounding (bits:
    /// `logits_follow_lane_order`), for f32 / f16 / bf16 keys,
    /// head-major and token-row layouts, 1 to 6 heads per group, dims that are not whole
    /// vectors, and N around the block and chunk sizes.
    #[test]
    fn layer_matches_window_pass() {
        let shapes = [
            (2, 3, 64, 777),
            (1, 4, 128, 200),
            (3, 1, 20, 97),
            (1, 6, 16, 33),
            (2, 5, 24, 2),
            (1, 2, 72, 101),
            (1, 4, 40, 96 * 3 + 31),
        ];
        for (i, &(hkv, g, dk, n)) in shapes.iter().enumerate() {
            let (hq, wq, p) = (hkv * g, 3, n - 1);
            let qv = vals(hq * wq * dk, 7 + i as u64, 1.0);
            let kv = vals(hkv * n * dk, 99 + i as u64, 2.5);
            let keys = KeyLayouts::new(kv, hkv, n, dk);
            let q = View::f32(&qv, [hq, wq, dk], [wq * dk, dk, 1]).unwrap();
            let views = keys.views();
            for (vi, k) in views.iter().enumerate() {
                let mut sz = WorkspaceSize::new();
                scratch_size(&mut sz, g, 1, dk).unwrap();
                one_pass_size(&mut sz, g, 1, n).unwrap();
                let mut scratch = vec![0xA5u8; sz.total()];
                // the window pass, group by group, into TOVA's sums
                let (mut rm0, mut rs0) = (vec![0f32; hq], vec![0f64; hq]);
                let (mut ta, mut tb) = (vec![0f32; p], vec![0f32; p]);
                let (mut acc, mut row) = (vec![0f32; p.max(hkv)], vec![0f32; dk]);
                let mut bufs = Bufs {
                    tmp_a: &mut ta,
                    tmp_b: &mut tb,
                    acc: &mut acc,
                    row: &mut row,
                };
                let needs = Needs {
                    sum: true,
                    sq: false,
                    cross: false,
                };
                for kh in 0..hkv {
                    let mut sum = vec![0f32; g * p];
                    let mut st = Stats {
                        sum: &mut sum,
                        sq: &mut [],
                        cross: &mut [],
                    };
                    assert!(one_pass_ready(&q, k, kh, g, 1, &mut scratch).unwrap());
                    let (rm, rs) = (&mut rm0[kh * g..], &mut rs0[kh * g..]);
                    one_pass(&q, k, kh, g, 1, rm, rs, needs, &mut scratch, &mut st).unwrap();
                    accumulate(&sum, g, hq, p, &mut bufs);
                }
                // TOVA's own pass
                let (mut rm1, mut rs1, mut out) = (vec![0f32; hq], vec![0f64; hq], vec![0f32; p]);
                assert!(layer(&q, k, g, &mut scratch, &mut rm1, &mut rs1, &mut out).unwrap());
                // the logits' rounding differs (lane order vs the window pass's chain over d)
                let what = format!("shape {i} view {vi}");
                let close = |a: f64, b: f64, tol: f64| (a - b).abs() <= tol * b.abs().max(1.0);
                for h in 0..hq {
                    assert!(close(rm1[h] as f64, rm0[h] as f64, 1e-6), "row max, {what}");
                    assert!(close(rs1[h], rs0[h], 1e-5), "row denominators, {what}");
                }
                let top = bufs.tmp_b.iter().fold(0f32, |m, &x| m.max(x)) as f64;
                for (a, b) in out.iter().zip(bufs.tmp_b.iter()) {
                    assert!(
                        (*a as f64 - *b as f64).abs() <= 1e-5 * top,
                        "scores, {what}"
                    );
                }
                assert!(out.iter().any(|&x| x > 0.0), "{what}");
            }
        }
    }

    /// The logits of every path against the lane order ([`crate::lanes`]), bit for bit: the
    /// 8-lane kernels (AVX2 fused, portable) and AVX-512 (dims in whole chunks of 16), f32 and
    /// f16 rows `ld` apart, 1 to 4 query rows, dims and key counts that are not whole chunks
    /// or blocks of 16 (the AVX-512 kernel takes the whole blocks, as in `group`).
    #[test]
    fn logits_follow_lane_order() {
        use crate::lanes::tests::{dot, f16_rows, spread};
        fn run<S: Simd>(fused: bool, wide: bool) {
            for &(g, dk, nt) in &[
                (4, 128, 40),
                (3, 64, 24),
                (1, 16, 8),
                (2, 20, 16),
                (4, 7, 8),
            ] {
                let ld = dk + 5;
                let kv = spread(nt * ld, (g * dk + nt) as u64);
                let (k16, k16f) = f16_rows(&kv);
                let q = spread(g * dk, 3 + dk as u64);
                for f16 in [false, true] {
                    let zld = nt + 3;
                    let mut z = vec![f32::NAN; g * zld];
                    let (kp, rows) = if f16 {
                        (k16.as_ptr() as *const u8, &k16f)
                    } else {
                        (kv.as_ptr() as *const u8, &kv)
                    };
                    #[allow(unused_mut)]
                    let mut t = 0;
                    // SAFETY: the caller runs with S's features
                    let mut bad = unsafe { S::zero() };
                    // SAFETY: nt rows of dk elements ld apart, g query rows, g rows of z of
                    // nt floats zld apart; the caller runs with S's features (and AVX-512
                    // F + VL when `wide`)
                    unsafe {
                        #[cfg(all(target_arch = "x86_64", kvevict_avx512))]
                        if wide && dk % 16 == 0 {
                            t = nt / 16 * 16;
                            let logits512 = if f16 {
                                crate::tova512::logits::<true>
                            } else {
                                crate::tova512::logits::<false>
                            };
                            assert!(logits512(kp, ld, dk, q.as_ptr(), g, z.as_mut_ptr(), zld, t));
                        }
                        let (kt, zt) = (
                            kp.add(t * ld * if f16 { 2 } else { 4 }),
                            z.as_mut_ptr().add(t),
                        );
                        if f16 {
                            logits::<S, true>(kt, ld, dk, q.as_ptr(), g, zt, zld, nt - t, &mut bad);
                        } else {
                            logits::<S, false>(
                                kt,
                                ld,
                                dk,
                                q.as_ptr(),
                                g,
                                zt,
                                zld,
                                nt - t,
                                &mut bad,
                            );
                        }
                        assert_eq!(S::hsum(bad), 0.0);
                    }
                    let _ = wide;
                    for a in 0..g {
                        for t in 0..nt {
                            let want =
                                dot(&rows[t * ld..t * ld + dk], &q[a * dk..(a + 1) * dk], fused);
                            let what =
                                format!("g {g} dk {dk} f16 {f16} wide {wide} row {a} key {t}");
                            assert_eq!(z[a * zld + t].to_bits(), want.to_bits(), "{what}");
                        }
                    }
                }
            }
        }
        run::<crate::numerics::Portable>(false, false);
        crate::numerics::on_vector_builds!(S => { run::<S>(true, false) });
        #[cfg(all(target_arch = "x86_64", kvevict_avx512))]
        if crate::numerics::has_avx2() && crate::gemm512::available() {
            #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
            unsafe fn avx512() {
                run::<crate::numerics::Avx2>(true, true)
            }
            // SAFETY: the CPU has AVX-512 F + VL, AVX2, FMA and F16C (checked just above)
            unsafe { avx512() };
        }
    }

    /// A NaN key, a NaN query or an infinite key element is `NonFinite`.
    #[test]
    fn layer_rejects_non_finite() {
        let (g, dk, n) = (3, 16, 50);
        for (at_q, bad) in [(false, f32::NAN), (false, f32::INFINITY), (true, f32::NAN)] {
            let mut qv = vals(g * dk, 1, 1.0);
            let mut kv = vals(n * dk, 2, 1.0);
            if at_q {
                qv[dk + 3] = bad;
            } else {
                kv[37 * dk + 5] = bad;
            }
            let q = View::f32(&qv, [g, 1, dk], [dk, dk, 1]).unwrap();
            let k = View::f32(&kv, [1, n, dk], [n * dk, dk, 1]).unwrap();
            let mut sz = WorkspaceSize::new();
            scratch_size(&mut sz, g, 1, dk).unwrap();
            one_pass_size(&mut sz, g, 1, n).unwrap();
            let mut scratch = vec![0u8; sz.total()];
            let (mut rm, mut rs, mut out) = (vec![0f32; g], vec![0f64; g], vec![0f32; n - 1]);
            let r = layer(&q, &k, g, &mut scratch, &mut rm, &mut rs, &mut out);
            assert_eq!(r, Err(Error::NonFinite), "query {at_q}, {bad}");
        }
    }
}
