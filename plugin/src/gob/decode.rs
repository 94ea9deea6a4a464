//! The gob decoder: a per-stream type registry plus typed, self-checking value decoding.
//!
//! A gob stream is a sequence of length-prefixed messages. A top-level value is preceded by the
//! definitions of its types (one message each) and, when it holds an interface whose concrete type
//! is new on the stream, its own encoding spans several messages (Go flushes at every type
//! definition, see the protocol notes §5.6). [`Decoder::decode`] therefore works on the buffered
//! stream as a transaction: it either consumes one whole top-level value, or reports
//! [`Error::Incomplete`] and leaves both the buffer and the type registry exactly as they were.
//!
//! Values decode into Rust types through [`GobDecode`]; struct fields are matched by Go name and
//! fields this side does not know are skipped using their wire type, as Go does.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::{Buf, BytesMut};

use super::types::{ids, TypeId, WireType};
use super::wire::{peek_uint, Reader};
use super::Error;

/// How deep values may nest before the decoder gives up (guards the stack against hostile input).
const MAX_DEPTH: usize = 128;

/// The default bound on one gob message; Go's own limit is 1 GiB, ours keeps memory bounded.
pub const DEFAULT_MAX_MESSAGE: usize = 64 << 20;

/// Per-stream decoding state: the type definitions received so far.
#[derive(Debug)]
pub struct Decoder {
    types: HashMap<TypeId, Arc<WireType>>,
    max_message: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    /// A decoder for a fresh stream.
    pub fn new() -> Self {
        Self {
            types: HashMap::new(),
            max_message: DEFAULT_MAX_MESSAGE,
        }
    }

    /// Sets the largest message accepted, in bytes.
    pub fn with_max_message(mut self, max: usize) -> Self {
        self.max_message = max;
        self
    }

    /// The type definitions received so far.
    pub fn types(&self) -> &HashMap<TypeId, Arc<WireType>> {
        &self.types
    }

    /// Decodes the next top-level value from the front of `buf`.
    ///
    /// On success the value's bytes are removed from `buf`. On [`Error::Incomplete`] nothing changes:
    /// call again with more bytes. On any other error the stream up to the end of the message that
    /// failed is consumed (as Go's decoder drops the rest of a bad message) and type definitions
    /// received before the failure are kept.
    pub fn decode<T: GobDecode>(&mut self, buf: &mut BytesMut) -> Result<T, Error> {
        self.transaction(buf, |d| d.top_level::<T>())
    }

    /// Decodes a top-level interface value whose concrete type must be registered as `name`.
    ///
    /// Returns `Ok(Err(actual))` when the interface holds another type (`"nil"` for a nil
    /// interface); that value is skipped.
    pub fn decode_interface<T: GobDecode>(
        &mut self,
        buf: &mut BytesMut,
        name: &str,
    ) -> Result<Result<T, String>, Error> {
        self.transaction(buf, |d| {
            let id = d.value_type_id()?;
            if id != ids::INTERFACE {
                return Err(Error::mismatch("interface", d.describe(id)));
            }
            d.singleton_delta()?;
            d.interface_as::<T>(name)
        })
    }

    /// Reads and discards the next top-level value (its type definitions are still recorded).
    pub fn skip(&mut self, buf: &mut BytesMut) -> Result<(), Error> {
        self.transaction(buf, |d| {
            let id = d.value_type_id()?;
            if !d.is_struct(id) {
                d.singleton_delta()?;
            }
            d.skip(id)
        })
    }

    fn transaction<R>(
        &mut self,
        buf: &mut BytesMut,
        f: impl FnOnce(&mut ValueDecoder<'_>) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let mut d = ValueDecoder {
            types: &mut self.types,
            added: Vec::new(),
            r: Reader::new(buf, 0, 0),
            max_message: self.max_message,
            depth: 0,
        };
        match f(&mut d) {
            Ok(v) => {
                let consumed = d.r.end();
                buf.advance(consumed);
                Ok(v)
            }
            Err(Error::Incomplete) => {
                let added = std::mem::take(&mut d.added);
                for id in added {
                    self.types.remove(&id);
                }
                Err(Error::Incomplete)
            }
            Err(e) => {
                // Drop the message that failed; with a bad length prefix, drop everything buffered.
                let consumed = d.r.end().max(d.r.pos()).min(buf.len());
                let consumed = if matches!(e, Error::TooLarge { .. }) {
                    buf.len()
                } else {
                    consumed
                };
                buf.advance(consumed);
                Err(e)
            }
        }
    }
}

