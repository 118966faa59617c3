//! The op table's own promises: names and methods unique, typing consistent with the semantics,
//! f32 and f64 semantics in agreement, and every derivative formula equal to central finite
//! differences of the op's f64 semantics.

use braze_ir::elementwise::{
    Accepts, BinaryOp, CType, DVal, Derivative, DerivativeBuilder, Elem, Partials, UnaryOp, Yields,
};
use braze_ir::DType;
use std::collections::HashSet;

#[test]
fn names_and_methods_are_unique() {
    let mut names = HashSet::new();
    let mut methods = HashSet::new();
    for op in UnaryOp::ALL {
        assert!(names.insert(op.name()), "two ops named {}", op.name());
        assert!(methods.insert(op.method()), "two ops with the method {}", op.method());
    }
    for op in BinaryOp::ALL {
        assert!(names.insert(op.name()), "two ops named {}", op.name());
        assert!(methods.insert(op.method()), "two ops with the method {}", op.method());
    }
}

#[test]
fn ops_serialize_by_name() {
    for &op in UnaryOp::ALL {
        let json = serde_json::to_string(&op).unwrap();
        assert_eq!(serde_json::from_str::<UnaryOp>(&json).unwrap(), op);
    }
    for &op in BinaryOp::ALL {
        let json = serde_json::to_string(&op).unwrap();
        assert_eq!(serde_json::from_str::<BinaryOp>(&json).unwrap(), op);
    }
}

fn sample(dtype: DType) -> Elem<f64> {
    match dtype {
        DType::Bool => Elem::Bool(true),
        d if d.is_float() => Elem::Float(0.75),
        _ => Elem::Int(3),
    }
}

fn kind_matches(value: Elem<f64>, dtype: DType) -> bool {
    matches!(
        (value, dtype),
        (Elem::Float(_), DType::F32 | DType::F16 | DType::BF16)
            | (Elem::Int(_), DType::I32 | DType::I64)
            | (Elem::Bool(_), DType::Bool)
    )
}

/// Every accepted dtype has semantics and a CUDA expression, the result kind is the declared
/// one, and no rejected dtype has a CUDA expression.
#[test]
fn typing_agrees_with_semantics_and_cuda() {
    for &op in UnaryOp::ALL {
        let def = op.def();
        for dtype in DType::ALL {
            let cuda = (def.cuda)("x", CType::of(dtype));
            if def.accepts.allows(dtype) {
                let y = op.eval_f64(sample(dtype));
                assert!(kind_matches(y, def.yields.dtype(dtype)), "{} on {dtype} gave {y:?}", op.name());
                assert!(cuda.is_some(), "{} on {dtype} has no CUDA expression", op.name());
            } else {
                assert!(cuda.is_none(), "{} rejects {dtype} but has a CUDA expression", op.name());
            }
        }
    }
    for &op in BinaryOp::ALL {
        let def = op.def();
        for dtype in DType::ALL {
            let cuda = (def.cuda)("a", "b", CType::of(dtype));
            if def.accepts.allows(dtype) {
                let y = op.eval_f64(sample(dtype), sample(dtype));
                assert!(kind_matches(y, def.yields.dtype(dtype)), "{} on {dtype} gave {y:?}", op.name());
                assert!(cuda.is_some(), "{} on {dtype} has no CUDA expression", op.name());
            } else {
                assert!(cuda.is_none(), "{} rejects {dtype} but has a CUDA expression", op.name());
            }
        }
    }
}

fn float_of<R: Copy + std::fmt::Debug>(value: Elem<R>) -> R {
    match value {
        Elem::Float(x) => x,
        other => panic!("expected a float, got {other:?}"),
    }
}

/// The f32 semantics (what fused kernels compute) stay within a few f32 ulps of the f64
/// reference on ordinary inputs.
#[test]
fn f32_semantics_follow_the_f64_reference() {
    let inputs = [-7.3, -2.0, -0.6, -1e-3, 1e-3, 0.3, 0.75, 1.5, 4.2, 19.0, 25.0];
    for &op in UnaryOp::ALL {
        if op.def().accepts != Accepts::Float && op.def().accepts != Accepts::Numeric {
            continue;
        }
        if op.def().yields != Yields::Same {
            continue;
        }
        for x in inputs {
            let want = float_of(op.eval_f64(Elem::Float(x)));
            let got = float_of(op.eval_f32(Elem::Float(x as f32))) as f64;
            let input_error = (x - (x as f32) as f64).abs() * 30.0;
            let tolerance = 4.0 * f32::EPSILON as f64 * want.abs().max(1e-30) + input_error;
            assert!(
                (got - want).abs() <= tolerance || (got.is_nan() && want.is_nan()),
                "{}({x}): f32 gives {got}, f64 gives {want}",
                op.name()
            );
        }
    }
}

