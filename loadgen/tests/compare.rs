//! `loadgen compare`: one invocation, the same workload against several
//! targets in turn (the mock's gRPC door, its OpenAI door, and a plain
//! OpenAI server), one report with the targets as series: text table,
//! `--json` `series`, `--requests-out` lines tagged by series, and an HTML
//! page drawing every series.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{assert_well_formed, loadgen, start, u, MockConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_runs_each_series_and_reports_them_side_by_side() {
    let ember = start(MockConfig {
        ttft: Duration::from_millis(20),
        itl: Duration::from_millis(5),
        ..Default::default()
    })
    .await;
    let plain = start(MockConfig {
        ember_fields: false,
        ttft: Duration::from_millis(40),
        itl: Duration::from_millis(5),
        ..Default::default()
    })
    .await;
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("compare-{}", std::process::id()));
    let grpc = format!("name=ember-grpc,target={}", ember.url);
    let http = format!(
        "name=ember-http,backend=openai,base-url={},http=2",
        ember.http_url
    );
    let other = format!("name=plain,backend=openai,base-url={}", plain.http_url);
    let run = loadgen(&[
        "compare",
        "--series",
        &grpc,
        "--series",
        &http,
        "--series",
        &other,
        "--num-requests",
        "6",
        "--max-new-tokens",
        "4",
        "--warmup-runs",
        "1",
        "--report",
        dir.to_str().expect("utf-8"),
    ])
    .await;
    let (to_ember, to_plain) = (
        ember.received.load(Ordering::SeqCst),
        plain.received.load(Ordering::SeqCst),
    );
    ember.stop().await;
    plain.stop().await;
    assert_eq!(run.code(), Some(0), "{}", run.output());
    assert_eq!(
        (to_ember, to_plain),
        (24, 12),
        "two series x (warmup + run) x 6, and one"
    );
    for (k, name) in ["ember-grpc", "ember-http", "plain"].iter().enumerate() {
        assert!(
            run.stdout
                .contains(&format!("### series {}/3: {name}", k + 1)),
            "{}",
            run.stdout
        );
        let row = run
            .stdout
            .lines()
            .skip_while(|l| !l.starts_with("=== compare: 3 series ==="))
            .find(|l| l.starts_with(name) && l.contains(" r0 "))
            .unwrap_or_else(|| panic!("no compare row for {name}: {}", run.stdout));
        assert!(row.contains("6/0"), "{row}");
    }
    // The harness adds --json and --requests-out.
    let json = &run.summary;
    let series = json["series"].as_array().expect("series").clone();
    let names: Vec<&str> = series.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, vec!["ember-grpc", "ember-http", "plain"]);
    for s in &series {
        assert_eq!(u(&s["runs"][0], "ok"), 6, "{s}");
        assert_eq!(s["warmups"].as_array().map(Vec::len), Some(1));
    }
    assert_eq!(u(&series[0]["runs"][0], "server_reported"), 6);
    assert_eq!(
        u(&series[1]["runs"][0], "server_reported"),
        6,
        "Ember's HTTP door reports"
    );
    assert_eq!(
        u(&series[2]["runs"][0], "server_reported"),
        0,
        "a plain server does not"
    );
    assert_eq!(series[1]["backend"], "openai /v1/completions (HTTP/2)");
    assert!(
        json["config"]["series"].is_array(),
        "the specs are in the config"
    );
    for name in ["ember-grpc", "ember-http", "plain"] {
        let tagged = run.requests.iter().filter(|r| r["series"] == name).count();
        assert_eq!(tagged, 12, "{name}: warmup + measured requests");
    }
    let html = std::fs::read_to_string(dir.join("index.html")).expect("report");
    assert_well_formed(&dir.join("index.html"), true);
    for name in ["ember-grpc", "ember-http", "plain"] {
        assert!(html.contains(&format!("<h2>Series {name}</h2>")), "{name}");
        let ttft = std::fs::read_to_string(dir.join("ttft_cdf.svg")).expect("cdf");
        assert!(
            ttft.contains(&format!("{name} r0")),
            "{name} in the CDF legend"
        );
    }
    assert!(dir.join("timeline_0.svg").exists() && dir.join("timeline_2.svg").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_sweeps_every_series_and_draws_them_together() {
    let a = start(MockConfig::default()).await;
    let b = start(MockConfig {
        ttft: Duration::from_millis(15),
        ..Default::default()
    })
    .await;
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("compare-sweep-{}", std::process::id()));
    let run = loadgen(&[
        "compare",
        "--series",
        &format!("name=a,target={}", a.url),
        "--series",
        &format!("name=b,backend=openai,base-url={}", b.http_url),
        "--num-requests",
        "8",
        "--max-new-tokens",
        "2",
        "--sweep-rates",
        "50,100",
        "--slo",
        "ttft=10s",
        "--report",
        dir.to_str().expect("utf-8"),
    ])
    .await;
    a.stop().await;
    b.stop().await;
    assert_eq!(run.code(), Some(0), "{}", run.output());
    let table: Vec<&str> = run
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("=== compare: 2 series ==="))
        .collect();
    for (series, rate) in [
        ("a", "50.00 req/s"),
        ("a", "100.00 req/s"),
        ("b", "50.00 req/s"),
        ("b", "100.00 req/s"),
    ] {
        assert!(
            table
                .iter()
                .any(|l| l.starts_with(series) && l.contains(rate)),
            "{series} at {rate}: {}",
            run.stdout
        );
    }
    assert!(
        table
            .iter()
            .any(|l| l.starts_with("b highest rate meeting the SLO:")),
        "{}",
        run.stdout
    );
    let svg = std::fs::read_to_string(dir.join("sweep_throughput.svg")).expect("sweep chart");
    let texts: Vec<&str> = svg
        .split("</text>")
        .filter_map(|t| t.rsplit_once('>').map(|(_, text)| text.trim()))
        .collect();
    assert!(
        texts.contains(&"a") && texts.contains(&"b"),
        "one line per series: {texts:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_series_fails_before_anything_runs_naming_the_flag() {
    let run = loadgen(&[
        "compare",
        "--series",
        "name=x,backend=openai,target=127.0.0.1:1",
    ])
    .await;
    assert_eq!(run.code(), Some(1), "{}", run.output());
    assert!(
        run.stderr
            .contains("invalid --series: x: --target: does not apply to --backend openai"),
        "{}",
        run.stderr
    );
    let run = loadgen(&["compare", "--series", "name=x,colour=red"]).await;
    assert_eq!(
        run.code(),
        Some(2),
        "clap rejects the spec: {}",
        run.output()
    );
    assert!(
        run.stderr.contains("unknown key `colour`"),
        "{}",
        run.stderr
    );
}
