//! `compile_kernels`: kernels that differ only in name and comments compile once, distinct ones
//! in parallel, results in kernel order; runs wherever libnvrtc loads, no GPU needed.

mod common;

use braze_codegen::{GeneratedKernel, KernelCode, Launch};
use braze_cuda::{compile_kernels_on, CompileOptions, CudaError, KernelCache};
use std::sync::Arc;

/// A generated kernel named `name` scaling by `factor`, with a comment naming its buffers.
fn kernel(name: &str, factor: f32, buffer: usize) -> KernelCode {
    let source = format!(
        "// braze kernel `{name}`: scale by {factor}\n//   in0 = b{buffer}\n\
         extern \"C\" __global__ void {name}(float* x, int n) {{\n\
         \x20   int i = blockIdx.x * blockDim.x + threadIdx.x;\n\
         \x20   if (i < n) x[i] *= {factor:?}f;\n\
         }}\n"
    );
    let launch =
        Launch { entry: name.to_string(), grid: [1, 1, 1], block: [32, 1, 1], shared_bytes: 0, params: vec![] };
    KernelCode::Cuda(GeneratedKernel {
        name: name.to_string(),
        source,
        launches: vec![launch],
        scratch: vec![],
        tables: vec![],
    })
}

#[test]
fn identical_kernels_of_every_layer_compile_once() {
    if !common::nvrtc_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::with_dir(dir.path()).unwrap();
    // Twelve layers of the same two kernels, each named after its plan position.
    let codes: Vec<KernelCode> = (0..24)
        .map(|i| kernel(&format!("pointwise_mul_f32_{i}"), if i % 2 == 0 { 2.0 } else { 3.0 }, 100 + i))
        .collect();
    let modules = compile_kernels_on(&codes, &cache, &CompileOptions::default(), 4).unwrap();
    assert_eq!(cache.stats().compiles, 2, "one compile per distinct kernel");
    assert_eq!(modules.len(), 24);
    let modules: Vec<_> = modules.into_iter().map(Option::unwrap).collect();
    for (i, module) in modules.iter().enumerate() {
        assert!(Arc::ptr_eq(module, &modules[i % 2]), "kernel {i} shares its layer twin's module");
        assert!(module.resources_of(braze_cuda::unit::UNIT_NAME).is_some());
    }
    assert!(!Arc::ptr_eq(&modules[0], &modules[1]));

    // A new process with the same cache directory compiles nothing.
    let later = KernelCache::with_dir(dir.path()).unwrap();
    compile_kernels_on(&codes, &later, &CompileOptions::default(), 1).unwrap();
    assert_eq!((later.stats().compiles, later.stats().disk_hits), (0, 2));
}

#[test]
fn a_compile_error_names_the_first_kernel_that_has_it() {
    if !common::nvrtc_ready() {
        return;
    }
    let cache = KernelCache::in_memory();
    let mut broken = kernel("row_sum_f32_7", 2.0, 1);
    if let KernelCode::Cuda(g) = &mut broken {
        g.source = g.source.replace("x[i] *=", "x[i] *= undeclared *");
    }
    let codes = vec![kernel("pointwise_f32_3", 2.0, 0), broken];
    match compile_kernels_on(&codes, &cache, &CompileOptions::default(), 2) {
        Err(CudaError::Compile { name, log, .. }) => {
            assert_eq!(name, "row_sum_f32_7");
            assert!(log.contains("undeclared"), "{log}");
        }
        other => panic!("expected a compile error, got {:?}", other.map(|m| m.len())),
    }
}
