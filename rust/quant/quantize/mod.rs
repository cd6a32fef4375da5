//! Quantization of float rows into the block formats, byte for byte as
//! ggml's quantizers write them (what `llama-quantize` calls through
//! `ggml_quantize_chunk`), one file per format over the shared scale
//! searches in `search`.
//!
//! Every quantizer takes one row of `n_per_row` floats and, optionally,
//! that row's importance vector (one weight per column, from an imatrix);
//! ggml's reference path runs without one, its weighted path with one.
//! Rows are independent, so a matrix is quantized in parallel by rows and
//! the bytes do not depend on the thread count.
//!
//! The loops index their arrays the way ggml's do, so each line can be
//! checked against ggml's operation order.
#![allow(clippy::needless_range_loop)]

mod iq1;
mod iq2;
mod iq3;
mod iq4;
mod iq_search;
mod iq_tables;
mod mxfp4;
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
pub mod search;
mod ternary;

use super::GgmlType;
use crate::threadpool::{SharedMut, ThreadPool};
use crate::{Error, Result};

/// Quantizes one row; `qw` is the row's importance vector (`x.len()`
/// weights) or `None`; `out` is exactly the row's bytes.
pub type RowFn = fn(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]);

/// `sum x^2 / n` over a whole row, the legacy formats' `sigma2`.
fn sigma2(x: &[f32]) -> f32 {
    let mut s = 0f32;
    for &v in x {
        s += v * v;
    }
    s / x.len() as f32
}

/// The row quantizer for `ty`, where we write that format.
pub fn row_quantizer(ty: GgmlType) -> Option<RowFn> {
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => q4_0::quantize,
        T::Q4_1 => q4_1::quantize,
        T::Q5_0 => q5_0::quantize,
        T::Q5_1 => q5_1::quantize,
        T::Q8_0 => q8_0::quantize,
        T::Q2K => q2_k::quantize,
        T::Q3K => q3_k::quantize,
        T::Q4K => q4_k::quantize,
        T::Q5K => q5_k::quantize,
        T::Q6K => q6_k::quantize,
        T::IQ4NL => iq4::quantize_nl,
        T::IQ4XS => iq4::quantize_xs,
        T::IQ3XXS => iq3::quantize_xxs,
        T::IQ3S => iq3::quantize_s,
        T::IQ2XXS => iq2::quantize_xxs,
        T::IQ2XS => iq2::quantize_xs,
        T::IQ2S => iq2::quantize_s,
        T::IQ1S => iq1::quantize_s,
        T::IQ1M => iq1::quantize_m,
        T::MXFP4 => mxfp4::quantize,
        T::TQ1_0 => ternary::quantize_tq1_0,
        T::TQ2_0 => ternary::quantize_tq2_0,
        _ => return None,
    })
}

/// Whether ggml's quantizer for `ty` reads an importance vector.
pub fn uses_imatrix(ty: GgmlType) -> bool {
    use GgmlType as T;
    matches!(
        ty,
        T::Q4_0 | T::Q4_1 | T::Q5_0 | T::Q5_1 | T::Q2K | T::Q3K | T::Q4K | T::Q5K | T::Q6K
    ) || matches!(
        ty,
        T::IQ4NL
            | T::IQ4XS
            | T::IQ3XXS
            | T::IQ3S
            | T::IQ2XXS
            | T::IQ2XS
            | T::IQ2S
            | T::IQ1S
            | T::IQ1M
    )
}

/// Whether ggml's quantizer for `ty` refuses to run without an importance
/// vector (`ggml_quantize_requires_imatrix`).
pub fn requires_imatrix(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::IQ2XXS | GgmlType::IQ2XS | GgmlType::IQ1S)
}

/// Rows per parallel chunk: enough work (~16K elements, as llama.cpp's
/// chunks) to pay for a claim.
fn rows_per_chunk(n_per_row: usize) -> usize {
    (16 * 1024usize).div_ceil(n_per_row.max(1)).max(1)
}

/// Quantizes the rows of `src` (`n_per_row` floats each) into `dst`
/// (`ty.row_bytes(n_per_row)` bytes each), on `pool` when given. The
/// importance vector, when given, has `n_per_row` weights and applies to
/// every row.
pub fn quantize_rows(
    ty: GgmlType,
    src: &[f32],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
    dst: &mut [u8],
    pool: Option<&ThreadPool>,
) -> Result<()> {
    let f = row_quantizer(ty)
        .ok_or_else(|| Error::invalid(format!("no quantizer writes {}", ty.name())))?;
    let row_bytes = ty
        .row_bytes(n_per_row)
        .filter(|_| n_per_row > 0)
        .ok_or_else(|| {
            Error::invalid(format!(
                "rows of {n_per_row} elements are not whole {} blocks of {}",
                ty.name(),
                ty.block_size()
            ))
        })?;
    if !src.len().is_multiple_of(n_per_row) {
        return Err(Error::invalid(format!(
            "{} floats are not whole rows of {n_per_row}",
            src.len()
        )));
    }
    let n_rows = src.len() / n_per_row;
    if dst.len() != n_rows * row_bytes {
        return Err(Error::invalid(format!(
            "{n_rows} rows of {} need {} bytes, got {}",
            ty.name(),
            n_rows * row_bytes,
            dst.len()
        )));
    }
    if let Some(w) = imatrix {
        if w.len() != n_per_row {
            return Err(Error::invalid(format!(
                "an importance vector of {} weights for rows of {n_per_row}",
                w.len()
            )));
        }
    }
    if imatrix.is_none() && requires_imatrix(ty) {
        return Err(Error::invalid(format!(
            "{} needs an importance vector (an imatrix)",
            ty.name()
        )));
    }
    let qw = imatrix.filter(|_| uses_imatrix(ty));
    let per = rows_per_chunk(n_per_row);
    let n_chunks = n_rows.div_ceil(per);
    let run_chunk = |c: usize, out: &mut [u8]| {
        let r0 = c * per;
        let r1 = ((c + 1) * per).min(n_rows);
        for (r, o) in (r0..r1).zip(out.chunks_exact_mut(row_bytes)) {
            f(&src[r * n_per_row..(r + 1) * n_per_row], qw, o);
        }
    };
    match pool {
        Some(pool) if n_chunks > 1 => {
            let shared = SharedMut::new(dst);
            pool.run(n_chunks, |c| {
                let (r0, r1) = (c * per, ((c + 1) * per).min(n_rows));
                // SAFETY: chunk c alone writes rows r0..r1; chunks do not
                // overlap, and `dst` outlives the dispatch.
                let out = unsafe { shared.slice(r0 * row_bytes, (r1 - r0) * row_bytes) };
                run_chunk(c, out);
            });
        }
        _ => {
            for c in 0..n_chunks {
                let (r0, r1) = (c * per, ((c + 1) * per).min(n_rows));
                run_chunk(c, &mut dst[r0 * row_bytes..r1 * row_bytes]);
            }
        }
    }
    Ok(())
}
