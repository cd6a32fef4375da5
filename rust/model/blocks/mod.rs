//! What the architectures share: norms, the attention block, the MLP
//! variants. An architecture's file composes these into its layer; none of
//! them knows which architecture it serves.

pub mod attention;
pub mod ffn;
pub mod moe;
pub mod norm;

pub use attention::{AttnOpts, AttnWeights};
pub use ffn::{Ffn, FfnWeights};
pub use norm::Norm;

/// `x += scale * y` (the residual add; `scale` is 1 except for Granite).
pub fn residual_add(x: &mut [f32], y: &[f32], scale: f32) {
    if scale == 1.0 {
        x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
    } else {
        x.iter_mut().zip(y).for_each(|(a, b)| *a += b * scale);
    }
}

/// Adds `bias` to every row of `buf`.
pub fn add_bias(buf: &mut [f32], bias: &[f32]) {
    for row in buf.chunks_exact_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(x, y)| *x += y);
    }
}
