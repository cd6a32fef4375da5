//! Where a model's bytes live: a read-only memory map of the file (weights
//! are never copied to the heap) or a caller-provided buffer.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::{Error, Result};

pub enum Source {
    /// The map and the file it maps (kept open so evicted ranges can be
    /// dropped from the page cache too, not only from this process).
    Mapped(Mmap, File),
    Owned(Vec<u8>),
}

/// What the layer pager asks of a range of the mapped file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paging {
    /// Start reading the range into the page cache and return at once.
    Prefetch,
    /// Map every page of the range into this process, reading what is not
    /// cached; returns when all are there.
    Populate,
    /// Unmap the range from this process (the page cache keeps the pages).
    Unmap,
    /// Faults read only the page they need (no read-around): the pager
    /// reads every unit ahead explicitly, in single-page folios the kernel
    /// can drop page by page.
    Random,
    /// Back to the kernel's usual read-around on faults.
    Normal,
    /// Drop the range's clean, unmapped pages from the page cache. The
    /// kernel skips pages any process still maps, so this never takes a
    /// page from under a live mapping.
    DropCache,
}

impl Source {
    pub fn map(path: &Path) -> Result<Self> {
        let file = File::open(path)
            .map_err(|e| Error::load(format!("cannot open {}: {e}", path.display())))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::load(format!("cannot stat {}: {e}", path.display())))?;
        if !meta.is_file() {
            return Err(Error::load(format!(
                "{} is not a regular file",
                path.display()
            )));
        }
        if meta.len() == 0 {
            return Ok(Source::Owned(Vec::new()));
        }
        // SAFETY: the map is read-only and private to this process. Like every
        // mmap-based loader (llama.cpp included) we rely on the model file not
        // being truncated by another process while it is mapped; all reads are
        // bounds-checked against the length observed at map time.
        let map = unsafe { Mmap::map(&file) }
            .map_err(|e| Error::load(format!("cannot map {}: {e}", path.display())))?;
        #[cfg(unix)]
        {
            // Weights are read front to back once per token; tell the kernel.
            let _ = map.advise(memmap2::Advice::WillNeed);
        }
        Ok(Source::Mapped(map, file))
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            Source::Mapped(m, _) => m,
            Source::Owned(v) => v,
        }
    }

    pub fn is_mapped(&self) -> bool {
        matches!(self, Source::Mapped(..))
    }

    /// The file a mapped source maps.
    pub fn file(&self) -> Option<&File> {
        match self {
            Source::Mapped(_, f) => Some(f),
            Source::Owned(_) => None,
        }
    }

    /// Applies `what` to bytes `offset..offset + len` of a mapped file
    /// (`offset` a multiple of the page size; the range inside the file).
    #[cfg(target_os = "linux")]
    pub fn page(&self, offset: usize, len: usize, what: Paging) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let Source::Mapped(map, file) = self else {
            return Err(std::io::ErrorKind::Unsupported.into());
        };
        if offset.checked_add(len).is_none_or(|end| end > map.len()) {
            return Err(std::io::ErrorKind::InvalidInput.into());
        }
        match what {
            Paging::Prefetch => {
                // One WILLNEED reads at most the device's read-ahead window
                // (max(read_ahead_kb, max_sectors_kb)) from the start of its
                // range; the rest would then fault in page by page (the map
                // is MADV_RANDOM under a budget). A 30 MiB head slice came in
                // at 0.15 GB/s that way and at 1.1 GB/s asked for in pieces
                // of 128 KiB, the smallest window a kernel defaults to.
                let end = offset + len;
                let mut at = offset;
                while at < end {
                    let n = PREFETCH_CHUNK.min(end - at);
                    map.advise_range(memmap2::Advice::WillNeed, at, n)?;
                    at += n;
                }
                Ok(())
            }
            Paging::Populate => map.advise_range(memmap2::Advice::PopulateRead, offset, len),
            Paging::Random => map.advise_range(memmap2::Advice::Random, offset, len),
            Paging::Normal => map.advise_range(memmap2::Advice::Normal, offset, len),
            Paging::Unmap => {
                // SAFETY: the map is private, read-only and never written, so
                // dropping its pages loses nothing: the next read of the range
                // faults the same bytes back in from the file. Slices other
                // threads hold into the range stay valid (the mapping itself
                // is untouched, only its page-table entries go).
                unsafe {
                    map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len)
                }
            }
            Paging::DropCache => {
                let (off, n) = (offset as libc::off_t, len as libc::off_t);
                // SAFETY: a plain syscall on a file descriptor we own; it only
                // hints the page cache and touches no memory of ours.
                let rc = unsafe {
                    libc::posix_fadvise(file.as_raw_fd(), off, n, libc::POSIX_FADV_DONTNEED)
                };
                if rc != 0 {
                    return Err(std::io::Error::from_raw_os_error(rc));
                }
                Ok(())
            }
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub fn page(&self, _offset: usize, _len: usize, _what: Paging) -> std::io::Result<()> {
        Err(std::io::ErrorKind::Unsupported.into())
    }
}

/// Bytes per `MADV_WILLNEED` call (see [`Source::page`]).
#[cfg(target_os = "linux")]
const PREFETCH_CHUNK: usize = 128 << 10;

/// The page size the kernel maps files with.
pub fn page_size() -> usize {
    #[cfg(unix)]
    {
        // SAFETY: sysconf reads a constant of the running system.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if n > 0 {
            return n as usize;
        }
    }
    4096
}
