//! Inputs that do not match the graph's signature are rejected with messages naming what
//! differs.

mod common;

use braze_cpu::{eval_graph, CpuError};
use braze_ir::{BinaryOp, DType, Graph, HostTensor, Op};
use common::*;

/// A graph `add(x: f32[64,256], y: f32[64,256])`.
fn add_graph() -> Graph {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [64, 256]);
    let y = g.input(DType::F32, [64, 256]);
    let z = g.add(Op::Binary { op: BinaryOp::Add }, &[x, y], None).unwrap();
    g.set_outputs(vec![z]);
    g
}

fn check(inputs: &[HostTensor], expected: &str) {
    let err = eval_graph(&add_graph(), inputs).unwrap_err();
    assert_eq!(err.to_string(), expected);
}

#[test]
fn wrong_inputs_name_index_expected_and_actual() {
    let good = HostTensor::full(DType::F32, [64, 256], 1.0);
    check(std::slice::from_ref(&good), "expected 2 inputs, got 1");
    check(&[good.clone(), good.clone(), good.clone()], "expected 2 inputs, got 3");
    let half = HostTensor::full(DType::F16, [64, 256], 1.0);
    check(&[good.clone(), half], "input 1: expected f32[64,256], got f16[64,256]");
    let narrow = HostTensor::full(DType::F32, [64, 255], 1.0);
    check(&[narrow, good.clone()], "input 0: expected f32[64,256], got f32[64,255]");
    let scalar = HostTensor::full(DType::F32, [], 1.0);
    check(&[good, scalar], "input 1: expected f32[64,256], got f32[]");
}

#[test]
fn errors_are_structured() {
    let err = eval_graph(&add_graph(), &[]).unwrap_err();
    assert_eq!(err, CpuError::Arity { expected: 2, actual: 0 });
}

#[test]
fn graphs_with_several_and_repeated_outputs() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, [2]);
    let two = g.constant(2.0, DType::F32);
    let y = g.add(Op::Binary { op: BinaryOp::Mul }, &[x, two], None).unwrap();
    let unused = g.add(Op::Unary { op: braze_ir::UnaryOp::Exp }, &[y], None).unwrap();
    let z = g.add(Op::Binary { op: BinaryOp::Add }, &[y, y], None).unwrap();
    g.set_outputs(vec![z, x, z, y]);
    let _ = unused;
    let out = eval_graph(&g, &[f32s(&[2], &[1.0, -3.0])]).unwrap();
    let expected =
        [f32s(&[2], &[4.0, -12.0]), f32s(&[2], &[1.0, -3.0]), f32s(&[2], &[4.0, -12.0]), f32s(&[2], &[2.0, -6.0])];
    assert_eq!(out.len(), 4);
    for (actual, expected) in out.iter().zip(&expected) {
        assert_identical(actual, expected, "multi-output");
    }
}
