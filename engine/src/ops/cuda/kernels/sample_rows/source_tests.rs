//! The sampling kernel (and the two small kernels that keep its penalty
//! counts and masks: `penalty_counts`, `write_rows`) expanded and
//! transpiled to CUDA C++ on the host, with no GPU:
//! what only expansion can catch (an operation CubeCL cannot lower, a
//! comptime value used at run time) fails here, and a few properties of the
//! source are pinned (the Philox products, the shared memory, no fast-math
//! intrinsics). Running them on a device is the GPU check's job; these run
//! with `cargo test -p ember-engine --features cuda --lib source_tests`
//! (not in CI, whose CUDA stage only checks that the build compiles).

use std::any::TypeId;
use std::sync::Arc;

use cubecl::ir::features::TypeUsage;
use cubecl::ir::{
    DeviceIdentity, FloatKind, HardwareProperties, IntKind, MemoryDeviceProperties, MmaProperties,
    UIntKind,
};
use cubecl::prelude::*;
use cubecl::server::Handle;
use cubecl::zspace::{Shape, Strides, Tiling};
use cubecl::{define_kernel, Compiler};
use cubecl_common::device::{DeviceId, ServiceId};
use cubecl_common::profile::TimingMethod;
use cubecl_cuda::{CudaCompilationOptions, CudaCompiler};
use cubecl_environment::stream::StreamId;

use super::{sample_rows_kernel, shared_bytes, SAMPLE_WARPS};
use crate::ops::row_params::{slot_row_len, FLOAT_COLS, INT_COLS};

/// An H100's properties, as far as expansion reads them.
fn h100() -> DeviceProperties {
    let hardware = HardwareProperties {
        load_width: 128,
        vector_register_count: None,
        plane_size_min: 32,
        plane_size_max: 32,
        max_bindings: 1024,
        max_shared_memory_size: 227 * 1024,
        max_cube_count: (u32::MAX, 65535, 65535),
        max_units_per_cube: 1024,
        max_cube_dim: (1024, 1024, 64),
        num_streaming_multiprocessors: Some(132),
        num_tensor_cores: None,
        min_tensor_cores_dim: None,
        num_cpu_cores: None,
        last_level_cache_size: None,
        max_vector_size: VectorSize::MAX,
        cube_mma_reserved_shared_memory: 0,
    };
    let mut props = DeviceProperties::new(
        Default::default(),
        MemoryDeviceProperties::new(1 << 30, 32),
        hardware,
        TimingMethod::Device,
        DeviceIdentity::default(),
    );
    props.register_address_type(AddressType::U32);
    props.register_address_type(AddressType::U64);
    for ty in [
        ElemType::UInt(UIntKind::U32),
        ElemType::UInt(UIntKind::U64),
        ElemType::Int(IntKind::I32),
        ElemType::Float(FloatKind::F16),
        ElemType::Float(FloatKind::F32),
        ElemType::Bool,
    ] {
        props.register_type_usage(ty, TypeUsage::all());
    }
    props
}

/// A tensor argument over a buffer no device ever sees.
fn tensor(shape: &[usize], elem_size: usize) -> TensorArg {
    let service = ServiceId {
        device: DeviceId {
            type_id: 0,
            index_id: 0,
        },
        service: TypeId::of::<u8>(),
    };
    let size = (shape.iter().product::<usize>() * elem_size) as u64;
    let mut strides = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    TensorArg::Handle {
        handle: TensorBinding {
            handle: Handle::new(service, StreamId { value: 0 }, size).binding(),
            strides: Strides::new(&strides),
            shape: shape.iter().copied().collect::<Shape>(),
            tiling: Tiling::default(),
        },
    }
}

/// No tensor cores asked of these kernels.
fn target() -> Arc<TargetProperties> {
    Arc::new(TargetProperties {
        mma: MmaProperties::default(),
    })
}

