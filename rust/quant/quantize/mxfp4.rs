//! MXFP4 rows as ggml's `quantize_row_mxfp4_ref` writes them (no
//! importance vector): the shared exponent from `floor(log2(amax)) - 2`,
//! each value the nearest e2m1 level, first one on ties.

use super::super::iq_common::KVALUES_MXFP4;
use super::super::mxfp4::e8m0_half;

fn best_index(x: f32, e: f32) -> u8 {
    let mut best = 0;
    let mut best_err = (KVALUES_MXFP4[0] as f32 * e - x).abs();
    for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (k as f32 * e - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

pub fn quantize(x: &[f32], _qw: Option<&[f32]>, out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(32).zip(out.chunks_exact_mut(17)) {
        let mut amax = 0f32;
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
            }
        }
        // ggml converts the float straight to uint8_t; out of range (amax
        // below 2^-125) that is x86's truncation through int32.
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as i32 as u8
        } else {
            0
        };
        let d = e8m0_half(e);
        b[0] = e;
        for j in 0..16 {
            b[1 + j] = best_index(xb[j], d) | (best_index(xb[j + 16], d) << 4);
        }
    }
}
