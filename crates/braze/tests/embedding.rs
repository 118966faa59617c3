//! index_select and embedding through the `Tensor` API: eagerly on the CPU reference and
//! compiled through the whole pipeline on the CPU backend, against loops in f64; gradients
//! against central finite differences; out-of-range indices eagerly and compiled.

use braze::{compile, value_and_grad, DType, Tensor};

fn values(t: &Tensor) -> Vec<f64> {
    t.to_host().unwrap().to_f64_vec()
}

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * w.abs().max(1.0), "{what}[{i}]: {g} vs {w}");
    }
}

/// Rows `indices` of a row-major `[rows, cols]` table.
fn rows_of(table: &[f64], cols: usize, indices: &[i64]) -> Vec<f64> {
    indices.iter().flat_map(|&i| table[i as usize * cols..(i as usize + 1) * cols].to_vec()).collect()
}

fn indices(v: &[i64], shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_slice(v, shape.to_vec()).unwrap().cast(dtype).unwrap()
}

#[test]
fn embedding_eager_and_compiled_match_the_rows_of_the_weight() {
    let picked = [3i64, 0, 3, 9, 1, 3];
    for (dtype, tol) in [(DType::F32, 0.0), (DType::BF16, 0.0), (DType::F16, 0.0)] {
        for index in [DType::I32, DType::I64] {
            let what = format!("{dtype} weight, {index} indices");
            let weight = Tensor::randn([10, 5], DType::F32, 3).unwrap().cast(dtype).unwrap();
            let idx = indices(&picked, &[2, 3], index);
            let want = rows_of(&values(&weight), 5, &picked);
            let eager = weight.embedding(&idx).unwrap();
            assert_eq!(eager.shape().dims(), [2, 3, 5], "{what}");
            assert_eq!(eager.dtype(), dtype, "{what}");
            close(&values(&eager), &want, tol, &format!("{what}: eager"));
            let f = compile(|a: &[Tensor]| Ok(vec![a[0].embedding(&a[1])?])).fullgraph(true);
            let out = f.call(&[weight.clone(), idx.clone()]).unwrap();
            assert_eq!(out[0].shape().dims(), [2, 3, 5], "{what}");
            close(&values(&out[0]), &want, tol, &format!("{what}: compiled"));
        }
    }
}

#[test]
fn index_select_along_every_axis_matches_loops() {
    let x = Tensor::randn([4, 3, 5], DType::F32, 8).unwrap();
    let xv = values(&x);
    let dims = [4usize, 3, 5];
    for axis in 0..3 {
        let picked: Vec<i64> = vec![dims[axis] as i64 - 1, 0, 1, 0];
        let idx = indices(&picked, &[4], DType::I64);
        let mut want = Vec::new();
        let mut out_dims = dims;
        out_dims[axis] = 4;
        for a in 0..out_dims[0] {
            for b in 0..out_dims[1] {
                for c in 0..out_dims[2] {
                    let mut at = [a, b, c];
                    at[axis] = picked[at[axis]] as usize;
                    want.push(xv[(at[0] * 3 + at[1]) * 5 + at[2]]);
                }
            }
        }
        let eager = x.index_select(axis as i64 - 3, &idx).unwrap();
        assert_eq!(eager.shape().dims(), out_dims);
        close(&values(&eager), &want, 0.0, &format!("axis {axis} eager"));
        let f = compile(move |a: &[Tensor]| Ok(vec![a[0].index_select(axis as i64, &a[1])?])).fullgraph(true);
        close(&values(&f.call(&[x.clone(), idx]).unwrap()[0]), &want, 0.0, &format!("axis {axis} compiled"));
    }
}

