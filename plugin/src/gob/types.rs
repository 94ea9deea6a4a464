//! Gob type ids and wire type definitions (`wireType` and friends in Go's `encoding/gob/type.go`).

use super::wire::{put_bytes, put_int, put_uint, Reader};
use super::Error;

/// A gob type id. Ids below 64 are predefined; user types get ids chosen by each encoder.
pub type TypeId = i64;

/// The predefined gob type ids.
pub mod ids {
    use super::TypeId;
    /// `bool`
    pub const BOOL: TypeId = 1;
    /// any signed integer
    pub const INT: TypeId = 2;
    /// any unsigned integer
    pub const UINT: TypeId = 3;
    /// `float32`/`float64`
    pub const FLOAT: TypeId = 4;
    /// `[]byte`
    pub const BYTES: TypeId = 5;
    /// `string`
    pub const STRING: TypeId = 6;
    /// `complex64`/`complex128`
    pub const COMPLEX: TypeId = 7;
    /// `interface{}` / `any`
    pub const INTERFACE: TypeId = 8;
    /// The first id a user type may have.
    pub const FIRST_USER: TypeId = 64;
}

/// One field of a struct type definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldType {
    /// The Go field name; gob matches fields by name.
    pub name: String,
    /// The field's type id.
    pub id: TypeId,
}

/// A user type definition as sent on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireType {
    /// `[N]T`
    Array {
        /// informational Go type name
        name: String,
        /// element type id
        elem: TypeId,
        /// fixed length
        len: i64,
    },
    /// `[]T`
    Slice {
        /// informational Go type name
        name: String,
        /// element type id
        elem: TypeId,
    },
    /// A struct; fields are numbered by their position in this list.
    Struct {
        /// informational Go type name
        name: String,
        /// fields in wire order
        fields: Vec<FieldType>,
    },
    /// `map[K]V`
    Map {
        /// informational Go type name
        name: String,
        /// key type id
        key: TypeId,
        /// element type id
        elem: TypeId,
    },
    /// A type with its own `GobEncode` (e.g. `time.Time`): a byte string on the wire.
    GobEncoder {
        /// informational Go type name
        name: String,
    },
    /// A `BinaryMarshaler`: a byte string on the wire.
    BinaryMarshaler {
        /// informational Go type name
        name: String,
    },
    /// A `TextMarshaler`: a byte string on the wire.
    TextMarshaler {
        /// informational Go type name
        name: String,
    },
}

impl WireType {
    /// The Go type name carried in the definition (may be empty).
    pub fn name(&self) -> &str {
        match self {
            WireType::Array { name, .. }
            | WireType::Slice { name, .. }
            | WireType::Struct { name, .. }
            | WireType::Map { name, .. }
            | WireType::GobEncoder { name }
            | WireType::BinaryMarshaler { name }
            | WireType::TextMarshaler { name } => name,
        }
    }

    /// A short description for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            WireType::Array { .. } => "array",
            WireType::Slice { .. } => "slice",
            WireType::Struct { .. } => "struct",
            WireType::Map { .. } => "map",
            WireType::GobEncoder { .. } => "GobEncoder",
            WireType::BinaryMarshaler { .. } => "BinaryMarshaler",
            WireType::TextMarshaler { .. } => "TextMarshaler",
        }
    }

    /// Parses a `wireType` struct value.
    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        let mut field = -1i64;
        let mut out = None;
        loop {
            let delta = r.read_uint()?;
            if delta == 0 {
                break;
            }
            field += delta as i64;
            let wt = match field {
                0 => {
                    let (name, mut rest) = read_common_then(r, 2)?;
                    WireType::Array {
                        name,
                        elem: rest.remove(0),
                        len: rest.remove(0),
                    }
                }
                1 => {
                    let (name, mut rest) = read_common_then(r, 1)?;
                    WireType::Slice {
                        name,
                        elem: rest.remove(0),
                    }
                }
                2 => read_struct_type(r)?,
                3 => {
                    let (name, mut rest) = read_common_then(r, 2)?;
                    WireType::Map {
                        name,
                        key: rest.remove(0),
                        elem: rest.remove(0),
                    }
                }
                4 => WireType::GobEncoder {
                    name: read_common_then(r, 0)?.0,
                },
                5 => WireType::BinaryMarshaler {
                    name: read_common_then(r, 0)?.0,
                },
                6 => WireType::TextMarshaler {
                    name: read_common_then(r, 0)?.0,
                },
                n => return Err(Error::invalid(format!("wireType has no field {n}"))),
            };
            if out.replace(wt).is_some() {
                return Err(Error::invalid("wireType sets more than one kind"));
            }
        }
        out.ok_or_else(|| Error::invalid("empty wireType definition"))
    }

    /// Appends this definition as a `wireType` struct value; `id` is its own type id.
    pub(crate) fn write(&self, id: TypeId, out: &mut Vec<u8>) {
        let (delta, name) = match self {
            WireType::Array { name, .. } => (1, name),
            WireType::Slice { name, .. } => (2, name),
            WireType::Struct { name, .. } => (3, name),
            WireType::Map { name, .. } => (4, name),
            WireType::GobEncoder { name } => (5, name),
            WireType::BinaryMarshaler { name } => (6, name),
            WireType::TextMarshaler { name } => (7, name),
        };
        put_uint(out, delta);
        put_uint(out, 1); // field 0 of every kind: CommonType
        write_common(name, id, out);
        match self {
            WireType::Array { elem, len, .. } => {
                put_uint(out, 1);
                put_int(out, *elem);
                put_uint(out, 1);
                put_int(out, *len);
            }
            WireType::Slice { elem, .. } => {
                put_uint(out, 1);
                put_int(out, *elem);
            }
            WireType::Struct { fields, .. } => {
                if !fields.is_empty() {
                    put_uint(out, 1);
                    put_uint(out, fields.len() as u64);
                    for f in fields {
                        put_uint(out, 1);
                        put_bytes(out, f.name.as_bytes());
                        put_uint(out, 1);
                        put_int(out, f.id);
                        put_uint(out, 0);
                    }
                }
            }
            WireType::Map { key, elem, .. } => {
                put_uint(out, 1);
                put_int(out, *key);
                put_uint(out, 1);
                put_int(out, *elem);
            }
            WireType::GobEncoder { .. }
            | WireType::BinaryMarshaler { .. }
            | WireType::TextMarshaler { .. } => {}
        }
        put_uint(out, 0); // end of the kind struct
        put_uint(out, 0); // end of wireType
    }
}

