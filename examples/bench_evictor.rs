//! The evictor's overhead over the stage calls it makes (issue 26 target: <= 1 %; a
//! benchmark, not a timed test).
//!
//! One round on one sequence, a whole model: by hand, `score_layer` per layer into
//! `[L][Hkv][P]` then `select_model`; through the evictor, `begin`, `score_layer` per
//! layer (the same views), `select`. Also the evictor reading the window queries from its
//! ring (`observe_queries` first, not timed). Synthetic f16 K/V/Q, head-major, fixed seed.
//! The sides alternate `--reps` times; the minimum and the median of each are reported,
//! the overhead as the difference over the hand-written time (the minimum is the least
//! disturbed by other processes: interference only ever adds time). Times are the thread's CPU
//! time on Linux (the target is CPU time; other processes' load moves wall time
//! by several percent on a shared machine), wall time elsewhere.
//!
//!   cargo run --release --example bench_evictor -- [--reps 7] [--shapes smol,llama]
//!       [--presets snapkv,laprox-span] [--n 4096]

use half::f16;
use kvevict::evictor::{Budget, EvictorConfig, LayerViews, ModelDims, PRESETS};
use kvevict::*;

mod common;
use common::{arg, Rng};

/// Seconds of CPU time of this thread (Linux), else of wall time since the first call.
#[cfg(target_os = "linux")]
fn now() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: a valid clock id and a writable timespec.
    unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.sec as f64 + t.nsec as f64 * 1e-9
}
#[cfg(not(target_os = "linux"))]
fn now() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

struct Shape {
    name: &'static str,
    layers: usize,
    hq: usize,
    hkv: usize,
    d: usize,
}

const SHAPES: [Shape; 2] = [
    Shape {
        name: "smol",
        layers: 30,
        hq: 9,
        hkv: 3,
        d: 64,
    },
    Shape {
        name: "llama",
        layers: 32,
        hq: 32,
        hkv: 8,
        d: 128,
    },
];

fn data(len: usize, seed: u64) -> Vec<f16> {
    let mut r = Rng::seeded(seed);
    (0..len).map(|_| f16::from_f32(r.f())).collect()
}

/// A head-major `[a, b, c]` view.
fn view(x: &[f16], e: [usize; 3]) -> View<'_> {
    View::f16(x, e, [e[1] * e[2], e[2], 1]).unwrap()
}

/// (minimum, median) in ms.
fn summary(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[0] * 1e3, v[v.len() / 2] * 1e3)
}

/// `"min X ms (+p %), median Y ms (+q %)"` of `t` against `base`.
fn versus(t: (f64, f64), base: (f64, f64)) -> String {
    let pct = |a: f64, b: f64| (a - b) / b * 100.0;
    format!(
        "min {:.2} ms ({:+.2} %), median {:.2} ms ({:+.2} %)",
        t.0,
        pct(t.0, base.0),
        t.1,
        pct(t.1, base.1)
    )
}

