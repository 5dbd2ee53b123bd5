//! Generates the gRPC code for `proto/ember/v1/inference.proto` with a vendored
//! protoc (no system install) and writes the file descriptor set used by the
//! server's reflection service.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    let proto_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let proto = proto_root.join("ember/v1/inference.proto");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("ember_descriptor.bin"))
        .compile_protos(&[proto.as_path()], &[proto_root.as_path()])?;
    println!("cargo:rerun-if-changed={}", proto.display());
    Ok(())
}
