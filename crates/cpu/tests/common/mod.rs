//! Shared by the integration tests: building tensors and graphs from plain values, and
//! comparing results bit for bit.

#![allow(dead_code)]

use braze_cpu::eval_graph;
use braze_ir::{DType, Graph, HostData, HostTensor, NodeId};

pub const NAN: f64 = f64::NAN;
pub const INF: f64 = f64::INFINITY;

/// A tensor from values converted to `dtype` (see `HostTensor::from_f64`).
pub fn t(dtype: DType, shape: &[usize], values: &[f64]) -> HostTensor {
    HostTensor::from_f64(dtype, shape.to_vec(), values).expect("value count matches shape")
}

pub fn f32s(shape: &[usize], values: &[f64]) -> HostTensor {
    t(DType::F32, shape, values)
}

pub fn bools(shape: &[usize], values: &[bool]) -> HostTensor {
    HostTensor::new(shape.to_vec(), HostData::Bool(values.to_vec())).expect("value count matches shape")
}

pub fn i32s(shape: &[usize], values: &[i32]) -> HostTensor {
    HostTensor::new(shape.to_vec(), HostData::I32(values.to_vec())).expect("value count matches shape")
}

pub fn i64s(shape: &[usize], values: &[i64]) -> HostTensor {
    HostTensor::new(shape.to_vec(), HostData::I64(values.to_vec())).expect("value count matches shape")
}

/// 0, 1, 2, ... as f32 in `shape`.
pub fn arange(shape: &[usize]) -> HostTensor {
    let n: usize = shape.iter().product();
    f32s(shape, &(0..n).map(|i| i as f64).collect::<Vec<_>>())
}

/// Builds a graph with one input per tensor in `inputs`, lets `build` add the ops and return the
/// output, and evaluates it.
pub fn run(build: impl FnOnce(&mut Graph, &[NodeId]) -> NodeId, inputs: &[HostTensor]) -> HostTensor {
    let mut graph = Graph::new();
    let ids: Vec<NodeId> = inputs.iter().map(|x| graph.input(x.dtype(), x.shape().clone())).collect();
    let out = build(&mut graph, &ids);
    graph.set_outputs(vec![out]);
    let mut outputs = eval_graph(&graph, inputs).expect("graph evaluates");
    outputs.remove(0)
}

/// Same dtype, shape and elements; floats must match bit for bit (so -0.0 differs from +0.0),
/// except that any NaN matches any NaN.
pub fn assert_identical(actual: &HostTensor, expected: &HostTensor, what: &str) {
    assert_eq!((actual.dtype(), actual.shape()), (expected.dtype(), expected.shape()), "{what}: dtype/shape differ");
    let same = match (actual.data(), expected.data()) {
        (HostData::I32(a), HostData::I32(e)) => a == e,
        (HostData::I64(a), HostData::I64(e)) => a == e,
        (HostData::Bool(a), HostData::Bool(e)) => a == e,
        _ => (0..actual.numel()).all(|i| {
            let (a, e) = (actual.get_f64(i), expected.get_f64(i));
            (a.is_nan() && e.is_nan()) || a.to_bits() == e.to_bits()
        }),
    };
    assert!(same, "{what}:\n  actual   {:?}\n  expected {:?}", actual.data(), expected.data());
}
