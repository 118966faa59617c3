//! The benchmark workloads of `bench/workloads.md`, written with the `Tensor` API, with seeded
//! inputs. The CLI runs them; tests compare them compiled and eager.

use crate::{compile, Compiled, DType, Error, Result, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

/// Every workload by name, in the order `workloads.md` lists them, then `sync_demo`.
pub const NAMES: [&str; 6] = ["ln_relu_res", "ew_chain", "multisum", "tiny_block", "mlp_block", "sync_demo"];

pub type WorkloadFn = Arc<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync>;

/// A function and inputs to call it with.
pub struct Workload {
    pub name: &'static str,
    pub input_names: Vec<String>,
    pub inputs: Vec<Tensor>,
    pub function: WorkloadFn,
}

impl Workload {
    /// Runs the function op by op.
    pub fn eager(&self) -> Result<Vec<Tensor>> {
        (self.function)(&self.inputs)
    }

    /// The function compiled, named after the workload.
    pub fn compile(&self) -> Compiled<impl Fn(&[Tensor]) -> Result<Vec<Tensor>>> {
        let function = self.function.clone();
        let names: Vec<&str> = self.input_names.iter().map(String::as_str).collect();
        compile(move |a: &[Tensor]| function(a)).name(self.name).input_names(&names)
    }

    /// `name(x: f32[64,256], w: f32[256], ...)`, listing at most a few inputs.
    pub fn signature(&self) -> String {
        const SHOWN: usize = 4;
        let mut parts: Vec<String> = self
            .input_names
            .iter()
            .zip(&self.inputs)
            .take(SHOWN)
            .map(|(name, t)| format!("{name}: {}{}", t.dtype(), t.shape()))
            .collect();
        if self.inputs.len() > SHOWN {
            parts.push(format!("... {} inputs", self.inputs.len()));
        }
        format!("{}({})", self.name, parts.join(", "))
    }
}

/// Sizes and seeds of the workloads. The defaults are small, for the CPU reference.
#[derive(Clone, Debug)]
pub struct Sizes {
    pub rows: usize,
    pub hidden: usize,
    pub dtype: DType,
    /// Elements of each `ew_chain` input.
    pub n: usize,
    /// `multisum`: number of tensors and the range of their log-uniform sizes.
    pub k: usize,
    pub lo: usize,
    pub hi: usize,
    pub seed: u64,
    /// `tiny_block` layers.
    pub layers: usize,
}

impl Default for Sizes {
    fn default() -> Sizes {
        Sizes { rows: 64, hidden: 256, dtype: DType::F32, n: 4096, k: 64, lo: 10, hi: 1000, seed: 0, layers: 16 }
    }
}

/// The workload `name` at `sizes`.
pub fn build(name: &str, sizes: &Sizes) -> Result<Workload> {
    let Sizes { rows, hidden, dtype, n, seed, .. } = *sizes;
    let named = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    match name {
        "ln_relu_res" => Ok(Workload {
            name: "ln_relu_res",
            input_names: named(&["x", "w", "b", "res"]),
            inputs: vec![
                Tensor::randn([rows, hidden], dtype, seed)?,
                Tensor::randn([hidden], dtype, seed + 1)?,
                Tensor::randn([hidden], dtype, seed + 2)?,
                Tensor::randn([rows, hidden], dtype, seed + 3)?,
            ],
            function: Arc::new(ln_relu_res),
        }),
        "ew_chain" => Ok(Workload {
            name: "ew_chain",
            input_names: named(&["x", "a", "b", "c"]),
            inputs: (0..4).map(|i| Tensor::randn([n], dtype, seed + i)).collect::<Result<_>>()?,
            function: Arc::new(ew_chain),
        }),
        "multisum" => {
            if sizes.lo == 0 || sizes.lo > sizes.hi {
                return Err(Error::InvalidArgument {
                    op: "multisum".into(),
                    loc: None,
                    detail: format!("expected 1 <= lo <= hi, got lo={}, hi={}", sizes.lo, sizes.hi),
                });
            }
            let lengths = multisum_sizes(sizes.k, sizes.lo, sizes.hi, seed);
            Ok(Workload {
                name: "multisum",
                input_names: (0..lengths.len()).map(|i| format!("t{i}")).collect(),
                inputs: lengths
                    .iter()
                    .enumerate()
                    .map(|(i, &len)| Tensor::randn([len], dtype, seed + i as u64))
                    .collect::<Result<_>>()?,
                function: Arc::new(multisum),
            })
        }
        "tiny_block" => {
            let mut weights = Vec::with_capacity(sizes.layers);
            for layer in 0..sizes.layers as u64 {
                weights.push((
                    Tensor::randn([hidden], dtype, seed + 100 + 2 * layer)?,
                    Tensor::randn([hidden], dtype, seed + 101 + 2 * layer)?,
                ));
            }
            Ok(Workload {
                name: "tiny_block",
                input_names: named(&["x"]),
                inputs: vec![Tensor::randn([rows, hidden], dtype, seed)?],
                function: Arc::new(tiny_block(weights)),
            })
        }
        "mlp_block" => {
            let inner = 4 * hidden;
            Ok(Workload {
                name: "mlp_block",
                input_names: named(&["x", "w1", "b1", "w2", "b2", "g", "beta"]),
                inputs: vec![
                    Tensor::randn([rows, hidden], dtype, seed)?,
                    Tensor::randn([hidden, inner], dtype, seed + 1)?.mul_scalar(1.0 / (hidden as f64).sqrt())?,
                    Tensor::randn([inner], dtype, seed + 2)?,
                    Tensor::randn([inner, hidden], dtype, seed + 3)?.mul_scalar(1.0 / (inner as f64).sqrt())?,
                    Tensor::randn([hidden], dtype, seed + 4)?,
                    Tensor::randn([hidden], dtype, seed + 5)?,
                    Tensor::randn([hidden], dtype, seed + 6)?,
                ],
                function: Arc::new(mlp_block),
            })
        }
        "sync_demo" => Ok(Workload {
            name: "sync_demo",
            input_names: named(&["x", "w"]),
            inputs: vec![
                Tensor::randn([rows, hidden], dtype, seed)?,
                Tensor::randn([hidden, hidden], dtype, seed + 1)?.mul_scalar(1.0 / (hidden as f64).sqrt())?,
            ],
            function: Arc::new(sync_demo),
        }),
        other => Err(Error::InvalidArgument {
            op: "workload".into(),
            loc: None,
            detail: format!("unknown workload `{other}`; known: {}", NAMES.join(", ")),
        }),
    }
}

/// `K` sizes log-uniform in `[lo, hi]` from `seed` (the generator idea of `torch_anchors.py`,
/// drawn from a seeded `StdRng`).
pub fn multisum_sizes(k: usize, lo: usize, hi: usize, seed: u64) -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(seed);
    let (log_lo, log_hi) = ((lo.max(1) as f64).ln(), (hi.max(lo).max(1) as f64).ln());
    (0..k).map(|_| (log_lo + (log_hi - log_lo) * rng.random::<f64>()).exp() as usize).collect()
}

