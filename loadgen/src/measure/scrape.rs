//! The server's view during a run: `--scrape-metrics URL` samples a
//! Prometheus endpoint with vLLM's names (which Ember exports too, see
//! docs/metrics.md) and `--gpu-telemetry` the local GPUs (`measure::gpu`),
//! every `--scrape-interval-ms`, from just before the run's first request
//! to just after its last. The samples are the run's time series in
//! `--json` (`server_metrics`) and in the HTML report.
//!
//! Series read (each summed over its label sets; a missing one is null):
//! `vllm:num_requests_running`, `vllm:num_requests_waiting`,
//! `vllm:kv_cache_usage_perc` (older vLLM: `vllm:gpu_cache_usage_perc`),
//! `vllm:num_preemptions_total`, `vllm:prefix_cache_hits_total` and
//! `vllm:prefix_cache_queries_total` (older: `vllm:gpu_prefix_cache_*`). A
//! scrape that fails is counted, not fatal.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use serde::Serialize;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::client::openai::conn::Dialer;
use crate::config::{Backend, Balance, ConnConfig, Endpoint, HttpVersion};
use crate::measure::gpu::{GpuSample, Gpus};

/// What to sample (built by `cli`).
#[derive(Debug, Clone)]
pub struct ScrapeConfig {
    /// `--scrape-metrics`.
    pub url: Option<String>,
    /// `--gpu-telemetry`.
    pub gpu: bool,
    /// `--scrape-interval-ms`.
    pub interval: Duration,
}

/// One sample of the server's gauges and counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MetricSample {
    /// Seconds since the sampler started (just before the run's t0).
    pub t_s: f64,
    /// `vllm:num_requests_running`.
    pub running: Option<f64>,
    /// `vllm:num_requests_waiting`.
    pub waiting: Option<f64>,
    /// `vllm:kv_cache_usage_perc` (0..1).
    pub kv_cache_usage: Option<f64>,
    /// `vllm:num_preemptions_total`.
    pub preemptions: Option<f64>,
    /// `vllm:prefix_cache_hits_total` (tokens).
    pub prefix_cache_hits: Option<f64>,
    /// `vllm:prefix_cache_queries_total` (tokens).
    pub prefix_cache_queries: Option<f64>,
    /// The local GPUs (`--gpu-telemetry`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuSample>,
}

/// A run's samples and what they add up to (the JSON `server_metrics`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerSeries {
    /// The endpoint sampled (null: GPU telemetry only).
    pub url: Option<String>,
    /// In time order.
    pub samples: Vec<MetricSample>,
    /// Scrapes that failed (unreachable, not 200).
    pub failed_scrapes: usize,
    /// Why there is no GPU telemetry, when it was asked for.
    pub gpu_note: Option<String>,
    /// Highest `running`.
    pub max_running: Option<f64>,
    /// Highest `waiting`.
    pub max_waiting: Option<f64>,
    /// Highest KV cache usage (0..1).
    pub max_kv_cache_usage: Option<f64>,
    /// Preemptions during the run (last - first sample).
    pub preemptions: Option<f64>,
    /// Prefix cache hits / queries during the run (token counts' deltas).
    pub prefix_cache_hit_rate: Option<f64>,
    /// Mean utilization of the GPUs over the samples, %.
    pub gpu_util_mean_pct: Option<f64>,
}

/// The value of `name` (any of its spellings) summed over its label sets.
pub fn read_metric(text: &str, names: &[&str]) -> Option<f64> {
    let mut total = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (key, rest) = match line.find(['{', ' ']) {
            Some(i) => (&line[..i], &line[i..]),
            None => continue,
        };
        if !names.contains(&key) {
            continue;
        }
        let value = match rest.strip_prefix('{') {
            Some(r) => r.rsplit_once('}').map(|(_, v)| v),
            None => Some(rest),
        };
        let v = value
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok());
        if let Some(v) = v.filter(|v| v.is_finite()) {
            *total.get_or_insert(0.0) += v;
        }
    }
    total
}

