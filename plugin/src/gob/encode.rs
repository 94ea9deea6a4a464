//! The gob encoder: per-stream type definitions plus value encoding, exactly as Go's decoder wants.
//!
//! Each stream has its own [`Encoder`]; a type's definition is sent once per stream, alone in its
//! own message, before the first value that uses it. Struct fields that hold Go's zero value are
//! omitted (nested structs never are), as Go's encoder does.

use std::any::TypeId as RustTypeId;
use std::collections::{BTreeMap, HashMap};

use super::decode::{Empty, GoBytes};
use super::types::{ids, FieldType, TypeId, WireType};
use super::wire::{put_bytes, put_float, put_int, put_uint};

/// Per-stream encoding state: which types have been defined and with which ids.
#[derive(Debug)]
pub struct Encoder {
    defined: HashMap<RustTypeId, TypeId>,
    next_id: TypeId,
    pending: Vec<(TypeId, WireType)>,
}

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

/// A Rust type that can be encoded as a gob value.
pub trait GobEncode {
    /// Whether this type is a Go struct: top-level structs carry no singleton delta byte.
    const IS_STRUCT: bool = false;

    /// The gob type id of `Self` on this stream, defining it (and the types it uses) if needed.
    fn gob_type(enc: &mut Encoder) -> TypeId;

    /// Appends the value (for a struct: its fields and the terminating zero).
    fn encode_value(&self, enc: &mut Encoder, out: &mut Vec<u8>);

    /// Whether Go would omit this value as a struct field.
    fn is_zero(&self) -> bool;
}

impl Encoder {
    /// An encoder for a fresh stream. Ids start at 65, like Go's first user type.
    pub fn new() -> Self {
        Self {
            defined: HashMap::new(),
            next_id: ids::FIRST_USER + 1,
            pending: Vec::new(),
        }
    }

    /// Returns the id of `T`, allocating one and queueing the definition built by `define` if new.
    ///
    /// The id is recorded before `define` runs, so a type may refer to itself.
    pub fn define_type<T: 'static>(
        &mut self,
        define: impl FnOnce(&mut Self) -> WireType,
    ) -> TypeId {
        let key = RustTypeId::of::<T>();
        if let Some(&id) = self.defined.get(&key) {
            return id;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.defined.insert(key, id);
        let slot = self.pending.len();
        self.pending.push((
            id,
            WireType::Struct {
                name: String::new(),
                fields: Vec::new(),
            },
        ));
        let wt = define(self);
        self.pending[slot] = (id, wt);
        id
    }

    /// Appends `value` as one top-level gob value (type definition messages first) to `out`.
    pub fn encode<T: GobEncode + ?Sized>(&mut self, value: &T, out: &mut Vec<u8>) {
        let id = T::gob_type(self);
        for (def_id, wt) in std::mem::take(&mut self.pending) {
            let mut msg = Vec::with_capacity(64);
            put_int(&mut msg, -def_id);
            wt.write(def_id, &mut msg);
            put_bytes(out, &msg);
        }
        let mut msg = Vec::with_capacity(128);
        put_int(&mut msg, id);
        if !T::IS_STRUCT {
            put_uint(&mut msg, 0);
        }
        value.encode_value(self, &mut msg);
        put_bytes(out, &msg);
    }
}

/// Writes one struct field: its delta from the previous field sent, then the value; zero values
/// are skipped. `last` tracks the previous field number (start at -1).
pub fn encode_field<T: GobEncode>(
    enc: &mut Encoder,
    out: &mut Vec<u8>,
    last: &mut i64,
    index: i64,
    value: &T,
) {
    if value.is_zero() {
        return;
    }
    put_uint(out, (index - *last) as u64);
    *last = index;
    value.encode_value(enc, out);
}

/// Builds a struct definition; used by [`crate::gob_struct!`].
pub fn struct_type(name: &str, fields: Vec<(&str, TypeId)>) -> WireType {
    WireType::Struct {
        name: name.to_string(),
        fields: fields
            .into_iter()
            .map(|(n, id)| FieldType {
                name: n.to_string(),
                id,
            })
            .collect(),
    }
}

// === GobEncode for standard types ===

impl GobEncode for str {
    fn gob_type(_: &mut Encoder) -> TypeId {
        ids::STRING
    }
    fn encode_value(&self, _: &mut Encoder, out: &mut Vec<u8>) {
        put_bytes(out, self.as_bytes());
    }
    fn is_zero(&self) -> bool {
        self.is_empty()
    }
}

