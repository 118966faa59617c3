//! Measuring one case: compile in each mode, check against the CPU reference, time, and eager.

use super::{dtype_name, micros, mode_variant, ran, with_poisoned_outputs, Bench};
use crate::common::{check_host, check_host_either, slice_rows, Check, Pair};
use anyhow::{bail, Result};
use braze::{DType, HostTensor, Mode, Tensor};
use braze_workloads::WorkloadFn;
use serde_json::{json, Map, Value};
use std::time::Instant;

/// Which part of the output is checked against the CPU reference.
pub(super) enum Scope {
    All,
    /// Row-wise (or elementwise) workloads: every row, the reference computed in chunks of rows
    /// from the same rows of the inputs shaped like the first input (the output's shape).
    Rows,
    /// As `Rows`, where the inputs split by row are these (`true`), each holding the output's
    /// rows along its first axis: broadcasts like `[rows, 1]` beside `[rows, cols]`.
    RowsOf(Vec<bool>),
}

/// One workload at one size, with everything measured about it.
pub(super) struct Case {
    pub(super) workload: &'static str,
    pub(super) shape: String,
    pub(super) dtype: DType,
    pub(super) pair: Pair,
    pub(super) bytes: Option<f64>,
    pub(super) flops: Option<f64>,
    pub(super) modes: Vec<Mode>,
    /// `Err(reason)` when eager is not measured.
    pub(super) eager: std::result::Result<(), String>,
    pub(super) scope: Scope,
    /// Launches per call expected, and how many more are allowed.
    pub(super) launch_target: Option<(usize, usize)>,
    /// Where elementwise tolerance is the wrong yardstick: the relative L2 error that passes
    /// instead, and why.
    pub(super) rel_l2_ok: Option<(f64, &'static str)>,
    /// Also time per call on the host clock (launch-bound workloads).
    pub(super) host_clock: bool,
}

impl Bench {
    /// Compiles, checks and times one case in each mode, then eager.
    pub(super) fn measure(&mut self, case: &Case) -> Result<()> {
        let inputs = &case.pair.dev.inputs;
        let dtype = dtype_name(case.dtype);
        let reference = Reference::new(case)?;
        for mode in self.modes(&case.modes) {
            let variant = mode_variant(mode);
            // The checked call runs on its own instance with poisoned outputs (NaN-filled before
            // each run, as in the conformance suite), so an element no kernel wrote cannot pass;
            // the timed instance below is built without the extra memsets.
            let (first_call, before, after, check) = with_poisoned_outputs(|| -> Result<_> {
                let checked = case.pair.dev.compile().fullgraph(true).mode(mode);
                let before = braze::kernel_cache_stats();
                let start = Instant::now();
                let out = checked.call(inputs)?;
                self.timer.sync()?;
                let first_call = start.elapsed();
                let after = braze::kernel_cache_stats();
                Ok((first_call, before, after, reference.check(&out)?))
            })?;
            let compiled = case.pair.dev.compile().fullgraph(true).mode(mode);
            let explanation = compiled.explain(inputs)?;
            let timing = self.bench(&mut || ran(compiled.call(inputs)), self.rep_ms)?;
            let us = timing.median_us;
            let mut row = Map::new();
            row.insert("workload".into(), json!(case.workload));
            row.insert("shape".into(), json!(case.shape));
            row.insert("dtype".into(), json!(dtype));
            row.insert("variant".into(), json!(variant));
            row.insert("us".into(), json!(us));
            row.insert("gbps".into(), json!(case.bytes.map(|b| b / (us * 1e-6) / 1e9)));
            row.insert("reps".into(), json!(timing.reps));
            if let (Some(b), Some(copy)) = (case.bytes, self.copy_gbps) {
                row.insert("pct_copy".into(), json!(100.0 * b / (us * 1e-6) / 1e9 / copy));
            }
            if let Some(flops) = case.flops {
                row.insert("tflops".into(), json!(flops / (us * 1e-6) / 1e12));
            }
            row.insert("kernels".into(), json!(explanation.kernels));
            row.insert("launches".into(), json!(explanation.launches));
            if let Some((target, extra)) = case.launch_target {
                let met = explanation.launches.is_some_and(|l| l <= target + extra && l >= target.min(1));
                row.insert(
                    "launch_target".into(),
                    json!(if extra > 0 { format!("{target}+{extra}") } else { target.to_string() }),
                );
                row.insert("launch_target_met".into(), json!(met));
                if !met {
                    self.failures.push(format!(
                        "{} {} {variant}: {:?} launches per call, target {target} (+{extra})",
                        case.workload, case.shape, explanation.launches
                    ));
                }
            }
            row.insert("first_call_s".into(), json!(first_call.as_secs_f64()));
            if mode == Mode::MaxAutotune {
                // The first max-autotune call traces, compiles the candidates, times them and
                // runs the winner: the tuning time a user waits for once.
                row.insert("tuning_s".into(), json!(first_call.as_secs_f64()));
            }
            row.insert("first_call_nvrtc_compiles".into(), json!(after.compiles - before.compiles));
            let verdict = verdict(&check, case.rel_l2_ok);
            if let (Some((limit, why)), false) = (case.rel_l2_ok, check.passed()) {
                row.insert("check_note".into(), json!(format!("judged on rel L2 error < {limit:e}: {why}")));
            }
            row.insert("check".into(), json!(verdict));
            row.insert("checked".into(), json!(format!("all {} output elements", check.numel)));
            row.insert("max_abs_err".into(), json!(check.max_abs_error));
            row.insert("rel_err".into(), json!(check.rel_l2_error()));
            row.insert("mismatches".into(), json!(check.mismatches));
            if verdict == "FAIL" {
                self.failures.push(format!(
                    "{} {} {dtype} {variant}: wrong result: {} ({})",
                    case.workload,
                    case.shape,
                    check.summary(),
                    check.first_mismatch.clone().unwrap_or_default()
                ));
            }
            self.emit(Value::Object(row));
            if case.host_clock {
                let (enqueue, total) = self.timer.host_per_call(&mut || ran(compiled.call(inputs)), 1000)?;
                let note = format!(
                    "host clock per call over 1000 back-to-back cached calls, until the device finished; \
                     returning from the call alone: {:.2} us",
                    micros(enqueue)
                );
                let v = format!("info host per call{}", if mode == Mode::ReduceOverhead { "+graphs" } else { "" });
                self.info(case.workload, &case.shape, &dtype, &v, Some(micros(total)), &note);
            }
        }
        match &case.eager {
            Ok(()) => {
                let f = &case.pair.dev.function;
                // Eager kernels read their sizes at run time where they can: a new size of an op
                // must not mean a new NVRTC compile.
                let compiles_before = braze::kernel_cache_stats().compiles;
                let timing = self.bench(&mut || ran(f(inputs)), self.rep_ms)?;
                let compiles = braze::kernel_cache_stats().compiles - compiles_before;
                let us = timing.median_us;
                let ops: usize = {
                    let compiled = case.pair.dev.compile();
                    compiled.explain(inputs)?.graphs.iter().map(|g| g.op_count()).sum()
                };
                let mut row = json!({
                    "workload": case.workload, "shape": case.shape, "dtype": dtype, "variant": "braze eager",
                    "us": us, "gbps": case.bytes.map(|b| b / (us * 1e-6) / 1e9), "ops": ops,
                    "reps": timing.reps, "nvrtc_compiles": compiles,
                    "note": format!("{ops} ops a call, {compiles} NVRTC compiles in all"),
                });
                if let Some(flops) = case.flops {
                    row["tflops"] = json!(flops / (us * 1e-6) / 1e12);
                }
                self.emit(row);
            }
            Err(reason) => self.info(case.workload, &case.shape, &dtype, "info braze eager", None, reason),
        }
        Ok(())
    }
}

/// `pass` within the elementwise tolerance of the dtype; `pass (rel L2)` where the case allows it
/// and the relative L2 error is below its limit; else `FAIL`.
fn verdict(check: &Check, rel_l2_ok: Option<(f64, &str)>) -> &'static str {
    if check.passed() {
        "pass"
    } else if rel_l2_ok.is_some_and(|(limit, _)| check.rel_l2_error() < limit) {
        "pass (rel L2)"
    } else {
        "FAIL"
    }
}

