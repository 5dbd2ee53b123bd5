//! `--spawn-server`, end to end, without building ember-server: this test
//! binary is its own child server. Run with `--listen ADDR` (as loadgen runs
//! its child), it serves the mock on ADDR, prints `listening on <addr>` as its
//! first stdout line, reports NOT_SERVING for a moment, then SERVING, and on
//! SIGTERM writes the `--marker` file and exits 0. Run without `--listen` (as
//! `cargo test` runs it), it runs the checks below. Hence `harness = false`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{start_on, MockConfig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--listen") {
        child(&args, &args[i + 1]);
        return;
    }
    let tests: [(&str, fn()); 3] = [
        (
            "spawns_benchmarks_and_stops_the_server",
            spawns_benchmarks_and_stops_the_server,
        ),
        ("child_that_exits_is_reported", child_that_exits_is_reported),
        (
            "child_never_serving_times_out",
            child_never_serving_times_out,
        ),
    ];
    for (name, test) in tests {
        println!("test {name} ...");
        test();
        println!("test {name} ... ok");
    }
}

/// The child server.
fn child(args: &[String], listen: &str) {
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| args[i + 1].clone())
    };
    let marker = flag("--marker").map(PathBuf::from);
    let never_serve = args.iter().any(|a| a == "--never-serve");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        let server = start_on(
            listen,
            MockConfig {
                ttft: Duration::from_millis(20),
                itl: Duration::from_millis(5),
                health_delay: Duration::from_millis(300),
                never_serve,
                ..Default::default()
            },
        )
        .await;
        eprintln!("mock child: model loading... (a stderr line)");
        println!("listening on {}", server.addr);
        term.recv().await;
        if let Some(m) = marker {
            std::fs::write(m, "terminated").expect("marker");
        }
        server.stop().await;
    });
}

fn tmp(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("spawn-{}-{name}", std::process::id()))
}

fn loadgen(args: &[&str]) -> std::process::Output {
    let me = std::env::current_exe().expect("current exe");
    Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .arg("--spawn-server")
        .arg("--server-bin")
        .arg(me)
        .args(args)
        .env("LOADGEN_LOG", "info")
        .output()
        .expect("run loadgen")
}

fn spawns_benchmarks_and_stops_the_server() {
    let marker = tmp("marker");
    let json = tmp("summary.json");
    let _ = std::fs::remove_file(&marker);
    let out = loadgen(&[
        "--num-requests",
        "4",
        "--max-new-tokens",
        "3",
        "--warmup-runs",
        "1",
        "--repeat-runs",
        "2",
        "--json",
        path(&json),
        "--",
        "--marker",
        path(&marker),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(
        stdout.matches("=== streaming benchmark ===").count(),
        2,
        "{stdout}"
    );
    assert!(stdout.contains("mock"), "{stdout}");
    // The child's stderr is forwarded with a prefix.
    assert!(
        stderr.contains("[ember-server] mock child: model loading"),
        "{stderr}"
    );
    // It was stopped with SIGTERM (graceful), not killed.
    assert_eq!(
        std::fs::read_to_string(&marker).ok().as_deref(),
        Some("terminated"),
        "the child did not receive SIGTERM; stderr:\n{stderr}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("valid json");
    assert_eq!(summary["model"], "mock");
    let target = summary["targets"][0].as_str().expect("target");
    assert!(target.starts_with("http://127.0.0.1:"), "{target}");
    assert_eq!(summary["runs"][1]["ok"], 4);
    let _ = std::fs::remove_file(&marker);
    let _ = std::fs::remove_file(&json);
}

fn child_that_exits_is_reported() {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["--spawn-server", "--server-bin", "/bin/false"])
        .output()
        .expect("run loadgen");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("exited before printing its address"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
}

fn child_never_serving_times_out() {
    let marker = tmp("never-marker");
    let out = loadgen(&[
        "--server-start-timeout",
        "1.5",
        "--",
        "--never-serve",
        "--marker",
        path(&marker),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not SERVING within 1.5 s"), "{stderr}");
    assert!(
        stderr.contains("NotServing") || stderr.contains("NOT_SERVING"),
        "{stderr}"
    );
    let _ = std::fs::remove_file(&marker);
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}
