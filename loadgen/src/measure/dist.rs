//! Distributions: HdrHistograms recorded in microseconds (3 significant
//! figures) with exact means and maxima ([`Dist`], summarized as
//! [`DistSummary`] in milliseconds), and the spread of one number across
//! measured runs ([`Spread`]).

use hdrhistogram::Histogram;
use serde::Serialize;

/// One distribution.
#[derive(Debug, Clone)]
pub struct Dist {
    /// The values in microseconds, for percentiles.
    hist: Histogram<u64>,
    /// Exact sum in ns, for the mean.
    sum_ns: u128,
    /// Exact maximum in ns.
    max_ns: u64,
    /// Values recorded.
    count: u64,
    /// Negative values recorded as 0 (possible only for the overhead, if the
    /// two clocks ran at visibly different rates).
    clamped_negative: u64,
}

impl Default for Dist {
    fn default() -> Self {
        Dist {
            // 3 significant figures with auto-resize: a constant, valid setting.
            hist: Histogram::new(3).expect("3 significant figures is a valid histogram setting"),
            sum_ns: 0,
            max_ns: 0,
            count: 0,
            clamped_negative: 0,
        }
    }
}

/// A distribution's summary in milliseconds; `null`s when it is empty.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct DistSummary {
    /// Median.
    pub p50: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Exact mean.
    pub mean: Option<f64>,
    /// Exact maximum.
    pub max: Option<f64>,
    /// Number of values.
    pub count: u64,
    /// How many negative values were recorded as 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub clamped_negative: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Dist {
    /// Records a duration in ns (rounded to the nearest microsecond).
    pub fn record_ns(&mut self, ns: u64) {
        let us = ns.saturating_add(500) / 1000;
        // `record` grows the (auto-resizing) histogram; `saturating_record`
        // would clamp to its current range instead.
        if self.hist.record(us).is_err() {
            self.hist.saturating_record(us);
        }
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
        self.count += 1;
    }

    /// Records a signed duration; a negative one counts as 0 and is counted.
    pub fn record_signed_ns(&mut self, ns: i64) {
        if ns < 0 {
            self.clamped_negative += 1;
        }
        self.record_ns(u64::try_from(ns).unwrap_or(0));
    }

    /// Percentiles (the middle of their histogram bucket), mean and max in ms.
    pub fn summary(&self) -> DistSummary {
        if self.count == 0 {
            return DistSummary::default();
        }
        let q = |q: f64| {
            let us = self.hist.median_equivalent(self.hist.value_at_quantile(q));
            Some(us as f64 / 1e3)
        };
        DistSummary {
            p50: q(0.50),
            p95: q(0.95),
            p99: q(0.99),
            mean: Some(self.sum_ns as f64 / self.count as f64 / 1e6),
            max: Some(self.max_ns as f64 / 1e6),
            count: self.count,
            clamped_negative: self.clamped_negative,
        }
    }
}

/// Mean and spread of one number across measured runs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spread {
    /// Mean over runs.
    pub mean: f64,
    /// Smallest run.
    pub min: f64,
    /// Largest run.
    pub max: f64,
    /// Sample standard deviation (0 for a single run).
    pub stdev: f64,
}

impl Spread {
    /// The spread of the values present; `None` if there are none.
    pub fn of(values: impl IntoIterator<Item = Option<f64>>) -> Option<Spread> {
        let v: Vec<f64> = values.into_iter().flatten().collect();
        if v.is_empty() {
            return None;
        }
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = if v.len() > 1 {
            v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
        } else {
            0.0
        };
        Some(Spread {
            mean,
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            stdev: var.sqrt(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dist_percentiles_within_histogram_precision() {
        let mut d = Dist::default();
        for ms in 1..=100u64 {
            d.record_ns(ms * 1_000_000);
        }
        let s = d.summary();
        let close = |a: Option<f64>, b: f64| (a.expect("present") - b).abs() <= b * 1e-3;
        assert!(close(s.p50, 50.0), "{s:?}");
        assert!(close(s.p95, 95.0), "{s:?}");
        assert!(close(s.p99, 99.0), "{s:?}");
        assert!(close(s.mean, 50.5), "{s:?}");
        assert!(close(s.max, 100.0), "{s:?}");
        assert_eq!(s.count, 100);
        assert!(Dist::default().summary().p50.is_none());
    }

    #[test]
    fn negative_overhead_is_clamped_and_counted() {
        let mut d = Dist::default();
        d.record_signed_ns(-5);
        d.record_signed_ns(2_000_000);
        let s = d.summary();
        assert_eq!(s.clamped_negative, 1);
        assert_eq!(s.count, 2);
    }

    #[test]
    fn spread() {
        let s = Spread::of([Some(1.0), None, Some(3.0)]).expect("values");
        assert_eq!((s.mean, s.min, s.max), (2.0, 1.0, 3.0));
        assert!((s.stdev - 2f64.sqrt()).abs() < 1e-12);
        assert!(Spread::of([None]).is_none());
    }
}
