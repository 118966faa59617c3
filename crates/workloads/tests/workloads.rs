//! Each workload compiled against eager execution, on several random inputs and dtypes, and its
//! graph form against the graph `compile` traces from its `Tensor` form.

use braze::{DType, Graph};
use braze_workloads::{self as workloads, graph, Sizes};

/// Builds workload `name` at `sizes` with each seed and checks the compiled outputs against eager
/// ones within the dtype's tolerance; `graphs` is how many graphs one call runs.
fn check(name: &str, sizes: Sizes, seeds: &[u64], graphs: usize) {
    for &seed in seeds {
        let workload = workloads::build(name, &Sizes { seed, ..sizes.clone() }).unwrap();
        let compiled = workload.compile().fullgraph(graphs == 1);
        let explanation = compiled.explain(&workload.inputs).unwrap();
        assert_eq!(explanation.graphs.len(), graphs, "{name}");
        let got = compiled.call(&workload.inputs).unwrap();
        let want = workload.eager().unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            braze_cpu::assert_close(&g.to_host().unwrap(), &w.to_host().unwrap())
                .unwrap_or_else(|e| panic!("{name} seed {seed}: {e}"));
        }
    }
}

fn small() -> Sizes {
    Sizes { rows: 8, hidden: 32, n: 1000, k: 20, lo: 1, hi: 500, layers: 4, ..Sizes::default() }
}

#[test]
fn ln_relu_res() {
    check("ln_relu_res", small(), &[0, 1, 2], 1);
    check("ln_relu_res", Sizes { dtype: DType::BF16, ..small() }, &[3], 1);
}

#[test]
fn ew_chain() {
    check("ew_chain", small(), &[0, 1], 1);
    check("ew_chain", Sizes { dtype: DType::F16, ..small() }, &[2], 1);
}

#[test]
fn multisum() {
    check("multisum", small(), &[0, 1], 1);
}

#[test]
fn tiny_block() {
    check("tiny_block", Sizes { layers: 16, ..small() }, &[0, 1], 1);
}

#[test]
fn mlp_block() {
    check("mlp_block", Sizes { rows: 4, hidden: 16, ..small() }, &[0, 1], 1);
}

#[test]
fn sync_demo() {
    // Split at its item() and to_bool(): three graphs.
    check("sync_demo", small(), &[0, 1], 3);
}

/// `graph`'s text with the source locations the trace recorded removed.
fn without_locations(graph: &Graph) -> String {
    let mut graph = graph.clone();
    for id in graph.node_ids() {
        graph.set_loc(id, None);
    }
    graph.to_string()
}

/// The graph `compile` traces from workload `name` at `sizes`.
fn traced(name: &str, sizes: &Sizes) -> String {
    let workload = workloads::build(name, sizes).unwrap();
    let explanation = workload.compile().fullgraph(true).explain(&workload.inputs).unwrap();
    assert_eq!(explanation.graphs.len(), 1, "{name}");
    without_locations(&explanation.graphs[0])
}

#[test]
fn graph_forms_are_the_traced_graphs() {
    for dtype in [DType::F32, DType::BF16] {
        let sizes = Sizes { dtype, ..small() };
        let Sizes { rows, hidden, n, layers, .. } = sizes;
        let lengths = workloads::multisum_sizes(sizes.k, sizes.lo, sizes.hi, sizes.seed);
        let cases = [
            ("ln_relu_res", graph::ln_relu_res(dtype, rows, hidden)),
            ("ew_chain", graph::ew_chain(dtype, &[n])),
            ("multisum", graph::multisum(dtype, &lengths)),
            ("tiny_block", graph::tiny_block(dtype, layers, rows, hidden)),
            ("mlp_block", graph::mlp_block(dtype, rows, hidden, 4 * hidden)),
        ];
        for (name, built) in cases {
            let built = built.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(without_locations(&built), traced(name, &sizes), "{name} {dtype}");
        }
    }
}

