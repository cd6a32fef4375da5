//! What the architectures share: norms, the attention block, the MLP
//! variants, the state-space mixers. An architecture's file composes these
//! into its layer; none of them knows which architecture it serves.

pub mod add;
pub mod attention;
pub mod ffn;
pub mod mamba1;
pub mod mla;
pub mod moe;
pub mod norm;
pub mod ssm;

pub use add::{add_bias, residual_add};
pub use attention::{AttnOpts, AttnWeights};
pub use ffn::{Ffn, FfnWeights};
pub use norm::Norm;
