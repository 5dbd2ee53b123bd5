//! `bench/run_multi_gpu.sh --dry-run` in CI (issues 22 and 40).
//!
//! The multi-GPU bench script is only worth anything if it still runs when a
//! multi-GPU machine finally is there, so its dry run (two CPU servers with
//! `--preset tiny`, workload 8 x 8, greedy and temperature 1.0, the same code
//! path as on GPUs otherwise) runs here against the built binaries:
//! `EMBER_BIN_DIR` is the directory of [`ember_tests::bins::server`] (or a
//! scratch dir of links to the server and `loadgen` when `EMBER_SERVER_BIN` /
//! `EMBER_LOADGEN_BIN` put them apart). So does `--dry-run --mock` (two
//! `loadgen mock` servers). The tests read the script's `table.md` like a
//! person would: the weak scaling rows at one and two servers, both loadgen
//! modes, whose tok/s and factors they recompute from loadgen's JSON, and
//! one per-server row per server whose requests add up to the run's. They
//! also check that the script leaves no server behind, on success and when a
//! server fails to start.

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
    "SAMPLINGS",
    "SCALES",
    "LOADGEN_MODE",
    "STRONG",
    "START_DELAY",
    "SERVERS",
    "MOCK_TTFT_MS",
    "MOCK_ITL_MS",
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

/// Runs `bash bench/run_multi_gpu.sh --dry-run ARGS` with `extra`
/// environment variables; returns its exit status and everything it
/// printed.
fn run_dry(
    scratch: &Path,
    out: &Path,
    extra: &[(&str, &str)],
    args: &[&str],
) -> (ExitStatus, String) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let log_path = scratch.join("script.log");
    let log = std::fs::File::create(&log_path).expect("create script.log");
    let mut cmd = Command::new("bash");
    cmd.arg(repo.join("bench/run_multi_gpu.sh"))
        .arg("--dry-run")
        .args(args)
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