#[test]
fn embedding_plus_positions_and_cast_is_one_kernel() {
    let weight = Tensor::randn([50, 16], DType::F32, 1).unwrap();
    let positions = Tensor::randn([8, 16], DType::F32, 2).unwrap();
    let idx = indices(&[1, 7, 7, 49, 0, 3, 2, 9, 1, 1, 5, 6, 8, 4, 3, 2], &[2, 8], DType::I32);
    let f = compile(|a: &[Tensor]| Ok(vec![a[0].embedding(&a[1])?.add(&a[2])?.cast(DType::BF16)?])).fullgraph(true);
    let args = [weight.clone(), idx.clone(), positions.clone()];
    let out = f.call(&args).unwrap();
    assert_eq!(f.explain(&args).unwrap().kernels, Some(1));
    let eager = weight.embedding(&idx).unwrap().add(&positions).unwrap().cast(DType::BF16).unwrap();
    assert_eq!(values(&out[0]), values(&eager));
}

#[test]
fn out_of_range_indices_are_errors_eagerly_and_compiled() {
    let weight = Tensor::randn([6, 4], DType::F32, 1).unwrap();
    for bad in [6i64, -1] {
        let idx = indices(&[0, bad, 2], &[3], DType::I64);
        let err = weight.embedding(&idx).unwrap_err().to_string();
        assert!(err.contains("embedding") && err.contains(&format!("index {bad}")) && err.contains("0..6"), "{err}");
        let err = weight.index_select(0, &idx).unwrap_err().to_string();
        assert!(err.contains("index_select") && err.contains(&format!("index {bad}")), "{err}");
        let f = compile(|a: &[Tensor]| Ok(vec![a[0].embedding(&a[1])?.mul_scalar(2.0)?])).fullgraph(true);
        let err = f.call(&[weight.clone(), idx]).unwrap_err().to_string();
        assert!(err.contains("index_select") && err.contains(&format!("index {bad}")) && err.contains("6"), "{err}");
        assert!(err.contains("embedding.rs"), "the error names the op's source location: {err}");
    }
    let err = weight.embedding(&Tensor::randn([3], DType::F32, 0).unwrap()).unwrap_err().to_string();
    assert!(err.contains("i32 or i64") && err.contains("f32"), "{err}");
    let err = weight.index_select(0, &indices(&[0, 1], &[1, 2], DType::I64)).unwrap_err().to_string();
    assert!(err.contains("1-D"), "{err}");
}

/// The gradient of `sum(embedding(w, idx) * g)` by central differences of the f64 loops.
fn numeric_grad(w: &[f64], cols: usize, picked: &[i64], g: &[f64]) -> Vec<f64> {
    let f = |w: &[f64]| rows_of(w, cols, picked).iter().zip(g).map(|(a, b)| a * b).sum::<f64>();
    let h = 1e-3;
    (0..w.len())
        .map(|i| {
            let (mut up, mut down) = (w.to_vec(), w.to_vec());
            up[i] += h;
            down[i] -= h;
            (f(&up) - f(&down)) / (2.0 * h)
        })
        .collect()
}

#[test]
fn embedding_gradient_sums_repeated_indices_and_matches_finite_differences() {
    for (picked, shape) in [(vec![2i64, 0, 2, 2, 4, 0], vec![2, 3]), (vec![1], vec![1]), (vec![], vec![0, 3])] {
        for index in [DType::I32, DType::I64] {
            let what = format!("indices {picked:?} {index}");
            let w = Tensor::randn([5, 3], DType::F32, 4).unwrap();
            let idx = indices(&picked, &shape, index);
            let mut out_shape = shape.clone();
            out_shape.push(3);
            let g = Tensor::randn(out_shape, DType::F32, 5).unwrap();
            let want = numeric_grad(&values(&w), 3, &picked, &values(&g));
            let loss = |b: &[Tensor]| b[0].embedding(&idx)?.mul(&g)?.sum_all();
            let (_, grads) = value_and_grad(loss, std::slice::from_ref(&w)).unwrap();
            close(&values(&grads[0]), &want, 1e-4, &format!("{what}: eager"));
            let compiled = compile(|a: &[Tensor]| {
                let (_, grads) = value_and_grad(|b| b[0].embedding(&a[1])?.mul(&a[2])?.sum_all(), &[a[0].clone()])?;
                Ok(grads)
            })
            .fullgraph(true);
            let out = compiled.call(&[w.clone(), idx.clone(), g.clone()]).unwrap();
            close(&values(&out[0]), &want, 1e-4, &format!("{what}: compiled"));
            // Deterministic: the same bits on a second call.
            assert_eq!(values(&compiled.call(&[w.clone(), idx.clone(), g.clone()]).unwrap()[0]), values(&out[0]));
        }
    }
}

