//! What the commands share: the device flag, workloads with inputs on a device next to the same
//! workload on the CPU (the reference), comparisons and printing.

use anyhow::{bail, Context, Result};
use braze::{DType, Device, HostTensor, Mode, Tensor};
use braze_workloads::{self as workloads, Sizes, Workload};
use std::sync::Arc;

/// `--device cpu|cuda|cuda:N`.
pub fn parse_device(s: &str) -> std::result::Result<Device, String> {
    match s {
        "cpu" => Ok(Device::Cpu),
        "cuda" | "gpu" => Ok(Device::Cuda(0)),
        _ => match s.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
            Some(ordinal) => Ok(Device::Cuda(ordinal)),
            None => Err(format!("expected cpu, cuda or cuda:N, got `{s}`")),
        },
    }
}

pub fn parse_dtype(s: &str) -> std::result::Result<DType, String> {
    match DType::parse(s) {
        Some(d) if d.is_float() => Ok(d),
        _ => Err(format!("expected f32, f16 or bf16, got `{s}`")),
    }
}

pub fn parse_mode(s: &str) -> std::result::Result<Mode, String> {
    match s {
        "default" => Ok(Mode::Default),
        "reduce-overhead" => Ok(Mode::ReduceOverhead),
        "max-autotune" => Ok(Mode::MaxAutotune),
        _ => Err(format!("expected default, reduce-overhead or max-autotune, got `{s}`")),
    }
}

/// The device asked for (opened now, so a missing GPU is a clear error), or the best available.
pub fn resolve_device(asked: Option<Device>) -> Result<Device> {
    match asked {
        None => Ok(Device::best_available()),
        Some(Device::Cpu) => Ok(Device::Cpu),
        Some(Device::Cuda(ordinal)) => Device::cuda(ordinal)
            .with_context(|| format!("--device cuda:{ordinal}: no usable CUDA device (driver or GPU missing)")),
    }
}

/// A workload twice: `host` on the CPU (the reference) and `dev` with the same values on `device`.
pub struct Pair {
    pub host: Workload,
    pub dev: Workload,
    pub device: Device,
}

fn same_on(w: &Workload, inputs: Vec<Tensor>, function: workloads::WorkloadFn) -> Workload {
    Workload { name: w.name, input_names: w.input_names.clone(), inputs, function }
}

fn to_device(tensors: &[Tensor], device: Device) -> Result<Vec<Tensor>> {
    tensors.iter().map(|t| t.to_device(device).context("moving inputs to the device")).collect()
}

type Gpt2Build = fn(&workloads::Gpt2Sizes, Device) -> braze::Result<Workload>;

/// How to build the GPT-2 workload `name` on a device, if it is one.
fn gpt2_workload(name: &str) -> Option<Gpt2Build> {
    Some(match name {
        "block_fwd" => |s, d| workloads::gpt2::block_workload(s, d, false),
        "block_step" => |s, d| workloads::gpt2::block_workload(s, d, true),
        "gpt2_step" => |s, d| Ok(workloads::gpt2::gpt2_training_step(s, d)?.0),
        _ => return None,
    })
}

/// Workload `name` on `device` alone, with its shape for display: the GPT-2 workloads at their
/// standard sizes (`small`: the CPU-sized ones), the others at `sizes`.
pub fn build_workload(name: &str, small: bool, sizes: &Sizes, device: Device) -> Result<(Workload, String)> {
    if let Some(build) = gpt2_workload(name) {
        let sizes = if small { workloads::Gpt2Sizes::small() } else { workloads::Gpt2Sizes::standard() };
        let shape = format!("{} {}", sizes.shape(name), sizes.dtype);
        return Ok((build(&sizes, device)?, shape));
    }
    let pair = Pair::build(name, sizes, device)?;
    let shape = pair.dev.signature();
    Ok((pair.dev, shape))
}

impl Pair {
    /// Pairs a CPU workload whose function captures no tensors with its inputs moved to `device`.
    pub fn from_host(host: Workload, device: Device) -> Result<Pair> {
        let inputs = to_device(&host.inputs, device)?;
        let dev = same_on(&host, inputs, host.function.clone());
        Ok(Pair { host, dev, device })
    }