/// Evaluates derivative formulas on f64 numbers, with the table's own semantics.
#[derive(Default)]
struct Numbers(Vec<Elem<f64>>);

impl Numbers {
    fn value(&mut self, v: Elem<f64>) -> DVal {
        self.0.push(v);
        DVal(self.0.len() - 1)
    }

    fn float(&self, v: DVal) -> f64 {
        float_of(self.0[v.0])
    }
}

impl DerivativeBuilder for Numbers {
    fn constant(&mut self, value: f64) -> DVal {
        self.value(Elem::Float(value))
    }

    fn unary(&mut self, op: UnaryOp, x: DVal) -> DVal {
        let y = op.eval_f64(self.0[x.0]);
        self.value(y)
    }

    fn binary(&mut self, op: BinaryOp, a: DVal, b: DVal) -> DVal {
        let y = op.eval_f64(self.0[a.0], self.0[b.0]);
        self.value(y)
    }

    fn select(&mut self, cond: DVal, a: DVal, b: DVal) -> DVal {
        let Elem::Bool(c) = self.0[cond.0] else { panic!("select on a non-bool condition") };
        self.value(if c { self.0[a.0] } else { self.0[b.0] })
    }
}

fn unary_f64(op: UnaryOp, x: f64) -> f64 {
    float_of(op.eval_f64(Elem::Float(x)))
}

fn binary_f64(op: BinaryOp, a: f64, b: f64) -> f64 {
    float_of(op.eval_f64(Elem::Float(a), Elem::Float(b)))
}

/// Central difference with a step relative to `x`.
fn central(f: impl Fn(f64) -> f64, x: f64) -> f64 {
    let h = 1e-6 * x.abs().max(1.0);
    (f(x + h) - f(x - h)) / (2.0 * h)
}

fn assert_near(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "{what}: formula {got}, finite differences {want}");
}

/// Points away from kinks and steps, inside every op's domain.
const POINTS: [f64; 8] = [-3.1, -1.2, -0.4, 0.2, 0.7, 1.3, 2.9, 22.3];

#[test]
fn unary_derivatives_match_finite_differences() {
    for &op in UnaryOp::ALL {
        let def = op.def();
        if let Derivative::NotDifferentiable = def.derivative {
            assert_eq!(def.yields, Yields::Bool, "{} has no derivative but a float result", op.name());
            continue;
        }
        for x in POINTS {
            let y = unary_f64(op, x);
            if !y.is_finite() {
                continue; // outside the domain (log of a negative, ...)
            }
            let want = central(|x| unary_f64(op, x), x);
            match def.derivative {
                Derivative::Formula(formula) => {
                    let mut d = Numbers::default();
                    let (xv, yv) = (d.constant(x), d.constant(y));
                    let got = formula(&mut d, xv, yv);
                    assert_near(d.float(got), want, &format!("d {}({x})", op.name()));
                }
                Derivative::Zero => assert_eq!(want, 0.0, "{} is piecewise constant at {x}", op.name()),
                Derivative::NotDifferentiable => unreachable!("skipped above"),
            }
        }
    }
}

/// A binary op's operand gradients for the incoming gradient `g`, as autodiff builds them from
/// the table; `None` for an op without a gradient.
fn operand_gradients(op: BinaryOp, a: f64, b: f64, g: f64) -> Option<(f64, f64)> {
    if let Partials::NotDifferentiable = op.def().partials {
        return None;
    }
    let y = binary_f64(op, a, b);
    let mut d = Numbers::default();
    let (av, bv, yv, gv) = (d.constant(a), d.constant(b), d.constant(y), d.constant(g));
    let (ga, gb) = match op.def().partials {
        Partials::Formula(formula) => {
            let (da, db) = formula(&mut d, av, bv, yv);
            (d.binary(BinaryOp::Mul, gv, da), d.binary(BinaryOp::Mul, gv, db))
        }
        Partials::Gradients(gradients) => gradients(&mut d, av, bv, yv, gv),
        Partials::NotDifferentiable => unreachable!("returned above"),
    };
    Some((d.float(ga), d.float(gb)))
}

