//! cuda/baselines.cu: KNorm, the score power, attention sinks and CriticalKV's combine.

use super::*;

// ------------------------------------------------ KNorm, sinks, CriticalKV --

#[test]
fn knorm_matches_reference() {
    let mut rng = device_rng!(40);
    for (dt, layout) in dtype_layouts() {
        for &(h, n, d) in &[(3usize, 700usize, 72usize), (2, 300, 128), (1, 50, 5)] {
            let prefix = 1 + rng.below(n - 1); // < n: the core needs a window
            let k = Tensor::normal(&mut rng, dt, layout, [h, n, d]);
            let ld = prefix + 3;
            let out = launched(h * ld, "knorm", |out| unsafe {
                kve_cuda_knorm(&k.view(), prefix as i64, out, ld as i64, null_mut())
            });
            let what = format!("knorm {dt:?} {layout:?} h{h} n{n} d{d} prefix{prefix}");
            let got = unstride(&what, &out, h, prefix, ld);
            assert_close(&what, &got, &ref_knorm(&k, prefix), 1e-5);
            // the core's f32 sum order: bit for bit
            assert_eq!(got, core_knorm(&k, prefix), "{what}: vs the core");
        }
    }
}

/// kve_score_params.power on the device: the core's `score::power` bit for bit (products
/// rounded one by one), in place over strided rows, the padding between rows untouched;
/// refused arguments change nothing.
#[test]
fn score_power_matches_core() {
    let mut rng = device_rng!(31);
    for &(rows, n, power) in &[
        (3usize, 1000usize, 3i32),
        (2, 17, 2),
        (1, 300, 16),
        (4, 5, 1),
    ] {
        let ld = n + 3;
        // signed scores over decades, zeros of both signs, the saturating extremes
        let mut host: Vec<f32> = (0..rows * ld)
            .map(|_| (rng.normal() * 4.0).exp2() * if rng.unif() < 0.3 { -1.0 } else { 1.0 })
            .collect();
        host[0] = -0.0;
        host[1] = 0.0;
        host[2] = f32::MAX;
        host[3] = -1e30;
        let buf = DBuf::from(&host);
        // SAFETY: `rows` rows of `ld` floats on the device.
        let rc = unsafe {
            kve_cuda_score_power(
                buf.ptr(),
                rows as i64,
                n as i64,
                ld as i64,
                power,
                null_mut(),
            )
        };
        ck(rc, "score_power");
        let mut want = host.clone();
        for r in 0..rows {
            kvevict::score::power::raise(power as u32, &mut want[r * ld..r * ld + n]);
        }
        let got = buf.download();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&got),
            bits(&want),
            "score_power rows{rows} n{n} power{power}"
        );
    }
    // refusals: power outside [1, 16], ld < n, rows < 0, NULL
    let host = vec![2.0f32; 16];
    let buf = DBuf::from(&host);
    for (rows, n, ld, power, what) in [
        (2i64, 8i64, 8i64, 0i32, "power 0"),
        (2, 8, 8, 17, "power 17"),
        (2, 8, 7, 3, "ld < n"),
        (-1, 8, 8, 3, "rows < 0"),
    ] {
        // SAFETY: refused before any access.
        let rc = unsafe { kve_cuda_score_power(buf.ptr(), rows, n, ld, power, null_mut()) };
        assert_eq!(rc, 1, "{what}");
    }
    // SAFETY: NULL with work to do is refused.
    assert_eq!(
        unsafe { kve_cuda_score_power(null_mut(), 1, 1, 1, 3, null_mut()) },
        1
    );
    assert_eq!(buf.download(), host, "refused calls wrote");
}

#[test]
fn sink_scores_match_reference() {
    need_device!();
    for &(rows, n, sinks) in &[
        (6usize, 1000usize, 4usize),
        (3, 17, 0),
        (2, 5, 9),
        (1, 300, 300),
    ] {
        let ld = n + 2;
        let out = poisoned(rows * ld);
        let got = written(&out, "sink_scores", |o| unsafe {
            kve_cuda_sink_scores(
                o,
                rows as i64,
                n as i64,
                ld as i64,
                sinks as i64,
                null_mut(),
            )
        });
        let what = format!("sink_scores rows{rows} n{n} sinks{sinks}");
        let got = unstride(&what, &got, rows, n, ld);
        let want = ref_sinks(rows, n, sinks);
        assert_eq!(
            got,
            want.iter().map(|&x| x as f32).collect::<Vec<f32>>(),
            "{what}"
        );
        // the selection keeps the sinks and the most recent tokens (later position first)
        if n >= sinks + 10 {
            let keep = sinks + 10;
            let (counts, idx) = select_rows(&out, (ld, n, rows), None, keep, "select sinks");
            let (gc, gi) = (counts.download(), idx.download());
            let want: Vec<i32> = (0..sinks).chain(n - 10..n).map(|i| i as i32).collect();
            for r in 0..rows {
                assert_eq!(gc[r] as usize, keep, "{what}: kept count row {r}");
                assert_eq!(&gi[r * n..r * n + keep], &want[..], "{what}: kept row {r}");
            }
        }
    }
}

