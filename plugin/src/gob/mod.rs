//! Go `encoding/gob`, the subset the go-plugin netrpc protocol needs, as pure bytes-in/bytes-out code.
//!
//! * [`Decoder`]: a per-stream registry of received type definitions; decodes top-level values into
//!   Rust types implementing [`GobDecode`], including interface values whose type definitions span
//!   several messages, and skips whatever the Rust type does not name.
//! * [`Encoder`]: a per-stream set of sent type definitions; encodes [`GobEncode`] values the way
//!   Go's decoder expects (definitions alone in their messages, zero fields omitted).
//! * [`gob_struct!`](crate::gob_struct): declares a Rust struct mirroring a Go struct by field name.

mod decode;
mod encode;
mod time;
mod types;
pub(crate) mod wire;

pub use decode::{Decoder, Empty, GoBytes, GobDecode, Ignored, ValueDecoder, DEFAULT_MAX_MESSAGE};
pub use encode::{encode_field, struct_type, Encoder, GobEncode};
pub use time::GoTime;
pub use types::{ids, FieldType, TypeId, WireType};

/// A gob decoding error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// More bytes are needed; nothing was consumed.
    #[error("incomplete gob stream: more bytes are needed")]
    Incomplete,
    /// A value ran past the end of its message.
    #[error("gob value runs past the end of its message")]
    Truncated,
    /// A message is larger than the decoder accepts.
    #[error("gob message of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// the announced length
        len: u64,
        /// the configured limit
        max: usize,
    },
    /// A value refers to a type id that was never defined on this stream.
    #[error("gob type id {0} is not defined on this stream")]
    UnknownType(TypeId),
    /// The wire type cannot be decoded into the Rust type.
    #[error("gob type mismatch: want {want}, got {got}")]
    Mismatch {
        /// what the Rust side expects
        want: String,
        /// what the stream sent
        got: String,
    },
    /// Anything else that is malformed.
    #[error("invalid gob data: {0}")]
    Invalid(String),
}

impl Error {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::Invalid(msg.into())
    }

    pub(crate) fn mismatch(want: impl Into<String>, got: impl Into<String>) -> Self {
        Error::Mismatch {
            want: want.into(),
            got: got.into(),
        }
    }
}

/// Declares a Rust struct that mirrors a Go struct over gob, matching fields by Go name.
///
/// Fields not listed are skipped when decoding and never sent when encoding. Every field type must
/// implement [`GobDecode`], [`GobEncode`], `Default`, `Debug`, `Clone` and `PartialEq`.
///
/// ```
/// dispatch_plugin::gob_struct! {
///     /// `net/rpc.Request`
///     pub struct Request as "Request" {
///         /// `"Service.Method"`
///         pub service_method: String => "ServiceMethod",
///         /// call sequence number
///         pub seq: u64 => "Seq",
///     }
/// }
/// ```
#[macro_export]
macro_rules! gob_struct {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident as $go_name:literal {
            $( $(#[$fmeta:meta])* $fvis:vis $field:ident : $fty:ty => $go_field:literal ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Default, PartialEq)]
        $vis struct $name {
            $( $(#[$fmeta])* $fvis $field: $fty, )*
        }

        impl $crate::gob::GobDecode for $name {
            const IS_STRUCT: bool = true;
            fn decode(
                d: &mut $crate::gob::ValueDecoder<'_>,
                ty: $crate::gob::TypeId,
            ) -> ::std::result::Result<Self, $crate::gob::Error> {
                let mut out = Self::default();
                d.decode_struct(ty, $go_name, &[$($go_field),*], |d, name, fty| {
                    match name {
                        $( $go_field => {
                            out.$field = $crate::gob::GobDecode::decode(d, fty)?;
                            Ok(true)
                        } )*
                        _ => Ok(false),
                    }
                })?;
                Ok(out)
            }
        }

        impl $crate::gob::GobEncode for $name {
            const IS_STRUCT: bool = true;
            fn gob_type(enc: &mut $crate::gob::Encoder) -> $crate::gob::TypeId {
                enc.define_type::<Self>(|enc| {
                    $crate::gob::struct_type($go_name, vec![
                        $( ($go_field, <$fty as $crate::gob::GobEncode>::gob_type(enc)), )*
                    ])
                })
            }
            #[allow(unused_assignments, unused_mut, unused_variables)]
            fn encode_value(&self, enc: &mut $crate::gob::Encoder, out: &mut Vec<u8>) {
                let mut last = -1i64;
                let mut index = 0i64;
                $(
                    $crate::gob::encode_field(enc, out, &mut last, index, &self.$field);
                    index += 1;
                )*
                out.push(0);
            }
            fn is_zero(&self) -> bool {
                false
            }
        }
    };
}

#[cfg(test)]
mod tests;
