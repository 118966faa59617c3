//! Each workload once: the inputs it takes (generic over [`Inputs`]) and what it computes
//! (generic over [`TensorOps`]). `braze::Tensor` implements both traits in the `Tensor`-API form,
//! graph nodes in [`crate::graph`].

use braze_ir::DType;

/// The epsilon of every layer norm of the workloads.
pub const EPS: f64 = 1e-5;

/// What a workload computes with: a `braze::Tensor` (eager, or traced inside `compile`) or a
/// node of an IR graph being built. Each method is the `Tensor` method of the same name.
pub trait TensorOps: Sized + Clone {
    type Error;
    fn add(&self, other: &Self) -> Result<Self, Self::Error>;
    fn mul(&self, other: &Self) -> Result<Self, Self::Error>;
    fn relu(&self) -> Result<Self, Self::Error>;
    /// Exact GELU (with `erf`).
    fn gelu(&self) -> Result<Self, Self::Error>;
    /// Over the last dim, with a per-column `weight` and `bias`.
    fn layer_norm(&self, weight: &Self, bias: &Self, eps: f64) -> Result<Self, Self::Error>;
    fn matmul(&self, other: &Self) -> Result<Self, Self::Error>;
    /// The sum of every element, as a rank-0 value.
    fn sum_all(&self) -> Result<Self, Self::Error>;
    /// `values` stacked along a new first axis.
    fn stack(values: &[Self]) -> Result<Self, Self::Error>;
}

/// Where a workload's inputs come from: seeded random tensors, or graph inputs.
pub trait Inputs {
    type Error;
    type Value: TensorOps<Error = Self::Error>;
    /// The next input. Random values are standard normals times `scale`.
    fn input(&mut self, name: &str, dtype: DType, shape: &[usize], scale: f64) -> Result<Self::Value, Self::Error>;
}

/// A weight matrix's scale: `1/sqrt(fan_in)` keeps the activations of a product near unit scale.
pub(crate) fn fan_in_scale(fan_in: usize) -> f64 {
    1.0 / (fan_in.max(1) as f64).sqrt()
}

/// `x`, `res`: `[rows, hidden]`; `w`, `b`: `[hidden]`.
pub fn ln_relu_res_inputs<I: Inputs>(
    i: &mut I,
    dtype: DType,
    rows: usize,
    hidden: usize,
) -> Result<[I::Value; 4], I::Error> {
    Ok([
        i.input("x", dtype, &[rows, hidden], 1.0)?,
        i.input("w", dtype, &[hidden], 1.0)?,
        i.input("b", dtype, &[hidden], 1.0)?,
        i.input("res", dtype, &[rows, hidden], 1.0)?,
    ])
}

/// `relu(layer_norm(x, w, b, 1e-5)) + res`.
pub fn ln_relu_res<T: TensorOps>(x: &T, w: &T, b: &T, res: &T) -> Result<T, T::Error> {
    x.layer_norm(w, b, EPS)?.relu()?.add(res)
}

/// Four tensors `x`, `a`, `b`, `c` of one shape (the benchmark's is `[n]`).
pub fn ew_chain_inputs<I: Inputs>(i: &mut I, dtype: DType, shape: &[usize]) -> Result<[I::Value; 4], I::Error> {
    Ok([
        i.input("x", dtype, shape, 1.0)?,
        i.input("a", dtype, shape, 1.0)?,
        i.input("b", dtype, shape, 1.0)?,
        i.input("c", dtype, shape, 1.0)?,
    ])
}

/// `gelu_erf(x * a + b) * c`.
pub fn ew_chain<T: TensorOps>(x: &T, a: &T, b: &T, c: &T) -> Result<T, T::Error> {
    x.mul(a)?.add(b)?.gelu()?.mul(c)
}

/// One 1-D tensor `t{i}` per length (the benchmark draws them with [`crate::multisum_sizes`]).
pub fn multisum_inputs<I: Inputs>(i: &mut I, dtype: DType, lengths: &[usize]) -> Result<Vec<I::Value>, I::Error> {
    lengths.iter().enumerate().map(|(k, &len)| i.input(&format!("t{k}"), dtype, &[len], 1.0)).collect()
}

/// `stack([t.sum() for t in ts])`.
pub fn multisum<T: TensorOps>(ts: &[T]) -> Result<T, T::Error> {
    let sums = ts.iter().map(|t| t.sum_all()).collect::<Result<Vec<_>, _>>()?;
    T::stack(&sums)
}

/// `x` and a `(w_l, b_l)` pair per layer.
pub type TinyBlockInputs<V> = (V, Vec<(V, V)>);

/// `x`: `[rows, hidden]`, then a `w_l`, `b_l` pair of `[hidden]` per layer.
pub fn tiny_block_inputs<I: Inputs>(
    i: &mut I,
    dtype: DType,
    layers: usize,
    rows: usize,
    hidden: usize,
) -> Result<TinyBlockInputs<I::Value>, I::Error> {
    let x = i.input("x", dtype, &[rows, hidden], 1.0)?;
    let weights = (0..layers)
        .map(|l| {
            Ok((i.input(&format!("w{l}"), dtype, &[hidden], 1.0)?, i.input(&format!("b{l}"), dtype, &[hidden], 1.0)?))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((x, weights))
}

/// `x = relu(layer_norm(x, w_l, b_l)) + x` for each layer's `(w_l, b_l)`.
pub fn tiny_block<T: TensorOps>(x: &T, weights: &[(T, T)]) -> Result<T, T::Error> {
    let mut x = x.clone();
    for (w, b) in weights {
        x = x.layer_norm(w, b, EPS)?.relu()?.add(&x)?;
    }
    Ok(x)
}

/// `x`: `[rows, hidden]`, `w1`: `[hidden, inner]`, `b1`: `[inner]`, `w2`: `[inner, hidden]`,
/// `b2`, `g`, `beta`: `[hidden]`; the matrices scaled by `1/sqrt(fan_in)`.
pub fn mlp_block_inputs<I: Inputs>(
    i: &mut I,
    dtype: DType,
    rows: usize,
    hidden: usize,
    inner: usize,
) -> Result<[I::Value; 7], I::Error> {
    Ok([
        i.input("x", dtype, &[rows, hidden], 1.0)?,
        i.input("w1", dtype, &[hidden, inner], fan_in_scale(hidden))?,
        i.input("b1", dtype, &[inner], 1.0)?,
        i.input("w2", dtype, &[inner, hidden], fan_in_scale(inner))?,
        i.input("b2", dtype, &[hidden], 1.0)?,
        i.input("g", dtype, &[hidden], 1.0)?,
        i.input("beta", dtype, &[hidden], 1.0)?,
    ])
}

/// `layer_norm(x + gelu_erf(x @ w1 + b1) @ w2 + b2, g, beta, 1e-5)`.
pub fn mlp_block<T: TensorOps>(x: &T, w1: &T, b1: &T, w2: &T, b2: &T, g: &T, beta: &T) -> Result<T, T::Error> {
    let h = x.matmul(w1)?.add(b1)?.gelu()?.matmul(w2)?.add(b2)?;
    x.add(&h)?.layer_norm(g, beta, EPS)
}
