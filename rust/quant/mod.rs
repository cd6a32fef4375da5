//! Quantized tensor formats: dequantization, activation quantization into
//! each format's integer partner, and dot products, with a scalar reference
//! and SIMD paths chosen once at run time.
//!
//! Contract for every format `T` (see `QuantKernels`):
//! - `dequantize(src, dst)`: `src.len() == T.row_bytes(dst.len())`.
//! - `quantize_act(src, dst)`: writes `src` in `T.vec_dot_type()` format;
//!   `dst.len() == T.vec_dot_type().row_bytes(src.len())`.
//! - `vec_dot(n, w, a)`: dot of `n` weights of type `T` with `n` activations
//!   already quantized by `quantize_act`.
//! - `vec_dot_tile(n, w_rows, acts, out)`: `out[r * acts.len() + c]` is the
//!   dot of weight row `r` with activation row `c`.
//! - `gemm(n, w_rows, acts, quants, scales, out)` (32-element block
//!   formats, Q4_K and Q6_K): the same for the activation rows in groups
//!   of [`GEMM_COLS`], `out[(g * w_rows.len() + r) * 8 + c]` for column `c`
//!   of group `g`, given both as rows (`acts`, for the scalar twin) and as
//!   the panels [`pack_panel`] made of each group, back to back (for the
//!   SIMD kernels, which decode each weight row once for every group).
//!
//! Callers check lengths.

mod bf16;
mod block;
mod f16;
mod float;
mod iq1_m;
mod iq1_s;
mod iq2_s;
mod iq2_xs;
mod iq2_xxs;
mod iq3_s;
mod iq3_xxs;
mod iq4_nl;
mod iq4_xs;
mod iq_common;
#[rustfmt::skip]
mod iq_grids;
mod kquant_scales;
pub mod kv;
mod mxfp4;
pub mod panel;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;
mod q8_1;
mod q8_k;
pub mod quantize;
mod tq1_0;
mod tq2_0;
pub mod types;

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(test)]
mod tests;

use std::sync::OnceLock;

pub use types::{GgmlType, QK_K};

use crate::{Error, Result};

pub type DotFn = fn(n: usize, w: &[u8], a: &[u8]) -> f32;
pub type TileFn = fn(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]);
pub type GemmFn =
    fn(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], quants: &[u8], scales: &[f32], out: &mut [f32]);

pub use panel::{
    has_panels, pack_panel, panel_sizes, KPANEL_BLOCK, KPANEL_SCALES, PANEL_BLOCK, PANEL_SCALES,
};

/// Activation columns a GEMM microkernel handles at once.
pub const GEMM_COLS: usize = 8;

/// The function table for one weight format.
#[derive(Clone, Copy)]
pub struct QuantKernels {
    pub weight: GgmlType,
    pub act: GgmlType,
    pub dequantize: fn(src: &[u8], dst: &mut [f32]),
    pub quantize_act: fn(src: &[f32], dst: &mut [u8]),
    pub vec_dot: DotFn,
    pub vec_dot_tile: TileFn,
    /// The prefill microkernel, for formats that have one.
    pub gemm: Option<GemmFn>,
}

/// A tile kernel that is a loop over `$dot`.
macro_rules! tile_of {
    ($dot:path) => {{
        fn tile(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], out: &mut [f32]) {
            let nc = acts.len();
            for (r, w) in w_rows.iter().enumerate() {
                for (c, a) in acts.iter().enumerate() {
                    out[r * nc + c] = $dot(n, w, a);
                }
            }
        }
        tile as TileFn
    }};
}

macro_rules! table_tiled {
    ($w:expr, $act:expr, $deq:path, $qa:path, $dot:path, $tile:expr) => {
        QuantKernels {
            weight: $w,
            act: $act,
            dequantize: $deq,
            quantize_act: $qa,
            vec_dot: $dot,
            vec_dot_tile: $tile,
            gemm: None,
        }
    };
    ($w:expr, $act:expr, $deq:path, $qa:path, $dot:path, $tile:expr, $gemm:expr) => {
        QuantKernels {
            gemm: Some($gemm),
            ..table_tiled!($w, $act, $deq, $qa, $dot, $tile)
        }
    };
}

