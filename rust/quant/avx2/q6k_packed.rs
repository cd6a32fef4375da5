//! Q6_K weights repacked at load time for decode on AVX-512 VNNI: sixteen
//! rows interleaved so that one 64-byte load holds the same four bytes of
//! each of them, as `q4k_packed.rs` does for Q4_K.
//!
//! Why: Q6_K is a quarter of a Q4_K_M model's bytes (the output head,
//! `ffn_down` and `attn_v` of half the layers; 43% of the 8B slice's, whose
//! head has 128,256 rows). The row kernel (`q6_k.rs`) spends about fifty
//! AVX2 instructions per row and super-block and a horizontal sum, and a
//! batched step pays that again for every token. Here a word of sixteen
//! rows, a shift, two masks and one `vpdpbusd` per token advance sixteen
//! rows by four products, and the sixteen group scales are vectors. The
//! layout takes exactly the file's bytes.
//!
//! Layout, per group of sixteen rows and super-block (`PACKED_BLOCK`
//! bytes, groups one after another, a group's super-blocks in order):
//! - from `WORDS`, words of 64 bytes, `4 * r` in each holding four bytes of row r's
//!   `ql` (word `(h, m)`: bytes `64h + 4m ..`, whose low nibbles are
//!   elements `128h + 4m ..` and high nibbles `128h + 64 + 4m ..`) or `qh`
//!   (word `(h, n)`: bytes `128 + 32h + 4n ..`, bits `2k, 2k + 1` of each
//!   for elements `128h + 32k + 4n ..`), in the order the kernel first
//!   reads them: for each half h and quarter q, `ql` words `4q .. 4q + 4`,
//!   `qh` words `4q .. 4q + 4`, `ql` words `8 + 4q .. 12 + 4q` (`ql_slot`,
//!   `qh_slot`);
//! - `SC + 16 * g + r`: row r's scale of group g (i8);
//! - `D + 2 * r`: row r's `d` (f16).
//!
//! Bits: each super-block's integer sum is exact and its value is the
//! scalar reference's `(d_w * d_a) * isum`, added in block order from
//! +0.0, lane by lane: the same bits as every other Q6_K path.

use std::arch::x86_64::*;

use super::packed_groups::{pack_groups, prefetch_span};
use super::read_u32;
use crate::quant::{q6_k, q8_k, QK_K};

/// Rows per group: the sixteen i32 lanes.
pub const GROUP_ROWS: usize = 16;
/// The 48 words of quants, then the scales and `d`.
const WORDS: usize = 0;
const SC: usize = WORDS + 48 * 64;
const D: usize = SC + 16 * GROUP_ROWS;
/// Bytes per group and super-block (the file's sixteen blocks take 3,360).
pub const PACKED_BLOCK: usize = D + 2 * GROUP_ROWS;
/// How far ahead of the block in use a pass asks for the weights, into
/// L2. Single-threaded from memory the pass read 25-34 GB/s with it and
/// 19-24 without (the row kernel: 17-18).
const AHEAD: usize = 4 * PACKED_BLOCK;
const _: () = assert!(PACKED_BLOCK == GROUP_ROWS * q6_k::BLOCK);

/// Where the kernel finds `ql` word `m` of half `h`: words are stored in
/// the order the groups first read them, so a block streams from memory
/// front to back. Laid out as the file has them (all `ql`, then all `qh`),
/// the groups jumped between the two, and the packed kernel read a head
/// of 49,152 rows from memory at half the row kernel's speed.
const fn ql_slot(h: usize, m: usize) -> usize {
    12 * (2 * h + (m / 4) % 2) + 8 * (m / 8) + m % 4
}

/// Where the kernel finds `qh` word `n` of half `h` (see `ql_slot`).
const fn qh_slot(h: usize, n: usize) -> usize {
    12 * (2 * h + n / 4) + 4 + n % 4
}

/// Whether the CPU has what the kernel uses.
pub fn available() -> bool {
    super::q4k_packed::available()
}

