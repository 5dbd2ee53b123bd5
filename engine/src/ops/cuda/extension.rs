//! How a kernel becomes a Burn backend extension: `cuda_kernel!`, the one
//! declaration each kernel file writes beside its `launch`, and the helpers
//! its generated code calls.
//!
//! A `Tensor` on Burn's CUDA device (behind fusion) reaches a CubeCL launch
//! through a backend extension: a trait over `Backend` marked
//! `#[backend_extension(Cube, Fusion)]` (Burn's macro generates its
//! `Dispatch` and `Fusion` implementations), implemented for `CubeBackend`
//! by a method that makes the inputs contiguous and calls the launch, and
//! reached from plain tensors through `Dispatch` (`into_dispatch` in,
//! `from_dispatch` out). `cuda_kernel!` writes all three from one
//! argument list, so a kernel's arguments are written once (in its own
//! file, `super::kernels` and `super::cublaslt::gemm`), and each kernel is
//! its own one-method extension trait.
//!
//! An operand that may be absent crosses the extension as a tensor (an
//! unread stand-in when absent) and a flag, because an extension method
//! takes only tensors and plain values: [`Operand`] builds the pair on the
//! tensor side, and the `CubeBackend` side turns it back into an `Option`
//! for the launch, which picks its own stand-in where its `#[cube]` kernel
//! needs one (`super::launch::or_stand_in`). Every knob arrives as a plain
//! argument (launch shapes are planned by the caller, `crate::ops::plan`).

use burn::backend::DispatchTensor;
use burn::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;