/// A GEMM kernel that is a loop over `$dot` (the scalar twin of the SIMD
/// microkernels; it reads the rows, not the panel).
macro_rules! gemm_of {
    ($dot:path) => {{
        fn gemm(n: usize, w_rows: &[&[u8]], acts: &[&[u8]], _: &[u8], _: &[f32], out: &mut [f32]) {
            let groups = acts.len().div_ceil(GEMM_COLS).max(1);
            for g in 0..groups {
                let group =
                    &acts[(g * GEMM_COLS).min(acts.len())..((g + 1) * GEMM_COLS).min(acts.len())];
                for (r, w) in w_rows.iter().enumerate() {
                    let o = (g * w_rows.len() + r) * GEMM_COLS;
                    let row = &mut out[o..o + GEMM_COLS];
                    row.fill(0.0); // columns past `acts` are padding
                    for (c, a) in group.iter().enumerate() {
                        row[c] = $dot(n, w, a);
                    }
                }
            }
        }
        gemm as GemmFn
    }};
}

macro_rules! table {
    ($w:expr, $act:expr, $deq:path, $qa:path, $dot:path) => {
        table_tiled!($w, $act, $deq, $qa, $dot, tile_of!($dot))
    };
}

use GgmlType as T;

/// The portable reference kernels, one per weight format.
static SCALAR: [QuantKernels; 25] = [
    table_tiled!(
        T::F32,
        T::F32,
        float::dequantize_f32,
        float::quantize_act_f32,
        float::vec_dot_f32,
        tile_of!(float::vec_dot_f32),
        gemm_of!(float::vec_dot_f32)
    ),
    table_tiled!(
        T::F16,
        T::F32,
        f16::dequantize,
        float::quantize_act_f32,
        f16::vec_dot,
        tile_of!(f16::vec_dot),
        gemm_of!(f16::vec_dot)
    ),
    table_tiled!(
        T::BF16,
        T::F32,
        bf16::dequantize,
        float::quantize_act_f32,
        bf16::vec_dot,
        tile_of!(bf16::vec_dot),
        gemm_of!(bf16::vec_dot)
    ),
    table_tiled!(
        T::Q8_0,
        T::Q8_0,
        q8_0::dequantize,
        q8_0::quantize,
        q8_0::vec_dot,
        tile_of!(q8_0::vec_dot),
        gemm_of!(q8_0::vec_dot)
    ),
    table_tiled!(
        T::Q4_1,
        T::Q8_1,
        q4_1::dequantize,
        q8_1::quantize,
        q4_1::vec_dot,
        tile_of!(q4_1::vec_dot),
        gemm_of!(q4_1::vec_dot)
    ),
    table_tiled!(
        T::Q4_0,
        T::Q8_0,
        q4_0::dequantize,
        q8_0::quantize,
        q4_0::vec_dot,
        tile_of!(q4_0::vec_dot),
        gemm_of!(q4_0::vec_dot)
    ),
    table_tiled!(
        T::Q5_0,
        T::Q8_0,
        q5_0::dequantize,
        q8_0::quantize,
        q5_0::vec_dot,
        tile_of!(q5_0::vec_dot),
        gemm_of!(q5_0::vec_dot)
    ),
    table_tiled!(
        T::Q5_1,
        T::Q8_1,
        q5_1::dequantize,
        q8_1::quantize,
        q5_1::vec_dot,
        tile_of!(q5_1::vec_dot),
        gemm_of!(q5_1::vec_dot)
    ),
    table!(
        T::Q2K,
        T::Q8K,
        q2_k::dequantize,
        q8_k::quantize,
        q2_k::vec_dot
    ),
    table!(
        T::Q3K,
        T::Q8K,
        q3_k::dequantize,
        q8_k::quantize,
        q3_k::vec_dot
    ),
    table_tiled!(
        T::Q4K,
        T::Q8K,
        q4_k::dequantize,
        q8_k::quantize,
        q4_k::vec_dot,
        tile_of!(q4_k::vec_dot),
        gemm_of!(q4_k::vec_dot)
    ),
    table!(
        T::Q5K,
        T::Q8K,
        q5_k::dequantize,
        q8_k::quantize,
        q5_k::vec_dot
    ),
    table_tiled!(
        T::Q6K,
        T::Q8K,
        q6_k::dequantize,
        q8_k::quantize,
        q6_k::vec_dot,
        tile_of!(q6_k::vec_dot),
        gemm_of!(q6_k::vec_dot)
    ),
    table_tiled!(
        T::IQ4NL,
        T::Q8_0,
        iq4_nl::dequantize,
        q8_0::quantize,
        iq4_nl::vec_dot,
        tile_of!(iq4_nl::vec_dot),
        gemm_of!(iq4_nl::vec_dot)
    ),
    table_tiled!(
        T::MXFP4,
        T::Q8_0,
        mxfp4::dequantize,
        q8_0::quantize,
        mxfp4::vec_dot,
        tile_of!(mxfp4::vec_dot),
        gemm_of!(mxfp4::vec_dot)
    ),
    table_tiled!(
        T::IQ4XS,
        T::Q8K,
        iq4_xs::dequantize,
        q8_k::quantize,
        iq4_xs::vec_dot,
        tile_of!(iq4_xs::vec_dot),
        gemm_of!(iq4_xs::vec_dot)
    ),
    table_tiled!(
        T::IQ3S,
        T::Q8K,
        iq3_s::dequantize,
        q8_k::quantize,
        iq3_s::vec_dot,
        tile_of!(iq3_s::vec_dot),
        gemm_of!(iq3_s::vec_dot)
    ),
    table_tiled!(
        T::IQ3XXS,
        T::Q8K,
        iq3_xxs::dequantize,
        q8_k::quantize,
        iq3_xxs::vec_dot,
        tile_of!(iq3_xxs::vec_dot),
        gemm_of!(iq3_xxs::vec_dot)
    ),
    table_tiled!(
        T::IQ2S,
        T::Q8K,
        iq2_s::dequantize,
        q8_k::quantize,
        iq2_s::vec_dot,
        tile_of!(iq2_s::vec_dot),
        gemm_of!(iq2_s::vec_dot)
    ),
    table_tiled!(
        T::IQ2XS,
        T::Q8K,
        iq2_xs::dequantize,
        q8_k::quantize,
        iq2_xs::vec_dot,
        tile_of!(iq2_xs::vec_dot),
        gemm_of!(iq2_xs::vec_dot)
    ),
    table_tiled!(
        T::IQ2XXS,
        T::Q8K,
        iq2_xxs::dequantize,
        q8_k::quantize,
        iq2_xxs::vec_dot,
        tile_of!(iq2_xxs::vec_dot),
        gemm_of!(iq2_xxs::vec_dot)
    ),
    table!(
        T::IQ1M,
        T::Q8K,
        iq1_m::dequantize,
        q8_k::quantize,
        iq1_m::vec_dot
    ),
    table!(
        T::IQ1S,
        T::Q8K,
        iq1_s::dequantize,
        q8_k::quantize,
        iq1_s::vec_dot
    ),
    table_tiled!(
        T::TQ2_0,
        T::Q8K,
        tq2_0::dequantize,
        q8_k::quantize,
        tq2_0::vec_dot,
        tile_of!(tq2_0::vec_dot),
        gemm_of!(tq2_0::vec_dot)
    ),
    table_tiled!(
        T::TQ1_0,
        T::Q8K,
        tq1_0::dequantize,
        q8_k::quantize,
        tq1_0::vec_dot,
        tile_of!(tq1_0::vec_dot),
        gemm_of!(tq1_0::vec_dot)
    ),
];

