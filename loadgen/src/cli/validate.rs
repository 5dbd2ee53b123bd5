//! The checks behind [`Args::validate`]: every value and combination of
//! flags is checked before anything connects; the error names the flag to
//! fix. (`cli::build` then turns the flags into settings.)

use crate::cli::Args;
use crate::config::{Arrival, Backend, Endpoint, SubmitSchedule};
use crate::error::Error;

impl Args {
    /// Every check. The error names the flag.
    pub(crate) fn check(&self) -> Result<(), Error> {
        self.validate_targets()?;
        self.check_settings()
    }

    /// Every check but the targets'.
    pub(crate) fn check_settings(&self) -> Result<(), Error> {
        if self.num_requests == Some(0) {
            return Err(Error::invalid("--num-requests", "must be >= 1 (got 0)"));
        }
        if self.repeat_runs == 0 {
            return Err(Error::invalid("--repeat-runs", "must be >= 1 (got 0)"));
        }
        if self.max_new_tokens.0 == Some(0) {
            return Err(Error::invalid(
                "--max-new-tokens",
                "must be >= 1 (got 0; `none` sends no limit)",
            ));
        }
        if self.prompt_repeats == 0 {
            return Err(Error::invalid("--prompt-repeats", "must be >= 1 (got 0)"));
        }
        if self.prompt.is_empty() {
            return Err(Error::invalid("--prompt", "must not be empty"));
        }
        if self.max_concurrency == Some(0) {
            return Err(Error::invalid(
                "--max-concurrency",
                "must be >= 1 (got 0; leave it unset for no limit)",
            ));
        }
        if !(self.submit_interval_ms.is_finite() && self.submit_interval_ms >= 0.0) {
            return Err(Error::invalid(
                "--submit-interval-ms",
                format!(
                    "must be a finite number >= 0 (got {})",
                    self.submit_interval_ms
                ),
            ));
        }
        if !(self.timeout.is_finite() && self.timeout > 0.0) {
            return Err(Error::invalid(
                "--timeout",
                format!("must be > 0 seconds (got {})", self.timeout),
            ));
        }
        if let Some(at) = self.start_at {
            check_start_at(at, crate::measure::clock::unix_now())?;
        }
        if !(self.server_start_timeout.is_finite() && self.server_start_timeout > 0.0) {
            return Err(Error::invalid(
                "--server-start-timeout",
                format!("must be > 0 seconds (got {})", self.server_start_timeout),
            ));
        }
        self.validate_arrival()?;
        self.validate_sweep()?;
        self.data.validate()?;
        self.view.validate()?;
        self.validate_sampling()?;
        self.validate_shape()?;
        self.validate_prompts()
    }

    fn validate_arrival(&self) -> Result<(), Error> {
        let rated = matches!(self.arrival, Arrival::Poisson | Arrival::Gamma);
        let name = format!("{:?}", self.arrival).to_lowercase();
        if rated && self.submit_schedule == SubmitSchedule::Relative {
            return Err(Error::invalid(
                "--submit-schedule",
                format!("--arrival {name} needs the absolute schedule (got relative)"),
            ));
        }
        if self.arrival != Arrival::Fixed && self.submit_interval_ms != 0.0 {
            return Err(Error::invalid(
                "--submit-interval-ms",
                format!("cannot be combined with --arrival {name} (it sets the gaps)"),
            ));
        }
        if !(self.burstiness.is_finite() && self.burstiness > 0.0) {
            return Err(Error::invalid(
                "--burstiness",
                format!("must be > 0 (got {})", self.burstiness),
            ));
        }
        if !(self.trace_time_scale.is_finite() && self.trace_time_scale > 0.0) {
            return Err(Error::invalid(
                "--trace-time-scale",
                format!("must be > 0 (got {})", self.trace_time_scale),
            ));
        }
        if self.arrival == Arrival::Trace {
            if self.data.dataset.is_none() {
                return Err(Error::invalid(
                    "--arrival",
                    "trace replays --dataset timestamps; give --dataset",
                ));
            }
            if self.submit_schedule == SubmitSchedule::Relative {
                return Err(Error::invalid(
                    "--submit-schedule",
                    "--arrival trace needs the absolute schedule",
                ));
            }
        }
        if self.sweep.active() {
            // The sweep sets the rate.
            return match self.request_rate {
                Some(_) => Err(Error::invalid(
                    "--request-rate",
                    "cannot be combined with a sweep (it sets the rates)",
                )),
                None => Ok(()),
            };
        }
        match (rated, self.request_rate) {
            (true, None) => Err(Error::invalid(
                "--request-rate",
                format!("is required with --arrival {name}"),
            )),
            (true, Some(r)) if !(r.is_finite() && r > 0.0) => Err(Error::invalid(
                "--request-rate",
                format!("must be > 0 requests/s with --arrival {name} (got {r})"),
            )),
            (false, Some(_)) => Err(Error::invalid(
                "--request-rate",
                "only applies to --arrival poisson or gamma (use --submit-interval-ms for fixed gaps)",
            )),
            _ => Ok(()),
        }
    }