fn main() {
    let reps: usize = arg("--reps", "7").parse().unwrap();
    let n: usize = arg("--n", "4096").parse().unwrap();
    let shapes = arg("--shapes", "smol,llama");
    let presets = arg("--presets", "snapkv,laprox-span");
    for sh in SHAPES
        .iter()
        .filter(|s| shapes.split(',').any(|x| x == s.name))
    {
        let (l, hq, hkv, d) = (sh.layers, sh.hq, sh.hkv, sh.d);
        let q: Vec<Vec<f16>> = (0..l).map(|i| data(hq * 64 * d, 3 * i as u64)).collect();
        let k: Vec<Vec<f16>> = (0..l)
            .map(|i| data(hkv * n * d, 3 * i as u64 + 1))
            .collect();
        let v: Vec<Vec<f16>> = (0..l)
            .map(|i| data(hkv * n * d, 3 * i as u64 + 2))
            .collect();
        let wo: Vec<Vec<f16>> = (0..l)
            .map(|i| data(hq * d * hq * d, 7 + i as u64))
            .collect();
        for &(name, preset) in PRESETS
            .iter()
            .filter(|p| presets.split(',').any(|x| x == p.0))
        {
            let dims = ModelDims {
                layers: l,
                hq,
                hkv,
                dk: d,
                dv: d,
                d_model: hq * d,
            };
            let mut cfg = EvictorConfig::new(preset, dims, n, Budget::Explicit);
            cfg.granularity = Some(Granularity::Token);
            let mut mem = vec![0u8; Evictor::memory_size(&cfg).unwrap()];
            let mut ev = Evictor::init(&mut mem, &cfg).unwrap();
            let needs = ev.needs();
            let w = needs.window as usize;
            let target = n / 4;
            // the hand-written side's state: scores, Gram blocks, workspaces
            let sc = ScoreConfig::preset(preset);
            let mut sel = evictor::default_select(preset, (target - w) as u64);
            sel.granularity = Granularity::Token;
            let cross = false;
            let mut grams = Vec::new();
            let mut gws = vec![0u8; gram_workspace_size(d, hq * d).unwrap()];
            for i in 0..l {
                let wov = view(&wo[i], [hq, d, hq * d]);
                if needs.capture.wo == evictor::WoUse::Once {
                    let mut g = vec![0f32; gram_len(hq, hkv, d, cross).unwrap()];
                    compute_gram(&wov, hkv, cross, &mut g, &mut gws).unwrap();
                    ev.set_output_projection(i, &wov).unwrap();
                    grams.push(g);
                }
                ev.observe_queries(0, i, &view(&q[i], [hq, 64, d])).unwrap();
            }
            let shape = LayerShape {
                hq,
                hkv,
                n,
                dk: d,
                dv: d,
            };
            let mut sws = vec![0u8; score_workspace_size(&sc, &shape).unwrap()];
            let p = n - w;
            let mut scores = vec![0f32; l * hkv * p];
            let (no, ni) = select_output_len(&sel, l, hkv, n, w).unwrap();
            let (mut off, mut idx) = (vec![0u64; no], vec![0u32; ni]);
            let mut selws = vec![0u8; select_workspace_size(&sel, l, hkv, n, w).unwrap()];
            let views = |i: usize, ring: bool| LayerViews {
                keys: view(&k[i], [hkv, n, d]),
                values: Some(view(&v[i], [hkv, n, d])),
                queries: (!ring && needs.capture.queries).then(|| view(&q[i], [hq, 64, d])),
                row_lse: None,
                wo: None,
            };
            let (mut hand, mut evt, mut ring) = (vec![], vec![], vec![]);
            for _ in 0..reps {
                let t = now();
                for i in 0..l {
                    let li = LayerInputs {
                        queries: Some(view(&q[i], [hq, 64, d])),
                        keys: Some(view(&k[i], [hkv, n, d])),
                        values: Some(view(&v[i], [hkv, n, d])),
                        gram: grams.get(i).map(|g| &g[..]),
                        ..Default::default()
                    };
                    score_layer(
                        &sc,
                        &li,
                        &mut scores[i * hkv * p..(i + 1) * hkv * p],
                        &mut sws,
                    )
                    .unwrap();
                }
                let ms = ModelScores {
                    scores: &scores,
                    layers: l,
                    hkv,
                    n,
                    window: w,
                };
                select_model(&sel, &ms, &mut off, &mut idx, &mut selws).unwrap();
                hand.push(now() - t);
                for (use_ring, out) in [(false, &mut evt), (true, &mut ring)] {
                    let t = now();
                    ev.begin(0, n, target).unwrap();
                    for i in 0..l {
                        ev.score_layer(0, i, &views(i, use_ring)).unwrap();
                    }
                    let kept = ev.select(0).unwrap();
                    assert_eq!(
                        kept.indices[..kept.offsets[1] as usize],
                        idx[..off[1] as usize]
                    );
                    out.push(now() - t);
                }
            }
            let (h, e, r) = (summary(&mut hand), summary(&mut evt), summary(&mut ring));
            println!(
                "{:5} {name} n={n} L={l} Hq={hq} Hkv={hkv} d={d}, {reps} reps:",
                sh.name
            );
            println!(
                "  stage calls           min {:.2} ms, median {:.2} ms",
                h.0, h.1
            );
            println!("  evictor               {}", versus(e, h));
            println!("  evictor, query ring   {}", versus(r, h));
        }
    }
}
