//! `bench/run_multi_gpu.sh --dry-run` in CI (issue 22).
//!
//! The multi-GPU bench script is only worth anything if it still runs when a
//! multi-GPU machine finally is there, so its dry run (two CPU servers with
//! `--preset tiny`, workload 8 x 8, the same code path as on GPUs otherwise)
//! runs here against the built binaries: `EMBER_BIN_DIR` is the directory of
//! [`ember_tests::bins::server`] (or a scratch dir of links to the server and
//! `loadgen` when `EMBER_SERVER_BIN` / `EMBER_LOADGEN_BIN` put them apart).
//! The tests read the script's `table.md` like a person would: both rows of
//! the workload with a scaling factor, and one per-target row per server whose
//! requests add up to the workload's. They also check that the script leaves
//! no server behind, on success and when a server fails to start.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ember_tests::bins;

/// The whole dry run takes a few seconds; this only stops a hung script.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);

/// The script's knobs: cleared so that the caller's environment cannot change
/// what the test runs.
const KNOBS: &[&str] = &[
    "DRY_RUN",
    "GPUS",
    "WORKLOADS",
    "PRESET",
    "SERVER_ARGS",
    "LOADGEN_ARGS",
    "WARMUP_RUNS",
    "REPEAT_RUNS",
    "KERNEL_CACHE_ROOT",
    "KERNEL_CACHE_DIR",
    "T_SERVING",
    "T_LOADGEN",
    "EMBER_BIN_DIR",
    "OUT",
];

/// A directory holding both `ember-server` and `loadgen`.
fn bin_dir(scratch: &Path) -> PathBuf {
    let server = bins::server();
    let loadgen = bins::loadgen();
    let dir = server.parent().expect("the server binary has a parent dir");
    if dir.join("loadgen") == loadgen {
        return dir.to_path_buf();
    }
    let links = scratch.join("bin");
    std::fs::create_dir_all(&links).expect("create the links dir");
    std::os::unix::fs::symlink(&server, links.join("ember-server")).expect("link ember-server");
    std::os::unix::fs::symlink(&loadgen, links.join("loadgen")).expect("link loadgen");
    links
}

/// Runs `bash bench/run_multi_gpu.sh --dry-run` with `extra` environment
/// variables; returns its exit status and everything it printed.
fn run_dry(scratch: &Path, out: &Path, extra: &[(&str, &str)]) -> (ExitStatus, String) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let log_path = scratch.join("script.log");
    let log = std::fs::File::create(&log_path).expect("create script.log");
    let mut cmd = Command::new("bash");
    cmd.arg(repo.join("bench/run_multi_gpu.sh"))
        .arg("--dry-run")
        .current_dir(&repo)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone the log handle"))
        .stderr(log);
    for knob in KNOBS {
        cmd.env_remove(knob);
    }
    cmd.env("EMBER_BIN_DIR", bin_dir(scratch))
        .env("OUT", out)
        .envs(extra.iter().copied());
    let mut child = cmd.spawn().expect("spawn bash");
    let deadline = Instant::now() + SCRIPT_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the script") {
            break status;
        }
        if Instant::now() >= deadline {
            // SIGTERM lets the script's trap stop its servers; SIGKILL if not.
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(30));
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "run_multi_gpu.sh --dry-run still running after {SCRIPT_TIMEOUT:?}:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(&log_path).expect("read script.log");
    (status, output)
}

/// The cells of every markdown table row in `table` whose first cell is
/// `first`.
fn rows<'a>(table: &'a str, first: &str) -> Vec<Vec<&'a str>> {
    table
        .lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect::<Vec<_>>()
        })
        .filter(|cells| cells[0] == first)
        .collect()
}

/// A table number such as `1,234` or `56.7` (thousands separators allowed).
fn number(cell: &str) -> f64 {
    cell.replace(',', "")
        .parse()
        .unwrap_or_else(|e| panic!("not a number: {cell:?} ({e})"))
}