/// Reference outputs for the rows `start..end` of every output (`None`: all rows).
type Part = (Option<(usize, usize)>, Vec<HostTensor>);

/// The CPU reference outputs for a case, computed once; row-wise workloads in row chunks on all
/// cores (rows are independent, so a chunk's reference is the function on those input rows).
/// A chunk whose bf16/f16 outputs miss the op-by-op reference is judged against the wide
/// reference too (`braze_cpu::wide_graph`: intermediates kept in f32, as a fused kernel keeps
/// them), computed only then: it costs another evaluation of the chunk.
pub(super) struct Reference {
    /// `(rows, outputs)`: the rows of every output these reference outputs cover, `None` for all.
    parts: Vec<Part>,
    function: WorkloadFn,
    inputs: Vec<HostTensor>,
    /// Which inputs hold one row per output row (sliced with a chunk's rows).
    split: Vec<bool>,
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(1, 32)
}

fn outputs_to_host(outputs: Vec<Tensor>) -> Result<Vec<HostTensor>> {
    Ok(outputs.iter().map(Tensor::to_host).collect::<braze::Result<_>>()?)
}

/// The inputs of the rows `rows` (`None`: all of them).
fn chunk_inputs(inputs: &[HostTensor], split: &[bool], rows: Option<(usize, usize)>) -> Result<Vec<HostTensor>> {
    inputs
        .iter()
        .zip(split)
        .map(|(t, &by_row)| match rows {
            Some((start, end)) if by_row => slice_rows(t, start, end),
            _ => Ok(t.clone()),
        })
        .collect()
}

