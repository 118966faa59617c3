//! Compile a function and read what braze made of it: graphs, breaks, kernels, launches.
//!
//! cargo run --release --example compile_explain

use braze::{compile, DType, Device, Tensor};

fn main() -> braze::Result<()> {
    run(Device::best_available())
}

fn run(dev: Device) -> braze::Result<()> {
    let block = compile(|a: &[Tensor]| {
        // layer_norm, relu and the residual add fuse into one row kernel.
        let y = a[0].layer_norm(&a[1], &a[2], 1e-5)?.relu()?.add(&a[0])?;
        Ok(vec![y])
    })
    .name("ln_relu_res")
    .fullgraph(true);
    let x = Tensor::randn([64, 256], DType::F32, 0)?.to_device(dev)?;
    let w = Tensor::ones([256], DType::F32, dev)?;
    let b = Tensor::zeros([256], DType::F32, dev)?;
    let out = block.call(&[x.clone(), w.clone(), b.clone()])?;
    println!("output {}{} on {dev}", out[0].dtype(), out[0].shape());
    print!("{}", block.explain(&[x, w, b])?);
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_on_the_cpu() {
        super::run(braze::Device::Cpu).expect("the example runs");
    }
}
