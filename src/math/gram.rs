//! LaProx's value-output norms without forming `V·Wo` (design §3): per-head Gram matrices
//! `G_ab = Wo_a Wo_bᵀ` (`[dv, dv]`, once per model) and per-token quadratic forms
//! `v G_ab vᵀ = (v Wo_a)·(v Wo_b)`, which an engine may cache when a token enters the cache.
//! CriticalKV's L1 norms `||v Wo_h||_1` cannot come from a Gram matrix and use `Wo` itself.
//!
//! Layouts: Gram `[Hkv][blocks][dv][dv]`, value forms `[Hkv][blocks][N]`, where
//! `blocks = g` (the diagonal `(a,a)`) or, with `cross`, `g + g(g-1)/2` (the diagonal,
//! then pairs `a < b` in order). The diagonal part is identical in both layouts.

use crate::error::{mul, Error, Result};
use crate::numerics::{all_finite, dispatch, Simd};
use crate::view::{load_rows, DType, View};
use crate::workspace::{Workspace, WorkspaceSize};

/// Blocks per KV head.
pub fn blocks(g: usize, cross: bool) -> usize {
    if cross {
        g + g * (g - 1) / 2
    } else {
        g
    }
}

/// (a, b) of block `k` of a group of `g`: the diagonal blocks first, then `a < b` in row
/// order (the layout of the Gram blocks and value forms; the kernels' too).
pub fn block_pair(g: usize, k: usize) -> (usize, usize) {
    if k < g {
        return (k, k);
    }
    let mut k = k - g;
    for a in 0..g {
        let row = g - a - 1;
        if k < row {
            return (a, a + 1 + k);
        }
        k -= row;
    }
    (0, 0)
}

fn group_of(hq: usize, hkv: usize) -> Result<usize> {
    if hq == 0 || hkv == 0 || hq % hkv != 0 {
        return Err(Error::ShapeMismatch);
    }
    Ok(hq / hkv)
}

/// f32 elements of the Gram output.
pub fn gram_len(hq: usize, hkv: usize, dv: usize, cross: bool) -> Result<usize> {
    let g = group_of(hq, hkv)?;
    mul(mul(hkv, blocks(g, cross))?, mul(dv, dv)?)
}

/// Workspace bytes of [`compute_gram`]: two heads of `Wo` as f32.
pub fn gram_workspace_size(dv: usize, d_model: usize) -> Result<usize> {
    let mut ws = WorkspaceSize::new();
    ws.add::<f32>(mul(dv, d_model)?)?;
    ws.add::<f32>(mul(dv, d_model)?)?;
    Ok(ws.total())
}

/// `wo` is `[Hq, dv, D]` (head, row, col): `Wo_h[r][c]`. For PyTorch's `o_proj.weight`
/// (`[D, Hq·dv]`, row-major) use strides `[dv, 1, Hq·dv]`. Sums in f64 in a fixed lane
/// order ([`dot64`]), the same bits on every build (once per model).
pub fn compute_gram(
    wo: &View,
    hkv: usize,
    cross: bool,
    out: &mut [f32],
    workspace: &mut [u8],
) -> Result<()> {
    let [hq, dv, dm] = wo.extent();
    let g = group_of(hq, hkv)?;
    let nb = blocks(g, cross);
    let len = gram_len(hq, hkv, dv, cross)?;
    if out.len() < len {
        return Err(Error::OutputTooSmall);
    }
    if workspace.len() < gram_workspace_size(dv, dm)? {
        return Err(Error::WorkspaceTooSmall);
    }
    let mut ws = Workspace::new(workspace);
    let wa = ws.take::<f32>(dv * dm)?;
    let wb = ws.take::<f32>(dv * dm)?;
    // validate everything before writing: finite rows, then finite results
    let mut largest = 0f64;
    for h in 0..hq {
        load_head(wo, h, wa);
        if wa.iter().any(|v| !v.is_finite()) {
            return Err(Error::NonFinite);
        }
        for r in 0..dv {
            let row = &wa[r * dm..(r + 1) * dm];
            // the diagonal entry itself, computed as the pass below computes it
            let d = dot64(row, row);
            if !(d as f32).is_finite() {
                return Err(Error::NonFinite);
            }
            largest = largest.max(d);
        }
    }
    // |x·y| <= max(x·x, y·y) up to f64 rounding (relative 2^-10 for D <= 2^40): below
    // that margin every entry fits f32; above it, compute each entry once to be sure
    if dm as u64 > 1u64 << 40 || largest * (1.0 + 1.0 / 1024.0) > f32::MAX as f64 {
        let all_finite = for_each_entry(wo, hkv, g, nb, wa, wb, &mut |_, v| v.is_finite());
        if !all_finite {
            return Err(Error::NonFinite);
        }
    }
    for_each_entry(wo, hkv, g, nb, wa, wb, &mut |i, v| {
        out[i] = v;
        true
    });
    // the lower triangle of a diagonal block mirrors its upper triangle
    for kh in 0..hkv {
        for k in 0..g {
            let blk = &mut out[((kh * nb + k) * dv * dv)..((kh * nb + k + 1) * dv * dv)];
            for r in 0..dv {
                for c in 0..r {
                    blk[r * dv + c] = blk[c * dv + r];
                }
            }
        }
    }
    Ok(())
}

/// Lanes of a Gram entry's f64 sum: lane `j` adds the products `k ≡ j (mod LANES)` in
/// order of `k`, then the lanes add as `(l0 + l2) + (l1 + l3)`. A fixed order, so every
/// build (portable, AVX2) gives the same bits, with independent chains the CPU can overlap.
const LANES: usize = 4;

#[inline(always)]
fn lanes_sum(l: [f64; LANES]) -> f64 {
    (l[0] + l[2]) + (l[1] + l[3])
}

/// One Gram entry `Σ x_k y_k` in f64, in the lane order above.
fn dot64(x: &[f32], y: &[f32]) -> f64 {
    let mut r = [[0f64; 1]; 1];
    dot_tile::<1, 1>([x], [y], &mut r);
    r[0][0]
}

