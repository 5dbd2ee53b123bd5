//! The front doors' flags, flattened into `cli::Args`: the HTTP door
//! (`--http-listen`), the served model name, TLS and API keys for both doors.
//!
//! [`DoorArgs::validate`] reads and checks the TLS and key files at startup,
//! so a missing or bad one stops the server before anything is loaded, with
//! a message naming the flag. Keys never appear in `--help` (no env value is
//! shown), in `Debug` output of the flags or the config, or in an error.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::auth::{ApiKey, ApiKeys};
use super::tls::TlsIdentity;

/// The front doors' flags.
#[derive(Debug, Clone, clap::Args)]
pub struct DoorArgs {
    /// Also serve the OpenAI-compatible HTTP API (POST /v1/completions and
    /// /v1/chat/completions, GET /v1/models, /health, /version) on this
    /// address, on the same scheduler. Port 0 picks a free port; the bound
    /// address is printed as the second stdout line: `http listening on
    /// <ip:port>`. Off when not given.
    #[arg(long, env = "EMBER_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,

    /// The model's name in the HTTP API (`model` in requests and responses,
    /// GET /v1/models) and in every metric's `model_name` label. Default: the
    /// --model-dir directory's name, else the preset's.
    #[arg(long, env = "EMBER_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,

    /// TLS certificate chain (PEM, leaf first) for both front doors, gRPC and
    /// HTTP. Needs --tls-key.
    #[arg(long, env = "EMBER_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// TLS private key (PEM: PKCS#8, PKCS#1 or SEC1) of --tls-cert.
    #[arg(long, env = "EMBER_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// An API key clients must send: `Authorization: Bearer KEY` on HTTP,
    /// `authorization: Bearer KEY` metadata on gRPC. Repeatable. Health
    /// (grpc.health.v1, GET /health) and GET /version stay open. Keys are
    /// never logged or shown.
    #[arg(
        long = "api-key",
        env = "EMBER_API_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub api_keys: Vec<ApiKey>,

    /// A file of API keys, one per line (blank lines and lines starting with
    /// # are skipped), in addition to --api-key.
    #[arg(long, env = "EMBER_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,
}

/// The front doors, validated.
#[derive(Debug, Clone)]
pub struct DoorConfig {
    /// The OpenAI-compatible HTTP API's address (`--http-listen`), if on.
    pub http_listen: Option<SocketAddr>,
    /// `--served-model-name`, if given.
    pub served_model_name: Option<String>,
    /// TLS on both doors (`--tls-cert`, `--tls-key`), loaded and checked.
    pub tls: Option<TlsIdentity>,
    /// API keys both doors ask for (empty: none asked).
    pub api_keys: ApiKeys,
}

impl DoorArgs {
    /// Checks the flags and reads the TLS and key files; the error names the
    /// flag.
    pub fn validate(&self) -> Result<DoorConfig, String> {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsIdentity::load(cert, key).map_err(|e| e.0)?),
            (Some(_), None) => return Err("--tls-cert needs --tls-key".into()),
            (None, Some(_)) => return Err("--tls-key needs --tls-cert".into()),
            (None, None) => None,
        };
        let api_keys =
            ApiKeys::new(&self.api_keys, self.api_key_file.as_deref()).map_err(|e| e.0)?;
        if let Some(name) = &self.served_model_name {
            if name.trim().is_empty() || name.chars().any(char::is_control) {
                return Err(format!(
                    "--served-model-name must be a non-empty name without control characters, got {name:?}"
                ));
            }
        }
        Ok(DoorConfig {
            http_listen: self.http_listen,
            served_model_name: self.served_model_name.clone(),
            tls,
            api_keys,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{DoorArgs, DoorConfig};

    /// The flags as `cli::Args` flattens them (without importing it).
    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        doors: DoorArgs,
    }

    fn parse(args: &[&str]) -> Result<DoorConfig, String> {
        let mut full = vec!["ember-server"];
        full.extend_from_slice(args);
        match Flags::try_parse_from(full) {
            Ok(f) => f.doors.validate(),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn front_door_flags() {
        let d = parse(&[]).unwrap();
        assert!(d.http_listen.is_none() && d.tls.is_none() && !d.api_keys.enabled());
        let d = parse(&[
            "--http-listen",
            "127.0.0.1:0",
            "--api-key",
            "sk-1",
            "--api-key",
            "sk-2",
            "--served-model-name",
            "gpt2-test",
        ])
        .unwrap();
        assert_eq!(d.http_listen.unwrap().port(), 0);
        assert_eq!(d.api_keys.len(), 2);
        assert_eq!(d.served_model_name.as_deref(), Some("gpt2-test"));
    }

    #[test]
    fn bad_values_name_the_flag_and_never_a_key() {
        for (args, flag) in [
            (
                &["--tls-cert", "/nonexistent/c.pem"][..],
                "--tls-cert needs --tls-key",
            ),
            (
                &["--tls-key", "/nonexistent/k.pem"][..],
                "--tls-key needs --tls-cert",
            ),
            (
                &[
                    "--tls-cert",
                    "/nonexistent/c.pem",
                    "--tls-key",
                    "/nonexistent/k.pem",
                ][..],
                "--tls-cert /nonexistent/c.pem: cannot read",
            ),
            (&["--api-key", "two words"][..], "--api-key (number 1)"),
            (
                &["--api-key-file", "/nonexistent/keys"][..],
                "--api-key-file",
            ),
            (&["--served-model-name", " "][..], "--served-model-name"),
            (&["--http-listen", "nowhere"][..], "--http-listen"),
        ] {
            let err = parse(args).unwrap_err();
            assert!(err.contains(flag), "{args:?}: {err}");
            assert!(!err.contains("two words"), "a key is never shown: {err}");
        }
    }

    #[test]
    fn api_keys_stay_out_of_debug_output() {
        let flags = Flags::try_parse_from(["ember-server", "--api-key", "sk-very-secret"]).unwrap();
        assert!(!format!("{flags:?}").contains("very-secret"));
        let config = flags.doors.validate().unwrap();
        assert!(!format!("{config:?}").contains("very-secret"));
    }
}
