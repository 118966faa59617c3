//! Strict mode catching a host sync: `item()` inside a function compiled with `fullgraph(true)`
//! is an error naming the op and its `file:line:col`, before anything runs; compiled leniently
//! it splits the function at the break and `explain` lists the break.
//!
//! cargo run --release --example strict_sync

use braze::{compile, DType, Tensor};

fn step(a: &[Tensor]) -> braze::Result<Vec<Tensor>> {
    let loss = a[0].mul(&a[0])?.mean_all()?;
    // Reading the loss on the host: a graph break, and a sync on a GPU.
    let value: f32 = loss.item()?;
    let scale = if value > 1.0 { 0.5 } else { 1.0 };
    Ok(vec![a[0].mul_scalar(scale)?])
}

fn main() -> braze::Result<()> {
    let x = Tensor::randn([8, 8], DType::F32, 0)?;
    match compile(step).fullgraph(true).call(std::slice::from_ref(&x)) {
        Err(e) => println!("strict: {e}"),
        Ok(_) => {
            return Err(braze::Error::InvalidArgument {
                op: "strict_sync".into(),
                loc: None,
                detail: "strict mode let the `item()` sync through".into(),
            })
        }
    }
    let lenient = compile(step);
    print!("lenient:\n{}", lenient.explain(&[x])?);
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_on_the_cpu() {
        super::main().expect("the example runs");
    }
}