/// `R × C` Gram entries at once (`out[i][j] = x_i · y_j`), each in [`dot64`]'s order: every
/// `x` and `y` chunk is loaded once for `C` (resp. `R`) entries.
#[inline(always)]
fn dot_tile<const R: usize, const C: usize>(
    x: [&[f32]; R],
    y: [&[f32]; C],
    out: &mut [[f64; C]; R],
) {
    let n = x[0].len();
    let mut acc = [[[0f64; LANES]; C]; R];
    let full = n - n % LANES;
    let mut k = 0;
    while k < full {
        let xs: [[f64; LANES]; R] =
            core::array::from_fn(|i| core::array::from_fn(|l| x[i][k + l] as f64));
        let ys: [[f64; LANES]; C] =
            core::array::from_fn(|j| core::array::from_fn(|l| y[j][k + l] as f64));
        for i in 0..R {
            for j in 0..C {
                for l in 0..LANES {
                    acc[i][j][l] += xs[i][l] * ys[j][l];
                }
            }
        }
        k += LANES;
    }
    for (l, k) in (full..n).enumerate() {
        for i in 0..R {
            for j in 0..C {
                acc[i][j][l] += x[i][k] as f64 * y[j][k] as f64;
            }
        }
    }
    for i in 0..R {
        for j in 0..C {
            out[i][j] = lanes_sum(acc[i][j]);
        }
    }
}

/// Head `h` of `wo` as `dv` rows of `dm` f32 into `dst`. PyTorch's `o_proj.weight` and
/// ggml's `attn_output` keep a head's `dv` entries of one output column adjacent (strides
/// `[dv, 1, Hq·dv]`): read in that order (a row would touch a cache line per element).
fn load_head(wo: &View, h: usize, dst: &mut [f32]) {
    let [_, dv, dm] = wo.extent();
    let st = wo.stride();
    if st[2] != 1 && st[1] < st[2] {
        for c in 0..dm {
            for r in 0..dv {
                dst[r * dm + c] = wo.get(h, r, c);
            }
        }
    } else {
        for r in 0..dv {
            wo.load_row(h, r, &mut dst[r * dm..(r + 1) * dm]);
        }
    }
}

/// Every Gram entry the layout computes (a diagonal block's upper triangle, every entry
/// of a cross block) as `f(index into the output, value)`, until `f` returns false.
/// `wa`, `wb` hold two heads of `Wo` (`dv·D` floats each). Returns whether `f` always did.
fn for_each_entry(
    wo: &View,
    hkv: usize,
    g: usize,
    nb: usize,
    wa: &mut [f32],
    wb: &mut [f32],
    f: &mut dyn FnMut(usize, f32) -> bool,
) -> bool {
    let [_, dv, dm] = wo.extent();
    for kh in 0..hkv {
        for k in 0..nb {
            let (a, b) = block_pair(g, k);
            load_head(wo, kh * g + a, wa);
            // a diagonal block pairs a head with itself: loaded once
            let wb: &[f32] = if a == b {
                wa
            } else {
                load_head(wo, kh * g + b, wb);
                wb
            };
            let base = (kh * nb + k) * dv * dv;
            let diag = a == b;
            if !block_entries(
                Block {
                    wa,
                    wb,
                    dv,
                    dm,
                    diag,
                    base,
                },
                f,
            ) {
                return false;
            }
        }
    }
    true
}

/// One Gram block: its two heads' rows of `Wo` (`dv` rows of `dm`), whether it pairs a head
/// with itself (`diag`: its lower triangle is skipped) and its first index in the output.
#[derive(Clone, Copy)]
struct Block<'a> {
    wa: &'a [f32],
    wb: &'a [f32],
    dv: usize,
    dm: usize,
    diag: bool,
    base: usize,
}

/// The entries of one block as `f(index, value)`, in tiles of `TR × TC` entries.
fn block_entries(b: Block, f: &mut dyn FnMut(usize, f32) -> bool) -> bool {
    #[cfg(all(feature = "std", target_arch = "x86_64"))]
    if crate::numerics::has_avx2() {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn fast(b: Block, f: &mut dyn FnMut(usize, f32) -> bool) -> bool {
            // SAFETY: this function only runs where the CPU has AVX2 (checked by the caller).
            block_entries_impl(b, f, |x, y, t| unsafe { dot_tile_avx2(x, y, t) })
        }
        // SAFETY: the CPU has avx2, fma and f16c (checked just above).
        return unsafe { fast(b, f) };
    }
    block_entries_impl(b, f, |x, y, t| dot_tile::<TR, TC>(x, y, t))
}

/// [`dot_tile`] with the `LANES` lanes in one AVX2 register: the same products and sums in
/// the same order per lane, so the same bits.
#[cfg(all(feature = "std", target_arch = "x86_64"))]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_tile_avx2(x: [&[f32]; TR], y: [&[f32]; TC], out: &mut [[f64; TC]; TR]) {
    use core::arch::x86_64::*;
    let n = x[0].len();
    assert!(x.iter().all(|r| r.len() == n) && y.iter().all(|r| r.len() == n));
    let full = n - n % LANES;
    let mut acc = [[_mm256_setzero_pd(); TC]; TR];
    let mut k = 0;
    while k < full {
        // SAFETY: k + LANES <= n for every row (asserted lengths).
        let xs: [__m256d; TR] = core::array::from_fn(|i| unsafe {
            _mm256_cvtps_pd(_mm_loadu_ps(x[i].as_ptr().add(k)))
        });
        // SAFETY: as above.
        let ys: [__m256d; TC] = core::array::from_fn(|j| unsafe {
            _mm256_cvtps_pd(_mm_loadu_ps(y[j].as_ptr().add(k)))
        });
        for i in 0..TR {
            for j in 0..TC {
                acc[i][j] = _mm256_add_pd(acc[i][j], _mm256_mul_pd(xs[i], ys[j]));
            }
        }
        k += LANES;
    }
    for i in 0..TR {
        for j in 0..TC {
            let mut l = [0f64; LANES];
            // SAFETY: `l` holds LANES f64.
            unsafe { _mm256_storeu_pd(l.as_mut_ptr(), acc[i][j]) };
            for (lane, kk) in (full..n).enumerate() {
                l[lane] += x[i][kk] as f64 * y[j][kk] as f64;
            }
            out[i][j] = lanes_sum(l);
        }
    }
}

