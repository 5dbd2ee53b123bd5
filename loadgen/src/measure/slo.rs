//! Service-level objectives and goodput: `--slo ttft=200ms,tpot=50ms,e2e=5s`
//! (any subset). A request is *good* if it finished OK and meets every
//! objective given; goodput is the good requests per second of wall time and
//! their share of all requests, reported next to throughput.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use crate::record::RequestRecord;

/// The objectives; `None` = not constrained.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Slo {
    /// Client TTFT (submit start -> first token) at most this.
    #[serde(serialize_with = "ser_ms")]
    pub ttft: Option<Duration>,
    /// Client TPOT at most this (requests with < 2 tokens have none and meet it).
    #[serde(serialize_with = "ser_ms")]
    pub tpot: Option<Duration>,
    /// Client latency (submit start -> end) at most this.
    #[serde(serialize_with = "ser_ms")]
    pub e2e: Option<Duration>,
}

fn ser_ms<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&(d.as_secs_f64() * 1e3)),
        None => s.serialize_none(),
    }
}

impl Slo {
    /// Whether the record finished OK within every objective.
    pub fn is_good(&self, r: &RequestRecord) -> bool {
        let within = |limit: Option<Duration>, value: Option<u64>| match (limit, value) {
            (None, _) => true,
            (Some(l), Some(v)) => u128::from(v) <= l.as_nanos(),
            (Some(_), None) => false,
        };
        r.ok && within(self.ttft, r.client_ttft_ns)
            && within(self.tpot, r.client_tpot_ns.or(Some(0)))
            && within(self.e2e, Some(r.latency_ns))
    }
}

impl fmt::Display for Slo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = [("ttft", self.ttft), ("tpot", self.tpot), ("e2e", self.e2e)]
            .iter()
            .filter_map(|(k, v)| v.map(|d| format!("{k}<={}ms", fmt_ms(d))))
            .collect();
        write!(f, "{}", parts.join(", "))
    }
}

fn fmt_ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms.fract() == 0.0 {
        format!("{ms:.0}")
    } else {
        format!("{ms}")
    }
}

impl FromStr for Slo {
    type Err = String;

    /// `ttft=200ms,tpot=50ms,e2e=5s`; units `us`, `ms`, `s` (a bare number is ms).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut slo = Slo::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}` is not key=value (e.g. ttft=200ms)"))?;
            let d = parse_duration(value.trim()).map_err(|e| format!("{key}: {e}"))?;
            let slot = match key.trim() {
                "ttft" => &mut slo.ttft,
                "tpot" => &mut slo.tpot,
                "e2e" => &mut slo.e2e,
                other => return Err(format!("unknown objective `{other}` (ttft, tpot, e2e)")),
            };
            if slot.replace(d).is_some() {
                return Err(format!("`{}` given twice", key.trim()));
            }
        }
        if slo == Slo::default() {
            return Err("no objective given (e.g. ttft=200ms,tpot=50ms,e2e=5s)".into());
        }
        Ok(slo)
    }
}

/// `200ms`, `1.5s`, `750us`, or a bare number of milliseconds; must be > 0.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else {
        (text, 1e-3)
    };
    let v: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (e.g. 200ms, 5s)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("`{text}` must be > 0"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

/// Goodput of one run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Goodput {
    /// Requests that finished OK within every objective.
    pub good: usize,
    /// good / all requests of the run (0..1).
    pub share: f64,
    /// good / run wall time.
    pub rps: f64,
}

impl Goodput {
    /// Goodput of the records over `wall_s` seconds.
    pub fn of(slo: &Slo, records: &[RequestRecord], wall_s: f64) -> Goodput {
        let good = records.iter().filter(|r| slo.is_good(r)).count();
        Goodput {
            good,
            share: if records.is_empty() {
                0.0
            } else {
                good as f64 / records.len() as f64
            },
            rps: if wall_s > 0.0 {
                good as f64 / wall_s
            } else {
                0.0
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::record;

    #[test]
    fn parses_any_subset_with_units() {
        let s: Slo = "ttft=200ms,tpot=50ms,e2e=5s".parse().expect("parses");
        assert_eq!(s.ttft, Some(Duration::from_millis(200)));
        assert_eq!(s.tpot, Some(Duration::from_millis(50)));
        assert_eq!(s.e2e, Some(Duration::from_secs(5)));
        let s: Slo = "tpot=1500us".parse().expect("parses");
        assert_eq!(
            s,
            Slo {
                tpot: Some(Duration::from_micros(1500)),
                ..Slo::default()
            }
        );
        assert_eq!(
            "e2e=2.5".parse::<Slo>().map(|s| s.e2e),
            Ok(Some(Duration::from_micros(2500)))
        );
        for bad in [
            "",
            "ttft",
            "ttft=abc",
            "ttft=-1ms",
            "ttft=0",
            "foo=1ms",
            "ttft=1ms,ttft=2ms",
        ] {
            assert!(bad.parse::<Slo>().is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn a_request_is_good_only_if_it_meets_all() {
        // record(): submit at 1.5 us, tokens at 10, 20, 40 us, finish at 50 us.
        let r = record(vec![10_000, 20_000, 40_000], Some(8_000));
        let slo = |t: u64, p: u64, e: u64| Slo {
            ttft: Some(Duration::from_nanos(t)),
            tpot: Some(Duration::from_nanos(p)),
            e2e: Some(Duration::from_nanos(e)),
        };
        assert!(
            slo(8_500, 15_000, 48_500).is_good(&r),
            "limits are inclusive"
        );
        assert!(!slo(8_499, 15_000, 48_500).is_good(&r), "ttft");
        assert!(!slo(8_500, 14_999, 48_500).is_good(&r), "tpot");
        assert!(!slo(8_500, 15_000, 48_499).is_good(&r), "e2e");
        let mut failed = r.clone();
        failed.ok = false;
        assert!(
            !Slo::default().is_good(&failed),
            "failed requests are never good"
        );
        let g = Goodput::of(&slo(8_500, 15_000, 48_500), &[r.clone(), failed], 2.0);
        assert_eq!(g.good, 1);
        assert!((g.share - 0.5).abs() < 1e-12 && (g.rps - 0.5).abs() < 1e-12);
        let one_token = record(vec![10_000], Some(8_000));
        assert!(
            slo(8_500, 1, 48_500).is_good(&one_token),
            "no TPOT meets tpot"
        );
    }
}
