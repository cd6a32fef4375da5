//! Register-blocked attention products: several queries against several
//! key rows (scores), and several weight rows against the same value rows
//! (outputs).
//!
//! Prefill at long depths spends most of its time here: every query of a
//! block reads every visible key and value row. One query at a time, each
//! FMA needs a load of its own, and a 32-row f32 tile no longer fits L1
//! beside the queries, so the products ran at about 0.8 FMA per cycle out
//! of 2. Holding an M x N block of accumulators lets one load of a key
//! chunk serve M queries and one load of a query chunk serve N keys.
//!
//! Every (query, key) pair and every output element keeps the exact
//! arithmetic of `VecKernels::dot_rows` and `axpy_rows`: one 8-lane FMA
//! chain over the chunks in the same order, the same horizontal sum, the
//! same unfused tail. Blocking changes the speed and never a bit, so a
//! token's logits stay the same alone, in a prefill or in a batch. The
//! kernel tables, the scalar twins and the bit test live in `ops::vec`.
//! The rows may be f16 bits, converted exactly on their way into the
//! registers (`simd::x86::TileElem`), so the same bits again.

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use crate::simd::x86::{hsum, TileElem};
    use std::arch::x86_64::*;

    /// `M` queries against `N` consecutive key rows at `k` (each `d` long):
    /// `out[r * stride + c] = q[r] . k[c]`.
    ///
    /// # Safety
    /// AVX2 and FMA (and F16C for f16 rows), inlined into a function enabling
    /// them; each `q[r]` holds `d` floats, `k` holds `N * d`, and `out` is
    /// writable at `r * stride + c` for every `r < M`, `c < N`.
    #[inline(always)]
    unsafe fn dot_mn<T: TileElem, const M: usize, const N: usize>(
        q: [*const f32; M],
        k: *const T,
        d: usize,
        out: *mut f32,
        stride: usize,
    ) {
        let d8 = d / 8 * 8;
        let mut acc = [[_mm256_setzero_ps(); N]; M];
        let mut i = 0;
        // SAFETY (all loads and stores): i + 8 <= d8 <= d within each query
        // and key row; the outputs are the caller's.
        unsafe {
            while i < d8 {
                let kv: [__m256; N] = std::array::from_fn(|c| T::load8(k.add(c * d + i)));
                for (qr, row) in q.iter().zip(acc.iter_mut()) {
                    let qv = _mm256_loadu_ps(qr.add(i));
                    for (a, kc) in row.iter_mut().zip(&kv) {
                        *a = _mm256_fmadd_ps(qv, *kc, *a);
                    }
                }
                i += 8;
            }
            if N.is_multiple_of(4) && d8 == d {
                // Four pairs reduced together: a fraction of the shuffles,
                // and for a 64-wide head the reductions were nearly as many
                // instructions as the FMAs.
                for (r, row) in acc.iter().enumerate() {
                    for c in (0..N).step_by(4) {
                        let s = hsum4(row[c], row[c + 1], row[c + 2], row[c + 3]);
                        _mm_storeu_ps(out.add(r * stride + c), s);
                    }
                }
                return;
            }
            if N == 2 && d8 == d {
                for (r, row) in acc.iter().enumerate() {
                    let s = hsum2(row[0], row[1]);
                    _mm_store_sd(out.add(r * stride) as *mut f64, _mm_castps_pd(s));
                }
                return;
            }
            for (r, row) in acc.iter().enumerate() {
                for (c, a) in row.iter().enumerate() {
                    let mut s = hsum(*a);
                    for e in d8..d {
                        s += *q[r].add(e) * (*k.add(c * d + e)).to_f32();
                    }
                    *out.add(r * stride + c) = s;
                }
            }
        }
    }

    /// `[a0+a4 .. a3+a7 | b0+b4 .. b3+b7]`: `hsum`'s first addition, of
    /// two vectors at once.
    ///
    /// # Safety
    /// AVX, inlined into a function enabling it.
    #[inline(always)]
    unsafe fn halves(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    }

    /// `[hsum(a), hsum(b), ..]` in the low two lanes, as `hsum4` does it.
    ///
    /// # Safety
    /// AVX, inlined into a function enabling it.
    #[inline(always)]
    unsafe fn hsum2(a: __m256, b: __m256) -> __m128 {
        let ab = halves(a, b);
        let (lo, hi) = (_mm256_castps256_ps128(ab), _mm256_extractf128_ps::<1>(ab));
        // [A0 A1 B0 B1], where A0 = lo[0] + lo[2] and A1 = lo[1] + lo[3].
        let z = _mm_add_ps(
            _mm_shuffle_ps::<0b01_00_01_00>(lo, hi),
            _mm_shuffle_ps::<0b11_10_11_10>(lo, hi),
        );
        // [A0 + A1, B0 + B1, ..].
        _mm_add_ps(
            _mm_shuffle_ps::<0b10_00_10_00>(z, z),
            _mm_shuffle_ps::<0b11_01_11_01>(z, z),
        )
    }

    /// `[hsum(a), hsum(b), hsum(c), hsum(d)]`, each by `hsum`'s own tree
    /// of additions (halves, then lanes 2 apart, then neighbours), so bit
    /// for bit the same sums.
    ///
    /// # Safety
    /// AVX, inlined into a function enabling it.
    #[inline(always)]
    unsafe fn hsum4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
        let (ab, cd) = (halves(a, b), halves(c, d));
        // [A0 A1 C0 C1 | B0 B1 D0 D1], where A0 = ab[0] + ab[2] and
        // A1 = ab[1] + ab[3].
        let z = _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(ab, cd),
            _mm256_shuffle_ps::<0b11_10_11_10>(ab, cd),
        );
        let (lo, hi) = (_mm256_castps256_ps128(z), _mm256_extractf128_ps::<1>(z));
        // [A0 + A1, C0 + C1, B0 + B1, D0 + D1], put back in order.
        let r = _mm_add_ps(
            _mm_shuffle_ps::<0b10_00_10_00>(lo, hi),
            _mm_shuffle_ps::<0b11_01_11_01>(lo, hi),
        );
        _mm_shuffle_ps::<0b11_01_10_00>(r, r)
    }

    /// `M` queries against all `n` rows at `k`, `N` rows at a time.
    ///
    /// # Safety
    /// As `dot_mn`, for `n` rows.
    #[inline(always)]
    unsafe fn dot_rows_m<T: TileElem, const M: usize, const N: usize>(
        q: [*const f32; M],
        k: *const T,
        n: usize,
        d: usize,
        out: *mut f32,
        stride: usize,
    ) {
        let mut c = 0;
        // SAFETY: c + N <= n (or c < n) rows lie inside `k` and `out`.
        unsafe {
            while c + N <= n {
                dot_mn::<T, M, N>(q, k.add(c * d), d, out.add(c), stride);
                c += N;
            }
            while c < n {
                dot_mn::<T, M, 1>(q, k.add(c * d), d, out.add(c), stride);
                c += 1;
            }
        }
    }

    /// The queries in blocks of `M` (`N` keys at a time); a rest of three
    /// queries takes blocks of `N3` keys, of two `N2`, of one eight.
    ///
    /// # Safety
    /// AVX2 and FMA (and F16C for f16 rows); `tile` holds whole rows of
    /// `d = qs[0].len()`, and `out` holds `qs.len()` rows at `stride` of
    /// `tile.len() / d`.
    #[inline(always)]
    unsafe fn dot_block_body<
        T: TileElem,
        const M: usize,
        const N: usize,
        const N3: usize,
        const N2: usize,
    >(
        qs: &[&[f32]],
        tile: &[T],
        out: &mut [f32],
        stride: usize,
    ) {
        let Some(d) = qs.first().map(|q| q.len()).filter(|&d| d > 0) else {
            return;
        };
        let n = tile.len() / d;
        assert!(qs.iter().all(|q| q.len() == d), "queries of unequal length");
        assert!(
            qs.is_empty() || out.len() >= (qs.len() - 1) * stride + n,
            "score rows too short"
        );
        let (k, o) = (tile.as_ptr(), out.as_mut_ptr());
        let mut r = 0;
        // SAFETY: every query holds d floats, `tile` n rows, and the asserts
        // bound every output row r * stride .. r * stride + n.
        unsafe {
            while r + M <= qs.len() {
                let q: [*const f32; M] = std::array::from_fn(|i| qs[r + i].as_ptr());
                dot_rows_m::<T, M, N>(q, k, n, d, o.add(r * stride), stride);
                r += M;
            }
            while r < qs.len() {
                let q = |i: usize| qs[r + i].as_ptr();
                let o = o.add(r * stride);
                r += match qs.len() - r {
                    1 => {
                        dot_rows_m::<T, 1, 8>([q(0)], k, n, d, o, stride);
                        1
                    }
                    2 => {
                        dot_rows_m::<T, 2, N2>([q(0), q(1)], k, n, d, o, stride);
                        2
                    }
                    _ => {
                        dot_rows_m::<T, 3, N3>([q(0), q(1), q(2)], k, n, d, o, stride);
                        3
                    }
                };
            }
        }
    }

    /// `y[r] += sum_j w[r][j] * t[j]` over the `n` rows at `t` (stride `d`),
    /// for `8 * E` elements from each `y[r]`, held in registers.
    ///
    /// # Safety
    /// AVX2 and FMA (and F16C for f16 rows); each `y[r]` holds `8 * E` floats,
    /// each `w[r]` holds `n`, and `t` holds `n` rows of `d` with `8 * E`
    /// readable from each.
    #[inline(always)]
    unsafe fn axpy_me<T: TileElem, const M: usize, const E: usize>(
        y: [*mut f32; M],
        w: [*const f32; M],
        n: usize,
        t: *const T,
        d: usize,
    ) {
        // SAFETY (all loads and stores): the caller's contract.
        unsafe {
            let mut acc: [[__m256; E]; M] =
                std::array::from_fn(|r| std::array::from_fn(|k| _mm256_loadu_ps(y[r].add(8 * k))));
            for j in 0..n {
                let v: [__m256; E] = std::array::from_fn(|k| T::load8(t.add(j * d + 8 * k)));
                for (row, wr) in acc.iter_mut().zip(&w) {
                    let wv = _mm256_set1_ps(*wr.add(j));
                    for (a, vk) in row.iter_mut().zip(&v) {
                        *a = _mm256_fmadd_ps(wv, *vk, *a);
                    }
                }
            }
            for (row, yr) in acc.iter().zip(&y) {
                for (k, a) in row.iter().enumerate() {
                    _mm256_storeu_ps(yr.add(8 * k), *a);
                }
            }
        }
    }

    /// `M` outputs over every element: `8 * E` at a time, then eight at a
    /// time, then one at a time unfused in row order (`axpy_rows`' tail).
    ///
    /// # Safety
    /// AVX2 and FMA (and F16C for f16 rows); each `y[r]` holds `d` floats, each
    /// `w[r]` holds `n`, and `t` holds `n` rows of `d`.
    #[inline(always)]
    unsafe fn axpy_m<T: TileElem, const M: usize, const E: usize>(
        y: [*mut f32; M],
        w: [*const f32; M],
        n: usize,
        t: *const T,
        d: usize,
    ) {
        let mut e0 = 0;
        // SAFETY: e0 + 8 * E <= d (or e0 + 8 <= d, or e0 < d) elements of
        // each output and of each row.
        unsafe {
            while e0 + 8 * E <= d {
                axpy_me::<T, M, E>(y.map(|p| p.add(e0)), w, n, t.add(e0), d);
                e0 += 8 * E;
            }
            while e0 + 8 <= d {
                axpy_me::<T, M, 1>(y.map(|p| p.add(e0)), w, n, t.add(e0), d);
                e0 += 8;
            }
            for (yr, wr) in y.iter().zip(&w) {
                for e in e0..d {
                    for j in 0..n {
                        *yr.add(e) += *wr.add(j) * (*t.add(j * d + e)).to_f32();
                    }
                }
            }
        }
    }

    /// The outputs in blocks of `M`; a rest of two or three outputs as one
    /// block, of one eight vectors wide.
    ///
    /// # Safety
    /// AVX2 and FMA (and F16C for f16 rows); every output is `d = ys[0].len()`
    /// long, `tile` holds whole rows of `d`, and `w` holds `ys.len()` rows at
    /// `stride` of `tile.len() / d`.
    #[inline(always)]
    unsafe fn axpy_block_body<T: TileElem, const M: usize, const E: usize>(
        ys: &mut [&mut [f32]],
        w: &[f32],
        stride: usize,
        tile: &[T],
    ) {
        let Some(d) = ys.first().map(|y| y.len()).filter(|&d| d > 0) else {
            return;
        };
        let n = tile.len() / d;
        assert!(ys.iter().all(|y| y.len() == d), "outputs of unequal length");
        assert!(
            ys.is_empty() || w.len() >= (ys.len() - 1) * stride + n,
            "weight rows too short"
        );
        let t = tile.as_ptr();
        let mut r = 0;
        // SAFETY: every output holds d floats, `tile` n rows, and the asserts
        // bound every weight row r * stride .. r * stride + n.
        unsafe {
            let wp = |i: usize| w.as_ptr().add(i * stride);
            while r + M <= ys.len() {
                let y: [*mut f32; M] = std::array::from_fn(|i| ys[r + i].as_mut_ptr());
                axpy_m::<T, M, E>(y, std::array::from_fn(|i| wp(r + i)), n, t, d);
                r += M;
            }
            while r < ys.len() {
                let rest = ys.len() - r;
                let mut y = |i: usize| ys[r + i].as_mut_ptr();
                r += match rest {
                    1 => {
                        axpy_m::<T, 1, 8>([y(0)], [wp(r)], n, t, d);
                        1
                    }
                    2 => {
                        axpy_m::<T, 2, 4>([y(0), y(1)], [wp(r), wp(r + 1)], n, t, d);
                        2
                    }
                    _ => {
                        let y3 = [y(0), y(1), y(2)];
                        axpy_m::<T, 3, 4>(y3, [wp(r), wp(r + 1), wp(r + 2)], n, t, d);
                        3
                    }
                };
            }
        }
    }

    /// Blocks sized for AVX2's sixteen vector registers: 4 x 2 scores
    /// (eight accumulators), 2 x 32 output elements (eight). Blocks of keys
    /// that divide a 32-row tile: a one-key rest runs at half speed.
    pub fn dot_block(qs: &[&[f32]], tile: &[f32], out: &mut [f32], stride: usize) {
        // SAFETY: installed only where AVX2 and FMA are present; the body
        // checks the shapes.
        unsafe { dot_block_avx2(qs, tile, out, stride) }
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_block_avx2(qs: &[&[f32]], tile: &[f32], out: &mut [f32], stride: usize) {
        // SAFETY: the caller's contract.
        unsafe { dot_block_body::<_, 4, 2, 4, 4>(qs, tile, out, stride) }
    }

    pub fn axpy_block(ys: &mut [&mut [f32]], w: &[f32], stride: usize, tile: &[f32]) {
        // SAFETY: installed only where AVX2 and FMA are present; the body
        // checks the shapes.
        unsafe { axpy_block_avx2(ys, w, stride, tile) }
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn axpy_block_avx2(ys: &mut [&mut [f32]], w: &[f32], stride: usize, tile: &[f32]) {
        // SAFETY: the caller's contract.
        unsafe { axpy_block_body::<_, 2, 4>(ys, w, stride, tile) }
    }

    /// The same 8-lane arithmetic with AVX-512VL's thirty-two registers:
    /// 4 x 4 scores, 4 x 32 output elements (sixteen accumulators: at 4 x 6
    /// the compiler spilled some of them every iteration).
    pub fn dot_block_vl(qs: &[&[f32]], tile: &[f32], out: &mut [f32], stride: usize) {
        // SAFETY: installed only where AVX2, FMA and AVX-512VL are present;
        // the body checks the shapes.
        unsafe { dot_block_avx512vl(qs, tile, out, stride) }
    }
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
    unsafe fn dot_block_avx512vl(qs: &[&[f32]], tile: &[f32], out: &mut [f32], stride: usize) {
        // SAFETY: the caller's contract.
        unsafe { dot_block_body::<_, 4, 4, 4, 8>(qs, tile, out, stride) }
    }

    pub fn axpy_block_vl(ys: &mut [&mut [f32]], w: &[f32], stride: usize, tile: &[f32]) {
        // SAFETY: installed only where AVX2, FMA and AVX-512VL are present;
        // the body checks the shapes.
        unsafe { axpy_block_avx512vl(ys, w, stride, tile) }
    }
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
    unsafe fn axpy_block_avx512vl(ys: &mut [&mut [f32]], w: &[f32], stride: usize, tile: &[f32]) {
        // SAFETY: the caller's contract.
        unsafe { axpy_block_body::<_, 4, 4>(ys, w, stride, tile) }
    }

    /// `dot_block` over a tile of f16 bits, converted in the registers: a
    /// decode step's few queries read each key once, and converting the
    /// tile to f32 first cost a store and a load of every element (4% of a
    /// one-thread SmolLM2 step at depth 400, in `f16_to_f32` alone).
    pub fn dot_block_f16(qs: &[&[f32]], tile: &[u16], out: &mut [f32], stride: usize) {
        // SAFETY: installed only where AVX2, FMA and F16C are present; the
        // body checks the shapes.
        unsafe { dot_block_f16_avx2(qs, tile, out, stride) }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_block_f16_avx2(qs: &[&[f32]], tile: &[u16], out: &mut [f32], stride: usize) {
        // SAFETY: the caller's contract.
        unsafe { dot_block_body::<_, 4, 2, 4, 4>(qs, tile, out, stride) }
    }

    pub fn axpy_block_f16(ys: &mut [&mut [f32]], w: &[f32], stride: usize, tile: &[u16]) {
        // SAFETY: installed only where AVX2, FMA and F16C are present; the
        // body checks the shapes.
        unsafe { axpy_block_f16_avx2(ys, w, stride, tile) }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn axpy_block_f16_avx2(ys: &mut [&mut [f32]], w: &[f32], stride: usize, tile: &[u16]) {
        // SAFETY: the caller's contract.
        unsafe { axpy_block_body::<_, 2, 4>(ys, w, stride, tile) }
    }

    pub fn axpy_block_f16_vl(ys: &mut [&mut [f32]], w: &[f32], stride: usize, tile: &[u16]) {
        // SAFETY: installed only where AVX2, FMA, F16C and AVX-512VL are
        // present; the body checks the shapes.
        unsafe { axpy_block_f16_avx512vl(ys, w, stride, tile) }
    }
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    unsafe fn axpy_block_f16_avx512vl(
        ys: &mut [&mut [f32]],
        w: &[f32],
        stride: usize,
        tile: &[u16],
    ) {
        // SAFETY: the caller's contract.
        unsafe { axpy_block_body::<_, 4, 4>(ys, w, stride, tile) }
    }
}
