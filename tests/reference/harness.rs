//! Glue between the f64 reference and the core: store logical tensors in a dtype and a
//! memory layout, build views, call the core's public API. No math lives here.
#![allow(dead_code)]

use super::{Rng, T3};
use half::{bf16, f16};
use kvevict::*;

/// How a logical `[a, b, c]` tensor sits in memory (design §6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `[a, b, c]` row-major: strides `(b·c, c, 1)`.
    HeadMajor,
    /// llama.cpp token rows `[b, a·c]`: strides `(c, a·c, 1)`.
    TokenMajor,
    /// llama.cpp transposed V `[a·c, b]`: strides `(c·b, 1, b)`.
    Transposed,
    /// PyTorch `o_proj.weight` `[c, a·b]` for `Wo` `[Hq, dv, D]`: strides `(b, 1, a·b)`.
    TorchOProj,
}

pub const LAYOUTS: [Layout; 3] = [Layout::HeadMajor, Layout::TokenMajor, Layout::Transposed];
pub const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

impl Layout {
    pub fn strides(self, [a, b, c]: [usize; 3]) -> [usize; 3] {
        match self {
            Layout::HeadMajor => [b * c, c, 1],
            Layout::TokenMajor => [c, a * c, 1],
            Layout::Transposed => [c * b, 1, b],
            Layout::TorchOProj => [b, 1, a * b],
        }
    }
}

/// Round an f64 to what `dtype` stores.
pub fn round(x: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::BF16 => bf16::from_f64(x).to_f64(),
        DType::Q8_0 | DType::Q4_0 => unreachable!("f32/f16/bf16 only here"),
    }
}

/// A tensor stored in memory the way an engine would hold it. `pad` extra elements at
/// the end of the buffer hold canaries that nobody may touch.
#[derive(Clone, Debug)]
pub struct Stored {
    pub dtype: DType,
    pub extent: [usize; 3],
    pub stride: [usize; 3],
    pub f32: Vec<f32>,
    pub f16: Vec<f16>,
    pub bf16: Vec<bf16>,
}

impl Stored {
    /// Store `t` (values rounded to `dtype`); returns the store and the rounded logical tensor.
    pub fn new(t: &T3, dtype: DType, layout: Layout) -> (Stored, T3) {
        Self::with_pad(t, dtype, layout, 0, 0.0)
    }
    pub fn with_pad(t: &T3, dtype: DType, layout: Layout, pad: usize, canary: f64) -> (Stored, T3) {
        let extent = [t.a, t.b, t.c];
        let stride = layout.strides(extent);
        let len = t.a * t.b * t.c + pad;
        let mut flat = vec![canary; len];
        let rounded = t.map(|x| round(x, dtype));
        for i in 0..t.a {
            for j in 0..t.b {
                for k in 0..t.c {
                    flat[i * stride[0] + j * stride[1] + k * stride[2]] = rounded.at(i, j, k);
                }
            }
        }
        let mut s = Stored {
            dtype,
            extent,
            stride,
            f32: vec![],
            f16: vec![],
            bf16: vec![],
        };
        match dtype {
            DType::F32 => s.f32 = flat.iter().map(|&x| x as f32).collect(),
            DType::F16 => s.f16 = flat.iter().map(|&x| f16::from_f64(x)).collect(),
            DType::BF16 => s.bf16 = flat.iter().map(|&x| bf16::from_f64(x)).collect(),
            DType::Q8_0 | DType::Q4_0 => unreachable!("f32/f16/bf16 only here"),
        }
        (s, rounded)
    }
    pub fn view(&self) -> View<'_> {
        match self.dtype {
            DType::F32 => View::f32(&self.f32, self.extent, self.stride),
            DType::F16 => View::f16(&self.f16, self.extent, self.stride),
            DType::BF16 => View::bf16(&self.bf16, self.extent, self.stride),
            DType::Q8_0 | DType::Q4_0 => unreachable!("f32/f16/bf16 only here"),
        }
        .unwrap()
    }
    pub fn view_mut(&mut self) -> ViewMut<'_> {
        match self.dtype {
            DType::F32 => ViewMut::f32(&mut self.f32, self.extent, self.stride),
            DType::F16 => ViewMut::f16(&mut self.f16, self.extent, self.stride),
            DType::BF16 => ViewMut::bf16(&mut self.bf16, self.extent, self.stride),
            DType::Q8_0 | DType::Q4_0 => unreachable!("f32/f16/bf16 only here"),
        }
        .unwrap()
    }
    /// Raw bits of every element of the buffer (for exact, dtype-independent comparison).
    pub fn bits(&self) -> Vec<u32> {
        match self.dtype {
            DType::F32 => self.f32.iter().map(|x| x.to_bits()).collect(),
            DType::F16 => self.f16.iter().map(|x| x.to_bits() as u32).collect(),
            DType::BF16 => self.bf16.iter().map(|x| x.to_bits() as u32).collect(),
            DType::Q8_0 | DType::Q4_0 => unreachable!("f32/f16/bf16 only here"),
        }
    }
    /// Raw bits of element `(i, j, k)`.
    pub fn bits_at(&self, i: usize, j: usize, k: usize) -> u32 {
        let o = i * self.stride[0] + j * self.stride[1] + k * self.stride[2];
        self.bits()[o]
    }
    /// Set element at flat offset `o` (f64, rounded).
    pub fn set_flat(&mut self, o: usize, x: f64) {
        match self.dtype {
            DType::F32 => self.f32[o] = x as f32,
            DType::F16 => self.f16[o] = f16::from_f64(x),
            DType::BF16 => self.bf16[o] = bf16::from_f64(x),
            DType::Q8_0 | DType::Q4_0 => unreachable!("f32/f16/bf16 only here"),
        }
    }
    pub fn offset(&self, i: usize, j: usize, k: usize) -> usize {
        i * self.stride[0] + j * self.stride[1] + k * self.stride[2]
    }
}