impl GobEncode for String {
    fn gob_type(_: &mut Encoder) -> TypeId {
        ids::STRING
    }
    fn encode_value(&self, _: &mut Encoder, out: &mut Vec<u8>) {
        put_bytes(out, self.as_bytes());
    }
    fn is_zero(&self) -> bool {
        self.is_empty()
    }
}

impl GobEncode for bool {
    fn gob_type(_: &mut Encoder) -> TypeId {
        ids::BOOL
    }
    fn encode_value(&self, _: &mut Encoder, out: &mut Vec<u8>) {
        put_uint(out, u64::from(*self));
    }
    fn is_zero(&self) -> bool {
        !*self
    }
}

impl GobEncode for f64 {
    fn gob_type(_: &mut Encoder) -> TypeId {
        ids::FLOAT
    }
    fn encode_value(&self, _: &mut Encoder, out: &mut Vec<u8>) {
        put_float(out, *self);
    }
    fn is_zero(&self) -> bool {
        *self == 0.0
    }
}

macro_rules! encode_ints {
    ($($t:ty => $id:expr, $put:ident, $conv:ty),*) => {$(
        impl GobEncode for $t {
            fn gob_type(_: &mut Encoder) -> TypeId {
                $id
            }
            fn encode_value(&self, _: &mut Encoder, out: &mut Vec<u8>) {
                $put(out, <$conv>::from(*self));
            }
            fn is_zero(&self) -> bool {
                *self == 0
            }
        }
    )*};
}
encode_ints!(i64 => ids::INT, put_int, i64, i32 => ids::INT, put_int, i64,
             u64 => ids::UINT, put_uint, u64, u32 => ids::UINT, put_uint, u64);

impl GobEncode for GoBytes {
    fn gob_type(_: &mut Encoder) -> TypeId {
        ids::BYTES
    }
    fn encode_value(&self, _: &mut Encoder, out: &mut Vec<u8>) {
        put_bytes(out, &self.0);
    }
    fn is_zero(&self) -> bool {
        self.0.is_empty()
    }
}

impl<T: GobEncode> GobEncode for Option<T> {
    const IS_STRUCT: bool = T::IS_STRUCT;
    fn gob_type(enc: &mut Encoder) -> TypeId {
        T::gob_type(enc)
    }
    fn encode_value(&self, enc: &mut Encoder, out: &mut Vec<u8>) {
        if let Some(v) = self {
            v.encode_value(enc, out);
        }
    }
    /// A nil pointer is omitted; a pointer to a zero value is sent (as Go does for GobEncoders).
    fn is_zero(&self) -> bool {
        self.is_none()
    }
}

impl<T: GobEncode> GobEncode for Box<T> {
    const IS_STRUCT: bool = T::IS_STRUCT;
    fn gob_type(enc: &mut Encoder) -> TypeId {
        T::gob_type(enc)
    }
    fn encode_value(&self, enc: &mut Encoder, out: &mut Vec<u8>) {
        (**self).encode_value(enc, out);
    }
    fn is_zero(&self) -> bool {
        (**self).is_zero()
    }
}

impl<T: GobEncode + 'static> GobEncode for Vec<T> {
    fn gob_type(enc: &mut Encoder) -> TypeId {
        enc.define_type::<Self>(|enc| WireType::Slice {
            name: String::new(),
            elem: T::gob_type(enc),
        })
    }
    fn encode_value(&self, enc: &mut Encoder, out: &mut Vec<u8>) {
        put_uint(out, self.len() as u64);
        for v in self {
            v.encode_value(enc, out);
        }
    }
    fn is_zero(&self) -> bool {
        self.is_empty()
    }
}

impl<K: GobEncode + 'static, V: GobEncode + 'static> GobEncode for BTreeMap<K, V> {
    fn gob_type(enc: &mut Encoder) -> TypeId {
        enc.define_type::<Self>(|enc| WireType::Map {
            name: String::new(),
            key: K::gob_type(enc),
            elem: V::gob_type(enc),
        })
    }
    fn encode_value(&self, enc: &mut Encoder, out: &mut Vec<u8>) {
        put_uint(out, self.len() as u64);
        for (k, v) in self {
            k.encode_value(enc, out);
            v.encode_value(enc, out);
        }
    }
    /// Treated like a nil map: an empty map decodes to the same thing on the Go side.
    fn is_zero(&self) -> bool {
        self.is_empty()
    }
}

impl GobEncode for Empty {
    const IS_STRUCT: bool = true;
    fn gob_type(enc: &mut Encoder) -> TypeId {
        enc.define_type::<Self>(|_| struct_type("", Vec::new()))
    }
    fn encode_value(&self, _: &mut Encoder, out: &mut Vec<u8>) {
        put_uint(out, 0);
    }
    fn is_zero(&self) -> bool {
        false
    }
}
