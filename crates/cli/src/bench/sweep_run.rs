//! Running a sweep (`braze bench --sweep`): each case of `sweep::sweep_cases` built as a workload
//! with random inputs, then measured like the standard rows (compiled in default and max-autotune
//! mode, every output element checked against the CPU reference), with fewer repetitions.

use super::cases::random_host;
use super::measure::{Case, Scope};
use super::sweep::{Broadcast, RowOp, SweepCase, SweepKind, SweepOp, LONG_ROWS};
use super::Bench;
use crate::common::Pair;
use anyhow::Result;
use braze::{Device, Mode, Tensor};
use braze_workloads::{definition::EPS, Workload};
use std::sync::Arc;

/// `gelu(t) * sigmoid(t) + tanh(t) * exp(-0.5 t)`: the pointwise chain, through each of the four
/// functions the sweep is about.
fn pointwise_chain(t: &Tensor) -> braze::Result<Tensor> {
    t.gelu()?.mul(&t.sigmoid()?)?.add(&t.tanh()?.mul(&t.mul_scalar(-0.5)?.exp()?)?)
}

fn sweep_function(op: SweepOp) -> braze_workloads::WorkloadFn {
    match op {
        SweepOp::Row(RowOp::LayerNormGeluRes) => {
            Arc::new(|t: &[Tensor]| Ok(vec![t[0].layer_norm(&t[1], &t[2], EPS)?.gelu()?.add(&t[3])?]))
        }
        SweepOp::Row(RowOp::RmsNormSiluRes) => {
            Arc::new(|t: &[Tensor]| Ok(vec![t[0].rms_norm(&t[1], EPS)?.silu()?.add(&t[2])?]))
        }
        SweepOp::Row(RowOp::SoftmaxMask) => Arc::new(|t: &[Tensor]| Ok(vec![t[0].add(&t[1])?.softmax(-1)?])),
        SweepOp::Pointwise(Broadcast::Scalar) => {
            Arc::new(|t: &[Tensor]| Ok(vec![pointwise_chain(&t[0].mul_scalar(0.5)?)?]))
        }
        SweepOp::Pointwise(_) => Arc::new(|t: &[Tensor]| Ok(vec![pointwise_chain(&t[0].mul(&t[1])?)?])),
    }
}

fn input_names(op: SweepOp) -> &'static [&'static str] {
    match op {
        SweepOp::Row(RowOp::LayerNormGeluRes) => &["x", "w", "b", "res"],
        SweepOp::Row(RowOp::RmsNormSiluRes) => &["x", "w", "res"],
        SweepOp::Row(RowOp::SoftmaxMask) => &["x", "mask"],
        SweepOp::Pointwise(Broadcast::Outer) => &["a", "b"],
        SweepOp::Pointwise(Broadcast::Scalar) => &["x"],
        SweepOp::Pointwise(_) => &["x", "b"],
    }
}

/// The case as a workload on the CPU with seeded standard normals (a pointwise chain's second
/// operand halved, so `exp(-0.5 t)` stays finite in f16), paired with the same inputs on `device`.
pub(super) fn sweep_pair(case: &SweepCase, device: Device) -> Result<Pair> {
    let specs: Vec<_> = case
        .input_shapes
        .iter()
        .enumerate()
        .map(|(i, shape)| {
            let scale = if matches!(case.op, SweepOp::Pointwise(_)) && i == 1 { 0.5 } else { 1.0 };
            (case.dtype, shape.clone(), 100 + i as u64, scale)
        })
        .collect();
    let host = Workload {
        name: case.workload,
        input_names: input_names(case.op).iter().map(|s| s.to_string()).collect(),
        inputs: random_host(&specs).into_iter().map(Tensor::from_host).collect(),
        function: sweep_function(case.op),
    };
    Pair::from_host(host, device)
}

/// Which inputs hold one row per output row: the reference is computed on chunks of those rows.
pub(super) fn row_split_inputs(case: &SweepCase) -> Vec<bool> {
    case.input_shapes.iter().map(|s| s.len() == 2 && s[0] == case.rows && case.rows > 1).collect()
}

/// One launch a call; the long rows (64 rows, fewer than the SMs) may split each row over blocks
/// and combine the parts in a second launch.
fn launch_target(case: &SweepCase) -> (usize, usize) {
    if case.cols == LONG_ROWS.1 && matches!(case.op, SweepOp::Row(_)) {
        (1, 1)
    } else {
        (1, 0)
    }
}

