//! Q5_K rows as ggml writes them: Q4_K's scales and mins for 31 levels,
//! the fifth bits in `qh`.

use super::super::QK_K;
use super::q4_k::scales_and_mins;

const BLOCK: usize = 176;

pub fn quantize(x: &[f32], qw: Option<&[f32]>, out: &mut [u8]) {
    let mut l = [0u8; QK_K];
    for (i, (xb, b)) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(BLOCK))
        .enumerate()
    {
        scales_and_mins(31, xb, qw.map(|q| &q[QK_K * i..QK_K * (i + 1)]), &mut l, b);
        b[16..48].fill(0);
        let (mut m1, mut m2) = (1u8, 2u8);
        for (g, n) in (0..QK_K).step_by(64).enumerate() {
            for j in 0..32 {
                let mut l1 = l[n + j];
                if l1 > 15 {
                    l1 -= 16;
                    b[16 + j] |= m1;
                }
                let mut l2 = l[n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    b[16 + j] |= m2;
                }
                b[48 + 32 * g + j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
    }
}