fn no_dot(_: usize, _: &[u8], _: &[u8]) -> f32 {
    0.0
}

/// Activation formats: dequantized (for tests and tools), never multiplied
/// as weights, so `kernels` does not offer them.
static DEQUANT_ONLY: [QuantKernels; 2] = [
    table!(T::Q8_1, T::Q8_1, q8_1::dequantize, q8_1::quantize, no_dot),
    table!(T::Q8K, T::Q8K, q8_k::dequantize, q8_k::quantize, no_dot),
];

/// AVX2 + FMA + F16C: every weight format has a SIMD dot and tile, and the
/// Q8 activation quantizers are vectorized; dequantization stays scalar
/// (it runs once per token for embeddings, not per weight).
#[cfg(target_arch = "x86_64")]
static AVX2: [QuantKernels; 25] = [
    // Float weights have no panel format: their "GEMM" is the dot kernel
    // over groups of GEMM_COLS tokens, which keeps those activations in L1
    // and the chunk's weight rows in L2 instead of streaming every token
    // past every row (same bits as the dot, so prefill equals decode).
    table_tiled!(
        T::F32,
        T::F32,
        float::dequantize_f32,
        float::quantize_act_f32,
        avx2::vec_dot_f32,
        tile_of!(avx2::vec_dot_f32),
        gemm_of!(avx2::vec_dot_f32)
    ),
    // Float weights have no panel format: their "GEMM" is the dot kernel
    // over groups of GEMM_COLS tokens, which keeps those activations in L1
    // and the chunk's weight rows in L2 instead of streaming every token
    // past every row (same bits as the dot, so prefill equals decode).
    table_tiled!(
        T::F16,
        T::F32,
        f16::dequantize,
        float::quantize_act_f32,
        avx2::vec_dot_f16,
        tile_of!(avx2::vec_dot_f16),
        gemm_of!(avx2::vec_dot_f16)
    ),
    // Float weights have no panel format: their "GEMM" is the dot kernel
    // over groups of GEMM_COLS tokens, which keeps those activations in L1
    // and the chunk's weight rows in L2 instead of streaming every token
    // past every row (same bits as the dot, so prefill equals decode).
    table_tiled!(
        T::BF16,
        T::F32,
        bf16::dequantize,
        float::quantize_act_f32,
        avx2::vec_dot_bf16,
        tile_of!(avx2::vec_dot_bf16),
        gemm_of!(avx2::vec_dot_bf16)
    ),
    table_tiled!(
        T::Q8_0,
        T::Q8_0,
        q8_0::dequantize,
        avx2::quantize_q8_0,
        avx2::vec_dot_q8_0,
        avx2::tile_q8_0,
        avx2::gemm_q8_0
    ),
    table_tiled!(
        T::Q4_1,
        T::Q8_1,
        q4_1::dequantize,
        avx2::quantize_q8_1,
        avx2::vec_dot_q4_1,
        avx2::tile_q4_1,
        avx2::gemm_q4_1
    ),
    table_tiled!(
        T::Q4_0,
        T::Q8_0,
        q4_0::dequantize,
        avx2::quantize_q8_0,
        avx2::vec_dot_q4_0,
        avx2::tile_q4_0,
        avx2::gemm_q4_0
    ),
    table_tiled!(
        T::Q5_0,
        T::Q8_0,
        q5_0::dequantize,
        avx2::quantize_q8_0,
        avx2::vec_dot_q5_0,
        avx2::tile_q5_0,
        avx2::gemm_q5_0
    ),
    table_tiled!(
        T::Q5_1,
        T::Q8_1,
        q5_1::dequantize,
        avx2::quantize_q8_1,
        avx2::vec_dot_q5_1,
        avx2::tile_q5_1,
        avx2::gemm_q5_1
    ),
    table_tiled!(
        T::Q2K,
        T::Q8K,
        q2_k::dequantize,
        avx2::quantize_q8_k,
        avx2::vec_dot_q2_k,
        avx2::tile_q2_k
    ),
    table_tiled!(
        T::Q3K,
        T::Q8K,
        q3_k::dequantize,
        avx2::quantize_q8_k,
        avx2::vec_dot_q3_k,
        avx2::tile_q3_k
    ),
    table_tiled!(
        T::Q4K,
        T::Q8K,
        q4_k::dequantize,
        avx2::quantize_q8_k,
        avx2::vec_dot_q4_k,
        avx2::tile_q4_k,
        avx2::gemm_q4_k
    ),
    table_tiled!(
        T::Q5K,
        T::Q8K,
        q5_k::dequantize,
        avx2::quantize_q8_k,
        avx2::vec_dot_q5_k,
        avx2::tile_q5_k
    ),
    table_tiled!(
        T::Q6K,
        T::Q8K,
        q6_k::dequantize,
        avx2::quantize_q8_k,
        avx2::vec_dot_q6_k,
        avx2::tile_q6_k,
        avx2::gemm_q6_k
    ),
    table_tiled!(
        T::IQ4NL,
        T::Q8_0,
        iq4_nl::dequantize,
        avx2::quantize_q8_0,
        avx2::vec_dot_iq4_nl,
        avx2::tile_iq4_nl,
        avx2::gemm_iq4_nl
    ),
    table_tiled!(
        T::MXFP4,
        T::Q8_0,
        mxfp4::dequantize,
        avx2::quantize_q8_0,
        avx2::vec_dot_mxfp4,
        avx2::tile_mxfp4,
        avx2::gemm_mxfp4
    ),
    table_tiled!(
        T::IQ4XS,
        T::Q8K,
        iq4_xs::dequantize,
        avx2::quantize_q8_k,
        avx2::vec_dot_iq4_xs,
        avx2::tile_iq4_xs,
        avx2::gemm_iq4_xs
    ),
    table_tiled!(
        T::IQ3S,
        T::Q8K,
        iq3_s::dequantize,
        avx2::quantize_q8_k,
        avx2::vec_dot_iq3_s,
        avx2::tile_iq3_s,
        avx2::gemm_iq3_s
    ),
    table_tiled!(
        T::IQ3XXS,
        T::Q8K,
        iq3_xxs::dequantize,
        avx2::quantize_q8_k,
        avx2::vec_dot_iq3_xxs,
        avx2::tile_iq3_xxs,
        avx2::gemm_iq3_xxs
    ),
    table_tiled!(
        T::IQ2S,
        T::Q8K,
        iq2_s::dequantize,
        avx2::quantize_q8_k,
        avx2::vec_dot_iq2_s,
        avx2::tile_iq2_s,
        avx2::gemm_iq2_s
    ),
    table_tiled!(
        T::IQ2XS,
        T::Q8K,
        iq2_xs::dequantize,
        avx2::quantize_q8_k,
        avx2::vec_dot_iq2_xs,
        avx2::tile_iq2_xs,
        avx2::gemm_iq2_xs
    ),
    table_tiled!(
        T::IQ2XXS,
        T::Q8K,
        iq2_xxs::dequantize,
        avx2::quantize_q8_k,
        avx2::vec_dot_iq2_xxs,
        avx2::tile_iq2_xxs,
        avx2::gemm_iq2_xxs
    ),
    table_tiled!(
        T::IQ1M,
        T::Q8K,
        iq1_m::dequantize,
        avx2::quantize_q8_k,
        avx2::vec_dot_iq1_m,
        avx2::tile_iq1_m
    ),
    table_tiled!(
        T::IQ1S,
        T::Q8K,
        iq1_s::dequantize,
        avx2::quantize_q8_k,
        avx2::vec_dot_iq1_s,
        avx2::tile_iq1_s
    ),
    table_tiled!(
        T::TQ2_0,
        T::Q8K,
        tq2_0::dequantize,
        avx2::quantize_q8_k,
        avx2::vec_dot_tq2_0,
        avx2::tile_tq2_0,
        avx2::gemm_tq2_0
    ),
    table_tiled!(
        T::TQ1_0,
        T::Q8K,
        tq1_0::dequantize,
        avx2::quantize_q8_k,
        avx2::vec_dot_tq1_0,
        avx2::tile_tq1_0,
        avx2::gemm_tq1_0
    ),
];

