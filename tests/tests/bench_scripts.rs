//! The benchmark scripts, run in their dry-run form against the built
//! binaries, so that a change to a binary's JSON cannot silently turn a
//! script's table into dashes again (issue 21: `bench/run_cpu.sh` read keys
//! `ember-engine-bench` no longer wrote and printed a table of dashes).
//!
//! `bash bench/run_cpu.sh --dry-run`: the tiny preset, 2 timed steps, a
//! 16 MiB bandwidth probe and a stub peer (no torch) under the system
//! `python3`; a few seconds. The test checks the exit status and that every
//! cell of every row of the table it prints is a number.
//!
//! `bash bench/run_family.sh --dry-run` (issue 41's GPT-2 family bench) runs
//! in CI too: without torch it writes the tiny model directory with the
//! standard library and runs the peer as `peer_compile.py --stub`, so the
//! engine bench's JSON, the peer's JSON and the cold start all reach its one
//! table. The torch peers themselves (`peer_compile.py`, `peer_cudagraph.py`)
//! run only where a python has torch and transformers
//! (`EMBER_TORCH_PYTHON`, the bench venv, or `python3`); CI installs none, so
//! that test says SKIPPED EXPLICITLY there and passes.

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
    // The summary: batch 2 against batch 1 for Ember and for torch, side
    // by side (issue 49's ratio and the peer's, from one run).
    let summary = &table[table.find("| batch | weights").expect("the summary table")..];
    assert!(
        summary.contains("| Ember vs batch 1 | torch vs batch 1 |"),
        "{table}"
    );
    let batch_two = table_rows(summary)
        .into_iter()
        .find(|r| r[0] == "2")
        .expect("a batch-2 row");
    for cell in &batch_two[7..9] {
        let ratio = cell.trim_end_matches('x');
        assert!(
            ratio.parse::<f64>().is_ok_and(|r| r > 0.0),
            "cell {cell:?} is not a ratio:\n{table}"
        );
    }
    assert!(log.contains(&table), "the script prints the table");
    cleanup_scratch(&out);
}

/// `bench/run_gpu.sh` in its documented CPU dry run (tiny preset, one
/// workload and its top-p sampled variant, no engine stage, no peers): the
/// server starts, loadgen runs and `table.md` has the workloads' rows with
/// their measured runs, no failures, and the sampled/greedy ratio.
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
        .env("BENCH_WORKLOADS", "single_1x256 single_1x256_t1_p09")
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
    // The sampled variant ran beside it and has its ratio to greedy.
    let sampled = table
        .lines()
        .find(|l| l.starts_with("| single_1x256_t1_p09 |"))
        .unwrap_or_else(|| panic!("no sampled row in\n{table}"));
    assert!(sampled.ends_with("| 0 |"), "failures in {sampled}");
    assert!(
        table.contains("## Sampled vs greedy") && table.contains("| single_1x256_t1_p09 | "),
        "no sampled/greedy ratio in\n{table}"
    );
    cleanup_scratch(&out);
}

/// Runs `bash bench/<script> --dry-run` with the built binaries; its log.
fn dry_run(script: &str, out: &Path, env: &[(&str, &str)]) -> String {
    let server = bins::server();
    let bin_dir = server.parent().expect("binary has a directory");
    assert!(bins::loadgen().is_file(), "loadgen is built");
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("bench").join(script))
        .arg("--dry-run")
        .env("EMBER_BIN_DIR", bin_dir)
        .env("OUT", out);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let run = cmd.output().expect("run bash");
    let log = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "{script} --dry-run failed ({}):\n{log}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    log
}

/// `bench/run_chats.sh --dry-run`: 8 non-streaming chats without a limit
/// against the tiny preset, as 8 curl processes and as one loadgen command;
/// both rows answered in full, with their throughput and the ratio.
#[test]
fn run_chats_dry_run_prints_curl_and_loadgen() {
    let out = scratch_dir("run-chats-dry");
    let log = dry_run("run_chats.sh", &out, &[]);
    let result = std::fs::read_to_string(out.join("result.md")).expect("result.md written");
    let rows = table_rows(&result);
    assert_eq!(rows.len(), 2, "{result}");
    for row in &rows {
        assert_eq!(row[1], "8", "every chat answered: {result}");
        assert!(
            row[4]
                .replace(',', "")
                .parse::<f64>()
                .is_ok_and(|t| t > 0.0),
            "{result}"
        );
    }
    assert!(result.contains("loadgen / curl:"), "{result}");
    assert!(log.contains(&result), "the script prints the result");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("loadgen.json")).expect("json"))
            .expect("loadgen's JSON");
    assert!(doc["request_shape"]
        .as_str()
        .is_some_and(|s| s.contains("non-streaming") && s.contains("no max_tokens")));
    assert!(doc["runs"][0]["server_metrics"]["samples"].is_array());
    assert!(out.join("report/index.html").is_file());
    cleanup_scratch(&out);
}

