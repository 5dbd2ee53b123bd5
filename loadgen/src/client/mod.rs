//! The client side of a request, one module per backend: [`grpc`] (Ember's
//! gRPC API) and [`openai`] (any OpenAI-compatible HTTP server, Ember's
//! extension read when present). [`pool`] holds the connections of every
//! target and picks one per request (`--balance`); [`call`] sends a request
//! on the connection it was given; [`tls`] builds the TLS settings both
//! backends use.
//!
//! Every backend turns a `workload::PreparedRequest` into a
//! `record::RequestRecord` with the same client timestamps, so everything
//! above this layer (statistics, reports, sweeps) is backend-blind.

pub mod call;
pub mod grpc;
pub mod openai;
pub mod pool;
pub mod tls;