#[inline(always)]
fn row_of(w: &[f32], dm: usize, r: usize) -> &[f32] {
    &w[r * dm..(r + 1) * dm]
}

const TR: usize = 2;
const TC: usize = 4;

#[inline(always)]
fn block_entries_impl(
    b: Block,
    f: &mut dyn FnMut(usize, f32) -> bool,
    tile: impl Fn([&[f32]; TR], [&[f32]; TC], &mut [[f64; TC]; TR]),
) -> bool {
    let (dv, diag) = (b.dv, b.diag);
    let mut r0 = 0;
    while r0 < dv {
        // rows past the block repeat its last row; their entries are not reported
        let x: [&[f32]; TR] = core::array::from_fn(|i| row_of(b.wa, b.dm, (r0 + i).min(dv - 1)));
        let mut c0 = if diag { r0 - r0 % TC } else { 0 };
        while c0 < dv {
            let y: [&[f32]; TC] =
                core::array::from_fn(|j| row_of(b.wb, b.dm, (c0 + j).min(dv - 1)));
            let mut t = [[0f64; TC]; TR];
            tile(x, y, &mut t);
            for (i, ti) in t.iter().enumerate() {
                for (j, v) in ti.iter().enumerate() {
                    let (r, c) = (r0 + i, c0 + j);
                    if r < dv && c < dv && (!diag || c >= r) && !f(b.base + r * dv + c, *v as f32) {
                        return false;
                    }
                }
            }
            c0 += TC;
        }
        r0 += TR;
    }
    true
}

/// f32 elements of the value-form cache `[Hkv][blocks][N]`.
pub fn value_forms_len(hq: usize, hkv: usize, n: usize, cross: bool) -> Result<usize> {
    let g = group_of(hq, hkv)?;
    mul(mul(hkv, blocks(g, cross))?, n)
}

/// Token rows per quadratic-form tile, and the stack buffer (f32) they are converted into.
const QT: usize = 6;
const QBUF: usize = 1536;
/// f32 stack buffer of token rows loaded at once for the value forms: 64 tokens at dv = 64, so a
/// transposed channel run is read in whole 128-byte pairs of cache lines before the next channel.
const VBUF: usize = 4096;

/// Coefficients of the diagonal 16×16 block in the symmetric form: row `i` counts column
/// `c` twice when `c > i`, once when `c == i`, not when `c < i` (its pair was counted).
const fn diag_masks() -> [[f32; 16]; 16] {
    let mut m = [[0f32; 16]; 16];
    let mut i = 0;
    while i < 16 {
        let mut c = i;
        while c < 16 {
            m[i][c] = if c == i { 1.0 } else { 2.0 };
            c += 1;
        }
        i += 1;
    }
    m
}
static DIAG: [[f32; 16]; 16] = diag_masks();

/// Whether `g` (`[dv][dv]`) equals its transpose. Then `v G vᵀ = Σ_c v_c (G_cc v_c +
/// 2 Σ_{r<c} G_rc v_r)`, half the multiply-adds of the general form.
fn symmetric(g: &[f32], dv: usize) -> bool {
    (0..dv).all(|r| (r + 1..dv).all(|c| g[r * dv + c] == g[c * dv + r]))
}

/// `v_i G v_iᵀ` for the `MT` rows `v_i = v[i*dv..(i+1)*dv]`: `Y = V·G` in column panels of
/// 16 (registers), then the row dot products `Y_i·v_i`. With `sym`, rows below a panel
/// count twice and the panel's diagonal block goes through [`DIAG`].
#[inline(always)]
unsafe fn qf_tile<S: Simd, const MT: usize>(
    v: &[f32],
    dv: usize,
    g: &[f32],
    sym: bool,
) -> [f32; MT] {
    // SAFETY: `S`'s CPU features are present (the `Simd` contract, kept by our callers); every load
    // reads `v[..MT·dv]` or `g[..dv·dv]`, asserted first.
    unsafe {
        assert!(v.len() >= MT * dv && g.len() >= dv * dv);
        let (vp, gp) = (v.as_ptr(), g.as_ptr());
        let full = dv / 16 * 16;
        let mut tot = [S::zero(); MT];
        let mut c0 = 0;
        while c0 < full {
            let mut acc = [[S::zero(); 2]; MT];
            let r_end = if sym { c0 } else { dv };
            for r in 0..r_end {
                let g0 = S::load(gp.add(r * dv + c0));
                let g1 = S::load(gp.add(r * dv + c0 + 8));
                for i in 0..MT {
                    let b = S::splat(*vp.add(i * dv + r));
                    acc[i][0] = S::fma(b, g0, acc[i][0]);
                    acc[i][1] = S::fma(b, g1, acc[i][1]);
                }
            }
            if sym {
                for a in acc.iter_mut() {
                    a[0] = S::add(a[0], a[0]);
                    a[1] = S::add(a[1], a[1]);
                }
                for (rr, m) in DIAG.iter().enumerate() {
                    let r = c0 + rr;
                    let g0 = S::mul(S::load(gp.add(r * dv + c0)), S::load(m.as_ptr()));
                    let g1 = S::mul(S::load(gp.add(r * dv + c0 + 8)), S::load(m.as_ptr().add(8)));
                    for i in 0..MT {
                        let b = S::splat(*vp.add(i * dv + r));
                        acc[i][0] = S::fma(b, g0, acc[i][0]);
                        acc[i][1] = S::fma(b, g1, acc[i][1]);
                    }
                }
            }
            for i in 0..MT {
                tot[i] = S::fma(acc[i][0], S::load(vp.add(i * dv + c0)), tot[i]);
                tot[i] = S::fma(acc[i][1], S::load(vp.add(i * dv + c0 + 8)), tot[i]);
            }
            c0 += 16;
        }
        let mut out = [0f32; MT];
        for i in 0..MT {
            let vi = &v[i * dv..(i + 1) * dv];
            let mut s = S::hsum(tot[i]);
            // columns past the last full panel
            for c in full..dv {
                let y = if sym {
                    let mut y = 0f32;
                    for r in 0..c {
                        y += vi[r] * g[r * dv + c];
                    }
                    2.0 * y + vi[c] * g[c * dv + c]
                } else {
                    let mut y = 0f32;
                    for r in 0..dv {
                        y += vi[r] * g[r * dv + c];
                    }
                    y
                };
                s += y * vi[c];
            }
            out[i] = s;
        }
        out
    }
}