impl Bench {
    /// Every case of the sweep (of the workloads in `only`, if any).
    pub(super) fn sweep(&mut self, kind: SweepKind, max_mb: Option<f64>, only: &[String]) -> Result<()> {
        let cases: Vec<SweepCase> = super::sweep::sweep_cases(kind, max_mb)
            .into_iter()
            .filter(|c| only.is_empty() || only.iter().any(|o| o == c.workload))
            .collect();
        println!("# sweep {kind:?}: {} cases, {} ms of repetitions each", cases.len(), self.rep_ms);
        for sweep_case in &cases {
            let case = Case {
                workload: sweep_case.workload,
                shape: sweep_case.shape(),
                dtype: sweep_case.dtype,
                pair: sweep_pair(sweep_case, self.device())?,
                bytes: Some(sweep_case.bytes as f64),
                flops: None,
                modes: vec![Mode::Default, Mode::MaxAutotune],
                eager: Err("not measured: sweeps time the compiled modes (PyTorch eager is in torch_baseline.py's \
                            sweep rows)"
                    .into()),
                scope: Scope::RowsOf(row_split_inputs(sweep_case)),
                launch_target: Some(launch_target(sweep_case)),
                rel_l2_ok: None,
                host_clock: false,
            };
            if let Err(e) = self.measure(&case) {
                let message = format!("{e:#}");
                let (shape, dtype) = (sweep_case.shape(), sweep_case.dtype.to_string());
                self.info(sweep_case.workload, &shape, &dtype, "info error", None, &format!("not measured: {message}"));
                self.failures.push(format!("{} {shape} {dtype}: {message}", sweep_case.workload));
            }
            self.save()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::measure::Reference;
    use crate::bench::sweep::sweep_cases;

    /// Every sweep case, shrunk, compiled on the CPU and checked as the bench checks it (against
    /// its own eager reference, or the wide one): the functions trace, compile and compute what
    /// they say for every shape and dtype.
    fn check_compiled_on_cpu(kind: SweepKind) {
        for sweep_case in sweep_cases(kind, Some(0.05)) {
            let case = Case {
                workload: sweep_case.workload,
                shape: sweep_case.shape(),
                dtype: sweep_case.dtype,
                pair: sweep_pair(&sweep_case, Device::Cpu).unwrap(),
                bytes: None,
                flops: None,
                modes: vec![],
                eager: Ok(()),
                scope: Scope::RowsOf(row_split_inputs(&sweep_case)),
                launch_target: None,
                rel_l2_ok: None,
                host_clock: false,
            };
            let reference = Reference::new(&case).unwrap();
            let got = case.pair.dev.compile().fullgraph(true).call(&case.pair.dev.inputs).unwrap();
            assert_eq!(got[0].shape().dims(), &[sweep_case.rows, sweep_case.cols], "{sweep_case}");
            let check = reference.check(&got).unwrap();
            assert!(check.passed(), "{sweep_case}: {}", check.summary());
        }
    }

    #[test]
    fn rows_sweep_cases_compile_and_match_the_reference_on_the_cpu() {
        check_compiled_on_cpu(SweepKind::Rows);
    }

    #[test]
    fn pointwise_sweep_cases_compile_and_match_the_reference_on_the_cpu() {
        check_compiled_on_cpu(SweepKind::Pointwise);
    }

    #[test]
    fn only_long_rows_may_take_a_second_launch() {
        let rows = sweep_cases(SweepKind::Rows, None);
        let long: Vec<_> = rows.iter().filter(|c| launch_target(c) == (1, 1)).collect();
        assert_eq!(long.len(), 9);
        assert!(long.iter().all(|c| c.shape() == "64x65536"));
        assert!(sweep_cases(SweepKind::Pointwise, None).iter().all(|c| launch_target(c) == (1, 0)));
    }

    #[test]
    fn only_inputs_with_a_row_per_output_row_are_split() {
        let cases = sweep_cases(SweepKind::Pointwise, None);
        let split = |w: &str| row_split_inputs(cases.iter().find(|c| c.workload == w).unwrap());
        assert_eq!(split("pw_row"), [true, false]);
        assert_eq!(split("pw_col"), [true, true]);
        assert_eq!(split("pw_outer"), [true, false]);
        assert_eq!(split("pw_scalar"), [true]);
        let rows = sweep_cases(SweepKind::Rows, None);
        assert_eq!(row_split_inputs(&rows[0]), [true, false, false, true]);
    }
}
