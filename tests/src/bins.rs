//! Locating the binaries under test.
//!
//! A test crate cannot use `CARGO_BIN_EXE_*` for another package's binaries,
//! so they are found next to the test executable: `current_exe()` is
//! `target/<profile>/deps/<test>-<hash>`, the binaries are in
//! `target/<profile>/`. Build them first (`cargo build --workspace`), or point
//! `EMBER_SERVER_BIN` / `EMBER_LOADGEN_BIN` / `EMBER_ENGINE_BENCH_BIN` at them.

use std::path::PathBuf;

/// `ember-server`: `$EMBER_SERVER_BIN`, else `target/<profile>/ember-server`.
pub fn server() -> PathBuf {
    locate("EMBER_SERVER_BIN", "ember-server")
}

/// `loadgen`: `$EMBER_LOADGEN_BIN`, else `target/<profile>/loadgen`.
pub fn loadgen() -> PathBuf {
    locate("EMBER_LOADGEN_BIN", "loadgen")
}

/// `ember-engine-bench`: `$EMBER_ENGINE_BENCH_BIN`, else
/// `target/<profile>/ember-engine-bench`.
pub fn engine_bench() -> PathBuf {
    locate("EMBER_ENGINE_BENCH_BIN", "ember-engine-bench")
}

/// `delay_relay` (this crate's own binary): `$EMBER_RELAY_BIN`, else
/// `target/<profile>/delay_relay`. Integration tests of this crate can also use
/// `env!("CARGO_BIN_EXE_delay_relay")`, which cargo guarantees is built.
pub fn relay() -> PathBuf {
    locate("EMBER_RELAY_BIN", "delay_relay")
}

fn locate(env: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "{env}={} does not exist", p.display());
        return p;
    }
    let exe = std::env::current_exe().expect("current_exe");
    // deps/<test> -> deps -> <profile>
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("test exe has no grandparent dir");
    let candidates = [dir.join(name), exe.parent().unwrap().join(name)];
    for c in &candidates {
        if c.is_file() {
            return c.clone();
        }
    }
    panic!(
        "{name} not found (looked at {:?}). Build the binaries first: \
         `cargo build --workspace` (same profile as the tests), or set {env}.",
        candidates
    );
}
