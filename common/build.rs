//! Generates the gRPC code for `proto/ember/v1/inference.proto` with a vendored
//! protoc (no system install) and writes the file descriptor set used by the
//! server's reflection service.
//!
//! Two passes, so that each side decodes with the right codec:
//! - messages and the server (`$OUT_DIR/ember.v1.rs`) with
//!   [`crate::codec::RequestCodec`]: a request that cannot be decoded is the
//!   client's fault, INVALID_ARGUMENT;
//! - the client alone (`$OUT_DIR/client/ember.v1.rs`, messages taken from the
//!   first pass) with tonic's prost codec: a response that cannot be decoded
//!   stays INTERNAL, as the gRPC status-code guide says.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    // Read at run time, not baked in: a target dir shared by two checkouts
    // must not compile one checkout's protos into the other.
    let proto_root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../proto");
    let proto = proto_root.join("ember/v1/inference.proto");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .build_client(false)
        .codec_path("crate::codec::RequestCodec")
        .file_descriptor_set_path(out_dir.join("ember_descriptor.bin"))
        .compile_protos(&[proto.as_path()], &[proto_root.as_path()])?;
    let client_dir = out_dir.join("client");
    std::fs::create_dir_all(&client_dir)?;
    tonic_prost_build::configure()
        .build_server(false)
        .extern_path(".ember.v1", "crate::pb")
        .out_dir(&client_dir)
        .compile_protos(&[proto.as_path()], &[proto_root.as_path()])?;
    println!("cargo:rerun-if-changed={}", proto.display());
    Ok(())
}