/// Decodes one value from the buffered stream; handed to [`GobDecode::decode`].
#[derive(Debug)]
pub struct ValueDecoder<'a> {
    types: &'a mut HashMap<TypeId, Arc<WireType>>,
    added: Vec<TypeId>,
    r: Reader<'a>,
    max_message: usize,
    depth: usize,
}

/// A Rust type that can be decoded from a gob value.
pub trait GobDecode: Sized {
    /// Whether this type is a Go struct: top-level structs carry no singleton delta byte.
    const IS_STRUCT: bool = false;

    /// Decodes a value whose wire type is `ty`, checking that the two are compatible.
    fn decode(d: &mut ValueDecoder<'_>, ty: TypeId) -> Result<Self, Error>;
}

// === impl ValueDecoder ===

impl<'a> ValueDecoder<'a> {
    /// Moves to the next message of the stream; `Incomplete` if it is not fully buffered.
    fn next_message(&mut self) -> Result<(), Error> {
        let buf = self.r.buf();
        let start = self.r.end();
        let Some((len, prefix)) = peek_uint(buf, start)? else {
            return Err(Error::Incomplete);
        };
        if len == 0 {
            return Err(Error::invalid("empty message"));
        }
        if len > self.max_message as u64 {
            return Err(Error::TooLarge {
                len,
                max: self.max_message,
            });
        }
        let body = start + prefix;
        let end = body + len as usize;
        if buf.len() < end {
            return Err(Error::Incomplete);
        }
        self.r.set_window(body, end);
        Ok(())
    }

    /// Reads type definitions until the id of a value; the value's bytes follow in the same message.
    fn value_type_id(&mut self) -> Result<TypeId, Error> {
        loop {
            self.next_message()?;
            let id = self.r.read_int()?;
            if id >= 0 {
                return Ok(id);
            }
            self.define(-id)?;
            if self.r.remaining() > 0 {
                return Err(Error::invalid(
                    "extra data in buffer after a type definition",
                ));
            }
        }
    }

    fn define(&mut self, id: TypeId) -> Result<(), Error> {
        let wt = WireType::read(&mut self.r)?;
        if id < ids::FIRST_USER || self.types.contains_key(&id) {
            return Err(Error::invalid(format!("duplicate type received: id {id}")));
        }
        self.types.insert(id, Arc::new(wt));
        self.added.push(id);
        Ok(())
    }

    /// Go's `decodeTypeSequence(isInterface=true)`: definitions may continue in later messages.
    fn interface_type_sequence(&mut self) -> Result<TypeId, Error> {
        loop {
            if self.r.remaining() == 0 {
                self.next_message()?;
            }
            let id = self.r.read_int()?;
            if id >= 0 {
                return Ok(id);
            }
            self.define(-id)?;
            if self.r.remaining() > 0 {
                // A delimited value follows in this message: skip its byte count.
                self.r.read_uint()?;
            }
        }
    }

    fn top_level<T: GobDecode>(&mut self) -> Result<T, Error> {
        let id = self.value_type_id()?;
        if !T::IS_STRUCT {
            self.singleton_delta()?;
        }
        T::decode(self, id)
    }

    fn singleton_delta(&mut self) -> Result<(), Error> {
        match self.r.read_uint()? {
            0 => Ok(()),
            d => Err(Error::invalid(format!(
                "non-zero delta {d} for a singleton value"
            ))),
        }
    }

