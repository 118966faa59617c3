//! The seeded generator of well-typed random graphs.

use crate::exactness::{exact_result, is_discontinuous};
use crate::rng::Rng;
use braze_ir::infer::{infer, Declared};
use braze_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, Shape, UnaryOp};
use std::collections::{BTreeMap, HashSet};

const DIMS: [usize; 9] = [0, 1, 2, 3, 5, 7, 8, 16, 33];
const MAX_RANK: usize = 4;
/// The binary ops the generator draws from: the table as it was when the fixed regression range
/// was recorded (ops added to the table since, such as philox, would change its graphs).
const REGRESSION_BINARY_OPS: &[BinaryOp] = &[
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Max,
    BinaryOp::Min,
    BinaryOp::Pow,
    BinaryOp::Eq,
    BinaryOp::Ne,
    BinaryOp::Lt,
    BinaryOp::Le,
    BinaryOp::Gt,
    BinaryOp::Ge,
    BinaryOp::And,
    BinaryOp::Or,
];
/// Largest tensor a graph holds, so a debug build runs a thousand graphs in a few minutes.
const MAX_NUMEL: usize = 4096;
pub const MAX_OPS: usize = 32;

/// An operand of a draw before the draw is added.
#[derive(Clone, Debug)]
enum Arg {
    Value(NodeId),
    /// A new graph input.
    Input(DType, Shape),
    /// A scalar constant.
    Const(f64, DType),
    /// A new arange of this length (an op of the graph, not an input).
    Arange(usize, DType),
}

/// Why a draw was not added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Skip {
    IllTyped,
    TooLarge,
    /// A comparison, mask or float-to-integer cast of a value whose last bits may differ.
    InexactOperand,
}

#[derive(Default)]
pub struct Counts {
    pub ops: usize,
    pub skipped: BTreeMap<Skip, usize>,
}

impl Counts {
    /// Adds what another run of the generator counted.
    pub fn merge(&mut self, other: Counts) {
        self.ops += other.ops;
        for (why, n) in other.skipped {
            *self.skipped.entry(why).or_default() += n;
        }
    }
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
    /// Ends of independent chains, each a graph output (else nothing would keep them).
    chain_ends: Vec<NodeId>,
    /// Whether draws include the model ops (log_softmax, cross_entropy, philox): a mode of its
    /// own, so the graphs of the regression range stay what they were.
    model_ops: bool,
}

impl Generator {
    fn new(seed: u64) -> Generator {
        Generator {
            rng: Rng::new(seed),
            g: Graph::new(),
            values: Vec::new(),
            exact: HashSet::new(),
            cap: MAX_NUMEL,
            chain_ends: Vec::new(),
            model_ops: false,
        }
    }

