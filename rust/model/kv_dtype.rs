//! The element types of KV cache memory, one for keys and one for values.
//!
//! Besides f32 and f16, a side can hold ggml's `q8_0` and `q4_0` blocks
//! (llama.cpp's `--cache-type-k/-v`): each row of a head is quantized on
//! its own, 32 elements to a block, so a row's bytes are those llama.cpp's
//! reference quantizer gives it.

use crate::quant::kv as kvq;
use crate::{Error, Result};

/// Keys or values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    K,
    V,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    F16,
    F32,
    Q8_0,
    Q4_0,
}

const NAMES: &str = "\"f32\", \"f16\", \"q8_0\" or \"q4_0\"";

impl KvDtype {
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
            KvDtype::Q8_0 => "q8_0",
            KvDtype::Q4_0 => "q4_0",
        }
    }
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "f16" => Ok(KvDtype::F16),
            "f32" => Ok(KvDtype::F32),
            "q8_0" => Ok(KvDtype::Q8_0),
            "q4_0" => Ok(KvDtype::Q4_0),
            _ => Err(Error::invalid(format!(
                "unknown KV cache type {s:?}: expected {NAMES}"
            ))),
        }
    }
    /// Bytes of one storage unit: an element, or a byte of quantized blocks.
    pub fn unit(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
            KvDtype::Q8_0 | KvDtype::Q4_0 => 1,
        }
    }
    pub fn is_quantized(self) -> bool {
        matches!(self, KvDtype::Q8_0 | KvDtype::Q4_0)
    }
    /// Storage units of one row of `dim` elements.
    pub fn row_units(self, dim: usize) -> usize {
        match self {
            KvDtype::F16 | KvDtype::F32 => dim,
            KvDtype::Q8_0 => dim / kvq::QK * kvq::Q8_0_BLOCK,
            KvDtype::Q4_0 => dim / kvq::QK * kvq::Q4_0_BLOCK,
        }
    }
    /// Bytes of one row of `dim` elements.
    pub fn row_bytes(self, dim: usize) -> usize {
        self.row_units(dim) * self.unit()
    }
    /// Whether rows of `dim` elements can be stored: quantized rows are
    /// whole blocks.
    pub fn check_dim(self, dim: usize) -> Result<()> {
        if self.is_quantized() && !dim.is_multiple_of(kvq::QK) {
            return Err(Error::invalid(format!(
                "a {} KV cache needs head sizes that are multiples of {}, this model's is {dim}",
                self.name(),
                kvq::QK
            )));
        }
        Ok(())
    }
}

/// The KV cache's types: keys and values may differ (as llama.cpp's
/// `--cache-type-k` and `--cache-type-v`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvTypes {
    pub k: KvDtype,
    pub v: KvDtype,
}

impl KvTypes {
    pub fn same(d: KvDtype) -> Self {
        KvTypes { k: d, v: d }
    }

    /// `"q8_0"` when both sides agree, else `"<k>/<v>"` (as `parse` reads).
    pub fn name(self) -> String {
        if self.k == self.v {
            self.k.name().to_string()
        } else {
            format!("{}/{}", self.k.name(), self.v.name())
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        match s.split_once('/') {
            Some((k, v)) => Ok(KvTypes {
                k: KvDtype::parse(k)?,
                v: KvDtype::parse(v)?,
            }),
            None => Ok(KvTypes::same(KvDtype::parse(s)?)),
        }
    }

    pub fn side(self, side: Side) -> KvDtype {
        match side {
            Side::K => self.k,
            Side::V => self.v,
        }
    }
}

impl From<KvDtype> for KvTypes {
    fn from(d: KvDtype) -> Self {
        KvTypes::same(d)
    }
}

/// One row of `dim` elements stored as `t`, as f32.
fn decode_row(t: KvDtype, src: &[u8], dst: &mut [f32]) {
    match t {
        KvDtype::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        KvDtype::F16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        KvDtype::Q8_0 => kvq::dequantize_q8_0(src, dst),
        KvDtype::Q4_0 => kvq::dequantize_q4_0(src, dst),
    }
}

/// One row of f32 stored as `t`, as `KvCache::store` would write it.
fn encode_row(t: KvDtype, src: &[f32], dst: &mut [u8]) {
    match t {
        KvDtype::F32 => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(4)) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        KvDtype::F16 => {
            for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
                o.copy_from_slice(&half::f16::from_f32(*x).to_bits().to_le_bytes());
            }
        }
        KvDtype::Q8_0 => kvq::quantize_q8_0(src, dst),
        KvDtype::Q4_0 => kvq::quantize_q4_0(src, dst),
    }
}

