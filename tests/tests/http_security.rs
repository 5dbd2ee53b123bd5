//! TLS and API keys on both front doors, against the built `ember-server`.
//!
//! - `--tls-cert`/`--tls-key` (made here with rcgen: a CA and a certificate
//!   for 127.0.0.1 it signed): a plain-text client is refused by both doors;
//!   clients trusting the CA get health, a gRPC stream and an OpenAI
//!   completion over TLS.
//! - `--api-key` and `--api-key-file`: a missing or wrong key is 401 (HTTP,
//!   OpenAI's error shape) and UNAUTHENTICATED (gRPC); either configured key
//!   passes on either door; health (`grpc.health.v1`, `GET /health`) and
//!   `GET /version` answer without one; no key ever reaches the log or
//!   `--help`.
//! - Bad TLS or key files stop the server at startup, naming the flag.

use std::time::Duration;

use anyhow::{bail, ensure};
use async_openai::types::completions::CreateCompletionRequestArgs;
use ember_common::pb::inference_client::InferenceClient;
use ember_common::pb::GetServerInfoRequest;
use ember_tests::client;
use ember_tests::http::{http_client, install_crypto, HttpServer, TestCa};
use serde_json::{json, Value};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// A gRPC channel to `url`, over TLS trusting `ca` when given.
async fn channel(url: String, ca: Option<String>) -> anyhow::Result<tonic::transport::Channel> {
    let mut endpoint = Endpoint::from_shared(url)?.connect_timeout(Duration::from_secs(5));
    if let Some(pem) = ca {
        install_crypto();
        endpoint = endpoint
            .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))?;
    }
    Ok(endpoint.connect().await?)
}

async fn health(channel: tonic::transport::Channel) -> anyhow::Result<ServingStatus> {
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: ember_common::SERVICE_NAME.into(),
        })
        .await?;
    Ok(ServingStatus::try_from(reply.into_inner().status)?)
}

#[test]
fn tls_on_both_doors_refuses_plain_clients() {
    let dir = ember_tests::scratch_dir("http-tls-certs");
    let ca = TestCa::new(&dir).expect("certificates");
    let server = HttpServer::start("http-tls", &ca.flags(), Some(&ca))
        .unwrap_or_else(|e| panic!("starting the TLS server: {e:#}"));
    let (grpc, http_addr) = (server.grpc_addr(), server.http_addr());
    let (grpc_url, health_url, base) = (server.grpc_url(), server.url("/health"), server.base());
    let ca_pem = ca.ca_pem.clone();
    ember_tests::block_on(None, move || async move {
        // Plain text: both doors refuse.
        let plain = http_client(None)?;
        let r = plain.get(format!("http://{http_addr}/health")).send().await;
        ensure!(r.is_err(), "plain HTTP to the TLS listener answered: {r:?}");
        let plain_grpc = async {
            let ch = channel(format!("http://{grpc}"), None).await?;
            health(ch).await
        };
        let r = tokio::time::timeout(Duration::from_secs(10), plain_grpc).await?;
        ensure!(r.is_err(), "plain gRPC to the TLS listener answered: {r:?}");

        // Trusting the CA: both doors answer.
        let https = http_client(Some(&ca_pem))?;
        let r = https.get(&health_url).send().await?;
        ensure!(r.status() == 200, "/health over TLS: {}", r.status());
        ensure!(
            r.version() == reqwest::Version::HTTP_2,
            "ALPN picks h2: {:?}",
            r.version()
        );
        let ch = channel(grpc_url, Some(ca_pem.clone())).await?;
        ensure!(health(ch.clone()).await? == ServingStatus::Serving);
        let mut c = InferenceClient::new(ch);
        let out = client::generate(&mut c, client::text_request("Over TLS", 4, true), None).await;
        ensure!(
            out.code() == tonic::Code::Ok && out.tokens.len() == 4,
            "{}",
            out.summary()
        );
        let config = async_openai::config::OpenAIConfig::new().with_api_base(base);
        let oa = async_openai::Client::with_config(config).with_http_client(https);
        let req = CreateCompletionRequestArgs::default()
            .model("tiny")
            .prompt("Over TLS")
            .max_tokens(4u32)
            .temperature(0.0)
            .build()?;
        let whole = oa.completions().create(req).await?;
        ensure!(
            !whole.choices.is_empty() && whole.usage.is_some(),
            "{whole:?}"
        );
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr_tail(30)));
    drop(server);
    ember_tests::cleanup_scratch(&dir);
}

