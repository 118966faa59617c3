//! Gradients that cannot be built are errors that name the op and where the user wrote it.

use braze_autodiff::{backward, AutodiffError};
use braze_ir::{DType, Graph, Op, ReduceOp, SourceLoc};

/// A second-order gradient through attention: its backward's ops have no rule, and the error
/// names the op and the source line of the attention it came from.
#[test]
fn a_gradient_through_an_op_without_a_rule_names_the_op_and_its_line() {
    let mut g = Graph::new();
    let [q, k, v] = [0, 1, 2].map(|_| g.input(DType::F32, [1, 2, 5, 8]));
    let at = SourceLoc { file: "src/model.rs".into(), line: 41, col: 17, backward: false, recomputed: false };
    let y = g.add(Op::Attention { causal: true, scale: 0.35 }, &[q, k, v], Some(at)).unwrap();
    let sum = |g: &mut Graph, x| {
        g.add(Op::Reduce { op: ReduceOp::Sum, axes: vec![0, 1, 2, 3], keepdim: false }, &[x], None).unwrap()
    };
    let loss = sum(&mut g, y);
    let one = g.constant(1.0, DType::F32);
    let first = backward(&mut g, &[(loss, one)], &[q]).unwrap();
    let dq = first[0].expect("q reaches the loss");
    let again = sum(&mut g, dq);
    let one = g.constant(1.0, DType::F32);
    let err = backward(&mut g, &[(again, one)], &[q]).unwrap_err();
    assert!(matches!(err, AutodiffError::NoRule { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("`attention_grad`") || text.contains("`attention_lse`"), "{text}");
    assert!(text.contains("src/model.rs:41:17"), "{text}");
}