/// A dummy kernel expanded and transpiled to CUDA C++ (warps of 32): its
/// representation.
macro_rules! transpile {
    ($kernel:expr) => {{
        let definition = define_kernel(&$kernel).expect("the kernel expands");
        let mut options = CudaCompilationOptions::default();
        options.cpp.warp_size = 32;
        CudaCompiler::default()
            .compile(definition, &options)
            .expect("the kernel transpiles")
    }};
}

#[test]
fn the_kernel_expands_and_transpiles_to_cuda_cpp() {
    let (b, v) = (4usize, 50_257usize);
    let cols = FLOAT_COLS;
    for (has_mask, has_counts, write_trace) in [
        (false, false, false),
        (true, true, true),
        (false, true, false),
    ] {
        let kernel = sample_rows_kernel::create_dummy_kernel(
            Arc::new(h100()),
            target(),
            CubeCount::Static(b as u32, 1, 1),
            CubeDim::new_2d(32, SAMPLE_WARPS as u32),
            tensor(&[b, v], 2),
            tensor(&[b, cols], 4),
            tensor(&[b, INT_COLS], 4),
            tensor(&[b], 4),
            tensor(&[b, v.div_ceil(32)], 4),
            tensor(&[8, slot_row_len(v)], 4),
            tensor(&[b, 1], 4),
            tensor(&[b, 4], 4),
            v,
            SAMPLE_WARPS,
            has_mask,
            has_counts,
            write_trace,
            [ElemType::Float(FloatKind::F16), ElemType::Int(IntKind::I32)],
        );
        let repr = transpile!(kernel);
        let source = repr.to_string();
        assert!(source.contains("__umulhi"), "Philox's high products");
        assert!(
            source.contains("__ballot_sync") && source.contains("__popc"),
            "candidates gathered by ballot"
        );
        assert!(
            !source.contains("__logf") && !source.contains("__expf"),
            "no fast math"
        );
        assert!(repr.shared_memory_size() >= shared_bytes(v) - 64);
        assert!(repr.shared_memory_size() <= 227 * 1024);
        if std::env::var_os("EMBER_PRINT_KERNEL").is_some() {
            println!("{source}");
        }
    }
}

#[test]
fn the_penalty_count_kernel_expands_and_transpiles_to_cuda_cpp() {
    use crate::ops::cuda::kernels::penalty_counts::count_chosen_kernel;
    let b = 4usize;
    let kernel = count_chosen_kernel::create_dummy_kernel(
        Arc::new(h100()),
        target(),
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(128),
        tensor(&[b, 1], 4),
        tensor(&[b, INT_COLS], 4),
        tensor(&[8, 50_257], 4),
        true,
        ElemType::Int(IntKind::I32),
    );
    transpile!(kernel);
}

#[test]
fn the_row_write_kernel_expands_and_transpiles_to_cuda_cpp() {
    use crate::ops::cuda::kernels::write_rows::write_rows_kernel;
    let kernel = write_rows_kernel::create_dummy_kernel(
        Arc::new(h100()),
        target(),
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(256),
        tensor(&[8, 1571], 4),
        tensor(&[2], 4),
        tensor(&[2, 1571], 4),
        ElemType::Int(IntKind::I32),
    );
    transpile!(kernel);
}

