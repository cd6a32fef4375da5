//! Small f32/f16 vector primitives used by attention and norms, with an
//! AVX2+FMA+F16C path picked once at run time and a scalar twin that the
//! tests hold it to.

use half::f16;
use std::sync::OnceLock;

/// `(queries, tile, score rows, their stride)`.
pub type DotBlock = fn(&[&[f32]], &[f32], &mut [f32], usize);
/// `(outputs, weight rows, their stride, tile)`.
pub type AxpyBlock = fn(&mut [&mut [f32]], &[f32], usize, &[f32]);
/// `DotBlock` over a tile of f16 bits.
pub type DotBlockF16 = fn(&[&[f32]], &[u16], &mut [f32], usize);
/// `AxpyBlock` over a tile of f16 bits.
pub type AxpyBlockF16 = fn(&mut [&mut [f32]], &[f32], usize, &[u16]);

pub struct VecKernels {
    pub dot: fn(&[f32], &[f32]) -> f32,
    /// Dot of f32 query with an f16 key row stored as raw bits.
    pub dot_f16: fn(&[f32], &[u16]) -> f32,
    /// `y += a * x`.
    pub axpy: fn(&mut [f32], f32, &[f32]),
    /// `y += a * x` with `x` f16 bits.
    pub axpy_f16: fn(&mut [f32], f32, &[u16]),
    /// Exact f16 -> f32 conversion of a slice.
    pub f16_to_f32: fn(&[u16], &mut [f32]),
    /// `out[j] = q . tile[j]` for the `out.len()` rows of `tile` (each
    /// `q.len()` long), with the exact arithmetic of `dot_f16` per row.
    pub dot_rows: fn(&[f32], &[f32], &mut [f32]),
    /// `y += sum_j w[j] * tile[j]`, rows in order, with the exact arithmetic
    /// of one `axpy` per row (one FMA per element and row).
    pub axpy_rows: fn(&mut [f32], &[f32], &[f32]),
    /// The same with `tile` as f16 bits: the bits of one `axpy_f16` per
    /// row, in row order (a LoRA adapter's B side adds every rank so).
    pub axpy_rows_f16: fn(&mut [f32], &[f32], &[u16]),
    /// `out[r * stride + j] = qs[r] . tile[j]` for every query and every
    /// row of `tile`: per pair the bits of `dot_rows`, register-blocked
    /// (`ops::attn_tile`).
    pub dot_block: DotBlock,
    /// `ys[r] += sum_j w[r * stride + j] * tile[j]`: per output the bits of
    /// `axpy_rows`, register-blocked (`ops::attn_tile`).
    pub axpy_block: AxpyBlock,
    /// `dot_block` reading f16 rows as stored: the bits `dot_block` gives
    /// on their exact f32 conversion.
    pub dot_block_f16: DotBlockF16,
    /// `axpy_block` reading f16 rows as stored, likewise.
    pub axpy_block_f16: AxpyBlockF16,
    /// `x = exp(x - m)` with `ops::exp` (SIMD and scalar agree bit for bit).
    pub exp_shifted: fn(&mut [f32], f32),
    /// `x = f16(x * s)` as f32, rounding to nearest even (bit for bit in
    /// both tables).
    pub scale_round16: fn(&mut [f32], f32),
    pub name: &'static str,
}

pub fn scalar() -> &'static VecKernels {
    static K: VecKernels = VecKernels {
        dot: scalar_impl::dot,
        dot_f16: scalar_impl::dot_f16,
        axpy: scalar_impl::axpy,
        axpy_f16: scalar_impl::axpy_f16,
        f16_to_f32: scalar_impl::f16_to_f32,
        dot_rows: scalar_impl::dot_rows,
        axpy_rows: scalar_impl::axpy_rows,
        axpy_rows_f16: scalar_impl::axpy_rows_f16,
        dot_block: scalar_impl::dot_block,
        axpy_block: scalar_impl::axpy_block,
        dot_block_f16: scalar_impl::dot_block_f16,
        axpy_block_f16: scalar_impl::axpy_block_f16,
        exp_shifted: scalar_impl::exp_shifted,
        scale_round16: scalar_impl::scale_round16,
        name: "scalar",
    };
    &K
}