/// The function's outputs on `inputs` with narrow intermediates kept in f32: its traced graph,
/// widened, on the f64 oracle.
fn wide_outputs(function: &WorkloadFn, inputs: &[HostTensor]) -> Result<Vec<HostTensor>> {
    let args: Vec<Tensor> = inputs.iter().cloned().map(Tensor::from_host).collect();
    let traced = braze::compile(|t: &[Tensor]| function(t)).trace_graph(&args)?;
    let wide = braze_cpu::wide_graph(&traced.graph)?;
    Ok(braze_cpu::eval_graph(&wide, inputs)?)
}

impl Reference {
    pub(super) fn new(case: &Case) -> Result<Reference> {
        let host = &case.pair.host;
        let inputs: Vec<HostTensor> = host.inputs.iter().map(Tensor::to_host).collect::<braze::Result<_>>()?;
        let split: Vec<bool> = match &case.scope {
            Scope::All => vec![false; inputs.len()],
            Scope::RowsOf(split) if split.len() == inputs.len() => split.clone(),
            Scope::RowsOf(split) => bail!("{} row-split flags for {} inputs", split.len(), inputs.len()),
            _ => inputs.iter().map(|t| t.shape() == inputs[0].shape()).collect(),
        };
        let function = host.function.clone();
        let Some(first_split) = split.iter().position(|&s| s) else {
            let parts = vec![(None, outputs_to_host(host.eager()?)?)];
            return Ok(Reference { parts, function, inputs, split });
        };
        let rows = inputs[first_split].shape().dims().first().copied().unwrap_or(1);
        let per_chunk = rows.div_ceil(cores()).max(1);
        let ranges: Vec<(usize, usize)> =
            (0..rows).step_by(per_chunk).map(|a| (a, (a + per_chunk).min(rows))).collect();
        let (f, inputs_ref, split_ref) = (&function, &inputs, &split);
        let parts: Result<Vec<_>> = std::thread::scope(|scope| {
            let handles: Vec<_> = ranges
                .iter()
                .map(|&(start, end)| {
                    scope.spawn(move || -> Result<Part> {
                        let rows = Some((start, end));
                        let chunk: Vec<Tensor> =
                            chunk_inputs(inputs_ref, split_ref, rows)?.into_iter().map(Tensor::from_host).collect();
                        Ok((rows, outputs_to_host(f(&chunk)?)?))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().map_err(|_| anyhow::anyhow!("reference thread panicked"))?).collect()
        });
        Ok(Reference { parts: parts?, function, inputs, split })
    }

    pub(super) fn check(&self, got: &[Tensor]) -> Result<Check> {
        let got: Vec<HostTensor> = got.iter().map(Tensor::to_host).collect::<braze::Result<_>>()?;
        let got = &got;
        let checks: Vec<Result<Check>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .parts
                .iter()
                .map(|(rows, want)| {
                    scope.spawn(move || -> Result<Check> {
                        if want.len() != got.len() {
                            bail!("{} outputs, the reference has {}", got.len(), want.len());
                        }
                        let parts: Vec<HostTensor> = match rows {
                            Some((start, end)) => {
                                got.iter().map(|g| slice_rows(g, *start, *end)).collect::<Result<_>>()?
                            }
                            None => got.clone(),
                        };
                        let mut checks: Vec<Check> =
                            parts.iter().zip(want).map(|(g, w)| check_host(g, w)).collect::<Result<_>>()?;
                        let narrow_miss = |(c, w): (&Check, &HostTensor)| !c.passed() && w.dtype().is_narrow_float();
                        if checks.iter().zip(want).any(narrow_miss) {
                            let wide = wide_outputs(&self.function, &chunk_inputs(&self.inputs, &self.split, *rows)?)?;
                            for (((check, g), w), wide) in checks.iter_mut().zip(&parts).zip(want).zip(&wide) {
                                if narrow_miss((check, w)) {
                                    *check = check_host_either(g, w, Some(wide))?;
                                }
                            }
                        }
                        let mut check = Check::empty();
                        checks.into_iter().for_each(|c| check.merge(c));
                        Ok(check)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().map_err(|_| anyhow::anyhow!("check thread panicked"))?).collect()
        });
        let mut total = Check::empty();
        for c in checks {
            total.merge(c?);
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::sweep::{sweep_cases, SweepKind};
    use crate::bench::sweep_run::{row_split_inputs, sweep_pair};
    use braze::Device;
    use std::sync::Arc;

    fn sweep_case(kind: SweepKind, workload: &str) -> Case {
        let cases = sweep_cases(kind, Some(0.2));
        let sc = cases.iter().find(|c| c.workload == workload && c.dtype == DType::F32).unwrap();
        assert!(sc.rows >= 4, "{sc}: too few rows to split");
        Case {
            workload: sc.workload,
            shape: sc.shape(),
            dtype: sc.dtype,
            pair: sweep_pair(sc, Device::Cpu).unwrap(),
            bytes: None,
            flops: None,
            modes: vec![],
            eager: Ok(()),
            scope: Scope::RowsOf(row_split_inputs(sc)),
            launch_target: None,
            rel_l2_ok: None,
            host_clock: false,
        }
    }

    /// The reference computed in row chunks (inputs split by row where they hold one row per
    /// output row, broadcast operands whole) checks every element, and finds one wrong element.
    #[test]
    fn row_chunked_reference_with_broadcast_inputs_checks_every_element() {
        for (kind, workload) in [
            (SweepKind::Pointwise, "pw_col"),
            (SweepKind::Pointwise, "pw_outer"),
            (SweepKind::Pointwise, "pw_row"),
            (SweepKind::Rows, "ln_gelu_res"),
            (SweepKind::Rows, "softmax_mask"),
        ] {
            let case = sweep_case(kind, workload);
            let reference = Reference::new(&case).unwrap();
            let want = case.pair.host.eager().unwrap();
            let check = reference.check(&want).unwrap();
            assert!(check.passed(), "{workload}: {}", check.summary());
            assert_eq!(check.numel, want[0].to_host().unwrap().numel(), "{workload}");
            let host = want[0].to_host().unwrap();
            let mut values = host.to_f64_vec();
            *values.last_mut().unwrap() += 1.0;
            let wrong = Tensor::from_host(HostTensor::from_f64(host.dtype(), host.shape().clone(), &values).unwrap());
            assert_eq!(reference.check(&[wrong]).unwrap().mismatches, 1, "{workload}");
        }
    }

    /// `silu(x) + res` in bf16 where the sum cancels: silu(4.5) = 4.4506 rounds to 4.4375 op by
    /// op, so the reference is 0 where a fused kernel (silu kept in f32) gives 0.0131, more than
    /// bf16's atol off. The wide reference passes the fused result; a wrong value still fails.
    #[test]
    fn a_cancelling_bf16_sum_passes_against_the_wide_reference() {
        let bf16 = |v: &[f64]| HostTensor::from_f64(DType::BF16, vec![v.len()], v).unwrap();
        let (x, res) = (bf16(&[4.5, 1.0]), bf16(&[-4.4375, 0.25]));
        let function: WorkloadFn = Arc::new(|t: &[Tensor]| Ok(vec![t[0].silu()?.add(&t[1])?]));
        let host = braze_workloads::Workload {
            name: "silu_res",
            input_names: vec!["x".into(), "res".into()],
            inputs: vec![Tensor::from_host(x), Tensor::from_host(res)],
            function,
        };
        let mut case = sweep_case(SweepKind::Rows, "rms_silu_res");
        case.pair = Pair::from_host(host, Device::Cpu).unwrap();
        case.scope = Scope::All;
        let reference = Reference::new(&case).unwrap();
        let op_by_op = case.pair.host.eager().unwrap();
        assert_eq!(op_by_op[0].to_host().unwrap().get_f64(0), 0.0);
        let silu_1 = 1.0 / (1.0 + (-1.0f64).exp());
        for (first, passes) in [(0.0, true), (4.5 / (1.0 + (-4.5f64).exp()) - 4.4375, true), (0.05, false)] {
            let got = Tensor::from_host(bf16(&[first, silu_1 + 0.25]));
            let check = reference.check(&[got]).unwrap();
            assert_eq!(check.passed(), passes, "{first}: {}", check.summary());
        }
        let fused = bf16(&[4.5 / (1.0 + (-4.5f64).exp()) - 4.4375, silu_1 + 0.25]);
        let alone = check_host(&fused, &op_by_op[0].to_host().unwrap()).unwrap();
        assert_eq!(alone.mismatches, 1, "the op-by-op reference alone rejects the fused result");
    }

    #[test]
    fn row_split_flags_must_match_the_inputs() {
        let mut case = sweep_case(SweepKind::Pointwise, "pw_col");
        case.scope = Scope::RowsOf(vec![true]);
        let err = Reference::new(&case).err().expect("one flag for two inputs");
        assert!(err.to_string().contains("1 row-split flags for 2 inputs"), "{err}");
    }
}
