//! The workloads in the `Tensor` API, with seeded inputs: the definitions of
//! [`crate::definition`] run on `braze::Tensor`, plus `sync_demo`, which reads values on the host
//! and so exists only in this form. The CLI runs them; tests compare them compiled and eager.

use crate::definition::{self, Inputs, TensorOps};
use crate::multisum_sizes;
use braze::optim::{AdamW, Optimizer, StateDType};
use braze::{compile, Compiled, DType, Device, Error, Result, Tensor};
use std::sync::Arc;

/// Every workload by name, in the order `benches/workloads.md` lists them, then `sync_demo`.
pub const NAMES: [&str; 10] = [
    "ln_relu_res",
    "ew_chain",
    "multisum",
    "tiny_block",
    "mlp_block",
    "sync_demo",
    "mlp_step",
    "block_fwd",
    "block_step",
    "gpt2_step",
];

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

/// Sizes and seeds of the workloads. The defaults are small, for the CPU reference; the
/// benchmark's standard sizes are in `benches/workloads.md`.
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
    /// The first input's seed; input `i` (in declaration order) gets `seed + i`.
    pub seed: u64,
    /// `tiny_block` layers.
    pub layers: usize,
    /// `mlp_step`: the dtype AdamW keeps its moments in.
    pub optimizer_state: StateDType,
}

impl Default for Sizes {
    fn default() -> Sizes {
        Sizes {
            rows: 64,
            hidden: 256,
            dtype: DType::F32,
            n: 4096,
            k: 64,
            lo: 10,
            hi: 1000,
            seed: 0,
            layers: 16,
            optimizer_state: StateDType::F32,
        }
    }
}

impl TensorOps for Tensor {
    type Error = Error;

    // `track_caller` everywhere: each op records the definition's line, not this impl's.
    #[track_caller]
    fn add(&self, other: &Tensor) -> Result<Tensor> {
        Tensor::add(self, other)
    }

    #[track_caller]
    fn mul(&self, other: &Tensor) -> Result<Tensor> {
        Tensor::mul(self, other)
    }

    #[track_caller]
    fn relu(&self) -> Result<Tensor> {
        Tensor::relu(self)
    }

    #[track_caller]
    fn gelu(&self) -> Result<Tensor> {
        Tensor::gelu(self)
    }

    #[track_caller]
    fn layer_norm(&self, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
        Tensor::layer_norm(self, weight, bias, eps)
    }

    #[track_caller]
    fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        Tensor::matmul(self, other)
    }

    #[track_caller]
    fn sum_all(&self) -> Result<Tensor> {
        Tensor::sum_all(self)
    }

    #[track_caller]
    fn stack(values: &[Tensor]) -> Result<Tensor> {
        Tensor::stack(values, 0)
    }
}

/// Seeded standard normals, input `i` from `seed + i`.
struct RandomInputs {
    seed: u64,
    names: Vec<String>,
    tensors: Vec<Tensor>,
}

impl RandomInputs {
    fn new(seed: u64) -> RandomInputs {
        RandomInputs { seed, names: Vec::new(), tensors: Vec::new() }
    }

    fn into_workload(self, name: &'static str, function: WorkloadFn) -> Workload {
        Workload { name, input_names: self.names, inputs: self.tensors, function }
    }
}

impl Inputs for RandomInputs {
    type Error = Error;
    type Value = Tensor;

    fn input(&mut self, name: &str, dtype: DType, shape: &[usize], scale: f64) -> Result<Tensor> {
        let seed = self.seed.wrapping_add(self.tensors.len() as u64);
        let mut t = Tensor::randn(shape.to_vec(), dtype, seed)?;
        if scale != 1.0 {
            t = t.mul_scalar(scale)?;
        }
        self.names.push(name.to_string());
        self.tensors.push(t.clone());
        Ok(t)
    }
}