/// `bench/run_options.sh --dry-run`: the six option loads (plain, penalty
/// on all, on half, one json_object request, json_object on all, logit_bias
/// on all) against the tiny preset; every group's TPOT is a number, no
/// request failed, and the five ratios print.
#[test]
fn run_options_dry_run_prints_every_group() {
    let out = scratch_dir("run-options-dry");
    let log = dry_run("run_options.sh", &out, &[]);
    let result = std::fs::read_to_string(out.join("result.md")).expect("result.md written");
    let rows = table_rows(&result);
    assert_eq!(rows.len(), 8, "{result}");
    for row in &rows {
        assert!(row[1].parse::<f64>().is_ok_and(|t| t > 0.0), "{result}");
        assert_eq!(row[3], "0", "no request failed: {result}");
    }
    for line in [
        "penalty on every request",
        "penalty on half",
        "beside 1 json_object",
        "json_object on every request",
        "logit_bias on every request",
    ] {
        assert!(result.contains(line), "{line}: {result}");
    }
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("json_one.json.json")).expect("json"),
    )
    .expect("loadgen's JSON");
    assert_eq!(json["runs"][0]["ok"], 1, "the structured request finished");
    assert!(log.contains(&result), "the script prints the result");
    cleanup_scratch(&out);
}

/// `bench/run_seeds_ab.sh --dry-run`: this build's server against itself as
/// the baseline, driven by one loadgen, on the tiny preset: the table has a
/// row per workload and metric, with both builds' numbers, a ratio and no
/// failed request.
#[test]
fn run_seeds_ab_dry_run_prints_both_builds_and_their_ratio() {
    let out = scratch_dir("run-seeds-ab-dry");
    let log = dry_run("run_seeds_ab.sh", &out, &[("WORKLOADS", "seed044 seed048")]);
    let result = std::fs::read_to_string(out.join("result.md")).expect("result.md written");
    let rows = table_rows(&result);
    assert_eq!(
        rows.len(),
        3,
        "seed044 tok/s, seed048 tok/s and TTFT: {result}"
    );
    for row in &rows {
        for cell in &row[2..5] {
            assert!(cell.parse::<f64>().is_ok_and(|x| x > 0.0), "{result}");
        }
        assert_eq!(row[6], "0", "no request failed: {result}");
    }
    assert!(log.contains(&result), "the script prints the result");
    cleanup_scratch(&out);
}

/// `bench/run_mixed_poisson.sh --dry-run`: Poisson chats, half sampled, as
/// two loadgens against the tiny preset for a few seconds; both groups
/// finish requests with no failure, TTFT and the server's waiting queue are
/// numbers, and the verdict line prints.
#[test]
fn run_mixed_poisson_dry_run_measures_both_groups() {
    let out = scratch_dir("run-mixed-dry");
    let log = dry_run("run_mixed_poisson.sh", &out, &[]);
    let result = std::fs::read_to_string(out.join("result.md")).expect("result.md written");
    let rows = table_rows(&result);
    assert_eq!(rows.len(), 2, "{result}");
    for row in &rows {
        assert!(row[1].parse::<u64>().is_ok_and(|n| n > 0), "{result}");
        assert_eq!(row[2], "0", "no request failed: {result}");
        let ttft = row[4].split('/').next().unwrap_or("").trim();
        assert!(ttft.parse::<f64>().is_ok(), "TTFT p50 in {result}");
        assert!(
            row[7].parse::<f64>().is_ok(),
            "server waiting max in {result}"
        );
    }
    assert!(
        result.contains("TTFT p50 < 20 ms in both groups"),
        "{result}"
    );
    assert!(log.contains(&result), "the script prints the result");
    cleanup_scratch(&out);
}

