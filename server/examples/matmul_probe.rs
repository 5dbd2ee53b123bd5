use burn::prelude::*;
use burn::tensor::Distribution;
use std::time::Instant;
fn main() {
    let dev = Device::flex();
    for &(m, k, n) in &[(1usize, 768usize, 2304usize), (1, 768, 3072), (1, 3072, 768), (16, 768, 2304), (16, 768, 3072), (16, 3072, 768), (16, 768, 50257), (1, 768, 50257)] {
        let x = Tensor::<2>::random([m, k], Distribution::Normal(0.0, 1.0), &dev);
        let w = Tensor::<2>::random([k, n], Distribution::Normal(0.0, 1.0), &dev);
        for _ in 0..3 { let _ = x.clone().matmul(w.clone()); }
        let iters = 20;
        let t = Instant::now();
        for _ in 0..iters { let y = x.clone().matmul(w.clone()); std::hint::black_box(y); }
        let ms = t.elapsed().as_secs_f64() * 1e3 / iters as f64;
        let gflops = 2.0 * (m * k * n) as f64 / (ms * 1e6);
        let gbs = (k * n * 4) as f64 / (ms * 1e6);
        println!("M={m:3} K={k:5} N={n:6}: {ms:8.3} ms  {gflops:6.1} GFLOP/s  {gbs:6.1} GB/s weights");
    }
}
