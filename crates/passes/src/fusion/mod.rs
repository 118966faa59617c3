//! Fusion: groups the ops of an optimized, decomposed graph into kernels and writes the [`Plan`].
//!
//! Nodes are visited in topological order; each joins a kernel by the first rule that applies:
//!
//! | rule | kernel |
//! | --- | --- |
//! | independent full reductions, each after its own per-element prologue over one tensor or a few contiguous ones of its shape, and the scalar ops and stacks over their results | multi-reduce, K items and an epilogue |
//! | full reduction of a tensor longer than `row_cache_limit` | multi-reduce, one item |
//! | matmul | matmul |
//! | `+ bias[n]`, then `relu` or `gelu_tanh`, on a matmul result with no other user | matmul epilogue |
//! | reduction over leading axes, with the elementwise group only it reads | column (prologue) |
//! | reduction over the same leading axes of a column group's element values, or reading a buffer an earlier column group of the same rows reads | column (several reductions) |
//! | elementwise op on a column group's per-column values | column (epilogue) |
//! | reduction over some axes, with the elementwise group of its input's shape | row (prologue) |
//! | reduction of a row group's element values over the same axes | row (dependent reductions) |
//! | elementwise op on a row group's per-row or element values | row (epilogue) |
//! | elementwise op of the shape of an operand's pointwise group | pointwise |
//! | a smaller elementwise group that only this kernel reads | broadcast side values |
//! | concat | concat (none where its inputs are attention gradients written in place) |
//! | attention, and the attention_lse of the same q, k, mask and scale | attention (flash forward) |
//! | attention_grad of q; of k and v with the same operands | attention backward (dq; dk and dv) |
//! | index_select | pointwise: a gather load, which elementwise users join; never a row or column prologue |
//! | index_add | index add |
//!
//! Then, across the kernels formed: an intermediate stored as the f32 cast of a bf16/f16 value is
//! stored narrow and widened by its readers as they load it (`narrow_stores.rs`); a column
//! kernel whose operands an earlier row kernel over the same rows can compute folds into it: the
//! row kernel writes the reductions' partials over groups of rows and the column kernel reduces
//! those (`column_partials.rs`); pointwise
//! kernels that are mutually independent (no path between any two, through any kernels) and of
//! at most `multi_pointwise_limit` elements become one multi-pointwise kernel, one launch, each
//! keeping its own program (`multi_pointwise.rs`); a concat of attention gradients that nothing
//! else reads is written in place, each gradient straight into its columns of the concat's rows,
//! and the concat kernel goes (`concat_in_place.rs`).
//!
//! Views (reshape, permute, slice, broadcast_to) get no kernels: they fold into strided loads. A
//! merge is refused when it would put a value recomputed for the backward in a kernel with forward
//! ops (where it would be computed early and held after all), when it would close a cycle through
//! a kernel outside the merged groups, when a
//! row kernel over rows longer than the cache would hold more than one chain of dependent
//! reductions, or when a value the kernel must store could not be stored in its family's layout.

mod access;
mod attention;
mod column;
mod column_partials;
mod concat_in_place;
mod cycles;
mod grouping;
mod in_place;
mod legalize;
mod lower;
mod matmul_epilogue;
mod multi_pointwise;
mod multi_reduce;
mod multi_reduce_lower;
mod narrow_stores;
mod node_map;
mod row;
mod views;

use crate::decompose::Origins;
use crate::{PassError, Result};
use access::Access;
use braze_ir::{Graph, Node, NodeId, Op, Shape};
use braze_plan::Plan;
use matmul_epilogue::MatMulGroup;
use multi_reduce::MultiReduceGroup;
use node_map::NodeMap;
use row::RowGeometry;
use std::collections::{HashMap, HashSet};

/// Knobs of the fusion rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusionOptions {
    /// Longest row (in elements) that row kernels keep in registers. Longer rows are re-read from
    /// memory for every dependent reduction, so a kernel over them holds at most one chain of two
    /// dependent reductions (one layer norm or softmax); further layers get kernels of their own.
    /// Also the size above which a full reduction becomes a chunked multi-reduce instead of a
    /// one-row kernel.
    pub row_cache_limit: usize,
    /// `false`: every op becomes a kernel of its own (views still fold into loads), for debugging
    /// and for testing the fusion against unfused plans.
    pub fuse: bool,
    /// `(graph output, graph input)` pairs: the caller stores the output into the input's tensor
    /// after each run (a write-back), so the plan writes it into the input's memory where its
    /// rules allow ([`braze_plan::BufferRole::InPlace`]).
    pub in_place: Vec<(usize, usize)>,
    /// Largest pointwise kernel (in elements) that horizontal fusion groups with independent
    /// ones into a multi-pointwise kernel. Above it a kernel streams long enough that its own
    /// launch costs a few percent at most, and a specialised kernel of its own is simplest.
    pub multi_pointwise_limit: usize,
    /// Every full reduction becomes a multi-reduce item, however short: its code is then the
    /// same at every size (the work list is a table the runtime uploads), which eager ops want.
    /// Off, a reduction short enough for one row is a row kernel of its own size.
    pub full_reductions_in_multi_reduce: bool,
    /// A column kernel whose rows an earlier row kernel reads is folded into it: the row kernel
    /// writes partial column sums of groups of rows, and the column kernel reduces those
    /// (`column_partials.rs`).
    pub column_partials: bool,
}