#[test]
fn the_vocabulary_kernels_expand_and_transpile_to_cuda_cpp() {
    use crate::ops::cuda::kernels::vocab_rows::{
        argmax_join_kernel, argmax_parts_kernel, vocab_argmax_kernel, vocab_logprobs_kernel,
        VOCAB_WARPS,
    };
    let (b, v) = (4usize, 50_257usize);
    let dtypes = [ElemType::Float(FloatKind::F16), ElemType::Int(IntKind::I32)];
    let argmax = vocab_argmax_kernel::create_dummy_kernel(
        Arc::new(h100()),
        target(),
        CubeCount::Static(b as u32, 1, 1),
        CubeDim::new_2d(32, VOCAB_WARPS as u32),
        tensor(&[b, v], 2),
        tensor(&[b, 1], 4),
        VOCAB_WARPS,
        dtypes,
    );
    transpile!(argmax);
    let parts = argmax_parts_kernel::create_dummy_kernel(
        Arc::new(h100()),
        target(),
        CubeCount::Static(32, b as u32, 1),
        CubeDim::new_2d(32, VOCAB_WARPS as u32),
        tensor(&[b, v], 2),
        tensor(&[b, 64], 4),
        VOCAB_WARPS,
        dtypes[0],
    );
    transpile!(parts);
    let join = argmax_join_kernel::create_dummy_kernel(
        Arc::new(h100()),
        target(),
        CubeCount::Static(b as u32, 1, 1),
        CubeDim::new_1d(32),
        tensor(&[b, 64], 4),
        tensor(&[b, 1], 4),
        dtypes[1],
    );
    transpile!(join);
    let logprobs = vocab_logprobs_kernel::create_dummy_kernel(
        Arc::new(h100()),
        target(),
        CubeCount::Static(2, 1, 1),
        CubeDim::new_2d(32, VOCAB_WARPS as u32),
        tensor(&[b, v], 2),
        tensor(&[2], 4),
        tensor(&[2], 4),
        tensor(&[2, 1 + 2 * 5], 4),
        5u32,
        VOCAB_WARPS,
        dtypes,
    );
    let source = transpile!(logprobs).to_string();
    assert!(
        !source.contains("__logf") && !source.contains("__expf"),
        "no fast math"
    );
}

#[test]
fn the_logit_edits_kernel_expands_and_transpiles_to_cuda_cpp() {
    use crate::ops::cuda::kernels::logit_edits::logit_edits_kernel;
    let (b, v, n) = (4usize, 50_257usize, 64usize);
    let kernel = logit_edits_kernel::create_dummy_kernel(
        Arc::new(h100()),
        target(),
        CubeCount::Static(b as u32, 1, 1),
        CubeDim::new_2d(32, 8),
        tensor(&[b, v], 2),
        tensor(&[n], 4),
        tensor(&[n], 4),
        tensor(&[n], 4),
        tensor(&[n], 4),
        tensor(&[b, v], 4),
        [ElemType::Float(FloatKind::F16), ElemType::Int(IntKind::I32)],
    );
    let source = transpile!(kernel).to_string();
    println!("{source}");
    assert!(source.contains("__syncthreads"), "the copy is waited for");
}

#[test]
fn the_prefill_attention_kernel_expands_and_transpiles_to_cuda_cpp() {
    use crate::ops::cuda::kernels::prefill_attention::{prefill_attention_kernel, PREFILL_WARPS};
    let (t, e, heads, slots, vs) = (256usize, 768usize, 12usize, 1024usize, 8usize);
    let mut props = h100();
    for cd_type in [
        ElemType::Float(FloatKind::F16),
        ElemType::Float(FloatKind::F32),
    ] {
        props
            .features
            .matmul
            .cmma
            .insert(cubecl::ir::features::MmaConfig {
                a_type: ElemType::Float(FloatKind::F16),
                b_type: ElemType::Float(FloatKind::F16),
                cd_type,
                m: 16,
                n: 16,
                k: 16,
            });
    }
    let dtypes = [ElemType::Float(FloatKind::F16), ElemType::Int(IntKind::I32)];
    let kernel = prefill_attention_kernel::create_dummy_kernel(
        Arc::new(props.clone()),
        target(),
        CubeCount::Static(4, heads as u32, 1),
        CubeDim::new_2d(32, PREFILL_WARPS as u32),
        vs,
        tensor(&[t, 3 * e], 2),
        tensor(&[heads, slots, 64], 2),
        tensor(&[heads, slots, 64], 2),
        tensor(&[1, 16], 4),
        tensor(&[2], 4),
        tensor(&[1], 4),
        tensor(&[4, 2], 4),
        tensor(&[t, e], 2),
        0.125f32,
        e,
        64,
        16,
        vs,
        dtypes,
    );
    let source = transpile!(kernel).to_string();
    if std::env::var_os("EMBER_PRINT_KERNEL").is_some() {
        println!("{source}");
    }
    assert!(!source.contains("__expf"), "no fast math");
}