/// Random layout / dtype choices.
pub fn any_layout(rng: &mut Rng) -> Layout {
    rng.pick(&LAYOUTS)
}
pub fn any_dtype(rng: &mut Rng) -> DType {
    rng.pick(&DTYPES)
}

/// A layer held the way the core reads it: K, V (any layout), Q, `Wo`.
pub struct CoreLayer {
    pub q: Option<Stored>,
    pub k: Stored,
    pub v: Option<Stored>,
    pub wo: Option<Stored>,
}

/// Which way LaProx's value term reaches the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValuePath {
    /// `values` + Gram from `compute_gram`.
    Gram,
    /// cached forms from `compute_value_forms`.
    Forms,
}

/// Gram blocks of `Wo` (`cross` as the scorer needs).
pub fn core_gram(wo: &Stored, hkv: usize, cross: bool) -> Vec<f32> {
    let v = wo.view();
    let [hq, dv, dm] = v.extent();
    let mut out = vec![0f32; gram_len(hq, hkv, dv, cross).unwrap()];
    let mut ws = vec![0u8; gram_workspace_size(dv, dm).unwrap()];
    compute_gram(&v, hkv, cross, &mut out, &mut ws).unwrap();
    out
}

/// Score one layer with the core; `Err` passes the core's rejection through.
pub fn core_score(cfg: &ScoreConfig, x: &CoreLayer, path: ValuePath) -> Result<Vec<f32>> {
    let hkv = x.k.extent[0];
    let n = x.k.extent[1];
    let cross = cfg.scorer == ScorerKind::LaProx && cfg.laprox_gqa != LaproxGqa::Sum;
    let hq = x.q.as_ref().map_or(hkv, |q| q.extent[0]);
    let mut gram = None;
    let mut forms = None;
    let mut l1 = None;
    if cfg.scorer == ScorerKind::LaProx {
        let gm = core_gram(x.wo.as_ref().unwrap(), hkv, cross);
        if path == ValuePath::Forms {
            let mut f = vec![f32::NAN; value_forms_len(hq, hkv, n, cross).unwrap()];
            compute_value_forms(&x.v.as_ref().unwrap().view(), &gm, hq, cross, 0, n, &mut f)
                .unwrap();
            forms = Some(f);
        }
        gram = Some(gm);
    }
    if cfg.scorer == ScorerKind::CriticalKv {
        let (v, wo) = (x.v.as_ref().unwrap().view(), x.wo.as_ref().unwrap().view());
        let mut out = vec![0f32; hkv * n];
        let mut ws = vec![
            0u8;
            kvevict::gram::value_l1_workspace_size(v.extent()[2], wo.extent()[2])
                .unwrap()
        ];
        compute_value_l1(&v, &wo, &mut out, &mut ws).unwrap();
        l1 = Some(out);
    }
    let inputs = LayerInputs {
        queries: x.q.as_ref().map(|s| s.view()),
        keys: Some(x.k.view()),
        values: if path == ValuePath::Forms && forms.is_some() {
            None
        } else {
            x.v.as_ref().map(|s| s.view())
        },
        gram: if forms.is_some() {
            None
        } else {
            gram.as_deref()
        },
        value_forms: forms.as_deref(),
        value_l1: l1.as_deref(),
        row_lse: None,
    };
    let shape = layer_shape(cfg, &inputs)?;
    let mut ws = vec![0u8; score_workspace_size(cfg, &shape)?];
    let mut out = vec![0f32; score_len(cfg, &shape)?];
    score_layer(cfg, &inputs, &mut out, &mut ws)?;
    Ok(out)
}

/// Run `select_model` and split its CSR output into per-(layer, head) lists.
pub fn core_select(
    cfg: &SelectConfig,
    scores: &[f32],
    layers: usize,
    hkv: usize,
    n: usize,
    window: usize,
) -> Result<Vec<Vec<u32>>> {
    core_select_linked(cfg, scores, None, layers, hkv, n, window)
}

/// [`core_select`] through `select_model_linked` when `links` is given.
pub fn core_select_linked(
    cfg: &SelectConfig,
    scores: &[f32],
    links: Option<ValueLinks>,
    layers: usize,
    hkv: usize,
    n: usize,
    window: usize,
) -> Result<Vec<Vec<u32>>> {
    let m = ModelScores {
        scores,
        layers,
        hkv,
        n,
        window,
    };
    let (no, ni) = select_output_len(cfg, layers, hkv, n, window)?;
    let mut offsets = vec![u64::MAX; no];
    let mut indices = vec![u32::MAX; ni];
    let mut ws = vec![0xA5u8; select_workspace_size(cfg, layers, hkv, n, window)?];
    match links {
        None => select_model(cfg, &m, &mut offsets, &mut indices, &mut ws)?,
        Some(l) => select_model_linked(cfg, &m, l, &mut offsets, &mut indices, &mut ws)?,
    }
    let used = offsets[layers * hkv] as usize;
    assert!(used <= ni, "offsets end {used} past indices {ni}");
    assert!(
        indices[used..].iter().all(|&x| x == u32::MAX),
        "indices written past offsets[L·Hkv]"
    );
    Ok((0..layers * hkv)
        .map(|u| indices[offsets[u] as usize..offsets[u + 1] as usize].to_vec())
        .collect())
}