/// Bytes `0..192` of the sixteen blocks (their `ql` and `qh`) into words
/// 0..48 (`ql_slot`, `qh_slot`): six 16 x 8-word transposes.
///
/// # Safety
/// AVX2 and AVX-512 F are available; every block holds `q6_k::BLOCK`
/// bytes and `dst` `PACKED_BLOCK`.
#[target_feature(enable = "avx2,avx512f")]
unsafe fn transpose_quants(blocks: &[&[u8]; GROUP_ROWS], dst: &mut [u8]) {
    for c in 0..6 {
        // SAFETY: bytes 32c .. 32c + 32 of each block (c < 6: under 192).
        let v: [__m256i; GROUP_ROWS] = std::array::from_fn(|r| unsafe {
            _mm256_loadu_si256(blocks[r].as_ptr().add(32 * c) as *const __m256i)
        });
        for (j, t) in super::rows16_vnni::transpose(v).iter().enumerate() {
            // Block bytes 4w .. 4w + 4: `ql` word (w / 16, w % 16) for w < 32,
            // then `qh` word ((w - 32) / 8, w % 8).
            let w = 8 * c + j;
            let slot = if w < 32 {
                ql_slot(w / 16, w % 16)
            } else {
                qh_slot((w - 32) / 8, w % 8)
            };
            // SAFETY: slot < 48, a word of the packed block.
            unsafe {
                _mm512_storeu_si512(dst.as_mut_ptr().add(WORDS + 64 * slot) as *mut __m512i, *t)
            };
        }
    }
}

/// Writes into `out` (`rows / 16 * cols / 256 * PACKED_BLOCK` bytes) the
/// packed form of a Q6_K matrix of `rows` (a multiple of 16) rows of
/// `cols` elements held in `data` (the file's layout).
pub fn pack(rows: usize, cols: usize, data: &[u8], out: &mut [u8]) {
    assert!(available(), "q6_k packing without AVX-512");
    let sizes = (QK_K, q6_k::BLOCK, PACKED_BLOCK);
    pack_groups("q6_k", sizes, rows, cols, data, out, |blocks, dst| {
        // SAFETY: AVX-512 F was checked above; every block holds
        // q6_k::BLOCK bytes and `dst` PACKED_BLOCK.
        unsafe { transpose_quants(blocks, dst) };
        for (r, b) in blocks.iter().enumerate() {
            for k in 0..16 {
                dst[SC + 16 * k + r] = b[192 + k];
            }
            dst[D + 2 * r..D + 2 * r + 2].copy_from_slice(&b[208..210]);
        }
    });
}

/// The file's layout back from packed groups `g0..g1` (`nb` super-blocks a
/// row), into `out` (`(g1 - g0) * 16` rows of `nb` blocks): the GEMM of a
/// prefill reads rows, and this lets it read them from the packed copy,
/// so the file's pages of a packed matrix can leave the process.
pub fn unpack(nb: usize, packed: &[u8], (g0, g1): (usize, usize), out: &mut [u8]) {
    /// Block byte `4w` of a row is at `WORD_AT[w] + 4r` in its packed block.
    const WORD_AT: [usize; 48] = {
        let mut at = [0; 48];
        let mut w = 0;
        while w < 48 {
            let slot = if w < 32 {
                ql_slot(w / 16, w % 16)
            } else {
                qh_slot((w - 32) / 8, w % 8)
            };
            at[w] = WORDS + 64 * slot;
            w += 1;
        }
        at
    };
    let rb = nb * q6_k::BLOCK;
    assert!(
        packed.len() >= g1 * nb * PACKED_BLOCK && out.len() == (g1 - g0) * GROUP_ROWS * rb,
        "q6_k unpack shape"
    );
    for (gi, rows) in out.chunks_exact_mut(GROUP_ROWS * rb).enumerate() {
        let g = g0 + gi;
        for i in 0..nb {
            let src: &[u8; PACKED_BLOCK] = packed[(g * nb + i) * PACKED_BLOCK..][..PACKED_BLOCK]
                .try_into()
                .expect("a whole packed block");
            for (r, row) in rows.chunks_exact_mut(rb).enumerate() {
                let dst: &mut [u8; q6_k::BLOCK] = (&mut row[i * q6_k::BLOCK..][..q6_k::BLOCK])
                    .try_into()
                    .expect("a whole block");
                for (w, &at) in WORD_AT.iter().enumerate() {
                    let a = at + 4 * r;
                    dst[4 * w..4 * w + 4].copy_from_slice(&src[a..a + 4]);
                }
                for k in 0..16 {
                    dst[192 + k] = src[SC + 16 * k + r];
                }
                dst[208..210].copy_from_slice(&src[D + 2 * r..D + 2 * r + 2]);
            }
        }
    }
}

