//! `t = A x` for an adapter: the rank dot products of one input row with
//! the rows of `A`, four rows at a time (four independent accumulator
//! chains, each input vector loaded once for the four). A lone dot product
//! is bound by the latency of its one FMA chain; four chains keep the FMA
//! units busy. Each row's arithmetic is that of a lone dot (its own
//! accumulator, then the same horizontal sum and tail), so the grouping
//! changes no bits. AVX2+FMA+F16C is picked at run time, with a scalar twin
//! the tests hold it to.

use std::sync::OnceLock;

pub struct LoraKernels {
    /// `out[j] = x . a[j]` for the `out.len()` rows of `a` (each `x.len()`
    /// long), `a` as f16 bits.
    pub dots_f16: fn(&[f32], &[u16], &mut [f32]),
    /// The same with f32 rows.
    pub dots_f32: fn(&[f32], &[f32], &mut [f32]),
    pub name: &'static str,
}

pub fn scalar() -> &'static LoraKernels {
    static K: LoraKernels = LoraKernels {
        dots_f16: scalar_impl::dots_f16,
        dots_f32: scalar_impl::dots_f32,
        name: "scalar",
    };
    &K
}

pub fn best() -> &'static LoraKernels {
    static BEST: OnceLock<&'static LoraKernels> = OnceLock::new();
    BEST.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if avx2::available() {
                return &avx2::KERNELS;
            }
        }
        scalar()
    })
}

/// The table matching a vector-kernel table: scalar with scalar (the tests'
/// twin), else the best.
pub fn matching(vk: &crate::ops::vec::VecKernels) -> &'static LoraKernels {
    if vk.name == "scalar" {
        scalar()
    } else {
        best()
    }
}

mod scalar_impl {
    use half::f16;

    pub fn dots_f16(x: &[f32], a: &[u16], out: &mut [f32]) {
        let n = x.len();
        for (o, row) in out.iter_mut().zip(a.chunks_exact(n.max(1))) {
            *o = x
                .iter()
                .zip(row)
                .map(|(v, &w)| v * f16::from_bits(w).to_f32())
                .sum();
        }
    }

