//! Where a model comes from: an HF model directory or a seeded random preset.
//!
//! - [`ModelSource::Dir`]: `config.json` + `model.safetensors` as saved by
//!   transformers, memory-mapped (`super::checkpoint`). Keys may carry the
//!   `transformer.` prefix (GPT2LMHeadModel) or not (GPT2Model);
//!   `attn.bias`/`attn.masked_bias` are causal-mask buffers and are never
//!   read; `lm_head.weight`, when present, must equal `wte.weight` (GPT-2
//!   ties them). f32 and f16 are handed over as they are, bf16 as f32;
//!   `Tensor::from_data` converts to the backend float type.
//! - [`ModelSource::Preset`]: GPT-2's init (normal std 0.02, biases 0, LN 1/0)
//!   drawn from host `StdRng`s seeded from `seed` ([`random_model`]), so the
//!   same seed gives the same weights on every backend.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use burn::prelude::*;
use burn::tensor::TensorData;
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

use super::checkpoint::load_safetensors;
use super::config::Gpt2Config;
use super::error::ModelError;
use super::gpt2::Gpt2;
use super::weights::TensorRole;

/// Standard deviation of GPT-2's weight initialization (normal, mean 0).
pub const INIT_STD: f64 = 0.02;

/// Where to get a model.
#[derive(Debug, Clone)]
pub enum ModelSource {
    /// An HF GPT-2 directory holding `config.json` and `model.safetensors`.
    Dir(PathBuf),
    /// A built-in architecture with seeded random weights.
    Preset { preset: Preset, seed: u64 },
}

/// Built-in architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// GPT-2 small (124M).
    Gpt2,
    /// 2 layers, 4 heads, 128 wide (tests).
    Tiny,
}

impl Preset {
    /// The preset's configuration.
    pub fn config(self) -> Gpt2Config {
        match self {
            Preset::Gpt2 => Gpt2Config::gpt2(),
            Preset::Tiny => Gpt2Config::tiny(),
        }
    }
}

impl FromStr for Preset {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "gpt2" => Ok(Preset::Gpt2),
            "tiny" => Ok(Preset::Tiny),
            other => Err(ModelError::UnknownPreset(other.to_string())),
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Preset::Gpt2 => "gpt2",
            Preset::Tiny => "tiny",
        })
    }
}

impl ModelSource {
    /// The model's configuration, without loading its weights.
    pub fn config(&self) -> Result<Gpt2Config, ModelError> {
        match self {
            ModelSource::Dir(dir) => Gpt2Config::from_hf_json(&dir.join("config.json")),
            ModelSource::Preset { preset, .. } => Ok(preset.config()),
        }
    }
}

/// Loads (or randomly builds) a model and returns it with its configuration.
pub fn load_model(source: &ModelSource, device: &Device) -> Result<(Gpt2, Gpt2Config), ModelError> {
    let config = source.config()?;
    match source {
        ModelSource::Dir(dir) => {
            let (model, timings) =
                load_safetensors(&config, &dir.join("model.safetensors"), device)?;
            timings.log(dir, &config);
            Ok((model, config))
        }
        ModelSource::Preset { preset, seed } => {
            tracing::warn!(
                %preset, seed,
                "RANDOM WEIGHTS: no --model-dir given, so the model is randomly initialized; generated text is meaningless"
            );
            let model = random_model(&config, *seed, device)?;
            // The uploads are asynchronous on CUDA: what the device has
            // left is read next (KV sizing), so let them land first.
            device
                .sync()
                .map_err(|e| ModelError::Device(format!("{e:?}")))?;
            Ok((model, config))
        }
    }
}

/// GPT-2's init from host RNGs seeded from `seed` (identical on every
/// backend and whatever the thread count): each weight tensor is drawn in
/// chunks of [`INIT_CHUNK`] values, chunk `i` of tensor `name` from its own
/// `StdRng` seeded with `seed`, `name` and `i`, the chunks in parallel. One
/// RNG for all 124M values took ~2 s of every start of the default model.
pub fn random_model(config: &Gpt2Config, seed: u64, device: &Device) -> Result<Gpt2, ModelError> {
    use rayon::prelude::*;
    let normal = Normal::new(0.0f32, INIT_STD as f32)
        .map_err(|e| ModelError::InvalidConfig(e.to_string()))?;
    Gpt2::from_weights(config, device, &mut |name, role, shape| {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = match role {
            TensorRole::Weight => {
                let mut values = vec![0.0f32; n];
                let tensor_seed = mix(seed, fnv1a(name.as_bytes()));
                values
                    .par_chunks_mut(INIT_CHUNK)
                    .enumerate()
                    .for_each(|(i, chunk)| {
                        let mut rng = StdRng::seed_from_u64(mix(tensor_seed, i as u64));
                        chunk.iter_mut().for_each(|v| *v = normal.sample(&mut rng));
                    });
                values
            }
            TensorRole::Bias => vec![0.0; n],
            TensorRole::NormScale => vec![1.0; n],
        };
        Ok(TensorData::new(values, shape.to_vec()).into())
    })
}

