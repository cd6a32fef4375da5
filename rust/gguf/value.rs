//! GGUF metadata values. Arrays are stored as typed vectors rather than a
//! `Vec<Value>` so a 262k-entry vocabulary costs one allocation per column.

use super::cursor::Cursor;
use crate::{Error, Result};

/// Nested arrays deeper than this are refused: no real model needs more,
/// and it bounds recursion on hostile input.
const MAX_NESTING: usize = 8;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    Str(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::Str(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Value {
    /// Any integer value that fits in u64 (GGUF writers disagree on widths).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
}

fn type_name(t: u32) -> &'static str {
    match t {
        0 => "u8",
        1 => "i8",
        2 => "u16",
        3 => "i16",
        4 => "u32",
        5 => "i32",
        6 => "f32",
        7 => "bool",
        8 => "string",
        9 => "array",
        10 => "u64",
        11 => "i64",
        12 => "f64",
        _ => "unknown",
    }
}

/// Smallest encoded size of one element of type `t`, used to bound counts.
fn min_size(t: u32) -> usize {
    match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        _ => 8,
    }
}

fn read_bool(c: &mut Cursor<'_>, what: &str) -> Result<bool> {
    match c.u8(what)? {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(Error::load(format!(
            "{what}: bool byte is {b}, expected 0 or 1"
        ))),
    }
}

pub(super) fn read_value(c: &mut Cursor<'_>, ty: u32, what: &str) -> Result<Value> {
    Ok(match ty {
        0 => Value::U8(c.u8(what)?),
        1 => Value::I8(c.i8(what)?),
        2 => Value::U16(c.u16(what)?),
        3 => Value::I16(c.i16(what)?),
        4 => Value::U32(c.u32(what)?),
        5 => Value::I32(c.i32(what)?),
        6 => Value::F32(c.f32(what)?),
        7 => Value::Bool(read_bool(c, what)?),
        8 => Value::Str(c.string_lossy(what)?),
        9 => {
            let elem = c.u32(what)?;
            Value::Array(read_array(c, elem, what, 1)?)
        }
        10 => Value::U64(c.u64(what)?),
        11 => Value::I64(c.i64(what)?),
        12 => Value::F64(c.f64(what)?),
        t => return Err(Error::load(format!("{what} has unknown value type {t}"))),
    })
}

fn read_array(c: &mut Cursor<'_>, elem: u32, what: &str, depth: usize) -> Result<Array> {
    if depth > MAX_NESTING {
        return Err(Error::load(format!(
            "{what}: arrays nested deeper than {MAX_NESTING}"
        )));
    }
    if type_name(elem) == "unknown" {
        return Err(Error::load(format!(
            "{what}: array of unknown value type {elem}"
        )));
    }
    let n = c.count(min_size(elem), &format!("{what} array length"))?;
    macro_rules! col {
        ($variant:ident, $read:expr) => {{
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push($read?);
            }
            Array::$variant(v)
        }};
    }
    Ok(match elem {
        0 => Array::U8(c.take(n, what)?.to_vec()),
        1 => col!(I8, c.i8(what)),
        2 => col!(U16, c.u16(what)),
        3 => col!(I16, c.i16(what)),
        4 => col!(U32, c.u32(what)),
        5 => col!(I32, c.i32(what)),
        6 => col!(F32, c.f32(what)),
        7 => col!(Bool, read_bool(c, what)),
        8 => col!(Str, c.string_lossy(what)),
        9 => col!(Array, {
            let inner = c.u32(what)?;
            read_array(c, inner, what, depth + 1)
        }),
        10 => col!(U64, c.u64(what)),
        11 => col!(I64, c.i64(what)),
        _ => col!(F64, c.f64(what)),
    })
}
