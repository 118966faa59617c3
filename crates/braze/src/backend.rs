//! The seam between the frontend and whatever executes graphs.
//!
//! Every graph the frontend runs, traced or eager, goes through [`compile_graph`], which turns a
//! [`Graph`] into an [`Executable`] for a [`Target`]. Today the only executable is the CPU
//! reference ([`braze_cpu::eval_graph`]). Fusion (graph -> plan), codegen and the CUDA runtime
//! plug in here as another `Executable` chosen by the target's device and mode; nothing else in
//! the frontend needs to change.
//!
//! **Invariant:** an `Executable` is pure: the same inputs give the same outputs, and it never
//! keeps a reference to an input after `run` returns.

use crate::logging;
use crate::{Device, Error, Mode, Result, Tensor};
use braze_ir::{Graph, HostTensor};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// A graph made ready to run.
pub trait Executable: Send + Sync {
    /// Runs on `inputs`, one per graph input in order, and returns one tensor per graph output.
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>>;

    /// Kernels generated for the graph and launches per call, for backends that generate
    /// kernels; the CPU reference interprets the graph and has none.
    fn kernel_counts(&self) -> Option<KernelCounts> {
        None
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelCounts {
    pub kernels: usize,
    pub launches_per_call: usize,
}

/// What a graph is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub device: Device,
    /// Passed through for the GPU backend (CUDA graphs, autotuning); the CPU reference ignores it.
    pub mode: Mode,
}

/// Makes `graph` runnable on `target`.
pub fn compile_graph(graph: &Graph, target: Target) -> Result<Arc<dyn Executable>> {
    match target.device {
        Device::Cpu => Ok(Arc::new(CpuGraph { graph: graph.clone() })),
        Device::Cuda(_) => Err(Error::DeviceUnavailable { op: "compile".into(), device: target.device }),
    }
}

/// The CPU reference: interprets the graph with `braze_cpu::eval_graph`.
struct CpuGraph {
    graph: Graph,
}

impl Executable for CpuGraph {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let mut host: Vec<HostTensor> = Vec::with_capacity(inputs.len());
        for (index, input) in inputs.iter().enumerate() {
            match input.host_data() {
                Some(data) => host.push((*data).clone()),
                None => return Err(Error::StaleTrace { op: format!("graph input {index}"), loc: None }),
            }
        }
        let outputs = braze_cpu::eval_graph(&self.graph, &host)
            .map_err(|cpu| Error::Cpu { context: "CPU reference executor".into(), cpu: Box::new(cpu) })?;
        Ok(outputs.into_iter().map(Tensor::from_host).collect())
    }
}

/// Compiled graphs keyed by their target device and structure (the canonical text, which
/// includes every input's dtype and shape), so a graph traced again with the same structure is
/// not compiled again. Holds at most [`GraphCache::CAPACITY`] graphs, evicting the oldest: a
/// function that bakes a changing host value into its graphs would otherwise grow it forever.
#[derive(Default)]
pub(crate) struct GraphCache {
    state: Mutex<GraphCacheState>,
}

#[derive(Default)]
struct GraphCacheState {
    by_key: HashMap<String, Arc<dyn Executable>>,
    oldest_first: VecDeque<String>,
    compiled: usize,
}

impl GraphCache {
    pub(crate) const CAPACITY: usize = 256;

    /// The executable for `graph`, compiled on a miss (`true` in the second field).
    pub(crate) fn get_or_compile(
        &self,
        graph: &Graph,
        target: Target,
        function: &str,
    ) -> Result<(Arc<dyn Executable>, bool)> {
        let key = format!("{}\n{}", target.device, graph.to_text());
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(exe) = state.by_key.get(&key) {
            return Ok((exe.clone(), false));
        }
        let exe = compile_traced(graph, target, function)?;
        if state.oldest_first.len() >= Self::CAPACITY {
            if let Some(oldest) = state.oldest_first.pop_front() {
                state.by_key.remove(&oldest);
            }
        }
        state.oldest_first.push_back(key.clone());
        state.by_key.insert(key, exe.clone());
        state.compiled += 1;
        Ok((exe, true))
    }

    /// Graphs compiled so far (evicted ones included).
    pub(crate) fn compiled(&self) -> usize {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).compiled
    }
}

/// Compiles a graph that came from tracing a user function: logged and dumped, unlike the
/// one-op graphs of eager execution.
pub(crate) fn compile_traced(graph: &Graph, target: Target, function: &str) -> Result<Arc<dyn Executable>> {
    logging::graph_compiled(graph, function);
    compile_graph(graph, target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use braze_ir::{BinaryOp, DType, Op};

    /// `x + value`: one graph structure per value.
    fn add_constant(value: f64) -> Graph {
        let mut graph = Graph::new();
        let x = graph.input(DType::F32, [2]);
        let c = graph.constant(value, DType::F32);
        let y = graph.add(Op::Binary { op: BinaryOp::Add }, &[x, c], None).unwrap();
        graph.set_outputs(vec![y]);
        graph
    }

    #[test]
    fn graph_cache_reuses_by_structure_and_evicts_the_oldest() {
        let cache = GraphCache::default();
        let target = Target { device: Device::Cpu, mode: Mode::Default };
        let compile = |value: f64| cache.get_or_compile(&add_constant(value), target, "f").unwrap().1;
        assert!(compile(0.0));
        assert!(!compile(0.0), "same structure: reused");
        for i in 1..=GraphCache::CAPACITY {
            assert!(compile(i as f64));
        }
        assert!(compile(0.0), "the oldest graph was evicted");
        assert_eq!(cache.compiled(), GraphCache::CAPACITY + 2);
    }
}
