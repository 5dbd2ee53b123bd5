//! Ember's test kit: what the tests of every crate, and loadgen's own
//! calibration, need to start and watch servers. It is a crate of its own so
//! that loadgen's library holds only the load generator, and so that the
//! server's tests, `ember-tests` and loadgen share one copy of each helper.
//!
//! Layout (each file imports only the files listed after it):
//! - [`harness`]: run the `loadgen` binary from a test and read its `--json`
//!   and `--requests-out` files ([`harness::LoadgenRun`]).
//! - [`mock`]: a mock Ember server with known timings, serving the gRPC API
//!   ([`mock::grpc`]) and the OpenAI-compatible HTTP API ([`mock::http`],
//!   Ember's wire contract in docs/http-api.md) on two listeners; `loadgen
//!   mock` serves it on its own and `loadgen calibrate` measures loadgen
//!   against it. [`mock::timeline`] is the one timeline both doors follow.
//! - [`health`]: grpc.health.v1 polling until SERVING, and `GetServerInfo`
//!   polling until a condition (idle) holds.
//! - [`child`]: a child process that prints `listening on ADDR` on its first
//!   stdout line (ember-server, the mock, the delay relay): start, read the
//!   address, SIGTERM, SIGKILL on drop.

pub mod child;
pub mod harness;
pub mod health;
pub mod mock;