#[test]
fn api_keys_guard_both_doors_but_not_health() {
    let dir = ember_tests::scratch_dir("http-keys-file");
    let key_file = dir.join("keys");
    std::fs::write(&key_file, "# keys\nsk-from-file-8c1f\n").expect("key file");
    let extra = [
        "--api-key".to_string(),
        "sk-from-flag-77d2".into(),
        "--api-key-file".into(),
        key_file.display().to_string(),
    ];
    let server = HttpServer::start("http-keys", &extra, None)
        .unwrap_or_else(|e| panic!("starting the server: {e:#}"));
    let grpc = server.grpc_addr();
    let (completions, models) = (server.url("/v1/completions"), server.url("/v1/models"));
    let open = [server.url("/health"), server.url("/version")];
    ember_tests::block_on(None, move || async move {
        let http = http_client(None)?;
        let body = json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0});
        for (auth, want) in [
            (None, 401),
            (Some("Bearer sk-wrong"), 401),
            (Some("Bearer sk-from-flag-77d"), 401),
            (Some("sk-from-flag-77d2"), 401),
            (Some("Bearer sk-from-flag-77d2"), 200),
            (Some("Bearer sk-from-file-8c1f"), 200),
        ] {
            let mut req = http.post(&completions).json(&body);
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            let r = req.send().await?;
            ensure!(r.status() == want, "{auth:?}: {}", r.status());
            if want == 401 {
                ensure!(r.headers()["www-authenticate"] == "Bearer");
                let v: Value = r.json().await?;
                ensure!(v["error"]["code"] == "invalid_api_key", "{v}");
                ensure!(v["error"]["type"] == "invalid_request_error", "{v}");
            }
        }
        ensure!(
            http.get(&models).send().await?.status() == 401,
            "/v1/models needs a key"
        );
        for url in &open {
            let r = http.get(url).send().await?;
            ensure!(r.status() == 200, "{url} without a key: {}", r.status());
        }

        // gRPC: the same keys, as `authorization` metadata.
        let ch = channel(format!("http://{grpc}"), None).await?;
        ensure!(
            health(ch.clone()).await? == ServingStatus::Serving,
            "health needs no key"
        );
        for (auth, want) in [
            (None, tonic::Code::Unauthenticated),
            (Some("Bearer sk-wrong"), tonic::Code::Unauthenticated),
            (Some("Bearer sk-from-flag-77d2"), tonic::Code::Ok),
            (Some("Bearer sk-from-file-8c1f"), tonic::Code::Ok),
        ] {
            let mut c = InferenceClient::new(ch.clone());
            let mut req = tonic::Request::new(client::text_request("Hi", 2, true));
            if let Some(a) = auth {
                req.metadata_mut().insert("authorization", a.parse()?);
            }
            let code = match c.generate(req).await {
                Ok(r) => {
                    let mut s = r.into_inner();
                    while s.message().await?.is_some() {}
                    tonic::Code::Ok
                }
                Err(s) => s.code(),
            };
            ensure!(code == want, "gRPC {auth:?}: {code:?}");
        }
        let mut c = InferenceClient::new(ch);
        match c.get_server_info(GetServerInfoRequest {}).await {
            Err(s) if s.code() == tonic::Code::Unauthenticated => {}
            other => bail!("GetServerInfo without a key: {other:?}"),
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr_tail(30)));
    let log = server.stderr();
    for key in ["sk-from-flag-77d2", "sk-from-file-8c1f", "sk-wrong"] {
        assert!(!log.contains(key), "{key} in the log");
    }
    drop(server);

    // --help shows the flags, never a key set through the environment.
    let help = std::process::Command::new(ember_tests::bins::server())
        .arg("--help")
        .env("EMBER_API_KEY", "sk-env-secret-5e")
        .output()
        .expect("--help");
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.contains("--api-key <KEY>") && text.contains("--api-key-file"),
        "{text}"
    );
    assert!(
        !text.contains("sk-env-secret-5e"),
        "a key in --help:\n{text}"
    );
    ember_tests::cleanup_scratch(&dir);
}

/// Startup fails fast, naming the flag, on a bad TLS or key file.
#[test]
fn bad_tls_and_key_files_stop_startup_naming_the_flag() {
    let dir = ember_tests::scratch_dir("http-bad-files");
    let ca = TestCa::new(&dir).expect("certificates");
    let junk = dir.join("junk.pem");
    std::fs::write(&junk, "not PEM\n").expect("junk");
    let empty_keys = dir.join("empty-keys");
    std::fs::write(&empty_keys, "# nothing\n").expect("keys");
    let path = |p: &std::path::Path| p.display().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--tls-cert".into(),
                path(&dir.join("missing.pem")),
                "--tls-key".into(),
                path(&ca.key_path),
            ],
            "--tls-cert",
        ),
        (
            vec![
                "--tls-cert".into(),
                path(&ca.cert_path),
                "--tls-key".into(),
                path(&junk),
            ],
            "--tls-key",
        ),
        (
            vec![
                "--tls-cert".into(),
                path(&junk),
                "--tls-key".into(),
                path(&ca.key_path),
            ],
            "--tls-cert",
        ),
        (
            vec!["--tls-cert".into(), path(&ca.cert_path)],
            "--tls-cert needs --tls-key",
        ),
        (
            vec!["--api-key-file".into(), path(&empty_keys)],
            "--api-key-file",
        ),
        (vec!["--api-key".into(), "has a space".into()], "--api-key"),
    ];
    for (args, flag) in cases {
        let out = std::process::Command::new(ember_tests::bins::server())
            .args([
                "--preset",
                "tiny",
                "--device",
                "cpu",
                "--listen",
                "127.0.0.1:0",
            ])
            .args(&args)
            .output()
            .expect("run ember-server");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("has a space"),
            "a key in the log: {stderr}"
        );
    }
    ember_tests::cleanup_scratch(&dir);
}