    /// Workload `name` at `sizes`. `tiny_block` captures its weights, so they are made here on
    /// both devices.
    pub fn build(name: &str, sizes: &Sizes, device: Device) -> Result<Pair> {
        if name == "mlp_step" {
            // The parameters are captured and trained in place: each side gets its own copy.
            let host = workloads::mlp_step(sizes, Device::Cpu)?;
            let dev = workloads::mlp_step(sizes, device)?;
            return Ok(Pair { host, dev, device });
        }
        if let Some(build) = gpt2_workload(name) {
            // GPT-2 workloads capture their model: each side gets its own, at the small sizes.
            let sizes = workloads::Gpt2Sizes::small();
            return Ok(Pair { host: build(&sizes, Device::Cpu)?, dev: build(&sizes, device)?, device });
        }
        if name != "tiny_block" {
            return Pair::from_host(workloads::build(name, sizes)?, device);
        }
        let (x, host_weights) = workloads::tiny_block_inputs(sizes)?;
        let dev_weights = host_weights
            .iter()
            .map(|(w, b)| Ok((w.to_device(device)?, b.to_device(device)?)))
            .collect::<braze::Result<Vec<_>>>()?;
        let host = Workload {
            name: "tiny_block",
            input_names: vec!["x".into()],
            inputs: vec![x.clone()],
            function: Arc::new(workloads::tiny_block(host_weights)),
        };
        let dev = same_on(&host, vec![x.to_device(device)?], Arc::new(workloads::tiny_block(dev_weights)));
        Ok(Pair { host, dev, device })
    }

    /// New random inputs of the same shapes, dtypes and scale (root mean square) as the current
    /// ones, on the CPU and on the device.
    pub fn fresh_inputs(&self, seed: u64) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        let mut host = Vec::with_capacity(self.host.inputs.len());
        for (i, t) in self.host.inputs.iter().enumerate() {
            let values = t.to_host()?.to_f64_vec();
            let rms = if values.is_empty() {
                1.0
            } else {
                (values.iter().map(|v| v * v).sum::<f64>() / values.len() as f64).sqrt()
            };
            let mut fresh = Tensor::randn(t.shape(), t.dtype(), seed.wrapping_mul(1000).wrapping_add(i as u64))?;
            if rms.is_finite() && rms > 0.0 && (rms - 1.0).abs() > 0.05 {
                fresh = fresh.mul_scalar(rms)?;
            }
            host.push(fresh);
        }
        let dev = to_device(&host, self.device)?;
        Ok((host, dev))
    }
}

/// How a result compares with the reference.
#[derive(Clone, Debug)]
pub struct Check {
    pub numel: usize,
    pub max_abs_error: f64,
    /// `sum (got - want)^2` and `sum want^2` over the elements finite on both sides.
    pub sq_diff: f64,
    pub sq_norm: f64,
    /// Elements outside the dtype's tolerance (`braze_cpu::tolerance`), NaN/Inf placement included.
    pub mismatches: usize,
    pub first_mismatch: Option<String>,
}

impl Check {
    pub fn passed(&self) -> bool {
        self.mismatches == 0
    }

    /// `||got - want|| / ||want||` over the elements finite on both sides.
    pub fn rel_l2_error(&self) -> f64 {
        if self.sq_norm > 0.0 {
            (self.sq_diff / self.sq_norm).sqrt()
        } else {
            self.sq_diff.sqrt()
        }
    }

    /// Folds another output's check into this one.
    pub fn merge(&mut self, other: Check) {
        self.numel += other.numel;
        self.max_abs_error = self.max_abs_error.max(other.max_abs_error);
        self.sq_diff += other.sq_diff;
        self.sq_norm += other.sq_norm;
        self.mismatches += other.mismatches;
        if self.first_mismatch.is_none() {
            self.first_mismatch = other.first_mismatch;
        }
    }

    pub fn empty() -> Check {
        Check { numel: 0, max_abs_error: 0.0, sq_diff: 0.0, sq_norm: 0.0, mismatches: 0, first_mismatch: None }
    }