/// The first `N` inputs as an array, or an arity error naming the workload.
fn inputs<'a, const N: usize>(workload: &str, a: &'a [Tensor]) -> Result<&'a [Tensor; N]> {
    a.try_into().map_err(|_| Error::Arity { function: workload.into(), expected: N, actual: a.len(), names: vec![] })
}

/// `relu(layer_norm(x, w, b, 1e-5)) + res`.
pub fn ln_relu_res(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let [x, w, b, res] = inputs::<4>("ln_relu_res", a)?;
    Ok(vec![x.layer_norm(w, b, 1e-5)?.relu()?.add(res)?])
}

/// `gelu_erf(x * a + b) * c`.
pub fn ew_chain(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let [x, p, q, s] = inputs::<4>("ew_chain", a)?;
    Ok(vec![x.mul(p)?.add(q)?.gelu()?.mul(s)?])
}

/// `stack([t.sum() for t in ts])`.
pub fn multisum(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let sums = a.iter().map(|t| t.sum_all()).collect::<Result<Vec<_>>>()?;
    Ok(vec![Tensor::stack(&sums, 0)?])
}

/// `x = relu(layer_norm(x, w_i, b_i)) + x` for each captured `(w_i, b_i)`.
pub fn tiny_block(weights: Vec<(Tensor, Tensor)>) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync {
    move |a: &[Tensor]| {
        let [x] = inputs::<1>("tiny_block", a)?;
        let mut x = x.clone();
        for (w, b) in &weights {
            x = x.layer_norm(w, b, 1e-5)?.relu()?.add(&x)?;
        }
        Ok(vec![x])
    }
}

/// `layer_norm(x + gelu(x @ w1 + b1) @ w2 + b2, g, beta)`.
pub fn mlp_block(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let [x, w1, b1, w2, b2, g, beta] = inputs::<7>("mlp_block", a)?;
    let h = x.matmul(w1)?.add(b1)?.gelu()?.matmul(w2)?.add(b2)?;
    Ok(vec![x.add(&h)?.layer_norm(g, beta, 1e-5)?])
}

/// A training-step-like function with the two host syncs a training loop hides: reading the
/// loss as a number (`item`) and checking for NaN in an `if` (`to_bool`). Returns the updated
/// `x` and the loss.
pub fn sync_demo(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let [x, w] = inputs::<2>("sync_demo", a)?;
    let h = x.matmul(w)?.relu()?;
    let loss = h.mul(&h)?.mean_all()?;
    let loss_value: f32 = loss.item()?;
    let updated = if h.any_nan()?.to_bool()? {
        // Skip the step: keep x as it was.
        x.clone()
    } else {
        x.sub(&h.mul_scalar(0.1)?)?
    };
    // Host control flow on the value read above.
    let scale = if loss_value > 1.0 { 1.0 / loss_value as f64 } else { 1.0 };
    Ok(vec![updated.mul_scalar(scale)?, loss])
}
