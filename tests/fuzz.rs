//! Random-graph fuzzing of the whole pipeline against the reference.
//!
//! A seeded generator builds well-typed graphs of 1-32 ops drawn from the op set (unary, binary
//! with broadcasting and scalar constants, where, cast, reductions over random axes with and
//! without kept dims, reshape, permute, slice, broadcast_to, concat, stack, softmax, layer_norm,
//! rms_norm and small matmuls, plus stacks of full reductions and norms over rows longer than the
//! row cache), over f32, bf16, i32 and bool values of rank 0-4 with dims from
//! `{0, 1, 2, 3, 5, 7, 8, 16, 33}`. A draw is type-checked before it is added (`infer`, then
//! `Graph::add_declared`); one that is ill-typed or too large is not added and counts as
//! skipped. Each graph is optimized and fused, every kernel gets CUDA C with its default config
//! (every 10th graph's kernels are also compiled by NVRTC for sm_90 when it is found), and the
//! plan run by `eval_plan` is compared with `eval_graph` on `random_tensor` inputs, two graphs
//! in three with NaN, +-Inf and signed zeros injected into every float input.
//!
//! Numerics. Fused kernels compute in f32 and the reference in f64 rounded after every op. For
//! add, sub, mul, div, sqrt, reciprocal, max, min, neg, abs, relu, comparisons, casts, views,
//! concat, stack, where and max/min reductions both give the same bits on the same inputs (one
//! correct rounding either way). Transcendentals, pow, float sums and means, norms, softmax,
//! matmul and any arithmetic on bf16 (fused kernels keep bf16 intermediates in f32) can differ in
//! the last bits, and what follows can magnify that (a layer norm of a nearly constant row,
//! `pow`, a sum that cancels). So:
//! - ops that turn a last-bit difference into a different answer (comparisons, isnan, isfinite
//!   and not of floats, casts of floats to integers or bool) are only drawn on operands whose
//!   bits agree; on other operands the draw is skipped and counted;
//! - float outputs are compared with the tolerance of the narrowest float dtype the graph
//!   computes in; an element outside it still passes when it lies within 4 times the spread of
//!   two perturbed references, i.e. the reference run again with every operand and result of the
//!   ops above multiplied by `1 + e`, `|e|` a unit or two in the last place of the value's dtype
//!   (for the operands of an op that sums `n` elements in f32, `sqrt(n)` f32 units, as the
//!   error of an f32 sum grows). The spread is large only where the reference itself is that
//!   sensitive; the report counts the elements that needed it. Integer and bool outputs must
//!   match exactly.
//!
//! `BRAZE_FUZZ_GRAPHS` sets the number of graphs (default 1,000) and `BRAZE_FUZZ_SEED` the
//! first seed (default 0). A failure is shrunk (outputs dropped, ops cut into inputs holding the
//! values they had, or bypassed, while the same stage still fails) and the minimal graph's text
//! and small inputs are printed; fixed failures are kept as the `regression_*` tests below.

mod common;

use braze_codegen::{default_config, generate, KernelCode, Target};
use braze_cpu::{assert_close_with, eval_graph, eval_plan};
use braze_cuda::nvrtc::nvrtc_available;
use braze_ir::infer::{infer, Declared};
use braze_ir::{BinaryOp, DType, Graph, HostTensor, NodeId, Op, ReduceOp, Shape, UnaryOp};
use braze_passes::{compile_to_plan, FusionOptions};
use common::{compile_for_sm90, narrowest_float, random_inputs, Builder};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::{self, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};

const DIMS: [usize; 9] = [0, 1, 2, 3, 5, 7, 8, 16, 33];
const MAX_RANK: usize = 4;
/// Largest tensor a graph holds, so a debug build runs a thousand graphs in a few minutes.
const MAX_NUMEL: usize = 4096;
const MAX_OPS: usize = 32;
/// Every how many graphs the kernels are also compiled with NVRTC.
const NVRTC_EVERY: u64 = 10;
/// Failures shrunk and printed per stage (the rest are counted).
const SHRUNK_PER_STAGE: usize = 3;

// ---- random numbers ---------------------------------------------------------------------------

/// splitmix64: a seed gives the same graphs on every machine and with every `rand` version.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64) < p * (1u64 << 53) as f64
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

// ---- the generator ----------------------------------------------------------------------------

/// An operand of a draw before the draw is added.
#[derive(Clone, Debug)]
enum Arg {
    Value(NodeId),
    /// A new graph input.
    Input(DType, Shape),
    /// A scalar constant.
    Const(f64, DType),
}

/// Why a draw was not added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Skip {
    IllTyped,
    TooLarge,
    /// A comparison, mask or float-to-integer cast of a value whose last bits may differ.
    InexactOperand,
}

/// Whether `op` turns a last-bit difference of its float operand into a different answer.
fn is_discontinuous(op: &Op, operand: DType, result: DType) -> bool {
    if !operand.is_float() {
        return false;
    }
    match op {
        Op::Unary { op } => !op.def().continuous,
        Op::Binary { op } => !op.def().continuous,
        Op::Cast => !result.is_float(),
        _ => false,
    }
}

/// Whether `op` gives the same bits in fused f32 kernels as in the reference, given operands
/// that do: one correctly rounded f32 operation, or no rounding at all.
fn exact_result(op: &Op, dtype: DType) -> bool {
    match op {
        Op::Unary { op } => op.def().exactness.exact_in(dtype),
        Op::Binary { op } => op.def().exactness.exact_in(dtype),
        Op::Reduce { op: ReduceOp::Sum | ReduceOp::Mean, .. } => !dtype.is_float(),
        Op::Softmax { .. } | Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::MatMul => false,
        _ => true,
    }
}

#[derive(Default)]
struct Counts {
    ops: usize,
    skipped: BTreeMap<Skip, usize>,
}

struct Generator {
    rng: Rng,
    g: Graph,
    /// Every value, in creation order.
    values: Vec<NodeId>,
    /// Values whose bits agree between fused kernels and the reference.
    exact: HashSet<NodeId>,
    /// Largest result a draw may have.
    cap: usize,
}

impl Generator {
    fn new(seed: u64) -> Generator {
        Generator { rng: Rng(seed), g: Graph::new(), values: Vec::new(), exact: HashSet::new(), cap: MAX_NUMEL }
    }

    fn random_dtype(&mut self) -> DType {
        match self.rng.below(20) {
            0..=9 => DType::F32,
            10..=13 => DType::BF16,
            14..=16 => DType::I32,
            _ => DType::Bool,
        }
    }

    fn random_shape(&mut self) -> Shape {
        loop {
            let rank = self.rng.below(MAX_RANK + 1);
            let dims: Vec<usize> = (0..rank).map(|_| self.rng.pick(&DIMS)).collect();
            if dims.iter().product::<usize>() <= MAX_NUMEL {
                return Shape(dims);
            }
        }
    }

    fn new_input(&mut self, dtype: DType, shape: Shape) -> NodeId {
        let id = self.g.input(dtype, shape);
        self.values.push(id);
        self.exact.insert(id);
        id
    }

