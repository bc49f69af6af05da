//! Cache prefetch hints, for the kernels of every build.

/// A prefetch of `rows` rows of `bytes` bytes, `ld` bytes apart, from `p` (a hint: never
/// faults, whatever the address).
#[inline(always)]
pub(crate) fn prefetch_rows(p: *const u8, ld: usize, bytes: usize, rows: usize) {
    for r in 0..rows {
        let row = p.wrapping_add(r * ld);
        let mut o = 0;
        while o < bytes {
            prefetch_line(row.wrapping_add(o));
            o += 64;
        }
    }
}

/// A prefetch of the cache line holding `p` into L1 (x86 `PREFETCHT0`, AArch64
/// `PRFM PLDL1KEEP`, nothing elsewhere; a hint: never faults, whatever the address).
#[inline(always)]
pub(crate) fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults; the address is only a hint.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: PRFM never faults and writes nothing; the address is only a hint.
    unsafe {
        core::arch::asm!(
            "prfm pldl1keep, [{0}]",
            in(reg) p,
            options(nostack, preserves_flags, readonly)
        )
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}
