//! The element types of KV cache memory, one for keys and one for values.
//!
//! Besides f32 and f16, a side can hold ggml's `q8_0` and `q4_0` blocks
//! (llama.cpp's `--cache-type-k/-v`): each row of a head is quantized on
//! its own, 32 elements to a block, so a row's bytes are those llama.cpp's
//! reference quantizer gives it.
//!
//! A quantized side can also hold its rows rotated by an orthonormal
//! Walsh-Hadamard matrix (`KvRot`, `ops/hadamard.rs`), as llama.cpp's
//! cache does by default.

use crate::ops::hadamard;
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

/// Environment variable that turns the rotation of quantized caches off
/// (a nonzero integer, read as C's `atoi`), as `LLAMA_ATTN_ROT_DISABLE`
/// does in llama.cpp. Read when a cache (its pool) is made.
pub const ROT_DISABLE_ENV: &str = "OXILLAMA_ATTN_ROT_DISABLE";

/// The Walsh-Hadamard rotation each side's rows are stored under: the
/// block size (a power of two dividing the head size), 0 for none.
///
/// With keys rotated, queries are rotated alike before attention; with
/// values rotated, the attention output is rotated back (the transform is
/// its own inverse). llama.cpp's default (`KvRot::standard`): a quantized
/// side whose head size is a multiple of 64 is rotated, keys in blocks of
/// the largest power of two dividing the head size, values in blocks of 64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvRot {
    pub k: usize,
    pub v: usize,
}

/// The smallest rotation llama.cpp applies, and the size it uses for values.
const ROT_MIN: usize = 64;

impl KvRot {
    pub const NONE: KvRot = KvRot { k: 0, v: 0 };

    /// llama.cpp's choice for caches of types `t` and these head sizes.
    pub fn standard(t: KvTypes, dim_k: usize, dim_v: usize) -> Self {
        let on =
            |d: KvDtype, dim: usize| d.is_quantized() && dim > 0 && dim.is_multiple_of(ROT_MIN);
        KvRot {
            // The largest power of two dividing dim_k (at least 64 here).
            k: if on(t.k, dim_k) {
                1 << dim_k.trailing_zeros()
            } else {
                0
            },
            v: if on(t.v, dim_v) { ROT_MIN } else { 0 },
        }
    }

    /// `standard` unless `OXILLAMA_ATTN_ROT_DISABLE` turns it off.
    pub fn from_env(t: KvTypes, dim_k: usize, dim_v: usize) -> Self {
        let off = std::env::var(ROT_DISABLE_ENV).is_ok_and(|s| atoi(&s) != 0);
        if off {
            KvRot::NONE
        } else {
            KvRot::standard(t, dim_k, dim_v)
        }
    }

    pub fn side(self, side: Side) -> usize {
        match side {
            Side::K => self.k,
            Side::V => self.v,
        }
    }

    pub fn is_none(self) -> bool {
        self == KvRot::NONE
    }

    /// Whether these blocks tile rows of these head sizes.
    pub fn check(self, dim_k: usize, dim_v: usize) -> Result<()> {
        for (n, dim, side) in [(self.k, dim_k, "key"), (self.v, dim_v, "value")] {
            if n != 0 && !(n.is_power_of_two() && dim.is_multiple_of(n)) {
                return Err(Error::invalid(format!(
                    "a Hadamard rotation in blocks of {n} does not fit {side} rows of {dim} \
                     elements (a power of two dividing the head size is needed)"
                )));
            }
        }
        Ok(())
    }

    /// `"K 64, V 64"`, `"K 256, V none"`, or `"none"`.
    pub fn describe(self) -> String {
        if self.is_none() {
            return "none".into();
        }
        let one = |n: usize| {
            if n == 0 {
                "none".to_string()
            } else {
                n.to_string()
            }
        };
        format!("K {}, V {}", one(self.k), one(self.v))
    }
}

