//! Which kernel runs each projection shape, and the cache of per-shape GEMM
//! plans: the host side of the GEMM choice, pure and tested on any machine.
//!
//! On CUDA a projection `[rows, k] x [n, k]^T` can run on three families:
//! Ember's decode kernels (the GEMV, the tensor-core kernel; shapes from
//! [`super::plan::linear`]), cuBLASLt (`super::cuda::cublaslt`), or CubeCL's
//! matmul (the fallback when libcublasLt is missing). Which one is fastest
//! depends on the GPU, so it is not a constant: the warmup times the
//! candidates of every decode bucket's shapes on the device and records the
//! winner here ([`LinearChoices::record`]); shapes nobody measured (prefill
//! sizes) take the rule in [`LinearChoices::choose`].
//!
//! [`PlanCache`] keeps whatever a GEMM library needs per shape (descriptors,
//! the chosen algorithm) once made, keyed by [`GemmKey`].

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use super::plan::LinearPlan;

/// A kernel that can run a projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinearKernel {
    /// Ember's decode kernels, with their launch plan (never `Matmul`).
    Ember(LinearPlan),
    /// cuBLASLt, epilogue included.
    Lt,
    /// Burn's matmul on the transposed weight view, then the epilogue as
    /// tensor ops.
    Matmul,
}

/// A projection's shape: `rows` x `k` times `n` x `k` transposed; `lm_head`
/// marks the tied LM head (its own row cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinearShape {
    pub rows: usize,
    pub n: usize,
    pub k: usize,
    pub lm_head: bool,
}

/// The kernel each projection shape runs with (see the module docs). Shared
/// by every copy of the ops (a captured graph keeps one), written only by the
/// warmup.
#[derive(Debug, Clone, Default)]
pub struct LinearChoices {
    measured: Arc<RwLock<HashMap<LinearShape, LinearKernel>>>,
}

impl LinearChoices {
    /// The kernel for `shape`: the measured winner if the warmup timed it;
    /// otherwise Ember's kernel where `planned` names one, else cuBLASLt when
    /// `lt` is available, else the matmul.
    pub fn choose(&self, shape: LinearShape, planned: LinearPlan, lt: bool) -> LinearKernel {
        let measured = self
            .measured
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&shape)
            .copied();
        match (measured, planned, lt) {
            (Some(kernel), _, _) => kernel,
            (None, LinearPlan::Matmul, true) => LinearKernel::Lt,
            (None, LinearPlan::Matmul, false) => LinearKernel::Matmul,
            (None, plan, _) => LinearKernel::Ember(plan),
        }
    }

    /// Records the kernel the warmup measured fastest for `shape`.
    pub fn record(&self, shape: LinearShape, kernel: LinearKernel) {
        self.measured
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(shape, kernel);
    }

    /// Every measured shape and its kernel, sorted (for the startup log and
    /// the benchmark's report).
    pub fn measured(&self) -> Vec<(LinearShape, LinearKernel)> {
        let mut all: Vec<_> = self
            .measured
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(s, k)| (*s, *k))
            .collect();
        all.sort_by_key(|(s, _)| (s.lm_head, s.n, s.k, s.rows));
        all
    }
}

/// What a GEMM library call computes after the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmEpilogue {
    None,
    Bias,
    GeluBias,
    Gelu,
}

impl GemmEpilogue {
    pub fn of(bias: bool, gelu: bool) -> Self {
        match (bias, gelu) {
            (false, false) => Self::None,
            (true, false) => Self::Bias,
            (true, true) => Self::GeluBias,
            (false, true) => Self::Gelu,
        }
    }
}

/// One GEMM plan's key: `D[m, n] = X[m, k] W[n, k]^T (+ residual)`, its
/// epilogue, and whether a residual is added (`beta = 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmKey {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub epilogue: GemmEpilogue,
    pub residual: bool,
}

/// Plans made once per [`GemmKey`] (descriptors, the chosen algorithm).
#[derive(Debug)]
pub struct PlanCache<P> {
    plans: HashMap<GemmKey, P>,
    /// Lookups that found a plan.
    pub hits: u64,
    /// Plans made.
    pub misses: u64,
}

impl<P> Default for PlanCache<P> {
    fn default() -> Self {
        Self {
            plans: HashMap::new(),
            hits: 0,
            misses: 0,
        }
    }
}

impl<P> PlanCache<P> {
    /// The plan for `key`, made with `make` the first time; a failed make is
    /// not cached (the next call tries again).
    pub fn get_or_make<E>(
        &mut self,
        key: GemmKey,
        make: impl FnOnce(&GemmKey) -> Result<P, E>,
    ) -> Result<&P, E> {
        match self.plans.entry(key) {
            Entry::Occupied(found) => {
                self.hits += 1;
                Ok(found.into_mut())
            }
            Entry::Vacant(slot) => {
                let plan = make(&key)?;
                self.misses += 1;
                Ok(slot.insert(plan))
            }
        }
    }

    pub fn len(&self) -> usize {
        self.plans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(rows: usize) -> LinearShape {
        LinearShape {
            rows,
            n: 768,
            k: 3072,
            lm_head: false,
        }
    }

    #[test]
    fn unmeasured_shapes_follow_the_plan_then_cublaslt() {
        let c = LinearChoices::default();
        let gemv = LinearPlan::Gemv;
        assert_eq!(c.choose(shape(1), gemv, true), LinearKernel::Ember(gemv));
        assert_eq!(
            c.choose(shape(4096), LinearPlan::Matmul, true),
            LinearKernel::Lt
        );
        assert_eq!(
            c.choose(shape(4096), LinearPlan::Matmul, false),
            LinearKernel::Matmul
        );
    }

    #[test]
    fn a_measured_winner_overrides_the_rule_for_that_shape_only() {
        let c = LinearChoices::default();
        let copy = c.clone(); // a captured graph's copy sees later records
        c.record(shape(8), LinearKernel::Lt);
        assert_eq!(
            copy.choose(shape(8), LinearPlan::Gemv, true),
            LinearKernel::Lt
        );
        assert_eq!(
            copy.choose(shape(16), LinearPlan::Gemv, true),
            LinearKernel::Ember(LinearPlan::Gemv)
        );
        assert_eq!(copy.measured(), [(shape(8), LinearKernel::Lt)]);
    }

    #[test]
    fn plans_are_made_once_per_key_and_failures_are_retried() {
        let mut cache = PlanCache::<u32>::default();
        let key = |m| GemmKey {
            m,
            n: 2304,
            k: 768,
            epilogue: GemmEpilogue::of(true, false),
            residual: false,
        };
        let mut made = 0;
        for _ in 0..3 {
            let p = cache
                .get_or_make(key(16), |k| -> Result<u32, ()> {
                    made += 1;
                    Ok(k.m as u32)
                })
                .unwrap();
            assert_eq!(*p, 16);
        }
        assert_eq!((made, cache.hits, cache.misses, cache.len()), (1, 2, 1, 1));
        assert!(cache
            .get_or_make(key(32), |_| Err::<u32, _>("no algorithm"))
            .is_err());
        assert_eq!(cache.len(), 1, "a failed plan is not cached");
        assert_eq!(*cache.get_or_make(key(32), |_| Ok::<_, ()>(7)).unwrap(), 7);
        assert_eq!(GemmEpilogue::of(true, true), GemmEpilogue::GeluBias);
        assert_eq!(GemmEpilogue::of(false, true), GemmEpilogue::Gelu);
    }
}