/// Values per independently seeded chunk of a random weight tensor.
const INIT_CHUNK: usize = 1 << 16;

/// FNV-1a of `bytes` (a stable name hash: std's hasher may change between
/// Rust versions).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// SplitMix64 of `a` and `b`: seeds that differ in either input differ
/// everywhere.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use burn::tensor::DType;
    use safetensors::tensor::TensorView;
    use safetensors::{Dtype, SafeTensors};

    use super::*;
    use crate::model::checkpoint::host_tensor;
    use crate::model::fixtures::tiny_gpt2_dir;

    /// A fresh temp dir holding the fixture's config.json.
    fn temp_model_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ember-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(tiny_gpt2_dir().join("config.json"), dir.join("config.json")).unwrap();
        dir
    }

    /// The fixture's tensors as (name, dtype, shape, bytes), all f32.
    fn fixture_tensors() -> Vec<(String, Vec<usize>, Vec<f32>)> {
        let bytes = std::fs::read(tiny_gpt2_dir().join("model.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        st.tensors()
            .into_iter()
            .map(|(name, view)| {
                let shape = view.shape().to_vec();
                let data = host_tensor(&name, view).unwrap().into_data();
                let values = data.convert_dtype(DType::F32).try_to_vec::<f32>().unwrap();
                (name, shape, values)
            })
            .collect()
    }

    fn write_safetensors(path: &Path, tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
        let views: HashMap<String, TensorView<'_>> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn flat_params(model: &Gpt2) -> Vec<f32> {
        let mut out: Vec<f32> = model.wte.weight.val().into_data().iter::<f32>().collect();
        let b = model.blocks.last().unwrap();
        out.extend(b.attn.c_attn.weight.val().into_data().iter::<f32>());
        out.extend(
            b.mlp
                .c_proj
                .bias
                .as_ref()
                .unwrap()
                .val()
                .into_data()
                .iter::<f32>(),
        );
        out.extend(model.ln_f.gamma.val().into_data().iter::<f32>());
        out
    }

    #[test]
    fn loads_the_fixture_directory() {
        let dev = Device::flex();
        let (model, config) = load_model(&ModelSource::Dir(tiny_gpt2_dir()), &dev).unwrap();
        assert_eq!((config.n_layer, config.n_head, config.n_embd), (2, 4, 64));
        assert_eq!((config.n_positions, config.vocab_size), (128, 1000));
        assert_eq!(model.blocks.len(), 2);
        // Stored `[in, out]` in the file; out-major where the device's ops
        // want it (the CPU and CUDA both do).
        let expected = if crate::ops::Ops::out_major_weights(&dev) {
            [192, 64]
        } else {
            [64, 192]
        };
        assert_eq!(model.blocks[0].attn.c_attn.weight.dims(), expected);
    }

    #[test]
    fn misshapen_tensor_error_names_tensor_and_both_shapes() {
        let dir = temp_model_dir("misshapen");
        let tensors: Vec<_> = fixture_tensors()
            .into_iter()
            .map(|(n, s, v)| {
                if n == "transformer.h.1.mlp.c_fc.weight" {
                    // Stored transposed: [256, 64] instead of [64, 256].
                    (n, Dtype::F32, vec![256, 64], f32_bytes(&v))
                } else {
                    (n, Dtype::F32, s, f32_bytes(&v))
                }
            })
            .collect();
        write_safetensors(&dir.join("model.safetensors"), &tensors);
        let err = load_model(&ModelSource::Dir(dir.clone()), &Device::flex()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("h.1.mlp.c_fc.weight"), "{msg}");
        assert!(
            msg.contains("[256, 64]") && msg.contains("[64, 256]"),
            "{msg}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_tensor_error_names_tensor_and_shape() {
        let dir = temp_model_dir("missing");
        let tensors: Vec<_> = fixture_tensors()
            .into_iter()
            .filter(|(n, _, _)| n != "transformer.ln_f.bias")
            .map(|(n, s, v)| (n, Dtype::F32, s, f32_bytes(&v)))
            .collect();
        write_safetensors(&dir.join("model.safetensors"), &tensors);
        let err = load_model(&ModelSource::Dir(dir.clone()), &Device::flex()).unwrap_err();
        assert!(
            matches!(&err, ModelError::MissingTensor { name, expected } if name == "ln_f.bias" && expected == &[64])
        );
        assert!(err.to_string().contains("ln_f.bias"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn loads_unprefixed_f16_and_bf16_keys() {
        let dev = Device::flex();
        let (reference, _) = load_model(&ModelSource::Dir(tiny_gpt2_dir()), &dev).unwrap();
        for (tag, dtype) in [("f16", Dtype::F16), ("bf16", Dtype::BF16)] {
            let dir = temp_model_dir(tag);
            let tensors: Vec<_> = fixture_tensors()
                .into_iter()
                .map(|(n, s, v)| {
                    let bytes: Vec<u8> = match dtype {
                        Dtype::F16 => v
                            .iter()
                            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                            .collect(),
                        _ => v
                            .iter()
                            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                            .collect(),
                    };
                    let name = n.trim_start_matches("transformer.").to_string();
                    (name, dtype, s, bytes)
                })
                .collect();
            write_safetensors(&dir.join("model.safetensors"), &tensors);
            let (model, _) = load_model(&ModelSource::Dir(dir.clone()), &dev).unwrap();
            let (a, b) = (flat_params(&reference), flat_params(&model));
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs() / x.abs().max(1e-3))
                .fold(0.0, f32::max);
            assert!(worst < 1e-2, "{tag}: relative error {worst}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn untied_lm_head_is_rejected_and_tied_one_accepted() {
        let mut tensors: Vec<_> = fixture_tensors()
            .into_iter()
            .map(|(n, s, v)| (n, Dtype::F32, s, f32_bytes(&v)))
            .collect();
        let wte = tensors
            .iter()
            .find(|t| t.0 == "transformer.wte.weight")
            .unwrap()
            .clone();
        for (tag, tied) in [("tied", true), ("untied", false)] {
            let dir = temp_model_dir(tag);
            let mut head = (
                "lm_head.weight".to_string(),
                wte.1,
                wte.2.clone(),
                wte.3.clone(),
            );
            if !tied {
                head.3[0] ^= 1;
            }
            tensors.retain(|t| t.0 != "lm_head.weight");
            tensors.push(head);
            write_safetensors(&dir.join("model.safetensors"), &tensors);
            let result = load_model(&ModelSource::Dir(dir.clone()), &Device::flex());
            assert_eq!(result.is_ok(), tied, "{tag}");
            if !tied {
                assert!(matches!(result, Err(ModelError::UntiedLmHead)));
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn random_weights_follow_the_seed_and_the_init() {
        let dev = Device::flex();
        let config = Preset::Tiny.config();
        let weights = |seed| -> Vec<f32> {
            let model = random_model(&config, seed, &dev).unwrap();
            model.blocks[0]
                .mlp
                .c_fc
                .weight
                .val()
                .into_data()
                .iter::<f32>()
                .collect()
        };
        let (a, again, other) = (weights(7), weights(7), weights(8));
        // The same seed gives the same values (chunks drawn in parallel);
        // another seed other values; GPT-2's init: mean 0, std 0.02.
        assert_eq!(a, again);
        assert_ne!(a, other);
        let n = a.len() as f64;
        let mean = a.iter().map(|&x| x as f64).sum::<f64>() / n;
        let std = (a.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(
            mean.abs() < 1e-3 && (std - INIT_STD).abs() < 1e-3,
            "mean {mean} std {std}"
        );
    }

    #[test]
    fn missing_directory_is_an_io_error() {
        let err = load_model(
            &ModelSource::Dir("/nonexistent/ember".into()),
            &Device::flex(),
        )
        .unwrap_err();
        assert!(matches!(err, ModelError::Io { .. }), "{err}");
    }

    #[test]
    fn random_init_is_seeded_and_follows_gpt2_init() {
        let dev = Device::flex();
        let config = Gpt2Config::new(1, 2, 16, 8, 300).with_eos_token_id(0);
        let a = flat_params(&random_model(&config, 7, &dev).unwrap());
        let b = flat_params(&random_model(&config, 7, &dev).unwrap());
        let c = flat_params(&random_model(&config, 8, &dev).unwrap());
        assert_eq!(a, b);
        assert_ne!(a, c);
        // wte: std ~0.02 (300 * 16 samples).
        let wte = &a[..300 * 16];
        let std = (wte.iter().map(|x| x * x).sum::<f32>() / wte.len() as f32).sqrt();
        assert!((std - 0.02).abs() < 0.002, "std {std}");
        // The tail is the final LayerNorm scale: ones.
        assert!(a[a.len() - 16..].iter().all(|&x| x == 1.0));
    }

    #[test]
    fn presets_parse_and_print() {
        for p in [Preset::Gpt2, Preset::Tiny] {
            assert_eq!(p.to_string().parse::<Preset>().unwrap(), p);
        }
        assert!("gpt3".parse::<Preset>().is_err());
        assert_eq!(Preset::Gpt2.config().n_embd, 768);
        assert_eq!(Preset::Tiny.config().n_layer, 2);
    }
}
