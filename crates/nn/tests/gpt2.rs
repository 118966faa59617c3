//! GPT-2 on the CPU backend at tiny sizes: names, initialization, the forward against a plain
//! reimplementation, the tied gradient, compiled against eager, checkpoints and the optimizer.

use braze::{compile, DType, Device, Tensor};
use braze_nn::checkpoint::{load_model, save_model, TensorFile};
use braze_nn::{Error, Gpt2, Gpt2Config, Gpt2Optimizer, Module, OptimizerConfig};
use std::collections::HashMap;

fn tiny() -> Gpt2Config {
    Gpt2Config { block_size: 8, vocab_size: 11, n_layer: 2, n_head: 2, n_embd: 8, bias: true, dtype: DType::F32 }
}

fn tokens(b: usize, t: usize, vocab: usize, seed: u64) -> Tensor {
    let values: Vec<i64> =
        (0..b * t).map(|i| ((i as u64 * 7 + seed * 13 + (i as u64 * i as u64) % 5) % vocab as u64) as i64).collect();
    Tensor::from_vec(values, [b, t]).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn parameters_have_nanogpt_names_shapes_and_order() {
    let model = Gpt2::new(tiny(), Device::Cpu, 0).unwrap();
    let named = model.named_parameters();
    let head: Vec<(String, Vec<usize>)> =
        named.iter().take(8).map(|(n, t)| (n.clone(), t.shape().dims().to_vec())).collect();
    let expected = [
        ("transformer.wte.weight", vec![11, 8]),
        ("transformer.wpe.weight", vec![8, 8]),
        ("transformer.h.0.ln_1.weight", vec![8]),
        ("transformer.h.0.ln_1.bias", vec![8]),
        ("transformer.h.0.attn.c_attn.weight", vec![24, 8]),
        ("transformer.h.0.attn.c_attn.bias", vec![24]),
        ("transformer.h.0.attn.c_proj.weight", vec![8, 8]),
        ("transformer.h.0.attn.c_proj.bias", vec![8]),
    ];
    for ((name, shape), (en, es)) in head.iter().zip(expected) {
        assert_eq!((name.as_str(), shape), (en, &es));
    }
    let names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"transformer.h.1.mlp.c_fc.weight"));
    assert_eq!(names.last(), Some(&"transformer.ln_f.bias"));
    assert!(!names.contains(&"lm_head.weight"), "the tied head is the token embedding");
    // 2 + 2 layers x 12 + 2 names; nanoGPT's count at this size.
    assert_eq!(named.len(), 2 + 2 * 12 + 2);
    let c = 8;
    let per_layer = 2 * c + (3 * c * c + 3 * c) + (c * c + c) + 2 * c + (4 * c * c + 4 * c) + (4 * c * c + c);
    assert_eq!(model.num_parameters(), 11 * c + 8 * c + 2 * per_layer + 2 * c);
}

#[test]
fn gpt2_124m_has_nanogpts_parameter_count() {
    // Counted without allocating: nanoGPT reports 124.47M parameters with the vocab at 50,304
    // (123.69M without positions).
    let c = 768;
    let per_layer = 2 * c + (3 * c * c + 3 * c) + (c * c + c) + 2 * c + (4 * c * c + 4 * c) + (4 * c * c + c);
    let total = 50304 * c + 1024 * c + 12 * per_layer + 2 * c;
    assert_eq!(total, 124_475_904);
    assert_eq!(Gpt2Config::gpt2().vocab_size, 50304);
}

