//! The loading, mapping and comparison on the CPU, with no PyTorch: the files `torch_train.py`
//! writes are made here from braze's own eager run, in the same layout. Eager bf16 rounds every
//! op as PyTorch eager does and the compiled step keeps intermediates in f32, so the compiled step
//! against these files is a real bf16-against-bf16 comparison.

use super::files::{write, TensorFile};
use super::*;
use braze::optim::Optimizer;
use std::collections::HashMap;

const STEPS: usize = 3;

fn sizes(dtype: DType) -> Sizes {
    Sizes { rows: 16, hidden: 32, dtype, seed: 3, ..Sizes::default() }
}

fn host(t: &Tensor) -> HostTensor {
    t.to_host().unwrap()
}

/// Writes `torch_train.py --write`'s files for `STEPS` steps of braze's eager bf16 `mlp_step`,
/// with the f32 reference computed by an f32 copy set to the bf16 parameters before each step.
fn write_fixture(dir: &Path) {
    let bf16 = mlp_training_step(&sizes(DType::BF16), Device::Cpu).unwrap();
    let wide = mlp_training_step(&sizes(DType::F32), Device::Cpu).unwrap();
    let s = sizes(DType::BF16);
    let metadata: HashMap<String, String> = [
        ("workload", "mlp_step".to_string()),
        ("rows", s.rows.to_string()),
        ("hidden", s.hidden.to_string()),
        ("layers", MLP_STEP_LAYERS.to_string()),
        ("dtype", "bf16".to_string()),
        ("lr", "0.001".to_string()),
        ("steps", STEPS.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let weights: Vec<(String, HostTensor)> = bf16.params.iter().map(|(n, p)| (n.clone(), host(p))).collect();
    write(&dir.join(WEIGHTS_FILE), &weights, metadata).unwrap();
    for k in 0..STEPS {
        for ((_, w), (_, p)) in wide.params.iter().zip(&bf16.params) {
            w.assign(&p.cast(DType::F32).unwrap()).unwrap();
        }
        let before: Vec<HostTensor> = bf16.params.iter().map(|(_, p)| host(p)).collect();
        let x = Tensor::randn([s.rows, s.hidden], DType::BF16, 100 + k as u64).unwrap();
        let target = Tensor::randn([s.rows, s.hidden], DType::BF16, 200 + k as u64).unwrap();
        let f32_inputs = [x.cast(DType::F32).unwrap(), target.cast(DType::F32).unwrap()];
        let f32_loss = (wide.workload.function)(&f32_inputs).unwrap().remove(0);
        let loss = (bf16.workload.function)(&[x.clone(), target.clone()]).unwrap().remove(0);
        // PyTorch's `(e * e).mean()` of bf16 is a bf16 scalar: braze's loss must be one too.
        assert_eq!((loss.dtype(), loss.shape().rank()), (DType::BF16, 0));
        let mut tensors = vec![("x".into(), host(&x)), ("target".into(), host(&target)), ("loss".into(), host(&loss))];
        tensors.push(("f32.loss".into(), host(&f32_loss)));
        for (((name, p), (_, w)), before) in bf16.params.iter().zip(&wide.params).zip(&before) {
            tensors.push((format!("param.{name}"), before.clone()));
            tensors.push((format!("grad.{name}"), host(&p.grad().unwrap())));
            tensors.push((format!("f32.grad.{name}"), host(&w.grad().unwrap())));
            tensors.push((format!("updated.{name}"), host(p)));
        }
        write(&dir.join(step_file(k)), &tensors, HashMap::new()).unwrap();
    }
}

fn fixture() -> tempdir::Dir {
    let dir = tempdir::Dir::new("torch-check");
    write_fixture(dir.path());
    dir
}

/// Rewrites tensor `name` of `file` in `dir` through `f`.
fn edit(dir: &Path, file: &str, name: &str, f: impl Fn(usize, f64) -> f64) {
    let path = dir.join(file);
    let read = TensorFile::read(&path).unwrap();
    let mut tensors: Vec<(String, HostTensor)> = read.tensors.into_iter().collect();
    let (_, t) = tensors.iter_mut().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no {name}"));
    let values: Vec<f64> = t.to_f64_vec().iter().enumerate().map(|(i, &v)| f(i, v)).collect();
    *t = HostTensor::from_f64(t.dtype(), t.shape().clone(), &values).unwrap();
    write(&path, &tensors, read.metadata).unwrap();
}

fn failed(report: &CheckReport) -> Vec<String> {
    report.checks.iter().filter(|c| c.verdict == Verdict::Fail).map(|c| format!("{} {}", c.step, c.name)).collect()
}

mod tempdir {
    /// A fresh directory under the system's temporary one, removed on drop.
    pub struct Dir(std::path::PathBuf);

    impl Dir {
        pub fn new(prefix: &str) -> Dir {
            use std::sync::atomic::{AtomicUsize, Ordering};
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("braze-{prefix}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).unwrap();
            Dir(path)
        }

        pub fn path(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[test]
fn the_weights_load_into_the_parameters_of_their_names() {
    let dir = fixture();
    let run = TorchRun::open(dir.path()).unwrap();
    assert_eq!((run.sizes.rows, run.sizes.hidden, run.sizes.dtype, run.steps), (16, 32, DType::BF16, STEPS));
    assert_eq!(run.shape(), "16x32 h128 L4");
    // Another seed: every parameter differs from the file's until loaded.
    let step = mlp_training_step(&Sizes { seed: 99, ..run.sizes.clone() }, Device::Cpu).unwrap();
    assert_ne!(host(&step.params[0].1).to_bytes(), run.weights["layers.0.w1"].to_bytes());
    load_params(&step, &run.weights).unwrap();
    for (name, p) in &step.params {
        assert_eq!(host(p).to_bytes(), run.weights[name].to_bytes(), "{name}");
        assert!(p.requires_grad(), "{name} still trains");
    }
}

#[test]
fn the_compiled_step_matches_the_saved_run() {
    let dir = fixture();
    let run = TorchRun::open(dir.path()).unwrap();
    let report = check_steps(&run, Device::Cpu, Mode::Default).unwrap();
    assert_eq!(report.checks.len(), STEPS * (1 + 2 * 6 * MLP_STEP_LAYERS));
    assert!(report.failures().is_empty(), "{:?}\n{}", report.failures(), report.summary());
    assert_eq!(report.recompiles, 0);
    report.print();
    // Not vacuous: compiled and eager bf16 round differently, and every tensor was compared
    // against the f32 reference too.
    assert!(report.checks.iter().any(|c| c.max_abs_error > 0.0));
    assert!(report.checks.iter().all(|c| (c.f32.is_some() || c.name.starts_with("updated.")) && c.numel > 0));
    let json = report.to_json();
    assert_eq!(json["tensors"].as_array().unwrap().len(), report.checks.len());
    assert!(report.summary().starts_with("3 steps: loss 3/3 pass"), "{}", report.summary());
}

#[test]
fn a_wrong_gradient_fails_by_name() {
    let dir = fixture();
    // PyTorch's gradient (and its f32 reference) 5% larger in one tensor of step 1: braze's then
    // disagrees with both.
    for name in ["grad.layers.2.w2", "f32.grad.layers.2.w2"] {
        edit(dir.path(), &step_file(1), name, |_, v| v * 1.05);
    }
    // One element of another gradient far off.
    for name in ["grad.layers.0.b1", "f32.grad.layers.0.b1"] {
        edit(dir.path(), &step_file(0), name, |i, v| if i == 7 { v + 0.5 } else { v });
    }
    let run = TorchRun::open(dir.path()).unwrap();
    let report = check_steps(&run, Device::Cpu, Mode::Default).unwrap();
    assert_eq!(failed(&report), ["0 grad.layers.0.b1", "1 grad.layers.2.w2"]);
    let failures = report.failures();
    assert!(failures[0].starts_with("step 0 grad.layers.0.b1: "), "{failures:?}");
    assert!(failures[0].contains("index 7"), "{failures:?}");
}

#[test]
fn a_wrong_loss_fails() {
    let dir = fixture();
    for name in ["loss", "f32.loss"] {
        edit(dir.path(), &step_file(2), name, |_, v| v * 1.1);
    }
    let report = check_steps(&TorchRun::open(dir.path()).unwrap(), Device::Cpu, Mode::Default).unwrap();
    assert_eq!(failed(&report), ["2 loss"]);
}

#[test]
fn missing_misshapen_or_extra_weights_are_errors_that_name_them() {
    let step = mlp_training_step(&sizes(DType::BF16), Device::Cpu).unwrap();
    let weights: HashMap<String, HostTensor> = step.params.iter().map(|(n, p)| (n.clone(), host(p))).collect();
    let error = |weights: &HashMap<String, HostTensor>| format!("{:#}", load_params(&step, weights).unwrap_err());
    let mut missing = weights.clone();
    missing.remove("layers.3.g");
    assert!(error(&missing).contains("no weight `layers.3.g`"), "{}", error(&missing));
    let mut transposed = weights.clone();
    let w1 = &weights["layers.1.w1"];
    transposed.insert("layers.1.w1".into(), HostTensor::from_f64(DType::BF16, [128, 32], &w1.to_f64_vec()).unwrap());
    assert!(
        error(&transposed).contains("weight `layers.1.w1` is bf16[128,32], braze's parameter bf16[32,128]"),
        "{}",
        error(&transposed)
    );
    let mut wrong_dtype = weights.clone();
    wrong_dtype.insert("layers.0.b2".into(), HostTensor::full(DType::F32, [32], 0.0));
    assert!(error(&wrong_dtype).contains("`layers.0.b2` is f32[32]"), "{}", error(&wrong_dtype));
    let mut extra = weights.clone();
    extra.insert("layers.4.w1".into(), weights["layers.0.w1"].clone());
    assert!(error(&extra).contains("no braze parameter of their name: layers.4.w1"), "{}", error(&extra));
    load_params(&step, &weights).unwrap();
}

#[test]
fn files_that_do_not_fit_are_errors_not_panics() {
    let dir = fixture();
    let step1 = dir.path().join(step_file(1));
    std::fs::write(&step1, b"not safetensors").unwrap();
    let run = TorchRun::open(dir.path()).unwrap();
    let error = format!("{:#}", check_steps(&run, Device::Cpu, Mode::Default).err().unwrap());
    assert!(error.contains("step-1.safetensors: not a valid safetensors file"), "{error}");
    let weights = dir.path().join(WEIGHTS_FILE);
    let mut meta = TensorFile::read(&weights).unwrap();
    meta.metadata.insert("lr".into(), "0.01".into());
    write(&weights, &meta.tensors.into_iter().collect::<Vec<_>>(), meta.metadata).unwrap();
    let error = format!("{:#}", TorchRun::open(dir.path()).err().unwrap());
    assert!(error.contains("learning rate 0.01, braze's mlp_step trains with 0.001"), "{error}");
    assert!(TorchRun::open(&dir.path().join("absent")).is_err());
}

#[test]
fn the_learning_rate_is_the_optimizers() {
    // Loaded weights train with the optimizer the step captured: a zero learning rate leaves
    // them (but for the decoupled weight decay, itself scaled by the learning rate) unchanged.
    let dir = fixture();
    let run = TorchRun::open(dir.path()).unwrap();
    let step = mlp_training_step(&run.sizes, Device::Cpu).unwrap();
    load_params(&step, &run.weights).unwrap();
    step.optimizer.set_lr(0.0).unwrap();
    (step.workload.function)(&step.workload.inputs).unwrap();
    for (name, p) in &step.params {
        assert_eq!(host(p).to_bytes(), run.weights[name].to_bytes(), "{name}");
    }
}

#[test]
fn a_nan_fails_and_equal_tensors_pass_at_any_scale() {
    let tensor = |values: &[f64]| HostTensor::from_f64(DType::BF16, [values.len()], values).unwrap();
    let tiny = tensor(&[1e-7, -2e-7, 3e-7, 0.0]);
    let check = |got: &HostTensor, wide: Option<&HostTensor>| {
        compare::compare_tensor(0, "g", got, &tiny, wide).unwrap().verdict
    };
    assert_eq!(check(&tiny, None), Verdict::Pass);
    // 1e-7 off is nothing in absolute terms, but half the tensor's scale.
    assert_eq!(check(&tensor(&[1e-7, -2e-7, 3e-7, 1e-7]), None), Verdict::Fail);
    assert_eq!(check(&tensor(&[1e-7, f64::NAN, 3e-7, 0.0]), None), Verdict::Fail);
    let wide = HostTensor::from_f64(DType::F32, [4], &[1e-7, -2e-7, 3e-7, 0.0]).unwrap();
    assert_eq!(check(&tensor(&[1e-7, f64::NAN, 3e-7, 0.0]), Some(&wide)), Verdict::Fail);
    let other_shape = tensor(&[1e-7, -2e-7, 3e-7]);
    assert!(compare::compare_tensor(0, "g", &other_shape, &tiny, None).is_err());
}

#[test]
fn braze_train_check_fails_on_a_mismatch_and_writes_every_tensor() {
    let dir = fixture();
    let json = dir.path().join("check.json");
    crate::train_check(dir.path(), Some(Device::Cpu), Mode::Default, Some(&json)).unwrap();
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(written["tensors"].as_array().unwrap().len(), STEPS * (1 + 2 * 6 * MLP_STEP_LAYERS));
    assert_eq!(written["tensors"][1]["tensor"], "grad.layers.0.w1");
    for name in ["grad.layers.3.g", "f32.grad.layers.3.g"] {
        edit(dir.path(), &step_file(0), name, |_, v| -v);
    }
    let error = format!("{:#}", crate::train_check(dir.path(), Some(Device::Cpu), Mode::Default, None).unwrap_err());
    assert!(error.starts_with("1 mismatch(es) with PyTorch:\n  step 0 grad.layers.3.g: "), "{error}");
}

#[test]
fn each_step_starts_from_pytorchs_parameters_of_that_step() {
    let dir = fixture();
    // Step 1's starting weight moved: braze's step-1 gradients, computed from it, now disagree
    // with PyTorch's saved ones (computed from the weight before the edit). Step 2 starts from
    // PyTorch's parameters again: its loss and gradients agree (its updates do not, the moments
    // holding step 1's gradients).
    edit(dir.path(), &step_file(1), "param.layers.0.w1", |_, v| v * 1.5);
    let report = check_steps(&TorchRun::open(dir.path()).unwrap(), Device::Cpu, Mode::Default).unwrap();
    let failed = failed(&report);
    assert!(failed.contains(&"1 grad.layers.0.w1".to_string()), "{failed:?}");
    assert!(failed.iter().all(|f| f.starts_with("1 ") || f.starts_with("2 updated.")), "{failed:?}");
}

#[test]
fn a_wrong_update_fails_by_name() {
    let dir = fixture();
    // PyTorch's update of one parameter ten times as large in every element, and of another one
    // element moved by ten updates: braze's are then far off.
    edit(dir.path(), &step_file(1), "updated.layers.2.w1", |_, v| v);
    let report = check_steps(&TorchRun::open(dir.path()).unwrap(), Device::Cpu, Mode::Default).unwrap();
    assert!(failed(&report).is_empty(), "an unchanged file passes: {:?}", failed(&report));
    let before = TensorFile::read(&dir.path().join(step_file(1))).unwrap().tensors["param.layers.2.w1"].to_f64_vec();
    edit(dir.path(), &step_file(1), "updated.layers.2.w1", |i, v| v + 9.0 * (v - before[i]));
    let before = TensorFile::read(&dir.path().join(step_file(2))).unwrap().tensors["param.layers.0.b2"].to_f64_vec();
    edit(dir.path(), &step_file(2), "updated.layers.0.b2", |i, v| if i == 5 { v + 9.0 * (v - before[5]) } else { v });
    let report = check_steps(&TorchRun::open(dir.path()).unwrap(), Device::Cpu, Mode::Default).unwrap();
    assert_eq!(failed(&report), ["1 updated.layers.2.w1", "2 updated.layers.0.b2"]);
    assert!(report.failures()[1].contains("first far at index 5"), "{:?}", report.failures());
}