/// The workload `name` at `sizes` (the GPT-2 ones are built by [`crate::build`]).
pub(crate) fn build_defined(name: &str, sizes: &Sizes) -> Result<Workload> {
    let Sizes { rows, hidden, dtype, n, seed, .. } = *sizes;
    let mut inputs = RandomInputs::new(seed);
    match name {
        "ln_relu_res" => {
            definition::ln_relu_res_inputs(&mut inputs, dtype, rows, hidden)?;
            Ok(inputs.into_workload("ln_relu_res", Arc::new(ln_relu_res)))
        }
        "ew_chain" => {
            definition::ew_chain_inputs(&mut inputs, dtype, &[n])?;
            Ok(inputs.into_workload("ew_chain", Arc::new(ew_chain)))
        }
        "multisum" => {
            if sizes.lo == 0 || sizes.lo > sizes.hi {
                return Err(Error::InvalidArgument {
                    op: "multisum".into(),
                    loc: None,
                    detail: format!("expected 1 <= lo <= hi, got lo={}, hi={}", sizes.lo, sizes.hi),
                });
            }
            definition::multisum_inputs(&mut inputs, dtype, &multisum_sizes(sizes.k, sizes.lo, sizes.hi, seed))?;
            Ok(inputs.into_workload("multisum", Arc::new(multisum)))
        }
        "tiny_block" => {
            let (x, weights) = tiny_block_inputs(sizes)?;
            Ok(Workload {
                name: "tiny_block",
                input_names: vec!["x".into()],
                inputs: vec![x],
                function: Arc::new(tiny_block(weights)),
            })
        }
        "mlp_block" => {
            definition::mlp_block_inputs(&mut inputs, dtype, rows, hidden, 4 * hidden)?;
            Ok(inputs.into_workload("mlp_block", Arc::new(mlp_block)))
        }
        "sync_demo" => {
            inputs.input("x", dtype, &[rows, hidden], 1.0)?;
            inputs.input("w", dtype, &[hidden, hidden], definition::fan_in_scale(hidden))?;
            Ok(inputs.into_workload("sync_demo", Arc::new(sync_demo)))
        }
        "mlp_step" => mlp_step(sizes, Device::Cpu),
        other => Err(Error::InvalidArgument {
            op: "workload".into(),
            loc: None,
            detail: format!("unknown workload `{other}`; known: {}", NAMES.join(", ")),
        }),
    }
}

/// `tiny_block`'s argument `x` and the weights its function captures, at `sizes`.
pub fn tiny_block_inputs(sizes: &Sizes) -> Result<(Tensor, Vec<(Tensor, Tensor)>)> {
    let mut inputs = RandomInputs::new(sizes.seed);
    definition::tiny_block_inputs(&mut inputs, sizes.dtype, sizes.layers, sizes.rows, sizes.hidden)
}

/// The first `N` inputs as an array, or an arity error naming the workload.
fn inputs<'a, const N: usize>(workload: &str, a: &'a [Tensor]) -> Result<&'a [Tensor; N]> {
    a.try_into().map_err(|_| Error::Arity { function: workload.into(), expected: N, actual: a.len(), names: vec![] })
}

/// [`definition::ln_relu_res`] on `[x, w, b, res]`.
pub fn ln_relu_res(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let [x, w, b, res] = inputs::<4>("ln_relu_res", a)?;
    Ok(vec![definition::ln_relu_res(x, w, b, res)?])
}

/// [`definition::ew_chain`] on `[x, a, b, c]`.
pub fn ew_chain(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let [x, p, q, s] = inputs::<4>("ew_chain", a)?;
    Ok(vec![definition::ew_chain(x, p, q, s)?])
}

/// [`definition::multisum`] of every argument.
pub fn multisum(a: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![definition::multisum(a)?])
}

/// [`definition::tiny_block`] on `[x]`, with the layers' `(w, b)` captured.
pub fn tiny_block(weights: Vec<(Tensor, Tensor)>) -> impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + Send + Sync {
    move |a: &[Tensor]| {
        let [x] = inputs::<1>("tiny_block", a)?;
        Ok(vec![definition::tiny_block(x, &weights)?])
    }
}