    pub fn dots_f32(x: &[f32], a: &[f32], out: &mut [f32]) {
        let n = x.len();
        for (o, row) in out.iter_mut().zip(a.chunks_exact(n.max(1))) {
            *o = x.iter().zip(row).map(|(v, w)| v * w).sum();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::LoraKernels;
    use std::arch::x86_64::*;

    use crate::simd::x86::hsum;

    pub static KERNELS: LoraKernels = LoraKernels {
        dots_f16,
        dots_f32,
        name: "avx2",
    };

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    fn dots_f16(x: &[f32], a: &[u16], out: &mut [f32]) {
        assert!(a.len() >= out.len() * x.len(), "A holds too few rows");
        // SAFETY: this table is only installed when `available()` is true;
        // the assert above keeps every row inside `a`.
        unsafe { dots_f16_impl(x, a, out) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dots_f16_impl(x: &[f32], a: &[u16], out: &mut [f32]) {
        let n = x.len();
        let n8 = n / 8 * 8;
        let load = |p: *const u16| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let tail = |r: &[u16]| -> f32 {
            let mut s = 0f32;
            for i in n8..n {
                s += x[i] * half::f16::from_bits(r[i]).to_f32();
            }
            s
        };
        let mut j = 0;
        while j + 4 <= out.len() {
            let rows = [
                &a[j * n..],
                &a[(j + 1) * n..],
                &a[(j + 2) * n..],
                &a[(j + 3) * n..],
            ];
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            // SAFETY: i + 8 <= n8 <= n, and each row slice holds at least n
            // values (the caller's assert), so every 8-lane load is in bounds.
            while i < n8 {
                let v = _mm256_loadu_ps(x.as_ptr().add(i));
                for (c, r) in acc.iter_mut().zip(&rows) {
                    *c = _mm256_fmadd_ps(v, load(r.as_ptr().add(i)), *c);
                }
                i += 8;
            }
            for k in 0..4 {
                out[j + k] = hsum(acc[k]) + tail(rows[k]);
            }
            j += 4;
        }
        while j < out.len() {
            let r = &a[j * n..];
            let mut c = _mm256_setzero_ps();
            let mut i = 0;
            // SAFETY: as above.
            while i < n8 {
                let v = _mm256_loadu_ps(x.as_ptr().add(i));
                c = _mm256_fmadd_ps(v, load(r.as_ptr().add(i)), c);
                i += 8;
            }
            out[j] = hsum(c) + tail(r);
            j += 1;
        }
    }

    fn dots_f32(x: &[f32], a: &[f32], out: &mut [f32]) {
        assert!(a.len() >= out.len() * x.len(), "A holds too few rows");
        // SAFETY: this table is only installed when `available()` is true;
        // the assert above keeps every row inside `a`.
        unsafe { dots_f32_impl(x, a, out) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn dots_f32_impl(x: &[f32], a: &[f32], out: &mut [f32]) {
        let n = x.len();
        let n8 = n / 8 * 8;
        let tail = |r: &[f32]| -> f32 {
            let mut s = 0f32;
            for i in n8..n {
                s += x[i] * r[i];
            }
            s
        };
        let mut j = 0;
        while j + 4 <= out.len() {
            let rows = [
                &a[j * n..],
                &a[(j + 1) * n..],
                &a[(j + 2) * n..],
                &a[(j + 3) * n..],
            ];
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            // SAFETY: as in `dots_f16_impl`.
            while i < n8 {
                let v = _mm256_loadu_ps(x.as_ptr().add(i));
                for (c, r) in acc.iter_mut().zip(&rows) {
                    *c = _mm256_fmadd_ps(v, _mm256_loadu_ps(r.as_ptr().add(i)), *c);
                }
                i += 8;
            }
            for k in 0..4 {
                out[j + k] = hsum(acc[k]) + tail(rows[k]);
            }
            j += 4;
        }
        while j < out.len() {
            let r = &a[j * n..];
            let mut c = _mm256_setzero_ps();
            let mut i = 0;
            // SAFETY: as above.
            while i < n8 {
                let v = _mm256_loadu_ps(x.as_ptr().add(i));
                c = _mm256_fmadd_ps(v, _mm256_loadu_ps(r.as_ptr().add(i)), c);
                i += 8;
            }
            out[j] = hsum(c) + tail(r);
            j += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn simd_matches_scalar_and_grouping_changes_no_bits() {
        for n in [1, 7, 8, 37, 576] {
            for rows in [1, 3, 4, 5, 16] {
                let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.31).sin()).collect();
                let a32: Vec<f32> = (0..n * rows).map(|i| (i as f32 * 0.17).cos()).collect();
                let a16: Vec<u16> = a32.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
                let (s, b) = (scalar(), best());
                let mut o = [vec![0f32; rows], vec![0f32; rows], vec![0f32; rows]];
                (s.dots_f16)(&x, &a16, &mut o[0]);
                (b.dots_f16)(&x, &a16, &mut o[1]);
                for (u, v) in o[0].iter().zip(&o[1]) {
                    assert!((u - v).abs() <= 1e-4 * (1.0 + u.abs()), "f16 {n} {rows}");
                }
                // Row by row (no grouping) gives the same bits.
                for j in 0..rows {
                    let mut one = [0f32];
                    (b.dots_f16)(&x, &a16[j * n..(j + 1) * n], &mut one);
                    assert_eq!(one[0].to_bits(), o[1][j].to_bits());
                }
                (s.dots_f32)(&x, &a32, &mut o[0]);
                (b.dots_f32)(&x, &a32, &mut o[2]);
                for (u, v) in o[0].iter().zip(&o[2]) {
                    assert!((u - v).abs() <= 1e-4 * (1.0 + u.abs()), "f32 {n} {rows}");
                }
                for j in 0..rows {
                    let mut one = [0f32];
                    (b.dots_f32)(&x, &a32[j * n..(j + 1) * n], &mut one);
                    assert_eq!(one[0].to_bits(), o[2][j].to_bits());
                }
            }
        }
    }
}