#[test]
fn graph_forms_reject_what_the_ops_reject() {
    // An empty multisum has nothing to stack, as `Tensor::stack` of nothing is an error.
    assert!(graph::multisum(DType::F32, &[]).is_err());
    // Integer layer norm is not defined.
    assert!(graph::ln_relu_res(DType::I32, 2, 4).is_err());
}

#[test]
fn mlp_step_is_one_graph_without_breaks_and_its_loss_falls() {
    let sizes = Sizes { rows: 8, hidden: 16, ..Sizes::default() };
    let step = braze_workloads::mlp_step(&sizes, braze::Device::Cpu).unwrap();
    let compiled = step.compile().fullgraph(true);
    let explanation = compiled.explain(&step.inputs).unwrap();
    assert_eq!(explanation.graphs.len(), 1);
    assert!(explanation.breaks.is_empty());
    let text = explanation.to_string();
    assert!(text.contains("graphs: 1") && text.contains("breaks: 0") && text.contains("host syncs: 0"), "{text}");
    // Peak memory: the batch, the parameters and AdamW's two f32 moments of each, the gradients
    // (outputs, f32 like the parameters), and the arena.
    let peak = explanation.peak.expect("a fused plan");
    let params: usize = step_parameters(&sizes).iter().sum();
    let batch = 2 * sizes.rows * sizes.hidden * 4;
    // The rest are AdamW's device scalars (learning rate, step, skipped steps and the like).
    let scalars = peak.inputs - (batch + params * 4 * 3);
    assert!(scalars <= 64, "{} bytes of inputs past the tensors: {text}", scalars);
    assert!(peak.outputs >= params * 4 && peak.outputs <= params * 4 + 64, "the gradients and the loss: {text}");
    assert_eq!(peak.intermediates, explanation.arena_bytes.unwrap());
    assert!(text.contains(&format!("peak memory: {:.1} KiB a call", peak.total() as f64 / 1024.0)), "{text}");
    let loss = |c: &braze::Compiled<_>| c.call(&step.inputs).unwrap()[0].item::<f64>().unwrap();
    let first = loss(&compiled);
    let mut last = first;
    for _ in 0..20 {
        last = loss(&compiled);
    }
    assert!(last < 0.9 * first, "AdamW on a fixed batch lowers the loss: {first} -> {last}");
    assert_eq!(compiled.stats().recompiles, 0);
}

#[test]
fn mlp_training_step_names_every_parameter_the_optimizer_updates() {
    let sizes = Sizes { rows: 4, hidden: 8, ..Sizes::default() };
    let step = braze_workloads::mlp_training_step(&sizes, braze::Device::Cpu).unwrap();
    let names: Vec<&str> = step.params.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), 6 * braze_workloads::MLP_STEP_LAYERS);
    assert_eq!(names[..6], ["layers.0.w1", "layers.0.b1", "layers.0.w2", "layers.0.b2", "layers.0.g", "layers.0.beta"]);
    assert_eq!(names.last(), Some(&"layers.3.beta"));
    let shape = |i: usize| step.params[i].1.shape().dims().to_vec();
    assert_eq!((shape(0), shape(1), shape(2), shape(3)), (vec![8, 32], vec![32], vec![32, 8], vec![8]));
    // One call leaves each parameter's gradient and moves every parameter that had one.
    let before: Vec<Vec<f32>> = step.params.iter().map(|(_, p)| p.to_vec().unwrap()).collect();
    (step.workload.function)(&step.workload.inputs).unwrap();
    for ((name, p), old) in step.params.iter().zip(&before) {
        let grad = p.grad().unwrap_or_else(|| panic!("{name} has no gradient"));
        assert_eq!(grad.shape(), p.shape(), "{name}");
        // In f32 every parameter moves (AdamW's first step is about lr for each element).
        assert_ne!(&p.to_vec::<f32>().unwrap(), old, "{name} was not updated");
    }
}

