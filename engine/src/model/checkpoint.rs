//! Loading `model.safetensors` ([`load_safetensors`]): the file is
//! memory-mapped, not read, and each tensor is handed to
//! [`Gpt2::from_weights`] as a view of the map ([`HostTensor::Borrowed`]),
//! so the only pass over its bytes is the one that builds what is uploaded:
//! the host transposition of a projection, or one parallel copy of the
//! rest (`super::host_transpose`). bf16 is widened to f32 on the way (its
//! exponent range does not fit f16); f32 and f16 are handed over as they
//! are (f16 weights reach an f16 device unconverted).
//!
//! Before, the file was read whole (`fs::read`: one single-threaded copy of
//! 3 GB for GPT-2 XL) and each tensor copied again before its
//! transposition: two passes on one thread before the parallel one.
//!
//! The load's log line (`loaded GPT-2 weights`, INFO) gives each phase's
//! seconds: `map` (open, map, parse the header), `fetch` (copies of the
//! untransposed tensors, bf16 widening), `transpose`, `upload` (handing the
//! data to the device; on CUDA asynchronous) and `drain` (waiting for the
//! device to finish the copies).

use std::path::Path;
use std::time::{Duration, Instant};

use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use memmap2::Mmap;
use rayon::prelude::*;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use super::config::Gpt2Config;
use super::error::ModelError;
use super::gpt2::Gpt2;
use super::weights::{BuildTimings, HostTensor};

/// Where a load spent its time (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadTimings {
    pub map: Duration,
    pub build: BuildTimings,
    pub drain: Duration,
    pub total: Duration,
}

impl LoadTimings {
    /// Logs the phases at INFO, with `what` (the directory).
    pub fn log(&self, what: &Path, config: &Gpt2Config) {
        let s = |d: Duration| (d.as_secs_f64() * 1e3).round() / 1e3;
        tracing::info!(
            dir = %what.display(),
            n_layer = config.n_layer,
            n_embd = config.n_embd,
            gib = format!("{:.2}", self.build.bytes as f64 / (1u64 << 30) as f64),
            seconds = s(self.total),
            map_s = s(self.map),
            fetch_s = s(self.build.fetch),
            transpose_s = s(self.build.transpose),
            upload_s = s(self.build.upload),
            drain_s = s(self.drain),
            "loaded GPT-2 weights"
        );
    }
}

/// Loads `path` (an HF `model.safetensors`) into a model of shape `config`
/// on `device`; returns it with the time each phase took.
pub fn load_safetensors(
    config: &Gpt2Config,
    path: &Path,
    device: &Device,
) -> Result<(Gpt2, LoadTimings), ModelError> {
    let started = Instant::now();
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // Safety: the map is read-only and lives for this function; the file is
    // the model's, which nothing writes while the server loads it (a
    // concurrent writer would be the same hazard for `fs::read`'s result,
    // but here it could change bytes under a reference).
    let map = unsafe { Mmap::map(&file) }.map_err(io)?;
    // Read ahead of the page faults when the file is not cached (a first
    // start); a hint, so its failure is only logged.
    #[cfg(unix)]
    if let Err(e) = map.advise(memmap2::Advice::WillNeed) {
        tracing::debug!(error = %e, "madvise(WILLNEED) on the checkpoint");
    }
    let st = SafeTensors::deserialize(&map).map_err(|e| ModelError::Safetensors {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let map_time = started.elapsed();
    // Keys of GPT2LMHeadModel carry `transformer.`; GPT2Model's do not.
    let lookup = |name: &str| {
        st.tensor(&format!("transformer.{name}"))
            .or_else(|_| st.tensor(name))
            .ok()
    };
    let (model, build) = Gpt2::from_weights_timed(config, device, &mut |name, _role, shape| {
        let view = lookup(name).ok_or_else(|| ModelError::MissingTensor {
            name: name.to_string(),
            expected: shape.to_vec(),
        })?;
        if view.shape() != shape {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                expected: shape.to_vec(),
                actual: view.shape().to_vec(),
            });
        }
        host_tensor(name, view)
    })?;
    // A present LM head must be the tied embedding.
    if let Ok(head) = st.tensor("lm_head.weight") {
        let tied = lookup("wte.weight")
            .is_some_and(|wte| wte.shape() == head.shape() && wte.data() == head.data());
        if !tied {
            return Err(ModelError::UntiedLmHead);
        }
    }
    let drained = Instant::now();
    device
        .sync()
        .map_err(|e| ModelError::Device(format!("{e:?}")))?;
    let timings = LoadTimings {
        map: map_time,
        build,
        drain: drained.elapsed(),
        total: started.elapsed(),
    };
    Ok((model, timings))
}

