//! Placeholder for cubecl-hip 0.11.3, which needs LLVM: see this crate's Cargo.toml.

compile_error!("cubecl-hip is not available in Ember's build: it needs cubecl-llvm, which downloads LLVM at build time");