    fn enter(&mut self) -> Result<(), Error> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Error::invalid(format!(
                "values nest deeper than {MAX_DEPTH} levels"
            )));
        }
        Ok(())
    }

    /// The definition of a user type id.
    pub fn wire_type(&self, id: TypeId) -> Result<&WireType, Error> {
        self.types
            .get(&id)
            .map(|wt| &**wt)
            .ok_or(Error::UnknownType(id))
    }

    fn is_struct(&self, id: TypeId) -> bool {
        matches!(
            self.types.get(&id).map(|wt| &**wt),
            Some(WireType::Struct { .. })
        )
    }

    /// A short description of a type id for error messages.
    pub fn describe(&self, id: TypeId) -> String {
        match id {
            ids::BOOL => "bool".into(),
            ids::INT => "int".into(),
            ids::UINT => "uint".into(),
            ids::FLOAT => "float".into(),
            ids::BYTES => "[]byte".into(),
            ids::STRING => "string".into(),
            ids::COMPLEX => "complex".into(),
            ids::INTERFACE => "interface".into(),
            _ => match self.types.get(&id) {
                Some(wt) if wt.name().is_empty() => format!("{} (id {id})", wt.kind()),
                Some(wt) => format!("{} {}", wt.kind(), wt.name()),
                None => format!("undefined type id {id}"),
            },
        }
    }

    fn expect(&self, ty: TypeId, want: TypeId, what: &'static str) -> Result<(), Error> {
        if ty == want {
            Ok(())
        } else {
            Err(Error::mismatch(what, self.describe(ty)))
        }
    }

    /// Reads a `uint` after checking the wire type is `uint`.
    pub fn read_uint(&mut self, ty: TypeId) -> Result<u64, Error> {
        self.expect(ty, ids::UINT, "uint")?;
        self.r.read_uint()
    }

    /// Reads an `int` after checking the wire type is `int`.
    pub fn read_int(&mut self, ty: TypeId) -> Result<i64, Error> {
        self.expect(ty, ids::INT, "int")?;
        self.r.read_int()
    }

    /// Reads a `string` (or `[]byte` into a string) after checking the wire type.
    pub fn read_str(&mut self, ty: TypeId) -> Result<&'a [u8], Error> {
        self.expect(ty, ids::STRING, "string")?;
        self.r.read_bytes()
    }

    /// Reads the bytes of a GobEncoder/BinaryMarshaler/TextMarshaler value.
    pub fn read_marshaled(&mut self, ty: TypeId) -> Result<&'a [u8], Error> {
        match self.wire_type(ty) {
            Ok(WireType::GobEncoder { .. })
            | Ok(WireType::BinaryMarshaler { .. })
            | Ok(WireType::TextMarshaler { .. }) => self.r.read_bytes(),
            _ => Err(Error::mismatch("GobEncoder", self.describe(ty))),
        }
    }

    /// Decodes a struct value of wire type `ty`, field by field.
    ///
    /// `known` lists the Go field names the Rust type has (Go rejects a struct where none match);
    /// `field` is called for each field present in the value and returns `false` for a field it does
    /// not know, which is then skipped.
    pub fn decode_struct(
        &mut self,
        ty: TypeId,
        go_name: &'static str,
        known: &[&str],
        mut field: impl FnMut(&mut Self, &str, TypeId) -> Result<bool, Error>,
    ) -> Result<(), Error> {
        let wt = match self.types.get(&ty) {
            Some(wt) if matches!(**wt, WireType::Struct { .. }) => Arc::clone(wt),
            _ => return Err(Error::mismatch(go_name, self.describe(ty))),
        };
        let WireType::Struct { fields, .. } = &*wt else {
            unreachable!("checked above")
        };
        if !known.is_empty()
            && !fields.is_empty()
            && !fields.iter().any(|f| known.contains(&f.name.as_str()))
        {
            return Err(Error::invalid(format!(
                "type mismatch: no fields matched compiling decoder for {go_name}"
            )));
        }
        self.enter()?;
        let mut index = -1i64;
        loop {
            let delta = self.r.read_uint()?;
            if delta == 0 {
                break;
            }
            index = index.checked_add(delta as i64).unwrap_or(i64::MAX);
            let Some(f) = usize::try_from(index).ok().and_then(|i| fields.get(i)) else {
                return Err(Error::invalid(format!(
                    "field number {index} out of range for {go_name}"
                )));
            };
            if !field(self, &f.name, f.id)? {
                self.skip(f.id)?;
            }
        }
        self.depth -= 1;
        Ok(())
    }

    /// Decodes the elements of a slice value of wire type `ty`.
    pub fn decode_slice<T: GobDecode>(&mut self, ty: TypeId) -> Result<Vec<T>, Error> {
        let elem = match self.types.get(&ty).map(|wt| &**wt) {
            Some(WireType::Slice { elem, .. }) => *elem,
            _ => return Err(Error::mismatch("slice", self.describe(ty))),
        };
        self.enter()?;
        let n = self.r.read_len()?;
        let mut out = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            out.push(T::decode(self, elem)?);
        }
        self.depth -= 1;
        Ok(out)
    }

    /// Decodes the entries of a map value of wire type `ty`.
    pub fn decode_map<K: GobDecode, V: GobDecode>(
        &mut self,
        ty: TypeId,
        mut insert: impl FnMut(K, V),
    ) -> Result<(), Error> {
        let (key, elem) = match self.types.get(&ty).map(|wt| &**wt) {
            Some(WireType::Map { key, elem, .. }) => (*key, *elem),
            _ => return Err(Error::mismatch("map", self.describe(ty))),
        };
        self.enter()?;
        let n = self.r.read_len()?;
        for _ in 0..n {
            let k = K::decode(self, key)?;
            let v = V::decode(self, elem)?;
            insert(k, v);
        }
        self.depth -= 1;
        Ok(())
    }

    /// Decodes an interface value (wire type must be `interface`) expecting concrete type `name`.
    pub fn interface_as<T: GobDecode>(&mut self, name: &str) -> Result<Result<T, String>, Error> {
        let got = self.r.read_bytes()?;
        if got.is_empty() {
            return Ok(Err("nil".into()));
        }
        if got.len() > 1024 {
            return Err(Error::invalid("interface type name longer than 1024 bytes"));
        }
        let concrete = self.interface_type_sequence()?;
        let count = self.r.read_len()?;
        if got != name.as_bytes() {
            self.r.take(count)?;
            return Ok(Err(String::from_utf8_lossy(got).into_owned()));
        }
        let end = self.r.pos() + count;
        if !self.is_struct(concrete) {
            self.singleton_delta()?;
        }
        self.enter()?;
        let v = T::decode(self, concrete)?;
        self.depth -= 1;
        if self.r.pos() != end {
            return Err(Error::invalid(format!(
                "interface value of {name} does not fill its byte count"
            )));
        }
        Ok(Ok(v))
    }

    /// Reads and discards a value of wire type `ty`.
    pub fn skip(&mut self, ty: TypeId) -> Result<(), Error> {
        match ty {
            ids::BOOL | ids::INT | ids::UINT | ids::FLOAT => {
                self.r.read_uint()?;
            }
            ids::COMPLEX => {
                self.r.read_uint()?;
                self.r.read_uint()?;
            }
            ids::BYTES | ids::STRING => {
                self.r.read_bytes()?;
            }
            ids::INTERFACE => {
                let name = self.r.read_bytes()?;
                if !name.is_empty() {
                    self.interface_type_sequence()?;
                    let n = self.r.read_len()?;
                    self.r.take(n)?;
                }
            }
            _ => {
                self.enter()?;
                let wt = Arc::clone(self.types.get(&ty).ok_or(Error::UnknownType(ty))?);
                match &*wt {
                    WireType::Struct { fields, .. } => {
                        let mut index = -1i64;
                        loop {
                            let delta = self.r.read_uint()?;
                            if delta == 0 {
                                break;
                            }
                            index = index.checked_add(delta as i64).unwrap_or(i64::MAX);
                            let Some(fid) = usize::try_from(index)
                                .ok()
                                .and_then(|i| fields.get(i))
                                .map(|f| f.id)
                            else {
                                return Err(Error::invalid(format!(
                                    "field number {index} out of range"
                                )));
                            };
                            self.skip(fid)?;
                        }
                    }
                    WireType::Slice { elem, .. } => {
                        let elem = *elem;
                        let n = self.r.read_len()?;
                        for _ in 0..n {
                            self.skip(elem)?;
                        }
                    }
                    WireType::Array { elem, len, .. } => {
                        let (elem, len) = (*elem, *len);
                        let n = self.r.read_len()?;
                        if n as i64 != len {
                            return Err(Error::invalid(format!(
                                "array length {n} differs from its type's {len}"
                            )));
                        }
                        for _ in 0..n {
                            self.skip(elem)?;
                        }
                    }
                    WireType::Map { key, elem, .. } => {
                        let (key, elem) = (*key, *elem);
                        let n = self.r.read_len()?;
                        for _ in 0..n {
                            self.skip(key)?;
                            self.skip(elem)?;
                        }
                    }
                    WireType::GobEncoder { .. }
                    | WireType::BinaryMarshaler { .. }
                    | WireType::TextMarshaler { .. } => {
                        self.r.read_bytes()?;
                    }
                }
                self.depth -= 1;
            }
        }
        Ok(())
    }
}