/// `dst[t - t0] = v_t G v_tᵀ` for tokens `t0..t1` of KV head `kh` of `values` (`[Hkv, N, dv]`,
/// `dv <= 1024`), `gblk` one `[dv][dv]` block. f32 accumulation; deterministic.
pub(crate) fn quad_forms(
    values: &View,
    kh: usize,
    gblk: &[f32],
    t0: usize,
    t1: usize,
    dst: &mut [f32],
) {
    dispatch!(fn(values: &View, kh: usize, gblk: &[f32], t0: usize, t1: usize,
                 dst: &mut [f32]) -> (), S => {
        quad_forms_impl::<S>(values, kh, gblk, t0, t1, dst)
    })
}

#[inline(always)]
fn quad_forms_impl<S: Simd>(
    values: &View,
    kh: usize,
    gblk: &[f32],
    t0: usize,
    t1: usize,
    dst: &mut [f32],
) {
    let dv = values.extent()[2];
    assert!(dv <= QBUF && gblk.len() >= dv * dv && dst.len() >= t1 - t0);
    let g = &gblk[..dv * dv];
    let sym = symmetric(g, dv);
    let chunk = chunk_rows(dv);
    let mut buf = [0f32; VBUF];
    let mut t = t0;
    while t < t1 {
        let mt = chunk.min(t1 - t);
        load_value_rows::<S>(values, kh, t, mt, &mut buf);
        forms_of_rows::<S>(&buf[..mt * dv], dv, g, sym, &mut dst[t - t0..t - t0 + mt]);
        t += mt;
    }
}

/// Token rows loaded at once into the `VBUF` stack buffer: a multiple of 8 when it holds 8
/// (the transposed loader's tile).
fn chunk_rows(dv: usize) -> usize {
    let c = (VBUF / dv.max(1)).max(1);
    if c >= 8 {
        c / 8 * 8
    } else {
        c
    }
}

/// `dst[i] = r_i G r_iᵀ` for the rows `r_i = rows[i*dv..(i+1)*dv]`, `QT` rows per tile. Each
/// row's result depends on that row alone, so any chunking of the tokens gives the same bits.
#[inline(always)]
fn forms_of_rows<S: Simd>(rows: &[f32], dv: usize, g: &[f32], sym: bool, dst: &mut [f32]) {
    let m = dst.len();
    assert!(rows.len() >= m * dv);
    let mut i = 0;
    while i < m {
        let mt = QT.min(m - i);
        let r = &rows[i * dv..(i + mt) * dv];
        let o = &mut dst[i..i + mt];
        // SAFETY: r holds mt rows of dv, g is dv×dv (qf_tile asserts both).
        unsafe {
            match mt {
                6 => o.copy_from_slice(&qf_tile::<S, 6>(r, dv, g, sym)),
                5 => o.copy_from_slice(&qf_tile::<S, 5>(r, dv, g, sym)),
                4 => o.copy_from_slice(&qf_tile::<S, 4>(r, dv, g, sym)),
                3 => o.copy_from_slice(&qf_tile::<S, 3>(r, dv, g, sym)),
                2 => o.copy_from_slice(&qf_tile::<S, 2>(r, dv, g, sym)),
                _ => o.copy_from_slice(&qf_tile::<S, 1>(r, dv, g, sym)),
            }
        }
        i += mt;
    }
}

/// Rows `t..t + mt` of head `kh` of `values` into `dst[..mt*dv]` as f32, token-major:
/// [`load_rows`], except for f16 values stored transposed (token stride 1: llama.cpp's V
/// cache without flash attention), read 8 tokens × 8 channels at a time and transposed in
/// registers rather than one strided element at a time (3-4x slower). Exact conversions
/// either way, so the same f32 values.
#[inline(always)]
fn load_value_rows<S: Simd>(values: &View, kh: usize, t: usize, mt: usize, dst: &mut [f32]) {
    let [h, n, dv] = values.extent();
    let st = values.stride();
    if values.dtype() != DType::F16 || st[1] != 1 || st[2] == 1 {
        return load_rows::<S>(values, kh, t, mt, dst);
    }
    assert!(kh < h && t + mt <= n && dst.len() >= mt * dv);
    let (m8, d8) = (mt / 8 * 8, dv / 8 * 8);
    let cvt = |x: u16| half::f16::from_bits(x).to_f32();
    // SAFETY: every element read, (kh, t..t + mt, 0..dv), is inside the view's extent
    // (asserted above), which its construction proved in bounds of its buffer (whose address
    // `byte_range` returns); 8 tokens from token i < m8 end at most at token mt; every store
    // is inside dst[..mt*dv] (asserted).
    unsafe {
        let p = (values.byte_range().0 as *const u16).add(kh * st[0] + t);
        let o = dst.as_mut_ptr();
        let mut i = 0;
        while i < m8 {
            let mut c = 0;
            while c < d8 {
                // column j: channel c + j of tokens i..i + 8; transposed: row r = token i + r
                let cols: [S::V; 8] =
                    core::array::from_fn(|j| S::load_f16(p.add((c + j) * st[2] + i)));
                for (r, v) in S::transpose8(cols).into_iter().enumerate() {
                    S::store(o.add((i + r) * dv + c), v);
                }
                c += 8;
            }
            for c in d8..dv {
                for r in i..i + 8 {
                    *o.add(r * dv + c) = cvt(*p.add(c * st[2] + r));
                }
            }
            i += 8;
        }
        for r in m8..mt {
            for c in 0..dv {
                *o.add(r * dv + c) = cvt(*p.add(c * st[2] + r));
            }
        }
    }
}