    fn type_of(&self, arg: &Arg) -> (DType, Shape) {
        match arg {
            Arg::Value(id) => (self.g.node(*id).dtype, self.g.node(*id).shape.clone()),
            Arg::Input(dtype, shape) => (*dtype, shape.clone()),
            Arg::Const(_, dtype) => (*dtype, Shape::scalar()),
        }
    }

    fn is_exact(&self, arg: &Arg) -> bool {
        match arg {
            Arg::Value(id) => self.exact.contains(id),
            Arg::Input(..) | Arg::Const(..) => true,
        }
    }

    /// Type-checks `op` on `args` (with `declared` for cast, reshape and broadcast_to), then adds
    /// the new inputs and constants and the op.
    fn commit(&mut self, op: Op, args: &[Arg], declared: Option<(DType, Shape)>) -> Result<NodeId, Skip> {
        let types: Vec<(DType, Shape)> = args.iter().map(|a| self.type_of(a)).collect();
        let refs: Vec<(DType, &Shape)> = types.iter().map(|(d, s)| (*d, s)).collect();
        let decl = declared.as_ref().map(|(dtype, shape)| Declared { dtype: *dtype, shape });
        let (dtype, shape) = infer(&op, &refs, decl).map_err(|_| Skip::IllTyped)?;
        if shape.numel() > self.cap {
            return Err(Skip::TooLarge);
        }
        if let Some((operand, _)) = types.first() {
            let all_exact = args.iter().all(|a| self.is_exact(a));
            if is_discontinuous(&op, *operand, dtype) && !all_exact {
                return Err(Skip::InexactOperand);
            }
        }
        let exact = args.iter().all(|a| self.is_exact(a)) && exact_result(&op, types.first().map_or(dtype, |t| t.0));
        let ids: Vec<NodeId> = args
            .iter()
            .map(|a| match a {
                Arg::Value(id) => *id,
                Arg::Input(dtype, shape) => self.new_input(*dtype, shape.clone()),
                Arg::Const(value, dtype) => self.g.constant(*value, *dtype),
            })
            .collect();
        let id = self
            .g
            .add_declared(op, &ids, dtype, shape, None)
            .unwrap_or_else(|e| panic!("infer accepted what Graph::add_declared rejects: {e}"));
        self.values.push(id);
        if exact {
            self.exact.insert(id);
        }
        Ok(id)
    }

    /// A value to build on: the newest half the time, else any.
    fn operand(&mut self) -> NodeId {
        let n = self.values.len();
        if self.rng.chance(0.5) {
            self.values[n - 1]
        } else {
            self.values[self.rng.below(n)]
        }
    }

    /// A shape that broadcasts with `shape`: some dims 1, leading dims dropped, or one added.
    fn broadcast_partner(&mut self, shape: &Shape) -> Shape {
        let mut dims: Vec<usize> = shape.dims().iter().map(|&d| if self.rng.chance(0.3) { 1 } else { d }).collect();
        let drop = self.rng.below(dims.len() + 1);
        if self.rng.chance(0.4) {
            dims.drain(..drop);
        }
        if dims.len() < MAX_RANK && self.rng.chance(0.15) {
            dims.insert(0, self.rng.pick(&DIMS));
        }
        Shape(dims)
    }

    /// A second operand for a binary op or where: a constant, a value or a new input.
    fn partner(&mut self, x: NodeId) -> Arg {
        let (dtype, shape) = (self.g.node(x).dtype, self.g.node(x).shape.clone());
        if self.rng.chance(0.2) {
            let value = match dtype {
                DType::Bool => self.rng.pick(&[0.0, 1.0]),
                d if d.is_float() => self.rng.pick(&[0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 3.0]),
                _ => self.rng.pick(&[0.0, 1.0, -1.0, 2.0, 3.0]),
            };
            return Arg::Const(value, dtype);
        }
        if self.rng.chance(0.4) {
            let fits: Vec<NodeId> = self
                .values
                .iter()
                .copied()
                .filter(|&v| {
                    let n = self.g.node(v);
                    n.dtype == dtype && Shape::broadcast(&n.shape, &shape).is_some()
                })
                .collect();
            if !fits.is_empty() {
                return Arg::Value(self.rng.pick(&fits));
            }
        }
        Arg::Input(dtype, self.broadcast_partner(&shape))
    }