/// Shape of exported KV data (see `KvCache::export`).
#[derive(Debug, Clone, Copy)]
pub struct KvShape {
    pub n_layer: usize,
    pub n_head_kv: usize,
    pub dim_k: usize,
    pub dim_v: usize,
}

impl KvShape {
    pub fn export_len(&self, t: KvTypes, n: usize) -> usize {
        self.n_layer * self.n_head_kv * n * (t.k.row_bytes(self.dim_k) + t.v.row_bytes(self.dim_v))
    }
}

/// Exported KV data of `n` positions in types `from`, re-encoded row by row
/// into types `to` (through f32, as if each row had been stored anew).
pub fn convert_export(
    data: &[u8],
    shape: KvShape,
    n: usize,
    from: KvTypes,
    to: KvTypes,
) -> Result<Vec<u8>> {
    from.k.check_dim(shape.dim_k)?;
    from.v.check_dim(shape.dim_v)?;
    to.k.check_dim(shape.dim_k)?;
    to.v.check_dim(shape.dim_v)?;
    if data.len() != shape.export_len(from, n) {
        return Err(Error::invalid(format!(
            "KV data is {} bytes, expected {} for {n} positions of {}",
            data.len(),
            shape.export_len(from, n),
            from.name()
        )));
    }
    let mut out = vec![0u8; shape.export_len(to, n)];
    let (mut i, mut o) = (0, 0);
    let mut row = Vec::new();
    for _ in 0..shape.n_layer {
        for (dim, a, b) in [(shape.dim_k, from.k, to.k), (shape.dim_v, from.v, to.v)] {
            row.resize(dim, 0f32);
            let (ra, rb) = (a.row_bytes(dim), b.row_bytes(dim));
            for _ in 0..shape.n_head_kv * n {
                decode_row(a, &data[i..i + ra], &mut row);
                encode_row(b, &row, &mut out[o..o + rb]);
                i += ra;
                o += rb;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_types_are_named() {
        for s in ["f16", "f32", "q8_0", "q4_0", "q8_0/q4_0", "f16/q8_0"] {
            assert_eq!(KvTypes::parse(s).unwrap().name(), s);
        }
        assert_eq!(KvTypes::parse("q8_0/q8_0").unwrap().name(), "q8_0");
        let e = KvTypes::parse("q5_1").unwrap_err().to_string();
        assert!(e.contains("q5_1") && e.contains("q4_0"), "{e}");
        assert!(KvTypes::parse("f16/bf16").is_err());
        assert_eq!(KvDtype::Q8_0.row_bytes(64), 68);
        assert_eq!(KvDtype::Q4_0.row_bytes(64), 36);
        assert!(KvDtype::Q4_0.check_dim(48).is_err());
        assert!(KvDtype::F16.check_dim(48).is_ok());
    }

    #[test]
    fn conversion_requantizes_each_row() {
        let shape = KvShape {
            n_layer: 2,
            n_head_kv: 2,
            dim_k: 64,
            dim_v: 32,
        };
        let n = 3;
        let f32s = KvTypes::same(KvDtype::F32);
        let vals: Vec<f32> = (0..shape.export_len(f32s, n) / 4)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let data: Vec<u8> = vals.iter().flat_map(|x| x.to_le_bytes()).collect();
        let to = KvTypes::parse("q8_0/q4_0").unwrap();
        let q = convert_export(&data, shape, n, f32s, to).unwrap();
        assert_eq!(q.len(), shape.export_len(to, n));
        // The first K row of layer 0 is what the quantizer gives it.
        let mut want = vec![0u8; 68];
        kvq::quantize_q8_0(&vals[..64], &mut want);
        assert_eq!(&q[..68], &want[..]);
        // Converting to the same types changes nothing.
        assert_eq!(convert_export(&q, shape, n, to, to).unwrap(), q);
        assert!(convert_export(&q[1..], shape, n, to, f32s).is_err());
    }
}