#[test]
fn bf16_embedding_gradient_accumulates_in_f32() {
    // 64 hits on one row of 1/64 each: exactly 1 in f32, far from it summed in bf16 steps.
    let w = Tensor::randn([3, 2], DType::F32, 1).unwrap().cast(DType::BF16).unwrap();
    let idx = indices(&[1; 600], &[600], DType::I64);
    let g = Tensor::full([600, 2], 1.0 / 64.0, DType::BF16, braze::Device::Cpu).unwrap();
    let step = compile(|a: &[Tensor]| {
        let (_, grads) = value_and_grad(|b| b[0].embedding(&a[1])?.mul(&a[2])?.sum_all(), &[a[0].clone()])?;
        Ok(grads)
    });
    let out = step.call(&[w, idx, g]).unwrap();
    assert_eq!(out[0].dtype(), DType::BF16);
    assert_eq!(values(&out[0]), [0.0, 0.0, 9.375, 9.375, 0.0, 0.0]);
}

#[test]
fn a_tied_weight_gets_the_sum_of_the_embedding_and_matmul_gradients() {
    let w = Tensor::randn([6, 4], DType::F32, 9).unwrap();
    let picked = [5i64, 1, 1];
    let idx = indices(&picked, &[3], DType::I64);
    // loss = sum((embedding(w, idx) @ w^T) * r): w is read by the gather and by the matmul.
    let r = Tensor::randn([3, 6], DType::F32, 10).unwrap();
    let loss =
        |b: &[Tensor], idx: &Tensor, r: &Tensor| b[0].embedding(idx)?.matmul(&b[0].transpose(0, 1)?)?.mul(r)?.sum_all();
    let (wv, rv) = (values(&w), values(&r));
    let f = |w: &[f64]| {
        let e = rows_of(w, 4, &picked);
        let mut total = 0.0;
        for i in 0..3 {
            for j in 0..6 {
                let dot: f64 = (0..4).map(|k| e[i * 4 + k] * w[j * 4 + k]).sum();
                total += dot * rv[i * 6 + j];
            }
        }
        total
    };
    let h = 1e-3;
    let want: Vec<f64> = (0..wv.len())
        .map(|i| {
            let (mut up, mut down) = (wv.clone(), wv.clone());
            up[i] += h;
            down[i] -= h;
            (f(&up) - f(&down)) / (2.0 * h)
        })
        .collect();
    let (_, grads) = value_and_grad(|b| loss(b, &idx, &r), std::slice::from_ref(&w)).unwrap();
    close(&values(&grads[0]), &want, 1e-3, "eager");
    let compiled = compile(|a: &[Tensor]| {
        let (_, grads) = value_and_grad(|b| loss(b, &a[1], &a[2]), &[a[0].clone()])?;
        Ok(grads)
    })
    .fullgraph(true);
    close(&values(&compiled.call(&[w, idx, r]).unwrap()[0]), &want, 1e-3, "compiled");
}

#[test]
fn zero_size_embeddings_work() {
    let w = Tensor::randn([4, 3], DType::F32, 1).unwrap();
    let idx = indices(&[], &[0], DType::I64);
    assert_eq!(w.embedding(&idx).unwrap().shape().dims(), [0, 3]);
    let f = compile(|a: &[Tensor]| Ok(vec![a[0].embedding(&a[1])?])).fullgraph(true);
    assert_eq!(f.call(&[w, idx.clone()]).unwrap()[0].shape().dims(), [0, 3]);
    let empty = Tensor::randn([0, 3], DType::F32, 1).unwrap();
    assert_eq!(f.call(&[empty, idx]).unwrap()[0].shape().dims(), [0, 3]);
}