#[test]
fn a_learning_rate_schedule_over_1000_steps_does_not_retrace() {
    use braze::optim::Optimizer;
    let sizes = Sizes { rows: 2, hidden: 4, ..Sizes::default() };
    let step = braze_workloads::mlp_training_step(&sizes, braze::Device::Cpu).unwrap();
    let compiled = step.workload.compile().fullgraph(true);
    let explanation = compiled.explain(&step.workload.inputs).unwrap();
    assert_eq!((explanation.graphs.len(), explanation.host_syncs), (1, 0));
    for i in 0..1000 {
        // Cosine decay from 1e-3, a new learning rate every step.
        let lr = 1e-3 * 0.5 * (1.0 + (std::f64::consts::PI * i as f64 / 1000.0).cos());
        step.optimizer.set_lr(lr).unwrap();
        compiled.call(&step.workload.inputs).unwrap();
    }
    let stats = compiled.stats();
    assert_eq!((stats.traces, stats.recompiles, stats.cache_hits), (1, 0, 1000), "{stats:?}");
    assert_eq!(step.optimizer.steps().item::<f64>().unwrap(), 1001.0);
}

/// The kernels of `plan` that write plan outputs `outputs` (graph outputs, in order).
fn writers(plan: &braze_plan::Plan, outputs: std::ops::Range<usize>) -> Vec<usize> {
    let mut kernels: Vec<usize> = plan.outputs[outputs]
        .iter()
        .map(|o| plan.kernels.iter().position(|k| k.outputs.contains(&o.buffer)).expect("a computed output"))
        .collect();
    kernels.sort();
    kernels.dedup();
    kernels
}

#[test]
fn mlp_step_updates_every_parameter_in_one_launch() {
    use braze_passes::{compile_to_plan, FusionOptions};
    use braze_plan::KernelKind;
    for dtype in [DType::F32, DType::BF16] {
        let sizes = Sizes { rows: 8, hidden: 16, dtype, ..Sizes::default() };
        let step = workloads::mlp_step(&sizes, braze::Device::Cpu).unwrap();
        let graph = step.compile().fullgraph(true).explain(&step.inputs).unwrap().graphs[0].clone();
        let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
        let ungrouped =
            compile_to_plan(&graph, &FusionOptions { multi_pointwise_limit: 0, ..FusionOptions::default() }).unwrap();
        // The graph's outputs: the loss, the gradients, then the optimizer's write-backs in the
        // order it assigns them: m, v and the parameter of each parameter, the step count and
        // the skipped-step count.
        let params = 6 * workloads::MLP_STEP_LAYERS;
        let outputs = plan.outputs.len();
        let updates = outputs - 2 - 3 * params..outputs - 2;
        let kernels = writers(&plan, updates.clone());
        assert_eq!(kernels.len(), 1, "{dtype}: the update of all {params} parameters is one launch\n{plan}");
        let KernelKind::MultiPointwise(multi) = &plan.kernels[kernels[0]].kind else {
            panic!("{dtype}: the update is not a multi-pointwise kernel\n{plan}")
        };
        // Other independent kernels may share the launch (bf16 gradients rounded for `.grad`).
        assert!(multi.members.len() >= params, "{dtype}: a member per parameter at least");
        // Without horizontal fusion every parameter's update is a kernel of its own at least
        // (some take two); with it, each multi-pointwise kernel saves the launches of all but
        // one of its members.
        assert!(writers(&ungrouped, updates).len() >= params, "{dtype}");
        let saved: usize = plan
            .kernels
            .iter()
            .map(|k| match &k.kind {
                KernelKind::MultiPointwise(multi) => multi.members.len() - 1,
                _ => 0,
            })
            .sum();
        assert_eq!(ungrouped.kernel_count() - plan.kernel_count(), saved, "{dtype}");
    }
}

/// The element count of each of mlp_step's parameters at `sizes`.
fn step_parameters(sizes: &Sizes) -> Vec<usize> {
    let (h, inner) = (sizes.hidden, 4 * sizes.hidden);
    [h * inner, inner, inner * h, h, h, h].repeat(braze_workloads::MLP_STEP_LAYERS)
}