    /// One of the model ops on `x`: log_softmax of a float, cross_entropy of float `[N, V]`
    /// logits with new integer targets and classes (values in -8..=8: rows with one class,
    /// several, none, or the ignored one), philox of an integer, index_select of anything.
    fn draw_model_op(&mut self, x: NodeId) -> Result<NodeId, Skip> {
        let (dtype, shape) = (self.g.node(x).dtype, self.g.node(x).shape.clone());
        let rank = shape.rank();
        match self.rng.below(4) {
            3 => {
                // index_select (an embedding for axis 0 of a matrix) with new indices clamped
                // into range (repeats at the ends), of one or two dims.
                if rank == 0 {
                    return Err(Skip::IllTyped);
                }
                let axis = self.rng.below(rank);
                let bound = shape.dims()[axis];
                if bound == 0 {
                    return Err(Skip::IllTyped);
                }
                let index = self.rng.pick(&[DType::I32, DType::I64]);
                let index_shape = if self.rng.chance(0.5) {
                    Shape(vec![self.rng.pick(&DIMS)])
                } else {
                    Shape(vec![self.rng.pick(&DIMS), self.rng.pick(&DIMS)])
                };
                let raw = Arg::Input(index, index_shape);
                let high =
                    self.commit(Op::Binary { op: BinaryOp::Min }, &[raw, Arg::Const((bound - 1) as f64, index)], None)?;
                let at =
                    self.commit(Op::Binary { op: BinaryOp::Max }, &[Arg::Value(high), Arg::Const(0.0, index)], None)?;
                self.commit(Op::IndexSelect { axis }, &[Arg::Value(x), Arg::Value(at)], None)
            }
            0 => {
                if !dtype.is_float() || rank == 0 {
                    return Err(Skip::IllTyped);
                }
                let axis = self.rng.below(rank);
                self.commit(Op::LogSoftmax { axis }, &[Arg::Value(x)], None)
            }
            1 => {
                if !dtype.is_float() || rank != 2 {
                    return Err(Skip::IllTyped);
                }
                let index = self.rng.pick(&[DType::I32, DType::I64]);
                let ignore_index = self.rng.pick(&[-100, 0, 3]);
                let targets = Arg::Input(index, Shape(vec![shape.dims()[0]]));
                // i32 classes beside i64 targets too (as the frontend passes them).
                let class_dtype = if index == DType::I64 && self.rng.chance(0.5) { DType::I32 } else { index };
                // Classes from -8..=8 (rows with one class, several, none), or the frontend's 0..V.
                let classes = if self.rng.chance(0.3) {
                    Arg::Arange(shape.dims()[1], class_dtype)
                } else {
                    Arg::Input(class_dtype, Shape(vec![shape.dims()[1]]))
                };
                self.commit(Op::CrossEntropy { ignore_index }, &[Arg::Value(x), targets, classes], None)
            }
            _ => {
                if !dtype.is_int() {
                    return Err(Skip::IllTyped);
                }
                let key = if self.rng.chance(0.5) {
                    Arg::Const(self.rng.pick(&[0.0, 1.0, -1.0, 12345.0]), dtype)
                } else {
                    Arg::Input(dtype, self.broadcast_partner(&shape))
                };
                self.commit(Op::Binary { op: BinaryOp::Philox }, &[Arg::Value(x), key], None)
            }
        }
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
            Arg::Arange(n, dtype) => (*dtype, Shape(vec![*n])),
        }
    }

    fn is_exact(&self, arg: &Arg) -> bool {
        match arg {
            Arg::Value(id) => self.exact.contains(id),
            Arg::Input(..) | Arg::Const(..) | Arg::Arange(..) => true,
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
                Arg::Arange(n, dtype) => self.g.arange(*n, *dtype).expect("a typed arange"),
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

    /// A second operand for a binary op or where: a constant, a value, a new input or (in model
    /// graphs) an arange.
    fn partner(&mut self, x: NodeId) -> Arg {
        let (dtype, shape) = (self.g.node(x).dtype, self.g.node(x).shape.clone());
        // Model graphs: an arange along the last dim (position ids), broadcast over the rest.
        if self.model_ops && dtype != DType::Bool && shape.rank() > 0 && self.rng.chance(0.1) {
            return Arg::Arange(shape.last(), dtype);
        }
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
        if self.model_ops && self.rng.chance(0.25) {
            return self.draw_model_op(x);
        }
        match self.rng.below(108) {
            0..=14 => {
                let ops: Vec<UnaryOp> =
                    UnaryOp::ALL.iter().copied().filter(|op| op.def().accepts.allows(dtype)).collect();
                let op = self.rng.pick(&ops);
                self.commit(Op::Unary { op }, &[Arg::Value(x)], None)
            }
            15..=31 => {
                let op = self.rng.pick(REGRESSION_BINARY_OPS);
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
                    d if d.is_float() => &[ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min],
                    // Integer and bool sums are i64.
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
                need(budget >= 4)?;
                self.independent_reductions(x, budget)
            }
            103 => self.long_row(),
            _ => {
                need(budget >= 2)?;
                self.independent_chains(budget)
            }
        }
    }

    /// Two to four short elementwise chains, each over a new input of its own shape and dtype
    /// (an op or two, with broadcast inputs and scalar constants, never a value of another
    /// chain) and each a graph output: independent pointwise kernels, which fusion groups into
    /// one multi-pointwise kernel.
    fn independent_chains(&mut self, budget: usize) -> Result<NodeId, Skip> {
        let chains = (2 + self.rng.below(3)).min(budget);
        let mut left = budget;
        let mut last = Err(Skip::IllTyped);
        for _ in 0..chains {
            let dtype = self.rng.pick(&[DType::F32, DType::F32, DType::BF16, DType::I32]);
            let shape = self.random_shape();
            let ops: Vec<UnaryOp> = UnaryOp::ALL.iter().copied().filter(|op| op.def().accepts.allows(dtype)).collect();
            let op = self.rng.pick(&ops);
            let mut end = self.commit(Op::Unary { op }, &[Arg::Input(dtype, shape.clone())], None)?;
            left -= 1;
            let (dtype, shape) = (self.g.node(end).dtype, self.g.node(end).shape.clone());
            if left > chains && self.rng.chance(0.6) {
                let op = self.rng.pick(&[BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max]);
                let other = if self.rng.chance(0.3) {
                    Arg::Const(self.rng.pick(&[2.0, -1.0, 3.0]), dtype)
                } else {
                    Arg::Input(dtype, self.broadcast_partner(&shape))
                };
                if let Ok(id) = self.commit(Op::Binary { op }, &[Arg::Value(end), other], None) {
                    end = id;
                    left -= 1;
                }
            }
            self.chain_ends.push(end);
            last = Ok(end);
        }
        last
    }

    /// Independent full reductions `reduce_i(f_i(t_i))` of up to four tensors, each with its own
    /// op and per-element prologue `f_i` (none, a unary op, `t * t`, or `t * u` over a second
    /// leaf), read the ways fusion must all turn into one multi-reduce kernel: stacked, folded
    /// with a chain of adds (`or` for bools), each scaled and then folded, or left for later draws
    /// and the outputs to read one by one; now and then an item longer than the row cache.
    fn independent_reductions(&mut self, x: NodeId, budget: usize) -> Result<NodeId, Skip> {
        let dtype = self.g.node(x).dtype;
        let ops: &[ReduceOp] = match dtype {
            d if d.is_float() => &[ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min],
            _ => &[ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min],
        };
        let items = (1 + self.rng.below(4)).min((budget - 1) / 3).max(1);
        let consumer = self.rng.below(4);
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
                let prologue = match gen.rng.below(3) {
                    0 => None,
                    1 if dtype.is_float() => {
                        Some(Op::Unary { op: gen.rng.pick(&[UnaryOp::Abs, UnaryOp::Exp, UnaryOp::Neg]) })
                    }
                    1 if dtype.is_int() => Some(Op::Unary { op: UnaryOp::Abs }),
                    _ if dtype != DType::Bool => Some(Op::Binary { op: BinaryOp::Mul }),
                    _ => None,
                };
                let t = match &prologue {
                    None => t,
                    Some(p @ Op::Unary { .. }) => Arg::Value(gen.commit(p.clone(), &[t], None)?),
                    Some(p) => {
                        // `t * t` (one tensor on both sides) or `t * u` (a second leaf of its type).
                        let t = match t {
                            Arg::Input(d, s) => Arg::Value(gen.new_input(d, s)),
                            t => t,
                        };
                        let u = if gen.rng.chance(0.5) {
                            let (d, s) = gen.type_of(&t);
                            Arg::Value(gen.new_input(d, s))
                        } else {
                            t.clone()
                        };
                        Arg::Value(gen.commit(p.clone(), &[t, u], None)?)
                    }
                };
                let op = gen.rng.pick(ops);
                let axes = (0..gen.type_of(&t).1.rank()).collect();
                reduced.push(gen.commit(Op::Reduce { op, axes, keepdim: false }, &[t], None)?);
            }
            let fold = if dtype == DType::Bool { BinaryOp::Or } else { BinaryOp::Add };
            let scale = |gen: &mut Generator, r: NodeId| {
                let c = if dtype == DType::Bool { 1.0 } else { gen.rng.pick(&[0.5, 2.0, 3.0]) };
                let op = if dtype == DType::Bool { BinaryOp::And } else { BinaryOp::Mul };
                gen.commit(Op::Binary { op }, &[Arg::Value(r), Arg::Const(c, dtype)], None)
            };
            match consumer {
                0 => gen.commit(Op::Stack { axis: 0 }, &reduced.into_iter().map(Arg::Value).collect::<Vec<_>>(), None),
                1 | 2 => {
                    let mut total = reduced[0];
                    if consumer == 2 {
                        total = scale(gen, total)?;
                    }
                    for &r in &reduced[1..] {
                        let r = if consumer == 2 { scale(gen, r)? } else { r };
                        total = gen.commit(Op::Binary { op: fold }, &[Arg::Value(total), Arg::Value(r)], None)?;
                    }
                    Ok(total)
                }
                _ => Ok(*reduced.last().expect("at least one item")),
            }
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

    /// Outputs: the newest value and up to two others (inputs included), and the ends of the
    /// independent chains.
    fn outputs(&mut self) -> Vec<NodeId> {
        let mut outputs = vec![*self.values.last().expect("a graph has values")];
        for &end in &self.chain_ends {
            if !outputs.contains(&end) {
                outputs.push(end);
            }
        }
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
pub fn random_graph(seed: u64, counts: &mut Counts) -> Graph {
    generate(Generator::new(seed), counts)
}

/// A graph of [`random_graph`]'s kind that also draws the model ops (log_softmax, cross_entropy,
/// philox).
pub fn random_model_graph(seed: u64, counts: &mut Counts) -> Graph {
    generate(Generator { model_ops: true, ..Generator::new(seed) }, counts)
}

fn generate(mut gen: Generator, counts: &mut Counts) -> Graph {
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
fn the_model_mode_draws_the_model_ops_and_leaves_the_regression_range_alone() {
    let mut ops: HashSet<&'static str> = HashSet::new();
    for seed in 0..300 {
        let graph = random_model_graph(seed, &mut Counts::default());
        assert_eq!(graph.to_text(), random_model_graph(seed, &mut Counts::default()).to_text(), "seed {seed}");
        graph.verify().unwrap();
        ops.extend(graph.node_ids().into_iter().map(|id| graph.node(id).op.name()));
        let regression = random_graph(seed, &mut Counts::default());
        assert!(regression.node_ids().into_iter().all(|id| !matches!(
            regression.node(id).op,
            Op::LogSoftmax { .. }
                | Op::CrossEntropy { .. }
                | Op::Binary { op: BinaryOp::Philox }
                | Op::IndexSelect { .. }
        )));
    }
    for op in ["log_softmax", "cross_entropy", "philox", "index_select"] {
        assert!(ops.contains(op), "no `{op}` in 300 model-mode graphs");
    }
}

#[test]
fn the_generator_makes_graphs_that_fusion_groups_into_multi_pointwise_kernels() {
    let options = braze_passes::FusionOptions::default();
    let grouped = (0..200)
        .filter(|&seed| {
            let graph = random_graph(seed, &mut Counts::default());
            let plan = braze_passes::compile_to_plan(&graph, &options).unwrap();
            plan.kernels.iter().any(|k| k.kind.family() == "multi_pointwise")
        })
        .count();
    assert!(grouped >= 10, "only {grouped} of 200 graphs have a multi-pointwise kernel");
}

#[test]
fn the_generator_makes_graphs_with_multi_reduce_items_over_two_leaves() {
    let options = braze_passes::FusionOptions::default();
    let two_leaves = (0..200)
        .filter(|&seed| {
            let graph = random_graph(seed, &mut Counts::default());
            let plan = braze_passes::compile_to_plan(&graph, &options).unwrap();
            plan.kernels.iter().any(|k| match &k.kind {
                braze_plan::KernelKind::MultiReduce(mr) => mr.reductions.iter().any(|r| r.leaves > 1),
                _ => false,
            })
        })
        .count();
    assert!(two_leaves >= 5, "only {two_leaves} of 200 graphs have a multi-reduce item of two leaves");
}
