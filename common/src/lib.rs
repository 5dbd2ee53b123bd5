//! Ember's shared pieces: the gRPC contract and the GPT-2 tokenizer.
//!
//! Layout:
//! - [`codec`]: the server's protobuf codec (undecodable requests are
//!   INVALID_ARGUMENT, not INTERNAL).
//! - [`pb`]: code generated from `proto/ember/v1/inference.proto` (package
//!   `ember.v1`): messages, the `Inference` client and server.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptor set of that proto, for the
//!   server's gRPC reflection service.
//! - [`tokenizer`]: GPT-2 byte-level BPE (vocabulary embedded in the binary) and
//!   the per-request incremental detokenizer. `loadgen --pretok` uses the same
//!   tokenizer as the server, so client- and server-side token counts agree.

pub mod codec;
pub mod ember_json;
pub mod tokenizer;

/// Generated protobuf messages and gRPC stubs for package `ember.v1`: the
/// messages and server from one pass of `build.rs`, the client from another
/// (each side with its own codec, see [`codec`]).
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("ember.v1");
    include!(concat!(env!("OUT_DIR"), "/client/ember.v1.rs"));
}

/// Encoded `FileDescriptorSet` of `ember.v1`, for `tonic-reflection`.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ember_descriptor");

/// Service name as registered with gRPC health (`grpc.health.v1`).
pub const SERVICE_NAME: &str = "ember.v1.Inference";
