//! Zeroed, 64-byte aligned byte storage for packed weights.
//!
//! A decode step streams every weight once, about a gigabyte, so with 4 KiB pages each
//! 4 KiB read needs its own TLB entry, and under a hypervisor every miss is a two-level
//! page walk. On Linux, large buffers are therefore mapped on a 2 MiB boundary and marked for
//! transparent huge pages (`MADV_HUGEPAGE`, which works where the system setting is `always`
//! or `madvise`); elsewhere, or if the mapping fails, they come from the allocator.

/// Buffers at least this large are mapped for huge pages.
#[cfg(target_os = "linux")]
const HUGE_FROM: usize = 1 << 21;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

pub(crate) struct AlignedBytes {
    storage: Storage,
    len: usize,
}

enum Storage {
    Lines(Vec<Line>),
    #[cfg(target_os = "linux")]
    Mapped(huge::Mapping),
}

impl AlignedBytes {
    pub(crate) fn zeroed(len: usize) -> Self {
        #[cfg(target_os = "linux")]
        if len >= HUGE_FROM {
            if let Some(mapping) = huge::Mapping::new(len) {
                return Self {
                    storage: Storage::Mapped(mapping),
                    len,
                };
            }
        }
        Self {
            storage: Storage::Lines(vec![Line([0; 64]); len.div_ceil(64)]),
            len,
        }
    }

    fn ptr(&self) -> *const u8 {
        match &self.storage {
            Storage::Lines(lines) => lines.as_ptr() as *const u8,
            #[cfg(target_os = "linux")]
            Storage::Mapped(m) => m.ptr(),
        }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: both storages hold at least `len` initialised (zeroed or written) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr() as *mut u8, self.len) }
    }
}

#[cfg(target_os = "linux")]
mod huge {
    const HUGE_PAGE: usize = 1 << 21;

    /// An anonymous private mapping, its usable part starting on a huge-page boundary.
    pub(super) struct Mapping {
        base: *mut libc::c_void,
        mapped: usize,
        start: *mut u8,
    }

    // SAFETY: the mapping is memory owned like a `Vec`'s buffer: it is freed only on drop
    // and reached only through `AlignedBytes`' `&self`/`&mut self` methods.
    unsafe impl Send for Mapping {}
    // SAFETY: as for Send: shared access only reads, through `&self`.
    unsafe impl Sync for Mapping {}

    impl Mapping {
        /// `len` zeroed bytes (fresh anonymous pages), or `None` if the mapping fails.
        pub(super) fn new(len: usize) -> Option<Self> {
            let mapped = len.checked_add(HUGE_PAGE)?;
            // SAFETY: a new anonymous mapping; no existing memory is touched.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    mapped,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return None;
            }
            let start = (base as usize).next_multiple_of(HUGE_PAGE) as *mut u8;
            // SAFETY: `start..start + len` lies inside the mapping. The advice is only a
            // hint: where huge pages are off, the pages stay 4 KiB and nothing else changes.
            unsafe {
                libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
            }
            Some(Self {
                base,
                mapped,
                start,
            })
        }

        pub(super) fn ptr(&self) -> *const u8 {
            self.start
        }
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: the mapping was made in `new` and nothing borrows it past `self`.
            unsafe {
                libc::munmap(self.base, self.mapped);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_buffers_are_zeroed_aligned_and_writable() {
        for len in [0, 1, 100, 3 << 20] {
            let mut b = AlignedBytes::zeroed(len);
            assert_eq!(b.as_slice().len(), len);
            assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
            assert!(b.as_slice().iter().all(|&v| v == 0));
            for (i, v) in b.as_mut_slice().iter_mut().enumerate() {
                *v = i as u8;
            }
            assert!(b.as_slice().iter().enumerate().all(|(i, &v)| v == i as u8));
        }
    }
}
