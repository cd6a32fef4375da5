//! Tensor lookup: matrices stay in the mapped file (only their location is
//! kept); small vectors (norm weights, biases) are dequantized to f32.

use crate::gguf::GgufFile;
use crate::ops::matmul::QMatrix;
use crate::quant::{dequantize_row, GgmlType};
use crate::{Error, Result};

/// Where a weight matrix lives in the file; shape checked at load time.
#[derive(Debug, Clone, Copy)]
pub struct MatRef {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub offset: usize,
    pub nbytes: usize,
}

impl MatRef {
    pub fn view<'a>(&self, f: &'a GgufFile) -> QMatrix<'a> {
        let (data, packed) = f.matrix_bytes(self.offset, self.nbytes);
        QMatrix {
            ty: self.ty,
            rows: self.rows,
            cols: self.cols,
            data,
            packed,
        }
    }
}

pub fn matrix(f: &GgufFile, name: &str, cols: usize, rows: Option<usize>) -> Result<MatRef> {
    let t = f
        .tensor(name)
        .ok_or_else(|| Error::load(format!("tensor {name} is missing")))?;
    if t.dims.len() != 2
        || t.dims[0] as usize != cols
        || rows.is_some_and(|r| t.dims[1] as usize != r)
    {
        return Err(Error::load(format!(
            "tensor {name} has shape {:?}, expected [{cols}, {}]",
            t.dims,
            rows.map_or("?".to_string(), |r| r.to_string())
        )));
    }
    let m = MatRef {
        ty: t.ty,
        rows: t.dims[1] as usize,
        cols,
        offset: t.offset,
        nbytes: t.nbytes,
    };
    // Validates block geometry and that a kernel exists for this format.
    QMatrix::new(m.ty, m.rows, m.cols, f.tensor_data(t))?;
    Ok(m)
}

/// The per-expert matrices of a 3-D `[cols, rows, n_expert]` tensor (each
/// expert's block of rows lies after the previous one's).
pub fn expert_matrices(
    f: &GgufFile,
    name: &str,
    cols: usize,
    rows: usize,
    n_expert: usize,
) -> Result<Vec<MatRef>> {
    let t = f
        .tensor(name)
        .ok_or_else(|| Error::load(format!("tensor {name} is missing")))?;
    if t.dims.len() != 3
        || t.dims[0] as usize != cols
        || t.dims[1] as usize != rows
        || t.dims[2] as usize != n_expert
        || t.nbytes % n_expert != 0
    {
        return Err(Error::load(format!(
            "tensor {name} has shape {:?}, expected [{cols}, {rows}, {n_expert}]",
            t.dims
        )));
    }
    let per = t.nbytes / n_expert;
    let data = f.tensor_data(t);
    (0..n_expert)
        .map(|i| {
            let m = MatRef {
                ty: t.ty,
                rows,
                cols,
                offset: t.offset + i * per,
                nbytes: per,
            };
            QMatrix::new(m.ty, rows, cols, &data[i * per..(i + 1) * per])?;
            Ok(m)
        })
        .collect()
}

pub fn vector(f: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = f
        .tensor(name)
        .ok_or_else(|| Error::load(format!("tensor {name} is missing")))?;
    if t.n_elements() != len as u64 {
        return Err(Error::load(format!(
            "tensor {name} has shape {:?}, expected {len} elements",
            t.dims
        )));
    }
    let mut out = vec![0f32; len];
    dequantize_row(t.ty, f.tensor_data(t), &mut out)
        .map_err(|e| Error::load(format!("tensor {name}: {e}")))?;
    Ok(out)
}

pub fn opt_vector(f: &GgufFile, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
    if f.tensor(name).is_some() {
        vector(f, name, len).map(Some)
    } else {
        Ok(None)
    }
}

/// Names and loads one layer's tensors (`blk.{il}.{name}.weight|bias`).
pub struct Tensors<'a> {
    pub f: &'a GgufFile,
    pub il: usize,
}

impl Tensors<'_> {
    pub fn weight_name(&self, name: &str) -> String {
        format!("blk.{}.{name}.weight", self.il)
    }
    pub fn bias_name(&self, name: &str) -> String {
        format!("blk.{}.{name}.bias", self.il)
    }
    pub fn has(&self, name: &str) -> bool {
        self.f.tensor(&self.weight_name(name)).is_some()
    }
    pub fn n_elements(&self, name: &str) -> Option<usize> {
        let t = self.f.tensor(&self.weight_name(name))?;
        usize::try_from(t.n_elements()).ok()
    }
    pub fn matrix(&self, name: &str, cols: usize, rows: usize) -> Result<MatRef> {
        matrix(self.f, &self.weight_name(name), cols, Some(rows))
    }
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        vector(self.f, &self.weight_name(name), len)
    }
    pub fn bias(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        vector(self.f, &self.bias_name(name), len)
    }
    pub fn opt_bias(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        opt_vector(self.f, &self.bias_name(name), len)
    }
}
