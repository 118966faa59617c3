//! Index-add kernels (an index_select's gradient) run by `eval_plan`, which sums each output
//! element as the GPU kernel does: from zero, in the order of the indices, in f32 for floats,
//! rounded to the dtype once. Checked bit for bit against that order written out here, and
//! against an f64 oracle: many repeats of one row, no indices, indices out of range, bf16
//! sources, inner extents that are no multiple of a vector, several outer slices.

use braze_cpu::{eval_graph, eval_plan, random_tensor, SplitMix64};
use braze_ir::{DType, Graph, HostData, HostTensor, Op, Shape};
use braze_plan::{Buffer, BufferId, BufferRole, IndexAdd, Kernel, KernelKind, Plan, PlanOutput};

/// One index_add kernel: src `[outer, indices, inner]` of `dtype` and `indices` of `index` in,
/// `[outer, size, inner]` out.
fn plan(dtype: DType, index: DType, outer: usize, indices: usize, inner: usize, size: usize) -> Plan {
    let ia = IndexAdd { outer, indices, inner, size, dtype, index_dtype: index };
    let plan = Plan {
        checks: Vec::new(),
        buffers: vec![
            Buffer { dtype, numel: outer * indices * inner, role: BufferRole::Input(0) },
            Buffer { dtype: index, numel: indices, role: BufferRole::Input(1) },
            Buffer { dtype, numel: outer * size * inner, role: BufferRole::Output },
        ],
        inputs: vec![BufferId(0), BufferId(1)],
        outputs: vec![PlanOutput { buffer: BufferId(2), shape: Shape::new(vec![outer, size, inner]) }],
        kernels: vec![Kernel {
            name: "index_add".into(),
            kind: KernelKind::IndexAdd(ia),
            inputs: vec![BufferId(0), BufferId(1)],
            outputs: vec![BufferId(2)],
            sources: vec![],
        }],
    };
    plan.validate().unwrap_or_else(|e| panic!("{e}"));
    plan
}

fn indices(index: DType, values: &[i64]) -> HostTensor {
    let data = match index {
        DType::I32 => HostData::I32(values.iter().map(|&v| v as i32).collect()),
        _ => HostData::I64(values.to_vec()),
    };
    HostTensor::new(vec![values.len()], data).unwrap()
}

/// `n` indices in `lo..hi` from a fixed generator.
fn random_indices(n: usize, lo: i64, hi: i64, seed: u64) -> Vec<i64> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| lo + (rng.next_u64() % (hi - lo) as u64) as i64).collect()
}

/// The sums as the kernels make them: f32 from zero in index order, one rounding at the end
/// (`from_f64` rounds the exact f32 value to the dtype).
fn f32_in_index_order(src: &HostTensor, at: &[i64], outer: usize, inner: usize, size: usize) -> Vec<f32> {
    let mut acc = vec![0.0f32; outer * size * inner];
    for o in 0..outer {
        for (j, &row) in at.iter().enumerate() {
            if row < 0 || row >= size as i64 {
                continue;
            }
            for i in 0..inner {
                acc[(o * size + row as usize) * inner + i] += src.get_f64((o * at.len() + j) * inner + i) as f32;
            }
        }
    }
    acc
}

/// The exact sums in f64.
fn f64_oracle(src: &HostTensor, at: &[i64], outer: usize, inner: usize, size: usize) -> Vec<f64> {
    let mut acc = vec![0.0f64; outer * size * inner];
    for o in 0..outer {
        for (j, &row) in at.iter().enumerate() {
            if (0..size as i64).contains(&row) {
                for i in 0..inner {
                    acc[(o * size + row as usize) * inner + i] += src.get_f64((o * at.len() + j) * inner + i);
                }
            }
        }
    }
    acc
}

/// Runs the kernel and checks it bit for bit against [`f32_in_index_order`], and within `rtol`
/// of the f64 oracle (relative to the sum of magnitudes of each element's terms, at least 1).
#[allow(clippy::too_many_arguments)]
fn check(what: &str, dtype: DType, index: DType, outer: usize, inner: usize, size: usize, at: &[i64], rtol: f64) {
    let src = random_tensor(dtype, [outer, at.len(), inner], 17 + at.len() as u64);
    let out = eval_plan(&plan(dtype, index, outer, at.len(), inner, size), &[src.clone(), indices(index, at)]).unwrap();
    let got = &out[0];
    assert_eq!(got.shape().dims(), [outer, size, inner], "{what}");
    let order = f32_in_index_order(&src, at, outer, inner, size);
    let want =
        HostTensor::from_f64(dtype, vec![outer, size, inner], &order.iter().map(|&x| x as f64).collect::<Vec<_>>())
            .unwrap();
    for i in 0..got.numel() {
        assert_eq!(got.get_f64(i).to_bits(), want.get_f64(i).to_bits(), "{what}: element {i}");
    }
    let oracle = f64_oracle(&src, at, outer, inner, size);
    let magnitude = f64_oracle(
        &HostTensor::from_f64(
            DType::F32,
            src.shape().clone(),
            &src.to_f64_vec().iter().map(|x| x.abs()).collect::<Vec<_>>(),
        )
        .unwrap(),
        at,
        outer,
        inner,
        size,
    );
    for (i, (&e, &m)) in oracle.iter().zip(&magnitude).enumerate() {
        let g = got.get_f64(i);
        assert!((g - e).abs() <= rtol * m.max(1.0), "{what}: element {i} is {g}, the exact sum {e}");
    }
}