/// The one measured run of a loadgen JSON under `OUT/runs`.
fn measured_run(out: &Path, name: &str) -> serde_json::Value {
    let path = out.join("runs").join(name);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let doc: serde_json::Value = serde_json::from_str(&text).expect("loadgen's JSON parses");
    let runs = doc["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1, "one measured run in {}", path.display());
    runs[0].clone()
}

/// A number field of a JSON object.
fn field(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

/// Completion tok/s of one run merged over its processes' JSONs, computed
/// here from their raw fields: all completion tokens / (the last end - the
/// first t0) on the wall clock.
fn merged_tps(out: &Path, names: &[String]) -> f64 {
    let runs: Vec<_> = names.iter().map(|n| measured_run(out, n)).collect();
    let tokens: f64 = runs.iter().map(|r| field(r, "completion_tokens")).sum();
    let start = runs
        .iter()
        .map(|r| field(r, "t0_unix_s"))
        .fold(f64::INFINITY, f64::min);
    let end = runs
        .iter()
        .map(|r| field(r, "t0_unix_s") + field(r, "wall_s"))
        .fold(f64::NEG_INFINITY, f64::max);
    tokens / (end - start)
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

/// The dry run exits 0 and its weak scaling table has, per sampling
/// (greedy, temperature 1.0), the one-server baseline and two servers both
/// ways (one loadgen per server, one for all), with positive tok/s; the
/// weak scaling factor is the merged tok/s of the loadgen JSONs (computed
/// here from their raw fields) over the baseline's; every per-server row
/// names its CPU server and each run's requests add up to 16 with shares
/// adding up to 100%; the per-server processes started together.
#[test]
fn dry_run_writes_the_scaling_table() {
    let scratch = ember_tests::scratch_dir("bench-multi-gpu");
    let out = scratch.join("out");
    let t0 = Instant::now();
    let (status, output) = run_dry(&scratch, &out, &[], &[]);
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

    let all = rows(&table, "8 x 8");
    let (weak, split): (Vec<_>, Vec<_>) = all.into_iter().partition(|r| r.len() == 12);
    let expected = [
        ("greedy", "1", "1 process", "8"),
        ("greedy", "2", "one per server", "16"),
        ("greedy", "2", "one for all (--balance least)", "16"),
        ("t1.0", "1", "1 process", "8"),
        ("t1.0", "2", "one per server", "16"),
        ("t1.0", "2", "one for all (--balance least)", "16"),
    ];
    assert_eq!(weak.len(), expected.len(), "weak scaling rows:\n{table}");
    for (row, (samp, g, mode, requests)) in weak.iter().zip(expected) {
        assert_eq!(
            (row[1], row[2], row[3], row[4]),
            (samp, g, mode, requests),
            "{table}"
        );
        assert!(number(row[5]) > 0.0, "tok/s in {row:?}");
        assert!(number(row[7]) > 0.0, "TTFT p99 in {row:?}");
        let base = merged_tps(&out, &[format!("8x8-{samp}-g1-one-r0.json")]);
        let tps = match mode {
            "1 process" => base,
            "one per server" => merged_tps(
                &out,
                &[
                    format!("8x8-{samp}-g2-per-server-r0-s0.json"),
                    format!("8x8-{samp}-g2-per-server-r0-s1.json"),
                ],
            ),
            _ => merged_tps(&out, &[format!("8x8-{samp}-g2-shared-r0.json")]),
        };
        assert!(
            (number(row[5]) - tps).abs() <= 0.5 + 1e-6 * tps,
            "tok/s {} = the merged JSONs' {tps}",
            row[5]
        );
        let scaling = row[8]
            .strip_suffix('x')
            .unwrap_or_else(|| panic!("scaling factor {:?} ends in x", row[8]));
        assert!(
            (number(scaling) - tps / base).abs() < 0.006,
            "weak scaling {scaling} = {tps} / {base}"
        );
        let start_skew = number(row[9]);
        assert!(start_skew >= 0.0, "{row:?}");
        if mode == "one per server" {
            // Both processes waited for the same --start-at (1 s ahead).
            assert!(start_skew < 200.0, "start skew {start_skew} ms: {row:?}");
        }
        assert!(number(row[11]) > 0.0, "loadgen CPU in {row:?}");
    }

    // Two servers x 2 samplings x 2 modes.
    assert_eq!(split.len(), 8, "per-server rows:\n{table}");
    for run in split.chunks(2) {
        let mut requests = 0.0;
        let mut share = 0.0;
        for (i, row) in run.iter().enumerate() {
            assert_eq!(row.len(), 11, "{row:?}");
            assert!(
                row[4].starts_with(&format!("cpu#{i} (127.0.0.1:")),
                "{row:?}"
            );
            requests += number(row[5]);
            share += number(row[7].trim_end_matches('%'));
            assert!(number(row[6]) > 0.0, "per-server tok/s in {row:?}");
        }
        assert_eq!(requests, 16.0, "a run's requests add up to 16:\n{table}");
        assert!(
            (share - 100.0).abs() < 0.2,
            "shares add up to 100%:\n{table}"
        );
    }

    for file in ["runs.tsv", "server-0.log", "server-1.log"] {
        assert!(out.join(file).is_file(), "{file} in OUT");
    }
    assert_servers_stopped(&out);
    ember_tests::cleanup_scratch(&scratch);
}

/// `--dry-run --mock`: the same path with two `loadgen mock` servers
/// (fixed TTFT and ITL, no batching limit), greedy only. The mocks scale
/// perfectly, so with either loadgen mode two of them give well over one's
/// tok/s (a merge that divided by the sum of the processes' times instead of
/// their common span would give about 1x).
#[test]
fn dry_run_with_mock_servers() {
    let scratch = ember_tests::scratch_dir("bench-multi-gpu-mock");
    let out = scratch.join("out");
    let (status, output) = run_dry(&scratch, &out, &[("SAMPLINGS", "greedy")], &["--mock"]);
    assert!(status.success(), "the dry run failed ({status}):\n{output}");
    let table = std::fs::read_to_string(out.join("table.md")).expect("table.md written");
    assert!(table.contains("loadgen mock servers"), "{table}");
    let weak: Vec<_> = rows(&table, "8 x 8")
        .into_iter()
        .filter(|r| r.len() == 12)
        .collect();
    assert_eq!(weak.len(), 3, "{table}");
    for row in &weak[1..] {
        let scaling = number(row[8].trim_end_matches('x'));
        assert!(scaling > 1.3, "two mocks scale: {row:?}\n{table}");
    }
    assert!(
        rows(&table, "8 x 8")
            .iter()
            .any(|r| r.len() == 11 && r[4].starts_with("mock#1 (127.0.0.1:")),
        "{table}"
    );
    assert_servers_stopped(&out);
    ember_tests::cleanup_scratch(&scratch);
}

/// A server that cannot start (`--max-batch-size 0`) fails the script with a
/// non-zero status naming it, and no server is left running.
#[test]
fn dry_run_fails_when_a_server_does_not_start() {
    let scratch = ember_tests::scratch_dir("bench-multi-gpu-fail");
    let out = scratch.join("out");
    let (status, output) = run_dry(
        &scratch,
        &out,
        &[("SERVER_ARGS", "--max-batch-size 0")],
        &[],
    );
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