/// Declares one CUDA kernel, once: its argument list gives the backend
/// extension trait (with the `#[fusion(..)]` metadata, for Burn's
/// `#[backend_extension(Cube, Fusion)]`), its implementation for
/// `CubeBackend`, which calls the `launch` function in scope, and the
/// function of plain `Tensor`s that the ops call.
///
/// ```ignore
/// cuda_kernel! {
///     /// Doc comments: on the trait method and on the tensor function.
///     #[fusion(dtype = seeds, shape = { let [b, _] = logits.dims::<2>(); Shape::new([b, 1]) })]
///     pub fn SampleRows::sample_rows(
///         logits: Tensor<2>,                    // a float tensor, made contiguous
///         seeds: Tensor<1, Int>,                // an int tensor, made contiguous
///         #[in_place] counters: Tensor<1, Int>, // as it is (written in place)
///         #[optional(flag = has_bias, stand_in = logits)] bias: Option<Tensor<2>>,
///         temperature: f32,                     // a plain value (one identifier)
///     ) -> Tensor<2, Int>
/// }
/// ```
///
/// generates, in the invoking module (paths shortened):
///
/// ```ignore
/// #[burn::backend::backend_extension(Cube, Fusion)]
/// pub trait SampleRows: burn::backend::Backend {
///     #[fusion(dtype = seeds, shape = { let [b, _] = logits.dims::<2>(); Shape::new([b, 1]) })]
///     fn sample_rows(logits: FloatTensor<Self>, seeds: IntTensor<Self>,
///         counters: IntTensor<Self>, bias: FloatTensor<Self>, has_bias: bool,
///         temperature: f32) -> IntTensor<Self>;
/// }
/// impl SampleRows for CubeBackend {
///     fn sample_rows(/* the same parameters */) -> IntTensor<Self> {
///         let logits = contiguous(logits);
///         let seeds = contiguous(seeds);
///         let counters = in_place(counters);
///         let bias = has_bias.then(|| contiguous(bias));
///         launch(logits, seeds, counters, bias, temperature)
///     }
/// }
/// pub fn sample_rows(logits: Tensor<2>, seeds: Tensor<1, Int>, counters: Tensor<1, Int>,
///     bias: Option<Tensor<2>>, temperature: f32) -> Tensor<2, Int> {
///     let bias = Operand::new(bias.map(Tensor::into_dispatch), || logits.clone().into_dispatch());
///     KernelOutput::wrap(<Dispatch as SampleRows>::sample_rows(logits.into_dispatch(),
///         seeds.into_dispatch(), counters.into_dispatch(), bias.tensor, bias.present,
///         temperature))
/// }
/// ```
///
/// so the kernel file's `launch` takes, in declaration order, a
/// `CubeTensor` per tensor ([`contiguous`] unless `#[in_place]`), an
/// `Option<CubeTensor>` per optional operand (the same, when present) and
/// each plain value as it is, and returns a `CubeTensor` (or a tuple of
/// them, as declared): here `fn launch(logits: CubeTensor, seeds:
/// CubeTensor, counters: CubeTensor, bias: Option<CubeTensor>, temperature:
/// f32) -> CubeTensor`. The fusion `dtype` must be the one the launch
/// allocates its output in (an int output: an int input's, as here).
///
/// The rules:
/// - Doc comments, then exactly one `#[fusion(..)]` (Burn's: `dtype = ..,
///   shape = ..` over the tensor arguments, or `meta = closure` taking every
///   argument of the trait method, flags included), then `pub fn
///   Trait::method(..) -> Output`. The trait is named by hand (one per
///   kernel); `method` names the trait method, the fusion operation and the
///   tensor function.
/// - Argument types: `Tensor<D>` (float) or `Tensor<D, Int>`; `Option<..>`
///   of one of those with `#[optional(flag = f, stand_in = t)]`, where `f`
///   names the `bool` the trait method takes after it and `t` is another
///   tensor argument of the same kind, sent (unread) when the operand is
///   absent; plain values of a one-identifier type (`bool`, `usize`, `f32`,
///   ...: an alias for anything longer). `#[in_place]` comes first where
///   both attributes are given.
/// - Output: `Tensor<D>`, `Tensor<D, Int>`, or a tuple of those.
/// - `Tensor`, `Int` and `Option` are read as words and written out as full
///   paths, so they need no import (and cubecl's `Tensor` in scope does not
///   matter); the `#[fusion(..)]` expression resolves in the kernel's file
///   (`Shape` imported there).
/// - `#[launch(expr)]` after `#[fusion(..)]` replaces the call
///   `launch(name, ..)`: `expr` sees each argument as the launch gets it,
///   under its own name (the projections group their operands this way,
///   `super::launch::projection_kernel!`).
/// - Every generated method allows `clippy::too_many_arguments`: a kernel's
///   arguments are what its launch needs.
macro_rules! cuda_kernel {
    // ---- Arguments, one at a time, into six lists: the trait method's
    // parameters; the `CubeBackend` method's `let`s (each tensor as its
    // launch gets it) and the names its launch call passes; the tensor
    // function's parameters, its `let`s (optional operands) and its
    // `Dispatch` call's arguments. `$head` carries the rest along.
    (@args $head:tt $acc:tt) => {
        $crate::ops::cuda::extension::cuda_kernel! { @out $head $acc }
    };
    // A plain value: the same on every side.
    (@args $head:tt { [$($tp:tt)*] $bind:tt [$($names:tt)*] [$($wp:tt)*] $pre:tt [$($da:tt)*] }
        $n:ident : $t:ident $(, $($rest:tt)*)?
    ) => {
        $crate::ops::cuda::extension::cuda_kernel! { @args $head
            { [$($tp)* $n: $t,] $bind [$($names)* $n,] [$($wp)* $n: $t,] $pre [$($da)* $n,] }
            $($($rest)*)?
        }
    };
    // A tensor: `$place` names how the launch gets it (the function
    // [`in_place`] or [`contiguous`]).
    (@args $head:tt $acc:tt #[in_place] $($arg:tt)+) => {
        $crate::ops::cuda::extension::cuda_kernel! { @tensor in_place $head $acc $($arg)+ }
    };
    (@args $head:tt $acc:tt $($arg:tt)+) => {
        $crate::ops::cuda::extension::cuda_kernel! { @tensor contiguous $head $acc $($arg)+ }
    };
    (@tensor $place:ident $head:tt $acc:tt
        #[optional(flag = $f:ident, stand_in = $s:ident)]
        $n:ident : Option<Tensor<$d:literal $(, $k:ident)?>> $(, $($rest:tt)*)?
    ) => {
        $crate::ops::cuda::extension::cuda_kernel! { @kind arg [$($k)?] $head $acc $n
            [$f: bool,]
            [$f.then(|| $crate::ops::cuda::extension::$place($n))]
            [Option<burn::tensor::Tensor<$d $(, burn::tensor::$k)?>>]
            [let $n = $crate::ops::cuda::extension::Operand::new(
                $n.map(burn::tensor::Tensor::into_dispatch),
                || $s.clone().into_dispatch(),
            );]
            [$n.tensor, $n.present]
            [$($($rest)*)?]
        }
    };
    (@tensor $place:ident $head:tt $acc:tt
        $n:ident : Tensor<$d:literal $(, $k:ident)?> $(, $($rest:tt)*)?
    ) => {
        $crate::ops::cuda::extension::cuda_kernel! { @kind arg [$($k)?] $head $acc $n
            []
            [$crate::ops::cuda::extension::$place($n)]
            [burn::tensor::Tensor<$d $(, burn::tensor::$k)?>]
            []
            [$n.into_dispatch()]
            [$($($rest)*)?]
        }
    };
    // A tensor argument, its trait type resolved by `@kind`, into the six
    // lists (`$flag`: the flag parameter of an optional operand; `$conv`:
    // the launch's value; `$prep`: the tensor function's `let` for it).
    (@arg $kind:ident $head:tt
        { [$($tp:tt)*] [$($bind:tt)*] [$($names:tt)*] [$($wp:tt)*] [$($pre:tt)*] [$($da:tt)*] }
        $n:ident [$($flag:tt)*] [$($conv:tt)*] [$($ty:tt)*] [$($prep:tt)*] [$($call:tt)*]
        [$($rest:tt)*]
    ) => {
        $crate::ops::cuda::extension::cuda_kernel! { @args $head
            {
                [$($tp)* $n: burn::backend::tensor::$kind<Self>, $($flag)*]
                [$($bind)* let $n = $($conv)*;]
                [$($names)* $n,]
                [$($wp)* $n: $($ty)*,]
                [$($pre)* $($prep)*]
                [$($da)* $($call)*,]
            }
            $($rest)*
        }
    };
    // A tensor kind (`Tensor<D>` or `Tensor<D, K>`) as the trait's type
    // name, handed to the rule `@$then`.
    (@kind $then:ident [] $($data:tt)*) => {
        $crate::ops::cuda::extension::cuda_kernel! { @$then FloatTensor $($data)* }
    };
    (@kind $then:ident [Float] $($data:tt)*) => {
        $crate::ops::cuda::extension::cuda_kernel! { @$then FloatTensor $($data)* }
    };
    (@kind $then:ident [Int] $($data:tt)*) => {
        $crate::ops::cuda::extension::cuda_kernel! { @$then IntTensor $($data)* }
    };
    // ---- The output: one tensor, or a tuple of them (one at a time).
    (@out { $docs:tt $fusion:tt $call:tt $tr:ident $name:ident
        [Tensor<$d:literal $(, $k:ident)?> $(;)?] } $acc:tt
    ) => {
        $crate::ops::cuda::extension::cuda_kernel! { @kind out_one [$($k)?]
            { $docs $fusion $call $tr $name } $acc
            [burn::tensor::Tensor<$d $(, burn::tensor::$k)?>]
        }
    };
    (@out_one $kind:ident $head:tt $acc:tt $ty:tt) => {
        $crate::ops::cuda::extension::cuda_kernel! { @emit $head $acc
            [burn::backend::tensor::$kind<Self>] $ty
        }
    };
    (@out { $docs:tt $fusion:tt $call:tt $tr:ident $name:ident
        [($($items:tt)*) $(;)?] } $acc:tt
    ) => {
        $crate::ops::cuda::extension::cuda_kernel! { @tuple { $docs $fusion $call $tr $name } $acc
            [] [] [$($items)*]
        }
    };
    (@tuple $head:tt $acc:tt $kinds:tt [$($ty:tt)*]
        [Tensor<$d:literal $(, $k:ident)?> $(, $($rest:tt)*)?]
    ) => {
        $crate::ops::cuda::extension::cuda_kernel! { @kind tuple_item [$($k)?] $head $acc $kinds
            [$($ty)* burn::tensor::Tensor<$d $(, burn::tensor::$k)?>,] [$($($rest)*)?]
        }
    };
    (@tuple_item $kind:ident $head:tt $acc:tt [$($kinds:tt)*] $ty:tt $rest:tt) => {
        $crate::ops::cuda::extension::cuda_kernel! { @tuple $head $acc
            [$($kinds)* burn::backend::tensor::$kind<Self>,] $ty $rest
        }
    };
    (@tuple $head:tt $acc:tt [$($kinds:tt)*] [$($ty:tt)*] []) => {
        $crate::ops::cuda::extension::cuda_kernel! { @emit $head $acc [($($kinds)*)] [($($ty)*)] }
    };
    // ---- The launch call: `launch` of the names in declaration order, or
    // the declaration's `#[launch(..)]`.
    (@call [] $($names:tt)*) => {
        launch($($names)*)
    };
    (@call [$($call:tt)+] $($names:tt)*) => {
        $($call)+
    };
    // ---- The three items.
    (@emit { [$($doc:tt)*] [$($fusion:tt)*] [$($call:tt)*] $tr:ident $name:ident }
        { [$($tp:tt)*] [$($bind:tt)*] [$($names:tt)*] [$($wp:tt)*] [$($pre:tt)*] [$($da:tt)*] }
        [$($out:tt)*] [$($ty:tt)*]
    ) => {
        #[doc = concat!("The `", stringify!($name), "` kernel as a Burn backend extension \
            (CubeCL, fused or not), declared with `cuda_kernel!` \
            (`crate::ops::cuda::extension`).")]
        #[burn::backend::backend_extension(Cube, Fusion)]
        pub trait $tr: burn::backend::Backend {
            $(#[doc = $doc])*
            #[fusion($($fusion)*)]
            #[allow(clippy::too_many_arguments)]
            fn $name($($tp)*) -> $($out)*;
        }

        impl $tr for burn_cubecl::CubeBackend {
            #[allow(clippy::too_many_arguments)]
            fn $name($($tp)*) -> $($out)* {
                $($bind)*
                $crate::ops::cuda::extension::cuda_kernel!(@call [$($call)*] $($names)*)
            }
        }

        $(#[doc = $doc])*
        #[allow(clippy::too_many_arguments)]
        pub fn $name($($wp)*) -> $($ty)* {
            $($pre)*
            $crate::ops::cuda::extension::KernelOutput::wrap(
                <burn::backend::Dispatch as $tr>::$name($($da)*),
            )
        }
    };
    // ---- Entry: one kernel's declaration, with or without `#[launch(..)]`.
    (
        $(#[doc = $doc:tt])*
        #[fusion($($fusion:tt)*)]
        #[launch($($call:tt)*)]
        pub fn $tr:ident :: $name:ident ($($args:tt)*) -> $($out:tt)+
    ) => {
        $crate::ops::cuda::extension::cuda_kernel! { @args
            { [$($doc)*] [$($fusion)*] [$($call)*] $tr $name [$($out)+] }
            { [] [] [] [] [] [] }
            $($args)*
        }
    };
    (
        $(#[doc = $doc:tt])*
        #[fusion($($fusion:tt)*)]
        pub fn $tr:ident :: $name:ident ($($args:tt)*) -> $($out:tt)+
    ) => {
        $crate::ops::cuda::extension::cuda_kernel! { @args
            { [$($doc)*] [$($fusion)*] [] $tr $name [$($out)+] }
            { [] [] [] [] [] [] }
            $($args)*
        }
    };
}
pub(crate) use cuda_kernel;

/// An optional operand as the tensor function sends it (see the module
/// docs): the tensor, or the stand-in (unread) when absent, and whether it
/// is present.
pub struct Operand {
    /// The operand, or the stand-in.
    pub tensor: DispatchTensor,
    /// Whether `tensor` is the operand.
    pub present: bool,
}

impl Operand {
    /// `tensor` when there is one, else `stand_in()`.
    pub fn new(tensor: Option<DispatchTensor>, stand_in: impl FnOnce() -> DispatchTensor) -> Self {
        match tensor {
            Some(tensor) => Self {
                tensor,
                present: true,
            },
            None => Self {
                tensor: stand_in(),
                present: false,
            },
        }
    }
}

/// A tensor argument as a launch gets it by default: contiguous (a copy
/// only where it is not).
pub fn contiguous(tensor: CubeTensor) -> CubeTensor {
    into_contiguous(tensor)
}

/// An `#[in_place]` tensor argument: as it is (the kernel writes it in
/// place, or its launch checks the layout itself).
pub fn in_place(tensor: CubeTensor) -> CubeTensor {
    tensor
}

/// A tensor function's output, from what the extension returned through
/// `Dispatch`: a tensor, or a tuple of them.
pub trait KernelOutput {
    /// The extension's output on `Dispatch`.
    type Dispatched;
    /// The output as `Tensor`s.
    fn wrap(dispatched: Self::Dispatched) -> Self;
}

impl<const D: usize> KernelOutput for Tensor<D> {
    type Dispatched = DispatchTensor;
    fn wrap(dispatched: DispatchTensor) -> Self {
        Tensor::from_dispatch(dispatched)
    }
}

impl<const D: usize> KernelOutput for Tensor<D, Int> {
    type Dispatched = DispatchTensor;
    fn wrap(dispatched: DispatchTensor) -> Self {
        Tensor::from_dispatch(dispatched)
    }
}

impl<A: KernelOutput, B: KernelOutput> KernelOutput for (A, B) {
    type Dispatched = (A::Dispatched, B::Dispatched);
    fn wrap((a, b): Self::Dispatched) -> Self {
        (A::wrap(a), B::wrap(b))
    }
}
