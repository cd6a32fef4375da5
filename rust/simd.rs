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