/// Completion tok/s of the one measured run in `loadgen-8x8-<mode>.json`.
fn measured_tps(out: &Path, mode: &str) -> f64 {
    let path = out.join(format!("loadgen-8x8-{mode}.json"));
    let text = std::fs::read_to_string(&path).expect("read loadgen's JSON");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("loadgen's JSON parses");
    let runs = doc["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1, "one measured run in {}", path.display());
    runs[0]["throughput_completion_tps"]
        .as_f64()
        .expect("throughput_completion_tps")
}

/// Every server the script announced in `servers.tsv` is gone: its port
/// refuses connections.
fn assert_servers_stopped(out: &Path) {
    let tsv = std::fs::read_to_string(out.join("servers.tsv")).unwrap_or_default();
    for line in tsv.lines() {
        let addr = line
            .split('\t')
            .nth(2)
            .expect("servers.tsv: index, device, address");
        assert!(
            TcpStream::connect(addr).is_err(),
            "server at {addr} still accepts connections after the script ended"
        );
    }
}

/// The dry run exits 0 and its table has the one-target and all-targets rows
/// of 8 x 8 with positive tok/s and a scaling factor, and one per-target row
/// per CPU server whose requests add up to 8 and shares to 100%.
#[test]
fn dry_run_writes_the_scaling_table() {
    let scratch = ember_tests::scratch_dir("bench-multi-gpu");
    let out = scratch.join("out");
    let t0 = Instant::now();
    let (status, output) = run_dry(&scratch, &out, &[]);
    let took = t0.elapsed();
    assert!(status.success(), "the dry run failed ({status}):\n{output}");
    eprintln!("run_multi_gpu.sh --dry-run took {took:.1?}");
    let table = std::fs::read_to_string(out.join("table.md")).expect("table.md written");
    eprintln!("{table}");
    assert!(
        table.contains("DRY RUN"),
        "the table says it is a dry run:\n{table}"
    );
    assert!(
        output.contains(&table),
        "the table is printed too:\n{output}"
    );

    let main = rows(&table, "8 x 8");
    let (summary, per_target): (Vec<_>, Vec<_>) = main.into_iter().partition(|r| r.len() == 6);
    assert_eq!(
        summary.len(),
        2,
        "one-target and all-targets rows:\n{table}"
    );
    assert_eq!(summary[0][1], "1 (first server)", "{table}");
    assert_eq!(summary[1][1], "2 (--balance least)", "{table}");
    for row in &summary {
        assert!(number(row[2]) > 0.0, "tok/s in {row:?}");
        assert!(
            number(row[3]) > 0.0 && number(row[4]) >= number(row[3]),
            "TTFT in {row:?}"
        );
    }
    assert_eq!(summary[0][5], "1.00x", "{table}");
    let scaling = summary[1][5]
        .strip_suffix('x')
        .unwrap_or_else(|| panic!("scaling factor {:?} ends in x", summary[1][5]));
    let scaling = number(scaling);
    let expected = measured_tps(&out, "all") / measured_tps(&out, "one");
    assert!(
        scaling > 0.0 && (scaling - expected).abs() < 0.006,
        "scaling {scaling} = all / one from loadgen's JSON = {expected}"
    );

    assert_eq!(
        per_target.len(),
        2,
        "one per-target row per server:\n{table}"
    );
    let mut requests = 0.0;
    let mut share = 0.0;
    for (i, row) in per_target.iter().enumerate() {
        assert_eq!(row.len(), 8, "{row:?}");
        assert!(
            row[1].starts_with(&format!("cpu#{i} (127.0.0.1:")),
            "{row:?}"
        );
        requests += number(row[2]);
        share += number(row[3].trim_end_matches('%'));
        assert!(number(row[4]) > 0.0, "per-target tok/s in {row:?}");
    }
    assert_eq!(
        requests, 8.0,
        "the per-target requests add up to 8:\n{table}"
    );
    assert!(
        (share - 100.0).abs() < 0.2,
        "shares add up to 100%:\n{table}"
    );

    for file in [
        "loadgen-8x8-one.json",
        "loadgen-8x8-all.json",
        "server-0.log",
        "server-1.log",
    ] {
        assert!(out.join(file).is_file(), "{file} in OUT");
    }
    assert_servers_stopped(&out);
    ember_tests::cleanup_scratch(&scratch);
}

/// A server that cannot start (`--max-batch-size 0`) fails the script with a
/// non-zero status naming it, and no server is left running.
#[test]
fn dry_run_fails_when_a_server_does_not_start() {
    let scratch = ember_tests::scratch_dir("bench-multi-gpu-fail");
    let out = scratch.join("out");
    let (status, output) = run_dry(&scratch, &out, &[("SERVER_ARGS", "--max-batch-size 0")]);
    assert!(!status.success(), "the script must fail:\n{output}");
    assert!(
        output.contains("FAILED: a server did not start") && output.contains("--max-batch-size"),
        "the failure and the server's reason are printed:\n{output}"
    );
    assert!(
        !out.join("table.md").exists(),
        "no table after a failed start"
    );
    assert_servers_stopped(&out);
    ember_tests::cleanup_scratch(&scratch);
}