fn std_of(t: &Tensor) -> f64 {
    let v = values(t);
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
    (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
}

#[test]
fn initialization_is_nanogpts() {
    let config = Gpt2Config { n_layer: 4, n_embd: 64, n_head: 4, vocab_size: 97, block_size: 16, ..tiny() };
    let model = Gpt2::new(config, Device::Cpu, 3).unwrap();
    for (name, p) in model.named_parameters() {
        let s = std_of(&p);
        if name.ends_with(".bias") {
            assert!(values(&p).iter().all(|&x| x == 0.0), "{name} is zero");
        } else if name.contains("ln_") {
            assert!(values(&p).iter().all(|&x| x == 1.0), "{name} is one");
        } else if name.ends_with("c_proj.weight") {
            let want = 0.02 / (8f64).sqrt();
            assert!((s - want).abs() < 0.15 * want, "{name}: std {s}, want {want}");
        } else {
            assert!((s - 0.02).abs() < 0.003, "{name}: std {s}, want 0.02");
        }
        assert!(p.requires_grad(), "{name} requires grad");
    }
    // The same seed gives the same weights; another seed others.
    let again = Gpt2::new(model.config.clone(), Device::Cpu, 3).unwrap();
    let other = Gpt2::new(model.config.clone(), Device::Cpu, 4).unwrap();
    assert_eq!(values(&model.wte.weight), values(&again.wte.weight));
    assert_ne!(values(&model.wte.weight), values(&other.wte.weight));
    assert_ne!(values(&model.wte.weight), values(&model.wpe.weight)[..]);
}

/// The forward in plain f64 loops over the host values of the parameters.
fn reference_logits(model: &Gpt2, idx: &[i64], b: usize, t: usize) -> Vec<f64> {
    let p: HashMap<String, (Vec<f64>, Vec<usize>)> = model
        .named_parameters()
        .into_iter()
        .map(|(n, t)| (n, (values(&t).iter().map(|&x| x as f64).collect(), t.shape().dims().to_vec())))
        .collect();
    let c = model.config.n_embd;
    let get = |n: &str| &p[n].0;
    let linear = |x: &[f64], rows: usize, name: &str| -> Vec<f64> {
        let (w, shape) = &p[&format!("{name}.weight")];
        let (out, inp) = (shape[0], shape[1]);
        let bias = &p[&format!("{name}.bias")].0;
        let mut y = vec![0.0; rows * out];
        for r in 0..rows {
            for o in 0..out {
                y[r * out + o] = bias[o] + (0..inp).map(|i| x[r * inp + i] * w[o * inp + i]).sum::<f64>();
            }
        }
        y
    };
    let norm = |x: &[f64], name: &str| -> Vec<f64> {
        let (w, bias) = (get(&format!("{name}.weight")), get(&format!("{name}.bias")));
        x.chunks(c)
            .flat_map(|row| {
                let mean = row.iter().sum::<f64>() / c as f64;
                let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / c as f64;
                row.iter()
                    .enumerate()
                    .map(move |(i, v)| (v - mean) / (var + 1e-5).sqrt() * w[i] + bias[i])
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let rows = b * t;
    let (wte, wpe) = (get("transformer.wte.weight"), get("transformer.wpe.weight"));
    let mut x: Vec<f64> = (0..rows)
        .flat_map(|r| (0..c).map(move |j| (r, j)))
        .map(|(r, j)| wte[idx[r] as usize * c + j] + wpe[(r % t) * c + j])
        .collect();
    let (h, d) = (model.config.n_head, c / model.config.n_head);
    for l in 0..model.config.n_layer {
        let pre = format!("transformer.h.{l}");
        let qkv = linear(&norm(&x, &format!("{pre}.ln_1")), rows, &format!("{pre}.attn.c_attn"));
        let mut y = vec![0.0; rows * c];
        for bi in 0..b {
            for hi in 0..h {
                for i in 0..t {
                    let q = |j: usize, k: usize| qkv[(bi * t + j) * 3 * c + k * c + hi * d..][..d].to_vec();
                    let qi = q(i, 0);
                    let scores: Vec<f64> = (0..=i)
                        .map(|j| qi.iter().zip(q(j, 1)).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt())
                        .collect();
                    let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (j, ej) in e.iter().enumerate() {
                        for (k, vk) in q(j, 2).iter().enumerate() {
                            y[(bi * t + i) * c + hi * d + k] += ej / z * vk;
                        }
                    }
                }
            }
        }
        let a = linear(&y, rows, &format!("{pre}.attn.c_proj"));
        x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
        let gelu = |v: f64| 0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh());
        let hdn: Vec<f64> =
            linear(&norm(&x, &format!("{pre}.ln_2")), rows, &format!("{pre}.mlp.c_fc")).into_iter().map(gelu).collect();
        let m = linear(&hdn, rows, &format!("{pre}.mlp.c_proj"));
        x.iter_mut().zip(&m).for_each(|(x, m)| *x += m);
    }
    let x = norm(&x, "transformer.ln_f");
    let v = model.config.vocab_size;
    (0..rows)
        .flat_map(|r| (0..v).map(move |o| (r, o)))
        .map(|(r, o)| (0..c).map(|j| x[r * c + j] * wte[o * c + j]).sum())
        .collect()
}

fn assert_close(actual: &[f32], expected: &[f64], tol: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(((*a as f64) - e).abs() <= tol * (1.0 + e.abs()), "{what}[{i}]: {a} vs {e}");
    }
}

/// Weights large enough that every layer changes the logits (nanoGPT's 0.02 leaves them tiny).
fn scaled_model(seed: u64) -> Gpt2 {
    let model = Gpt2::new(tiny(), Device::Cpu, seed).unwrap();
    for (k, (name, p)) in model.named_parameters().into_iter().enumerate() {
        let noise = Tensor::randn(p.shape(), DType::F32, 100 + k as u64).unwrap().mul_scalar(0.3).unwrap();
        let base = if name.contains("ln_") && name.ends_with("weight") {
            p.clone()
        } else {
            Tensor::zeros(p.shape(), DType::F32, Device::Cpu).unwrap()
        };
        p.assign(&base.add(&noise).unwrap()).unwrap();
    }
    model
}

#[test]
fn forward_matches_a_plain_reimplementation_eager_and_compiled() {
    let model = scaled_model(1);
    let (b, t) = (2, 5);
    let idx = tokens(b, t, 11, 1);
    let expected = reference_logits(&model, &idx.to_vec::<i64>().unwrap(), b, t);
    let eager = model.forward(&idx).unwrap();
    assert_eq!(eager.shape().dims(), &[b, t, 11]);
    assert_close(&values(&eager), &expected, 1e-4, "eager logits");
    let compiled = compile(|a: &[Tensor]| Ok(vec![model.forward(&a[0]).map_err(nn_error)?])).fullgraph(true);
    let out = compiled.call(std::slice::from_ref(&idx)).unwrap();
    assert_close(&values(&out[0]), &expected, 1e-4, "compiled logits");
    // A fresh input through the cached graph.
    let idx2 = tokens(b, t, 11, 9);
    let expected2 = reference_logits(&model, &idx2.to_vec::<i64>().unwrap(), b, t);
    assert_close(&values(&compiled.call(&[idx2]).unwrap()[0]), &expected2, 1e-4, "compiled logits, new tokens");
}

fn nn_error(e: Error) -> braze::Error {
    match e {
        Error::Tensor(e) => e,
        other => braze::Error::InvalidArgument { op: "nn".into(), loc: None, detail: other.to_string() },
    }
}

#[test]
fn the_tied_weight_gets_both_gradients_and_matches_finite_differences() {
    let model = scaled_model(2);
    let (b, t) = (2, 4);
    let idx = tokens(b, t, 11, 2);
    let targets = tokens(b, t, 11, 5);
    let loss_of = |m: &Gpt2| m.loss(&idx, &targets).unwrap().0;
    let loss = loss_of(&model);
    loss.backward().unwrap();
    let grad = values(&model.wte.weight.grad().unwrap());
    // Central differences of the loss in f32 at a few entries, rows used by both the lookup and
    // the head, and rows only the head uses.
    let used: Vec<i64> = idx.to_vec::<i64>().unwrap();
    let unused_row = (0..11).find(|r| !used.contains(&(*r as i64))).expect("a row no token uses");
    let c = 8;
    let base = values(&model.wte.weight);
    for &i in &[used[0] as usize * c, used[0] as usize * c + 3, used[3] as usize * c + 5, unused_row * c + 1] {
        let h = 1e-2;
        let at = |delta: f32| -> f64 {
            let mut v = base.clone();
            v[i] += delta;
            model.wte.weight.assign(&Tensor::from_vec(v, [11, c]).unwrap()).unwrap();
            braze::no_grad(|| loss_of(&model).item::<f32>().unwrap() as f64)
        };
        let fd = (at(h) - at(-h)) / (2.0 * h as f64);
        assert!(
            (grad[i] as f64 - fd).abs() < 2e-3 + 2e-2 * fd.abs(),
            "wte[{i}]: grad {} vs finite difference {fd}",
            grad[i]
        );
    }
}

#[test]
fn checkpoints_round_trip_and_name_what_is_wrong() {
    let dir = std::env::temp_dir().join(format!("braze-nn-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    let model = Gpt2::new(tiny(), Device::Cpu, 7).unwrap();
    let meta = HashMap::from([("step".to_string(), "3".to_string())]);
    save_model(&path, &model, &meta).unwrap();
    let other = Gpt2::new(tiny(), Device::Cpu, 8).unwrap();
    let file = TensorFile::read(&path).unwrap();
    assert_eq!(file.metadata.get("step").map(String::as_str), Some("3"));
    load_model(&file, &other).unwrap();
    for ((n, a), (_, b)) in model.named_parameters().iter().zip(other.named_parameters()) {
        assert_eq!(values(a), values(&b), "{n}");
    }
    // A bf16 model loads the f32 file, rounded.
    let half = Gpt2::new(Gpt2Config { dtype: DType::BF16, ..tiny() }, Device::Cpu, 9).unwrap();
    load_model(&file, &half).unwrap();
    assert_eq!(half.wte.weight.dtype(), DType::BF16);
    let rounded = values(&half.wte.weight.cast(DType::F32).unwrap());
    assert_close(&rounded, &values(&model.wte.weight).iter().map(|&x| x as f64).collect::<Vec<_>>(), 8e-3, "bf16 wte");

    // A missing tensor, a mis-shaped one and a stranger are errors naming them.
    let mut named = model.named_parameters();
    named.retain(|(n, _)| n != "transformer.h.1.mlp.c_fc.bias");
    braze_nn::checkpoint::save(&path, &named, &HashMap::new()).unwrap();
    let err = load_model(&TensorFile::read(&path).unwrap(), &other).unwrap_err().to_string();
    assert!(err.contains("transformer.h.1.mlp.c_fc.bias") && err.contains("f32[32]"), "{err}");
    let mut named = model.named_parameters();
    named[1].1 = Tensor::zeros([4, 8], DType::F32, Device::Cpu).unwrap();
    braze_nn::checkpoint::save(&path, &named, &HashMap::new()).unwrap();
    let err = load_model(&TensorFile::read(&path).unwrap(), &other).unwrap_err().to_string();
    assert!(err.contains("transformer.wpe.weight") && err.contains("f32[8,8]") && err.contains("f32[4,8]"), "{err}");
    let mut named = model.named_parameters();
    named.push(("transformer.h.9.ln_1.weight".into(), Tensor::zeros([8], DType::F32, Device::Cpu).unwrap()));
    // PyTorch's state dict also has the tied head: accepted.
    named.push(("lm_head.weight".into(), model.wte.weight.clone()));
    braze_nn::checkpoint::save(&path, &named, &HashMap::new()).unwrap();
    let err = load_model(&TensorFile::read(&path).unwrap(), &other).unwrap_err().to_string();
    assert!(err.contains("transformer.h.9.ln_1.weight"), "{err}");
    let err = TensorFile::read(&dir.join("absent.safetensors")).err().unwrap().to_string();
    assert!(err.contains("absent.safetensors"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn optimizer_decays_matrices_only_and_a_compiled_step_learns() {
    let model = Gpt2::new(tiny(), Device::Cpu, 11).unwrap();
    let config = OptimizerConfig { lr: 1e-2, weight_decay: 0.5, ..OptimizerConfig::default() };
    let opt = Gpt2Optimizer::new(&model, &config).unwrap();
    // Zero gradients: AdamW's update is the decay alone, on matrices only.
    for p in model.parameters() {
        p.set_grad(Some(&Tensor::zeros(p.shape(), DType::F32, Device::Cpu).unwrap())).unwrap();
    }
    let before: Vec<Vec<f32>> = model.parameters().iter().map(values).collect();
    opt.step().unwrap();
    for ((name, p), old) in model.named_parameters().iter().zip(&before) {
        let new = values(p);
        let factor = if p.rank() >= 2 { 1.0 - 1e-2 * 0.5 } else { 1.0 };
        for (n, o) in new.iter().zip(old) {
            assert!((n - o * factor as f32).abs() <= 1e-6 * (1.0 + o.abs()), "{name}: {n} vs {o} x {factor}");
        }
    }

    // The whole step compiled in one graph: loss, backward, clip, AdamW.
    let model = Gpt2::new(tiny(), Device::Cpu, 12).unwrap();
    let opt = Gpt2Optimizer::new(&model, &OptimizerConfig { lr: 1e-2, ..OptimizerConfig::default() }).unwrap();
    let step = compile(|a: &[Tensor]| {
        opt.zero_grad();
        let (loss, _) = model.loss(&a[0], &a[1]).map_err(nn_error)?;
        loss.backward()?;
        let norm = opt.step().map_err(nn_error)?.expect("gradients");
        Ok(vec![loss, norm])
    })
    .fullgraph(true);
    let idx = tokens(4, 8, 11, 3);
    let targets = tokens(4, 8, 11, 4);
    let first = step.call(&[idx.clone(), targets.clone()]).unwrap();
    let first_loss = first[0].item::<f32>().unwrap();
    assert!((first_loss - (11f32).ln()).abs() < 0.1, "initial loss {first_loss} near ln(11)");
    let mut last = first_loss;
    for _ in 0..30 {
        last = step.call(&[idx.clone(), targets.clone()]).unwrap()[0].item::<f32>().unwrap();
    }
    assert!(last < 0.5 * first_loss, "memorizing one batch: {first_loss} -> {last}");
    assert_eq!(step.stats().traces, 1, "one trace for every step");
}
