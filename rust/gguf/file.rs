//! A parsed GGUF file: metadata, tensor directory, and checked access to
//! tensor bytes inside the mapped file.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use super::cursor::Cursor;
use super::value::{read_value, Value};
use super::{Held, Source, WeightArena, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::quant::GgmlType;
use crate::{Error, Result};

#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous (row) length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute byte offset in the file (already checked to be in range).
    pub offset: usize,
    pub nbytes: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Length of one row (the contiguous dimension).
    pub fn row_len(&self) -> usize {
        self.dims.first().map_or(1, |&d| d as usize)
    }
    /// Number of rows: product of all dimensions but the first.
    pub fn n_rows(&self) -> usize {
        self.dims.iter().skip(1).product::<u64>() as usize
    }
}

pub struct GgufFile {
    source: Source,
    pub version: u32,
    pub alignment: u64,
    pub data_offset: usize,
    metadata: Vec<(String, Value)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// The matrices decode streams, repacked or copied onto huge pages (by
    /// data offset), made once by the model (see `ensure_packed`) and kept
    /// as long as the file.
    packed: OnceLock<WeightArena>,
    /// Whether views hand out the arena's matrices (off under an offload
    /// budget, whose pager must see every weight read).
    packed_on: AtomicBool,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        Self::parse(Source::map(path)?)
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(Source::Owned(bytes))
    }

    pub fn parse(source: Source) -> Result<Self> {
        let data = source.bytes();
        let file_size = data.len();
        let mut c = Cursor::new(data);
        let magic = c.u32("magic")?;
        if magic != MAGIC {
            let found = data.get(..4).unwrap_or(&[]);
            return Err(Error::load(format!(
                "not a GGUF file: bad magic {found:02x?} (expected \"GGUF\")"
            )));
        }
        let version = c.u32("version")?;
        if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
            return Err(Error::load("big-endian GGUF files are not supported"));
        }
        if !(2..=3).contains(&version) {
            return Err(Error::load(format!(
                "unsupported GGUF version {version} (supported: 2, 3)"
            )));
        }
        // A tensor info is at least 8 (name len) + 4 (dims) + 4 (type) + 8 (offset) bytes.
        let n_tensors = c.count(24, "tensor count")?;
        // A key-value pair is at least 8 (key len) + 4 (type) + 1 (value) bytes.
        let n_kv = c.count(13, "metadata count")?;

        let mut metadata = Vec::with_capacity(n_kv);
        let mut meta_index = HashMap::with_capacity(n_kv);
        for i in 0..n_kv {
            let key = c.string_strict(&format!("metadata key #{i}"))?;
            let ty = c.u32(&format!("type of metadata {key}"))?;
            let value = read_value(&mut c, ty, &format!("metadata {key}"))?;
            if meta_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(Error::load(format!("duplicate metadata key {key}")));
            }
            metadata.push((key, value));
        }

        let alignment = match meta_index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= 1 << 20 => a,
                _ => {
                    return Err(Error::load(format!(
                        "general.alignment must be a power of two up to 1 MiB, got {v:?}"
                    )))
                }
            },
        };

        struct Raw {
            name: String,
            dims: Vec<u64>,
            ty: GgmlType,
            rel: u64,
        }
        let mut raws = Vec::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = c.string_strict(&format!("name of tensor #{i}"))?;
            let n_dims = c.u32(&format!("dimension count of tensor {name}"))? as usize;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(Error::load(format!(
                    "tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for d in 0..n_dims {
                let v = c.u64(&format!("dimension {d} of tensor {name}"))?;
                if v == 0 || v > i64::MAX as u64 {
                    return Err(Error::load(format!(
                        "tensor {name} dimension {d} is {v}, out of range"
                    )));
                }
                dims.push(v);
            }
            let ty_raw = c.u32(&format!("type of tensor {name}"))?;
            let ty = GgmlType::from_u32(ty_raw).ok_or_else(|| {
                Error::load(format!("tensor {name} has unsupported type id {ty_raw}"))
            })?;
            let rel = c.u64(&format!("offset of tensor {name}"))?;
            raws.push(Raw {
                name,
                dims,
                ty,
                rel,
            });
        }

        let header_end = c.pos() as u64;
        let data_offset = header_end
            .checked_next_multiple_of(alignment)
            .filter(|&o| o <= file_size as u64)
            .ok_or_else(|| {
                Error::load(format!(
                    "tensor data section starts past end of file (header ends at {header_end}, file size {file_size})"
                ))
            })?;

        let mut tensors = Vec::with_capacity(raws.len());
        let mut tensor_index = HashMap::with_capacity(raws.len());
        for r in raws {
            let name = r.name;
            let n_el = r.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let row = r.dims[0];
            let nbytes = n_el
                .and_then(|n| usize::try_from(n).ok())
                .and_then(|n| {
                    let row = usize::try_from(row).ok()?;
                    // Every row must be whole blocks; checking the row covers the tensor.
                    r.ty.row_bytes(row)?;
                    r.ty.row_bytes(n)
                })
                .ok_or_else(|| {
                    Error::load(format!(
                        "tensor {name} has shape {:?} that is not a whole number of {} blocks of {} or is too large",
                        r.dims,
                        r.ty.name(),
                        r.ty.block_size()
                    ))
                })?;
            if r.rel % alignment != 0 {
                return Err(Error::load(format!(
                    "tensor {name} offset {} is not a multiple of the alignment {alignment}",
                    r.rel
                )));
            }
            let start = data_offset.checked_add(r.rel);
            let end = start.and_then(|s| s.checked_add(nbytes as u64));
            match (start, end) {
                (Some(s), Some(e)) if e <= file_size as u64 => {
                    if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                        return Err(Error::load(format!("duplicate tensor name {name}")));
                    }
                    tensors.push(TensorInfo {
                        name,
                        dims: r.dims,
                        ty: r.ty,
                        offset: s as usize,
                        nbytes,
                    });
                }
                _ => {
                    return Err(Error::load(format!(
                        "tensor {name} extends past end of file (offset {}, {} bytes, file size {file_size})",
                        data_offset.saturating_add(r.rel),
                        nbytes
                    )))
                }
            }
        }

        Ok(GgufFile {
            version,
            alignment,
            data_offset: data_offset as usize,
            metadata,
            meta_index,
            tensors,
            tensor_index,
            source,
            packed: OnceLock::new(),
            packed_on: AtomicBool::new(true),
        })
    }

    pub fn file_size(&self) -> usize {
        self.source.bytes().len()
    }

    pub fn is_mapped(&self) -> bool {
        self.source.is_mapped()
    }

    /// The model file, when the model is mapped from one.
    pub fn mapped_file(&self) -> Option<&std::fs::File> {
        self.source.file()
    }

    /// Whether the arena is a file the user's processes share (made and
    /// shared, or found shared), once made.
    pub fn arena_shared(&self) -> bool {
        self.packed.get().is_some_and(WeightArena::is_shared)
    }

    /// Paging advice for a byte range of a mapped file (the layer pager).
    pub fn page(&self, offset: usize, len: usize, what: super::Paging) -> std::io::Result<()> {
        self.source.page(offset, len, what)
    }

    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor; its range was validated at parse time.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        &self.source.bytes()[t.offset..t.offset + t.nbytes]
    }

    /// Makes the derived layouts (once; later calls return at once).
    pub fn ensure_packed(&self, build: impl FnOnce(&GgufFile) -> WeightArena) {
        self.packed.get_or_init(|| build(self));
    }

    /// Whether the weight arena has been built (it may hold nothing, where
    /// no matrix is repacked or copied on this CPU).
    pub fn arena_built(&self) -> bool {
        self.packed.get().is_some()
    }

    /// What a view of the `len` bytes at `offset` (a tensor's data start)
    /// reads, from one arena lookup: the huge-page copy if the arena holds
    /// one, else the file's bytes; and the derived decode layout, if one was
    /// made. The arena is skipped while it is off.
    pub fn matrix_bytes(&self, offset: usize, len: usize) -> (&[u8], Option<&[u8]>) {
        let file = &self.source.bytes()[offset..offset + len];
        let Some(arena) = self
            .packed
            .get()
            .filter(|_| self.packed_on.load(Ordering::Relaxed))
        else {
            return (file, None);
        };
        match arena.lookup(offset) {
            Some((Held::Packed, layout)) => (file, Some(layout)),
            Some((Held::Copy, copy)) if copy.len() == len => (copy, None),
            _ => (file, None),
        }
    }

    /// Whether `bytes` lie in memory this file owns (its bytes or its
    /// arena), which lives as long as the file: what lets a job that holds
    /// the file's `Arc` keep reading a matrix after its caller has moved on.
    pub fn holds(&self, bytes: &[u8]) -> bool {
        super::arena::within(self.source.bytes(), bytes)
            || self.packed.get().is_some_and(|a| a.holds(bytes))
    }

    /// Turns the arena's matrices on or off for later views.
    pub fn set_packed_on(&self, on: bool) {
        self.packed_on.store(on, Ordering::Relaxed);
    }

    /// The whole underlying buffer (for fingerprints and kernels that keep
    /// raw pointers into the map).
    pub fn bytes(&self) -> &[u8] {
        self.source.bytes()
    }
}
