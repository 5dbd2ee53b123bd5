//! `loadgen compare`'s flags: the same workload against several targets in
//! turn, one report with the targets as series (`modes::compare` runs them).
//!
//! ```text
//! loadgen compare \
//!   --series name=ember-grpc,target=127.0.0.1:50051 \
//!   --series name=ember-http,backend=openai,base-url=http://127.0.0.1:8080 \
//!   --series name=vllm,backend=openai,base-url=http://gpu:8000,model=gpt2,http=1 \
//!   --num-requests 200 --arrival poisson --request-rate 20 --report cmp/
//! ```
//!
//! Each `--series` is comma-separated `key=value` pairs: `name` (required,
//! unique) and any connection flag without its dashes: `backend`, `target`
//! and `base-url` (repeatable within a series), `endpoint`, `model`,
//! `api-key`, `tls-ca`, `http`, `channels`, `balance`. Every other flag
//! (workload, schedule, sweep, SLO, warmup/repeat, outputs) is given once and
//! applies to every series; a connection flag given outside `--series` is the
//! default of every series that does not set it. The series run one after
//! another with the same seeds, so they get the same prompts and arrival
//! times. The text report prints each series' run blocks, then one table
//! with a row per series and run; `--json` has a `series` list;
//! `--report DIR` draws every series in the same charts.

use std::collections::HashSet;
use std::path::PathBuf;
use std::str::FromStr;

use clap::Parser;
use serde::Serialize;

use crate::cli::conn::ConnArgs;
use crate::cli::Args;
use crate::config::{Backend, Balance, Endpoint, HttpVersion};
use crate::error::Error;
use crate::modes::compare::{self as runner, SeriesPlan};
use crate::modes::session::Outcome;
use crate::modes::setup::Servers;

/// One `--series` spec: a name and the connection flags it sets.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SeriesSpec {
    /// The series' name in every report.
    pub name: String,
    /// `backend=`.
    pub backend: Option<Backend>,
    /// `target=` (repeatable).
    pub targets: Vec<String>,
    /// `base-url=` (repeatable).
    pub base_urls: Vec<String>,
    /// `endpoint=`.
    pub endpoint: Option<Endpoint>,
    /// `model=`.
    pub model: Option<String>,
    /// `api-key=` (never written out).
    #[serde(skip)]
    pub api_key: Option<String>,
    /// `tls-ca=`.
    pub tls_ca: Option<PathBuf>,
    /// `http=`.
    pub http: Option<HttpVersion>,
    /// `channels=`.
    pub channels: Option<usize>,
    /// `balance=`.
    pub balance: Option<Balance>,
}

/// A clap value of `T` (its ValueEnum names), for one key of a spec.
fn value<T: clap::ValueEnum>(key: &str, v: &str) -> Result<T, String> {
    T::from_str(v, true).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|x| x.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        format!("{key}={v}: expected one of {}", names.join(", "))
    })
}

impl FromStr for SeriesSpec {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let mut s = SeriesSpec::default();
        for pair in spec.split(',').filter(|p| !p.trim().is_empty()) {
            let (key, v) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not key=value"))?;
            let (key, v) = (key.trim(), v.trim());
            match key {
                "name" => s.name = v.to_string(),
                "backend" => s.backend = Some(value(key, v)?),
                "target" => s.targets.push(v.to_string()),
                "base-url" => s.base_urls.push(v.to_string()),
                "endpoint" => s.endpoint = Some(value(key, v)?),
                "model" => s.model = Some(v.to_string()),
                "api-key" => s.api_key = Some(v.to_string()),
                "tls-ca" => s.tls_ca = Some(PathBuf::from(v)),
                "http" => s.http = Some(value(key, v)?),
                "balance" => s.balance = Some(value(key, v)?),
                "channels" => {
                    s.channels = Some(v.parse().map_err(|_| format!("channels={v}: not a count"))?)
                }
                other => {
                    return Err(format!(
                        "unknown key `{other}` (name, backend, target, base-url, endpoint, model, api-key, tls-ca, http, channels, balance)"
                    ))
                }
            }
        }
        if s.name.is_empty() {
            return Err("every series needs name=NAME".into());
        }
        Ok(s)
    }
}

impl SeriesSpec {
    /// The connection flags of this series: the defaults with the spec's
    /// values on top.
    pub fn conn(&self, defaults: &ConnArgs) -> ConnArgs {
        let mut c = defaults.clone();
        c.targets = self.targets.clone();
        c.base_urls = self.base_urls.clone();
        c.backend = self.backend.unwrap_or(c.backend);
        c.endpoint = self.endpoint.unwrap_or(c.endpoint);
        c.http = self.http.unwrap_or(c.http);
        c.channels = self.channels.unwrap_or(c.channels);
        c.balance = self.balance.unwrap_or(c.balance);
        if self.model.is_some() {
            c.model = self.model.clone();
        }
        if self.api_key.is_some() {
            c.api_key = self.api_key.clone();
        }
        if self.tls_ca.is_some() {
            c.tls_ca = self.tls_ca.clone();
        }
        c
    }
}

