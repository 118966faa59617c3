//! The GPT-2 workloads at small sizes on the CPU backend: each step is one graph without
//! breaks or host syncs, and compiled matches eager.

use braze::Device;
use braze_workloads::gpt2::{block_workload, gpt2_step_flops, gpt2_training_step};
use braze_workloads::{build, Gpt2Sizes};

fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what}[{i}]: {x} vs {y}");
    }
}

#[test]
fn gpt2_step_is_one_graph_without_breaks_and_matches_eager() {
    let sizes = Gpt2Sizes::small();
    let (compiled_side, _) = gpt2_training_step(&sizes, Device::Cpu).unwrap();
    let (eager_side, trainer) = gpt2_training_step(&sizes, Device::Cpu).unwrap();
    let compiled = compiled_side.compile().fullgraph(true);
    let explanation = compiled.explain(&compiled_side.inputs).unwrap();
    assert_eq!((explanation.graphs.len(), explanation.breaks.len(), explanation.host_syncs), (1, 0, 0));
    // explain ran one step; the eager side takes one too, then both another.
    eager_side.eager().unwrap();
    let c = compiled.call(&compiled_side.inputs).unwrap();
    let e = eager_side.eager().unwrap();
    let (cl, el) = (c[0].item::<f32>().unwrap(), e[0].item::<f32>().unwrap());
    close(&[cl], &[el], 1e-4, "second step's loss");
    close(&[c[1].item::<f32>().unwrap()], &[e[1].item::<f32>().unwrap()], 1e-3, "gradient norm");
    assert!(el < (sizes.vocab_size as f32).ln() + 0.1, "loss {el} near ln(vocab) at the start");
    assert!(gpt2_step_flops(&trainer, &sizes) > 0.0);
    assert_eq!(build("gpt2_step", &Default::default()).unwrap().input_names, ["idx", "targets"]);
}

#[test]
fn block_workloads_match_eager() {
    let sizes = Gpt2Sizes::small();
    for backward in [false, true] {
        let w = block_workload(&sizes, Device::Cpu, backward).unwrap();
        let compiled = w.compile().fullgraph(true);
        let explanation = compiled.explain(&w.inputs).unwrap();
        assert_eq!((explanation.graphs.len(), explanation.breaks.len()), (1, 0), "backward {backward}");
        let c = compiled.call(&w.inputs).unwrap()[0].to_vec::<f32>().unwrap();
        let e = w.eager().unwrap()[0].to_vec::<f32>().unwrap();
        close(&c, &e, 1e-4, if backward { "block_step" } else { "block_fwd" });
    }
}

/// `gpt2_step` in bf16 is nanoGPT's mixed precision: f32 parameters, the forward in a bf16
/// autocast region (its matmuls and attention in bf16, norms and the loss in f32), one graph;
/// its loss is the f32 step's within bf16's rounding, and compiled matches eager.
#[test]
fn gpt2_step_in_bf16_autocasts_its_forward_over_f32_parameters() {
    use braze::DType;
    use braze_ir::Op;
    use braze_nn::Module;
    let sizes = Gpt2Sizes { dtype: DType::BF16, ..Gpt2Sizes::small() };
    let (compiled_side, trainer) = gpt2_training_step(&sizes, Device::Cpu).unwrap();
    assert_eq!(trainer.autocast, Some(DType::BF16));
    trainer.model.named_parameters().iter().for_each(|(name, p)| assert_eq!(p.dtype(), DType::F32, "{name}"));
    let compiled = compiled_side.compile().fullgraph(true);
    let explanation = compiled.explain(&compiled_side.inputs).unwrap();
    assert_eq!((explanation.graphs.len(), explanation.breaks.len(), explanation.host_syncs), (1, 0, 0));
    let graph = &explanation.graphs[0];
    let dtypes_of = |pick: fn(&Op) -> bool| -> Vec<DType> {
        graph.node_ids().into_iter().map(|id| graph.node(id)).filter(|n| pick(&n.op)).map(|n| n.dtype).collect()
    };
    let matmuls = dtypes_of(|op| matches!(op, Op::MatMul));
    assert!(!matmuls.is_empty() && matmuls.iter().all(|d| *d == DType::BF16), "{matmuls:?}");
    assert_eq!(dtypes_of(|op| matches!(op, Op::Attention { .. })), vec![DType::BF16; sizes.n_layer]);
    let norms = dtypes_of(|op| matches!(op, Op::LayerNorm { .. }));
    assert!(!norms.is_empty() && norms.iter().all(|d| *d == DType::F32), "{norms:?}");
    assert_eq!(dtypes_of(|op| matches!(op, Op::CrossEntropy { .. })), vec![DType::F32]);
    // Against eager (one step behind after explain's) and the f32 step from the same weights.
    let (eager_side, _) = gpt2_training_step(&sizes, Device::Cpu).unwrap();
    let (f32_side, _) = gpt2_training_step(&Gpt2Sizes::small(), Device::Cpu).unwrap();
    let first_eager = eager_side.eager().unwrap()[0].item::<f32>().unwrap();
    let first_f32 = f32_side.eager().unwrap()[0].item::<f32>().unwrap();
    close(&[first_eager], &[first_f32], 1e-2, "bf16 autocast loss against the f32 loss");
    let c = compiled.call(&compiled_side.inputs).unwrap()[0].item::<f32>().unwrap();
    let e = eager_side.eager().unwrap()[0].item::<f32>().unwrap();
    close(&[c], &[e], 1e-3, "second step's loss, compiled and eager");
}