/// `bench/run_first_deploy.sh --dry-run`: the tiny preset on the CPU from an
/// empty kernel cache, every request kind at once (streamed and whole chats,
/// n=2, penalties, JSON mode, echo with prompt logprobs, disconnects): each
/// group sent requests and every group but the disconnects finished them
/// all, the time to SERVING and TTFT are numbers, and no kernel was tuned
/// after SERVING (the script exits 1 otherwise).
#[test]
fn run_first_deploy_dry_run_sends_every_kind_and_tunes_nothing_after_serving() {
    let out = scratch_dir("run-first-deploy-dry");
    let log = dry_run("run_first_deploy.sh", &out, &[]);
    let result = std::fs::read_to_string(out.join("result.md")).expect("result.md written");
    let rows = table_rows(&result);
    let groups: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        groups,
        [
            "chat_stream",
            "chat_sampled",
            "n2",
            "penalties",
            "json",
            "echo_logprobs",
            "disconnects"
        ],
        "{result}"
    );
    for row in &rows {
        let sent: u64 = row[1].parse().unwrap_or(0);
        assert!(sent > 0, "{result}");
        if row[0] != "disconnects" {
            assert_eq!(row[3], "0", "no errors outside the disconnects: {result}");
        }
        // A non-streamed request's TTFT comes from the server's timeline
        // (its client sees only the whole response), never past its latency.
        let streamed = !matches!(row[0].as_str(), "chat_sampled" | "echo_logprobs");
        let source = if streamed {
            "client"
        } else {
            "server timeline"
        };
        assert_eq!(row[4], source, "{result}");
        if !streamed {
            let ttft_p99: f64 = row[5]
                .rsplit(" / ")
                .next()
                .unwrap_or("")
                .parse()
                .unwrap_or(-1.0);
            let latency_p99: f64 = row[6].parse().unwrap_or(-1.0);
            assert!(ttft_p99 > 0.0 && ttft_p99 <= latency_p99 + 1.0, "{result}");
        }
    }
    let line = |prefix: &str| {
        result
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no '{prefix}' line:\n{result}"))
            .to_string()
    };
    let serving = line("- time to SERVING");
    let secs = serving
        .rsplit(": ")
        .next()
        .unwrap_or("")
        .trim_end_matches(" s");
    assert!(secs.parse::<f64>().is_ok_and(|s| s > 0.0), "{serving}");
    assert!(
        line("- kernel autotunings after SERVING").ends_with(": 0"),
        "{result}"
    );
    assert!(
        line("- TTFT over every request").contains("p99"),
        "{result}"
    );
    assert!(
        line("- kernels compiled after SERVING").ends_with(": 0"),
        "{result}"
    );
    assert!(
        result.contains("- verdict: nothing tuned or compiled after SERVING"),
        "{result}"
    );
    assert!(log.contains(&result), "the script prints the result");
    cleanup_scratch(&out);
}

/// `bench/run_aiperf_compare.sh --dry-run` without AIPerf (CI has no
/// PyPI): the pinned server, loadgen's three loads and the table, with the
/// server's own TTFT and the closed loops' re-issue delay from its log.
#[test]
fn run_aiperf_compare_dry_run_prints_loadgens_rows() {
    let out = scratch_dir("run-aiperf-dry");
    let log = dry_run(
        "run_aiperf_compare.sh",
        &out,
        &[("AIPERF", "/nonexistent/aiperf")],
    );
    assert!(log.contains("no AIPerf"), "{log}");
    let table = std::fs::read_to_string(out.join("table.md")).expect("table.md written");
    let rows = table_rows(&table);
    assert_eq!(rows.len(), 3, "c1, rate, conc by loadgen:\n{table}");
    for row in &rows {
        assert_eq!(row[1], "loadgen", "{table}");
        for cell in &row[2..6] {
            assert!(
                cell.replace(',', "").parse::<f64>().is_ok(),
                "{cell:?}:\n{table}"
            );
        }
        assert!(
            row[6].ends_with("(8 req)"),
            "the server logged every request:\n{table}"
        );
    }
    assert!(
        rows[0][7].contains(" / "),
        "c1 has a re-issue delay:\n{table}"
    );
    assert!(rows[1][7].contains("open loop"), "{table}");
    cleanup_scratch(&out);
}

