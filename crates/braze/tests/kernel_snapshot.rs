//! A user's own kernel snapshot: `Compiled::kernel_snapshot` hands out the fused plan and the
//! CUDA C of a compiled function, to review with `cargo insta review` when braze changes.

use braze::{compile, DType, Device, Result, Tensor};

#[test]
fn a_compiled_function_hands_out_its_plan_and_kernels_to_snapshot() -> Result<()> {
    let block = compile(|a: &[Tensor]| Ok(vec![a[0].layer_norm(&a[1], &a[2], 1e-5)?.relu()?.add(&a[0])?]))
        .fullgraph(true)
        .name("user_block");
    let x = Tensor::randn([64, 256], DType::F32, 0)?;
    let w = Tensor::ones([256], DType::F32, Device::Cpu)?;
    let b = Tensor::zeros([256], DType::F32, Device::Cpu)?;
    let args = [x, w, b];
    let text = block.kernel_snapshot(&args)?;
    // One graph, one row kernel holding the norm, the activation and the residual.
    assert!(text.starts_with("==== graph 0:"), "{text}");
    assert_eq!(text.matches("---- kernel ").count(), 1, "{text}");
    assert!(text.contains("__global__"), "{text}");
    // The same text on a second call: it is deterministic, so a snapshot of it is stable.
    assert_eq!(block.kernel_snapshot(&args)?, text);
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../../snapshots/plans"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.bind(|| insta::assert_snapshot!("user_block_kernel_snapshot", text));
    Ok(())
}