    /// Adds one random op, or a few for the multi-op patterns when `budget` ops are left; `Err`
    /// says why nothing was added.
    fn draw(&mut self, budget: usize) -> Result<NodeId, Skip> {
        let x = self.operand();
        let (dtype, shape) = (self.g.node(x).dtype, self.g.node(x).shape.clone());
        let rank = shape.rank();
        let float = dtype.is_float();
        let need = |ok: bool| if ok { Ok(()) } else { Err(Skip::IllTyped) };
        match self.rng.below(104) {
            0..=14 => {
                let ops: Vec<UnaryOp> =
                    UnaryOp::ALL.iter().copied().filter(|op| op.def().accepts.allows(dtype)).collect();
                let op = self.rng.pick(&ops);
                self.commit(Op::Unary { op }, &[Arg::Value(x)], None)
            }
            15..=31 => {
                let op = self.rng.pick(BinaryOp::ALL);
                let other = self.partner(x);
                let args = if self.rng.chance(0.5) { [Arg::Value(x), other] } else { [other, Arg::Value(x)] };
                self.commit(Op::Binary { op }, &args, None)
            }
            32..=36 => {
                let bools: Vec<NodeId> = self
                    .values
                    .iter()
                    .copied()
                    .filter(|&v| {
                        let n = self.g.node(v);
                        n.dtype == DType::Bool && Shape::broadcast(&n.shape, &shape).is_some()
                    })
                    .collect();
                let cond = if !bools.is_empty() && self.rng.chance(0.7) {
                    Arg::Value(self.rng.pick(&bools))
                } else {
                    Arg::Input(DType::Bool, self.broadcast_partner(&shape))
                };
                let other = self.partner(x);
                let args =
                    if self.rng.chance(0.5) { [cond, Arg::Value(x), other] } else { [cond, other, Arg::Value(x)] };
                self.commit(Op::Where, &args, None)
            }
            37..=42 => {
                let to = if self.rng.chance(0.1) {
                    self.rng.pick(&[DType::F16, DType::I64])
                } else {
                    self.rng.pick(&[DType::F32, DType::BF16, DType::I32, DType::Bool])
                };
                need(to != dtype)?;
                self.commit(Op::Cast, &[Arg::Value(x)], Some((to, shape)))
            }
            43..=54 => {
                let ops: &[ReduceOp] = match dtype {
                    DType::Bool => &[ReduceOp::Max, ReduceOp::Min],
                    d if d.is_float() => &[ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min],
                    _ => &[ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min],
                };
                let op = self.rng.pick(ops);
                let axes: Vec<usize> = (0..rank).filter(|_| self.rng.chance(0.5)).collect();
                let keepdim = self.rng.chance(0.4);
                self.commit(Op::Reduce { op, axes, keepdim }, &[Arg::Value(x)], None)
            }
            55..=59 => {
                let to = self.factorization(shape.numel());
                self.commit(Op::Reshape, &[Arg::Value(x)], Some((dtype, to)))
            }
            60..=64 => {
                let mut perm: Vec<usize> = (0..rank).collect();
                for i in (1..rank).rev() {
                    let j = self.rng.below(i + 1);
                    perm.swap(i, j);
                }
                self.commit(Op::Permute { perm }, &[Arg::Value(x)], None)
            }
            65..=69 => {
                need(rank > 0)?;
                let axis = self.rng.below(rank);
                let dim = shape.dims()[axis];
                let start = self.rng.below(dim + 1);
                let end = start + self.rng.below(dim - start + 1);
                let step = 1 + self.rng.below(3);
                self.commit(Op::Slice { axis, start, end, step }, &[Arg::Value(x)], None)
            }
            70..=73 => {
                let mut dims: Vec<usize> = shape
                    .dims()
                    .iter()
                    .map(|&d| if d == 1 && self.rng.chance(0.6) { self.rng.pick(&DIMS) } else { d })
                    .collect();
                if rank < MAX_RANK && self.rng.chance(0.4) {
                    dims.insert(0, self.rng.pick(&DIMS));
                }
                self.commit(Op::BroadcastTo, &[Arg::Value(x)], Some((dtype, Shape(dims))))
            }
            74..=78 => {
                need(rank > 0)?;
                let axis = self.rng.below(rank);
                let parts = 1 + self.rng.below(3);
                let mut args = vec![Arg::Value(x)];
                for _ in 1..parts {
                    let arg = if self.rng.chance(0.3) {
                        Arg::Value(x)
                    } else {
                        let mut dims = shape.dims().to_vec();
                        dims[axis] = self.rng.pick(&DIMS);
                        Arg::Input(dtype, Shape(dims))
                    };
                    let at = self.rng.below(args.len() + 1);
                    args.insert(at, arg);
                }
                self.commit(Op::Concat { axis }, &args, None)
            }
            79..=82 => {
                need(rank < MAX_RANK)?;
                let axis = self.rng.below(rank + 1);
                let parts = 1 + self.rng.below(3);
                let args: Vec<Arg> = (0..parts)
                    .map(|_| if self.rng.chance(0.5) { Arg::Value(x) } else { Arg::Input(dtype, shape.clone()) })
                    .collect();
                self.commit(Op::Stack { axis }, &args, None)
            }
            83..=87 => {
                need(float && rank > 0)?;
                let axis = self.rng.below(rank);
                self.commit(Op::Softmax { axis }, &[Arg::Value(x)], None)
            }
            88..=92 => {
                need(float && rank > 0)?;
                let affine = Shape(vec![shape.last()]);
                let args = [Arg::Value(x), Arg::Input(dtype, affine.clone()), Arg::Input(dtype, affine)];
                self.commit(Op::LayerNorm { eps: 1e-5 }, &args, None)
            }
            93..=96 => {
                need(float && rank > 0)?;
                let args = [Arg::Value(x), Arg::Input(dtype, Shape(vec![shape.last()]))];
                self.commit(Op::RmsNorm { eps: 1e-6 }, &args, None)
            }
            97..=99 => {
                need(float && rank >= 2)?;
                let dims = shape.dims();
                let batch = &dims[..rank - 2];
                let (rows, cols) = (dims[rank - 2], dims[rank - 1]);
                let own_batch = self.rng.chance(0.4);
                let mut other: Vec<usize> = if own_batch { batch.to_vec() } else { Vec::new() };
                let n = self.rng.pick(&DIMS[..8]);
                if self.rng.chance(0.7) {
                    other.extend([cols, n]);
                    self.commit(Op::MatMul, &[Arg::Value(x), Arg::Input(dtype, Shape(other))], None)
                } else {
                    other.extend([n, rows]);
                    self.commit(Op::MatMul, &[Arg::Input(dtype, Shape(other)), Arg::Value(x)], None)
                }
            }
            100..=102 => {
                need(budget >= 3)?;
                self.reduction_stack(x, budget)
            }
            _ => self.long_row(),
        }
    }

    /// `stack([reduce(f(t)) for t in [x, ...]])`: full reductions of up to four tensors with one
    /// op after one per-element prologue `f` (none, or a unary op, or `t * t`), the pattern fusion
    /// turns into one multi-reduce kernel; now and then an item longer than the row cache.
    fn reduction_stack(&mut self, x: NodeId, budget: usize) -> Result<NodeId, Skip> {
        let dtype = self.g.node(x).dtype;
        let ops: &[ReduceOp] = match dtype {
            DType::Bool => &[ReduceOp::Max, ReduceOp::Min],
            d if d.is_float() => &[ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min],
            _ => &[ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min],
        };
        let op = self.rng.pick(ops);
        let prologue = match self.rng.below(3) {
            0 => None,
            1 if dtype.is_float() => Some(Op::Unary { op: self.rng.pick(&[UnaryOp::Abs, UnaryOp::Exp, UnaryOp::Neg]) }),
            1 if dtype.is_int() => Some(Op::Unary { op: UnaryOp::Abs }),
            _ if dtype != DType::Bool => Some(Op::Binary { op: BinaryOp::Mul }),
            _ => None,
        };
        let per_item = 1 + usize::from(prologue.is_some());
        let items = (1 + self.rng.below(4)).min((budget - 1) / per_item).max(1);
        self.with_cap(MAX_NUMEL * 8, |gen| {
            let mut reduced = Vec::new();
            for i in 0..items {
                let t = if i == 0 {
                    Arg::Value(x)
                } else if gen.rng.chance(0.1) {
                    Arg::Input(dtype, Shape(vec![16_385 + gen.rng.below(4000)]))
                } else {
                    Arg::Input(dtype, gen.random_shape())
                };
                let t = match &prologue {
                    None => t,
                    Some(p @ Op::Unary { .. }) => Arg::Value(gen.commit(p.clone(), &[t], None)?),
                    Some(p) => {
                        // `t * t`: one tensor on both sides.
                        let t = match t {
                            Arg::Input(d, s) => Arg::Value(gen.new_input(d, s)),
                            t => t,
                        };
                        Arg::Value(gen.commit(p.clone(), &[t.clone(), t], None)?)
                    }
                };
                let axes = (0..gen.type_of(&t).1.rank()).collect();
                reduced.push(Arg::Value(gen.commit(Op::Reduce { op, axes, keepdim: false }, &[t], None)?));
            }
            gen.commit(Op::Stack { axis: 0 }, &reduced, None)
        })
    }

    /// Runs `f` with results of up to `cap` elements allowed.
    fn with_cap<T>(&mut self, cap: usize, f: impl FnOnce(&mut Generator) -> T) -> T {
        self.cap = cap;
        let result = f(self);
        self.cap = MAX_NUMEL;
        result
    }

