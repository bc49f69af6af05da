//! The model and data of the tests that check the evictor against the f64 reference
//! (`decode_memory`, `marks`); the including test also declares `mod reference`.
#![allow(dead_code)]

use crate::reference::{Layer, Rng, T3};
use kvevict::evictor::{LayerViews, ModelDims};
use kvevict::{Evictor, View};

/// 3 layers of 4 query heads over 2 KV heads, `dk` 16; no values or `Wo` are read.
pub const DIMS: ModelDims = ModelDims {
    layers: 3,
    hq: 4,
    hkv: 2,
    dk: 16,
    dv: 8,
    d_model: 0,
};

/// Per layer, queries `[Hq][wq][dk]` and keys `[Hkv][n][dk]` of [`DIMS`].
pub struct QueriesKeys {
    pub q: Vec<T3>,
    pub k: Vec<T3>,
}

impl QueriesKeys {
    /// Normal values (σ 1.5) rounded to f32, so that the evictor's f32 inputs hold the
    /// reference's values exactly: every layer's queries, then every layer's keys.
    pub fn new(wq: usize, n: usize, seed: u64) -> QueriesKeys {
        let mut r = Rng::new(seed);
        let f32_exact = |x: f64| x as f32 as f64;
        let mut draw = |heads: usize, rows: usize| -> Vec<T3> {
            (0..DIMS.layers)
                .map(|_| T3::normal(&mut r, heads, rows, DIMS.dk, 1.5).map(f32_exact))
                .collect()
        };
        let q = draw(DIMS.hq, wq);
        let k = draw(DIMS.hkv, n);
        QueriesKeys { q, k }
    }

    /// Layer `l` for the reference: the window queries and the keys, no values or `Wo`.
    pub fn layer(&self, l: usize) -> Layer {
        Layer {
            q: Some(self.q[l].clone()),
            k: self.k[l].clone(),
            v: None,
            wo: None,
        }
    }

    /// Sequence 0's begun round scored by `ev`, every layer (the same tensors in f32).
    pub fn score_round(&self, ev: &mut Evictor) {
        for l in 0..DIMS.layers {
            let (k, q) = (self.k[l].f32s(), self.q[l].f32s());
            let (n, w) = (self.k[l].b, self.q[l].b);
            let v = LayerViews {
                keys: View::f32_contiguous(&k, [DIMS.hkv, n, DIMS.dk]).unwrap(),
                values: None,
                queries: Some(View::f32_contiguous(&q, [DIMS.hq, w, DIMS.dk]).unwrap()),
                row_lse: None,
                wo: None,
            };
            ev.score_layer(0, l, &v).unwrap();
        }
    }
}
