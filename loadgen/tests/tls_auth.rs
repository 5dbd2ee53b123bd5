//! TLS and API keys on both backends: the mock serves both doors over TLS
//! with a certificate signed by a CA made in the test (rcgen), and requires
//! `authorization: Bearer KEY` on both. loadgen trusts the CA with
//! `--tls-ca`, fails to connect without it (the system's roots do not know
//! it), sends `--api-key` on gRPC and HTTP, and never writes the key out.
//! A server whose own certificate is self-signed and CA:TRUE (what
//! `openssl req -x509` makes) is trusted when that certificate is given with
//! `--tls-ca`, on both backends.

mod common;

use common::{loadgen, self_signed_ca, start, temp_file, u, MockConfig, TlsIdentity};

const KEY: &str = "sk-test-9f2c";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_self_signed_ca_on_both_backends() {
    let (ca, identity) = self_signed_ca();
    let ca_path = temp_file("ca.pem", &ca);
    let ca_s = ca_path.to_str().expect("utf-8");
    let mock = start(MockConfig {
        tls: Some(identity),
        ..Default::default()
    })
    .await;
    assert!(mock.url.starts_with("https://") && mock.http_url.starts_with("https://"));
    // The certificate names localhost and 127.0.0.1: both work.
    let http_localhost = mock.http_url.replace("127.0.0.1", "localhost");
    let cases: Vec<Vec<&str>> = vec![
        vec!["--target", &mock.url],
        vec!["--backend", "openai", "--base-url", &mock.http_url],
        vec![
            "--backend",
            "openai",
            "--base-url",
            &http_localhost,
            "--http",
            "2",
        ],
    ];
    for case in &cases {
        let mut args = case.clone();
        args.extend([
            "--tls-ca",
            ca_s,
            "--num-requests",
            "3",
            "--max-new-tokens",
            "2",
        ]);
        let run = loadgen(&args).await;
        assert_eq!(run.code(), Some(0), "{case:?}: {}", run.output());
        assert_eq!(u(&run.summary["runs"][0], "ok"), 3, "{case:?}");
        // Without the CA: the system's roots do not trust it; fail at connect.
        let mut args = case.clone();
        args.extend(["--num-requests", "1"]);
        let run = loadgen(&args).await;
        assert_eq!(run.code(), Some(1), "{case:?}: {}", run.output());
        assert!(
            run.stderr.contains("cannot connect to https://"),
            "{case:?}: {}",
            run.stderr
        );
        assert!(run.requests.is_empty(), "nothing was sent");
    }
    let plain = loadgen(&["--target", "127.0.0.1:1", "--tls-ca", ca_s]).await;
    assert!(
        plain.stderr.contains("invalid --tls-ca"),
        "{}",
        plain.stderr
    );
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_sent_on_both_backends_and_never_written_out() {
    let mock = start(MockConfig {
        api_key: Some(KEY.into()),
        ..Default::default()
    })
    .await;
    let grpc = ["--target", mock.url.as_str()];
    let http = [
        "--backend",
        "openai",
        "--base-url",
        mock.http_url.as_str(),
        "--model",
        "mock",
    ];
    for base in [&grpc[..], &http[..]] {
        let mut args = base.to_vec();
        args.extend([
            "--api-key",
            KEY,
            "--num-requests",
            "4",
            "--max-new-tokens",
            "2",
        ]);
        let run = loadgen(&args).await;
        assert_eq!(run.code(), Some(0), "{base:?}: {}", run.output());
        assert_eq!(u(&run.summary["runs"][0], "ok"), 4);
        assert_eq!(run.summary["config"]["api_key"], "<redacted>");
        let everything = format!("{}{}{}", run.summary, run.stdout, run.stderr);
        assert!(!everything.contains(KEY), "the key leaked: {base:?}");

        let mut args = base.to_vec();
        args.extend(["--num-requests", "2", "--max-new-tokens", "2"]);
        let run = loadgen(&args).await;
        assert_eq!(run.code(), Some(1), "{base:?}: {}", run.output());
        let want = if base == grpc {
            "UNAUTHENTICATED"
        } else {
            "HTTP_401"
        };
        assert_eq!(u(&run.summary["runs"][0]["errors"], want), 2, "{base:?}");
    }
    // Without --model, GET /v1/models is the first call: a 401 fails fast.
    let run = loadgen(&["--backend", "openai", "--base-url", &mock.http_url]).await;
    assert_eq!(run.code(), Some(1));
    assert!(run.stderr.contains("HTTP 401"), "{}", run.stderr);
    mock.stop().await;
}

/// A server certificate made as `openssl req -x509 -newkey ... -subj
/// /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1` makes
/// it: self-signed and CA:TRUE. rustls alone refuses it as a server's own
/// (`CaUsedAsEndEntity`); curl and Python accept it.
fn openssl_req_x509() -> TlsIdentity {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("certificate");
    TlsIdentity {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_signed_ca_true_server_certificate_given_with_tls_ca_is_trusted() {
    let identity = openssl_req_x509();
    let cert_path = temp_file("openssl-x509.pem", &identity.cert_pem);
    let cert_s = cert_path.to_str().expect("utf-8");
    let mock = start(MockConfig {
        tls: Some(identity),
        ..Default::default()
    })
    .await;
    let cases: Vec<Vec<&str>> = vec![
        vec!["--target", &mock.url],
        vec!["--backend", "openai", "--base-url", &mock.http_url],
        vec![
            "--backend",
            "openai",
            "--base-url",
            &mock.http_url,
            "--http",
            "2",
        ],
    ];
    for case in &cases {
        let mut args = case.clone();
        args.extend([
            "--tls-ca",
            cert_s,
            "--num-requests",
            "2",
            "--max-new-tokens",
            "2",
        ]);
        let run = loadgen(&args).await;
        assert_eq!(run.code(), Some(0), "{case:?}: {}", run.output());
        assert_eq!(u(&run.summary["runs"][0], "ok"), 2, "{case:?}");
    }
    // Another CA's file: refused, and the message says what to do.
    let (other_ca, _) = self_signed_ca();
    let other = temp_file("other-ca.pem", &other_ca);
    let run = loadgen(&[
        "--backend",
        "openai",
        "--base-url",
        &mock.http_url,
        "--tls-ca",
        other.to_str().expect("utf-8"),
        "--num-requests",
        "1",
    ])
    .await;
    assert_eq!(run.code(), Some(1), "{}", run.output());
    assert!(
        run.stderr
            .contains("pass that certificate itself with --tls-ca"),
        "{}",
        run.stderr
    );
    mock.stop().await;
}