/// Name of the SIMD level the dispatcher picked: "avx512vnni" (the AVX2
/// kernels with their AVX-512 VNNI twins for the 32-element formats),
/// "avx2" or "scalar".
pub fn simd_level() -> &'static str {
    static LEVEL: OnceLock<&'static str> = OnceLock::new();
    LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            return if avx2::vnni() { "avx512vnni" } else { "avx2" };
        }
        "scalar"
    })
}

/// Most tokens of one product that go through the tile kernel rather than
/// the GEMM (which costs the same for one token as for eight). Measured
/// with SmolLM2 Q4_1 relative to one decode step: through the AVX2 tiles
/// 2 tokens cost 1.72 and through the GEMM 2.62, 3 tokens 2.26 and 2.67,
/// 4 tokens 2.97 and 2.46. The AVX-512 VNNI tile of the 32-element
/// formats adds much less per token (see `avx2::wide_tile_tokens`). Both
/// paths form each block sum the same way, so the bits do not depend on
/// the choice.
pub fn tile_tokens(ty: GgmlType) -> usize {
    #[cfg(target_arch = "x86_64")]
    if simd_level() != "scalar" {
        if let Some(n) = avx2::wide_tile_tokens(ty) {
            return n;
        }
    }
    3
}

/// Whether the GEMM of `ty` on this CPU reads only the activation rows
/// (`GemmFn`'s `acts`), so the panels need not be packed for it.
pub fn gemm_reads_rows(ty: GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    if simd_level() != "scalar" {
        return avx2::gemm_reads_rows(ty);
    }
    false
}

