//! braze-ir: the tensor-program IR.
//!
//! Dtypes, shapes with NumPy broadcasting, the op set, a petgraph-backed [`Graph`] with a
//! deterministic text form, a JSON form and a verifier, and [`HostTensor`] for plain data.
//!
//! **Invariant:** knows nothing of devices, passes or kernels; every graph built through
//! [`Graph`]'s methods has been type-checked by [`infer::infer`], the single home of the typing
//! rules.

mod class_match;
mod dtype;
pub mod elementwise;
mod error;
mod graph;
mod host;
pub mod infer;
mod json;
mod literal;
mod op;
pub mod rounding;
mod shape;
mod text;
mod verify;

pub use class_match::class_onehot;
pub use dtype::DType;
pub use elementwise::{BinaryOp, UnaryOp};
pub use error::{IrError, Result};
pub use graph::{Graph, Node, NodeId, SourceLoc};
pub use host::{HostData, HostTensor};
pub use literal::{format_f64, Literal};
pub use op::{AttentionInput, AutocastPolicy, Op, ReduceOp};
pub use shape::Shape;

#[cfg(test)]
mod tests {
    use super::*;

    fn ln_relu_res() -> Graph {
        let mut g = Graph::new();
        let x = g.input(DType::F32, [64, 256]);
        let w = g.input(DType::F32, [256]);
        let b = g.input(DType::F32, [256]);
        let r = g.input(DType::F32, [64, 256]);
        let ln = g.add(Op::LayerNorm { eps: 1e-5 }, &[x, w, b], None).unwrap();
        let y = g.add(Op::Unary { op: UnaryOp::Relu }, &[ln], None).unwrap();
        let z = g.add(Op::Binary { op: BinaryOp::Add }, &[y, r], None).unwrap();
        g.set_outputs(vec![z]);
        g
    }

    /// An arange is a rank-1 node of a number dtype with no operands; it prints, round-trips
    /// through JSON and verifies like any node, and bad declarations are errors naming it.
    #[test]
    fn aranges_are_rank_1_numbers() {
        let mut g = Graph::new();
        let ids = g.arange(5, DType::I64).unwrap();
        let x = g.input(DType::I64, [5]);
        let y = g.add(Op::Binary { op: BinaryOp::Add }, &[ids, x], None).unwrap();
        g.set_outputs(vec![y]);
        g.verify().unwrap();
        assert_eq!(
            g.to_text(),
            "graph(%0: i64[5]) {\n  %1 = arange : i64[5]\n  %2 = add %1, %0 : i64[5]\n  return %2\n}\n"
        );
        assert_eq!(Graph::from_json(&g.to_json()).unwrap().to_text(), g.to_text());
        let bool_err = Graph::new().arange(3, DType::Bool).unwrap_err().to_string();
        assert!(bool_err.contains("arange") && bool_err.contains("bool"), "{bool_err}");
        let rank_err = Graph::new().add_declared(Op::Arange, &[], DType::F32, Shape(vec![2, 3]), None).unwrap_err();
        assert!(rank_err.to_string().contains("an arange is rank 1, got shape [2,3]"), "{rank_err}");
    }

    #[test]
    fn text_form_renumbers_topologically() {
        let g = ln_relu_res();
        g.verify().unwrap();
        assert_eq!(
            g.to_text(),
            "graph(%0: f32[64,256], %1: f32[256], %2: f32[256], %3: f32[64,256]) {\n  \
             %4 = layer_norm %0, %1, %2, eps=1e-5 : f32[64,256]\n  \
             %5 = relu %4 : f32[64,256]\n  \
             %6 = add %5, %3 : f32[64,256]\n  \
             return %6\n}\n"
        );
    }

    #[test]
    fn topo_order_puts_inputs_first_then_ready_nodes_by_creation() {
        let mut g = Graph::new();
        let x = g.input(DType::F32, [4]);
        let c = g.constant(2.0, DType::F32);
        let y = g.input(DType::F32, [4]);
        let a = g.add(Op::Binary { op: BinaryOp::Mul }, &[y, c], None).unwrap();
        let b = g.add(Op::Binary { op: BinaryOp::Add }, &[x, x], None).unwrap();
        let d = g.add(Op::Binary { op: BinaryOp::Sub }, &[b, a], None).unwrap();
        g.set_outputs(vec![d]);
        assert_eq!(g.topo_order(), vec![x, y, c, a, b, d]);
    }

    #[test]
    fn json_round_trips() {
        let g = ln_relu_res();
        let back = Graph::from_json(&g.to_json()).unwrap();
        assert_eq!(back.to_text(), g.to_text());
    }

    #[test]
    fn typing_errors_name_op_expected_and_actual() {
        let mut g = Graph::new();
        let a = g.input(DType::F32, [3]);
        let b = g.input(DType::F32, [4]);
        let c = g.input(DType::BF16, [3]);
        let e = g.add(Op::Binary { op: BinaryOp::Add }, &[a, b], None).unwrap_err();
        assert_eq!(e.to_string(), "add: cannot broadcast [3] with [4]");
        let e = g.add(Op::Binary { op: BinaryOp::Mul }, &[a, c], None).unwrap_err();
        assert_eq!(e.to_string(), "mul: operand 1 has dtype bf16, expected f32");
        let e = g.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keepdim: false }, &[a], None).unwrap_err();
        assert_eq!(e.to_string(), "sum: axis 1 is out of range for a rank-1 tensor");
        let e = g.reshape(a, [2, 2]).unwrap_err();
        assert_eq!(e.to_string(), "reshape: cannot reshape [3] (3 elements) to [2,2] (4 elements)");
    }

    #[test]
    fn replace_and_remove_keep_graph_valid() {
        let mut g = ln_relu_res();
        let order = g.topo_order();
        let relu = order[5];
        let ln = order[4];
        g.replace_all_uses(relu, ln);
        g.remove(relu).unwrap();
        g.verify().unwrap();
        assert!(g.to_text().contains("%5 = add %4, %3"));
        assert!(g.remove(ln).is_err());
    }

    #[test]
    fn host_bytes_round_trip() {
        let t = HostTensor::from_f64(DType::BF16, [2, 2], &[1.0, -2.5, 3.0, f64::NAN]).unwrap();
        let back = HostTensor::from_bytes(DType::BF16, [2, 2], &t.to_bytes()).unwrap();
        assert_eq!(back.to_f64_vec()[..3], [1.0, -2.5, 3.0]);
        assert!(back.get_f64(3).is_nan());
    }
}
