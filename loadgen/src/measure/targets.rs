//! Per-target figures of one run: how the balancer spread the requests and
//! how each target served its share (requests, OK / failed, completion
//! tokens/s over the run's wall time, client TTFT p50/p99, errors by
//! status), and when its last request ended: a target that drains later
//! than the others holds the run's wall time up. Reported when a run has
//! more than one target.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::measure::dist::Dist;
use crate::record::RequestRecord;

/// One target's share of a run.
#[derive(Debug, Clone, Serialize)]
pub struct TargetStats {
    /// The target URL.
    pub target: String,
    /// Requests sent to it.
    pub requests: usize,
    /// Of those, finished OK.
    pub ok: usize,
    /// Of those, failed.
    pub failed: usize,
    /// Completion tokens of its OK requests.
    pub completion_tokens: u64,
    /// Those / the run's wall time.
    pub throughput_completion_tps: f64,
    /// t0 -> its last request ended, seconds (the run's `wall_s` is the
    /// largest of these).
    pub wall_s: f64,
    /// Client TTFT p50 of its OK requests, ms.
    pub ttft_p50_ms: Option<f64>,
    /// Client TTFT p99, ms.
    pub ttft_p99_ms: Option<f64>,
    /// Failures by status name.
    pub errors: BTreeMap<String, usize>,
}

impl TargetStats {
    /// The figures of each of `targets` (in that order) from the run's
    /// records; `wall_s` is the run's wall time.
    pub fn of(targets: &[String], records: &[RequestRecord], wall_s: f64) -> Vec<TargetStats> {
        targets
            .iter()
            .map(|target| {
                let mine = records.iter().filter(|r| &r.target == target);
                let mut ttft = Dist::default();
                let mut s = TargetStats {
                    target: target.clone(),
                    requests: 0,
                    ok: 0,
                    failed: 0,
                    completion_tokens: 0,
                    throughput_completion_tps: 0.0,
                    wall_s: 0.0,
                    ttft_p50_ms: None,
                    ttft_p99_ms: None,
                    errors: BTreeMap::new(),
                };
                for r in mine {
                    s.requests += 1;
                    s.wall_s = s.wall_s.max(r.finish_ns as f64 / 1e9);
                    if !r.ok {
                        s.failed += 1;
                        *s.errors.entry(r.status.clone()).or_insert(0) += 1;
                        continue;
                    }
                    s.ok += 1;
                    s.completion_tokens += u64::from(r.completion_tokens);
                    if let Some(v) = r.client_ttft_ns {
                        ttft.record_ns(v);
                    }
                }
                if wall_s > 0.0 {
                    s.throughput_completion_tps = s.completion_tokens as f64 / wall_s;
                }
                let d = ttft.summary();
                (s.ttft_p50_ms, s.ttft_p99_ms) = (d.p50, d.p99);
                s
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::record;

    #[test]
    fn each_target_gets_its_own_share() {
        let mut a = record(vec![2_000_000, 3_000_000], None);
        a.target = "a".into();
        let mut b = a.clone();
        b.target = "b".into();
        let mut failed = record(vec![], None).fail("UNAVAILABLE".into(), "down".into(), 1);
        failed.target = "b".into();
        let s = TargetStats::of(&["a".into(), "b".into(), "c".into()], &[a, b, failed], 2.0);
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].requests, s[0].ok, s[0].failed), (1, 1, 0));
        assert_eq!((s[1].requests, s[1].ok, s[1].failed), (2, 1, 1));
        assert_eq!(s[1].errors.get("UNAVAILABLE"), Some(&1));
        assert_eq!(s[0].completion_tokens, 2);
        assert_eq!(s[0].throughput_completion_tps, 1.0, "2 tokens over 2 s");
        // Its own last finish: `record` ends at 50 us, the failure at 1 ns.
        assert_eq!((s[0].wall_s, s[1].wall_s, s[2].wall_s), (50e-6, 50e-6, 0.0));
        let p50 = s[0].ttft_p50_ms.expect("a TTFT");
        assert!((p50 - 2.0).abs() < 0.01, "{p50}");
        assert_eq!(
            (s[2].requests, s[2].ttft_p50_ms),
            (0, None),
            "an idle target"
        );
    }
}
