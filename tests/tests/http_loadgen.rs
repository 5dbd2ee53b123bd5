//! `loadgen` against Ember's two front doors in one invocation: `loadgen
//! compare` with a gRPC series and an OpenAI-HTTP series (`--backend
//! openai`, SSE) at the same server, the same seeded workload on each.
//!
//! Both series must complete every request with the same token counts, and
//! the HTTP series must carry the server's breakdown (Ember's `ember_timing`
//! extension) and usage-based token counts, so its client-vs-server
//! reconciliation is as complete as gRPC's. The figures themselves (client
//! overhead per door) are measured by `bench/` runs, not asserted here.

use std::time::Duration;

use anyhow::{ensure, Context};
use ember_tests::bins;
use ember_tests::http::HttpServer;
use serde_json::Value;

const REQUESTS: usize = 12;
const TOKENS: u64 = 8;

fn series<'a>(summary: &'a Value, name: &str) -> anyhow::Result<&'a Value> {
    summary["series"]
        .as_array()
        .context("no series array")?
        .iter()
        .find(|s| s["name"] == name)
        .with_context(|| format!("no series {name} in {summary}"))
}

/// The request records of one series (`--requests-out` lines tagged `series`).
fn records<'a>(all: &'a [Value], name: &str) -> Vec<&'a Value> {
    all.iter()
        .filter(|r| r["series"] == name && r["warmup"] != true)
        .collect()
}

#[test]
fn compare_grpc_and_http_doors_of_one_server() -> anyhow::Result<()> {
    let server = HttpServer::tiny("lg-doors", &[]);
    let args: Vec<String> = [
        "compare",
        "--series",
        &format!("name=grpc,target={}", server.grpc_addr()),
        "--series",
        &format!("name=http,backend=openai,base-url={}", server.base()),
        "--num-requests",
        &REQUESTS.to_string(),
        "--max-new-tokens",
        &TOKENS.to_string(),
        "--no-stop-on-eos",
        "--submit-interval-ms",
        "5",
        "--seed",
        "7",
    ]
    .map(String::from)
    .to_vec();
    let dir = ember_tests::scratch_dir("lg-doors");
    let run =
        ember_testkit::harness::run(&[], &bins::loadgen(), &args, dir, Duration::from_secs(120))?;
    ensure!(
        run.code() == Some(0),
        "loadgen compare failed:\n{}",
        run.output()
    );

    for name in ["grpc", "http"] {
        let s = series(&run.summary, name)?;
        let recs = records(&run.requests, name);
        ensure!(
            recs.len() == REQUESTS,
            "{name}: {} records\n{}",
            recs.len(),
            run.output()
        );
        for r in &recs {
            ensure!(r["ok"] == true, "{name}: failed request {r}");
            ensure!(
                r["completion_tokens"].as_u64() == Some(TOKENS),
                "{name}: token count in {r}"
            );
            ensure!(!r["server"].is_null(), "{name}: no server breakdown in {r}");
            let from = if name == "grpc" { "server" } else { "usage" };
            ensure!(r["tokens_from"] == from, "{name}: tokens_from in {r}");
        }
        ensure!(
            !s["runs"].as_array().is_none_or(Vec::is_empty),
            "{name}: no runs in {s}"
        );
    }
    let text = run.output();
    ensure!(
        text.contains("=== compare: 2 series"),
        "no compare table:\n{text}"
    );
    ensure!(
        !text.contains("not reported by this server"),
        "Ember's HTTP door lost its server breakdown:\n{text}"
    );
    Ok(())
}
