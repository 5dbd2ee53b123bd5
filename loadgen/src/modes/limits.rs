//! The process's open-file limit. Every HTTP/1.1 stream in flight holds a
//! socket, so thousands of concurrent streams need thousands of file
//! descriptors: at start loadgen raises its soft limit to the hard one (what
//! a user would do with `ulimit -n`), and `calibrate` checks the limit before
//! it opens more sockets than that.

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit
/// in force afterwards (`None` where there is no such limit).
#[cfg(unix)]
pub fn raise_open_files() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    Some(lim.rlim_cur)
}

/// No such limit off Unix.
#[cfg(not(unix))]
pub fn raise_open_files() -> Option<u64> {
    None
}

/// The soft open-file limit now.
#[cfg(unix)]
pub fn open_files() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    (rc == 0).then_some(lim.rlim_cur)
}

/// No such limit off Unix.
#[cfg(not(unix))]
pub fn open_files() -> Option<u64> {
    None
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn raising_reaches_the_hard_limit() {
        let after = raise_open_files().expect("a limit");
        assert_eq!(open_files(), Some(after));
        assert!(after >= 256, "{after}");
    }
}