/// Rows per group of a packed matrix (see `pack_matrix`).
pub const PACKED_GROUP_ROWS: usize = 16;

/// Most tokens of one product that take the packed decode kernel (more go
/// through the GEMM, which reads the file's layout).
pub const PACKED_TOKENS: usize = 8;

/// Whether weights may leave the model file's pages for memory of our
/// own (repacked layouts, copies on huge pages): yes unless
/// `OXILLAMA_REPACK=0`, which keeps every matrix in the file's pages, the
/// page cache that several processes on one model file share. Decided
/// once per process.
pub fn weights_may_move() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("OXILLAMA_REPACK").is_none_or(|v| v != "0"))
}

/// Whether matrices of `ty` are repacked for decode on this CPU: Q4_K,
/// Q6_K, Q8_0, IQ4_XS, TQ2_0, the grid i-quants (IQ3_S, IQ3_XXS, IQ2_S,
/// IQ2_XS, IQ2_XXS), Q4_0, Q4_1, Q5_0 and Q5_1 where AVX-512 VNNI (and,
/// for the last four, VBMI) is available, unless `OXILLAMA_REPACK=0`.
/// Decided once per process.
pub fn packs(ty: GgmlType) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if simd_level() != "scalar" && avx2::q4k_packed::available() {
            return weights_may_move();
        }
        false
    });
    #[cfg(target_arch = "x86_64")]
    if on && avx2::q4_packed::packed_block(ty).is_some() {
        return avx2::q4_packed::available();
    }
    #[cfg(target_arch = "x86_64")]
    if on && avx2::grid_packed::format(ty).is_some() {
        return true;
    }
    on && matches!(
        ty,
        GgmlType::Q4K | GgmlType::Q6K | GgmlType::Q8_0 | GgmlType::IQ4XS | GgmlType::TQ2_0
    )
}

