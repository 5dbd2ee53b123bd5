//! The benchmark scripts, run in their dry-run form against the built
//! binaries, so that a change to a binary's JSON cannot silently turn a
//! script's table into dashes again (issue 21: `bench/run_cpu.sh` read keys
//! `ember-engine-bench` no longer wrote and printed a table of dashes).
//!
//! `bash bench/run_cpu.sh --dry-run`: the tiny preset, 2 timed steps, a
//! 16 MiB bandwidth probe and a stub peer (no torch) under the system
//! `python3`; a few seconds. The test checks the exit status and that every
//! cell of every row of the table it prints is a number.

use std::path::{Path, PathBuf};
use std::process::Command;

use ember_tests::{bins, cleanup_scratch, scratch_dir};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

/// The data rows of a markdown table (`| ... |` lines after the `|---` one),
/// as cells.
fn table_rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .skip_while(|l| !l.starts_with("|---"))
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

#[test]
fn run_cpu_dry_run_prints_a_table_of_numbers() {
    let bench = bins::engine_bench();
    let bin_dir = bench.parent().expect("binary has a directory");
    let out = scratch_dir("run-cpu-dry");
    let run = Command::new("bash")
        .arg(repo_root().join("bench/run_cpu.sh"))
        .arg("--dry-run")
        .env("EMBER_BIN_DIR", bin_dir)
        .env("OUT", &out)
        .env_remove("PYTHON")
        .output()
        .expect("run bash");
    let log = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "run_cpu.sh --dry-run failed ({}):\n{log}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let table = std::fs::read_to_string(out.join("table.md")).expect("table.md written");
    let rows = table_rows(&table);
    // Batch 1 and 2, one pass.
    assert_eq!(rows.len(), 2, "{table}");
    for row in &rows {
        assert_eq!(row.len(), 7, "{table}");
        for cell in row {
            let number = cell.trim_end_matches('%');
            assert!(
                number.parse::<f64>().is_ok_and(f64::is_finite),
                "cell {cell:?} is not a number:\n{table}"
            );
        }
    }
    assert!(
        table.contains("SIMD:"),
        "the table names the CPU's SIMD features:\n{table}"
    );
    assert!(log.contains(&table), "the script prints the table");
    cleanup_scratch(&out);
}

/// `bench/run_gpu.sh` in its documented CPU dry run (tiny preset, one
/// workload, no engine stage, no peers): the server starts, loadgen runs and
/// `table.md` has the workload's row with its measured runs and no failures.
#[test]
fn run_gpu_dry_run_writes_the_end_to_end_row() {
    let out = scratch_dir("run-gpu-dry");
    let bin_dir = bins::server()
        .parent()
        .expect("the server binary has a parent dir")
        .to_path_buf();
    let run = Command::new("bash")
        .arg(repo_root().join("bench/run_gpu.sh"))
        .env("BENCH_DEVICE", "cpu")
        .env("BENCH_PRESET", "tiny")
        .env("EMBER_BIN_DIR", &bin_dir)
        .env("BENCH_WORKLOADS", "single_1x256")
        .env("SKIP_ENGINE", "1")
        .env("SKIP_PEERS", "1")
        .env("BENCH_WALL_S", "150")
        .env("PEER_RESERVE_S", "10")
        .env("OUT", &out)
        .output()
        .expect("bash runs");
    let log = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "run_gpu.sh dry run failed:\n{log}");
    let table = std::fs::read_to_string(out.join("table.md")).expect("table.md written");
    let row: Vec<String> = table
        .lines()
        .find(|l| l.starts_with("| single_1x256"))
        .unwrap_or_else(|| panic!("no single_1x256 row in\n{table}"))
        .trim_matches('|')
        .split('|')
        .map(|c| c.trim().to_string())
        .collect();
    assert_eq!(row[1], "3", "measured runs in {row:?}");
    assert_eq!(
        row.last().map(String::as_str),
        Some("0"),
        "failures in {row:?}"
    );
    cleanup_scratch(&out);
}
