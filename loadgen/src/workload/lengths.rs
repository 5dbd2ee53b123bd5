//! Length distributions for synthetic prompts and outputs: `--input-len` and
//! `--output-len` take `N` or `fixed:N`, `uniform:LO..HI` (inclusive) or
//! `normal:MEAN,STDEV` (rounded, clamped to >= 1). Draws use a seeded RNG, so
//! the same `--seed` gives the same lengths.

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use rand_distr::{Distribution, Normal};
use serde::Serialize;

/// A distribution of token counts (every draw is >= 1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum LenDist {
    /// Always N.
    Fixed { n: u32 },
    /// Uniform over lo..=hi.
    Uniform { lo: u32, hi: u32 },
    /// Normal with this mean and standard deviation, rounded, at least 1.
    Normal { mean: f64, stdev: f64 },
}

impl LenDist {
    /// One draw.
    pub fn sample(&self, rng: &mut impl Rng) -> u32 {
        match *self {
            LenDist::Fixed { n } => n,
            LenDist::Uniform { lo, hi } => rng.random_range(lo..=hi),
            LenDist::Normal { mean, stdev } => match Normal::new(mean, stdev) {
                Ok(d) => d.sample(rng).round().clamp(1.0, f64::from(u32::MAX)) as u32,
                // Parsing rejects a bad stdev; keep the mean if one slips by.
                Err(_) => mean.round().max(1.0) as u32,
            },
        }
    }
}

impl fmt::Display for LenDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LenDist::Fixed { n } => write!(f, "fixed:{n}"),
            LenDist::Uniform { lo, hi } => write!(f, "uniform:{lo}..{hi}"),
            LenDist::Normal { mean, stdev } => write!(f, "normal:{mean},{stdev}"),
        }
    }
}

fn count(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{text}` is not a token count >= 1")),
    }
}

impl FromStr for LenDist {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (kind, rest) = text.split_once(':').unwrap_or(("fixed", text));
        match kind.trim() {
            "fixed" => Ok(LenDist::Fixed { n: count(rest)? }),
            "uniform" => {
                let (lo, hi) = rest
                    .split_once("..")
                    .ok_or_else(|| format!("uniform needs LO..HI (got `{rest}`)"))?;
                let (lo, hi) = (count(lo)?, count(hi)?);
                if lo > hi {
                    return Err(format!("uniform: {lo} > {hi}"));
                }
                Ok(LenDist::Uniform { lo, hi })
            }
            "normal" => {
                let (m, s) = rest
                    .split_once(',')
                    .ok_or_else(|| format!("normal needs MEAN,STDEV (got `{rest}`)"))?;
                let mean: f64 = m.trim().parse().map_err(|_| format!("bad mean `{m}`"))?;
                let stdev: f64 = s.trim().parse().map_err(|_| format!("bad stdev `{s}`"))?;
                if !(mean.is_finite() && mean >= 1.0 && stdev.is_finite() && stdev >= 0.0) {
                    return Err(format!(
                        "normal needs MEAN >= 1 and STDEV >= 0 (got {mean},{stdev})"
                    ));
                }
                Ok(LenDist::Normal { mean, stdev })
            }
            other => Err(format!(
                "unknown distribution `{other}` (fixed, uniform, normal)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    #[test]
    fn parses() {
        assert_eq!("128".parse(), Ok(LenDist::Fixed { n: 128 }));
        assert_eq!("fixed:7".parse(), Ok(LenDist::Fixed { n: 7 }));
        assert_eq!(
            "uniform:4..9".parse(),
            Ok(LenDist::Uniform { lo: 4, hi: 9 })
        );
        assert_eq!(
            "normal:100,10".parse(),
            Ok(LenDist::Normal {
                mean: 100.0,
                stdev: 10.0
            })
        );
        for bad in [
            "0",
            "x",
            "uniform:9..4",
            "uniform:4",
            "normal:10",
            "normal:0,1",
            "normal:5,-1",
            "zipf:3",
        ] {
            assert!(bad.parse::<LenDist>().is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn draws_follow_the_distribution_and_the_seed() {
        let draw = |d: &LenDist, seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..4000).map(|_| d.sample(&mut rng)).collect::<Vec<u32>>()
        };
        let u = LenDist::Uniform { lo: 10, hi: 20 };
        let a = draw(&u, 1);
        assert_eq!(a, draw(&u, 1), "seeded");
        assert_ne!(a, draw(&u, 2));
        assert!(a.iter().all(|v| (10..=20).contains(v)));
        assert!(a.contains(&10) && a.contains(&20), "both ends drawn");
        let n = LenDist::Normal {
            mean: 200.0,
            stdev: 20.0,
        };
        let v = draw(&n, 3);
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        let sd = (v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / v.len() as f64)
            .sqrt();
        // 4000 draws: the mean's standard error is 20/63 = 0.32.
        assert!((mean - 200.0).abs() < 2.0, "mean {mean}");
        assert!((sd - 20.0).abs() < 2.0, "stdev {sd}");
        let clamped = draw(
            &LenDist::Normal {
                mean: 1.0,
                stdev: 50.0,
            },
            4,
        );
        assert!(clamped.iter().all(|&x| x >= 1));
        assert!(draw(&LenDist::Fixed { n: 5 }, 0).iter().all(|&x| x == 5));
    }
}
