//! Building a [`Gpt2`] from named tensors, whatever their origin.
//!
//! Both loaders go through [`Gpt2::from_weights`]: it walks the model in a
//! fixed order and asks a `fetch(name, shape)` callback for each tensor by its
//! Hugging Face name without the `transformer.` prefix (`wte.weight`,
//! `h.0.attn.c_attn.weight`, ...). The safetensors loader answers from the
//! memory-mapped file, borrowing its bytes ([`HostTensor`]); the preset
//! loader answers with seeded random numbers. GPT-2's Conv1D
//! stores weights `[in, out]`; where [`Ops::out_major_weights`] says so (CUDA
//! and the CPU) they are transposed once here, on the host before the upload
//! ([`super::host_transpose`]), to the out-major layout the decode kernels
//! read ([`super::linear`]).

use std::time::{Duration, Instant};

use burn::module::Param;
use burn::nn::Embedding;
use burn::prelude::*;
use burn::tensor::{DType, TensorData};

use super::attention::Attention;
use super::block::Block;
use super::config::Gpt2Config;
use super::error::ModelError;
use super::gpt2::Gpt2;
use super::host_transpose::{copied, transposed, transposed_bytes};
use super::layer_norm::LayerNorm;
use super::linear::Linear;
use super::mlp::Mlp;
use crate::ops::pitched::settled;
use crate::ops::Ops;

/// What a tensor is, so a random source knows how to initialize it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    /// A weight matrix or embedding (GPT-2 init: normal, std 0.02).
    Weight,
    /// A bias (init 0).
    Bias,
    /// A LayerNorm scale (init 1).
    NormScale,
}

/// A tensor's host data as a source hands it over: owned (random weights,
/// bf16 widened to f32), or borrowed from a memory-mapped checkpoint, so the
/// one copy made is the upload's or the transposition's
/// (`super::checkpoint`).
#[derive(Debug)]
pub enum HostTensor<'a> {
    Owned(TensorData),
    /// Little-endian elements of `dtype`, row-major, of `shape`.
    Borrowed {
        bytes: &'a [u8],
        shape: Vec<usize>,
        dtype: DType,
    },
}

impl HostTensor<'_> {
    pub fn shape(&self) -> Vec<usize> {
        match self {
            HostTensor::Owned(data) => data.shape().to_vec(),
            HostTensor::Borrowed { shape, .. } => shape.clone(),
        }
    }

    /// The data, owned (a borrowed tensor is copied over the rayon pool).
    pub fn into_data(self) -> TensorData {
        match self {
            HostTensor::Owned(data) => data,
            HostTensor::Borrowed {
                bytes,
                shape,
                dtype,
            } => TensorData::from_bytes_vec(copied(bytes), shape, dtype),
        }
    }

    /// The `[rows, cols]` matrix as `[cols, rows]` (out-major), read in place.
    fn transposed(self, rows: usize, cols: usize) -> TensorData {
        match self {
            HostTensor::Owned(data) => transposed(data),
            HostTensor::Borrowed { bytes, dtype, .. } => transposed_bytes(bytes, rows, cols, dtype),
        }
    }
}

impl From<TensorData> for HostTensor<'_> {
    fn from(data: TensorData) -> Self {
        HostTensor::Owned(data)
    }
}

/// Callback answering `(name, role, expected shape)` with data of exactly
/// that shape, f32 or f16 (`Tensor::from_data` converts it to the device's
/// float type; f16 weights reach an f16 device unconverted).
pub type Fetch<'a> =
    dyn FnMut(&str, TensorRole, &[usize]) -> Result<HostTensor<'a>, ModelError> + 'a;

/// Where building a model spent its time (the load's log line): answering
/// `fetch` (reading the source, copying borrowed bytes), transposing the
/// projections on the host, and handing data to the device (on CUDA an
/// asynchronous submission: the copies themselves finish on CubeCL's
/// device thread, which `super::checkpoint` waits for and reports apart).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BuildTimings {
    pub fetch: Duration,
    pub transpose: Duration,
    pub upload: Duration,
    /// Bytes handed to the device.
    pub bytes: usize,
}

struct Builder<'a, 'f> {
    fetch: &'a mut Fetch<'f>,
    device: &'a Device,
    /// Store projection weights `[out, in]` ([`Ops::out_major_weights`]).
    out_major: bool,
    timings: BuildTimings,
}

