//! Eager ops on a CUDA device at many sizes. Its own test binary: it counts the process's NVRTC
//! compiles, which tests running beside it would add to. Skips without a GPU (fails instead when
//! `BRAZE_REQUIRE_CUDA=1`).

mod common;

use braze::{DType, Result, Tensor};
use common::gpu;

fn randn(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    Tensor::randn(shape.to_vec(), dtype, seed).unwrap()
}

/// Eager elementwise ops and full sums on the GPU read their sizes at run time: once an op has
/// run at one size (a sum at one size within a segment and one beyond), every other size of it
/// runs the same compiled unit (no NVRTC compile, no module loaded again), and gives the CPU's
/// values.
#[test]
fn gpu_eager_ops_compile_once_for_every_size() {
    let Some(device) = gpu() else { return };
    let run = |x: &Tensor, y: &Tensor| -> Result<Vec<Tensor>> {
        let z = x.tanh()?.mul(y)?.add_scalar(0.5)?;
        let total = z.cast(DType::F32)?.sum_all()?;
        Ok(vec![z, total])
    };
    for warm in [vec![5usize, 7], vec![20_000]] {
        let first = randn(&warm, DType::BF16, 80).to_device(device).unwrap();
        run(&first, &first).unwrap()[1].to_host().unwrap();
    }
    let before = braze::kernel_cache_stats().compiles;
    let braze::Device::Cuda(ordinal) = device else { unreachable!("gpu() gives a CUDA device") };
    let cuda = braze::cuda_device(ordinal).unwrap();
    let loads_before = cuda.module_load_count();
    for n in [3usize, 17, 1000, 4099, 65_537] {
        let (x, y) = (randn(&[n], DType::BF16, n as u64), randn(&[n], DType::BF16, n as u64 + 1));
        let got = run(&x.to_device(device).unwrap(), &y.to_device(device).unwrap()).unwrap();
        let want = run(&x, &y).unwrap();
        for (got, want) in got.iter().zip(&want) {
            let (got, want) = (got.to_host().unwrap().to_f64_vec(), want.to_host().unwrap().to_f64_vec());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let scale = if want.len() == 1 { n as f64 } else { w.abs().max(1.0) };
                assert!((g - w).abs() <= 1e-2 * scale, "n = {n}, element {i}: {g} vs {w}");
            }
        }
    }
    assert_eq!(braze::kernel_cache_stats().compiles, before, "an NVRTC compile for a new size");
    assert_eq!(cuda.module_load_count(), loads_before, "a module loaded again for a new size");
}
