//! The orthonormal Walsh-Hadamard rotation of quantized KV rows.
//!
//! A quantized cache spends one scale per 32 elements on the block's
//! largest magnitude; a few large coordinates (keys have outlier channels)
//! leave the rest of the block a handful of levels. Rotating every head's
//! rows by an orthonormal Hadamard matrix `H` spreads each coordinate over
//! the whole block, so blocks hold values of similar size and q4_0 loses
//! far less. Attention is unchanged in exact arithmetic: `(H q)·(H k) =
//! q·k`, and `H` is symmetric with `H H = I`, so the same transform undoes
//! itself on the attention output of rotated values.
//!
//! `H` is Sylvester's matrix scaled by `1/sqrt(n)`:
//! `H[i][j] = (-1)^popcount(i & j) / sqrt(n)`, the natural-order matrix
//! llama.cpp builds (`ggml_gen_hadamard`). The fast transform multiplies by
//! it in `n log n` additions. Its rounding matches ggml's CPU kernel for
//! that product: scale first, then the butterflies from stride 1 upward,
//! each an exact `u + v` and `u - v` of f32s.

/// Rotates each consecutive block of `n` elements of `x` in place by the
/// `n x n` orthonormal Hadamard matrix. `n` is a power of two and divides
/// `x.len()`; `n == 0` leaves `x` alone (no rotation).
pub fn rotate(x: &mut [f32], n: usize) {
    if n == 0 {
        return;
    }
    assert!(
        n.is_power_of_two() && x.len().is_multiple_of(n),
        "Hadamard blocks of {n} do not tile {} elements",
        x.len()
    );
    let scale = 1.0 / (n as f32).sqrt();
    for block in x.chunks_exact_mut(n) {
        block.iter_mut().for_each(|v| *v *= scale);
        let mut len = 1;
        while len < n {
            for pair in block.chunks_exact_mut(2 * len) {
                let (lo, hi) = pair.split_at_mut(len);
                // Same-length slices: the compiler vectorizes from len 8 on.
                for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                    let (u, v) = (*a, *b);
                    *a = u + v;
                    *b = u - v;
                }
            }
            len *= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `H x` in f64 straight from the matrix's closed form.
    fn oracle(x: &[f32], n: usize) -> Vec<f64> {
        let s = 1.0 / (n as f64).sqrt();
        x.chunks_exact(n)
            .flat_map(|b| {
                (0..n).map(move |i| {
                    (0..n)
                        .map(|j| {
                            let sign = if (i & j).count_ones() % 2 == 0 {
                                1.0
                            } else {
                                -1.0
                            };
                            sign * s * b[j] as f64
                        })
                        .sum::<f64>()
                })
            })
            .collect()
    }

    fn sample(len: usize, seed: u64) -> Vec<f32> {
        let mut st = seed;
        (0..len)
            .map(|_| {
                st = st
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((st >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
            })
            .collect()
    }

    #[test]
    fn matches_the_matrix_product() {
        for n in [1, 2, 4, 8, 16, 32, 64, 128, 256] {
            let x = sample(3 * n, n as u64);
            let mut y = x.clone();
            rotate(&mut y, n);
            let want = oracle(&x, n);
            let norm = x.iter().map(|v| v.abs()).fold(0f32, f32::max) as f64;
            for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
                assert!(
                    (g as f64 - w).abs() <= 1e-6 * norm * (n as f64).sqrt(),
                    "n {n} [{i}]: {g} vs {w}"
                );
            }
        }
    }

    #[test]
    fn is_its_own_inverse_and_keeps_norms() {
        for n in [64, 128, 256] {
            let x = sample(2 * n, 7 + n as u64);
            let mut y = x.clone();
            rotate(&mut y, n);
            let (nx, ny) = (
                x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>(),
                y.iter().map(|v| (*v as f64).powi(2)).sum::<f64>(),
            );
            assert!(
                (nx - ny).abs() <= 1e-5 * nx,
                "n {n}: |x|^2 {nx}, |Hx|^2 {ny}"
            );
            rotate(&mut y, n);
            for (a, b) in x.iter().zip(&y) {
                assert!(
                    (a - b).abs() <= 1e-5 * a.abs().max(1.0),
                    "n {n}: {a} vs {b}"
                );
            }
        }
        let mut none = vec![1.5f32, -2.0];
        rotate(&mut none, 0);
        assert_eq!(none, [1.5, -2.0]);
    }

    #[test]
    fn keeps_dot_products() {
        let (q, k) = (sample(128, 1), sample(128, 2));
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let (mut hq, mut hk) = (q.clone(), k.clone());
        rotate(&mut hq, 64);
        rotate(&mut hk, 64);
        assert!((dot(&q, &k) - dot(&hq, &hk)).abs() < 1e-3, "dot changed");
    }

    /// A float64 numpy oracle (tests/reference/make_hadamard_oracle.py)
    /// written to a fixture: blocks of 64 and 256 and their products with
    /// the matrix numpy builds by Kronecker products.
    #[test]
    fn matches_the_numpy_oracle() {
        let text = include_str!("../../tests/reference/hadamard_oracle.txt");
        let mut cases = 0;
        let mut lines = text.lines().filter(|l| !l.starts_with('#'));
        while let Some(head) = lines.next() {
            let n: usize = head.trim().parse().unwrap();
            let floats = |line: Option<&str>| -> Vec<f64> {
                line.unwrap()
                    .split_whitespace()
                    .map(|v| v.parse().unwrap())
                    .collect()
            };
            let x = floats(lines.next());
            let want = floats(lines.next());
            assert_eq!((x.len(), want.len()), (n, n));
            let mut y: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            rotate(&mut y, n);
            for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
                assert!((g as f64 - w).abs() <= 1e-5, "n {n} [{i}]: {g} vs {w}");
            }
            cases += 1;
        }
        assert!(cases >= 3, "the fixture holds {cases} cases");
    }
}