// === GobDecode for standard types ===

impl GobDecode for String {
    fn decode(d: &mut ValueDecoder<'_>, ty: TypeId) -> Result<Self, Error> {
        Ok(String::from_utf8_lossy(d.read_str(ty)?).into_owned())
    }
}

impl GobDecode for bool {
    fn decode(d: &mut ValueDecoder<'_>, ty: TypeId) -> Result<Self, Error> {
        d.expect(ty, ids::BOOL, "bool")?;
        match d.r.read_uint()? {
            0 => Ok(false),
            1 => Ok(true),
            n => Err(Error::invalid(format!("invalid bool value {n}"))),
        }
    }
}

impl GobDecode for f64 {
    fn decode(d: &mut ValueDecoder<'_>, ty: TypeId) -> Result<Self, Error> {
        d.expect(ty, ids::FLOAT, "float")?;
        d.r.read_float()
    }
}

macro_rules! decode_ints {
    ($($t:ty => $read:ident),*) => {$(
        impl GobDecode for $t {
            fn decode(d: &mut ValueDecoder<'_>, ty: TypeId) -> Result<Self, Error> {
                let v = d.$read(ty)?;
                <$t>::try_from(v).map_err(|_| Error::invalid(format!("value {v} overflows {}", stringify!($t))))
            }
        }
    )*};
}
decode_ints!(i64 => read_int, i32 => read_int, u64 => read_uint, u32 => read_uint);

