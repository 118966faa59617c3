//! User mistakes are errors, never panics, and each message names the op or argument, the
//! expected and the actual, and the caller's `file:line:col`.

use braze::{compile, DType, Device, Error, Result, Tensor};
use braze_workloads as workloads;
use std::cell::RefCell;

const FILE: &str = "crates/braze/tests/errors.rs";

/// An expression with the line it is on.
macro_rules! at {
    ($e:expr) => {
        ($e, line!())
    };
}

/// `result` must fail with `{op} at {FILE}:{line}:{col}: {detail}` (any column), or with exactly
/// `detail` when `line` is `None` (errors without a source location).
fn check<T: std::fmt::Debug>((result, line): (Result<T>, u32), op: &str, detail: &str) {
    let message = result.expect_err("expected an error").to_string();
    let prefix = format!("{op} at {FILE}:{line}:");
    let rest = message.strip_prefix(&prefix).unwrap_or_else(|| panic!("`{message}` does not start with `{prefix}`"));
    let after_col = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    assert_eq!(after_col, format!(": {detail}"), "in `{message}`");
}

/// `result` must fail with exactly `message` (errors without a source location).
fn check_message<T: std::fmt::Debug>(result: Result<T>, message: &str) {
    assert_eq!(result.expect_err("expected an error").to_string(), message);
}

fn t(shape: &[usize]) -> Tensor {
    Tensor::randn(shape.to_vec(), DType::F32, 7).unwrap()
}

#[test]
fn shape_mismatch() {
    let (x3, x4, x23, x22, x45, w2) = (t(&[3]), t(&[4]), t(&[2, 3]), t(&[2, 2]), t(&[4, 5]), t(&[2]));
    check(at!(x3.add(&x4)), "add", "cannot broadcast [3] with [4]");
    check(at!(&x23 * &x22), "mul", "cannot broadcast [2,3] with [2,2]");
    check(at!(x23.matmul(&x45)), "matmul", "inner dimensions differ: [2,3] @ [4,5]");
    check(at!(x3.reshape([2, 2])), "reshape", "cannot reshape [3] (3 elements) to [2,2] (4 elements)");
    check(at!(x23.layer_norm(&w2, &x3, 1e-5)), "layer_norm", "operand 1 has shape [2], expected [3]");
    check(at!(Tensor::from_vec(vec![1.0f32; 3], [2, 2])), "from_vec", "3 values do not fill shape [2,2] (4 elements)");
    check(at!(x3.item::<f32>()), "item", "expected a tensor with exactly one element, got shape [3]");
    check(at!(Tensor::concat(&[], 0)), "concat", "expected at least one tensor, got 0");
}

#[test]
fn bad_axis() {
    let (x23, x4) = (t(&[2, 3]), t(&[4]));
    check(at!(x23.sum(&[2], false)), "sum", "axis 2 is out of range for a rank-2 tensor");
    check(at!(x23.softmax(-3)), "softmax", "axis -3 is out of range for a rank-2 tensor");
    check(at!(x23.mean(&[1, -1], true)), "mean", "axis -1 repeats an axis already given in [1, -1]");
    check(at!(x23.transpose(0, 5)), "transpose", "axis 5 is out of range for a rank-2 tensor");
    check(at!(x4.slice(0, 1, 9, 1)), "slice", "range 1:9:1 is invalid for axis 0 of size 4");
}

#[test]
fn dtype_mismatch() {
    let (x, half, ints) = (t(&[3]), t(&[3]).cast(DType::BF16).unwrap(), t(&[3]).cast(DType::I32).unwrap());
    // Arithmetic promotes mixed dtypes (tests/promotion.rs); logical ops take bools only.
    check(at!(x.logical_and(&half)), "logical_and", "operand 1 has dtype bf16, expected f32");
    check(at!(x.to_vec::<i32>()), "to_vec", "expected dtype i32, got f32");
    check(at!(ints.exp()), "exp", "not defined for dtype i32");
    check(at!(Tensor::randn([2], DType::I64, 0)), "randn", "expected a float dtype (f32, f16, bf16), got i64");
    check(at!(Tensor::where_(&x, &x, &x)), "where_", "operand 0 has dtype f32, expected bool");
}

#[test]
fn errors_inside_a_compiled_function_carry_the_same_location() {
    let line = line!() + 1;
    let compiled = compile(|a: &[Tensor]| Ok(vec![a[0].add(&a[1])?]));
    check((compiled.call(&[t(&[3]), t(&[4])]), line), "add", "cannot broadcast [3] with [4]");
}

#[test]
fn wrong_arity_on_call_names_the_missing_input() {
    let compiled = compile(workloads::ln_relu_res).name("ln_relu_res").input_names(&["x", "w", "b", "res"]);
    check_message(
        compiled.call(&[t(&[2, 3]), t(&[3]), t(&[3])]),
        "`ln_relu_res`: expected 4 inputs (x, w, b, res), got 3; missing res",
    );
    // Without declared names, the function itself reports it.
    check_message(compile(workloads::ln_relu_res).call(&[t(&[2, 3])]), "`ln_relu_res`: expected 4 inputs, got 1");
}

#[test]
fn cuda_is_a_clear_error() {
    if braze_cuda::cuda_available() {
        println!("skipped: a CUDA device is present, so asking for one is not an error");
        return;
    }
    let tail = "CUDA device not available (asked for cuda:0): no NVIDIA driver or GPU was found; use Device::Cpu";
    check_message(Device::cuda(0), &format!("Device::cuda: {tail}"));
    check_message(Tensor::zeros([2], DType::F32, Device::Cuda(0)), &format!("zeros: {tail}"));
    check_message(t(&[2]).to_device(Device::Cuda(0)), &format!("to_device: {tail}"));
}

#[test]
fn a_traced_tensor_used_after_its_call_is_an_error() {
    let escaped: RefCell<Option<Tensor>> = RefCell::new(None);
    let compiled = compile(|a: &[Tensor]| {
        let y = a[0].exp()?;
        *escaped.borrow_mut() = Some(y.clone());
        Ok(vec![y])
    });
    compiled.call(&[t(&[2])]).unwrap();
    let stale = escaped.borrow_mut().take().unwrap();
    assert!(stale.is_traced());
    let (result, line) = at!(stale.relu());
    assert!(matches!(result, Err(Error::StaleTrace { .. })));
    check(
        (result, line),
        "relu",
        "this tensor was traced inside a compiled function whose call has ended; return it from the function to use \
         its value",
    );
    assert!(stale.to_vec::<f32>().is_err());
}

#[test]
fn assign_of_another_type_inside_a_compiled_function_is_an_error() {
    let weight = t(&[2]);
    let captured = weight.clone();
    let line = line!() + 1;
    let compiled = compile(move |a: &[Tensor]| captured.assign(&a[0].reshape([2, 1])?).map(|_| vec![]));
    check(
        (compiled.call(&[t(&[2])]), line),
        "assign",
        "inside a compiled function the new value must keep the type f32[2], got f32[2,1]",
    );
}

#[test]
fn unknown_workload() {
    check_message(
        workloads::build("nope", &workloads::Sizes::default()).map(|w| w.name),
        "workload: unknown workload `nope`; known: ln_relu_res, ew_chain, multisum, tiny_block, mlp_block, sync_demo, mlp_step, block_fwd, block_step, gpt2_step",
    );
}
