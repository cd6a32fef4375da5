//! x86 SIMD helpers shared by the quantized and the float kernels.

/// Asks for the `len` bytes at `p` to be brought into L1 ahead of their use.
/// Only a hint: a prefetch never faults, so `p` may be dangling or past the
/// end of a buffer; elsewhere than x86-64 it does nothing.
#[inline(always)]
pub fn prefetch_bytes(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..len).step_by(64) {
        let at = p.wrapping_add(off) as *const i8;
        // SAFETY: SSE is part of every x86-64 CPU, and a prefetch
        // dereferences nothing.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// Whether the CPU says it is Intel's (CPUID leaf 0), decided once per
/// process. For the few tuning choices measured to go opposite ways on
/// Intel's and AMD's cores (see `quant::avx2::packed_groups`).
pub fn intel_cpu() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static INTEL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *INTEL.get_or_init(|| {
            let r = std::arch::x86_64::__cpuid(0);
            let mut vendor = [0u8; 12];
            for (i, w) in [r.ebx, r.edx, r.ecx].iter().enumerate() {
                vendor[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
            }
            &vendor == b"GenuineIntel"
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use std::arch::x86_64::*;

    /// Sum of the eight lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// An element type of the rows the attention and LoRA kernels read: f32,
    /// or f16 bits converted on the way into the registers (exactly, so a
    /// kernel over f16 rows gives the bits it gives over their f32 copy).
    pub trait TileElem: Copy {
        /// Eight elements from `p` as f32.
        ///
        /// # Safety
        /// Eight elements are readable at `p`; AVX (and F16C for f16).
        unsafe fn load8(p: *const Self) -> __m256;
        fn to_f32(self) -> f32;
    }

    impl TileElem for f32 {
        #[inline(always)]
        unsafe fn load8(p: *const f32) -> __m256 {
            // SAFETY: the trait's contract.
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        fn to_f32(self) -> f32 {
            self
        }
    }

    impl TileElem for u16 {
        #[inline(always)]
        unsafe fn load8(p: *const u16) -> __m256 {
            // SAFETY: the trait's contract.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
        }
        #[inline(always)]
        fn to_f32(self) -> f32 {
            half::f16::from_bits(self).to_f32()
        }
    }
}

#[cfg(all(test, target_os = "linux", target_arch = "x86_64"))]
mod tests {
    #[test]
    fn the_vendor_is_the_one_linux_reports() {
        let info = std::fs::read_to_string("/proc/cpuinfo").expect("Linux has /proc/cpuinfo");
        let vendor = info
            .lines()
            .find_map(|l| l.strip_prefix("vendor_id"))
            .expect("x86 /proc/cpuinfo names the vendor");
        assert_eq!(
            super::intel_cpu(),
            vendor.contains("GenuineIntel"),
            "{vendor}"
        );
    }
}