/// Run the same workload against several targets in turn and report them
/// side by side. Every flag of the plain benchmark applies to all series;
/// see `--series` for what each series sets.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "loadgen compare")]
pub struct CompareArgs {
    /// One series (repeatable, run in order): comma-separated key=value with
    /// name=NAME and the connection flags without dashes, e.g.
    /// `name=grpc,target=host:50051` or
    /// `name=http,backend=openai,base-url=http://host:8080,http=2`. Keys:
    /// name, backend, target, base-url (both repeatable), endpoint, model,
    /// api-key, tls-ca, http, channels, balance.
    #[arg(long = "series", value_name = "SPEC", required = true)]
    pub series: Vec<SeriesSpec>,

    /// The flags every series shares.
    #[command(flatten)]
    #[serde(flatten)]
    pub base: Args,
}

impl CompareArgs {
    /// Each series' settings, validated (the error names the flag, and the
    /// series).
    pub fn per_series(&self) -> Result<Vec<SeriesPlan>, Error> {
        let base = &self.base;
        if base.spawn_server {
            return Err(Error::invalid(
                "--spawn-server",
                "not with compare: start the servers yourself and name them in --series",
            ));
        }
        if !base.conn.targets.is_empty() || !base.conn.base_urls.is_empty() {
            return Err(Error::invalid(
                "--target",
                "with compare, each --series names its own targets (target=... or base-url=...)",
            ));
        }
        // One nonce for every series: they send the same prompts.
        let mut base = base.clone();
        base.shape
            .nonce
            .get_or_insert_with(crate::cli::build::random_nonce);
        let flags = serde_json::to_value(self)?;
        let mut names = HashSet::new();
        let mut out = Vec::with_capacity(self.series.len());
        for spec in &self.series {
            if !names.insert(spec.name.as_str()) {
                return Err(Error::invalid(
                    "--series",
                    format!("two series are named {:?}", spec.name),
                ));
            }
            let mut args = base.clone();
            args.conn = spec.conn(&base.conn);
            let (mut config, servers) = args.validate().map_err(|e| match e {
                Error::InvalidArgument { flag, reason } => {
                    Error::invalid("--series", format!("{}: {flag}: {reason}", spec.name))
                }
                other => other,
            })?;
            config.flags = flags.clone();
            let Servers::Given(urls) = servers else {
                return Err(Error::invalid("--spawn-server", "not with compare"));
            };
            out.push(SeriesPlan {
                name: spec.name.clone(),
                config,
                urls,
            });
        }
        Ok(out)
    }

    /// Validates every series, then runs them in turn.
    pub async fn run(self) -> Result<Outcome, Error> {
        let plan = self.per_series()?;
        let outputs = self.base.outputs();
        runner::run(plan, &outputs, &serde_json::to_value(&self)?).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: &[&str]) -> CompareArgs {
        let mut v = vec!["loadgen compare"];
        v.extend_from_slice(argv);
        CompareArgs::try_parse_from(v).expect("parses")
    }

    #[test]
    fn specs_parse_and_override_the_defaults() {
        let c = parse(&[
            "--series",
            "name=a,target=h:1,target=h:2,balance=least",
            "--series",
            "name=b,backend=openai,base-url=http://h:3,http=2,channels=2,api-key=s",
            "--api-key",
            "shared",
            "--num-requests",
            "4",
        ]);
        let plan = c.per_series().expect("valid");
        let (a, b) = (&plan[0].config, &plan[1].config);
        assert_eq!(plan[0].urls, vec!["http://h:1", "http://h:2"]);
        assert_eq!(
            (a.conn.balance, a.conn.api_key.as_deref()),
            (Balance::Least, Some("shared"))
        );
        assert_eq!(
            (b.conn.backend, b.conn.http, b.conn.channels),
            (Backend::Openai, HttpVersion::Http2, 2)
        );
        assert_eq!(b.conn.api_key.as_deref(), Some("s"));
        assert_eq!(
            (a.arrivals.num_requests, b.arrivals.num_requests),
            (4, 4),
            "shared flags"
        );
        let json = serde_json::to_string(&c).expect("serializes");
        assert!(
            !json.contains("\"s\"") && !json.contains("shared\""),
            "keys never written: {json}"
        );
    }

    #[test]
    fn bad_specs_name_the_flag_and_the_series() {
        let bad = |argv: &[&str]| match parse(argv).per_series() {
            Err(Error::InvalidArgument { flag, reason }) => format!("{flag}: {reason}"),
            other => panic!("{argv:?}: {other:?}"),
        };
        assert!(bad(&[
            "--series",
            "name=a,target=h:1",
            "--series",
            "name=a,target=h:2"
        ])
        .contains("two series"));
        let e = bad(&["--series", "name=x,backend=openai,target=h:1"]);
        assert!(e.starts_with("--series: x: --target"), "{e}");
        assert!(bad(&["--series", "name=a,target=h:1", "--target", "h:9"]).starts_with("--target"));
        assert!(
            CompareArgs::try_parse_from(["loadgen compare", "--series", "target=h:1"]).is_err()
        );
        assert!(
            CompareArgs::try_parse_from(["loadgen compare", "--series", "name=a,colour=red"])
                .is_err()
        );
        assert!(
            CompareArgs::try_parse_from(["loadgen compare", "--series", "name=a,http=3"]).is_err()
        );
        assert!(
            CompareArgs::try_parse_from(["loadgen compare", "--num-requests", "2"]).is_err(),
            "a series is required"
        );
    }
}
