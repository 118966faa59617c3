//! Assignments inside a compiled function written back in place: the plan writes the new value
//! into the captured tensor's own memory (its data pointer does not change), or through a
//! temporary and a copy where writing directly would clobber values still to be read, and the
//! results equal eager execution either way.

use braze::{compile, DType, Result, Tensor};

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// Runs `step` on fresh captured parameters eagerly and compiled (three calls each), and checks
/// the parameters agree after every call, keep their data pointers when compiled, and that
/// `explain` reports `(in place, copied)` write-backs.
fn check(step: fn(&[Tensor], &Tensor) -> Result<()>, shapes: &[&[usize]], expect: (usize, usize)) {
    let make = || -> Vec<Tensor> {
        shapes.iter().enumerate().map(|(i, s)| Tensor::randn(s.to_vec(), DType::F32, 40 + i as u64).unwrap()).collect()
    };
    let (eager, compiled) = (make(), make());
    let x = Tensor::randn([4], DType::F32, 7).unwrap();
    let ptrs: Vec<usize> = compiled.iter().map(Tensor::data_ptr).collect();
    let captured = compiled.clone();
    let f = compile(move |a: &[Tensor]| {
        step(&captured, &a[0])?;
        Ok(vec![])
    })
    .fullgraph(true);
    for call in 0..3 {
        step(&eager, &x).unwrap();
        f.call(std::slice::from_ref(&x)).unwrap();
        for (i, (e, c)) in eager.iter().zip(&compiled).enumerate() {
            let (e, c) = (values(e), values(c));
            for (a, b) in e.iter().zip(&c) {
                assert!((a - b).abs() <= 1e-5 + 1e-5 * a.abs(), "call {call}, param {i}: {e:?} vs {c:?}");
            }
        }
        let now: Vec<usize> = compiled.iter().map(Tensor::data_ptr).collect();
        assert_eq!(now, ptrs, "call {call}: the parameters were updated in place, not swapped");
    }
    let explanation = f.explain(std::slice::from_ref(&x)).unwrap();
    assert_eq!((explanation.write_backs_in_place, explanation.write_backs_copied), expect);
    if expect != (0, 0) {
        assert!(explanation.to_string().contains("write-backs: "), "{explanation}");
    }
}

/// An SGD-like update of two parameters: each read only at the element it writes.
fn sgd(p: &[Tensor], x: &Tensor) -> Result<()> {
    let grad = p[0].mul(x)?.tanh()?;
    p[0].assign(&p[0].sub(&grad.mul_scalar(0.1)?)?)?;
    p[1].assign(&p[1].mul_scalar(0.9)?.add(&grad)?)?;
    Ok(())
}

#[test]
fn an_elementwise_update_is_written_directly_in_place() {
    check(sgd, &[&[4], &[4]], (2, 0));
}

/// `p = p^T`: element (i, j) of the new value reads (j, i) of the old one.
fn transpose(p: &[Tensor], _x: &Tensor) -> Result<()> {
    p[0].assign(&p[0].permute(&[1, 0])?)
}

#[test]
fn a_transpose_goes_through_a_copy() {
    check(transpose, &[&[3, 3]], (0, 1));
}

/// `p = p + sum(p)`: every element of the new value needs every element of the old one.
fn plus_sum(p: &[Tensor], _x: &Tensor) -> Result<()> {
    p[0].assign(&p[0].add(&p[0].sum_all()?)?)
}

#[test]
fn an_update_reading_the_whole_old_value_is_still_right_in_place() {
    let make = || Tensor::randn([2, 3], DType::F32, 5).unwrap();
    let (eager, compiled) = (make(), make());
    plus_sum(std::slice::from_ref(&eager), &eager).unwrap();
    let captured = compiled.clone();
    let f = compile(move |_: &[Tensor]| {
        plus_sum(std::slice::from_ref(&captured), &captured)?;
        Ok(vec![])
    })
    .fullgraph(true);
    let ptr = compiled.data_ptr();
    f.call(&[]).unwrap();
    assert_eq!(compiled.data_ptr(), ptr);
    let (e, c) = (values(&eager), values(&compiled));
    for (a, b) in e.iter().zip(&c) {
        assert!((a - b).abs() <= 1e-5 + 1e-5 * a.abs(), "{e:?} vs {c:?}");
    }
    let explanation = f.explain(&[]).unwrap();
    assert_eq!(explanation.write_backs_in_place + explanation.write_backs_copied, 1, "{explanation}");
}

/// Two parameters swapping values: each copy must read the other's old value.
fn swap(p: &[Tensor], _x: &Tensor) -> Result<()> {
    let (a, b) = (p[0].mul_scalar(1.0)?, p[1].mul_scalar(1.0)?);
    p[0].assign(&b)?;
    p[1].assign(&a)
}

#[test]
fn swapping_two_parameters_keeps_the_old_values_for_both() {
    let make = || vec![Tensor::randn([5], DType::F32, 1).unwrap(), Tensor::randn([5], DType::F32, 2).unwrap()];
    let (before, compiled) = (make(), make());
    let captured = compiled.clone();
    let f = compile(move |a: &[Tensor]| {
        swap(&captured, &a[0])?;
        Ok(vec![])
    });
    f.call(&[Tensor::zeros([1], DType::F32, braze::Device::Cpu).unwrap()]).unwrap();
    assert_eq!(values(&compiled[0]), values(&before[1]));
    assert_eq!(values(&compiled[1]), values(&before[0]));
}

#[test]
fn a_parameter_also_passed_as_an_argument_reads_its_old_value() {
    let p = Tensor::randn([4], DType::F32, 3).unwrap();
    let old = values(&p);
    let captured = p.clone();
    let f = compile(move |a: &[Tensor]| {
        captured.assign(&captured.mul_scalar(2.0)?)?;
        Ok(vec![a[0].add_scalar(1.0)?])
    })
    .fullgraph(true);
    let out = f.call(std::slice::from_ref(&p)).unwrap();
    let want: Vec<f32> = old.iter().map(|v| v + 1.0).collect();
    assert_eq!(values(&out[0]), want);
    assert_eq!(values(&p), old.iter().map(|v| v * 2.0).collect::<Vec<_>>());
}
