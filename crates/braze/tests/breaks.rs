//! Every graph-break kind, in fullgraph mode (an error at the user's line, nothing run) and in
//! lenient mode (split into graphs, results equal to eager execution).

use braze::{compile, BreakKind, CustomOp, DType, Device, Error, HostTensor, Result, Tensor};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

thread_local! {
    static OP_LINE: Cell<u32> = const { Cell::new(0) };
}

/// Records the line of the op that should break; call as `at(line!(), op)` on the op's line.
fn at<T>(line: u32, result: T) -> T {
    OP_LINE.with(|l| l.set(line));
    result
}

struct Case {
    kind: BreakKind,
    op: &'static str,
    function: fn(&[Tensor]) -> Result<Vec<Tensor>>,
}

fn inputs() -> Vec<Tensor> {
    vec![Tensor::randn([3, 4], DType::F32, 1).unwrap(), Tensor::randn([3, 4], DType::F32, 2).unwrap()]
}

fn check(case: Case) {
    let inputs = inputs();
    let eager = (case.function)(&inputs).expect("eager run");
    let line = OP_LINE.with(Cell::get);
    assert!(line > 0, "the case must mark its op with at(line!(), ..)");

    // fullgraph: the break is an error naming kind, op and the user's line; nothing ran.
    let strict = compile(case.function).fullgraph(true);
    match strict.call(&inputs) {
        Err(Error::GraphBreak { kind, op, loc, hint }) => {
            assert_eq!((kind, op.as_str()), (case.kind, case.op));
            assert!(loc.file.ends_with("tests/breaks.rs"), "{}", loc.file);
            assert_eq!(loc.line, line, "{op}");
            assert_eq!(hint, case.kind.hint());
        }
        other => panic!("{}: expected a graph break, got {other:?}", case.op),
    }
    assert_eq!(strict.stats().graphs_compiled, 0, "{}: fullgraph mode ran a graph", case.op);

    // lenient: split at the break, same results as eager, pieces reused on the next call.
    let lenient = compile(case.function);
    let explanation = lenient.explain(&inputs).expect("lenient run");
    assert_eq!(explanation.breaks.len(), 1, "{}", case.op);
    let found = &explanation.breaks[0];
    assert_eq!((found.kind, found.op.as_str(), found.loc.line), (case.kind, case.op, line));
    assert_eq!(explanation.host_syncs, 1);
    let compiled_graphs = lenient.stats().graphs_compiled;
    for _ in 0..2 {
        let outputs = lenient.call(&inputs).expect("lenient call");
        assert_eq!(outputs.len(), eager.len());
        for (got, want) in outputs.iter().zip(&eager) {
            braze_cpu::compare::assert_close(&got.to_host().unwrap(), &want.to_host().unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", case.op));
        }
    }
    let stats = lenient.stats();
    assert_eq!((stats.traces, stats.graphs_compiled), (1, compiled_graphs), "{}", case.op);
}

fn item_break(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let total = a[0].mul(&a[1])?.sum_all()?;
    let value: f32 = at(line!(), total.item())?;
    Ok(vec![a[0].add_scalar(value as f64)?])
}

fn to_vec_break(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let y = a[0].relu()?;
    let values: Vec<f32> = at(line!(), y.to_vec())?;
    let largest = values.iter().copied().fold(0.0f32, f32::max);
    Ok(vec![y.div_scalar(largest as f64 + 1.0)?])
}

fn to_bool_break(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let y = a[0].sub(&a[1])?;
    let has_nan = y.any_nan()?;
    if at(line!(), has_nan.to_bool())? {
        Ok(vec![a[0].clone()])
    } else {
        Ok(vec![y.exp()?])
    }
}

fn to_host_break(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let y = a[0].tanh()?;
    let host: HostTensor = at(line!(), y.to_host())?;
    let back = Tensor::from_host(host);
    Ok(vec![back.add(&a[1])?])
}

fn to_device_break(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let y = a[0].sigmoid()?;
    let on_cpu = at(line!(), y.to_device(Device::Cpu))?;
    Ok(vec![on_cpu.mul(&a[1])?])
}

fn host_fn_break(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let double = CustomOp::host("double_on_host", |inputs| {
        let values: Vec<f64> = inputs[0].to_f64_vec().iter().map(|v| v * 2.0).collect();
        Ok(vec![HostTensor::from_f64(inputs[0].dtype(), inputs[0].shape().clone(), &values).unwrap()])
    });
    let y = a[0].abs()?;
    let doubled = at(line!(), double.call(&[y]))?;
    Ok(vec![doubled[0].add(&a[1])?])
}

fn nonzero_break(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let positive = a[0].gt_scalar(0.0)?;
    let indices = at(line!(), positive.nonzero())?;
    Ok(vec![indices.cast(DType::F32)?.sum(&[0], false)?, a[1].neg()?])
}

#[test]
fn host_read_item() {
    check(Case { kind: BreakKind::HostRead, op: "item", function: item_break });
}

#[test]
fn host_read_to_vec() {
    check(Case { kind: BreakKind::HostRead, op: "to_vec", function: to_vec_break });
}

#[test]
fn bool_coercion() {
    check(Case { kind: BreakKind::BoolCoercion, op: "to_bool", function: to_bool_break });
}

#[test]
fn copy_to_cpu_to_host() {
    check(Case { kind: BreakKind::CopyToCpu, op: "to_host", function: to_host_break });
}

#[test]
fn copy_to_cpu_to_device() {
    check(Case { kind: BreakKind::CopyToCpu, op: "to_device", function: to_device_break });
}

#[test]
fn opaque_host_fn() {
    check(Case { kind: BreakKind::OpaqueHostFn, op: "double_on_host", function: host_fn_break });
}

#[test]
fn data_dependent_shape() {
    check(Case { kind: BreakKind::DataDependentShape, op: "nonzero", function: nonzero_break });
}

#[test]
fn fullgraph_stops_at_the_first_break_even_if_the_error_is_ignored() {
    let host_runs = Arc::new(AtomicUsize::new(0));
    let counter = host_runs.clone();
    let count = CustomOp::host("count", move |inputs| {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(inputs.to_vec())
    });
    let compiled = compile(move |a: &[Tensor]| {
        let total = a[0].sum_all()?;
        let ignored = total.item::<f32>().is_err();
        let after = a[0].exp()?;
        let _ = count.call(&[a[0].clone()]);
        Ok(vec![after, Tensor::scalar(ignored)])
    })
    .fullgraph(true);
    let error = compiled.call(&inputs()[..1]).unwrap_err();
    assert!(matches!(error, Error::GraphBreak { kind: BreakKind::HostRead, .. }), "{error}");
    assert_eq!(host_runs.load(Ordering::SeqCst), 0);
    assert_eq!(compiled.stats().graphs_compiled, 0);
}

#[test]
fn traceable_custom_op_does_not_break() {
    let softplus = CustomOp::traceable("softplus", |a| Ok(vec![a[0].exp()?.add_scalar(1.0)?.log()?]));
    let compiled = compile(move |a: &[Tensor]| softplus.call(a)).fullgraph(true);
    let explanation = compiled.explain(&inputs()[..1]).unwrap();
    assert_eq!((explanation.graphs.len(), explanation.breaks.len()), (1, 0));
    assert_eq!(explanation.graphs[0].op_count(), 3);
}

#[test]
fn strict_break_message_names_kind_op_location_and_hint() {
    let compiled = compile(item_break).fullgraph(true);
    let message = compiled.call(&inputs()).unwrap_err().to_string();
    let line = OP_LINE.with(Cell::get);
    let expected = format!(
        "graph break in fullgraph mode: `item` at crates/braze/tests/breaks.rs:{line}:40 reads a tensor value on \
         the host (host_read); hint: keep the metric on the device and read it every N steps"
    );
    assert_eq!(message, expected);
}
