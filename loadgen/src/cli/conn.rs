//! The connection flags: which server(s), through which door, how requests
//! spread over them. One group, so `loadgen compare` can give each series its
//! own values of exactly these flags (see `cli::compare`). Validated, they
//! become a `config::ConnConfig` and the list of target URLs.
//!
//! - `--backend ember` (default): Ember's gRPC API at `--target host:port`;
//! - `--backend openai`: any OpenAI-compatible server at `--base-url URL`,
//!   `--endpoint completions|chat`, `--model`, HTTP/1.1 or HTTP/2 (`--http`).
//!
//! `--extra-inputs key:value` (AIPerf's flag) adds fields to every OpenAI
//! request body (penalties, `response_format`, ...): the value is JSON when
//! it parses as JSON, else a string.
//!
//! Both take `--api-key` (sent as `authorization: Bearer KEY`) and TLS
//! (`https://` targets; `--tls-ca FILE` or the system's roots), and spread
//! requests over several targets round-robin or to the least busy one
//! (`--balance`).

use std::path::PathBuf;

use clap::Args as ClapArgs;
use serde::{Serialize, Serializer};

use crate::config::{Backend, Balance, ConnConfig, Endpoint, HttpVersion};
use crate::error::Error;

/// Where the requests go and how.
#[derive(Debug, Clone, ClapArgs, Serialize)]
pub struct ConnArgs {
    /// ember: Ember's gRPC API at --target; openai: an OpenAI-compatible
    /// HTTP server at --base-url.
    #[arg(long, env = "LOADGEN_BACKEND", value_enum, default_value_t = Backend::Ember)]
    pub backend: Backend,

    /// --backend ember: server to load, `host:port` or `http(s)://host:port`;
    /// repeatable (or comma-separated). Not with --spawn-server.
    #[arg(
        long = "target",
        env = "LOADGEN_TARGET",
        value_delimiter = ',',
        value_name = "URL"
    )]
    pub targets: Vec<String>,

    /// --backend openai: the server's root URL, e.g. http://host:8000
    /// (a trailing /v1 is accepted); repeatable (or comma-separated).
    #[arg(
        long = "base-url",
        env = "LOADGEN_BASE_URL",
        value_delimiter = ',',
        value_name = "URL"
    )]
    pub base_urls: Vec<String>,

    /// --backend openai: completions (/v1/completions) or chat
    /// (/v1/chat/completions).
    #[arg(long, env = "LOADGEN_ENDPOINT", value_enum, default_value_t = Endpoint::Completions)]
    pub endpoint: Endpoint,

    /// --backend openai: the `model` of every request (default: the first
    /// model of GET /v1/models).
    #[arg(long, env = "LOADGEN_MODEL", value_name = "NAME")]
    pub model: Option<String>,

    /// Sent as `authorization: Bearer KEY` (gRPC metadata or HTTP header).
    /// Never written to the outputs.
    #[arg(
        long,
        env = "LOADGEN_API_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    #[serde(serialize_with = "redact")]
    pub api_key: Option<String>,

    /// Trust this CA (PEM) for https:// targets instead of the system's
    /// roots.
    #[arg(long, env = "LOADGEN_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// --backend openai: HTTP version, 1 (HTTP/1.1, a keep-alive connection
    /// per stream in flight) or 2 (HTTP/2, --channels connections).
    #[arg(long, env = "LOADGEN_HTTP", value_enum, default_value_t = HttpVersion::Http1)]
    pub http: HttpVersion,

    /// HTTP/2 connections per target (gRPC, or --http 2); requests spread
    /// over them.
    #[arg(long, env = "LOADGEN_CHANNELS", default_value_t = 1, value_name = "N")]
    pub channels: usize,

    /// Spread requests over several targets: rr (round-robin) or least (the
    /// target with the fewest requests in flight).
    #[arg(long, env = "LOADGEN_BALANCE", value_enum, default_value_t = Balance::Rr)]
    pub balance: Balance,

    /// --backend openai: a field added to every request body, `key:value`
    /// (AIPerf's flag); the value is JSON if it parses (`0.5`, `true`,
    /// `{"type":"json_object"}`), else a string; repeatable; overrides
    /// loadgen's own fields of the same name.
    #[arg(long = "extra-inputs", value_name = "KEY:VALUE", value_parser = parse_extra_input)]
    pub extra_inputs: Vec<(String, serde_json::Value)>,
}

/// One `--extra-inputs` value: `key:value`, the value JSON if it parses.
pub fn parse_extra_input(s: &str) -> Result<(String, serde_json::Value), String> {
    let Some((key, value)) = s.split_once(':') else {
        return Err(format!(
            "{s:?}: expected KEY:VALUE, e.g. frequency_penalty:0.5"
        ));
    };
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("{s:?}: the key is empty"));
    }
    let value = serde_json::from_str(value)
        .unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
    Ok((key.to_string(), value))
}

fn redact<S: Serializer>(key: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match key {
        Some(_) => s.serialize_some("<redacted>"),
        None => s.serialize_none(),
    }
}

/// `host:port` becomes `http://host:port`; a URL with a scheme is kept.
pub fn normalize_target(target: &str) -> String {
    let t = target.trim().trim_end_matches('/');
    if t.contains("://") {
        t.to_string()
    } else {
        format!("http://{t}")
    }
}