/// A Go `[]byte` (also `json.RawMessage`): the predefined bytes type on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoBytes(pub Vec<u8>);

impl GobDecode for GoBytes {
    fn decode(d: &mut ValueDecoder<'_>, ty: TypeId) -> Result<Self, Error> {
        d.expect(ty, ids::BYTES, "[]byte")?;
        Ok(GoBytes(d.r.read_bytes()?.to_vec()))
    }
}

impl<T: GobDecode> GobDecode for Option<T> {
    const IS_STRUCT: bool = T::IS_STRUCT;
    /// Go flattens pointers: a present value is the pointee; a nil pointer is simply not sent.
    fn decode(d: &mut ValueDecoder<'_>, ty: TypeId) -> Result<Self, Error> {
        T::decode(d, ty).map(Some)
    }
}

impl<T: GobDecode> GobDecode for Box<T> {
    const IS_STRUCT: bool = T::IS_STRUCT;
    fn decode(d: &mut ValueDecoder<'_>, ty: TypeId) -> Result<Self, Error> {
        T::decode(d, ty).map(Box::new)
    }
}

impl<T: GobDecode> GobDecode for Vec<T> {
    fn decode(d: &mut ValueDecoder<'_>, ty: TypeId) -> Result<Self, Error> {
        d.decode_slice(ty)
    }
}

impl<K: GobDecode + Ord, V: GobDecode> GobDecode for BTreeMap<K, V> {
    fn decode(d: &mut ValueDecoder<'_>, ty: TypeId) -> Result<Self, Error> {
        let mut m = BTreeMap::new();
        d.decode_map(ty, |k, v| {
            m.insert(k, v);
        })?;
        Ok(m)
    }
}

/// The empty struct `struct{}`: accepts any struct on the wire, like Go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Empty;

impl GobDecode for Empty {
    const IS_STRUCT: bool = true;
    fn decode(d: &mut ValueDecoder<'_>, ty: TypeId) -> Result<Self, Error> {
        d.decode_struct(ty, "struct {}", &[], |_, _, _| Ok(false))?;
        Ok(Empty)
    }
}

/// Skips any value: decode into this when the content does not matter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ignored;

impl GobDecode for Ignored {
    fn decode(d: &mut ValueDecoder<'_>, ty: TypeId) -> Result<Self, Error> {
        d.skip(ty)?;
        Ok(Ignored)
    }
}