/// Bytes of the decode layout of a `rows x cols` matrix of `ty`, when
/// `packs(ty)` and its rows come in whole groups.
pub fn packed_len(ty: GgmlType, rows: usize, cols: usize) -> Option<usize> {
    if !packs(ty) || !rows.is_multiple_of(PACKED_GROUP_ROWS) {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    return match ty {
        GgmlType::Q4K if cols.is_multiple_of(QK_K) => {
            Some(rows / PACKED_GROUP_ROWS * (cols / QK_K) * avx2::q4k_packed::PACKED_BLOCK)
        }
        GgmlType::Q6K if cols.is_multiple_of(QK_K) => {
            Some(rows / PACKED_GROUP_ROWS * (cols / QK_K) * avx2::q6k_packed::PACKED_BLOCK)
        }
        GgmlType::IQ4XS if cols.is_multiple_of(QK_K) => {
            Some(rows / PACKED_GROUP_ROWS * (cols / QK_K) * avx2::iq4xs_packed::PACKED_BLOCK)
        }
        GgmlType::TQ2_0 if cols.is_multiple_of(QK_K) => {
            Some(rows / PACKED_GROUP_ROWS * (cols / QK_K) * avx2::tq2_packed::PACKED_BLOCK)
        }
        _ if avx2::grid_packed::format(ty).is_some() && cols.is_multiple_of(QK_K) => {
            Some(rows / PACKED_GROUP_ROWS * (cols / QK_K) * avx2::grid_packed::PACKED_BLOCK)
        }
        GgmlType::Q8_0 if cols.is_multiple_of(32) => {
            Some(rows / PACKED_GROUP_ROWS * (cols / 32) * avx2::q8_0_packed::PACKED_BLOCK)
        }
        _ if cols.is_multiple_of(32) => {
            avx2::q4_packed::packed_block(ty).map(|b| rows / PACKED_GROUP_ROWS * (cols / 32) * b)
        }
        _ => None,
    };
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Writes the decode layout of a `rows x cols` matrix of `ty` (the file's
/// bytes in `data`) into `out` (`packed_len` bytes); false (and `out`
/// untouched) where the matrix is not packed.
pub fn pack_matrix_into(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: &[u8],
    out: &mut [u8],
) -> bool {
    let ok = packed_len(ty, rows, cols) == Some(out.len())
        && ty.row_bytes(cols).and_then(|rb| rb.checked_mul(rows)) == Some(data.len());
    #[cfg(target_arch = "x86_64")]
    if ok {
        match ty {
            GgmlType::Q4K => avx2::q4k_packed::pack(rows, cols, data, out),
            GgmlType::Q6K => avx2::q6k_packed::pack(rows, cols, data, out),
            GgmlType::Q8_0 => avx2::q8_0_packed::pack(rows, cols, data, out),
            GgmlType::IQ4XS => avx2::iq4xs_packed::pack(rows, cols, data, out),
            GgmlType::TQ2_0 => avx2::tq2_packed::pack(rows, cols, data, out),
            _ if avx2::grid_packed::format(ty).is_some() => {
                avx2::grid_packed::pack(ty, rows, cols, data, out)
            }
            _ => avx2::q4_packed::pack_for(ty, rows, cols, data, out),
        }
    }
    ok
}

/// `pack_matrix_into` into a new buffer.
pub fn pack_matrix(ty: GgmlType, rows: usize, cols: usize, data: &[u8]) -> Option<Vec<u8>> {
    let mut out = vec![0u8; packed_len(ty, rows, cols)?];
    pack_matrix_into(ty, rows, cols, data, &mut out).then_some(out)
}

/// Whether a prefill's GEMM reads a packed matrix of `ty` from its packed
/// form (Q6_K through `unpack_rows`, the grid i-quants through
/// `packed_gemm`), so the file's pages are not needed after packing.
pub fn gemm_reads_packed(ty: GgmlType) -> bool {
    packs(ty) && (ty == GgmlType::Q6K || packed_gemm_runs(ty))
}

/// Whether the prefill GEMM of `ty` runs on the packed copy itself
/// (`packed_gemm`): the grid i-quants and IQ4_XS where the AVX-512 VNNI
/// GEMM runs.
/// Their file blocks cost a grid lookup per four or eight weights to
/// decode, once per row group per call; the packed codes cost a `vpshufb`
/// per 64 (IQ3_S's prefill on Zen 4: 130 tok/s from the file's blocks).
pub fn packed_gemm_runs(ty: GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    if packs(ty) && (avx2::grid_packed::format(ty).is_some() || ty == GgmlType::IQ4XS) {
        return avx2::grid_packed::gemm_available();
    }
    let _ = ty;
    false
}

/// Row groups `g0..g1` of a packed matrix of `ty` (`packed_gemm_runs`)
/// against the Q8_K rows `acts`, in `GemmFn`'s layout for those rows. Same
/// bits as the file layout's GEMM.
pub fn packed_gemm(
    ty: GgmlType,
    cols: usize,
    packed: &[u8],
    groups: (usize, usize),
    acts: &[&[u8]],
    out: &mut [f32],
) {
    assert!(
        packed_gemm_runs(ty),
        "{} has no packed GEMM here",
        ty.name()
    );
    #[cfg(target_arch = "x86_64")]
    avx2::grid_packed::gemm(ty, cols, packed, groups, acts, out);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (cols, packed, groups, acts, out);
}

/// Rows `16 * g0 .. 16 * g1` of a packed matrix of `ty` (`gemm_reads_packed`)
/// back in the file's layout, into `out` (their bytes).
pub fn unpack_rows(
    ty: GgmlType,
    cols: usize,
    packed: &[u8],
    groups: (usize, usize),
    out: &mut [u8],
) {
    assert!(
        gemm_reads_packed(ty) && ty == GgmlType::Q6K,
        "{} is not unpacked",
        ty.name()
    );
    #[cfg(target_arch = "x86_64")]
    avx2::q6k_packed::unpack(cols / QK_K, packed, groups, out);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (cols, packed, groups, out);
}

/// An activation block's scalars as the packed kernels of the 32-element
/// formats read them: `d` and, for Q8_1, `s` as f32 (the f16 values of the
/// block, converted), and `off` the block's quant sum times the weight
/// format's unsigned offset (Q4_0, Q5_0, Q8_0). One table per product
/// (`packed_side`) serves every group of rows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockSide {
    pub d: f32,
    pub s: f32,
    pub off: i32,
}

/// Writes into `out` what `packed_tile` reads of the activation rows
/// `acts` (rows of `n` elements) against packed `ty` weights: a
/// `BlockSide` per block, token after token, or nothing for the formats
/// whose activations carry f32 scalars of their own (Q4_K, Q6_K).
pub fn packed_side(ty: GgmlType, n: usize, acts: &[&[u8]], out: &mut Vec<BlockSide>) {
    out.clear();
    assert!(packs(ty), "{} matrices are not packed here", ty.name());
    #[cfg(target_arch = "x86_64")]
    match ty {
        GgmlType::Q4K | GgmlType::Q6K | GgmlType::IQ4XS | GgmlType::TQ2_0 => {}
        _ if avx2::grid_packed::format(ty).is_some() => {}
        GgmlType::Q8_0 => avx2::q8_0_packed::side(n, acts, out),
        _ => avx2::q4_packed::side_for(ty, n, acts, out),
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (n, acts);
}

/// Row groups `g0..g1` of a packed matrix against each activation row (in
/// `ty`'s activation format; `side` what `packed_side` wrote for them):
/// `outs[t][(g - g0) * 16 + r]` for row `16g + r`. Same bits as
/// `vec_dot`. Call only for matrices `pack_matrix` packed.
pub fn packed_tile(
    ty: GgmlType,
    n: usize,
    packed: &[u8],
    groups: (usize, usize),
    acts: &[&[u8]],
    side: &[BlockSide],
    outs: &mut [&mut [f32]],
) {
    assert!(packs(ty), "{} matrices are not packed here", ty.name());
    #[cfg(target_arch = "x86_64")]
    match ty {
        GgmlType::Q4K => avx2::q4k_packed::tile(n, packed, groups, acts, outs),
        GgmlType::Q6K => avx2::q6k_packed::tile(n, packed, groups, acts, outs),
        GgmlType::IQ4XS => avx2::iq4xs_packed::tile(n, packed, groups, acts, outs),
        GgmlType::TQ2_0 => avx2::tq2_packed::tile(n, packed, groups, acts, outs),
        _ if avx2::grid_packed::format(ty).is_some() => {
            avx2::grid_packed::tile(ty, n, packed, groups, acts, outs)
        }
        GgmlType::Q8_0 => avx2::q8_0_packed::tile(n, packed, groups, acts, side, outs),
        _ => avx2::q4_packed::tile_for(ty, n, packed, groups, acts, side, outs),
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (n, packed, groups, acts, side, outs);
}

/// The portable reference implementation for weight type `ty`.
pub fn scalar_kernels(ty: GgmlType) -> Option<&'static QuantKernels> {
    SCALAR.iter().find(|k| k.weight == ty)
}

/// The fastest implementation of weight type `ty` on this CPU, decided once
/// per process. `None` for Q8_1/Q8_K, which are only activation formats.
pub fn kernels(ty: GgmlType) -> Option<&'static QuantKernels> {
    static BEST: OnceLock<Vec<&'static QuantKernels>> = OnceLock::new();
    let best = BEST.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if simd_level() != "scalar" {
            return AVX2.iter().collect();
        }
        SCALAR.iter().collect()
    });
    best.iter().copied().find(|k| k.weight == ty)
}

/// The kernel table entry able to dequantize `ty` (every GGUF format).
fn dequantizer(ty: GgmlType) -> Option<&'static QuantKernels> {
    SCALAR
        .iter()
        .chain(DEQUANT_ONLY.iter())
        .find(|k| k.weight == ty)
}

/// Dequantizes one row, checking lengths (never panics on bad input).
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let k = dequantizer(ty)
        .ok_or_else(|| Error::invalid(format!("no dequantization kernel for {}", ty.name())))?;
    match ty.row_bytes(dst.len()) {
        Some(n) if n == src.len() => {
            (k.dequantize)(src, dst);
            Ok(())
        }
        _ => Err(Error::invalid(format!(
            "{} row of {} elements needs {:?} bytes, got {}",
            ty.name(),
            dst.len(),
            ty.row_bytes(dst.len()),
            src.len()
        ))),
    }
}