impl<'f> Builder<'_, 'f> {
    fn tensor<const D: usize>(
        &mut self,
        name: &str,
        role: TensorRole,
        shape: [usize; D],
    ) -> Result<Param<Tensor<D>>, ModelError> {
        let data = self.data(name, role, shape)?;
        let started = Instant::now();
        let data = data.into_data();
        self.timings.fetch += started.elapsed();
        Ok(Param::from_tensor(self.upload(data)))
    }

    /// The tensor's data from `fetch`, checked against `shape`.
    fn data<const D: usize>(
        &mut self,
        name: &str,
        role: TensorRole,
        shape: [usize; D],
    ) -> Result<HostTensor<'f>, ModelError> {
        let started = Instant::now();
        let data = (self.fetch)(name, role, &shape)?;
        self.timings.fetch += started.elapsed();
        if data.shape().as_slice() != shape.as_slice() {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                expected: shape.to_vec(),
                actual: data.shape(),
            });
        }
        Ok(data)
    }

    /// `data` on the device (a matrix on CUDA contiguous:
    /// `crate::ops::pitched::settled`).
    fn upload<const D: usize>(&mut self, data: TensorData) -> Tensor<D> {
        let started = Instant::now();
        self.timings.bytes += data.as_bytes().len();
        let tensor = settled(Tensor::from_data(data, self.device));
        self.timings.upload += started.elapsed();
        tensor
    }

    fn linear(&mut self, prefix: &str, d_in: usize, d_out: usize) -> Result<Linear, ModelError> {
        let name = format!("{prefix}.weight");
        let weight = match self.out_major {
            // A contiguous `[out, in]` copy, made on the host before the upload.
            true => {
                let data = self.data(&name, TensorRole::Weight, [d_in, d_out])?;
                let started = Instant::now();
                let data = data.transposed(d_in, d_out);
                self.timings.transpose += started.elapsed();
                Param::from_tensor(self.upload(data))
            }
            false => self.tensor(&name, TensorRole::Weight, [d_in, d_out])?,
        };
        Ok(Linear {
            weight,
            bias: Some(self.tensor(&format!("{prefix}.bias"), TensorRole::Bias, [d_out])?),
            out_major: self.out_major,
        })
    }

    fn layer_norm(&mut self, prefix: &str, d: usize, eps: f64) -> Result<LayerNorm, ModelError> {
        Ok(LayerNorm {
            gamma: self.tensor(&format!("{prefix}.weight"), TensorRole::NormScale, [d])?,
            beta: self.tensor(&format!("{prefix}.bias"), TensorRole::Bias, [d])?,
            epsilon: eps,
        })
    }

    fn embedding(&mut self, name: &str, rows: usize, d: usize) -> Result<Embedding, ModelError> {
        Ok(Embedding {
            weight: self.tensor(name, TensorRole::Weight, [rows, d])?,
        })
    }
}

impl Gpt2 {
    /// The model with its weight matrices (every projection and the tied
    /// embedding / LM head) stored as `dtype`; biases and LayerNorm keep
    /// theirs. Each f32 matrix is dropped as its copy is made.
    pub fn with_matrix_dtype(mut self, dtype: DType) -> Self {
        let cast = |p: &mut Param<Tensor<2>>| *p = Param::from_tensor(p.val().cast(dtype));
        cast(&mut self.wte.weight);
        for b in &mut self.blocks {
            cast(&mut b.attn.c_attn.weight);
            cast(&mut b.attn.c_proj.weight);
            cast(&mut b.mlp.c_fc.weight);
            cast(&mut b.mlp.c_proj.weight);
        }
        self
    }

    /// Builds the model tensor by tensor from `fetch` (see the module docs).
    pub fn from_weights(
        config: &Gpt2Config,
        device: &Device,
        fetch: &mut Fetch<'_>,
    ) -> Result<Self, ModelError> {
        Ok(Self::from_weights_timed(config, device, fetch)?.0)
    }

    /// [`Gpt2::from_weights`], with where the time went.
    pub fn from_weights_timed(
        config: &Gpt2Config,
        device: &Device,
        fetch: &mut Fetch<'_>,
    ) -> Result<(Self, BuildTimings), ModelError> {
        config.validate()?;
        let e = config.n_embd;
        let eps = config.layer_norm_epsilon;
        let out_major = Ops::out_major_weights(device);
        let mut b = Builder {
            fetch,
            device,
            out_major,
            timings: BuildTimings::default(),
        };
        let wte = b.embedding("wte.weight", config.vocab_size, e)?;
        let wpe = b.embedding("wpe.weight", config.n_positions, e)?;
        let mut blocks = Vec::with_capacity(config.n_layer);
        for i in 0..config.n_layer {
            let p = format!("h.{i}");
            blocks.push(Block {
                ln_1: b.layer_norm(&format!("{p}.ln_1"), e, eps)?,
                attn: Attention {
                    c_attn: b.linear(&format!("{p}.attn.c_attn"), e, 3 * e)?,
                    c_proj: b.linear(&format!("{p}.attn.c_proj"), e, e)?,
                    n_head: config.n_head,
                },
                ln_2: b.layer_norm(&format!("{p}.ln_2"), e, eps)?,
                mlp: Mlp {
                    c_fc: b.linear(&format!("{p}.mlp.c_fc"), e, 4 * e)?,
                    c_proj: b.linear(&format!("{p}.mlp.c_proj"), 4 * e, e)?,
                },
            });
        }
        let ln_f = b.layer_norm("ln_f", e, eps)?;
        let model = Gpt2 {
            wte,
            wpe,
            blocks,
            ln_f,
        };
        Ok((model, b.timings))
    }
}
