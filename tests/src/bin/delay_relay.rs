//! `delay_relay --listen ADDR --upstream ADDR --delay-ms D`
//!
//! A TCP relay that forwards every chunk `D` ms after it was read, in each
//! direction (see `ember_tests::relay`). Prints `listening on ADDR` (the bound
//! address; port 0 picks one) as its first stdout line. Runs until killed.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use std::io::Write;

fn parse() -> anyhow::Result<(String, SocketAddr, Duration)> {
    let mut listen = None;
    let mut upstream = None;
    let mut delay = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "--listen" => listen = Some(value("--listen")?),
            "--upstream" => upstream = Some(value("--upstream")?.parse().context("--upstream")?),
            "--delay-ms" => {
                let ms: f64 = value("--delay-ms")?.parse().context("--delay-ms")?;
                if !(ms >= 0.0 && ms.is_finite()) {
                    bail!("--delay-ms must be a finite number >= 0");
                }
                delay = Some(Duration::from_secs_f64(ms / 1000.0));
            }
            "-h" | "--help" => {
                println!("usage: delay_relay --listen ADDR --upstream ADDR --delay-ms D");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}"),
        }
    }
    Ok((
        listen.context("--listen is required")?,
        upstream.context("--upstream is required")?,
        delay.context("--delay-ms is required")?,
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (listen, upstream, delay) = parse()?;
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("bind {listen}"))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on {}", listener.local_addr()?)?;
    out.flush()?;
    drop(out);
    eprintln!(
        "delay_relay: {} -> {upstream}, {delay:?} each way",
        listener.local_addr()?
    );
    ember_tests::relay::serve(listener, upstream, delay).await?;
    Ok(())
}
