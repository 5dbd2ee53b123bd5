//! `loadgen mock`'s flags: serve the mock server on its own
//! (`modes::mock`). Validation builds what it serves.

use std::time::Duration;

use clap::Parser;
use ember_testkit::mock::MockConfig;

use crate::error::Error;
use crate::modes::mock::{self as runner, Announce, MockServe};

/// Serve the mock Ember server (gRPC and OpenAI HTTP) with known timings.
#[derive(Debug, Clone, Parser)]
#[command(name = "loadgen mock")]
pub struct MockArgs {
    /// Address of the gRPC door (port 0 picks one).
    #[arg(long, env = "LOADGEN_MOCK_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Address of the OpenAI HTTP door (port 0 picks one).
    #[arg(long, env = "LOADGEN_MOCK_HTTP_LISTEN", default_value = "127.0.0.1:0")]
    pub http_listen: String,
    /// Which door's address is on the first stdout line (`listening on ADDR`).
    #[arg(long, env = "LOADGEN_MOCK_ANNOUNCE", value_enum, default_value_t = Announce::Grpc)]
    pub announce: Announce,
    /// Time to first token after admission, ms.
    #[arg(long, env = "LOADGEN_MOCK_TTFT_MS", default_value_t = 50.0)]
    pub ttft_ms: f64,
    /// Inter-token latency, ms.
    #[arg(long, env = "LOADGEN_MOCK_ITL_MS", default_value_t = 10.0)]
    pub itl_ms: f64,
    /// Requests generating at once; more wait in a queue (unset: no limit).
    #[arg(long, env = "LOADGEN_MOCK_SLOTS")]
    pub slots: Option<usize>,
    /// Require `authorization: Bearer KEY` on both doors.
    #[arg(long, env = "LOADGEN_MOCK_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// HTTP: leave out Ember's extension fields (a plain OpenAI server).
    #[arg(long, env = "LOADGEN_MOCK_NO_EMBER_FIELDS")]
    pub no_ember_fields: bool,
    /// HTTP: never send `usage` (the client must count chunks).
    #[arg(long, env = "LOADGEN_MOCK_NO_USAGE")]
    pub no_usage: bool,
}

impl MockArgs {
    /// Checks the flags (the error names the flag); what to serve.
    pub fn validate(&self) -> Result<MockServe, Error> {
        let args = self;
        for (flag, v) in [("--ttft-ms", args.ttft_ms), ("--itl-ms", args.itl_ms)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(Error::invalid(flag, format!("must be >= 0 (got {v})")));
            }
        }
        if args.slots == Some(0) {
            return Err(Error::invalid("--slots", "must be >= 1"));
        }
        let cfg = MockConfig {
            ttft: Duration::from_secs_f64(args.ttft_ms / 1e3),
            itl: Duration::from_secs_f64(args.itl_ms / 1e3),
            slots: args.slots,
            api_key: args.api_key.clone(),
            ember_fields: !args.no_ember_fields,
            usage: !args.no_usage,
            ..MockConfig::default()
        };
        Ok(MockServe {
            listen: args.listen.clone(),
            http_listen: args.http_listen.clone(),
            announce: args.announce,
            mock: cfg,
        })
    }

    /// Serves the mock until ctrl-c or SIGTERM.
    pub async fn serve(self) -> Result<(), Error> {
        runner::serve(self.validate()?).await
    }
}