    fn validate_sweep(&self) -> Result<(), Error> {
        self.sweep.validate()?;
        if !self.sweep.active() {
            return Ok(());
        }
        if self.arrival == Arrival::Trace || self.submit_schedule == SubmitSchedule::Relative {
            return Err(Error::invalid(
                "--sweep",
                "needs a rate-driven arrival (fixed, poisson or gamma) on the absolute schedule",
            ));
        }
        if self.submit_interval_ms != 0.0 {
            return Err(Error::invalid(
                "--submit-interval-ms",
                "cannot be combined with a sweep (it sets the rates)",
            ));
        }
        Ok(())
    }

    fn validate_sampling(&self) -> Result<(), Error> {
        if let Some(t) = self.temperature {
            if !(t.is_finite() && t >= 0.0) {
                return Err(Error::invalid(
                    "--temperature",
                    format!("must be a finite number >= 0 (got {t})"),
                ));
            }
        }
        if let Some(k) = self.top_k {
            if k < 0 {
                return Err(Error::invalid("--top-k", format!("must be >= 0 (got {k})")));
            }
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(Error::invalid(
                    "--top-p",
                    format!("must be in (0, 1] (got {p})"),
                ));
            }
        }
        if let Some(p) = self.min_p {
            if !(0.0..=1.0).contains(&p) {
                return Err(Error::invalid(
                    "--min-p",
                    format!("must be in [0, 1] (got {p})"),
                ));
            }
        }
        Ok(())
    }

    fn validate_targets(&self) -> Result<(), Error> {
        self.conn.validate(self.spawn_server)?;
        if !self.spawn_server && !self.server_args.is_empty() {
            return Err(Error::invalid(
                "--spawn-server",
                format!(
                    "arguments after `--` ({}) are for the spawned server; pass --spawn-server",
                    self.server_args.join(" ")
                ),
            ));
        }
        Ok(())
    }

    /// The chat endpoint takes text: token ids are decoded client-side, but
    /// `--pretok` (which exists to send ids) makes no sense there.
    fn validate_prompts(&self) -> Result<(), Error> {
        if self.pretok
            && self.conn.backend == Backend::Openai
            && self.conn.endpoint == Endpoint::Chat
        {
            return Err(Error::invalid(
                "--pretok",
                "the chat endpoint takes text messages, not token ids (use --endpoint completions)",
            ));
        }
        Ok(())
    }
}