#[test]
fn binary_derivatives_match_finite_differences() {
    let pairs = [(0.7, 1.3), (2.9, -1.2), (1.3, 0.4), (3.0, 2.5), (0.2, 0.2)];
    for &op in BinaryOp::ALL {
        for (a, b) in pairs {
            let Some((da, db)) = operand_gradients(op, a, b, 1.0) else {
                let float_result = op.def().yields == Yields::Same && op.def().accepts != Accepts::Integer;
                assert!(!float_result, "{} has no partials but a float result", op.name());
                break;
            };
            if a == b && matches!(op, BinaryOp::Max | BinaryOp::Min) {
                // A tie splits the gradient evenly, as PyTorch does.
                assert_eq!((da, db), (0.5, 0.5), "{} at a tie", op.name());
                continue;
            }
            assert_near(da, central(|a| binary_f64(op, a, b), a), &format!("d/da {}({a}, {b})", op.name()));
            assert_near(db, central(|b| binary_f64(op, a, b), b), &format!("d/db {}({a}, {b})", op.name()));
        }
    }
}

/// Pow's gradients at a zero base are PyTorch's (`pow_backward_self`, `pow_backward_exponent`):
/// the base's is `where(b == 0, 0, g b 0^(b-1))`, the exponent's `g where(b >= 0, 0, y ln 0)`.
#[test]
fn pow_gradients_at_a_zero_base_follow_pytorch() {
    let inf = f64::INFINITY;
    // (a, b, g, d/da, d/db), worked by hand. 0^b is inf for b < 0, 1 for b == 0, 0 for b > 0.
    let cases = [
        (0.0, -2.0, 1.0, -inf, -inf), // -2 * 0^-3 = -inf; inf * ln 0 = -inf
        (0.0, -0.5, 1.0, -inf, -inf), // -0.5 * 0^-1.5
        (0.0, 0.0, 1.0, 0.0, 0.0),    // both masked: b * 0^(b-1) would be 0 * inf = NaN
        (0.0, 0.5, 1.0, inf, 0.0),    // 0.5 * 0^-0.5 = inf; masked 0 * ln 0
        (0.0, 1.0, 1.0, 1.0, 0.0),    // 1 * 0^0
        (0.0, 2.0, 1.0, 0.0, 0.0),    // 2 * 0^1
        (0.0, 2.5, 1.0, 0.0, 0.0),    // 2.5 * 0^1.5
        (-0.0, 0.5, 1.0, inf, 0.0),   // -0 == 0: masked as +0
        (0.0, 2.0, 3.0, 0.0, 0.0),
        (0.0, 1.0, -3.0, -3.0, 0.0),
        // The base's mask is outside the incoming gradient (y is 1 for every base where b == 0),
        // the exponent's inside it, as in PyTorch.
        (0.0, 0.0, inf, 0.0, f64::NAN),
        (2.0, 0.0, f64::NAN, 0.0, f64::NAN),
        (2.0, 0.0, 1.0, 0.0, 2f64.ln()),
    ];
    for (a, b, g, want_da, want_db) in cases {
        let (da, db) = operand_gradients(BinaryOp::Pow, a, b, g).unwrap();
        let same = |got: f64, want: f64| got == want || (got.is_nan() && want.is_nan());
        assert!(same(da, want_da), "d/da pow({a}, {b}) * {g}: {da}, want {want_da}");
        assert!(same(db, want_db), "d/db pow({a}, {b}) * {g}: {db}, want {want_db}");
    }
    // Where the derivative exists, finite differences agree: the base's at integer exponents
    // (a negative base has a value there), from the right at 2.5, and the exponent's wherever
    // 0^b is 0 on both sides.
    for b in [0.0, 1.0, 2.0, 3.0] {
        let (da, _) = operand_gradients(BinaryOp::Pow, 0.0, b, 1.0).unwrap();
        assert_near(da, central(|a| binary_f64(BinaryOp::Pow, a, b), 0.0), &format!("d/da pow(0, {b})"));
    }
    let h = 1e-6;
    let right = (binary_f64(BinaryOp::Pow, h, 2.5) - binary_f64(BinaryOp::Pow, 0.0, 2.5)) / h;
    assert_near(operand_gradients(BinaryOp::Pow, 0.0, 2.5, 1.0).unwrap().0, right, "d/da pow(0, 2.5) from the right");
    for b in [0.5, 1.0, 2.0, 2.5] {
        let (_, db) = operand_gradients(BinaryOp::Pow, 0.0, b, 1.0).unwrap();
        assert_near(db, central(|b| binary_f64(BinaryOp::Pow, 0.0, b), b), &format!("d/db pow(0, {b})"));
    }
}

/// A wrong formula is caught: the checker is not vacuous.
#[test]
fn a_wrong_derivative_is_caught() {
    let mut d = Numbers::default();
    let x = d.constant(0.7);
    let wrong = d.unary(UnaryOp::Cos, x); // d cos is -sin, not cos
    let want = central(|x| unary_f64(UnaryOp::Cos, x), 0.7);
    let caught = std::panic::catch_unwind(|| assert_near(d.float(wrong), want, "d cos"));
    assert!(caught.is_err());
}