pub fn best() -> &'static VecKernels {
    static BEST: OnceLock<&'static VecKernels> = OnceLock::new();
    BEST.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if avx2::available() {
                if avx2::has_avx512vl() {
                    return &avx2::KERNELS_VL;
                }
                return &avx2::KERNELS;
            }
        }
        scalar()
    })
}

/// Every SIMD table this CPU can run, for the tests that hold each to the
/// scalar twin and the benches that time each against it.
pub fn avx2_tables() -> Vec<&'static VecKernels> {
    let mut t = Vec::new();
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        t.push(&avx2::KERNELS);
        if avx2::has_avx512vl() {
            t.push(&avx2::KERNELS_VL);
        }
    }
    t
}

/// f32 -> f16 bits, rounding to nearest even (the KV cache's writes). F16C
/// eight at a time where the CPU has it; the same bits either way.
pub fn f32_to_f16_bits(src: &[f32], dst: &mut [u16]) {
    let n = src.len().min(dst.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        done = n / 8 * 8;
        // SAFETY: F16C was detected; the kernel touches elements 0..done of
        // both slices only.
        unsafe { avx2::f32_to_f16_8s(src.as_ptr(), dst.as_mut_ptr(), done) };
    }
    for (d, s) in dst[done..n].iter_mut().zip(&src[done..n]) {
        *d = f16::from_f32(*s).to_bits();
    }
}

