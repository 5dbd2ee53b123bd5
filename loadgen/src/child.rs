//! The two things every "start a server as a child" helper needs, in one
//! place: reading its `listening on ADDR` line and signalling it.
//!
//! `ember-server`, `delay_relay` and `loadgen mock` all print exactly
//! `listening on <ip:port>` as their first stdout line when given port 0.
//! Users: [`spawn`](crate::spawn) (`--spawn-server`) and the `ember-tests`
//! process helper.

use std::net::{Ipv4Addr, SocketAddr};

/// The first stdout line's prefix.
pub const LISTENING_PREFIX: &str = "listening on ";

/// The address of a `listening on ADDR` line; an unspecified IP (0.0.0.0)
/// becomes loopback. `None` if the line is something else.
pub fn parse_listening(line: &str) -> Option<Result<SocketAddr, String>> {
    let text = line.strip_prefix(LISTENING_PREFIX)?;
    Some(
        text.trim()
            .parse::<SocketAddr>()
            .map(|mut addr| {
                if addr.ip().is_unspecified() {
                    addr.set_ip(Ipv4Addr::LOCALHOST.into());
                }
                addr
            })
            .map_err(|e| format!("cannot parse the address in `{line}`: {e}")),
    )
}

/// Sends `sig` (e.g. `libc::SIGTERM`) to process `pid`. The caller must own
/// the child and not have reaped it, so the pid cannot have been reused.
#[cfg(unix)]
pub fn signal(pid: u32, sig: i32) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: kill(2) takes plain integers and has no memory effects.
    let rc = unsafe { libc::kill(pid, sig) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// SIGTERM: the graceful stop (the server drains).
#[cfg(unix)]
pub fn sigterm(pid: u32) -> std::io::Result<()> {
    signal(pid, libc::SIGTERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_lines() {
        let ok = |l: &str| {
            parse_listening(l)
                .expect("a listening line")
                .expect("parses")
                .to_string()
        };
        assert_eq!(ok("listening on 127.0.0.1:5000"), "127.0.0.1:5000");
        assert_eq!(ok("listening on 0.0.0.0:7 "), "127.0.0.1:7");
        assert!(parse_listening("listening on nonsense")
            .expect("a listening line")
            .is_err());
        assert!(parse_listening("INFO starting").is_none());
    }

    #[cfg(unix)]
    #[test]
    fn signal_reaches_a_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        sigterm(child.id()).expect("SIGTERM");
        let status = child.wait().expect("wait");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
    }
}
