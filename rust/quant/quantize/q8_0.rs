//! Q8_0 rows as ggml's `quantize_row_q8_0_ref` writes them (the importance
//! vector does not apply): `d = amax / 127`, values `round(x / d)` half
//! away from zero.

use super::super::block::put_f16;
use super::super::q8_0::{BLOCK, QK};

pub fn quantize(x: &[f32], _qw: Option<&[f32]>, out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK).zip(out.chunks_exact_mut(BLOCK)) {
        let mut amax = 0f32;
        for &v in xb {
            let a = v.abs();
            amax = if amax > a { amax } else { a };
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, 0, d);
        for (q, &v) in b[2..].iter_mut().zip(xb) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}
