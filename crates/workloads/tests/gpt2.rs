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
