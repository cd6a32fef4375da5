//! TQ1_0 and TQ2_0 rows as ggml's reference writes them (no importance
//! vector): `d = amax`, each value `round(x / d)` in {-1, 0, 1}.

use super::super::block::put_f16;
use super::super::QK_K;

fn amax_of(x: &[f32]) -> f32 {
    let mut amax = 0f32;
    for &v in x {
        let a = v.abs();
        amax = if amax > a { amax } else { a };
    }
    amax
}

/// The trit of `v` (0, 1, 2 for -1, 0, 1), ggml's `lroundf(v * id) + 1`.
#[inline]
fn trit(v: f32, id: f32) -> u8 {
    ((v * id).round() as i32 + 1) as u8
}

pub fn quantize_tq1_0(x: &[f32], _qw: Option<&[f32]>, out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(54)) {
        let d = amax_of(xb);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        // Five trits a byte along 32 bytes, then along 16, then four a
        // byte in qh; each stored as ceil(q * 256 / 243).
        let pack = |q: u16| (q * 256).div_ceil(243) as u8;
        let mut off = 0;
        for m in 0..32 {
            let mut q = 0u16;
            for n in 0..5 {
                q = q * 3 + trit(xb[off + m + 32 * n], id) as u16;
            }
            b[m] = pack(q & 0xff);
        }
        off += 160;
        for m in 0..16 {
            let mut q = 0u16;
            for n in 0..5 {
                q = q * 3 + trit(xb[off + m + 16 * n], id) as u16;
            }
            b[32 + m] = pack(q & 0xff);
        }
        off += 80;
        for j in 0..4 {
            let mut q = 0u16;
            for m in 0..4 {
                q = q * 3 + trit(xb[off + j + 4 * m], id) as u16;
            }
            b[48 + j] = pack((q * 3) & 0xff);
        }
        put_f16(b, 52, d);
    }
}

pub fn quantize_tq2_0(x: &[f32], _qw: Option<&[f32]>, out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(66)) {
        let d = amax_of(xb);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for j in (0..64).step_by(32) {
            for m in 0..32 {
                let mut q = 0u8;
                for n in 0..4 {
                    q += (trit(xb[4 * j + m + 32 * n], id) & 3) << (2 * n);
                }
                b[j + m] = q;
            }
        }
        put_f16(b, 64, d);
    }
}