/// The sixteen rows of one group (`grp`: its `nb` packed super-blocks)
/// against `N` Q8_K activation rows; writes each token's sixteen values
/// to `out[t]`.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 F/BW/VL and VNNI are available; `grp` holds
/// `nb * PACKED_BLOCK` bytes and every `a[t]` `nb` Q8_K blocks.
/// Every `out[t]` has sixteen writable floats.
// `t` indexes several arrays (tokens' sums, pointers) at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pass<const N: usize>(nb: usize, grp: *const u8, a: [*const u8; N], out: [*mut f32; N]) {
    let m4 = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); N];
    for i in 0..nb {
        let blk = grp.wrapping_add(i * PACKED_BLOCK);
        let ab: [*const u8; N] = std::array::from_fn(|t| a[t].wrapping_add(i * q8_k::BLOCK));
        let mut isum = [zero; N];
        // One group of sixteen elements, its place a constant so that the
        // shifts and offsets below are fixed (a loop over g compiled to
        // branches and a jump table, and took 2.5x q4k_packed's time per
        // byte).
        macro_rules! group {
            ($h:expr, $gl:expr, $o:expr) => {{
                // A sixteenth of the block AHEAD on, spread over the groups.
                prefetch_span(
                    blk,
                    AHEAD,
                    $o * PACKED_BLOCK / 16,
                    $o * PACKED_BLOCK / 16 + 256,
                );
                // Group g of half h: the low nibbles of `ql` words
                // 4(g % 4) .. + 4 for g % 8 < 4, their high nibbles after;
                // the `qh` words are the same ones modulo 8, at bits 2k (k:
                // the quarter of the half the group's elements fall in).
                const H: usize = $h;
                const GL: usize = $gl;
                const G: usize = 8 * H + GL;
                const HIGH: bool = GL >= 4;
                const M0: usize = 4 * (GL % 4);
                const K: usize = M0 / 8 + if HIGH { 2 } else { 0 };
                // SAFETY: the group's sixteen scales, i8.
                let sc = _mm512_cvtepi8_epi32(unsafe {
                    _mm_loadu_si128(blk.add(SC + 16 * G) as *const __m128i)
                });
                // Two chains per token when few tokens interleave: the
                // four products of a group otherwise wait on each other.
                let mut dot = [zero; N];
                let mut dot2 = [zero; N];
                let mut dot3 = [zero; N];
                let mut dot4 = [zero; N];
                for m in M0..M0 + 4 {
                    // SAFETY: two words of this packed block (slots < 48).
                    let (q, qh) = unsafe {
                        (
                            _mm512_loadu_si512(
                                blk.add(WORDS + 64 * ql_slot(H, m)) as *const __m512i
                            ),
                            _mm512_loadu_si512(
                                blk.add(WORDS + 64 * qh_slot(H, m % 8)) as *const __m512i
                            ),
                        )
                    };
                    // Each byte's two high bits (bits 2k, 2k + 1 of its `qh`
                    // byte) onto bits 4 and 5, beside its nibble: the
                    // unsigned value q + 32. Shifting 16-bit lanes is safe:
                    // the masks keep only bits of the byte's own.
                    let bits = match K {
                        0 => _mm512_slli_epi16::<4>(qh),
                        1 => _mm512_slli_epi16::<2>(qh),
                        2 => qh,
                        _ => _mm512_srli_epi16::<2>(qh),
                    };
                    let nib = if HIGH { _mm512_srli_epi16::<4>(q) } else { q };
                    let v = _mm512_or_si512(_mm512_and_si512(nib, m4), _mm512_and_si512(bits, m30));
                    let e = 128 * H + if HIGH { 64 } else { 0 } + 4 * m;
                    for t in 0..N {
                        // SAFETY: quants e .. e + 4 of token t's block i.
                        let x = unsafe { read_u32(ab[t].add(4 + e)) };
                        let xv = _mm512_set1_epi32(x as i32);
                        match (N <= 2, m % 4) {
                            (true, 1) => dot2[t] = _mm512_dpbusd_epi32(dot2[t], v, xv),
                            (true, 2) => dot3[t] = _mm512_dpbusd_epi32(dot3[t], v, xv),
                            (true, 3) => dot4[t] = _mm512_dpbusd_epi32(dot4[t], v, xv),
                            _ => dot[t] = _mm512_dpbusd_epi32(dot[t], v, xv),
                        }
                    }
                }
                if N <= 2 {
                    for t in 0..N {
                        dot[t] = _mm512_add_epi32(
                            _mm512_add_epi32(dot[t], dot2[t]),
                            _mm512_add_epi32(dot3[t], dot4[t]),
                        );
                    }
                }
                for t in 0..N {
                    // SAFETY: token t's block-i 16-sum g (i16 at 260 + 2g).
                    let bs = unsafe {
                        let s = ab[t].add(260 + 2 * G);
                        i16::from_le_bytes([*s, *s.add(1)]) as i32
                    };
                    // |dot - 32 bs| <= 16 * 63 * 128 and |scale| <= 128,
                    // sixteen groups: exact in i32, as in the reference.
                    let centred = _mm512_sub_epi32(dot[t], _mm512_set1_epi32(32 * bs));
                    isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(sc, centred));
                }
            }};
        }
        // Per half and quarter q, the four groups that read its twelve
        // words, so the block is read in its stored order.
        group!(0, 0, 0);
        group!(0, 2, 1);
        group!(0, 4, 2);
        group!(0, 6, 3);
        group!(0, 1, 4);
        group!(0, 3, 5);
        group!(0, 5, 6);
        group!(0, 7, 7);
        group!(1, 0, 8);
        group!(1, 2, 9);
        group!(1, 4, 10);
        group!(1, 6, 11);
        group!(1, 1, 12);
        group!(1, 3, 13);
        group!(1, 5, 14);
        group!(1, 7, 15);
        // SAFETY: the sixteen d of this packed block.
        let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(blk.add(D) as *const __m256i) });
        for t in 0..N {
            // SAFETY: token t's block-i scale.
            let da = _mm512_set1_ps(unsafe { super::read_f32(ab[t]) });
            // The scalar reference's block value, lane by lane, to the bit.
            let v = _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum[t]));
            acc[t] = _mm512_add_ps(acc[t], v);
        }
    }
    for t in 0..N {
        // SAFETY: sixteen floats at each `out[t]` (caller's contract).
        unsafe { _mm512_storeu_ps(out[t], acc[t]) };
    }
}

super::packed_groups::q8k_packed_tile!("Q6_K");

#[cfg(test)]
mod tests {
    use super::*;

    /// Pack, then unpack a range of groups that starts past the first: the
    /// file's bytes back.
    #[test]
    fn unpack_gives_back_the_files_bytes() {
        if !available() {
            return;
        }
        let (rows, nb) = (4 * GROUP_ROWS, 3);
        let rb = nb * q6_k::BLOCK;
        // Any bytes: packing moves them and reads no value.
        let data: Vec<u8> = (0..rows * rb).map(|i| (i * 7919 % 251) as u8).collect();
        let mut packed = vec![0u8; rows / GROUP_ROWS * nb * PACKED_BLOCK];
        pack(rows, nb * QK_K, &data, &mut packed);
        let (g0, g1) = (1, 4);
        let want = &data[g0 * GROUP_ROWS * rb..g1 * GROUP_ROWS * rb];
        let mut got = vec![0u8; want.len()];
        unpack(nb, &packed, (g0, g1), &mut got);
        assert!(got == want, "the unpacked rows differ from the file's");
    }
}