/// `bench/run_lmeval.sh --dry-run`: the tiny preset's HTTP door passes the
/// probe of what lm-evaluation-harness sends and reads (models, tokenizer
/// routes, the 20-item task), the local tokenizer directory is written, and
/// the lm_eval command is printed with the local task (not run: no venv).
#[test]
fn run_lmeval_dry_run_probes_the_door_and_prints_the_command() {
    let out = scratch_dir("run-lmeval-dry");
    let log = dry_run("run_lmeval.sh", &out, &[]);
    for check in [
        "ok   models:",
        "ok   tokenizer_info:",
        "ok   tokenize: 200: 'Hello world' -> [15496, 995]",
        "ok   detokenize:",
        "ok   task: 20 items",
    ] {
        assert!(log.contains(check), "no {check:?} in:\n{log}");
    }
    let command = log
        .lines()
        .find(|l| l.starts_with("command: "))
        .unwrap_or_else(|| panic!("no command line in:\n{log}"));
    for part in [
        "lm_eval --model local-completions",
        "/v1/completions,model=",
        "tokenized_requests=False",
        "tokenizer_backend=huggingface",
        "--include_path bench/lmeval --tasks ember_mc",
    ] {
        assert!(command.contains(part), "no {part:?} in {command}");
    }
    for file in ["vocab.json", "merges.txt", "tokenizer_config.json"] {
        assert!(out.join("tokenizer").join(file).is_file(), "{file}");
    }
    let probe: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("probe.json")).expect("probe.json"))
            .expect("probe.json is JSON");
    assert!(
        probe["max_model_len"].as_u64().is_some_and(|n| n > 0),
        "{probe}"
    );
    cleanup_scratch(&out);
}

/// `bench/run_family.sh --dry-run`: the tiny model directory on the CPU
/// (written with the standard library where python3 has no torch, as in
/// CI, and the peer as `peer_compile.py --stub`), two engine-bench runs, the
/// peer, the cold start and ONE table: every decode and prefill row has
/// Ember's step, the peer's time and their ratio as numbers, no notes, and
/// the cold start line has both starts' seconds.
#[test]
fn run_family_dry_run_prints_one_table() {
    let out = scratch_dir("run-family-dry");
    let log = dry_run("run_family.sh", &out, &[]);
    let table = std::fs::read_to_string(out.join("table.md")).expect("table.md written");
    let rows = table_rows(&table);
    // Contexts 16 and 24 x batches 1 and 2, then prefills 1x8 and 2x8.
    let shapes: Vec<&str> = rows.iter().map(|r| r[1].as_str()).collect();
    assert_eq!(
        shapes,
        [
            "B=1, ctx 16",
            "B=2, ctx 16",
            "B=1, ctx 24",
            "B=2, ctx 24",
            "prefill 1x8",
            "prefill 2x8"
        ],
        "{table}"
    );
    for row in &rows {
        assert_eq!(row.len(), 10, "{table}");
        assert_eq!(row[0], "tiny", "{table}");
        let decode = row[1].starts_with("B=");
        // Step, (overlapped step for decode rows,) peer, ratio.
        let numeric: &[usize] = if decode { &[2, 3, 5, 7] } else { &[2, 5, 7] };
        for &i in numeric {
            assert!(
                row[i]
                    .parse::<f64>()
                    .is_ok_and(|v| v.is_finite() && v >= 0.0),
                "column {i} of {row:?} is not a number:\n{table}"
            );
        }
        assert_eq!(row[9], "", "no notes (nothing skipped or failed): {table}");
    }
    let cold = table
        .lines()
        .find(|l| l.contains("start to health SERVING"))
        .unwrap_or_else(|| panic!("no cold start line:\n{table}"));
    assert!(
        cold.contains("cold (empty --kernel-cache-dir): ") && !cold.contains("not run"),
        "{cold}"
    );
    assert!(!cold.contains("failed"), "{cold}");
    assert!(table.contains("stages not clean: none"), "{table}");
    assert!(log.contains(&table), "the script prints the table");
    let results: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("results.json")).expect("results.json"),
    )
    .expect("results.json is JSON");
    assert!(results["raw"]["ember-tiny-c16.json"]["decode"].is_array());
    cleanup_scratch(&out);
}