/// Blocks whose symmetry is decided at once (a stack array) in [`compute_value_forms`].
const SYM_GROUP: usize = 64;

/// Fill columns `t0..t1` of the value-form cache from `values` (`[Hkv, N, dv]`) and a Gram
/// computed with the same `cross`. Other columns are not touched, so an engine can fill
/// new tokens as they enter the cache. Rejects NaN/Inf in the values read.
pub fn compute_value_forms(
    values: &View,
    gram: &[f32],
    hq: usize,
    cross: bool,
    t0: usize,
    t1: usize,
    out: &mut [f32],
) -> Result<()> {
    let [hkv, n, dv] = values.extent();
    let g = group_of(hq, hkv)?;
    let nb = blocks(g, cross);
    if t0 > t1 || t1 > n {
        return Err(Error::InvalidArgument);
    }
    let glen = gram_len(hq, hkv, dv, cross)?;
    if gram.len() < glen {
        return Err(Error::ShapeMismatch);
    }
    if gram[..glen].iter().any(|x| !x.is_finite()) {
        return Err(Error::NonFinite);
    }
    if out.len() < value_forms_len(hq, hkv, n, cross)? {
        return Err(Error::OutputTooSmall);
    }
    if dv > 1024 {
        return Err(Error::InvalidArgument);
    }
    if !values_finite(values, t0, t1) {
        return Err(Error::NonFinite);
    }
    dispatch!(fn(values: &View, gram: &[f32], nb: usize, t0: usize, t1: usize,
                 out: &mut [f32]) -> (), S => {
        value_forms_impl::<S>(values, gram, nb, t0, t1, out)
    });
    Ok(())
}

/// [`compute_value_forms`]'s loop on checked arguments: each chunk of token rows is loaded
/// once for all (up to `SYM_GROUP`) blocks of its head, not once per block.
#[inline(always)]
fn value_forms_impl<S: Simd>(
    values: &View,
    gram: &[f32],
    nb: usize,
    t0: usize,
    t1: usize,
    out: &mut [f32],
) {
    let [hkv, n, dv] = values.extent();
    let block = |kh: usize, k: usize| &gram[(kh * nb + k) * dv * dv..(kh * nb + k + 1) * dv * dv];
    let chunk = chunk_rows(dv);
    let mut buf = [0f32; VBUF];
    for kh in 0..hkv {
        let mut k0 = 0;
        while k0 < nb {
            let k1 = (k0 + SYM_GROUP).min(nb);
            let mut sym = [false; SYM_GROUP];
            for k in k0..k1 {
                sym[k - k0] = symmetric(block(kh, k), dv);
            }
            let mut t = t0;
            while t < t1 {
                let mt = chunk.min(t1 - t);
                load_value_rows::<S>(values, kh, t, mt, &mut buf);
                for k in k0..k1 {
                    let dst = &mut out[(kh * nb + k) * n + t..(kh * nb + k) * n + t + mt];
                    forms_of_rows::<S>(&buf[..mt * dv], dv, block(kh, k), sym[k - k0], dst);
                }
                t += mt;
            }
            k0 = k1;
        }
    }
}

/// Whether rows `t0..t1` of every head of `view` are finite.
pub(crate) fn values_finite(view: &View, t0: usize, t1: usize) -> bool {
    let [h, n, d] = view.extent();
    let st = view.stride();
    if view.dtype() == DType::F16 && st[1] == 1 && t0 < t1 {
        // f16 stored transposed: the tokens of one channel are contiguous, and a binary16 is
        // non-finite exactly when its exponent bits are all set (no conversion needed)
        assert!(t1 <= n);
        let base = view.byte_range().0 as *const u16;
        return (0..h).all(|a| {
            (0..d).all(|c| {
                // SAFETY: (a, t0..t1, c) is inside the extent (t1 <= n asserted), which the
                // view's construction proved in bounds; token stride 1: a contiguous run.
                let run = unsafe {
                    core::slice::from_raw_parts(base.add(a * st[0] + c * st[2] + t0), t1 - t0)
                };
                run.iter().map(|&x| x & 0x7c00).max() != Some(0x7c00)
            })
        });
    }
    dispatch!(fn(view: &View, t0: usize, t1: usize) -> bool, S => {
        let [h, _, d] = view.extent();
        let mut buf = [0f32; QBUF];
        let tile = (QBUF / d.max(1)).max(1);
        for a in 0..h {
            let mut t = t0;
            while t < t1 {
                let mt = tile.min(t1 - t);
                load_rows::<S>(view, a, t, mt, &mut buf);
                if !all_finite::<S>(&buf[..mt * d]) {
                    return false;
                }
                t += mt;
            }
        }
        true
    })
}

/// Workspace bytes of [`compute_value_l1`].
pub fn value_l1_workspace_size(dv: usize, d_model: usize) -> Result<usize> {
    let mut ws = WorkspaceSize::new();
    ws.add::<f32>(mul(dv, d_model)?)?;
    ws.add::<f32>(d_model)?;
    ws.add::<f32>(dv)?;
    Ok(ws.total())
}

