//! Panics the caller expects and handles.
//!
//! Burn's backends report some failures by panicking (a CUDA driver that
//! cannot load, a kernel that does not compile), sometimes on their own
//! runner thread rather than the caller's. Code that catches such panics and
//! turns them into errors (the device probe, the scheduler's guarded engine
//! steps) runs inside [`expecting_panics`]; the process's panic hook (the
//! server's logging) asks [`panics_expected`] to log those as warnings rather
//! than errors. The counter is process-wide for the runner-thread case.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many [`expecting_panics`] calls are running.
static PANICS_EXPECTED: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` (which catches its own panics and reports the failure) with any
/// panic meanwhile counted as expected (see [`panics_expected`]).
pub fn expecting_panics<T>(f: impl FnOnce() -> T) -> T {
    /// Ends the expectation however `f` ends.
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            PANICS_EXPECTED.fetch_sub(1, Ordering::SeqCst);
        }
    }
    PANICS_EXPECTED.fetch_add(1, Ordering::SeqCst);
    let _done = Done;
    f()
}

/// Whether some caller is handling panics right now (a panic hook logs them
/// as warnings then).
pub fn panics_expected() -> bool {
    PANICS_EXPECTED.load(Ordering::SeqCst) > 0
}

/// The message of a caught panic's payload (`panic!` with a string or a
/// format), or a placeholder.
pub fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("a panic without a message")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expectation_ends_with_the_call_even_when_it_panics() {
        assert!(!panics_expected());
        let caught = expecting_panics(|| {
            assert!(panics_expected());
            std::panic::catch_unwind(|| panic!("boom {}", 1))
        });
        assert_eq!(panic_message(caught.unwrap_err().as_ref()), "boom 1");
        assert!(!panics_expected());
    }
}