impl ConnArgs {
    /// The flag naming the targets of this backend.
    pub fn target_flag(&self) -> &'static str {
        match self.backend {
            Backend::Ember => "--target",
            Backend::Openai => "--base-url",
        }
    }

    /// The targets of the chosen backend, normalized (`http://` added).
    pub fn urls(&self) -> Vec<String> {
        let raw = match self.backend {
            Backend::Ember => &self.targets,
            Backend::Openai => &self.base_urls,
        };
        raw.iter().map(|t| normalize_target(t)).collect()
    }

    /// The settings the layers below read (the targets apart).
    pub fn config(&self) -> ConnConfig {
        ConnConfig {
            backend: self.backend,
            endpoint: self.endpoint,
            model: self.model.clone(),
            api_key: self.api_key.clone(),
            tls_ca: self.tls_ca.clone(),
            http: self.http,
            channels: self.channels,
            balance: self.balance,
            extra_inputs: self.extra_inputs.clone(),
        }
    }

    /// Validates the connection flags. `spawn` is --spawn-server (which
    /// supplies the target itself).
    pub fn validate(&self, spawn: bool) -> Result<(), Error> {
        let flag = self.target_flag();
        let (mine, other, other_flag) = match self.backend {
            Backend::Ember => (&self.targets, &self.base_urls, "--base-url"),
            Backend::Openai => (&self.base_urls, &self.targets, "--target"),
        };
        if !other.is_empty() {
            let name = format!("{:?}", self.backend).to_lowercase();
            return Err(Error::invalid(
                other_flag,
                format!("does not apply to --backend {name}; give the server(s) with {flag}"),
            ));
        }
        if spawn && self.backend == Backend::Openai {
            return Err(Error::invalid(
                "--spawn-server",
                "starts ember-server's gRPC door only; use --backend ember (or run the server yourself and pass --base-url)",
            ));
        }
        if spawn && !mine.is_empty() {
            return Err(Error::invalid(
                flag,
                "cannot be combined with --spawn-server (the spawned server is the target)",
            ));
        }
        if !spawn && mine.is_empty() {
            return Err(Error::invalid(
                flag,
                "at least one is required (or pass --spawn-server)",
            ));
        }
        if mine.iter().any(|t| t.trim().is_empty()) {
            return Err(Error::invalid(flag, "must not be empty"));
        }
        self.validate_options()
    }

    /// The checks that do not need a target list (calibrate's mock is the
    /// target).
    pub fn validate_options(&self) -> Result<(), Error> {
        if self.channels == 0 {
            return Err(Error::invalid("--channels", "must be >= 1 (got 0)"));
        }
        let openai = self.backend == Backend::Openai;
        if openai && self.http == HttpVersion::Http1 && self.channels != 1 {
            return Err(Error::invalid(
                "--channels",
                "HTTP/1.1 carries one stream per connection and opens as many as there are streams in flight; --channels applies to gRPC and --http 2",
            ));
        }
        if !openai && self.model.is_some() {
            return Err(Error::invalid(
                "--model",
                "applies to --backend openai (Ember's gRPC API serves one model)",
            ));
        }
        if !openai && self.http != HttpVersion::Http1 {
            return Err(Error::invalid(
                "--http",
                "applies to --backend openai (gRPC is always HTTP/2)",
            ));
        }
        if !openai && !self.extra_inputs.is_empty() {
            return Err(Error::invalid(
                "--extra-inputs",
                "applies to --backend openai (the gRPC request has typed fields)",
            ));
        }
        if !openai && self.endpoint != Endpoint::Completions {
            return Err(Error::invalid("--endpoint", "applies to --backend openai"));
        }
        if self
            .api_key
            .as_deref()
            .is_some_and(|k| k.is_empty() || k.chars().any(|c| c.is_control() || c == ' '))
        {
            return Err(Error::invalid(
                "--api-key",
                "must be non-empty, without spaces or control characters",
            ));
        }
        if let Some(ca) = &self.tls_ca {
            if let Some(plain) = self.urls().iter().find(|u| u.starts_with("http://")) {
                return Err(Error::invalid(
                    "--tls-ca",
                    format!("{plain} is plain http://; TLS needs https:// targets"),
                ));
            }
            if !ca.is_file() {
                return Err(Error::invalid(
                    "--tls-ca",
                    format!("{} is not a readable file", ca.display()),
                ));
            }
        }
        let bad = self
            .urls()
            .into_iter()
            .find(|u| !(u.starts_with("http://") || u.starts_with("https://")));
        if let Some(u) = bad {
            return Err(Error::invalid(
                self.target_flag(),
                format!("{u}: the scheme must be http:// or https://"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn extra_inputs_are_json_when_they_parse() {
        let cases = [
            ("frequency_penalty:0.5", json!(0.5)),
            ("ignore_eos:true", json!(true)),
            (
                "response_format:{\"type\":\"json_object\"}",
                json!({"type": "json_object"}),
            ),
            ("user:alice", json!("alice")),
            ("stop:a:b", json!("a:b")),
        ];
        for (arg, want) in cases {
            let (_, got) = parse_extra_input(arg).expect(arg);
            assert_eq!(got, want, "{arg}");
        }
        assert!(parse_extra_input("no-colon").is_err());
        assert!(parse_extra_input(":1").is_err());
    }
}
