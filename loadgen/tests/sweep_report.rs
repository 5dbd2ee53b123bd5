//! Sweeps, the HTML report and `loadgen calibrate`, against the mock server.
//! The SLO outcomes are forced by objectives the mock always meets (seconds)
//! or can never meet (below its fixed TTFT), so no check depends on speed.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{assert_well_formed, loadgen, start, u, MockConfig};

fn tmp_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("sweep-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_rates_write_one_row_each_and_a_report() {
    let mock = start(MockConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(2),
        ..Default::default()
    })
    .await;
    let dir = tmp_dir("report");
    let dir_s = dir.to_str().expect("utf-8").to_string();
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "10",
        "--max-new-tokens",
        "4",
        "--sweep-rates",
        "50,100",
        "--slo",
        "ttft=10s,e2e=30s",
        "--report",
        &dir_s,
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let sweep = &run.summary["sweep"];
    let rows = sweep["rows"].as_array().expect("rows");
    assert_eq!(
        rows.len(),
        2,
        "every rate met the SLO: nothing to search above"
    );
    assert_eq!(rows[0]["rate_rps"].as_f64(), Some(50.0));
    assert_eq!(rows[1]["stats"]["requested_rate_rps"].as_f64(), Some(100.0));
    assert!(rows
        .iter()
        .all(|r| r["meets_slo"] == true && u(&r["stats"], "ok") == 10));
    assert_eq!(sweep["max_rate_meeting_slo"].as_f64(), Some(100.0));
    assert_eq!(
        sweep["slo_limit_found"], false,
        "no rate missed: the limit is above"
    );
    assert!(
        run.stdout
            .contains("100.00 req/s (the highest rate tried; none missed the SLO)"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("=== sweep: 2 run(s) ===")
            && run.stdout.contains("Highest rate meeting the SLO:"),
        "{}",
        run.stdout
    );
    for name in [
        "ttft_cdf.svg",
        "tpot_cdf.svg",
        "itl_cdf.svg",
        "timeline.svg",
        "sweep_throughput.svg",
        "sweep_latency.svg",
    ] {
        let path = dir.join(name);
        assert_well_formed(&path, false);
        let svg = std::fs::read_to_string(&path).expect("read");
        assert!(
            svg.trim_start().starts_with("<svg") && svg.contains("</svg>"),
            "{name}"
        );
    }
    let index = dir.join("index.html");
    assert_well_formed(&index, true);
    let html = std::fs::read_to_string(&index).expect("read");
    assert_eq!(html.matches("<svg").count(), 6, "every chart inlined");
    for external in ["<script", "<link", "src=\"http", "href=\"http", "url("] {
        assert!(
            !html.contains(external),
            "the page must not fetch anything: {external}"
        );
    }
    assert!(html.contains("Highest rate meeting the SLO") && html.contains("100.00 req/s"));
    mock.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slo_search_bisects_below_a_failing_rate() {
    let mock = start(MockConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(1),
        ..Default::default()
    })
    .await;
    // ttft=1ms is below the mock's 5 ms TTFT: every rate misses.
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "6",
        "--max-new-tokens",
        "2",
        "--sweep-rates",
        "40",
        "--slo",
        "ttft=1ms",
        "--sweep-search-steps",
        "2",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let rows = run.summary["sweep"]["rows"]
        .as_array()
        .expect("rows")
        .clone();
    let rates: Vec<(String, f64)> = rows
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().expect("kind").to_string(),
                r["rate_rps"].as_f64().expect("rate"),
            )
        })
        .collect();
    assert_eq!(
        rates,
        vec![
            ("rate".into(), 40.0),
            ("search".into(), 20.0),
            ("search".into(), 10.0)
        ]
    );
    assert!(rows.iter().all(|r| r["meets_slo"] == false));
    assert!(run.summary["sweep"]["max_rate_meeting_slo"].is_null());
    assert!(
        run.stdout.contains("none of the rates tried"),
        "{}",
        run.stdout
    );
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_auto_runs_baseline_saturation_and_rates_up_to_it() {
    let mock = start(MockConfig {
        ttft: Duration::from_millis(20),
        itl: Duration::from_millis(5),
        ..Default::default()
    })
    .await;
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "8",
        "--max-new-tokens",
        "4",
        "--sweep",
        "auto",
        "--sweep-steps",
        "2",
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let rows = run.summary["sweep"]["rows"]
        .as_array()
        .expect("rows")
        .clone();
    let kinds: Vec<&str> = rows
        .iter()
        .map(|r| r["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(
        kinds,
        vec!["baseline", "saturation", "rate", "rate", "rate"]
    );
    let rps = |r: &serde_json::Value| {
        u(&r["stats"], "ok") as f64 / r["stats"]["wall_s"].as_f64().expect("wall")
    };
    let (lo, hi) = (rps(&rows[0]), rps(&rows[1]));
    // One at a time (each request >= 35 ms) vs all 8 at once.
    assert!(hi > lo, "saturation {hi} <= baseline {lo}");
    let rates: Vec<f64> = rows[2..]
        .iter()
        .map(|r| r["rate_rps"].as_f64().expect("rate"))
        .collect();
    let want = [lo + (hi - lo) / 3.0, lo + 2.0 * (hi - lo) / 3.0, hi];
    assert!(
        rates.len() == 3 && rates.iter().zip(want).all(|(r, w)| (r - w).abs() < 1e-6),
        "{rates:?}, want {want:?}"
    );
    assert_eq!(
        rows[0]["stats"]["max_streams_per_connection"], 1,
        "the baseline is concurrency 1"
    );
    mock.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calibrate_measures_loadgen_against_the_built_in_mock() {
    // gRPC; the OpenAI door over HTTP/1.1; over HTTP/2 with the mock in its
    // own process.
    let cases: [(&[&str], &str); 3] = [
        (&[], "ember (gRPC, HTTP/2)"),
        (
            &["--backend", "openai"],
            "openai /v1/completions (HTTP/1.1)",
        ),
        (
            &["--backend", "openai", "--http", "2", "--mock-process"],
            "openai /v1/completions (HTTP/2)",
        ),
    ];
    for (k, (extra, transport)) in cases.iter().enumerate() {
        let json = tmp_dir(&format!("calibration-{k}.json"));
        let mut args = vec![
            "calibrate",
            "--streams",
            "40",
            "--ttft-ms",
            "30",
            "--itl-ms",
            "10",
            "--tokens",
            "4",
            "--json",
            json.to_str().expect("utf-8"),
        ];
        args.extend_from_slice(extra);
        let run = loadgen(&args).await;
        assert_eq!(run.code(), Some(0), "{extra:?}: {}", run.output());
        assert!(
            run.stdout.contains("=== calibration ===") && run.stdout.contains("TTFT error"),
            "{}",
            run.stdout
        );
        let c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("calibration json"))
                .expect("json");
        assert_eq!(c["transport"], *transport);
        assert_eq!(u(&c, "ok"), 40, "{extra:?}");
        assert_eq!(
            u(&c["itl_error_ms"], "count"),
            40 * 3,
            "{extra:?}: one error per token pair"
        );
        assert_eq!(u(&c["ttft_error_ms"], "count"), 40);
        // Loopback on one machine: loadgen adds well under the mock's 30 ms
        // TTFT (generous for a noisy 2-core box; a clock or unit error, or a
        // client that buffers the stream, would be far off).
        let p50 = c["ttft_error_ms"]["p50"].as_f64().expect("p50");
        assert!(
            (0.0..30.0).contains(&p50),
            "{extra:?}: TTFT error p50 {p50} ms"
        );
        assert!(c["itl_error_ms"]["p50"].as_f64().expect("p50") < 10.0);
        assert_eq!(
            c["pass"].as_bool(),
            Some(
                c["ttft_error_ms"]["p99"].as_f64().expect("p99") < 1.0
                    && c["itl_error_ms"]["p99"].as_f64().expect("p99") < 1.0
            )
        );
        let _ = std::fs::remove_file(json);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_run_report_has_its_runs_table_and_no_sweep_charts() {
    let mock = start(MockConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(1),
        ..Default::default()
    })
    .await;
    let dir = tmp_dir("plain");
    let dir_s = dir.to_str().expect("utf-8").to_string();
    let run = loadgen(&[
        "--target",
        &mock.url,
        "--num-requests",
        "5",
        "--max-new-tokens",
        "3",
        "--repeat-runs",
        "2",
        "--report",
        &dir_s,
    ])
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let index = dir.join("index.html");
    assert_well_formed(&index, true);
    let html = std::fs::read_to_string(&index).expect("read");
    assert!(html.contains("<h2>Runs</h2>") && !html.contains("<h2>Sweep</h2>"));
    assert_eq!(
        html.matches("<tr><td>r").count(),
        2,
        "one row per measured run"
    );
    assert_eq!(html.matches("<svg").count(), 4, "3 CDFs and the timeline");
    assert!(!dir.join("sweep_throughput.svg").exists());
    // The timeline has one bar group per request: 5 decode rectangles.
    let timeline = std::fs::read_to_string(dir.join("timeline.svg")).expect("timeline");
    assert_eq!(
        timeline.matches("fill=\"#3C6EDC\"").count(),
        5 + 1,
        "5 decode bars + the legend swatch"
    );
    mock.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
