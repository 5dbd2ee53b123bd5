//! What the report says about the machine and the work: the CPU model, its
//! SIMD features and the instruction set Ember's CPU kernels picked (every
//! CPU figure is printed beside them), and the bytes of weights a decode
//! step streams (its weight-read floor is those bytes over the measured
//! read bandwidth, [`super::membw`]).

use ember_engine::model::Gpt2Config;
use ember_engine::ops::cpu::isa::simd_flags;
use ember_engine::EngineDevice;
use serde_json::json;

/// `{"model", "simd", "isa", "weights", "threads"}`: the CPU model from
/// `/proc/cpuinfo`, its SIMD flags, the kernels' instruction set and weight
/// format on this device, and the rayon pool's threads.
pub fn cpu_report(device: &EngineDevice) -> serde_json::Value {
    let kernels = device.ops.cpu_kernels();
    json!({
        "model": cpu_model(),
        "simd": simd_flags(),
        "isa": kernels.isa.to_string(),
        "weights": kernels.weights.to_string(),
        "threads": rayon::current_num_threads(),
    })
}

/// One line for the console.
pub fn describe(cpu: &serde_json::Value) -> String {
    format!(
        "{} [{}], kernels {} with {} weights, {} threads",
        cpu["model"].as_str().unwrap_or("?"),
        cpu["simd"].as_str().unwrap_or("?"),
        cpu["isa"].as_str().unwrap_or("?"),
        cpu["weights"].as_str().unwrap_or("?"),
        cpu["threads"]
    )
}

/// `model name` of the first processor in `/proc/cpuinfo` with its family
/// and model numbers (a virtual machine often shows only "AMD EPYC"), else
/// the architecture.
fn cpu_model() -> String {
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return std::env::consts::ARCH.to_string();
    };
    let field = |name: &str| {
        info.lines()
            .find(|l| l.split(':').next().map(str::trim) == Some(name))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_string())
    };
    let name = field("model name").unwrap_or_else(|| std::env::consts::ARCH.to_string());
    match (field("cpu family"), field("model")) {
        (Some(family), Some(model)) => format!("{name} (family {family}, model {model})"),
        _ => name,
    }
}

/// Bytes of weight matrices one decode step reads: every projection of
/// every block (`E x 3E`, `E x E`, `E x 4E`, `4E x E`) and the LM head
/// (`vocab x E`), `elem_bytes` each. Biases and LayerNorm parameters (0.1%)
/// are left out.
pub fn decode_weight_bytes(config: &Gpt2Config, elem_bytes: usize) -> usize {
    let e = config.n_embd;
    let per_block = e * 3 * e + e * e + e * 4 * e + 4 * e * e;
    (config.n_layer * per_block + config.vocab_size * e) * elem_bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_reads_about_half_a_gigabyte_of_f32_weights() {
        let bytes = decode_weight_bytes(&Gpt2Config::gpt2(), 4);
        // 12 x 7,077,888 + 50,257 x 768 parameters.
        assert_eq!(bytes, (12 * 7_077_888 + 50_257 * 768) * 4);
    }
}