/// [`definition::mlp_block`] on `[x, w1, b1, w2, b2, g, beta]`.
pub fn mlp_block(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let [x, w1, b1, w2, b2, g, beta] = inputs::<7>("mlp_block", a)?;
    Ok(vec![definition::mlp_block(x, w1, b1, w2, b2, g, beta)?])
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

// ---- training ------------------------------------------------------------------------------

/// Layers of `mlp_step`.
pub const MLP_STEP_LAYERS: usize = 4;

/// `mlp_step`'s AdamW learning rate (betas, eps and weight decay are PyTorch's defaults).
pub const MLP_STEP_LR: f64 = 1e-3;

/// The names of one `mlp_step` layer's parameters, in the order the layer holds them:
/// `x = layer_norm(x + gelu(x @ w1 + b1) @ w2 + b2, g, beta)`. Layer `l`'s are named
/// `layers.{l}.{name}` ([`TrainingStep::params`]), as `benches/torch_train.py` names its own.
pub const MLP_STEP_PARAMS: [&str; 6] = ["w1", "b1", "w2", "b2", "g", "beta"];

/// A training step with what it trains: the compiled-or-eager step function (inputs `x`,
/// `target`; output the loss), its parameters by name, and the optimizer that updates them.
pub struct TrainingStep {
    pub workload: Workload,
    /// `(name, parameter)` in the optimizer's order; each call leaves the step's gradient in
    /// every parameter's `grad()` and the updated value in the parameter.
    pub params: Vec<(String, Tensor)>,
    /// Shared with the step function: `set_lr` between calls changes the next steps' learning
    /// rate without a retrace.
    pub optimizer: Arc<AdamW>,
}

/// `mlp_step`: [`MLP_STEP_LAYERS`] layers of `x = layer_norm(x + gelu(x @ W1 + b1) @ W2 + b2)`
/// (hidden `4 * sizes.hidden`), the mean squared error against a target, `backward()`, and an
/// AdamW step (lr 1e-3) over every parameter; parameters in `sizes.dtype`, optimizer state in
/// f32. Inputs: `x` and `target`, `[rows, hidden]`; the parameters (seeded, the same for the
/// same `sizes` on every device) and the optimizer live on `device` and are captured, so each
/// call trains one step.
pub fn mlp_step(sizes: &Sizes, device: Device) -> Result<Workload> {
    Ok(mlp_training_step(sizes, device)?.workload)
}

/// [`mlp_step`] with its parameters and optimizer.
pub fn mlp_training_step(sizes: &Sizes, device: Device) -> Result<TrainingStep> {
    let Sizes { rows, hidden, dtype, seed, optimizer_state, .. } = *sizes;
    let inner = 4 * hidden;
    let param = |t: Tensor| -> Result<Tensor> {
        let t = t.to_device(device)?;
        t.set_requires_grad(true)?;
        Ok(t)
    };
    let mut next_seed = seed;
    let mut random = |shape: &[usize], scale: f64| -> Result<Tensor> {
        next_seed += 1;
        param(Tensor::randn(shape.to_vec(), dtype, next_seed)?.mul_scalar(scale)?)
    };
    let mut layers = Vec::with_capacity(MLP_STEP_LAYERS);
    for _ in 0..MLP_STEP_LAYERS {
        layers.push([
            random(&[hidden, inner], definition::fan_in_scale(hidden))?,
            param(Tensor::zeros([inner], dtype, Device::Cpu)?)?,
            random(&[inner, hidden], definition::fan_in_scale(inner))?,
            param(Tensor::zeros([hidden], dtype, Device::Cpu)?)?,
            param(Tensor::ones([hidden], dtype, Device::Cpu)?)?,
            param(Tensor::zeros([hidden], dtype, Device::Cpu)?)?,
        ]);
    }
    let params: Vec<(String, Tensor)> = layers
        .iter()
        .enumerate()
        .flat_map(|(l, layer)| {
            MLP_STEP_PARAMS.iter().zip(layer).map(move |(name, p)| (format!("layers.{l}.{name}"), p.clone()))
        })
        .collect();
    let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.clone()).collect();
    let optimizer = Arc::new(AdamW::new(&tensors, MLP_STEP_LR)?.state_dtype(optimizer_state)?);
    let step_optimizer = optimizer.clone();
    let function = move |a: &[Tensor]| -> Result<Vec<Tensor>> {
        step_optimizer.zero_grad();
        let mut x = a[0].clone();
        for [w1, b1, w2, b2, g, beta] in &layers {
            x = definition::mlp_block(&x, w1, b1, w2, b2, g, beta)?;
        }
        let error = x.sub(&a[1])?;
        let loss = error.mul(&error)?.mean_all()?;
        loss.backward()?;
        step_optimizer.step()?;
        Ok(vec![loss])
    };
    let x = Tensor::randn([rows, hidden], dtype, seed + 1000)?.to_device(device)?;
    let target = Tensor::randn([rows, hidden], dtype, seed + 1001)?.to_device(device)?;
    let workload = Workload {
        name: "mlp_step",
        input_names: vec!["x".into(), "target".into()],
        inputs: vec![x, target],
        function: Arc::new(function),
    };
    Ok(TrainingStep { workload, params, optimizer })
}