mod scalar_impl {
    use half::f16;

    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        // Four partial sums, like the SIMD path, so results stay close.
        let mut s = [0f32; 8];
        let n8 = a.len().min(b.len()) / 8 * 8;
        for (ca, cb) in a[..n8].chunks_exact(8).zip(b[..n8].chunks_exact(8)) {
            for i in 0..8 {
                s[i] += ca[i] * cb[i];
            }
        }
        let mut t: f32 = s.iter().sum();
        for i in n8..a.len().min(b.len()) {
            t += a[i] * b[i];
        }
        t
    }

    pub fn dot_f16(a: &[f32], b: &[u16]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, &y)| x * f16::from_bits(y).to_f32())
            .sum()
    }

    pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        for (yi, xi) in y.iter_mut().zip(x) {
            *yi += a * xi;
        }
    }

    pub fn axpy_f16(y: &mut [f32], a: f32, x: &[u16]) {
        for (yi, &xi) in y.iter_mut().zip(x) {
            *yi += a * f16::from_bits(xi).to_f32();
        }
    }

    pub fn f16_to_f32(src: &[u16], dst: &mut [f32]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f16::from_bits(s).to_f32();
        }
    }

    pub fn dot_rows(q: &[f32], tile: &[f32], out: &mut [f32]) {
        let d = q.len();
        for (o, row) in out.iter_mut().zip(tile.chunks_exact(d.max(1))) {
            *o = q.iter().zip(row).map(|(a, b)| a * b).sum();
        }
    }

    pub fn axpy_rows(y: &mut [f32], w: &[f32], tile: &[f32]) {
        let d = y.len();
        for (&wj, row) in w.iter().zip(tile.chunks_exact(d.max(1))) {
            axpy(y, wj, row);
        }
    }

    pub fn axpy_rows_f16(y: &mut [f32], w: &[f32], tile: &[u16]) {
        let d = y.len();
        for (&wj, row) in w.iter().zip(tile.chunks_exact(d.max(1))) {
            axpy_f16(y, wj, row);
        }
    }

    /// The block kernels' twins: the one-query kernels, query by query.
    pub fn dot_block(qs: &[&[f32]], tile: &[f32], out: &mut [f32], stride: usize) {
        for (r, q) in qs.iter().enumerate() {
            let n = if q.is_empty() {
                0
            } else {
                tile.len() / q.len()
            };
            dot_rows(q, tile, &mut out[r * stride..r * stride + n]);
        }
    }

    pub fn axpy_block(ys: &mut [&mut [f32]], w: &[f32], stride: usize, tile: &[f32]) {
        for (r, y) in ys.iter_mut().enumerate() {
            let n = if y.is_empty() {
                0
            } else {
                tile.len() / y.len()
            };
            axpy_rows(y, &w[r * stride..r * stride + n], tile);
        }
    }

    /// The f16 block kernels' twins: `dot_block` and `axpy_block` with each
    /// element converted where it is used (exactly, so the same bits as
    /// over a converted tile, with no tile to allocate).
    pub fn dot_block_f16(qs: &[&[f32]], tile: &[u16], out: &mut [f32], stride: usize) {
        for (r, q) in qs.iter().enumerate() {
            if q.is_empty() {
                continue;
            }
            let rows = tile.chunks_exact(q.len());
            for (o, row) in out[r * stride..].iter_mut().zip(rows) {
                *o = dot_f16(q, row);
            }
        }
    }

    pub fn axpy_block_f16(ys: &mut [&mut [f32]], w: &[f32], stride: usize, tile: &[u16]) {
        for (r, y) in ys.iter_mut().enumerate() {
            let n = if y.is_empty() {
                0
            } else {
                tile.len() / y.len()
            };
            axpy_rows_f16(y, &w[r * stride..r * stride + n], tile);
        }
    }

    pub fn exp_shifted(x: &mut [f32], m: f32) {
        for v in x {
            *v = crate::ops::exp::exp(*v - m);
        }
    }

    pub fn scale_round16(x: &mut [f32], s: f32) {
        for v in x {
            *v = f16::from_f32(*v * s).to_f32();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::VecKernels;
    use std::arch::x86_64::*;

    use crate::simd::x86::{hsum, TileElem};

    const BASE: VecKernels = VecKernels {
        dot,
        dot_f16,
        axpy,
        axpy_f16,
        f16_to_f32,
        dot_rows,
        axpy_rows,
        axpy_rows_f16,
        exp_shifted,
        scale_round16,
        dot_block: crate::ops::attn_tile::x86::dot_block,
        axpy_block: crate::ops::attn_tile::x86::axpy_block,
        dot_block_f16: crate::ops::attn_tile::x86::dot_block_f16,
        axpy_block_f16: crate::ops::attn_tile::x86::axpy_block_f16,
        name: "avx2",
    };
    pub static KERNELS: VecKernels = BASE;
    /// The same arithmetic, with attention blocks sized for AVX-512VL's
    /// thirty-two vector registers.
    pub static KERNELS_VL: VecKernels = VecKernels {
        dot_block: crate::ops::attn_tile::x86::dot_block_vl,
        axpy_block: crate::ops::attn_tile::x86::axpy_block_vl,
        // The AVX2 build of the same blocks: over f16 rows this one took
        // 1.5x its time (SmolLM2's three queries, 16 keys of 64: 189 against
        // 124 ns), though over f32 rows it is the faster.
        dot_block_f16: crate::ops::attn_tile::x86::dot_block_f16,
        axpy_block_f16: crate::ops::attn_tile::x86::axpy_block_f16_vl,
        name: "avx2+avx512vl",
        ..BASE
    };

    pub fn has_avx512vl() -> bool {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl")
    }

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: this table is only installed when `available()` is true.
        unsafe { dot_impl(a, b) }
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_impl(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY (for the loads below): i + 16 <= n, or i + 8 <= n, so every
        // 8-lane unaligned load stays inside both slices.
        while i + 16 <= n {
            acc0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(b.as_ptr().add(i)),
                acc0,
            );
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                acc1,
            );
            i += 16;
        }
        while i + 8 <= n {
            acc0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(b.as_ptr().add(i)),
                acc0,
            );
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(acc0, acc1));
        while i < n {
            s += a[i] * b[i];
            i += 1;
        }
        s
    }

    fn dot_f16(a: &[f32], b: &[u16]) -> f32 {
        // SAFETY: installed only when AVX2, FMA and F16C are present.
        unsafe { dot_f16_impl(a, b) }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_f16_impl(a: &[f32], b: &[u16]) -> f32 {
        let n = a.len().min(b.len());
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY: i + 8 <= n keeps the 8-lane loads in bounds.
        while i + 8 <= n {
            let k = _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(i) as *const __m128i));
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), k, acc);
            i += 8;
        }
        let mut s = hsum(acc);
        while i < n {
            s += a[i] * half::f16::from_bits(b[i]).to_f32();
            i += 1;
        }
        s
    }

    fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        // SAFETY: installed only when AVX2 and FMA are present.
        unsafe { axpy_impl(y, a, x) }
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn axpy_impl(y: &mut [f32], a: f32, x: &[f32]) {
        let n = y.len().min(x.len());
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        // SAFETY: i + 8 <= n keeps loads and stores in bounds.
        while i + 8 <= n {
            let p = y.as_mut_ptr().add(i);
            _mm256_storeu_ps(
                p,
                _mm256_fmadd_ps(va, _mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(p)),
            );
            i += 8;
        }
        while i < n {
            y[i] += a * x[i];
            i += 1;
        }
    }

    fn axpy_f16(y: &mut [f32], a: f32, x: &[u16]) {
        // SAFETY: installed only when AVX2, FMA and F16C are present.
        unsafe { axpy_f16_impl(y, a, x) }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn axpy_f16_impl(y: &mut [f32], a: f32, x: &[u16]) {
        let n = y.len().min(x.len());
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        // SAFETY: i + 8 <= n keeps loads and stores in bounds.
        while i + 8 <= n {
            let p = y.as_mut_ptr().add(i);
            let v = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i) as *const __m128i));
            _mm256_storeu_ps(p, _mm256_fmadd_ps(va, v, _mm256_loadu_ps(p)));
            i += 8;
        }
        while i < n {
            y[i] += a * half::f16::from_bits(x[i]).to_f32();
            i += 1;
        }
    }

    fn f16_to_f32(src: &[u16], dst: &mut [f32]) {
        // SAFETY: installed only when F16C is present.
        unsafe { f16_to_f32_impl(src, dst) }
    }
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn f16_to_f32_impl(src: &[u16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        // SAFETY: i + 8 <= n keeps the loads and stores in bounds.
        while i + 8 <= n {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(src.as_ptr().add(i) as *const __m128i));
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), v);
            i += 8;
        }
        while i < n {
            dst[i] = half::f16::from_bits(src[i]).to_f32();
            i += 1;
        }
    }

    /// # Safety
    /// F16C is available; `src` and `dst` hold `n` elements, n % 8 == 0.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn f32_to_f16_8s(src: *const f32, dst: *mut u16, n: usize) {
        let mut i = 0;
        while i < n {
            // SAFETY: i + 8 <= n (caller's contract).
            unsafe {
                let h =
                    _mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(_mm256_loadu_ps(src.add(i)));
                _mm_storeu_si128(dst.add(i) as *mut __m128i, h);
            }
            i += 8;
        }
    }

    fn exp_shifted(x: &mut [f32], m: f32) {
        // SAFETY: installed only when AVX2, FMA and F16C are present.
        unsafe { exp_shifted_impl(x, m) }
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp_shifted_impl(x: &mut [f32], m: f32) {
        let n8 = x.len() / 8 * 8;
        let mv = _mm256_set1_ps(m);
        let p = x.as_mut_ptr();
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= len keeps the load and store in bounds.
            unsafe {
                let v = _mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mv);
                _mm256_storeu_ps(p.add(i), crate::ops::exp::avx2::exp8(v));
            }
            i += 8;
        }
        super::scalar_impl::exp_shifted(&mut x[n8..], m);
    }

    fn scale_round16(x: &mut [f32], s: f32) {
        // SAFETY: installed only when AVX2, FMA and F16C are present.
        unsafe { scale_round16_impl(x, s) }
    }
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn scale_round16_impl(x: &mut [f32], s: f32) {
        let n8 = x.len() / 8 * 8;
        let sv = _mm256_set1_ps(s);
        let p = x.as_mut_ptr();
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= len keeps the load and store in bounds.
            unsafe {
                let h = _mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(_mm256_mul_ps(
                    _mm256_loadu_ps(p.add(i)),
                    sv,
                ));
                _mm256_storeu_ps(p.add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        super::scalar_impl::scale_round16(&mut x[n8..], s);
    }

    fn dot_rows(q: &[f32], tile: &[f32], out: &mut [f32]) {
        assert!(tile.len() >= out.len() * q.len(), "tile too short");
        // SAFETY: installed only when AVX2 and FMA are present; the assert
        // bounds every row.
        unsafe { dot_rows_impl(q, tile, out) }
    }

    /// Eight rows at a time: eight independent FMA chains that share each
    /// load of `q`. Per row, the operations are `dot_f16_impl`'s: one
    /// 8-lane accumulator over the chunks in order, `hsum`, then the tail.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_rows_impl(q: &[f32], tile: &[f32], out: &mut [f32]) {
        const R: usize = 8;
        let d = q.len();
        let d8 = d / 8 * 8;
        let (qp, tp) = (q.as_ptr(), tile.as_ptr());
        let tail = |row: usize, mut s: f32| {
            for i in d8..d {
                s += q[i] * tile[row * d + i];
            }
            s
        };
        let mut j = 0;
        // SAFETY (all loads): rows j..j + R lie inside `tile` (checked by the
        // caller), and i + 8 <= d8 <= d within each row and within `q`.
        while j + R <= out.len() {
            let mut acc = [_mm256_setzero_ps(); R];
            let mut i = 0;
            while i < d8 {
                let qv = _mm256_loadu_ps(qp.add(i));
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(tp.add((j + r) * d + i)), *a);
                }
                i += 8;
            }
            for (r, a) in acc.iter().enumerate() {
                out[j + r] = tail(j + r, hsum(*a));
            }
            j += R;
        }
        while j < out.len() {
            let mut acc = _mm256_setzero_ps();
            let mut i = 0;
            while i < d8 {
                acc = _mm256_fmadd_ps(
                    _mm256_loadu_ps(qp.add(i)),
                    _mm256_loadu_ps(tp.add(j * d + i)),
                    acc,
                );
                i += 8;
            }
            out[j] = tail(j, hsum(acc));
            j += 1;
        }
    }

    fn axpy_rows(y: &mut [f32], w: &[f32], tile: &[f32]) {
        assert!(tile.len() >= w.len() * y.len(), "tile too short");
        // SAFETY: installed only when AVX2 and FMA are present; the assert
        // bounds every row.
        unsafe { axpy_rows_impl(y, w, tile) }
    }

    fn axpy_rows_f16(y: &mut [f32], w: &[f32], tile: &[u16]) {
        assert!(tile.len() >= w.len() * y.len(), "tile too short");
        // SAFETY: installed only when AVX2, FMA and F16C are present; the
        // assert bounds every row.
        unsafe { axpy_rows_f16_impl(y, w, tile) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn axpy_rows_impl(y: &mut [f32], w: &[f32], tile: &[f32]) {
        // SAFETY: the caller's contract.
        unsafe { axpy_rows_body(y, w, tile) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn axpy_rows_f16_impl(y: &mut [f32], w: &[f32], tile: &[u16]) {
        // SAFETY: the caller's contract.
        unsafe { axpy_rows_body(y, w, tile) }
    }

    /// Up to 64 elements of `y` stay in registers while every row is added,
    /// instead of a load and a store of `y` per row. Per element the FMAs
    /// run in row order, and the tail is `y += w * x` unfused, exactly as
    /// repeated `axpy` (or `axpy_f16`) calls.
    ///
    /// # Safety
    /// AVX2 and FMA (and F16C for f16 tiles) are available, inlined into a
    /// function enabling them; `tile` holds `w.len()` rows of `y.len()`.
    #[inline(always)]
    unsafe fn axpy_rows_body<T: TileElem>(y: &mut [f32], w: &[f32], tile: &[T]) {
        const E: usize = 8;
        let d = y.len();
        let tp = tile.as_ptr();
        let mut e0 = 0;
        // SAFETY (all loads and stores): e0 + 8 * E <= d, or e0 + 8 <= d,
        // within `y` and within each of the w.len() rows of `tile`.
        unsafe {
            while e0 + 8 * E <= d {
                let yp = y.as_mut_ptr().add(e0);
                let mut acc: [__m256; E] = std::array::from_fn(|k| _mm256_loadu_ps(yp.add(8 * k)));
                for (j, &wj) in w.iter().enumerate() {
                    let wv = _mm256_set1_ps(wj);
                    for (k, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(wv, T::load8(tp.add(j * d + e0 + 8 * k)), *a);
                    }
                }
                for (k, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(yp.add(8 * k), *a);
                }
                e0 += 8 * E;
            }
            while e0 + 8 <= d {
                let yp = y.as_mut_ptr().add(e0);
                let mut a = _mm256_loadu_ps(yp);
                for (j, &wj) in w.iter().enumerate() {
                    a = _mm256_fmadd_ps(_mm256_set1_ps(wj), T::load8(tp.add(j * d + e0)), a);
                }
                _mm256_storeu_ps(yp, a);
                e0 += 8;
            }
        }
        for e in e0..d {
            for (j, &wj) in w.iter().enumerate() {
                y[e] += wj * tile[j * d + e].to_f32();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn rvec(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect()
    }

    #[test]
    fn best_matches_scalar_with_tails() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (b, s) = (best(), scalar());
        for n in [1usize, 7, 8, 9, 15, 16, 17, 63, 64, 65, 256, 257] {
            let a = rvec(&mut rng, n);
            let x = rvec(&mut rng, n);
            let mut xh = vec![0u16; n];
            f32_to_f16_bits(&x, &mut xh);
            let tol = 1e-4 * n as f32;
            assert!(((b.dot)(&a, &x) - (s.dot)(&a, &x)).abs() < tol);
            assert!(((b.dot_f16)(&a, &xh) - (s.dot_f16)(&a, &xh)).abs() < tol);
            let (mut y1, mut y2) = (a.clone(), a.clone());
            (b.axpy)(&mut y1, 0.3, &x);
            (s.axpy)(&mut y2, 0.3, &x);
            assert!(y1.iter().zip(&y2).all(|(p, q)| (p - q).abs() < 1e-5));
            let (mut y1, mut y2) = (a.clone(), a.clone());
            (b.axpy_f16)(&mut y1, -0.7, &xh);
            (s.axpy_f16)(&mut y2, -0.7, &xh);
            assert!(y1.iter().zip(&y2).all(|(p, q)| (p - q).abs() < 1e-5));
        }
    }

    #[test]
    fn f16_conversion_equals_half_bit_for_bit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        for n in [0usize, 5, 8, 13, 64, 67] {
            let mut x: Vec<f32> = (0..n)
                .map(|_| rng.random_range(-70000.0f32..70000.0))
                .collect();
            if n > 4 {
                x[1] = 1e-6; // subnormal in f16
                x[2] = f32::INFINITY;
                x[3] = 0.333_333_34;
            }
            let mut got = vec![0u16; n];
            f32_to_f16_bits(&x, &mut got);
            let want: Vec<u16> = x.iter().map(|v| f16::from_f32(*v).to_bits()).collect();
            assert_eq!(got, want, "n={n}");
        }
    }

    #[test]
    fn softmax_helpers_equal_their_scalar_twins_bit_for_bit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        let (b, s) = (best(), scalar());
        for n in [0usize, 1, 7, 8, 9, 64, 67] {
            let x: Vec<f32> = (0..n).map(|_| rng.random_range(-120.0f32..3.0)).collect();
            let (mut e1, mut e2) = (x.clone(), x.clone());
            (b.exp_shifted)(&mut e1, 2.5);
            (s.exp_shifted)(&mut e2, 2.5);
            assert_eq!(bits(&e1), bits(&e2), "exp n={n}");
            let (mut r1, mut r2) = (x.clone(), x.clone());
            (b.scale_round16)(&mut r1, 0.37);
            (s.scale_round16)(&mut r2, 0.37);
            assert_eq!(bits(&r1), bits(&r2), "round n={n}");
            for (v, r) in x.iter().zip(&r1) {
                assert_eq!(*r, half::f16::from_f32(v * 0.37).to_f32());
            }
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The row kernels give the bits of the one-row kernels they replace
    /// (the SIMD table), and stay close to the scalar twin.
    #[test]
    fn row_kernels_equal_one_row_kernels() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (b, s) = (best(), scalar());
        for d in [1usize, 7, 8, 16, 17, 64, 72, 256, 260] {
            for rows in [1usize, 3, 8, 9, 17] {
                let q = rvec(&mut rng, d);
                let t = rvec(&mut rng, d * rows);
                let mut th = vec![0u16; d * rows];
                f32_to_f16_bits(&t, &mut th);
                let mut tf = vec![0f32; d * rows];
                (b.f16_to_f32)(&th, &mut tf);
                let mut tf2 = vec![0f32; d * rows];
                (s.f16_to_f32)(&th, &mut tf2);
                assert_eq!(tf, tf2);
                let (mut o1, mut o2) = (vec![0f32; rows], vec![0f32; rows]);
                (b.dot_rows)(&q, &tf, &mut o1);
                (s.dot_rows)(&q, &tf, &mut o2);
                for j in 0..rows {
                    let one = (b.dot_f16)(&q, &th[j * d..(j + 1) * d]);
                    assert_eq!(o1[j].to_bits(), one.to_bits(), "d={d} rows={rows} j={j}");
                    assert!((o1[j] - o2[j]).abs() < 1e-4 * d as f32);
                }
                let w = rvec(&mut rng, rows);
                let y0 = rvec(&mut rng, d);
                let (mut y1, mut y2, mut y3) = (y0.clone(), y0.clone(), y0.clone());
                (b.axpy_rows)(&mut y1, &w, &tf);
                (s.axpy_rows)(&mut y2, &w, &tf);
                for j in 0..rows {
                    (b.axpy_f16)(&mut y3, w[j], &th[j * d..(j + 1) * d]);
                }
                assert_eq!(y1, y3, "d={d} rows={rows}");
                assert!(y1.iter().zip(&y2).all(|(p, q)| (p - q).abs() < 1e-4));
                // The f16 tile: the bits of one axpy_f16 per row, in both
                // tables.
                for k in [s, b] {
                    let mut want = y0.clone();
                    for j in 0..rows {
                        (k.axpy_f16)(&mut want, w[j], &th[j * d..(j + 1) * d]);
                    }
                    let mut got = y0.clone();
                    (k.axpy_rows_f16)(&mut got, &w, &th);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{} d={d} rows={rows}", k.name);
                }
            }
        }
    }

    fn tables() -> Vec<&'static VecKernels> {
        let mut t = vec![scalar(), best()];
        t.extend(avx2_tables());
        t
    }

    /// Each block kernel gives, pair by pair and element by element, the
    /// bits of its table's one-query kernels, for every shape of remainder;
    /// over f16 rows, the bits it gives over their f32 conversion.
    #[test]
    fn blocks_equal_one_query_kernels_bit_for_bit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(23);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for k in tables() {
            for d in [1usize, 8, 17, 64, 72, 256, 260] {
                for m in [1usize, 2, 3, 4, 5, 7, 9, 12] {
                    for n in [1usize, 2, 3, 5, 6, 7, 13, 32] {
                        let q: Vec<f32> = (0..m * d).map(|_| rng.random_range(-2.0..2.0)).collect();
                        let t: Vec<f32> = (0..n * d).map(|_| rng.random_range(-2.0..2.0)).collect();
                        let qs: Vec<&[f32]> = q.chunks_exact(d).collect();
                        let stride = n + 3;
                        let mut got = vec![f32::NAN; m * stride];
                        (k.dot_block)(&qs, &t, &mut got, stride);
                        for (r, qr) in qs.iter().enumerate() {
                            let mut want = vec![0f32; n];
                            (k.dot_rows)(qr, &t, &mut want);
                            let row = &got[r * stride..r * stride + n];
                            assert_eq!(bits(row), bits(&want), "{} d={d} m={m} n={n}", k.name);
                        }
                        let w: Vec<f32> = (0..m * stride)
                            .map(|_| rng.random_range(-1.0..1.0))
                            .collect();
                        let y0: Vec<f32> =
                            (0..m * d).map(|_| rng.random_range(-1.0..1.0)).collect();
                        let mut ys: Vec<Vec<f32>> =
                            y0.chunks_exact(d).map(|c| c.to_vec()).collect();
                        let mut refs: Vec<&mut [f32]> =
                            ys.iter_mut().map(|y| y.as_mut_slice()).collect();
                        (k.axpy_block)(&mut refs, &w, stride, &t);
                        for (r, y) in ys.iter().enumerate() {
                            let mut want = y0[r * d..(r + 1) * d].to_vec();
                            (k.axpy_rows)(&mut want, &w[r * stride..r * stride + n], &t);
                            assert_eq!(bits(y), bits(&want), "{} d={d} m={m} n={n}", k.name);
                        }
                        // The same products over the tile stored as f16.
                        let h: Vec<u16> = t.iter().map(|&x| f16::from_f32(x).to_bits()).collect();
                        let mut th = vec![0f32; h.len()];
                        (k.f16_to_f32)(&h, &mut th);
                        let mut want = vec![f32::NAN; m * stride];
                        (k.dot_block)(&qs, &th, &mut want, stride);
                        let mut got = vec![f32::NAN; m * stride];
                        (k.dot_block_f16)(&qs, &h, &mut got, stride);
                        for r in 0..m {
                            let (a, b) = (r * stride, r * stride + n);
                            assert_eq!(
                                bits(&got[a..b]),
                                bits(&want[a..b]),
                                "{} f16 d={d} m={m} n={n}",
                                k.name
                            );
                        }
                        let mut want: Vec<Vec<f32>> =
                            y0.chunks_exact(d).map(|c| c.to_vec()).collect();
                        let mut refs: Vec<&mut [f32]> =
                            want.iter_mut().map(|y| y.as_mut_slice()).collect();
                        (k.axpy_block)(&mut refs, &w, stride, &th);
                        let mut got: Vec<Vec<f32>> =
                            y0.chunks_exact(d).map(|c| c.to_vec()).collect();
                        let mut refs: Vec<&mut [f32]> =
                            got.iter_mut().map(|y| y.as_mut_slice()).collect();
                        (k.axpy_block_f16)(&mut refs, &w, stride, &h);
                        for (g, w) in got.iter().zip(&want) {
                            assert_eq!(bits(g), bits(w), "{} f16 d={d} m={m} n={n}", k.name);
                        }
                    }
                }
            }
        }
    }
}
