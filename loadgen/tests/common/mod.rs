//! Test support: the mock server (`ember_testkit::mock`, shared with
//! `loadgen calibrate` and the other crates' tests) started for a test, a
//! runner for the `loadgen` binary, and a self-signed CA for TLS tests.
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub use ember_testkit::mock::{MockConfig, MockServer, TlsIdentity};

/// Serves the mock's gRPC door on `addr` (use port 0), its HTTP door on a
/// free port.
pub async fn start_on(addr: &str, cfg: MockConfig) -> MockServer {
    ember_testkit::mock::start_on(addr, "127.0.0.1:0", cfg)
        .await
        .expect("start the mock server")
}

/// Serves the mock on 127.0.0.1 on free ports.
pub async fn start(cfg: MockConfig) -> MockServer {
    start_on("127.0.0.1:0", cfg).await
}

pub use ember_testkit::harness::LoadgenRun;

/// A fresh directory for one run's files.
fn run_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let k = N.fetch_add(1, Ordering::SeqCst);
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("loadgen-{}-{k}", std::process::id()))
}

/// Runs the loadgen binary with `args` plus `--json` and `--requests-out`
/// (blocking the calling thread, so call it from `spawn_blocking`).
pub fn loadgen_blocking(args: &[String]) -> LoadgenRun {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_loadgen"));
    ember_testkit::harness::run(&[], &bin, args, run_dir(), Duration::from_secs(300))
        .expect("run loadgen")
}

/// Runs loadgen from an async test without blocking the mock's runtime.
pub async fn loadgen(args: &[&str]) -> LoadgenRun {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || loadgen_blocking(&args))
        .await
        .expect("loadgen thread")
}

/// A u64 field of a JSON object.
pub fn u(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a u64 in {v}"))
}

/// A f64 field reached by a path of keys.
pub fn f(v: &serde_json::Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for k in path {
        cur = &cur[*k];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number"))
}

/// Percentile (nearest rank) of a non-empty slice.
pub fn pct(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// A self-signed CA and a server certificate it signed for `localhost` and
/// 127.0.0.1: the CA's PEM (for `--tls-ca`) and the server's identity.
pub fn self_signed_ca() -> (String, TlsIdentity) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "loadgen test CA");
    let ca_key = KeyPair::generate().expect("CA key");
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("server params");
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    let leaf_key = KeyPair::generate().expect("server key");
    let leaf_cert = leaf
        .signed_by(&leaf_key, &issuer)
        .expect("server certificate");
    (
        ca_cert.pem(),
        TlsIdentity {
            cert_pem: leaf_cert.pem(),
            key_pem: leaf_key.serialize_pem(),
        },
    )
}

/// Writes `text` to a fresh file for one test and returns its path.
pub fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = run_dir();
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

/// Checks that every tag is closed in order (enough for the SVG and HTML we
/// write: no unquoted `<` in text, void HTML elements listed).
pub fn assert_well_formed(path: &Path, html: bool) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let void = ["meta", "br", "hr", "img", "input", "link"];
    let mut stack: Vec<String> = Vec::new();
    let mut rest = text.as_str();
    while let Some(open) = rest.find('<') {
        let close = rest[open..]
            .find('>')
            .unwrap_or_else(|| panic!("{}: unclosed `<`", path.display()))
            + open;
        let tag = &rest[open + 1..close];
        rest = &rest[close + 1..];
        if tag.starts_with('!') || tag.starts_with('?') || tag.ends_with('/') {
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            let top = stack.pop().unwrap_or_default();
            assert_eq!(
                top,
                name.trim(),
                "{}: </{name}> closes <{top}>",
                path.display()
            );
            continue;
        }
        let name = tag
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        if !(html && void.contains(&name.as_str())) {
            stack.push(name);
        }
    }
    assert!(stack.is_empty(), "{}: unclosed {stack:?}", path.display());
}