#[test]
fn every_index_the_same_row() {
    for index in [DType::I32, DType::I64] {
        check("16384 hits on row 3", DType::F32, index, 1, 40, 7, &[3; 16_384], 1e-4);
    }
    // Many repeats mixed with other rows, with two outer slices.
    check("repeats", DType::F32, DType::I64, 2, 33, 50, &random_indices(5000, 0, 4, 1), 1e-5);
}

#[test]
fn no_indices_give_zeros() {
    for dtype in [DType::F32, DType::BF16, DType::I64] {
        let src = HostTensor::from_f64(dtype, vec![2, 0, 3], &[]).unwrap();
        let out = eval_plan(&plan(dtype, DType::I64, 2, 0, 3, 5), &[src, indices(DType::I64, &[])]).unwrap();
        assert_eq!(out[0].shape().dims(), [2, 5, 3]);
        assert!(out[0].to_f64_vec().iter().all(|&x| x == 0.0 && x.is_sign_positive()), "{dtype}");
    }
    // No rows or no columns: nothing to write.
    for (size, inner) in [(0, 3), (4, 0)] {
        let src = random_tensor(DType::F32, [1, 2, inner], 1);
        let out = eval_plan(&plan(DType::F32, DType::I32, 1, 2, inner, size), &[src, indices(DType::I32, &[0, 0])]);
        assert_eq!(out.unwrap()[0].numel(), 0);
    }
}

#[test]
fn indices_out_of_range_add_nothing() {
    let at = [-1, 5, 2, i64::MIN, 7, 2, i64::MAX, 0, -5];
    for index in [DType::I32, DType::I64] {
        // i32 indices: the extremes of i32.
        let at: Vec<i64> = at
            .iter()
            .map(|&v| if index == DType::I32 { v.clamp(i32::MIN as i64, i32::MAX as i64) } else { v })
            .collect();
        check(&format!("out of range {index}"), DType::F32, index, 2, 6, 5, &at, 1e-6);
        let src = HostTensor::full(DType::F32, vec![1, at.len(), 1], 1.0);
        let out = eval_plan(&plan(DType::F32, index, 1, at.len(), 1, 5), &[src, indices(index, &at)]).unwrap();
        assert_eq!(out[0].to_f64_vec(), [1.0, 0.0, 2.0, 0.0, 0.0], "{index}");
    }
}

#[test]
fn bf16_sources_accumulate_in_f32_and_round_once() {
    // 4096 hits of 1/64 on one row: 64 exactly in f32; summed in bf16 steps it would stop at
    // 4 (where 1/64 is below half a bf16 ulp).
    let src = HostTensor::full(DType::BF16, vec![1, 4096, 2], 1.0 / 64.0);
    let out =
        eval_plan(&plan(DType::BF16, DType::I64, 1, 4096, 2, 3), &[src, indices(DType::I64, &[1; 4096])]).unwrap();
    assert_eq!(out[0].to_f64_vec(), [0.0, 0.0, 64.0, 64.0, 0.0, 0.0]);
    // Random bf16 rows, many repeats: within one bf16 rounding of the exact sum (f32's error
    // over a few thousand terms is far below it).
    for (outer, inner) in [(1, 64), (3, 100), (2, 7)] {
        let at = random_indices(3000, 0, 6, outer as u64);
        check(&format!("bf16 [{outer}, _, {inner}]"), DType::BF16, DType::I32, outer, inner, 6, &at, 1.0 / 256.0);
    }
    for dtype in [DType::F16, DType::F32] {
        check(&format!("{dtype} repeats"), dtype, DType::I64, 2, 9, 6, &random_indices(2000, 0, 6, 3), 1.0 / 1024.0);
    }
}

#[test]
fn inner_extents_that_are_no_multiple_of_a_vector_and_several_outer_slices() {
    for (dtype, inner) in [(DType::F32, 7), (DType::F32, 33), (DType::F32, 1030), (DType::BF16, 100), (DType::F16, 12)]
    {
        for outer in [1, 3] {
            let at = random_indices(700, -2, 45, inner as u64 * 31 + outer as u64);
            check(&format!("{dtype} [{outer}, _, {inner}]"), dtype, DType::I64, outer, inner, 41, &at, 1.0 / 256.0);
        }
    }
}

#[test]
fn integers_wrap() {
    let src = HostTensor::new(vec![1, 3, 1], HostData::I32(vec![i32::MAX, 1, 5])).unwrap();
    let out = eval_plan(&plan(DType::I32, DType::I64, 1, 3, 1, 2), &[src, indices(DType::I64, &[1, 1, 0])]).unwrap();
    assert_eq!(out[0].data(), &HostData::I32(vec![5, i32::MIN]));
}

#[test]
fn the_graph_reference_agrees() {
    // index_add on axis 1 of a [2, 300, 5] source: the f64 reference of the graph and the plan
    // executor within f32's rounding.
    let mut g = Graph::new();
    let src = g.input(DType::F32, [2, 300, 5]);
    let at = g.input(DType::I64, [300]);
    let out = g.add(Op::IndexAdd { axis: 1, size: 9 }, &[src, at], None).unwrap();
    g.set_outputs(vec![out]);
    let data = [random_tensor(DType::F32, [2, 300, 5], 3), indices(DType::I64, &random_indices(300, -1, 10, 4))];
    let want = eval_graph(&g, &data).unwrap();
    let got = eval_plan(&plan(DType::F32, DType::I64, 2, 300, 5, 9), &data).unwrap();
    braze_cpu::assert_close(&got[0], &want[0]).unwrap();
}