/// The view's data as [`Gpt2::from_weights`] takes it: f32 and f16
/// borrowed from the map, bf16 widened to f32 (see the module docs).
pub(super) fn host_tensor<'a>(
    name: &str,
    view: TensorView<'a>,
) -> Result<HostTensor<'a>, ModelError> {
    let shape = view.shape().to_vec();
    let dtype = match view.dtype() {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => {
            let widened: Vec<f32> = view
                .data()
                .par_chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect();
            return Ok(HostTensor::Owned(TensorData::new(widened, shape)));
        }
        other => {
            return Err(ModelError::UnsupportedDtype {
                name: name.to_string(),
                dtype: format!("{other:?}"),
            })
        }
    };
    Ok(HostTensor::Borrowed {
        bytes: view.data(),
        shape,
        dtype,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::model::fixtures::tiny_gpt2_dir;

    /// A tensor written in a test file: its shape, its bytes in the file's
    /// dtype and their f32 values.
    type Written = (Vec<usize>, Vec<u8>, Vec<f32>);

    /// Every parameter of `model` by its checkpoint name, as f32, with
    /// whether it is stored transposed (the out-major projections).
    fn params(model: &Gpt2) -> Vec<(String, bool, Vec<f32>)> {
        let v2 = |t: Tensor<2>| t.into_data().iter::<f32>().collect::<Vec<_>>();
        let v1 = |t: Tensor<1>| t.into_data().iter::<f32>().collect::<Vec<_>>();
        let mut out = vec![
            ("wte.weight".into(), false, v2(model.wte.weight.val())),
            ("wpe.weight".into(), false, v2(model.wpe.weight.val())),
            ("ln_f.weight".into(), false, v1(model.ln_f.gamma.val())),
            ("ln_f.bias".into(), false, v1(model.ln_f.beta.val())),
        ];
        for (i, b) in model.blocks.iter().enumerate() {
            for (name, ln) in [("ln_1", &b.ln_1), ("ln_2", &b.ln_2)] {
                out.push((format!("h.{i}.{name}.weight"), false, v1(ln.gamma.val())));
                out.push((format!("h.{i}.{name}.bias"), false, v1(ln.beta.val())));
            }
            let linears = [
                ("attn.c_attn", &b.attn.c_attn),
                ("attn.c_proj", &b.attn.c_proj),
                ("mlp.c_fc", &b.mlp.c_fc),
                ("mlp.c_proj", &b.mlp.c_proj),
            ];
            for (name, l) in linears {
                let w = format!("h.{i}.{name}.weight");
                out.push((w, l.out_major, v2(l.weight.val())));
                let bias = l.bias.as_ref().map(|p| v1(p.val())).unwrap_or_default();
                out.push((format!("h.{i}.{name}.bias"), false, bias));
            }
        }
        out
    }

    /// The mapped loader gives exactly the checkpoint's values (read
    /// element by element here, the projections transposed), for f32, f16
    /// and bf16 files.
    #[test]
    fn mapped_loads_equal_the_files_values_in_every_dtype() {
        let bytes = std::fs::read(tiny_gpt2_dir().join("model.safetensors")).unwrap();
        let fixture = SafeTensors::deserialize(&bytes).unwrap();
        let dev = Device::flex();
        for dtype in [Dtype::F32, Dtype::F16, Dtype::BF16] {
            let dir =
                std::env::temp_dir().join(format!("ember-ckpt-{dtype:?}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::copy(tiny_gpt2_dir().join("config.json"), dir.join("config.json")).unwrap();
            let mut file: HashMap<String, Written> = HashMap::new();
            for (name, view) in fixture.tensors() {
                let f32s: Vec<f32> = view
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                let (raw, exact): (Vec<u8>, Vec<f32>) = match dtype {
                    Dtype::F16 => {
                        let h: Vec<_> = f32s.iter().map(|&x| half::f16::from_f32(x)).collect();
                        (
                            h.iter().flat_map(|x| x.to_le_bytes()).collect(),
                            h.iter().map(|x| x.to_f32()).collect(),
                        )
                    }
                    Dtype::BF16 => {
                        let h: Vec<_> = f32s.iter().map(|&x| half::bf16::from_f32(x)).collect();
                        (
                            h.iter().flat_map(|x| x.to_le_bytes()).collect(),
                            h.iter().map(|x| x.to_f32()).collect(),
                        )
                    }
                    _ => (view.data().to_vec(), f32s),
                };
                file.insert(name, (view.shape().to_vec(), raw, exact));
            }
            let views: HashMap<String, TensorView<'_>> = file
                .iter()
                .map(|(n, (s, b, _))| (n.clone(), TensorView::new(dtype, s.clone(), b).unwrap()))
                .collect();
            safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
            let config = Gpt2Config::from_hf_json(&dir.join("config.json")).unwrap();
            let path = dir.join("model.safetensors");
            let (model, _) = load_safetensors(&config, &path, &dev).unwrap();
            for (name, transposed, got) in params(&model) {
                let (shape, _, want) = &file[&format!("transformer.{name}")];
                let want: Vec<f32> = if transposed {
                    let (rows, cols) = (shape[0], shape[1]);
                    (0..rows * cols)
                        .map(|j| want[(j % rows) * cols + j / rows])
                        .collect()
                } else {
                    want.clone()
                };
                assert_eq!(got, want, "{dtype:?} {name}");
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