/// `--start-at` is a Unix time in seconds within a day of `now` (a time in
/// milliseconds, or a typo, would otherwise wait for years or start at once).
fn check_start_at(at: f64, now: f64) -> Result<(), Error> {
    const DAY_S: f64 = 86_400.0;
    if at.is_finite() && (at - now).abs() <= DAY_S {
        return Ok(());
    }
    Err(Error::invalid(
        "--start-at",
        format!("must be a Unix time in seconds within a day of now ({now:.3}); got {at}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        let mut argv = vec!["loadgen", "--target", "127.0.0.1:1"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv)
    }

    fn flag_of(extra: &[&str]) -> &'static str {
        match parse(extra).map(|a| a.validate().map(|_| ())) {
            Ok(Err(Error::InvalidArgument { flag, .. })) => flag,
            other => panic!("{extra:?}: expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        let args = parse(&[]).expect("parses");
        let (c, _) = args.validate().expect("defaults validate");
        assert_eq!(c.arrivals.num_requests, 16);
        assert_eq!(c.workload.max_new_tokens, Some(32));
        assert_eq!((c.warmup_runs, c.repeat_runs), (0, 1));
        assert_eq!(c.arrivals.submit_schedule, SubmitSchedule::Absolute);
        assert_eq!(c.arrivals.requested_rate_rps(), None);
    }

    #[test]
    fn rejects_bad_values_naming_the_flag() {
        assert_eq!(
            flag_of(&["--submit-interval-ms", "-5"]),
            "--submit-interval-ms"
        );
        assert_eq!(
            flag_of(&["--submit-interval-ms", "NaN"]),
            "--submit-interval-ms"
        );
        assert_eq!(flag_of(&["--num-requests", "0"]), "--num-requests");
        assert_eq!(flag_of(&["--repeat-runs", "0"]), "--repeat-runs");
        assert_eq!(flag_of(&["--channels", "0"]), "--channels");
        assert_eq!(flag_of(&["--max-concurrency", "0"]), "--max-concurrency");
        assert_eq!(flag_of(&["--max-new-tokens", "0"]), "--max-new-tokens");
        assert_eq!(flag_of(&["--prompt-repeats", "0"]), "--prompt-repeats");
        assert_eq!(flag_of(&["--timeout", "0"]), "--timeout");
        assert_eq!(flag_of(&["--start-at", "NaN"]), "--start-at");
        let in_ms = format!("{}", crate::measure::clock::unix_now() * 1e3);
        assert_eq!(flag_of(&["--start-at", &in_ms]), "--start-at");
        assert!(check_start_at(1_000.5, 1_000.0).is_ok());
        assert!(check_start_at(-1.0, 1_000_000.0).is_err());
        assert_eq!(flag_of(&["--arrival", "poisson"]), "--request-rate");
        assert_eq!(
            flag_of(&["--arrival", "poisson", "--request-rate", "0"]),
            "--request-rate"
        );
        assert_eq!(
            flag_of(&["--arrival", "poisson", "--request-rate", "-2"]),
            "--request-rate"
        );
        assert_eq!(flag_of(&["--request-rate", "5"]), "--request-rate");
        assert_eq!(
            flag_of(&[
                "--arrival",
                "poisson",
                "--request-rate",
                "5",
                "--submit-schedule",
                "relative"
            ]),
            "--submit-schedule"
        );
        assert_eq!(flag_of(&["--temperature", "-1"]), "--temperature");
        assert_eq!(flag_of(&["--top-p", "0"]), "--top-p");
        assert_eq!(flag_of(&["--top-k", "-1"]), "--top-k");
        assert_eq!(flag_of(&["--min-p", "1.5"]), "--min-p");
        assert_eq!(flag_of(&["--min-p", "-0.1"]), "--min-p");
        assert_eq!(flag_of(&["--spawn-server"]), "--target");
        assert_eq!(flag_of(&["--", "--preset", "tiny"]), "--spawn-server");
    }

    #[test]
    fn rejects_bad_new_flags_naming_the_flag() {
        assert_eq!(flag_of(&["--arrival", "gamma"]), "--request-rate");
        assert_eq!(
            flag_of(&[
                "--arrival",
                "gamma",
                "--request-rate",
                "5",
                "--burstiness",
                "0"
            ]),
            "--burstiness"
        );
        assert_eq!(flag_of(&["--arrival", "trace"]), "--arrival");
        assert_eq!(
            flag_of(&[
                "--arrival",
                "trace",
                "--dataset",
                "x",
                "--trace-time-scale",
                "0"
            ]),
            "--trace-time-scale"
        );
        assert_eq!(flag_of(&["--sweep-rates", "2,0"]), "--sweep-rates");
        assert_eq!(
            flag_of(&["--sweep-rates", "2", "--request-rate", "3"]),
            "--request-rate"
        );
        assert_eq!(
            flag_of(&["--sweep", "auto", "--sweep-rates", "2"]),
            "--sweep"
        );
        assert_eq!(
            flag_of(&["--sweep", "auto", "--submit-schedule", "relative"]),
            "--sweep"
        );
        assert_eq!(
            flag_of(&["--sweep-rates", "2", "--submit-interval-ms", "5"]),
            "--submit-interval-ms"
        );
        assert_eq!(
            flag_of(&["--sweep-rates", "2", "--slo-min-share", "0"]),
            "--slo-min-share"
        );
        assert_eq!(
            flag_of(&["--max-submit-lag-ms", "0"]),
            "--max-submit-lag-ms"
        );
        assert_eq!(
            flag_of(&["--progress-interval-s", "0"]),
            "--progress-interval-s"
        );
        assert_eq!(
            flag_of(&["--dataset", "x", "--input-len", "5"]),
            "--input-len"
        );
        assert!(
            parse(&["--slo", "ttft=fast"]).is_err(),
            "clap rejects a bad --slo"
        );
        assert!(parse(&["--input-len", "uniform:9..2"]).is_err());
        let ok = parse(&[
            "--sweep-rates",
            "2,4",
            "--arrival",
            "gamma",
            "--slo",
            "ttft=200ms",
        ])
        .expect("parses");
        ok.validate()
            .expect("a gamma sweep needs no --request-rate");
        assert_eq!(ok.sweep.sweep_rates, vec![2.0, 4.0]);
    }

    #[test]
    fn needs_a_target_or_spawn_server() {
        let args = Args::try_parse_from(["loadgen"]).expect("parses");
        assert!(matches!(
            args.validate(),
            Err(Error::InvalidArgument {
                flag: "--target",
                ..
            })
        ));
        let args = Args::try_parse_from(["loadgen", "--spawn-server", "--", "--preset", "tiny"])
            .expect("parses");
        args.validate().expect("valid");
        assert_eq!(args.server_args, vec!["--preset", "tiny"]);
    }

    #[test]
    fn poisson_and_fixed_rates() {
        let rate = |extra: &[&str]| {
            let (c, _) = parse(extra).expect("parses").validate().expect("valid");
            c.arrivals.requested_rate_rps()
        };
        assert_eq!(
            rate(&["--arrival", "poisson", "--request-rate", "7.5"]),
            Some(7.5)
        );
        assert_eq!(rate(&["--submit-interval-ms", "250"]), Some(4.0));
        assert_eq!(
            rate(&[
                "--submit-interval-ms",
                "250",
                "--submit-schedule",
                "relative",
            ]),
            None
        );
    }

    #[test]
    fn targets_are_normalized_and_repeatable() {
        let args = parse(&["--target", "http://b:2,c:3"]).expect("parses");
        assert_eq!(
            args.conn.urls(),
            vec!["http://127.0.0.1:1", "http://b:2", "http://c:3"]
        );
    }

    #[test]
    fn rejects_bad_connection_flags_naming_the_flag() {
        let openai = |extra: &[&str]| {
            let mut argv = vec!["loadgen", "--backend", "openai", "--base-url", "http://h:1"];
            argv.extend_from_slice(extra);
            match Args::try_parse_from(argv).map(|a| a.validate().map(|_| ())) {
                Ok(Err(Error::InvalidArgument { flag, .. })) => flag,
                other => panic!("{extra:?}: expected a validation error, got {other:?}"),
            }
        };
        assert_eq!(openai(&["--target", "h:2"]), "--target");
        assert_eq!(openai(&["--channels", "2"]), "--channels");
        assert_eq!(openai(&["--api-key", ""]), "--api-key");
        assert_eq!(openai(&["--tls-ca", "/no/such.pem"]), "--tls-ca");
        assert_eq!(openai(&["--spawn-server"]), "--spawn-server");
        assert_eq!(openai(&["--endpoint", "chat", "--pretok"]), "--pretok");
        assert_eq!(flag_of(&["--base-url", "http://h:1"]), "--base-url");
        assert_eq!(flag_of(&["--model", "m"]), "--model");
        assert_eq!(flag_of(&["--http", "2"]), "--http");
        assert_eq!(flag_of(&["--endpoint", "chat"]), "--endpoint");
        assert_eq!(flag_of(&["--target", "ftp://x:1"]), "--target");
        assert!(parse(&["--balance", "random"]).is_err(), "clap rejects it");
        assert!(parse(&["--backend", "vllm"]).is_err(), "clap rejects it");
        let ok = Args::try_parse_from([
            "loadgen",
            "--backend",
            "openai",
            "--base-url",
            "https://a:1/v1,b:2",
            "--http",
            "2",
            "--channels",
            "3",
            "--balance",
            "least",
            "--api-key",
            "k",
        ])
        .expect("parses");
        ok.validate().expect("valid");
        assert_eq!(ok.conn.urls(), vec!["https://a:1/v1", "http://b:2"]);
        let json = serde_json::to_string(&ok).expect("serializes");
        assert!(json.contains("\"api_key\":\"<redacted>\""), "{json}");
        assert!(
            !json.contains("\"k\""),
            "the key never reaches the outputs: {json}"
        );
    }
}
