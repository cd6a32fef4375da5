//! Where a model's bytes live: a read-only memory map of the file (weights
//! are never copied to the heap) or a caller-provided buffer.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::{Error, Result};

pub enum Source {
    Mapped(Mmap),
    Owned(Vec<u8>),
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
        Ok(Source::Mapped(map))
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            Source::Mapped(m) => m,
            Source::Owned(v) => v,
        }
    }

    pub fn is_mapped(&self) -> bool {
        matches!(self, Source::Mapped(_))
    }
}