impl Default for FusionOptions {
    fn default() -> FusionOptions {
        FusionOptions {
            row_cache_limit: 16384,
            fuse: true,
            in_place: Vec::new(),
            multi_pointwise_limit: 1 << 24,
            full_reductions_in_multi_reduce: false,
            column_partials: true,
        }
    }
}

/// Fuses an optimized, decomposed graph (see [`crate::optimize`]) into a plan. Composites that are
/// still present are decomposed first.
pub fn fuse(graph: &Graph, options: &FusionOptions) -> Result<Plan> {
    fuse_with_origins(graph, options, &Origins::new())
}

/// [`crate::optimize`], then [`fuse`].
pub fn compile_to_plan(graph: &Graph, options: &FusionOptions) -> Result<Plan> {
    Ok(compile_to_plan_timed(graph, options)?.0)
}

/// How long each half of [`compile_to_plan`] took.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PlanTimes {
    /// [`crate::optimize`]: dead code, decomposition, simplification, common subexpressions,
    /// recomputation.
    pub optimize: std::time::Duration,
    /// [`fuse`]: grouping into kernels and writing the plan.
    pub fuse: std::time::Duration,
}

/// [`compile_to_plan`], also returning how long optimizing and fusing took.
pub fn compile_to_plan_timed(graph: &Graph, options: &FusionOptions) -> Result<(Plan, PlanTimes)> {
    let started = std::time::Instant::now();
    let (optimized, origins) = crate::pipeline::optimize_with_origins(graph)?;
    let optimize = started.elapsed();
    let started = std::time::Instant::now();
    let plan = fuse_with_origins(&optimized, options, &origins)?;
    Ok((plan, PlanTimes { optimize, fuse: started.elapsed() }))
}

fn fuse_with_origins(graph: &Graph, options: &FusionOptions, origins: &Origins) -> Result<Plan> {
    // Graphs are type-checked as they are built; verifying again is for catching our own bugs.
    if cfg!(debug_assertions) {
        graph.verify()?;
    }
    let (g, origins) = legalize::legalize(graph, origins)?;
    let mut fuser = Fuser::new(&g, options, &origins);
    fuser.store_attention_results_permuted();
    fuser.fold_views();
    fuser.claim_multi_reductions();
    fuser.plan_materializations()?;
    fuser.group_nodes()?;
    let mut plan = fuser.lower()?;
    narrow_stores::narrow_widened_stores(&mut plan);
    if options.fuse && options.column_partials {
        column_partials::fold_into_row_kernels(&mut plan);
    }
    if options.fuse {
        plan = multi_pointwise::group_independent_pointwise(plan, options)?;
    }
    in_place::place(&mut plan, &options.in_place);
    if options.fuse {
        concat_in_place::place(&mut plan);
    }
    if cfg!(debug_assertions) {
        plan.validate()?;
    }
    tracing::debug!(target: "braze::plan", "\n{plan}");
    Ok(plan)
}

/// Which coordinates a value of a row or column group is indexed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Space {
    /// The reduction's input shape (element values, and keepdim per-row values broadcast over it).
    Element,
    /// The shape with the reduced axes dropped (results of a reduction without keepdim): one
    /// value per row of a row kernel, per column of a column kernel.
    Row,
}

#[derive(Clone, Debug)]
enum GroupKind {
    Pointwise {
        domain: Shape,
    },
    Row(RowGeometry),
    /// Reductions over leading axes: the geometry's reduced axes are the rows, its kept axes the
    /// columns.
    Column(RowGeometry),
    MultiReduce(MultiReduceGroup),
    MatMul(MatMulGroup),
    Concat {
        node: NodeId,
    },
    /// An attention and/or its lse (see `attention.rs`).
    Attention,
    /// The dq, or the dk and dv, of one attention.
    AttentionBackward,
    /// The scatter-add of an index_select's gradient.
    IndexAdd {
        node: NodeId,
    },
}

#[derive(Clone, Debug)]
struct Group {
    kind: GroupKind,
    members: Vec<NodeId>,
    /// Members of a row group indexed by [`Space::Row`]; all others use [`Space::Element`].
    row_space: HashSet<NodeId>,
    /// Members of a row group whose value changes along the row (the others are per-row).
    varies: HashSet<NodeId>,
    min_pos: usize,
    max_pos: usize,
    /// Whether a member is forward work, and whether one recomputes a forward value for the
    /// backward: a kernel never holds both (see [`braze_ir::SourceLoc::recomputed`]).
    forward: bool,
    recomputed: bool,
}