#[test]
fn critical_combine_matches_reference() {
    let mut rng = device_rng!(41);
    let (rows, n) = (5usize, 300usize);
    let (ld_b, ld_l, ld_o, idx_ld) = (n + 1, n + 2, n + 3, n + 4);
    let base: Vec<f32> = (0..rows * n).map(|_| rng.unif() * rng.unif()).collect();
    let l1: Vec<f32> = (0..rows * n).map(|_| 3.0 * rng.unif()).collect();
    // the core's second stage in f32: (s + 1e-4) · l1, forced positions f32::MAX
    let combine = |forced: &dyn Fn(usize, usize) -> bool| -> Vec<f32> {
        (0..rows * n)
            .map(|e| {
                let (r, i) = (e / n, e % n);
                if forced(r, i) {
                    f32::MAX
                } else {
                    (base[e] + 1e-4) * l1[e]
                }
            })
            .collect()
    };
    let (bd, ld) = (
        DBuf::from(&strided(&base, rows, n, ld_b)),
        DBuf::from(&strided(&l1, rows, n, ld_l)),
    );
    // the first-stage lists `cd`, `id` (row stride `idx_ld`) over `base` (row stride `ld_base`)
    // and the l1 factors into `out` (row stride `ld_out`)
    let critical_combine = |base: &DBuf<f32>,
                            ld_base: usize,
                            (cd, id, idx_ld): (&DBuf<i32>, &DBuf<i32>, usize),
                            out: &DBuf<f32>,
                            ld_out: usize,
                            what: &str| {
        ck(
            // SAFETY: device buffers of the documented sizes.
            unsafe {
                kve_cuda_critical_combine(
                    base.ptr(),
                    ld_base as i64,
                    ld.ptr(),
                    ld_l as i64,
                    cd.ptr(),
                    id.ptr(),
                    idx_ld as i64,
                    rows as i64,
                    n as i64,
                    out.ptr(),
                    ld_out as i64,
                    null_mut(),
                )
            },
            what,
        )
    };
    // 1. random first-stage lists, every array strided
    let (idx, counts) = random_lists(&mut rng, rows, n, idx_ld);
    let (id, cd) = (DBuf::from(&idx), DBuf::from(&counts));
    let out = poisoned(rows * ld_o);
    critical_combine(
        &bd,
        ld_b,
        (&cd, &id, idx_ld),
        &out,
        ld_o,
        "critical_combine",
    );
    let got = unstride("critical_combine", &out.download(), rows, n, ld_o);
    let want =
        combine(&|r, i| idx[r * idx_ld..r * idx_ld + counts[r] as usize].contains(&(i as i32)));
    assert_eq!(got, want, "critical_combine (strided, random lists)");
    // 2. in place, first stage from kve_cuda_select (top `first` of each row), as the core
    let first = 1 + rng.below(n / 4);
    let inplace = DBuf::from(&strided(&base, rows, n, ld_b));
    let (kc, ki) = select_rows(&inplace, (ld_b, n, rows), None, first, "select first stage");
    critical_combine(
        &inplace,
        ld_b,
        (&kc, &ki, n),
        &inplace,
        ld_b,
        "critical_combine in place",
    );
    let first_stage = ref_select(&base, n, rows, 1, &vec![first as i64; rows], None);
    let got = unstride(
        "critical_combine in place",
        &inplace.download(),
        rows,
        n,
        ld_b,
    );
    let want = combine(&|r, i| first_stage[r].contains(&(i as i32)));
    assert_eq!(
        got, want,
        "critical_combine in place after select (first {first})"
    );
    // 3. first-stage positions outside the row (-1, n) are skipped; a count above n is
    // clamped to n (row 1: the whole list, all -1 past its first entries)
    let mut idx = vec![-1i32; rows * n];
    idx[..3].copy_from_slice(&[-1, n as i32, 2]);
    idx[n] = 7;
    let mut counts = vec![0i32; rows];
    counts[..2].copy_from_slice(&[3, 1000]);
    let (id, cd) = (DBuf::from(&idx), DBuf::from(&counts));
    let out = poisoned(rows * n);
    let what = "critical_combine, lists out of range";
    critical_combine(&bd, ld_b, (&cd, &id, n), &out, n, what);
    let want = combine(&|r, i| (r, i) == (0, 2) || (r, i) == (1, 7));
    assert_eq!(out.download(), want, "critical_combine, lists out of range");
}