    /// A norm, softmax or sum over rows longer than the row cache (16384 elements).
    fn long_row(&mut self) -> Result<NodeId, Skip> {
        let dtype = self.rng.pick(&[DType::F32, DType::BF16]);
        let shape = Shape(vec![1 + self.rng.below(2), 16_385 + self.rng.below(3000)]);
        let cols = shape.last();
        let x = Arg::Input(dtype, shape);
        let affine = Arg::Input(dtype, Shape(vec![cols]));
        let (op, args) = match self.rng.below(4) {
            0 => (Op::Softmax { axis: 1 }, vec![x]),
            1 => (Op::LayerNorm { eps: 1e-5 }, vec![x, affine.clone(), affine]),
            2 => (Op::RmsNorm { eps: 1e-6 }, vec![x, affine]),
            _ => (Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keepdim: true }, vec![x]),
        };
        self.with_cap(MAX_NUMEL * 12, |gen| gen.commit(op, &args, None))
    }

    /// A random shape of `numel` elements (rank 0-4).
    fn factorization(&mut self, numel: usize) -> Shape {
        let rank = if numel == 1 { self.rng.below(MAX_RANK + 1) } else { 1 + self.rng.below(MAX_RANK) };
        let mut dims = vec![1; rank];
        if numel == 0 {
            for d in dims.iter_mut() {
                *d = self.rng.pick(&DIMS[..5]);
            }
            let zero = self.rng.below(rank);
            dims[zero] = 0;
            return Shape(dims);
        }
        let mut rest = numel;
        let mut p = 2;
        while rest > 1 {
            while rest.is_multiple_of(p) {
                let slot = self.rng.below(rank);
                dims[slot] *= p;
                rest /= p;
            }
            p += 1;
        }
        Shape(dims)
    }

    /// Outputs: the newest value and up to two others (inputs included).
    fn outputs(&mut self) -> Vec<NodeId> {
        let mut outputs = vec![*self.values.last().expect("a graph has values")];
        for _ in 0..self.rng.below(3) {
            let v = self.rng.pick(&self.values);
            if !outputs.contains(&v) || self.rng.chance(0.2) {
                outputs.push(v);
            }
        }
        outputs
    }
}

/// The graph of `seed`: 1-32 ops over one or two starting inputs.
fn random_graph(seed: u64, counts: &mut Counts) -> Graph {
    let mut gen = Generator::new(seed);
    for _ in 0..1 + gen.rng.below(2) {
        let (dtype, shape) = (gen.random_dtype(), gen.random_shape());
        gen.new_input(dtype, shape);
    }
    let wanted = 1 + gen.rng.below(MAX_OPS);
    for _ in 0..wanted * 10 {
        let added = gen.g.op_count();
        if added >= wanted {
            break;
        }
        if let Err(skip) = gen.draw(wanted - added) {
            *counts.skipped.entry(skip).or_default() += 1;
        }
    }
    counts.ops += gen.g.op_count();
    let outputs = gen.outputs();
    gen.g.set_outputs(outputs);
    gen.g
}

// ---- running one graph ------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    /// Verifying the graph and evaluating it with the reference.
    Build,
    Fuse,
    Codegen,
    Compile,
    Run,
    Compare,
}

const STAGES: [Stage; 6] = [Stage::Build, Stage::Fuse, Stage::Codegen, Stage::Compile, Stage::Run, Stage::Compare];

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Stage::Build => "build",
            Stage::Fuse => "fuse",
            Stage::Codegen => "codegen",
            Stage::Compile => "compile",
            Stage::Run => "run",
            Stage::Compare => "compare",
        };
        f.write_str(name)
    }
}

#[derive(Clone, Debug)]
struct Failure {
    stage: Stage,
    message: String,
}

/// What one graph produced.
#[derive(Default)]
struct Produced {
    kernels: BTreeMap<&'static str, usize>,
    compiled: usize,
    /// Elements that matched only within the conditioning allowance.
    widened: usize,
}

thread_local! {
    /// Set while a stage runs, so that an expected panic does not print its message twice.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

fn install_quiet_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

/// Runs `f` as `stage`: an error or a panic is that stage's failure.
fn stage<T>(stage: Stage, f: impl FnOnce() -> Result<T, String>) -> Result<T, Failure> {
    QUIET.with(|q| q.set(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(false));
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(message)) => Err(Failure { stage, message }),
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic without a message".into());
            Err(Failure { stage, message: format!("panicked: {message}") })
        }
    }
}

/// The whole pipeline on `graph` with the inputs of `seed`; NVRTC compiles its kernels when
/// `nvrtc` is set.
fn run_graph(graph: &Graph, seed: u64, specials: bool, nvrtc: bool) -> Result<Produced, Failure> {
    run_graph_on(graph, &random_inputs(graph, seed, |_| specials), nvrtc)
}

