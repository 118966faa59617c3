//! Helpers shared by the pipeline and fuzz tests: building graphs without source locations,
//! reproducible inputs, whether NVRTC is there, compiling generated kernels with it, the wide
//! reference (bf16/f16 intermediates kept in f32, as kernels keep them), and
//! comparing a plan's outputs with the reference within the tolerance of the narrowest float
//! dtype the graph computes in.

#![allow(dead_code)]

use braze_codegen::GeneratedKernel;
pub use braze_cpu::wide_graph;
use braze_cpu::{assert_close_with, inject_specials, random_tensor, tolerance};
use braze_ir::{BinaryOp, DType, Graph, HostTensor, NodeId, Op, ReduceOp, Shape, UnaryOp};

/// Builds a graph op by op; every call panics with the op's typing error, so a case that is not
/// well typed fails where it is written.
#[derive(Default)]
pub struct Builder {
    pub g: Graph,
}

impl Builder {
    pub fn new() -> Builder {
        Builder::default()
    }

    pub fn input(&mut self, dtype: DType, shape: impl Into<Shape>) -> NodeId {
        self.g.input(dtype, shape)
    }

    pub fn constant(&mut self, value: f64, dtype: DType) -> NodeId {
        self.g.constant(value, dtype)
    }

    pub fn op(&mut self, op: Op, operands: &[NodeId]) -> NodeId {
        let name = op.name();
        self.g.add(op, operands, None).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    pub fn un(&mut self, op: UnaryOp, x: NodeId) -> NodeId {
        self.op(Op::Unary { op }, &[x])
    }

    pub fn bin(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        self.op(Op::Binary { op }, &[a, b])
    }

    pub fn add(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.bin(BinaryOp::Add, a, b)
    }

    pub fn mul(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.bin(BinaryOp::Mul, a, b)
    }

    pub fn reduce(&mut self, op: ReduceOp, x: NodeId, axes: &[usize], keepdim: bool) -> NodeId {
        self.op(Op::Reduce { op, axes: axes.to_vec(), keepdim }, &[x])
    }

    pub fn cast(&mut self, x: NodeId, dtype: DType) -> NodeId {
        self.g.cast(x, dtype).unwrap_or_else(|e| panic!("cast: {e}"))
    }

    pub fn reshape(&mut self, x: NodeId, shape: impl Into<Shape>) -> NodeId {
        self.g.reshape(x, shape).unwrap_or_else(|e| panic!("reshape: {e}"))
    }

    pub fn broadcast_to(&mut self, x: NodeId, shape: impl Into<Shape>) -> NodeId {
        self.g.broadcast_to(x, shape).unwrap_or_else(|e| panic!("broadcast_to: {e}"))
    }

    /// The graph with `outputs` as its results.
    pub fn finish(mut self, outputs: Vec<NodeId>) -> Graph {
        self.g.set_outputs(outputs);
        self.g
    }
}

/// Causal attention as GPT-2 writes it, over one `[B, T, 3 H D]` input (a fused q, k, v
/// projection's output): q, k and v sliced out of it and split into heads (`[B, H, T, D]`
/// views), the output merged back to `[B, T, H D]`; with `backward`, the gradient of the input
/// for an incoming gradient of the output instead.
pub fn projected_attention(dtype: DType, [batch, seq, heads, head_dim]: [usize; 4], backward: bool) -> Graph {
    let width = heads * head_dim;
    let mut b = Builder::new();
    let qkv = b.input(dtype, [batch, seq, 3 * width]);
    let split: Vec<NodeId> = (0..3)
        .map(|i| {
            let part = b.op(Op::Slice { axis: 2, start: i * width, end: (i + 1) * width, step: 1 }, &[qkv]);
            let heads_apart = b.reshape(part, [batch, seq, heads, head_dim]);
            b.op(Op::Permute { perm: vec![0, 2, 1, 3] }, &[heads_apart])
        })
        .collect();
    let scale = if head_dim == 0 { 1.0 } else { 1.0 / (head_dim as f64).sqrt() };
    let out = b.op(Op::Attention { causal: true, scale }, &split);
    let merged = b.op(Op::Permute { perm: vec![0, 2, 1, 3] }, &[out]);
    let y = b.reshape(merged, [batch, seq, width]);
    if !backward {
        return b.finish(vec![y]);
    }
    let dy = b.input(dtype, [batch, seq, width]);
    let grads = braze_autodiff::backward(&mut b.g, &[(y, dy)], &[qkv]).expect("float inputs");
    b.finish(grads.into_iter().map(|g| g.expect("the input gets a gradient")).collect())
}

/// One tensor per graph input from `seed`: `random_tensor` data (never all zeros), with NaN,
/// +-Inf and signed zeros injected into the float inputs `specials` accepts (by input index).
pub fn random_inputs(graph: &Graph, seed: u64, specials: impl Fn(usize) -> bool) -> Vec<HostTensor> {
    graph
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let node = graph.node(id);
            let input_seed = seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
            let mut t = random_tensor(node.dtype, node.shape.clone(), input_seed);
            if specials(i) {
                inject_specials(&mut t, input_seed ^ 0xA5A5);
            }
            t
        })
        .collect()
}

