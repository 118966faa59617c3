//! The random-graph fuzz through the emulator (`tests/emulator`): each graph's generated CUDA C
//! run on the CPU, judged against the reference as the GPU's outputs are, and compared with the
//! CPU plan executor (outputs the exactness tables call exact must agree exactly). So the CPU
//! checks, without a GPU, that the plan executor models the generated kernels faithfully.
//! `BRAZE_FUZZ_EMULATED_GRAPHS` graphs of each generator mode (default 16: a thread per CUDA
//! thread is slow) from `BRAZE_FUZZ_SEED` (default 0).

use crate::common::random_inputs;
use crate::emulator;
use crate::generator::{random_graph, random_model_graph, Counts};
use crate::gpu::agreement;
use crate::judge::judge;
use crate::run::run_on_cpu;
use braze_codegen::{default_config, Target};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn emulated_random_graphs_match_the_reference_and_the_plan_executor() {
    if !emulator::available() {
        println!("skipped: no C++ compiler (c++ or $CXX)");
        return;
    }
    let first = env_u64("BRAZE_FUZZ_SEED").unwrap_or(0);
    let graphs = env_u64("BRAZE_FUZZ_EMULATED_GRAPHS").unwrap_or(16);
    let target = Target::h200();
    let (mut kernels, mut failures) = (0, Vec::new());
    type Generator = fn(u64, &mut Counts) -> braze_ir::Graph;
    let generators: [(&str, Generator); 2] = [("graph", random_graph), ("model graph", random_model_graph)];
    for (seed, (mode, generate)) in (first..first + graphs).flat_map(|s| generators.map(|g| (s, g))) {
        let graph = generate(seed, &mut Counts::default());
        let inputs = random_inputs(&graph, seed, |_| !seed.is_multiple_of(3));
        let Ok(cpu) = run_on_cpu(&graph, &inputs, false) else {
            continue; // the CPU fuzz reports its own failures
        };
        let configs: Vec<_> = (0..cpu.plan.kernels.len()).map(|k| default_config(&cpu.plan, k, &target)).collect();
        kernels += configs.len();
        let checked = emulator::run_plan(&cpu.plan, &configs, &target, &inputs).and_then(|actual| {
            judge(&actual, &cpu.refs)?;
            agreement(&graph, &actual, &cpu.actual, &cpu.refs)
        });
        if let Err(e) = checked {
            failures.push(format!("{mode} of seed {seed}: {e}\ngraph:\n{graph}\nplan:\n{}", cpu.plan));
        }
    }
    println!(
        "emulated fuzz: {graphs} graphs and {graphs} model graphs from seed {first}, {kernels} kernels, {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