/// A sample of `text` taken at `t_s`.
pub fn parse_sample(text: &str, t_s: f64) -> MetricSample {
    MetricSample {
        t_s,
        running: read_metric(text, &["vllm:num_requests_running"]),
        waiting: read_metric(text, &["vllm:num_requests_waiting"]),
        kv_cache_usage: read_metric(
            text,
            &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
        ),
        preemptions: read_metric(
            text,
            &["vllm:num_preemptions_total", "vllm:num_preemptions"],
        ),
        prefix_cache_hits: read_metric(
            text,
            &[
                "vllm:prefix_cache_hits_total",
                "vllm:prefix_cache_hits",
                "vllm:gpu_prefix_cache_hits_total",
            ],
        ),
        prefix_cache_queries: read_metric(
            text,
            &[
                "vllm:prefix_cache_queries_total",
                "vllm:prefix_cache_queries",
                "vllm:gpu_prefix_cache_queries_total",
            ],
        ),
        gpus: Vec::new(),
    }
}

impl ServerSeries {
    /// The summary of `samples`.
    pub fn of(
        url: Option<String>,
        samples: Vec<MetricSample>,
        failed: usize,
        gpu_note: Option<String>,
    ) -> ServerSeries {
        let max = |f: fn(&MetricSample) -> Option<f64>| {
            samples
                .iter()
                .filter_map(f)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
        };
        let delta = |f: fn(&MetricSample) -> Option<f64>| {
            let first = samples.iter().find_map(f)?;
            let last = samples.iter().rev().find_map(f)?;
            Some(last - first)
        };
        let queries = delta(|s| s.prefix_cache_queries);
        let hits = delta(|s| s.prefix_cache_hits);
        let utils: Vec<f64> = samples
            .iter()
            .flat_map(|s| s.gpus.iter().filter_map(|g| g.util_pct.map(f64::from)))
            .collect();
        ServerSeries {
            max_running: max(|s| s.running),
            max_waiting: max(|s| s.waiting),
            max_kv_cache_usage: max(|s| s.kv_cache_usage),
            preemptions: delta(|s| s.preemptions),
            prefix_cache_hit_rate: match (hits, queries) {
                (Some(h), Some(q)) if q > 0.0 => Some(h / q),
                _ => None,
            },
            gpu_util_mean_pct: (!utils.is_empty())
                .then(|| utils.iter().sum::<f64>() / utils.len() as f64),
            url,
            samples,
            failed_scrapes: failed,
            gpu_note,
        }
    }
}

/// A running sampler; [`finish`](Sampler::finish) stops it and returns the
/// series.
#[derive(Debug)]
pub struct Sampler {
    /// Stops the loop.
    stop: Option<oneshot::Sender<()>>,
    /// The loop.
    join: JoinHandle<ServerSeries>,
}