/// Float dtypes from the narrowest significand up.
const FLOATS_BY_PRECISION: [DType; 3] = [DType::BF16, DType::F16, DType::F32];

/// The narrowest float dtype any computed node of `graph` has (inputs excluded: a bf16 input read
/// as f32 is exact), or f32 when it computes no floats.
pub fn narrowest_float(graph: &Graph) -> DType {
    let computed: Vec<DType> = graph
        .node_ids()
        .into_iter()
        .map(|id| graph.node(id))
        .filter(|n| !matches!(n.op, Op::Input { .. }))
        .map(|n| n.dtype)
        .collect();
    FLOATS_BY_PRECISION.into_iter().find(|d| computed.contains(d)).unwrap_or(DType::F32)
}

/// Compares every output pair within the tolerance of `dtype` (integers and bools exactly),
/// against the reference or, where given, the wide reference ([`wide_graph`]'s outputs), a few
/// elements in a thousand a few ulps further ([`braze_cpu::compare::assert_close_bounded`]);
/// `Err` names the first output that differs.
pub fn compare_outputs(
    actual: &[HostTensor],
    expected: &[HostTensor],
    wide: Option<&[HostTensor]>,
    dtype: DType,
) -> Result<(), String> {
    if actual.len() != expected.len() {
        return Err(format!("{} outputs, expected {}", actual.len(), expected.len()));
    }
    for (j, (a, e)) in actual.iter().zip(expected).enumerate() {
        let checked = match wide {
            Some(wide) => {
                let bounds = braze_cpu::compare::Bounds::for_rounding(e.dtype(), [dtype], e.numel());
                braze_cpu::compare::assert_close_bounded(a, e, Some(&wide[j]), &bounds).map_err(|e| e.to_string())
            }
            None => {
                let (rtol, atol) = tolerance(dtype);
                assert_close_with(a, e, rtol, atol)
            }
        };
        checked.map_err(|msg| format!("output {j} ({}{}): {msg}", e.dtype(), e.shape()))?;
    }
    Ok(())
}

/// Whether kernels can be compiled here: NVRTC found, or a skip printed; a missing NVRTC fails
/// under `BRAZE_REQUIRE_NVRTC=1`.
pub fn nvrtc_enabled() -> bool {
    if braze_cuda::nvrtc::nvrtc_available() {
        return true;
    }
    assert!(
        std::env::var("BRAZE_REQUIRE_NVRTC").as_deref() != Ok("1"),
        "NVRTC not found, and BRAZE_REQUIRE_NVRTC=1 requires it (set LD_LIBRARY_PATH to its lib folder)"
    );
    println!("skipped: NVRTC not found (kernels are generated but not compiled)");
    false
}