    pub fn summary(&self) -> String {
        let verdict = if self.passed() {
            "within tolerance".to_string()
        } else {
            format!("{} of {} elements OUT OF TOLERANCE", self.mismatches, self.numel)
        };
        format!(
            "max abs error {:.3e}, rel L2 error {:.3e} over {} elements: {verdict}",
            self.max_abs_error,
            self.rel_l2_error(),
            self.numel
        )
    }
}

/// Compares `got` with `want` at `want`'s dtype tolerance.
pub fn check_host(got: &HostTensor, want: &HostTensor) -> Result<Check> {
    check_host_either(got, want, None)
}

/// [`check_host`], where an element also passes within the tolerance of `wide`, the reference
/// with narrow intermediates kept in f32 (`braze_cpu::wide_graph`).
pub fn check_host_either(got: &HostTensor, want: &HostTensor, wide: Option<&HostTensor>) -> Result<Check> {
    let (rtol, atol) = braze_cpu::tolerance(want.dtype());
    let report = braze_cpu::compare_either(got, want, wide, rtol, atol).map_err(anyhow::Error::msg)?;
    let (mut sq_diff, mut sq_norm) = (0.0f64, 0.0f64);
    for i in 0..got.numel() {
        let (a, b) = (got.get_f64(i), want.get_f64(i));
        if a.is_finite() && b.is_finite() {
            sq_diff += (a - b) * (a - b);
            sq_norm += b * b;
        }
    }
    Ok(Check {
        numel: report.numel,
        max_abs_error: report.max_abs_error,
        sq_diff,
        sq_norm,
        mismatches: report.mismatches,
        first_mismatch: report
            .first_mismatch
            .map(|m| format!("index {:?}: got {}, expected {}", m.coord, m.actual, m.expected)),
    })
}

/// Compares every output (copied to the host) with the reference outputs.
pub fn check_outputs(got: &[Tensor], want: &[Tensor]) -> Result<Check> {
    if got.len() != want.len() {
        bail!("{} outputs, the reference has {}", got.len(), want.len());
    }
    let mut check = Check::empty();
    for (g, w) in got.iter().zip(want) {
        check.merge(check_host(&g.to_host()?, &w.to_host()?)?);
    }
    Ok(check)
}

/// Rows `start..end` (along the first dim) of a row-major tensor, copied.
pub fn slice_rows(t: &HostTensor, start: usize, end: usize) -> Result<HostTensor> {
    use braze::HostData;
    let dims = t.shape().dims();
    let rows = *dims.first().context("slice_rows of a rank-0 tensor")?;
    if start > end || end > rows {
        bail!("rows {start}..{end} of a tensor with {rows} rows");
    }
    let row: usize = dims[1..].iter().product();
    let (a, b) = (start * row, end * row);
    let data = match t.data() {
        HostData::F32(v) => HostData::F32(v[a..b].to_vec()),
        HostData::F16(v) => HostData::F16(v[a..b].to_vec()),
        HostData::BF16(v) => HostData::BF16(v[a..b].to_vec()),
        HostData::I32(v) => HostData::I32(v[a..b].to_vec()),
        HostData::I64(v) => HostData::I64(v[a..b].to_vec()),
        HostData::Bool(v) => HostData::Bool(v[a..b].to_vec()),
    };
    let mut shape = dims.to_vec();
    shape[0] = end - start;
    Ok(HostTensor::new(shape, data)?)
}

/// Prints a graph's text indented, long lines cut and long graphs shortened to their first ops
/// and the return.
pub fn print_graph(text: &str) {
    const MAX_WIDTH: usize = 110;
    const MAX_OPS: usize = 8;
    let lines: Vec<&str> = text.lines().collect();
    let cut = |line: &str| match line.char_indices().nth(MAX_WIDTH) {
        Some((end, _)) => format!("{} ...", &line[..end]),
        None => line.to_string(),
    };
    let ops = lines.len().saturating_sub(3);
    for (i, line) in lines.iter().enumerate() {
        let is_op = i > 0 && i + 2 < lines.len();
        if is_op && i > MAX_OPS {
            if i == MAX_OPS + 1 {
                println!("    ... {} more ops", ops - MAX_OPS);
            }
            continue;
        }
        println!("  {}", cut(line));
    }
}