fn write_common(name: &str, id: TypeId, out: &mut Vec<u8>) {
    if name.is_empty() {
        put_uint(out, 2);
    } else {
        put_uint(out, 1);
        put_bytes(out, name.as_bytes());
        put_uint(out, 1);
    }
    put_int(out, id);
    put_uint(out, 0);
}

fn read_string(r: &mut Reader<'_>) -> Result<String, Error> {
    Ok(String::from_utf8_lossy(r.read_bytes()?).into_owned())
}

/// Reads `CommonType` and then `extra` int fields (elem, key/len) of an array/slice/map/GobEncoder type.
fn read_common_then(r: &mut Reader<'_>, extra: usize) -> Result<(String, Vec<i64>), Error> {
    let mut name = String::new();
    let mut rest = vec![0i64; extra];
    let mut field = -1i64;
    loop {
        let delta = r.read_uint()?;
        if delta == 0 {
            break;
        }
        field += delta as i64;
        match field {
            0 => name = read_common(r)?,
            n if (1..=extra as i64).contains(&n) => rest[(n - 1) as usize] = r.read_int()?,
            n => return Err(Error::invalid(format!("type definition has no field {n}"))),
        }
    }
    Ok((name, rest))
}

fn read_common(r: &mut Reader<'_>) -> Result<String, Error> {
    let mut name = String::new();
    let mut field = -1i64;
    loop {
        let delta = r.read_uint()?;
        if delta == 0 {
            return Ok(name);
        }
        field += delta as i64;
        match field {
            0 => name = read_string(r)?,
            1 => {
                r.read_int()?;
            }
            n => return Err(Error::invalid(format!("CommonType has no field {n}"))),
        }
    }
}

fn read_struct_type(r: &mut Reader<'_>) -> Result<WireType, Error> {
    let mut name = String::new();
    let mut fields = Vec::new();
    let mut field = -1i64;
    loop {
        let delta = r.read_uint()?;
        if delta == 0 {
            break;
        }
        field += delta as i64;
        match field {
            0 => name = read_common(r)?,
            1 => {
                let n = r.read_len()?;
                fields.reserve(n);
                for _ in 0..n {
                    fields.push(read_field_type(r)?);
                }
            }
            n => return Err(Error::invalid(format!("structType has no field {n}"))),
        }
    }
    Ok(WireType::Struct { name, fields })
}

fn read_field_type(r: &mut Reader<'_>) -> Result<FieldType, Error> {
    let mut ft = FieldType {
        name: String::new(),
        id: 0,
    };
    let mut field = -1i64;
    loop {
        let delta = r.read_uint()?;
        if delta == 0 {
            break;
        }
        field += delta as i64;
        match field {
            0 => ft.name = read_string(r)?,
            1 => ft.id = r.read_int()?,
            n => return Err(Error::invalid(format!("fieldType has no field {n}"))),
        }
    }
    if ft.name.is_empty() {
        return Err(Error::invalid("struct field without a name"));
    }
    Ok(ft)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `type Point struct{X, Y int}` from the `encoding/gob` package documentation.
    const POINT_DEF: &[u8] = &[
        0x03, 0x01, 0x01, 0x05, b'P', b'o', b'i', b'n', b't', 0x01, 0xff, 0x82, 0x00, 0x01, 0x02,
        0x01, 0x01, b'X', 0x01, 0x04, 0x00, 0x01, 0x01, b'Y', 0x01, 0x04, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn point_definition_round_trips() {
        let mut r = Reader::new(POINT_DEF, 0, POINT_DEF.len());
        let wt = WireType::read(&mut r).unwrap();
        assert_eq!(
            wt,
            WireType::Struct {
                name: "Point".into(),
                fields: vec![
                    FieldType {
                        name: "X".into(),
                        id: ids::INT
                    },
                    FieldType {
                        name: "Y".into(),
                        id: ids::INT
                    }
                ]
            }
        );
        assert_eq!(r.remaining(), 0);
        let mut out = Vec::new();
        wt.write(65, &mut out);
        assert_eq!(out, POINT_DEF);
    }
}