/// Compiles one generated kernel for sm_90: every launched entry must exist and no entry may spill.
pub fn compile_for_sm90(kernel: &GeneratedKernel) -> Result<(), String> {
    use braze_cuda::nvrtc::{compile, CompileOptions};
    let module = compile(&kernel.source, &format!("{}.cu", kernel.name), &CompileOptions::default())
        .map_err(|e| format!("{}: {e}", kernel.name))?;
    check_module(kernel, &module)
}

/// Kernels whose NVRTC log lacked the `ptxas` report of an entry, so its spills could not be read.
pub static KERNELS_WITHOUT_PTXAS_REPORT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Entries whose spill [`tolerated_spill`] lets pass outside CI, counted and printed by the
/// caller.
pub static TOLERATED_SPILLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Spills the GPU machine's NVRTC (CUDA 13.0) reports in kernels that CI's NVRTC compiles without
/// any: at most 8 B in an entry launched (or, with nothing to launch, declared) with 1024
/// threads and using exactly the 32 or 64 registers such a block allows (GPU fuzz seed
/// 30,001,668: a layer norm over zero rows), or at most 32 B in a kernel calling `sinf`/`cosf`
/// (their slow-path argument reduction, which CI's NVRTC reports as stack). Any other spill
/// fails.
fn tolerated_spill(kernel: &GeneratedKernel, r: &braze_cuda::nvrtc::KernelResources) -> bool {
    let bytes = r.spill_stores.max(r.spill_loads);
    // A kernel with nothing to launch (zero rows) still declares its block size in its bounds.
    let block = kernel
        .launches
        .iter()
        .find(|l| l.entry == r.kernel)
        .map(|l| l.block.iter().product::<u32>())
        .or_else(|| declared_block(&kernel.source));
    let at_register_cap = block == Some(1024) && matches!(r.registers, 32 | 64) && bytes <= 8;
    let trigonometry = (kernel.source.contains("sinf(") || kernel.source.contains("cosf(")) && bytes <= 32;
    at_register_cap || trigonometry
}

/// The thread count of a kernel's first `__launch_bounds__(threads, ...)`.
fn declared_block(source: &str) -> Option<u32> {
    let rest = &source[source.find("__launch_bounds__(")? + "__launch_bounds__(".len()..];
    rest[..rest.find([',', ')'])?].trim().parse().ok()
}

/// Checks a kernel's compiled module: every launched entry exists and no entry spills.
///
/// The CUDA 13.0 NVRTC of the GPU machine sometimes leaves the `ptxas -v` report of some or all
/// entries out of the program log (the PyPI build CI uses never does). Where
/// `BRAZE_REQUIRE_NVRTC=1` (CI) every launched entry's report is required; elsewhere a module
/// missing one is counted in [`KERNELS_WITHOUT_PTXAS_REPORT`] and printed by the caller (loading
/// the module still checks its entries exist), and the reports it has are still checked.
pub fn check_module(kernel: &GeneratedKernel, module: &braze_cuda::CompiledModule) -> Result<(), String> {
    let required = std::env::var("BRAZE_REQUIRE_NVRTC").as_deref() == Ok("1");
    if let Some(launch) = kernel.launches.iter().find(|l| module.resources_of(&l.entry).is_none()) {
        if required {
            return Err(format!(
                "{}: ptxas reports no entry `{}`; the NVRTC log:\n{}",
                kernel.name,
                launch.entry,
                module.log.lines().take(40).collect::<Vec<_>>().join("\n")
            ));
        }
        KERNELS_WITHOUT_PTXAS_REPORT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    for r in &module.resources {
        if r.spill_stores > 0 || r.spill_loads > 0 {
            if !required && tolerated_spill(kernel, r) {
                TOLERATED_SPILLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                continue;
            }
            return Err(format!(
                "{}: `{}` spills ({} B stored, {} B loaded, {} registers)",
                kernel.name, r.kernel, r.spill_stores, r.spill_loads, r.registers
            ));
        }
    }
    Ok(())
}
