//! Two network namespaces joined by a veth pair: a "server host" and a
//! "client host" on one machine.
//!
//! Names are unique per process and per pair (`ember-srv-<pid>-<n>`,
//! `ember-cli-<pid>-<n>`) so tests running in parallel threads never share
//! one. The veth ends are created directly inside the namespaces, so the
//! host's own namespace gains no interface, address or route. Addresses are in
//! 10.203.<x>.0/30 (x from pid and n); they are only reachable from inside the
//! two namespaces. Dropping the pair deletes both namespaces, which also
//! removes the veth pair. Stop the processes running inside first (declare the
//! pair before them, so it drops after them).
//!
//! Needs root and iproute2's `ip netns`. [`NetnsPair::create_or_skip`] turns a
//! failure into a loud panic unless `EMBER_SKIP_NETNS=1`.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{bail, Context};

/// The env switch that skips namespace tests explicitly.
pub const SKIP_ENV: &str = "EMBER_SKIP_NETNS";

/// A pair of namespaces with a veth link between them.
pub struct NetnsPair {
    /// Namespace of the "server host".
    pub server_ns: String,
    /// Namespace of the "client host".
    pub client_ns: String,
    /// Server end of the veth (in `server_ns`).
    pub server_ip: Ipv4Addr,
    /// Client end of the veth (in `client_ns`).
    pub client_ip: Ipv4Addr,
    /// Namespaces created so far, deleted on drop.
    created: Vec<String>,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running `ip` (is iproute2 installed?)")?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl NetnsPair {
    /// Creates the pair, or fails with the reason.
    pub fn create() -> anyhow::Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let server_ns = format!("ember-srv-{pid}-{n}");
        let client_ns = format!("ember-cli-{pid}-{n}");
        // Interface names: at most 15 bytes ("e" + pid <= 7 digits + "s" + n).
        let veth_srv = format!("e{pid}s{n}");
        let veth_cli = format!("e{pid}c{n}");
        let x = (pid.wrapping_mul(7).wrapping_add(n)) % 250 + 1;
        let server_ip = Ipv4Addr::new(10, 203, x as u8, 1);
        let client_ip = Ipv4Addr::new(10, 203, x as u8, 2);
        let mut pair = NetnsPair {
            server_ns,
            client_ns,
            server_ip,
            client_ip,
            created: Vec::new(),
        };
        for ns in [pair.server_ns.clone(), pair.client_ns.clone()] {
            // A namespace of this name can only be left over from a crashed
            // run whose pid we now have again: remove it.
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
            ip(&["netns", "add", &ns])?;
            pair.created.push(ns.clone());
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        let (s, c) = (&pair.server_ns, &pair.client_ns);
        ip(&[
            "link", "add", &veth_srv, "netns", s, "type", "veth", "peer", "name", &veth_cli,
            "netns", c,
        ])?;
        ip(&[
            "-n",
            s,
            "addr",
            "add",
            &format!("{server_ip}/30"),
            "dev",
            &veth_srv,
        ])?;
        ip(&[
            "-n",
            c,
            "addr",
            "add",
            &format!("{client_ip}/30"),
            "dev",
            &veth_cli,
        ])?;
        ip(&["-n", s, "link", "set", &veth_srv, "up"])?;
        ip(&["-n", c, "link", "set", &veth_cli, "up"])?;
        Ok(pair)
    }

    /// Creates the pair; if that is impossible, panics with the reason, unless
    /// `EMBER_SKIP_NETNS=1`, in which case it says so and returns `None`.
    pub fn create_or_skip(test: &str) -> Option<Self> {
        if std::env::var(SKIP_ENV).as_deref() == Ok("1") {
            eprintln!("SKIPPED EXPLICITLY: {test} (network namespace test) because {SKIP_ENV}=1");
            return None;
        }
        match Self::create() {
            Ok(p) => Some(p),
            Err(e) => panic!(
                "{test}: cannot create network namespaces: {e:#}\n\
                 This test needs root and `ip netns` (iproute2). It does not pass silently: \
                 set {SKIP_ENV}=1 to skip it explicitly."
            ),
        }
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for ns in self.created.drain(..) {
            if let Err(e) = ip(&["netns", "del", &ns]) {
                eprintln!("warning: {e:#}");
            }
        }
    }
}

/// Moves the calling thread into network namespace `name` (setns(2)). Only
/// this thread moves; threads it spawns afterwards start in `name` too.
pub fn enter(name: &str) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let path = format!("/var/run/netns/{name}");
    let f = std::fs::File::open(&path).with_context(|| format!("open {path}"))?;
    // SAFETY: setns(2) on a valid namespace fd; affects only this thread.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        bail!("setns({path}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}