/// CriticalKV's `mean_{h in group} ||v_i Wo_h||_1` for every token: out `[Hkv][N]`.
pub fn compute_value_l1(
    values: &View,
    wo: &View,
    out: &mut [f32],
    workspace: &mut [u8],
) -> Result<()> {
    let [hkv, n, dv] = values.extent();
    let [hq, dv2, dm] = wo.extent();
    let g = group_of(hq, hkv)?;
    if dv2 != dv {
        return Err(Error::ShapeMismatch);
    }
    if out.len() < mul(hkv, n)? {
        return Err(Error::OutputTooSmall);
    }
    if workspace.len() < value_l1_workspace_size(dv, dm)? {
        return Err(Error::WorkspaceTooSmall);
    }
    let mut ws = Workspace::new(workspace);
    let w = ws.take::<f32>(dv * dm)?;
    let y = ws.take::<f32>(dm)?;
    let v = ws.take::<f32>(dv)?;
    // validate everything before writing: finite inputs, then finite results
    let mut vmax = 0f64; // largest |v|
    for kh in 0..hkv {
        for t in 0..n {
            values.load_row(kh, t, v);
            if v.iter().any(|x| !x.is_finite()) {
                return Err(Error::NonFinite);
            }
            vmax = v.iter().fold(vmax, |m, x| m.max(x.abs() as f64));
        }
    }
    let mut wsum = 0f64; // largest Σ_r ||Wo_h[r]||_1 over heads
    for h in 0..hq {
        let mut sum = 0f64;
        for r in 0..dv {
            wo.load_row(h, r, y);
            if y.iter().any(|x| !x.is_finite()) {
                return Err(Error::NonFinite);
            }
            sum += y.iter().map(|x| x.abs() as f64).sum::<f64>();
        }
        wsum = wsum.max(sum);
    }
    // every partial sum below is at most vmax·wsum, grown by f32 rounding at most
    // (1 + 2^-24)^(dv + D + g + 2) < 1.07 when that count is <= 2^20; beyond the bound,
    // compute each token once to be sure
    let terms = dv + dm + g + 2;
    if terms > 1 << 20 || vmax * wsum * 1.07 > f32::MAX as f64 {
        for kh in 0..hkv {
            for t in 0..n {
                values.load_row(kh, t, v);
                let mut acc = 0f32;
                for a in 0..g {
                    load_head(wo, kh * g + a, w);
                    acc += l1_of(v, w, y) / g as f32;
                }
                if !acc.is_finite() {
                    return Err(Error::NonFinite);
                }
            }
        }
    }
    out[..hkv * n].fill(0.0);
    for kh in 0..hkv {
        for a in 0..g {
            load_head(wo, kh * g + a, w);
            for t in 0..n {
                values.load_row(kh, t, v);
                out[kh * n + t] += l1_of(v, w, y) / g as f32;
            }
        }
    }
    Ok(())
}

/// `||v·W||_1` in f32 for a row `v` (`dv`) and `W` (`dv × D`, row-major), `y` (`D`) scratch.
fn l1_of(v: &[f32], w: &[f32], y: &mut [f32]) -> f32 {
    let dm = y.len();
    y.fill(0.0);
    for (r, &vr) in v.iter().enumerate() {
        for (o, x) in y.iter_mut().zip(&w[r * dm..(r + 1) * dm]) {
            *o += vr * x;
        }
    }
    y.iter().map(|x| x.abs()).sum()
}

/// The largest `|v_t|²` (f64) over tokens `t0..t1` of head `kh` (0 for none), rows loaded in
/// chunks as [`compute_value_forms`] loads them.
fn max_sq_norm(values: &View, kh: usize, t0: usize, t1: usize) -> f64 {
    dispatch!(fn(values: &View, kh: usize, t0: usize, t1: usize) -> f64, S => {
        let dv = values.extent()[2];
        let chunk = chunk_rows(dv);
        let mut buf = [0f32; VBUF];
        let mut vmax = 0f64;
        let mut t = t0;
        while t < t1 {
            let mt = chunk.min(t1 - t);
            load_value_rows::<S>(values, kh, t, mt, &mut buf);
            for row in buf[..mt * dv].chunks_exact(dv.max(1)) {
                let sq: f64 = row.iter().map(|&x| x as f64 * x as f64).sum();
                vmax = vmax.max(sq);
            }
            t += mt;
        }
        vmax
    })
}