/// [`run_graph`] on given inputs.
fn run_graph_on(graph: &Graph, inputs: &[HostTensor], nvrtc: bool) -> Result<Produced, Failure> {
    let (expected, perturbed) = stage(Stage::Build, || {
        graph.verify().map_err(|e| e.to_string())?;
        let expected = eval_graph(graph, inputs).map_err(|e| format!("eval_graph: {e}"))?;
        let (noisy, noise) = perturbed_graph(graph);
        let perturbed = (0..PERTURBED_RUNS)
            .map(|run| {
                let mut all = inputs.to_vec();
                all.extend(noise.iter().enumerate().map(|(i, n)| noise_tensor(n, run, i)));
                eval_graph(&noisy, &all).map_err(|e| format!("eval_graph of the perturbed graph: {e}"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok((expected, perturbed))
    })?;
    let plan = stage(Stage::Fuse, || {
        let plan = compile_to_plan(graph, &FusionOptions::default()).map_err(|e| e.to_string())?;
        plan.validate().map_err(|e| e.to_string())?;
        Ok(plan)
    })?;
    let mut produced = Produced::default();
    let code = stage(Stage::Codegen, || {
        (0..plan.kernels.len())
            .map(|i| {
                generate(&plan, i, &default_config(&plan, i, &Target::h200()), &Target::h200())
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<KernelCode>, String>>()
    })?;
    for k in &plan.kernels {
        *produced.kernels.entry(k.kind.family()).or_default() += 1;
    }
    if nvrtc {
        stage(Stage::Compile, || {
            for c in &code {
                if let KernelCode::Cuda(kernel) = c {
                    compile_for_sm90(kernel)?;
                    produced.compiled += 1;
                }
            }
            Ok(())
        })?;
    }
    let actual = stage(Stage::Run, || eval_plan(&plan, inputs).map_err(|e| e.to_string()))?;
    produced.widened = stage(Stage::Compare, || {
        compare_with_spread(&actual, &expected, &perturbed, narrowest_float(graph))
            .map_err(|e| format!("{e}\nplan:\n{plan}"))
    })?;
    Ok(produced)
}

// ---- the reference and how far last-bit differences move it ---------------------------------

/// Reference runs with perturbed rounding per graph.
const PERTURBED_RUNS: u64 = 2;
/// How many times the perturbed references' spread an element may be off, on top of the dtype's
/// tolerance.
const SPREAD_FACTOR: f64 = 4.0;

/// Relative size of the perturbation of a value of `dtype`: a unit or two in its last place.
fn perturbation(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2f64.powi(-7),
        DType::F16 => 2f64.powi(-10),
        _ => 2f64.powi(-22),
    }
}

/// Ops that can round differently in fused kernels than in the reference (the sources of
/// last-bit differences; see the module docs).
fn rounds_differently(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    if matches!(node.op, Op::Input { .. } | Op::Constant { .. }) {
        return false;
    }
    let operand = node.operands.first().map_or(node.dtype, |&o| graph.node(o).dtype);
    !exact_result(&node.op, operand)
}

/// How many elements an op combines into each element of its result: the rounding error of a
/// sum in f32 grows with their number (as its square root for random signs).
fn combined(graph: &Graph, id: NodeId) -> usize {
    let node = graph.node(id);
    let input = graph.node(node.operands[0]).shape.dims();
    match &node.op {
        Op::Reduce { axes, .. } => axes.iter().map(|&a| input[a]).product(),
        Op::Softmax { axis } => input[*axis],
        Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::MatMul => input.last().copied().unwrap_or(1),
        _ => 1,
    }
}

/// A noise input of the perturbed graph: its type and the relative size of its perturbation.
type Noise = (DType, Shape, f64);

/// `graph` with every float operand and the result of each op that [`rounds_differently`]
/// multiplied by a new input, which [`noise_tensor`] fills with `1 + e` for small random `e`: a
/// few units in the last place of the value's dtype, and for the operands of an op that sums `n`
/// elements in f32 at least `sqrt(n)` f32 units. The noise inputs follow the graph's own.
fn perturbed_graph(graph: &Graph) -> (Graph, Vec<Noise>) {
    let mut g = Graph::new();
    let mut noise = Vec::new();
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    let perturb = |g: &mut Graph, x: NodeId, combined: usize, noise: &mut Vec<Noise>| {
        let (dtype, shape) = (g.node(x).dtype, g.node(x).shape.clone());
        if !dtype.is_float() {
            return x;
        }
        let size = perturbation(dtype).max(perturbation(DType::F32) * (combined as f64).sqrt());
        noise.push((dtype, shape.clone(), size));
        let n = g.input(dtype, shape);
        g.add(Op::Binary { op: BinaryOp::Mul }, &[x, n], None).expect("x * noise of x's type")
    };
    // Inputs come first in topological order, so they keep their indices.
    for id in graph.topo_order() {
        let node = graph.node(id);
        let new = match node.op {
            Op::Input { .. } => g.input(node.dtype, node.shape.clone()),
            Op::Constant { value } => g.constant(value, node.dtype),
            _ => {
                let source = rounds_differently(graph, id);
                let n = combined(graph, id);
                let operands: Vec<NodeId> = node
                    .operands
                    .iter()
                    .map(|o| if source { perturb(&mut g, map[o], n, &mut noise) } else { map[o] })
                    .collect();
                let y = g
                    .add_declared(node.op.clone(), &operands, node.dtype, node.shape.clone(), None)
                    .expect("the same op on operands of the same types");
                if source {
                    perturb(&mut g, y, 1, &mut noise)
                } else {
                    y
                }
            }
        };
        map.insert(id, new);
    }
    g.set_outputs(graph.outputs().iter().map(|o| map[o]).collect());
    (g, noise)
}

/// Noise input `index` of perturbed run `run`: `1 + e` with `|e| <= size`.
fn noise_tensor(&(dtype, ref shape, size): &Noise, run: u64, index: usize) -> HostTensor {
    let mut rng = Rng(run.wrapping_mul(0x1000_0001).wrapping_add(index as u64));
    let values: Vec<f64> = (0..shape.numel()).map(|_| 1.0 + size * (2.0 * rng.unit() - 1.0)).collect();
    HostTensor::from_f64(dtype, shape.clone(), &values).expect("one value per element")
}

/// Compares the plan's outputs with the reference: integers and bools exactly, floats within the
/// tolerance of `dtype`, or, for elements the perturbed references move, within
/// [`SPREAD_FACTOR`] times that spread of the reference or of a perturbed reference. Returns how
/// many elements needed the spread.
fn compare_with_spread(
    actual: &[HostTensor],
    expected: &[HostTensor],
    perturbed: &[Vec<HostTensor>],
    dtype: DType,
) -> Result<usize, String> {
    if actual.len() != expected.len() {
        return Err(format!("{} outputs, expected {}", actual.len(), expected.len()));
    }
    let (rtol, atol) = braze_cpu::tolerance(dtype);
    let close = |a: f64, r: f64, widen: f64| {
        (a.is_nan() && r.is_nan()) || a == r || (a - r).abs() <= atol + rtol * r.abs() + widen
    };
    let mut widened = 0;
    for (j, (a, e)) in actual.iter().zip(expected).enumerate() {
        let here = |msg: String| format!("output {j} ({}{}): {msg}", e.dtype(), e.shape());
        if !e.dtype().is_float() || a.dtype() != e.dtype() || a.shape() != e.shape() {
            assert_close_with(a, e, 0.0, 0.0).map_err(here)?;
            continue;
        }
        for i in 0..e.numel() {
            let (x, r) = (a.get_f64(i), e.get_f64(i));
            if close(x, r, 0.0) {
                continue;
            }
            let others: Vec<f64> = perturbed.iter().map(|p| p[j].get_f64(i)).collect();
            let spread = others.iter().filter(|p| p.is_finite()).map(|p| (p - r).abs()).fold(0.0, f64::max);
            let widen = SPREAD_FACTOR * spread;
            if close(x, r, widen) || others.iter().any(|&p| close(x, p, widen)) {
                widened += 1;
                continue;
            }
            return Err(here(format!(
                "element {i}: actual {x}, expected {r} (perturbed references {others:?}; rtol {rtol:e}, atol {atol:e})"
            )));
        }
    }
    Ok(widened)
}

// ---- shrinking --------------------------------------------------------------------------------

/// Where an input of a rebuilt graph gets its data: an input of the graph it came from, or the
/// value a node of it had.
#[derive(Clone, Copy, Debug)]
enum Source {
    Input(usize),
    Node(NodeId),
}

/// `graph` rebuilt from `outputs`, with `cut` turned into a new input and every use of
/// `bypass.0` reading `bypass.1`; nodes no output needs are left out. `None` when an op no longer
/// type-checks.
fn rebuild(
    graph: &Graph,
    outputs: &[NodeId],
    cut: Option<NodeId>,
    bypass: Option<(NodeId, NodeId)>,
) -> Option<(Graph, Vec<Source>)> {
    let resolve = |id: NodeId| match bypass {
        Some((from, to)) if from == id => to,
        _ => id,
    };
    let mut needed = HashSet::new();
    let mut stack: Vec<NodeId> = outputs.iter().map(|&o| resolve(o)).collect();
    while let Some(n) = stack.pop() {
        if needed.insert(n) && Some(n) != cut {
            stack.extend(graph.node(n).operands.iter().map(|&o| resolve(o)));
        }
    }
    let mut g = Graph::new();
    let mut sources = Vec::new();
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    for id in graph.topo_order() {
        if !needed.contains(&id) {
            continue;
        }
        let node = graph.node(id);
        let new = match node.op {
            _ if Some(id) == cut => {
                sources.push(Source::Node(id));
                g.input(node.dtype, node.shape.clone())
            }
            Op::Input { index } => {
                sources.push(Source::Input(index));
                g.input(node.dtype, node.shape.clone())
            }
            Op::Constant { value } => g.constant(value, node.dtype),
            _ => {
                let operands: Vec<NodeId> = node.operands.iter().map(|&o| map[&resolve(o)]).collect();
                g.add_declared(node.op.clone(), &operands, node.dtype, node.shape.clone(), None).ok()?
            }
        };
        map.insert(id, new);
    }
    g.set_outputs(outputs.iter().map(|&o| map[&resolve(o)]).collect());
    Some((g, sources))
}

/// A graph and the inputs it runs on.
#[derive(Clone)]
struct Repro {
    graph: Graph,
    inputs: Vec<HostTensor>,
}

impl Repro {
    /// The reference value of `node`, for an input that replaces it.
    fn value_of(&self, node: NodeId) -> Option<HostTensor> {
        let (g, sources) = rebuild(&self.graph, &[node], None, None)?;
        let inputs = self.inputs_for(&sources)?;
        eval_graph(&g, &inputs).ok()?.pop()
    }

    fn inputs_for(&self, sources: &[Source]) -> Option<Vec<HostTensor>> {
        sources
            .iter()
            .map(|s| match *s {
                Source::Input(i) => Some(self.inputs[i].clone()),
                Source::Node(n) => self.value_of(n),
            })
            .collect()
    }

    /// A smaller repro from `rebuild`'s result: cut nodes keep the values they had.
    fn step(&self, rebuilt: Option<(Graph, Vec<Source>)>) -> Option<Repro> {
        let (graph, sources) = rebuilt?;
        Some(Repro { inputs: self.inputs_for(&sources)?, graph })
    }

    /// Inputs small enough to read, as text.
    fn small_inputs(&self) -> String {
        let mut text = String::new();
        for (i, t) in self.inputs.iter().enumerate() {
            if (1..=16).contains(&t.numel()) {
                let _ = writeln!(text, "input {i} = {:?}", t.to_f64_vec());
            }
        }
        text
    }
}

/// Ops count most, then inputs and outputs.
fn size(graph: &Graph) -> usize {
    4 * graph.op_count() + graph.inputs().len() + graph.outputs().len()
}

/// Smaller repros made from `repro` by one step each: an output dropped or replaced by an
/// operand, an op cut into an input holding its value, or an op bypassed.
fn shrink_steps(repro: &Repro) -> Vec<Repro> {
    let graph = &repro.graph;
    let outputs = graph.outputs().to_vec();
    let mut steps = Vec::new();
    for j in 0..outputs.len() {
        if outputs.len() > 1 {
            let mut fewer = outputs.clone();
            fewer.remove(j);
            steps.extend(repro.step(rebuild(graph, &fewer, None, None)));
        }
        for &operand in &graph.node(outputs[j]).operands {
            let mut earlier = outputs.clone();
            earlier[j] = operand;
            steps.extend(repro.step(rebuild(graph, &earlier, None, None)));
        }
    }
    for id in graph.topo_order() {
        let node = graph.node(id);
        if matches!(node.op, Op::Input { .. } | Op::Constant { .. }) {
            continue;
        }
        steps.extend(repro.step(rebuild(graph, &outputs, Some(id), None)));
        for &o in &node.operands {
            let same_type = graph.node(o).dtype == node.dtype && graph.node(o).shape == node.shape;
            if same_type {
                steps.extend(repro.step(rebuild(graph, &outputs, None, Some((id, o)))));
            }
        }
    }
    steps
}

/// Shrinks `repro` while `run` still fails it at `failure.stage`; returns the smallest repro and
/// its failure.
fn shrink(mut repro: Repro, mut failure: Failure, run: impl Fn(&Repro) -> Option<Failure>) -> (Repro, Failure) {
    'outer: loop {
        for candidate in shrink_steps(&repro) {
            if size(&candidate.graph) >= size(&repro.graph) {
                continue;
            }
            if let Some(f) = run(&candidate) {
                if f.stage == failure.stage {
                    repro = candidate;
                    failure = f;
                    continue 'outer;
                }
            }
        }
        return (repro, failure);
    }
}

// ---- the tests --------------------------------------------------------------------------------

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Whether the fuzz compiles kernels: NVRTC found, or a skip printed; a missing NVRTC fails
/// under `BRAZE_REQUIRE_NVRTC=1`.
fn nvrtc_enabled() -> bool {
    if nvrtc_available() {
        return true;
    }
    assert!(
        std::env::var("BRAZE_REQUIRE_NVRTC").as_deref() != Ok("1"),
        "NVRTC not found, and BRAZE_REQUIRE_NVRTC=1 requires it (set LD_LIBRARY_PATH to its lib folder)"
    );
    println!("skipped: NVRTC not found (kernels are generated but not compiled)");
    false
}

#[test]
fn random_graphs_match_the_reference() {
    install_quiet_panic_hook();
    let graphs = env_u64("BRAZE_FUZZ_GRAPHS", 1000);
    let first = env_u64("BRAZE_FUZZ_SEED", 0);
    let nvrtc = nvrtc_enabled();
    let mut counts = Counts::default();
    let mut kernels: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut compiled = 0;
    let mut failures: BTreeMap<Stage, Vec<u64>> = BTreeMap::new();
    let mut reports = Vec::new();
    // Elements matched only within the perturbed references' spread, and the graphs holding them.
    let mut widened = (0, 0);
    for seed in first..first + graphs {
        let graph = random_graph(seed, &mut counts);
        let specials = seed % 3 != 0;
        let compile_this = nvrtc && seed % NVRTC_EVERY == 0;
        match run_graph(&graph, seed, specials, compile_this) {
            Ok(produced) => {
                for (family, n) in produced.kernels {
                    *kernels.entry(family).or_default() += n;
                }
                compiled += produced.compiled;
                if produced.widened > 0 {
                    widened.0 += produced.widened;
                    widened.1 += 1;
                }
            }
            Err(failure) => {
                let seeds = failures.entry(failure.stage).or_default();
                seeds.push(seed);
                if seeds.len() <= SHRUNK_PER_STAGE {
                    let nvrtc = failure.stage == Stage::Compile;
                    let inputs = random_inputs(&graph, seed, |_| specials);
                    let run = |r: &Repro| run_graph_on(&r.graph, &r.inputs, nvrtc).err();
                    let (small, why) = shrink(Repro { graph, inputs }, failure, run);
                    reports.push(format!(
                        "seed {seed} fails at {} (specials: {specials}); shrunk to:\n{}{}{}\n",
                        why.stage,
                        small.graph.to_text(),
                        small.small_inputs(),
                        why.message
                    ));
                }
            }
        }
    }
    let total_kernels: usize = kernels.values().sum();
    let families: Vec<String> = kernels.iter().map(|(f, n)| format!("{f} {n}")).collect();
    let skipped: Vec<String> = counts.skipped.iter().map(|(why, n)| format!("{why:?} {n}")).collect();
    println!("fuzz: {graphs} graphs from seed {first}, {} ops, draws skipped: {}", counts.ops, skipped.join(", "));
    println!("kernels produced: {total_kernels} ({}); compiled with NVRTC: {compiled}", families.join(", "));
    let by_stage: Vec<String> = STAGES.iter().map(|s| format!("{s} {}", failures.get(s).map_or(0, Vec::len))).collect();
    println!(
        "elements matched only within the spread of the perturbed references: {} in {} graphs",
        widened.0, widened.1
    );
    println!("failures by stage: {}", by_stage.join(", "));
    for report in &reports {
        println!("{report}");
    }
    let failed: usize = failures.values().map(Vec::len).sum();
    assert_eq!(failed, 0, "{failed} of {graphs} graphs failed: {failures:?}");
}

#[test]
fn the_generator_is_deterministic_and_covers_the_op_set() {
    let mut counts = Counts::default();
    let mut ops: HashSet<&'static str> = HashSet::new();
    for seed in 0..200 {
        let graph = random_graph(seed, &mut counts);
        assert_eq!(graph.to_text(), random_graph(seed, &mut Counts::default()).to_text(), "seed {seed}");
        assert!((1..=MAX_OPS).contains(&graph.op_count()), "seed {seed}: {} ops", graph.op_count());
        graph.verify().unwrap();
        for id in graph.node_ids() {
            ops.insert(graph.node(id).op.name());
        }
    }
    for op in [
        "cast",
        "where",
        "reshape",
        "broadcast_to",
        "permute",
        "slice",
        "concat",
        "stack",
        "softmax",
        "layer_norm",
        "rms_norm",
        "matmul",
        "sum",
        "mean",
        "max",
        "min",
        "add",
        "exp",
        "isnan",
        "const",
    ] {
        assert!(ops.contains(op), "no `{op}` in 200 graphs");
    }
}

#[test]
fn shrinking_finds_the_one_op_that_fails() {
    // A stand-in failure: any graph holding an `exp` fails to compare. Shrinking must drop the
    // other output, cut the ops before the exp into inputs and bypass the ops after it.
    let mut b = Builder::new();
    let x = b.input(DType::F32, [4, 3]);
    let y = b.input(DType::F32, [3]);
    let xy = b.add(x, y);
    let e = b.un(UnaryOp::Exp, xy);
    let n = b.un(UnaryOp::Neg, e);
    let s = b.reduce(ReduceOp::Sum, n, &[1], false);
    let r = b.un(UnaryOp::Relu, x);
    let graph = b.finish(vec![s, r]);
    let has_exp = |g: &Graph| g.node_ids().iter().any(|&id| g.node(id).op == Op::Unary { op: UnaryOp::Exp });
    let fails = |r: &Repro| has_exp(&r.graph).then(|| Failure { stage: Stage::Compare, message: "exp".into() });
    let inputs = random_inputs(&graph, 0, |_| false);
    let repro = Repro { graph, inputs };
    let first = fails(&repro).unwrap();
    let (small, failure) = shrink(repro.clone(), first, fails);
    assert_eq!(failure.stage, Stage::Compare);
    assert_eq!(small.graph.to_text(), "graph(%0: f32[4,3]) {\n  %1 = exp %0 : f32[4,3]\n  return %1\n}\n");
    // The cut input holds what it replaced: x + y.
    let xy: Vec<f64> = (0..12).map(|i| repro.inputs[0].get_f64(i) + repro.inputs[1].get_f64(i % 3)).collect();
    assert_eq!(small.inputs[0].to_f64_vec(), xy.iter().map(|&v| v as f32 as f64).collect::<Vec<_>>());
}

// ---- regressions: graphs the fuzzer failed on, named for the bug -------------------------------

/// Runs a fixed graph through the same checks: on `inputs`, or on the inputs of a few seeds with
/// and without NaN and Inf.
fn check_fixed(graph: &Graph, inputs: Option<Vec<HostTensor>>) {
    let nvrtc = nvrtc_enabled();
    let runs: Vec<Vec<HostTensor>> = match inputs {
        Some(inputs) => vec![inputs],
        None => (0..4).map(|seed| random_inputs(graph, seed, |_| seed % 2 == 1)).collect(),
    };
    for inputs in runs {
        if let Err(failure) = run_graph_on(graph, &inputs, nvrtc) {
            panic!("fails at {}: {}\n{}", failure.stage, failure.message, graph.to_text());
        }
    }
}

/// Fusion stored a row kernel's element value that only reads broadcast views once per row, also
/// when the rows have no columns (a buffer of 0 elements got 1).
#[test]
fn regression_softmax_over_an_empty_slice_of_a_broadcast() {
    let mut b = Builder::new();
    let x = b.input(DType::F32, []);
    let wide = b.broadcast_to(x, [7]);
    let empty = b.op(Op::Slice { axis: 0, start: 7, end: 7, step: 3 }, &[wide]);
    let y = b.op(Op::Softmax { axis: 0 }, &[empty]);
    check_fixed(&b.finish(vec![y]), None);
}

/// Simplify rewrote a float sum over no axes to its operand, but a sum starts from +0.0, so
/// `-0.0` sums to +0.0 (and its reciprocal is +inf, not -inf).
#[test]
fn regression_float_sum_over_no_axes_of_negative_zero() {
    for dtype in [DType::F32, DType::BF16] {
        for op in [ReduceOp::Sum, ReduceOp::Mean] {
            let mut b = Builder::new();
            let zero = b.constant(-0.0, dtype);
            let x = b.input(dtype, [3]);
            let sum = b.reduce(op, zero, &[], true);
            let r = b.un(UnaryOp::Reciprocal, sum);
            let xs = b.reduce(op, x, &[], false);
            let rx = b.un(UnaryOp::Reciprocal, xs);
            let graph = b.finish(vec![r, rx]);
            let inputs = vec![HostTensor::from_f64(dtype, [3], &[-0.0, 0.0, -2.0]).unwrap()];
            check_fixed(&graph, Some(inputs));
        }
    }
}

/// Integers above 2^24 converted to bf16 went through a rounded f32 first: two roundings, where
/// the reference rounds once (2^24 + 2^16 + 1 is nearer 2^24 + 2^17 than 2^24).
#[test]
fn regression_integer_to_bf16_rounds_once() {
    for dtype in [DType::I32, DType::I64] {
        let mut b = Builder::new();
        let x = b.input(dtype, [6]);
        let y = b.cast(x, DType::BF16);
        let h = b.cast(x, DType::F16);
        let graph = b.finish(vec![y, h]);
        let big = (1 << 24) + (1 << 16) + 1;
        let values = [big as f64, -big as f64, 16_777_217.0, 2_147_483_647.0, -2_147_483_648.0, 65_521.0];
        let inputs = vec![HostTensor::from_f64(dtype, [6], &values).unwrap()];
        check_fixed(&graph, Some(inputs.clone()));
        // One bf16 ulp is inside the bf16 tolerance: a lone cast of integers must be exact.
        let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
        let expected = eval_graph(&graph, &inputs).unwrap();
        let actual = eval_plan(&plan, &inputs).unwrap();
        for (a, e) in actual.iter().zip(&expected) {
            assert_close_with(a, e, 0.0, 0.0).unwrap_or_else(|m| panic!("{dtype}: {m}"));
        }
        assert_eq!(expected[0].get_f64(0), ((1 << 24) + (1 << 17)) as f64);
        let KernelCode::Cuda(kernel) =
            generate(&plan, 0, &default_config(&plan, 0, &Target::h200()), &Target::h200()).unwrap()
        else {
            panic!()
        };
        assert!(kernel.source.contains("round_to_bf16(int_to_f32_odd("), "{}", kernel.source);
    }
}

/// Row kernels caching long rows in 1024-thread blocks spilled: without a minimum of one block per
/// SM, ptxas held them to 32 registers a thread.
#[test]
fn regression_cached_rows_in_1024_thread_blocks_do_not_spill() {
    for (dtype, cols) in [(DType::F32, 16_418), (DType::BF16, 18_375)] {
        let mut b = Builder::new();
        let x = b.input(dtype, [1, cols]);
        let w = b.input(dtype, [cols]);
        let s = b.op(Op::Softmax { axis: 1 }, &[x]);
        let r = b.op(Op::RmsNorm { eps: 1e-6 }, &[x, w]);
        let graph = b.finish(vec![s, r]);
        let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
        for i in 0..plan.kernels.len() {
            let KernelCode::Cuda(kernel) =
                generate(&plan, i, &default_config(&plan, i, &Target::h200()), &Target::h200()).unwrap()
            else {
                panic!()
            };
            assert!(kernel.source.contains("__launch_bounds__(1024, 1)"), "{}", kernel.source);
        }
        check_fixed(&graph, None);
    }
}

/// A multi-reduce item that is an empty tensor of rank 2 or more (its zero dims have stride 0)
/// was not taken for a plain buffer, and fusion asked for a copy of a graph input.
#[test]
fn regression_stack_of_full_reductions_with_empty_items() {
    for dtype in [DType::F32, DType::I32, DType::Bool] {
        let op = if dtype == DType::Bool { ReduceOp::Max } else { ReduceOp::Sum };
        let mut b = Builder::new();
        let items: Vec<NodeId> = [vec![16, 0], vec![3], vec![2, 0, 7, 2], vec![5, 1]]
            .into_iter()
            .map(|shape| {
                let t = b.input(dtype, shape.clone());
                let axes: Vec<usize> = (0..shape.len()).collect();
                b.reduce(op, t, &axes, false)
            })
            .collect();
        let y = b.op(Op::Stack { axis: 0 }, &items);
        check_fixed(&b.finish(vec![y]), None);
    }
}

/// Fusion merged the kernel computing a value into the kernel copying a broadcast view of it
/// (a graph output), whose copy then read the value's buffer, which no kernel wrote.
#[test]
fn regression_copied_view_of_a_value_in_the_same_kernel() {
    let mut b = Builder::new();
    let c = b.input(DType::Bool, []);
    let w = b.op(Op::Where, &[c, c, c]);
    let wide = b.broadcast_to(w, [5]);
    let y = b.op(Op::Where, &[w, wide, wide]);
    check_fixed(&b.finish(vec![y, wide]), None);

    let mut b = Builder::new();
    let x = b.input(DType::F32, []);
    let m = b.un(UnaryOp::Neg, x);
    let wide = b.broadcast_to(m, [2, 5]);
    let y = b.add(m, wide);
    check_fixed(&b.finish(vec![y, wide]), None);
}

// ---- the comparison ---------------------------------------------------------------------------

/// An f32 sum that cancels (1000, then 16781 values near 1e-3, then -1000) loses the small
/// values' low bits while its partial sum is large: accumulated in order in f32 it is off by far
/// more than the f32 tolerance of its small result, and the perturbed references spread as far.
#[test]
fn long_f32_sums_pass_within_the_spread_of_the_reference() {
    let n = 16_783;
    let mut b = Builder::new();
    let x = b.input(DType::F32, [1, n]);
    let s = b.reduce(ReduceOp::Sum, x, &[1], true);
    let graph = b.finish(vec![s]);
    let mut values: Vec<f64> =
        random_inputs(&graph, 9351, |_| false)[0].to_f64_vec().iter().map(|v| v * 1e-3).collect();
    values[0] = 1000.0;
    values[n - 1] = -1000.0;
    let inputs = vec![HostTensor::from_f64(DType::F32, [1, n], &values).unwrap()];
    let produced = run_graph_on(&graph, &inputs, false).unwrap_or_else(|f| panic!("{}: {}", f.stage, f.message));
    assert!(produced.widened > 0, "the f32 tolerance alone was enough; the case no longer tests the spread");
}

/// The spread widens nothing where the reference is stable: an error of 1e-3 in a relu output
/// fails.
#[test]
fn the_spread_does_not_hide_errors_where_the_reference_is_stable() {
    let mut b = Builder::new();
    let x = b.input(DType::F32, [64]);
    let e = b.un(UnaryOp::Exp, x);
    let y = b.un(UnaryOp::Relu, e);
    let graph = b.finish(vec![y]);
    let inputs = random_inputs(&graph, 1, |_| false);
    let expected = eval_graph(&graph, &inputs).unwrap();
    let (noisy, noise) = perturbed_graph(&graph);
    let perturbed: Vec<Vec<HostTensor>> = (0..PERTURBED_RUNS)
        .map(|run| {
            let mut all = inputs.clone();
            all.extend(noise.iter().enumerate().map(|(i, n)| noise_tensor(n, run, i)));
            eval_graph(&noisy, &all).unwrap()
        })
        .collect();
    assert_eq!(compare_with_spread(&expected, &expected, &perturbed, DType::F32), Ok(0));
    let mut off = expected[0].to_f64_vec();
    off[7] += 1e-3;
    let actual = vec![HostTensor::from_f64(DType::F32, [64], &off).unwrap()];
    let err = compare_with_spread(&actual, &expected, &perturbed, DType::F32).unwrap_err();
    assert!(err.starts_with("output 0 (f32[64]): element 7:"), "{err}");
}

/// The f32 kernels computed gelu as `0.5 x (1 + erf(x / sqrt 2))` and `0.5 x (1 + tanh(u))`,
/// which cancel for negative `x`: gelu_erf(-5) was 10% off and gelu_tanh(-6.1) was -0, so its
/// reciprocal or log (-inf where the reference has NaN) went wrong.
#[test]
fn regression_gelu_of_negative_inputs_keeps_its_relative_accuracy() {
    for op in [UnaryOp::GeluErf, UnaryOp::GeluTanh] {
        let mut b = Builder::new();
        let x = b.input(DType::F32, [8]);
        let y = b.un(op, x);
        let r = b.un(UnaryOp::Reciprocal, y);
        let l = b.un(UnaryOp::Log, y);
        let graph = b.finish(vec![r, l]);
        let values = [-3.0, -5.0, -6.145473480224609, -7.5, -9.0, -10.5, -12.0, -0.5];
        let inputs = vec![HostTensor::from_f64(DType::F32, [8], &values).unwrap()];
        check_fixed(&graph, Some(inputs.clone()));
        let plan = compile_to_plan(&graph, &FusionOptions::default()).unwrap();
        let (actual, expected) = (eval_plan(&plan, &inputs).unwrap(), eval_graph(&graph, &inputs).unwrap());
        assert_close_with(&actual[0], &expected[0], 1e-5, 0.0).unwrap_or_else(|m| panic!("{op:?}: {m}"));
    }
}