struct Fuser<'a> {
    g: &'a Graph,
    options: &'a FusionOptions,
    origins: &'a Origins,
    order: Vec<NodeId>,
    pos: NodeMap<usize>,
    users: NodeMap<Vec<NodeId>>,
    /// The folded access of every view node, over its own shape.
    view_access: HashMap<NodeId, Access>,
    /// View and constant nodes that get a buffer of their own (a copy kernel writes them).
    materialized: HashSet<NodeId>,
    /// Computed values their kernel stores in another order than row-major: the strides of
    /// their own shape in their buffer (see `Fuser::store_attention_results_permuted`).
    stored_strides: HashMap<NodeId, Vec<usize>>,
    groups: Vec<Option<Group>>,
    group_of: NodeMap<usize>,
    /// Elementwise nodes that only column reductions read (see `column.rs`).
    column_prologue: HashSet<NodeId>,
    /// Nodes that autodiff appended (marked backward) or that read one, directly or through
    /// others: what runs after the backward began (the backward and an optimizer update).
    after_backward: NodeMap<bool>,
}

fn is_view(op: &Op) -> bool {
    op.is_view()
}

fn lowering_error(g: &Graph, id: NodeId, detail: impl Into<String>) -> PassError {
    PassError::Lowering { node: id.to_string(), op: g.node(id).op.name().into(), detail: detail.into() }
}

impl<'a> Fuser<'a> {
    fn new(g: &'a Graph, options: &'a FusionOptions, origins: &'a Origins) -> Fuser<'a> {
        let order = g.topo_order();
        let bound = order.iter().map(|n| n.index() + 1).max().unwrap_or(0);
        let (mut pos, mut users) = (NodeMap::with_bound(bound), NodeMap::with_bound(bound));
        let mut after_backward = NodeMap::with_bound(bound);
        for (i, &n) in order.iter().enumerate() {
            pos.insert(n, i);
            users.insert(n, g.users(n));
            let node = g.node(n);
            // A constant has no place in time (common subexpressions may have merged a forward
            // constant into the backward's).
            let marked = node.loc.as_ref().is_some_and(|loc| loc.backward) && !matches!(node.op, Op::Constant { .. });
            let late = marked || node.operands.iter().any(|o| after_backward.get(o) == Some(&true));
            after_backward.insert(n, late);
        }
        Fuser {
            g,
            options,
            origins,
            order,
            pos,
            users,
            view_access: HashMap::new(),
            materialized: HashSet::new(),
            stored_strides: HashMap::new(),
            groups: Vec::new(),
            group_of: NodeMap::with_bound(bound),
            column_prologue: HashSet::new(),
            after_backward,
        }
    }

    fn node(&self, id: NodeId) -> &'a Node {
        self.g.node(id)
    }

    fn shape(&self, id: NodeId) -> &'a Shape {
        &self.g.node(id).shape
    }

    fn pos(&self, id: NodeId) -> usize {
        self.pos[&id]
    }

    fn users(&self, id: NodeId) -> &[NodeId] {
        &self.users[&id]
    }

    /// Whether `id`'s value is read only by `user` (once or several times) and is no graph output.
    fn only_feeds(&self, id: NodeId, user: NodeId) -> bool {
        !self.g.is_output(id) && self.users(id) == [user]
    }

    fn group(&self, gid: usize) -> &Group {
        self.groups[gid].as_ref().expect("group ids in group_of refer to live groups")
    }

    fn group_mut(&mut self, gid: usize) -> &mut Group {
        self.groups[gid].as_mut().expect("group ids in group_of refer to live groups")
    }

    fn in_group(&self, id: NodeId, gid: usize) -> bool {
        self.group_of.get(&id) == Some(&gid)
    }

    /// Whether group `gid` computes an index_select or an arange: either stays in a pointwise
    /// kernel over its own shape (the only family whose loops check and clamp an index, and
    /// know each element's flat index).
    fn holds_gather(&self, gid: usize) -> bool {
        self.group(gid).members.iter().any(|&m| matches!(self.node(m).op, Op::IndexSelect { .. } | Op::Arange))
    }

    /// The plan check of index_select `n`: its place among the graph's index_selects.
    fn check_of(&self, n: NodeId) -> usize {
        self.gathers().position(|g| g == n).expect("check_of is asked about index_select nodes")
    }

    /// The index_select nodes in visiting order, one plan check each.
    fn gathers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.order.iter().copied().filter(|&n| matches!(self.node(n).op, Op::IndexSelect { .. }))
    }

    fn space_of(&self, id: NodeId) -> Space {
        match self.group_of.get(&id) {
            Some(&gid) if self.group(gid).row_space.contains(&id) => Space::Row,
            _ => Space::Element,
        }
    }
}
