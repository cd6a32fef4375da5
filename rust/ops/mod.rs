//! Dense operations of the forward pass.

pub mod activation;
pub mod attention;
pub mod attn_tile;
pub mod exp;
pub mod hadamard;
pub mod matmul;
pub mod norm;
pub mod rope;
pub mod ssm;
pub mod vec;