/// Whether every value form `compute_value_forms` would write for tokens `t0..t1` is
/// finite, for inputs it accepts (finite values and Gram, `dv <= 1024`). Cheap unless
/// the inputs are huge: [`quad_forms`] forms `Y = v·G` (entries at most doubled by the
/// symmetric form), then `Y·v`, so every partial sum stays below `2·max(1, |v|)²·|G|_F`
/// grown by f32 rounding over at most `2·dv + 64` terms (< 1%); beyond that bound the
/// forms are computed once into a scratch tile and checked. (An evaluation that formed
/// `v_r·v_c` first would also need `2·|v|² <= FLT_MAX` here.)
pub fn value_forms_finite(
    values: &View,
    gram: &[f32],
    hq: usize,
    cross: bool,
    t0: usize,
    t1: usize,
) -> bool {
    let [hkv, _, dv] = values.extent();
    let Ok(g) = group_of(hq, hkv) else {
        return true; // compute_value_forms refuses the shape itself
    };
    let nb = blocks(g, cross);
    for kh in 0..hkv {
        let vmax = max_sq_norm(values, kh, t0, t1); // largest |v|² of the tokens filled
        let scale = 2.0 * vmax.max(1.0) * 1.01;
        for k in 0..nb {
            let gb = &gram[(kh * nb + k) * dv * dv..(kh * nb + k + 1) * dv * dv];
            let frob = gb.iter().map(|&x| x as f64 * x as f64).sum::<f64>();
            let frob = libm::sqrt(frob);
            let bound = scale * frob;
            if bound.is_nan() || bound > f32::MAX as f64 {
                let mut tile = [0f32; 64];
                let mut t = t0;
                while t < t1 {
                    let m = (t1 - t).min(tile.len());
                    quad_forms(values, kh, gb, t, t + m, &mut tile[..m]);
                    if tile[..m].iter().any(|x| !x.is_finite()) {
                        return false;
                    }
                    t += m;
                }
            }
        }
    }
    true
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// Random-ish values from a fixed LCG.
    fn vals(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn check<S: Simd>(dv: usize, sym: bool, f16: bool) {
        let n = 23;
        let v32 = vals(2 * n * dv, dv as u64);
        let v16: Vec<half::f16> = v32.iter().map(|&x| half::f16::from_f32(x)).collect();
        let v32: Vec<f32> = if f16 {
            v16.iter().map(|x| x.to_f32()).collect()
        } else {
            v32
        };
        let mut g = vals(dv * dv, 7 + dv as u64);
        if sym {
            for r in 0..dv {
                for c in 0..r {
                    g[r * dv + c] = g[c * dv + r];
                }
            }
        }
        assert_eq!(symmetric(&g, dv), sym || dv == 1);
        let view = if f16 {
            View::f16(&v16, [2, n, dv], [n * dv, dv, 1]).unwrap()
        } else {
            View::f32(&v32, [2, n, dv], [n * dv, dv, 1]).unwrap()
        };
        let mut out = vec![0f32; n];
        quad_forms_impl::<S>(&view, 1, &g, 2, n, &mut out);
        for t in 2..n {
            let v = &v32[(n + t) * dv..(n + t + 1) * dv];
            let mut want = 0f64;
            let mut mag = 0f64;
            for r in 0..dv {
                for c in 0..dv {
                    let x = v[r] as f64 * g[r * dv + c] as f64 * v[c] as f64;
                    want += x;
                    mag += x.abs();
                }
            }
            let got = out[t - 2] as f64;
            assert!(
                (got - want).abs() <= 1e-5 * mag.max(1e-30),
                "dv {dv} sym {sym} f16 {f16} t {t}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn quad_forms_match_f64() {
        for dv in [1, 5, 8, 16, 24, 33, 64, 100, 128, 200, 512, 1024] {
            for sym in [false, true] {
                for f16 in [false, true] {
                    check::<crate::numerics::Portable>(dv, sym, f16);
                    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
                    if crate::numerics::has_neon() {
                        check::<crate::numerics::Neon>(dv, sym, f16);
                    }
                    #[cfg(target_arch = "x86_64")]
                    if crate::numerics::has_avx2() {
                        check::<crate::numerics::Avx2>(dv, sym, f16);
                    }
                }
            }
        }
    }

    #[test]
    fn gram_entries_match_f64_and_builds_agree() {
        // odd shapes: dv not a multiple of the tile, D not a multiple of the lanes
        for (hq, hkv, dv, dm) in [(3, 1, 5, 13), (4, 2, 7, 1), (6, 2, 9, 37), (2, 2, 16, 64)] {
            for cross in [false, true] {
                let w = vals(hq * dv * dm, (hq * 131 + dv * 7 + dm) as u64);
                let wo = View::f32(&w, [hq, dv, dm], [dv * dm, dm, 1]).unwrap();
                let mut out = vec![f32::NAN; gram_len(hq, hkv, dv, cross).unwrap()];
                let mut ws = vec![0u8; gram_workspace_size(dv, dm).unwrap()];
                compute_gram(&wo, hkv, cross, &mut out, &mut ws).unwrap();
                // the same Wo stored as PyTorch's o_proj.weight / ggml's attn_output
                // (`[D, Hq·dv]` row-major, read column by column): the same bits
                let mut t = vec![0f32; w.len()];
                for i in 0..hq * dv {
                    for c in 0..dm {
                        t[c * hq * dv + i] = w[i * dm + c];
                    }
                }
                let wt = View::f32(&t, [hq, dv, dm], [dv, 1, hq * dv]).unwrap();
                let mut out_t = vec![f32::NAN; out.len()];
                compute_gram(&wt, hkv, cross, &mut out_t, &mut ws).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&out), bits(&out_t), "{hq} {dv} {dm} {cross}: layouts");
                let (g, nb) = (hq / hkv, blocks(hq / hkv, cross));
                for kh in 0..hkv {
                    for k in 0..nb {
                        let (a, b) = block_pair(g, k);
                        for r in 0..dv {
                            for c in 0..dv {
                                let exact: f64 = (0..dm)
                                    .map(|t| {
                                        w[((kh * g + a) * dv + r) * dm + t] as f64
                                            * w[((kh * g + b) * dv + c) * dm + t] as f64
                                    })
                                    .sum();
                                let got = out[(kh * nb + k) * dv * dv + r * dv + c];
                                let tol = 1e-6 * (1.0 + exact.abs());
                                assert!(
                                    (got as f64 - exact).abs() <= tol,
                                    "{hq} {dv} {dm} {cross}: {got} vs {exact}"
                                );
                            }
                        }
                    }
                }
            }
        }
        #[cfg(all(feature = "std", target_arch = "x86_64"))]
        if crate::numerics::has_avx2() {
            for n in [1, 3, 4, 5, 8, 31, 64, 577] {
                let x = vals(TR * n, n as u64);
                let y = vals(TC * n, 7 + n as u64);
                let xs: [&[f32]; TR] = core::array::from_fn(|i| &x[i * n..(i + 1) * n]);
                let ys: [&[f32]; TC] = core::array::from_fn(|j| &y[j * n..(j + 1) * n]);
                let (mut p, mut v) = ([[0f64; TC]; TR], [[1f64; TC]; TR]);
                dot_tile::<TR, TC>(xs, ys, &mut p);
                // SAFETY: the CPU has AVX2 (checked above).
                unsafe { dot_tile_avx2(xs, ys, &mut v) };
                assert_eq!(p, v, "n = {n}");
            }
        }
    }

    /// f16 values `[hkv, n, dv]` in token rows and the same values stored transposed as
    /// llama.cpp keeps V without flash attention (element (h, t, c) at `(h·dv + c)·size + t`).
    fn both_layouts(
        hkv: usize,
        n: usize,
        dv: usize,
        size: usize,
    ) -> (Vec<half::f16>, Vec<half::f16>) {
        let v = vals(hkv * n * dv, (n * 31 + dv) as u64);
        let mut rows = vec![half::f16::ZERO; hkv * n * dv];
        let mut trans = vec![half::f16::ZERO; hkv * dv * size];
        for h in 0..hkv {
            for t in 0..n {
                for c in 0..dv {
                    let x = half::f16::from_f32(v[(h * n + t) * dv + c]);
                    rows[t * hkv * dv + h * dv + c] = x;
                    trans[(h * dv + c) * size + t] = x;
                }
            }
        }
        (rows, trans)
    }

    #[test]
    fn transposed_values_give_the_forms_of_token_rows_bit_for_bit() {
        // dv off the 8-lane tile, n off the 8-token tile and the chunk, sub-ranges t0..t1
        for (hq, hkv, dv, n) in [
            (9, 3, 64, 1000),
            (4, 2, 12, 77),
            (2, 1, 5, 9),
            (6, 2, 128, 130),
            (3, 3, 8, 8),
        ] {
            let size = n + 13;
            let (rows, trans) = both_layouts(hkv, n, dv, size);
            let vr = View::f16(&rows, [hkv, n, dv], [dv, hkv * dv, 1]).unwrap();
            let vt = View::f16(&trans, [hkv, n, dv], [dv * size, 1, size]).unwrap();
            for cross in [false, true] {
                let glen = gram_len(hq, hkv, dv, cross).unwrap();
                let mut gram = vals(glen, 5 + dv as u64);
                // the diagonal blocks symmetric, as real Gram blocks are
                let nb = blocks(hq / hkv, cross);
                for (i, b) in gram.chunks_exact_mut(dv * dv).enumerate() {
                    if i % nb < hq / hkv {
                        for r in 0..dv {
                            for c in 0..r {
                                b[r * dv + c] = b[c * dv + r];
                            }
                        }
                    }
                }
                let len = value_forms_len(hq, hkv, n, cross).unwrap();
                for (t0, t1) in [(0, n), (1, n), (n / 3, n - n / 4)] {
                    let mut want = vec![f32::NAN; len];
                    // the per-block path (quad_forms, one head and block at a time) on token rows
                    for kh in 0..hkv {
                        for k in 0..nb {
                            let gb = &gram[(kh * nb + k) * dv * dv..(kh * nb + k + 1) * dv * dv];
                            quad_forms(&vr, kh, gb, t0, t1, &mut want[(kh * nb + k) * n + t0..]);
                        }
                    }
                    for v in [&vr, &vt] {
                        let mut got = vec![f32::NAN; len];
                        compute_value_forms(v, &gram, hq, cross, t0, t1, &mut got).unwrap();
                        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "{hq} {hkv} {dv} {n} {cross} {t0}..{t1}"
                        );
                        let mut tmp = vec![0f32; n];
                        quad_forms(
                            v,
                            hkv - 1,
                            &gram[(hkv - 1) * nb * dv * dv..],
                            t0,
                            t1,
                            &mut tmp,
                        );
                        assert_eq!(
                            bits(&tmp[..t1 - t0]),
                            bits(&want[(hkv - 1) * nb * n + t0..][..t1 - t0])
                        );
                    }
                    assert!(value_forms_finite(&vt, &gram, hq, cross, t0, t1));
                }
            }
            // the transposed loader on each kernel build against the plain row loader
            let mut a = vec![0f32; VBUF];
            let mut b = vec![1f32; VBUF];
            let mt = chunk_rows(dv).min(n - 1);
            for kh in 0..hkv {
                load_rows::<crate::numerics::Portable>(&vr, kh, 1, mt, &mut a);
                load_value_rows::<crate::numerics::Portable>(&vt, kh, 1, mt, &mut b);
                assert_eq!(a[..mt * dv], b[..mt * dv]);
                #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
                if crate::numerics::has_neon() {
                    load_value_rows::<crate::numerics::Neon>(&vt, kh, 1, mt, &mut b);
                    assert_eq!(a[..mt * dv], b[..mt * dv]);
                }
                #[cfg(all(feature = "std", target_arch = "x86_64"))]
                if crate::numerics::has_avx2() {
                    // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
                    unsafe { transposed_avx2(&vt, kh, mt, &mut b) };
                    assert_eq!(a[..mt * dv], b[..mt * dv]);
                }
            }
        }
    }

    #[cfg(all(feature = "std", target_arch = "x86_64"))]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn transposed_avx2(v: &View, kh: usize, mt: usize, out: &mut [f32]) {
        load_value_rows::<crate::numerics::Avx2>(v, kh, 1, mt, out)
    }

    #[test]
    fn a_non_finite_transposed_value_is_found_in_its_range_only() {
        let (hkv, n, dv, size) = (3, 100, 16, 128);
        let (_, clean) = both_layouts(hkv, n, dv, size);
        for bad in [half::f16::NAN, half::f16::INFINITY, half::f16::NEG_INFINITY] {
            for (h, t, c) in [(0, 0, 0), (2, 99, 15), (1, 50, 7)] {
                let mut tr = clean.clone();
                tr[(h * dv + c) * size + t] = bad;
                // a non-finite value in the padding past n is outside every range
                tr[size - 1] = half::f16::NAN;
                let v = View::f16(&tr, [hkv, n, dv], [dv * size, 1, size]).unwrap();
                assert!(!values_finite(&v, 0, n));
                assert!(!values_finite(&v, t, t + 1));
                assert!(values_finite(&v, 0, t) && values_finite(&v, t + 1, n));
                let gram = vals(gram_len(3 * hkv, hkv, dv, false).unwrap(), 3);
                let mut out = vec![0f32; value_forms_len(3 * hkv, hkv, n, false).unwrap()];
                assert_eq!(
                    compute_value_forms(&v, &gram, 3 * hkv, false, 0, n, &mut out),
                    Err(Error::NonFinite)
                );
            }
        }
    }
}
