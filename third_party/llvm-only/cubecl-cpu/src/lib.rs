//! Placeholder for cubecl-cpu 0.11.3, which needs LLVM: see this crate's Cargo.toml.

compile_error!("cubecl-cpu is not available in Ember's build: it needs cubecl-llvm, which downloads LLVM at build time");
