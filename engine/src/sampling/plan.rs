//! [`StepPlan`]: how a step chooses its tokens, decided once from its
//! sampling table when the table is written
//! ([`super::sampler::SamplingParamsRows::write`]); everything after reads
//! it (which graph ending a replayed step takes, whether the graph's choice
//! stands, whether a captured choice half serves, whether penalty counts the
//! graph took are taken back), and nothing else decides.
//!
//! One route serves a whole step: the sampling kernel treats greedy and
//! sampled rows alike, so rows never need routes of their own.

/// How a step's tokens are chosen (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Every row takes the argmax of the raw logits: greedy, nothing changes
    /// its logits, no device penalty. A replayed step's `plain` ending (its
    /// argmax stands), else `argmax_rows`.
    Argmax,
    /// The sampling kernel chooses every row from the raw logits (sampling,
    /// masks and device penalty counts in one launch): a replayed step's
    /// `sampled` ending, a captured choice half, else one eager launch.
    Kernel,
    /// Some rows' logits take host edits first (`logit_bias`, penalties kept
    /// as edits); then the kernel chooses every row again, and the counts a
    /// replayed step's kernel already added for penalized rows are taken back.
    EditsThenKernel,
    /// No sampling kernel (the CPU, `--device-sampler false`): host edits
    /// where asked, then the host row sampler.
    Host,
}

/// What a step asked beyond plain choices (its trace).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepOptions {
    /// A row's penalties come from a device penalty slot.
    pub device_penalties: bool,
    /// A row has a mask (an allowed set, or tokens banned before
    /// `min_tokens`) the kernel applies.
    pub masked: bool,
    /// A row's logits take host edits.
    pub host_edits: bool,
}

/// A step's route and options (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepPlan {
    pub route: Route,
    pub options: StepOptions,
}

impl StepPlan {
    /// An all-greedy step without options.
    pub const ARGMAX: StepPlan = StepPlan {
        route: Route::Argmax,
        options: StepOptions {
            device_penalties: false,
            masked: false,
            host_edits: false,
        },
    };

    /// The plan of a step where every row takes the raw argmax or not
    /// (`argmax_only`), with `options`, where the sampling kernel runs or not.
    pub fn new(kernel: bool, argmax_only: bool, options: StepOptions) -> Self {
        let route = match (argmax_only, kernel, options.host_edits) {
            (true, _, _) => Route::Argmax,
            (false, false, _) => Route::Host,
            (false, true, true) => Route::EditsThenKernel,
            (false, true, false) => Route::Kernel,
        };
        Self { route, options }
    }

    /// Whether the kernel alone chooses every row from the raw logits (a
    /// captured choice half serves the step).
    pub fn kernel_alone(&self) -> bool {
        self.route == Route::Kernel
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_route_per_step_from_the_table_and_the_device() {
        let plain = StepOptions::default();
        let edits = StepOptions {
            host_edits: true,
            ..plain
        };
        assert_eq!(StepPlan::new(true, true, plain), StepPlan::ARGMAX);
        assert_eq!(StepPlan::new(false, true, plain).route, Route::Argmax);
        assert_eq!(StepPlan::new(true, false, plain).route, Route::Kernel);
        assert_eq!(
            StepPlan::new(true, false, edits).route,
            Route::EditsThenKernel
        );
        assert_eq!(StepPlan::new(false, false, plain).route, Route::Host);
        assert_eq!(StepPlan::new(false, false, edits).route, Route::Host);
        assert!(StepPlan::new(true, false, plain).kernel_alone());
        assert!(!StepPlan::new(true, false, edits).kernel_alone());
    }
}