/// C's `atoi`: the leading decimal integer after blanks, 0 if none.
fn atoi(s: &str) -> i64 {
    let t = s.trim_start();
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let mut v: i64 = 0;
    for b in digits.bytes().take_while(u8::is_ascii_digit) {
        v = v.saturating_mul(10).saturating_add((b - b'0') as i64);
    }
    if neg {
        -v
    } else {
        v
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

/// What one position of a layer holds, and so the shape of exported KV
/// data (see `KvCache::export`): `n_head_kv` key rows of `dim_k` and,
/// unless `v_in_k`, as many value rows of `dim_v`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub n_layer: usize,
    pub n_head_kv: usize,
    pub dim_k: usize,
    pub dim_v: usize,
    /// Values are the first `dim_v` elements of the key rows and are not
    /// stored (DeepSeek's MLA caches its latent once).
    pub v_in_k: bool,
}

impl KvShape {
    /// Ordinary keys and values.
    pub fn plain(n_layer: usize, n_head_kv: usize, dim_k: usize, dim_v: usize) -> Self {
        KvShape {
            n_layer,
            n_head_kv,
            dim_k,
            dim_v,
            v_in_k: false,
        }
    }

    /// Elements of each stored value row.
    pub fn stored_dim_v(&self) -> usize {
        if self.v_in_k {
            0
        } else {
            self.dim_v
        }
    }

    /// Bytes one position takes in every layer, in these types.
    pub fn position_bytes(&self, t: KvTypes) -> usize {
        self.n_layer
            * self.n_head_kv
            * (t.k.row_bytes(self.dim_k) + t.v.row_bytes(self.stored_dim_v()))
    }

    pub fn export_len(&self, t: KvTypes, n: usize) -> usize {
        n * self.position_bytes(t)
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
    convert_export_rot(data, shape, n, (from, KvRot::NONE), (to, KvRot::NONE))
}

/// `convert_export` between caches whose rows are also stored under
/// rotations: each row is decoded, rotated back if `from` rotates its
/// side, rotated if `to` does, and encoded. A side whose type and rotation
/// both stay is copied as it is.
pub fn convert_export_rot(
    data: &[u8],
    shape: KvShape,
    n: usize,
    (from, rot_from): (KvTypes, KvRot),
    (to, rot_to): (KvTypes, KvRot),
) -> Result<Vec<u8>> {
    from.k.check_dim(shape.dim_k)?;
    from.v.check_dim(shape.dim_v)?;
    to.k.check_dim(shape.dim_k)?;
    to.v.check_dim(shape.dim_v)?;
    rot_from.check(shape.dim_k, shape.dim_v)?;
    rot_to.check(shape.dim_k, shape.dim_v)?;
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
        for (side, dim) in [(Side::K, shape.dim_k), (Side::V, shape.dim_v)] {
            let (a, b) = (from.side(side), to.side(side));
            let (ra, rb) = (a.row_bytes(dim), b.row_bytes(dim));
            let (na, nb) = (rot_from.side(side), rot_to.side(side));
            let len = shape.n_head_kv * n;
            if a == b && na == nb {
                out[o..o + rb * len].copy_from_slice(&data[i..i + ra * len]);
                i += ra * len;
                o += rb * len;
                continue;
            }
            row.resize(dim, 0f32);
            for _ in 0..len {
                decode_row(a, &data[i..i + ra], &mut row);
                if na != nb {
                    hadamard::rotate(&mut row, na);
                    hadamard::rotate(&mut row, nb);
                }
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
            v_in_k: false,
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

    #[test]
    fn the_rotation_follows_llama_cpp_defaults() {
        let q = |s: &str| KvTypes::parse(s).unwrap();
        // SmolLM2 (64), Gemma-3 (256), a 192-wide head, an 80-wide one.
        assert_eq!(KvRot::standard(q("q4_0"), 64, 64), KvRot { k: 64, v: 64 });
        assert_eq!(
            KvRot::standard(q("q8_0"), 256, 256),
            KvRot { k: 256, v: 64 }
        );
        assert_eq!(KvRot::standard(q("q4_0"), 192, 128), KvRot { k: 64, v: 64 });
        assert_eq!(KvRot::standard(q("q4_0"), 96, 96), KvRot::NONE);
        assert_eq!(KvRot::standard(q("f16"), 128, 128), KvRot::NONE);
        assert_eq!(
            KvRot::standard(q("q8_0/f16"), 128, 128),
            KvRot { k: 128, v: 0 }
        );
        assert_eq!(
            KvRot::standard(q("f32/q4_0"), 128, 128),
            KvRot { k: 0, v: 64 }
        );
        assert_eq!(KvRot { k: 256, v: 0 }.describe(), "K 256, V none");
        assert_eq!(KvRot::NONE.describe(), "none");
        assert!(KvRot { k: 128, v: 64 }.check(64, 64).is_err());
        assert!(KvRot { k: 48, v: 0 }.check(96, 96).is_err());
        assert!(KvRot { k: 32, v: 64 }.check(96, 64).is_ok());
        for (text, v) in [
            ("1", 1),
            (" 2x", 2),
            ("0", 0),
            ("", 0),
            ("yes", 0),
            ("-1", -1),
        ] {
            assert_eq!(atoi(text), v, "{text:?}");
        }
    }

    /// Converting between rotations: to rotated rows and back gives the
    /// rows (f32: up to rounding); a rotated quantized export turned into
    /// an unrotated f32 one holds the stored rows rotated back.
    #[test]
    fn conversion_rotates_and_unrotates_rows() {
        let shape = KvShape {
            n_layer: 2,
            n_head_kv: 2,
            dim_k: 128,
            dim_v: 64,
            v_in_k: false,
        };
        let n = 3;
        let f32s = KvTypes::same(KvDtype::F32);
        let vals: Vec<f32> = (0..shape.export_len(f32s, n) / 4)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 9.0)
            .collect();
        let data: Vec<u8> = vals.iter().flat_map(|x| x.to_le_bytes()).collect();
        let rot = KvRot { k: 128, v: 64 };
        let r = convert_export_rot(&data, shape, n, (f32s, KvRot::NONE), (f32s, rot)).unwrap();
        let floats = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        // The first key row, rotated.
        let mut want = vals[..128].to_vec();
        hadamard::rotate(&mut want, 128);
        assert_eq!(&floats(&r)[..128], &want[..]);
        let back =
            floats(&convert_export_rot(&r, shape, n, (f32s, rot), (f32s, KvRot::NONE)).unwrap());
        for (a, b) in vals.iter().zip(&back) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        // Rotated q4_0 rows, unrotated into f32: within q4_0's error.
        let q4 = KvTypes::same(KvDtype::Q4_0);
        let rq = convert_export_rot(&data, shape, n, (f32s, KvRot::NONE), (q4, rot)).unwrap();
        let uq =
            floats(&convert_export_rot(&rq, shape, n, (q4, rot), (f32s, KvRot::NONE)).unwrap());
        // Rotated back, a block's rounding errors spread over its rows: the
        // RMS error stays q4_0's (about a step / sqrt(12); steps here are
        // near 1), the largest one grows.
        let rms = (vals
            .iter()
            .zip(&uq)
            .map(|(a, b)| (a - b).powi(2))
            .sum::<f32>()
            / vals.len() as f32)
            .sqrt();
        assert!(rms < 0.5, "q4_0 round trip RMS error {rms}");
        // The same types and rotation: copied as they are.
        assert_eq!(
            convert_export_rot(&rq, shape, n, (q4, rot), (q4, rot)).unwrap(),
            rq
        );
        assert!(
            convert_export_rot(&rq, shape, n, (q4, rot), (q4, KvRot { k: 256, v: 64 })).is_err()
        );
    }
}