/// A python that imports torch and transformers: `EMBER_TORCH_PYTHON`, else
/// the venv `bench/run_cpu.sh` makes, else `python3`. None where none does.
fn torch_python() -> Option<PathBuf> {
    let venv = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/ember/bench-venv/bin/python"));
    std::env::var_os("EMBER_TORCH_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain(venv)
        .chain([PathBuf::from("python3")])
        .find(|py| {
            Command::new(py)
                .args(["-c", "import torch, transformers"])
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// The hand-written torch peers on the CPU with a python that has torch:
/// `peer_compile.py --dry-run` (tiny, float32, torch.compile without a graph)
/// and `peer_cudagraph.py`'s CPU smoke run pass their checks against
/// transformers and time every shape. Without such a python (CI installs no
/// torch) it says SKIPPED EXPLICITLY and passes; `EMBER_TORCH_PYTHON` points
/// it at one.
#[test]
fn torch_peers_dry_runs_match_transformers() {
    let Some(py) = torch_python() else {
        eprintln!(
            "SKIPPED EXPLICITLY: torch_peers_dry_runs_match_transformers: no python with torch \
             and transformers (EMBER_TORCH_PYTHON, ~/.cache/ember/bench-venv, python3)"
        );
        return;
    };
    let out = scratch_dir("torch-peers-dry");
    let peers: [(&str, &[&str]); 2] = [
        ("peer_compile.py", &["--dry-run"]),
        (
            "peer_cudagraph.py",
            &[
                "--device",
                "cpu",
                "--tiny",
                "--dtype",
                "float32",
                "--batch-sizes",
                "1,2",
                "--iters",
                "3",
                "--prefill",
                "2x8",
            ],
        ),
    ];
    for (script, args) in peers {
        let json = out.join(format!("{script}.json"));
        let run = Command::new(&py)
            .arg(repo_root().join("bench").join(script))
            .args(args)
            .arg("--json")
            .arg(&json)
            .output()
            .expect("run python");
        let log = String::from_utf8_lossy(&run.stdout);
        assert!(
            run.status.success(),
            "{script} failed ({}):\n{log}\n{}",
            run.status,
            String::from_utf8_lossy(&run.stderr)
        );
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("JSON");
        assert_eq!(doc["check"]["status"], "ok", "{script}: {}", doc["check"]);
        let rows = doc["decode"].as_array().expect("decode rows");
        assert_eq!(rows.len(), 2, "{script}: {rows:?}");
        for row in rows
            .iter()
            .chain(doc["prefill"].as_array().expect("prefill"))
        {
            assert!(
                row["median_ms"].as_f64().is_some_and(|ms| ms > 0.0),
                "{script}: {row}"
            );
        }
    }
    cleanup_scratch(&out);
}

/// `bench/run_loadgen_scale.sh --dry-run`: calibrate at 100 and 400 streams
/// and the open loop at 500 and 2,000 req/s, each through both doors, in one
/// table: every row's submit lag, rates and loadgen CPU are numbers, the
/// calibrations' errors too, and the open loop's achieved rate is within 5%
/// of the asked (its target is 1%; a loaded CI machine gets room).
#[test]
fn run_loadgen_scale_dry_run_prints_one_table() {
    let out = scratch_dir("run-loadgen-scale-dry");
    let log = dry_run("run_loadgen_scale.sh", &out, &[]);
    let table = std::fs::read_to_string(out.join("table.md")).expect("table.md written");
    assert!(log.contains(&table), "the script prints the table");
    assert!(table.contains("cores (nproc)"), "{table}");
    let rows = table_rows(&table);
    assert_eq!(rows.len(), 8, "4 calibrations + 4 open loops:\n{table}");
    let num = |cell: &str| -> f64 {
        cell.replace(',', "")
            .parse()
            .unwrap_or_else(|e| panic!("{cell:?} is not a number ({e}):\n{table}"))
    };
    let pair = |cell: &str| -> (f64, f64) {
        let (a, b) = cell
            .split_once(" / ")
            .unwrap_or_else(|| panic!("{cell:?} is not a pair:\n{table}"));
        (num(a), num(b))
    };
    for row in &rows {
        assert_eq!(row.len(), 9, "{row:?}");
        assert!(row[1] == "grpc" || row[1] == "http", "{row:?}");
        let (p50, p99) = pair(&row[5]);
        assert!(0.0 <= p50 && p50 <= p99, "submit lag {row:?}");
        let (achieved, asked) = pair(&row[6]);
        let cores = row[7]
            .split_once(" s, ")
            .and_then(|(_, c)| c.strip_suffix(" cores"))
            .unwrap_or_else(|| panic!("loadgen CPU {:?}", row[7]));
        assert!(num(cores) > 0.0, "{row:?}");
        if row[0] == "calibrate" {
            let (e50, e99) = pair(&row[3]);
            assert!(e50 <= e99, "TTFT error {row:?}");
            pair(&row[4]);
            assert!(row[8].starts_with("error p99 < 1 ms: "), "{row:?}");
        } else {
            assert_eq!(row[0], "open loop", "{row:?}");
            assert!(row[2].ends_with(" req/s"), "{row:?}");
            assert_eq!(num(row[2].trim_end_matches(" req/s")), asked, "{row:?}");
            assert!(
                (achieved - asked).abs() <= 0.05 * asked,
                "achieved rate {row:?}"
            );
        }
    }
    cleanup_scratch(&out);
}
