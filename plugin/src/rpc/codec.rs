//! Go `net/rpc` message headers over gob.
//!
//! A call is a gob `Request{ServiceMethod, Seq}` followed by the argument value; a reply is a gob
//! `Response{ServiceMethod, Seq, Error}` followed by the reply value (an empty struct when `Error`
//! is set). Each direction of a stream has one gob encoder/decoder for its whole life.

use crate::gob_struct;

gob_struct! {
    /// `net/rpc.Request`, the header of every call.
    pub struct Request as "Request" {
        /// `"Service.Method"`
        pub service_method: String => "ServiceMethod",
        /// The caller's sequence number, echoed in the response.
        pub seq: u64 => "Seq",
    }
}

gob_struct! {
    /// `net/rpc.Response`, the header of every reply.
    pub struct Response as "Response" {
        /// `"Service.Method"` of the call
        pub service_method: String => "ServiceMethod",
        /// the call's sequence number
        pub seq: u64 => "Seq",
        /// non-empty when the call failed; the body is then an empty struct
        pub error: String => "Error",
    }
}
