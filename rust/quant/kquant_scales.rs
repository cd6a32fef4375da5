//! The packed 6-bit scale/min pairs shared by Q4_K and Q5_K.

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// All eight scales and all eight mins, each as eight bytes of a u64
/// (sub-block j in byte j): `scale_min_k4` for every j at once, on words.
#[inline]
pub fn scales_mins(q: &[u8]) -> (u64, u64) {
    let w = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (u0, u1, u2) = (w(0), w(1), w(2));
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const TOP2: u32 = 0x0303_0303;
    let sc_hi = (u2 & LOW4) | (((u0 >> 6) & TOP2) << 4);
    let mn_hi = ((u2 >> 4) & LOW4) | (((u1 >> 6) & TOP2) << 4);
    (
        (u0 & LOW6) as u64 | (sc_hi as u64) << 32,
        (u1 & LOW6) as u64 | (mn_hi as u64) << 32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn word_unpack_equals_bytewise() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..1000 {
            let q: [u8; 12] = rng.random();
            let (sc, mn) = scales_mins(&q);
            for j in 0..8 {
                let (s, m) = scale_min_k4(j, &q);
                assert_eq!(((sc >> (8 * j)) & 0xff) as u8, s);
                assert_eq!(((mn >> (8 * j)) & 0xff) as u8, m);
            }
        }
    }
}