impl Sampler {
    /// Starts sampling, if anything is to be sampled, and returns once the
    /// first sample is taken (so it comes before the run's first request).
    pub async fn start(cfg: &ScrapeConfig) -> Option<Sampler> {
        if cfg.url.is_none() && !cfg.gpu {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        let (first_tx, first_rx) = oneshot::channel();
        let join = tokio::spawn(sample_loop(cfg.clone(), rx, first_tx));
        // The loop's own scrape timeouts bound this wait.
        let _ = first_rx.await;
        Some(Sampler {
            stop: Some(tx),
            join,
        })
    }

    /// Takes one last sample, stops, and returns the series.
    pub async fn finish(mut self) -> ServerSeries {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.join.await.unwrap_or_default()
    }
}

/// Scrapes every interval until stopped (and once more then).
async fn sample_loop(
    cfg: ScrapeConfig,
    mut stop: oneshot::Receiver<()>,
    first: oneshot::Sender<()>,
) -> ServerSeries {
    let mut first = Some(first);
    let start = Instant::now();
    let gpus = if cfg.gpu {
        tokio::task::spawn_blocking(Gpus::open)
            .await
            .unwrap_or_else(|e| Err(e.to_string()))
    } else {
        Err(String::new())
    };
    let gpus = gpus.map(Arc::new);
    let dialer = cfg.url.as_deref().map(metrics_dialer);
    let (mut samples, mut failed) = (Vec::new(), 0);
    let mut timer = tokio::time::interval(cfg.interval);
    loop {
        let last = tokio::select! {
            _ = &mut stop => true,
            _ = timer.tick() => false,
        };
        let t_s = start.elapsed().as_secs_f64();
        let mut sample = match (&dialer, &cfg.url) {
            (Some(Ok(d)), Some(url)) => match scrape(d, url).await {
                Ok(text) => parse_sample(&text, t_s),
                Err(e) => {
                    failed += 1;
                    tracing::debug!(error = %e, "scrape failed");
                    MetricSample {
                        t_s,
                        ..Default::default()
                    }
                }
            },
            _ => MetricSample {
                t_s,
                ..Default::default()
            },
        };
        if let Ok(g) = &gpus {
            let g = g.clone();
            sample.gpus = tokio::task::spawn_blocking(move || g.sample())
                .await
                .unwrap_or_default();
        }
        samples.push(sample);
        if let Some(tx) = first.take() {
            let _ = tx.send(());
        }
        if last {
            break;
        }
    }
    if let Some(Err(e)) = &dialer {
        tracing::warn!(error = %e, "--scrape-metrics: bad URL");
    }
    let note = match (&gpus, cfg.gpu) {
        (Err(e), true) => Some(e.clone()),
        _ => None,
    };
    ServerSeries::of(cfg.url.clone(), samples, failed, note)
}

/// An HTTP/1.1 dialer for the metrics URL.
fn metrics_dialer(url: &str) -> Result<Dialer, String> {
    let conn = ConnConfig {
        backend: Backend::Openai,
        endpoint: Endpoint::Completions,
        model: None,
        api_key: None,
        tls_ca: None,
        http: HttpVersion::Http1,
        channels: 1,
        balance: Balance::Rr,
        extra_inputs: Vec::new(),
    };
    Dialer::new(url, &conn).map_err(|e| e.to_string())
}

/// One GET of the metrics page (a fresh connection each time: a sample per
/// interval does not need keep-alive).
async fn scrape(dialer: &Dialer, url: &str) -> Result<String, String> {
    let path = url
        .split_once("://")
        .and_then(|(_, rest)| rest.find('/').map(|i| rest[i..].to_string()))
        .unwrap_or_else(|| "/metrics".to_string());
    let mut sender = dialer.http1().await?;
    let req = Request::get(dialer.uri(&path))
        .header(hyper::header::HOST, &dialer.authority)
        .body(Full::new(hyper::body::Bytes::new()))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(5), sender.send_request(req))
        .await
        .map_err(|_| "no answer within 5 s".to_string())?
        .map_err(|e| e.to_string())?;
    if resp.status() != StatusCode::OK {
        return Err(format!("HTTP {}", resp.status()));
    }
    let body = tokio::time::timeout(Duration::from_secs(5), resp.into_body().collect())
        .await
        .map_err(|_| "no body within 5 s".to_string())?
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# HELP vllm:num_requests_running x\n\
# TYPE vllm:num_requests_running gauge\n\
vllm:num_requests_running{model_name=\"gpt2\"} 56\n\
vllm:num_requests_waiting{model_name=\"gpt2\"} 200\n\
vllm:kv_cache_usage_perc{model_name=\"gpt2\",engine=\"0\"} 0.5\n\
vllm:kv_cache_usage_perc{model_name=\"gpt2\",engine=\"1\"} 0.25\n\
vllm:prefix_cache_queries_total{model_name=\"gpt2\"} 1000\n\
vllm:prefix_cache_hits_total{model_name=\"gpt2\"} 250 1700000000\n\
vllm:num_requests_running_extra 3\n";

    #[test]
    fn reads_vllm_names_summed_over_labels() {
        let s = parse_sample(PAGE, 1.5);
        assert_eq!(s.running, Some(56.0), "the _extra series is another name");
        assert_eq!(s.waiting, Some(200.0));
        assert_eq!(s.kv_cache_usage, Some(0.75));
        assert_eq!(
            (s.prefix_cache_queries, s.prefix_cache_hits),
            (Some(1000.0), Some(250.0))
        );
        assert_eq!(s.preemptions, None, "not exported");
        assert_eq!(
            read_metric(
                "vllm:gpu_cache_usage_perc 0.1\n",
                &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]
            ),
            Some(0.1)
        );
    }

    #[test]
    fn the_summary_takes_maxima_and_deltas() {
        let at = |t: f64, q: f64, h: f64, run: f64| MetricSample {
            t_s: t,
            running: Some(run),
            prefix_cache_queries: Some(q),
            prefix_cache_hits: Some(h),
            ..Default::default()
        };
        let s = ServerSeries::of(
            None,
            vec![
                at(0.0, 100.0, 10.0, 1.0),
                at(1.0, 300.0, 110.0, 9.0),
                at(2.0, 500.0, 210.0, 4.0),
            ],
            0,
            None,
        );
        assert_eq!(s.max_running, Some(9.0));
        assert_eq!(
            s.prefix_cache_hit_rate,
            Some(0.5),
            "200 hits of 400 queried during the run"
        );
        assert_eq!(s.max_waiting, None);
    }
}
