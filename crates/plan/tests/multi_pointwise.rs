//! The multi-pointwise family: a valid kernel of members of different shapes and dtypes (one
//! empty, one reading a broadcast scalar) passes, its text and JSON forms, and each mutation that
//! breaks one rule is rejected with that rule.

use braze_ir::{BinaryOp, DType, ReduceOp, Shape, UnaryOp};
use braze_plan::{
    Body, Buffer, BufferId, BufferRole, Expr, Kernel, KernelKind, MultiPointwise, Plan, PlanError, PlanOutput,
    Pointwise, Rule, Store, ValueId,
};

const F: DType = DType::F32;
const BF: DType = DType::BF16;

/// Validates `plan`: `None` expects it valid, `Some(rule)` expects exactly that rule broken.
fn check(plan: &Plan, expect: Option<Rule>) {
    let got = plan.validate().err();
    assert_eq!(got.as_ref().and_then(PlanError::rule), expect, "{got:?}");
    if let Some(err) = got {
        let text = err.to_string();
        assert!(text.contains("kernel 0 (multi_pointwise_k0)"), "the message names the kernel: {text}");
    }
}

fn load(body: &mut Body, input: usize, strides: &[usize], dtype: DType) -> ValueId {
    body.push(Expr::Load { input, offset: 0, strides: strides.to_vec() }, dtype)
}

/// Input slots: 0 = x f32 [2, 3], 1 = s f32 scalar, 2 = y bf16 [5], 3 = e f32 [0].
/// Member 0: `exp(x) * s` over [2, 3] into out0; member 1: `y + y` over [5] into out1 (bf16);
/// member 2: `e * s` over [0] into out2.
fn multi() -> Plan {
    let mut m0 = Body::default();
    let x = load(&mut m0, 0, &[3, 1], F);
    let e = m0.push(Expr::Unary { op: UnaryOp::Exp, x }, F);
    let s = load(&mut m0, 1, &[0, 0], F);
    let v = m0.push(Expr::Binary { op: BinaryOp::Mul, a: e, b: s }, F);
    m0.stores.push(Store { value: v, output: 0 });
    let mut m1 = Body::default();
    let y = load(&mut m1, 2, &[1], BF);
    let v = m1.push(Expr::Binary { op: BinaryOp::Add, a: y, b: y }, BF);
    m1.stores.push(Store { value: v, output: 1 });
    let mut m2 = Body::default();
    let e = load(&mut m2, 3, &[1], F);
    let s = load(&mut m2, 1, &[0], F);
    let v = m2.push(Expr::Binary { op: BinaryOp::Mul, a: e, b: s }, F);
    m2.stores.push(Store { value: v, output: 2 });
    let members = vec![
        Pointwise { shape: Shape::new(vec![2, 3]), body: m0 },
        Pointwise { shape: Shape::new(vec![5]), body: m1 },
        Pointwise { shape: Shape::new(vec![0]), body: m2 },
    ];
    let buffer = |dtype, numel, role| Buffer { dtype, numel, role };
    Plan {
        checks: Vec::new(),
        buffers: vec![
            buffer(F, 6, BufferRole::Input(0)),
            buffer(F, 1, BufferRole::Input(1)),
            buffer(BF, 5, BufferRole::Input(2)),
            buffer(F, 0, BufferRole::Input(3)),
            buffer(F, 6, BufferRole::Output),
            buffer(BF, 5, BufferRole::Output),
            buffer(F, 0, BufferRole::Output),
        ],
        inputs: vec![BufferId(0), BufferId(1), BufferId(2), BufferId(3)],
        outputs: [(4, vec![2, 3]), (5, vec![5]), (6, vec![0])]
            .into_iter()
            .map(|(b, dims)| PlanOutput { buffer: BufferId(b), shape: Shape::new(dims) })
            .collect(),
        kernels: vec![Kernel {
            name: "multi_pointwise_k0".into(),
            kind: KernelKind::MultiPointwise(MultiPointwise { members }),
            inputs: (0..4).map(BufferId).collect(),
            outputs: (4..7).map(BufferId).collect(),
            sources: vec![],
        }],
    }
}

fn members(plan: &mut Plan) -> &mut Vec<Pointwise> {
    match &mut plan.kernels[0].kind {
        KernelKind::MultiPointwise(multi) => &mut multi.members,
        _ => unreachable!(),
    }
}

fn with(mut plan: Plan, f: impl FnOnce(&mut Plan)) -> Plan {
    f(&mut plan);
    plan
}

#[test]
fn a_valid_kernel_passes_and_reads_back_from_json() {
    let plan = multi();
    check(&plan, None);
    assert_eq!(plan.kernels[0].kind.family(), "multi_pointwise");
    assert_eq!(Plan::from_json(&plan.to_json()).unwrap(), plan);
    let text = plan.to_string();
    for line in [
        "kernel 0: multi_pointwise_k0 (multi_pointwise: 3 members, 11 elements) reads b0 b1 b2 b3 writes b4 b5 b6",
        "  member 1: shape=[5]",
        "  v1 = add v0, v0 : bf16",
        "  member 2: shape=[0]",
        "  store v2 -> out2",
    ] {
        assert!(text.contains(line), "missing `{line}` in\n{text}");
    }
}

#[test]
fn malformed_members_are_rejected() {
    let rule = Some(Rule::MultiPointwise);
    check(&with(multi(), |p| members(p).clear()), rule);
    // A member that stores nothing.
    check(&with(multi(), |p| members(p)[2].body.stores.clear()), rule);
    // Two members store the same slot (and so slot 2 is never stored).
    check(&with(multi(), |p| members(p)[2].body.stores[0].output = 0), rule);
    // An output slot no member stores.
    check(
        &with(multi(), |p| {
            p.buffers.push(Buffer { dtype: F, numel: 6, role: BufferRole::Output });
            p.kernels[0].outputs.push(BufferId(7));
        }),
        rule,
    );
    // A store to a slot the kernel does not have.
    check(&with(multi(), |p| members(p)[1].body.stores[0].output = 3), rule);
    // A member whose shape does not fill its buffer.
    check(
        &with(multi(), |p| {
            members(p)[1].shape = Shape::new(vec![4]);
        }),
        rule,
    );
    // A store of another dtype than its buffer's.
    check(&with(multi(), |p| p.buffers[5].dtype = F), rule);
    // A store of a value that does not exist.
    check(&with(multi(), |p| members(p)[0].body.stores[0].value = ValueId(9)), rule);
}

#[test]
fn member_bodies_follow_the_pointwise_rules() {
    // A load past the end of its buffer over the member's domain.
    check(&with(multi(), |p| members(p)[1].shape = Shape::new(vec![6])), Some(Rule::Loads));
    // A load of a slot the kernel does not have.
    let bad_slot = with(multi(), |p| {
        if let Expr::Load { input, .. } = &mut members(p)[0].body.values[0].expr {
            *input = 4;
        }
    });
    check(&bad_slot, Some(Rule::Loads));
    // A reduction is no pointwise value.
    let reduction = with(multi(), |p| {
        members(p)[0].body.values[1].expr = Expr::Reduce { op: ReduceOp::Sum, x: ValueId(0) };
    });
    check(&reduction, Some(Rule::Reductions));
    // A typing error inside a member.
    check(&with(multi(), |p| members(p)[1].body.values[1].dtype = F), Some(Rule::ValueTypes));
    // A member may not read what the kernel writes: its outputs are not written before it.
    check(&with(multi(), |p| p.kernels[0].inputs[3] = BufferId(6)), Some(Rule::ReadBeforeWrite));
}
