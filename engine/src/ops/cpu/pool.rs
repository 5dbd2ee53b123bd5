//! Where a CPU forward pass runs: on a thread of the rayon pool that the CPU
//! kernels fork onto.
//!
//! The engine's thread is not one of the pool's. A parallel loop started
//! from outside the pool is injected into it as a job, and the caller sleeps
//! on a latch until a worker has run it: a wake-up there and back, about
//! 12 us per loop on the 2-core dev machine (61 loops in a decode step: 49
//! projections and 12 attentions). Started from a worker, the same loop is a
//! `join` on the worker's own deque (about half a microsecond). So a CPU
//! pass is moved onto the pool once, with [`on_pool`], and the engine's
//! thread sleeps once per pass instead.

use burn::prelude::*;

/// Runs `pass` on a rayon worker (at once if this thread is one) and
/// returns its result; the calling thread waits.
pub fn on_pool<R: Send>(pass: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return pass();
    }
    rayon::scope(|_| pass())
}

/// Whether `device` is the CPU (Flex), where [`on_pool`] pays off.
pub fn is_cpu(device: &Device) -> bool {
    matches!(device.as_dispatch(), burn::backend::DispatchDevice::Flex(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pass_runs_on_a_pool_thread_and_returns_its_value() {
        assert_eq!(rayon::current_thread_index(), None);
        let (index, value) = on_pool(|| (rayon::current_thread_index(), 7));
        assert!(index.is_some());
        assert_eq!(value, 7);
        // From a worker it runs in place.
        let nested = on_pool(|| {
            let outer = rayon::current_thread_index();
            on_pool(|| rayon::current_thread_index() == outer)
        });
        assert!(nested);
    }

    #[test]
    fn flex_is_the_cpu() {
        assert!(is_cpu(&Device::flex()));
    }
}
