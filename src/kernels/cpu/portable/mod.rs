//! Written once over [`Simd`](simd::Simd), built for every target: the vector trait, its
//! portable build and the exp (`simd`), the dispatch between the builds, sums and float keys
//! (`numerics`, which re-exports `simd`'s items), and the fixed lane order of dot products
//! and squares (`lanes`).

pub(crate) mod lanes;
pub mod numerics;
pub(crate) mod prefetch;
pub(crate) mod simd;
