//! Snapshot the kernels braze makes of your own function: `Compiled::kernel_snapshot` hands out
//! the fused plan of every graph and the CUDA C of every generated kernel as one deterministic
//! text, so a test of yours can pin it with [insta](https://insta.rs) and a braze upgrade that
//! changes a kernel shows up as a diff to review. Runs on the CPU: the kernels are generated for
//! the GPU the codegen assumes there (an H200) without one being present.
//!
//! cargo run --release --example kernel_snapshots
//!
//! In your own crate (`insta` as a dev-dependency), a test like this one:
//!
//! ```ignore
//! #[test]
//! fn norm_mlp_kernels() -> braze::Result<()> {
//!     let block = braze::compile(norm_mlp).fullgraph(true).name("norm_mlp");
//!     // On Device::Cpu, so the text is the same on every machine (CI has no GPU).
//!     let args = norm_mlp_args(16, 64)?;
//!     insta::assert_snapshot!("norm_mlp_kernels", block.kernel_snapshot(&args)?);
//!     Ok(())
//! }
//! ```
//!
//! The first `cargo test` (or `cargo insta test`) writes `tests/snapshots/*.snap.new`;
//! `cargo insta review` shows each one to accept (commit the `.snap`) or reject. After a braze
//! upgrade or a change to the function, a kernel that differs fails the test with a diff, and
//! `cargo insta review` again shows the old and new plan and CUDA C side by side. The kernels'
//! opening comments name the `file:line:col` of the ops they hold, so moving the function in its
//! file changes the snapshot too.

use braze::{compile, DType, Device, Tensor};

/// The function to compile: an RMS norm, a linear layer with GELU and a residual add.
fn norm_mlp(a: &[Tensor]) -> braze::Result<Vec<Tensor>> {
    let (x, norm_weight, w, b) = (&a[0], &a[1], &a[2], &a[3]);
    let h = x.rms_norm(norm_weight, 1e-6)?;
    let y = h.matmul(w)?.add(b)?.gelu()?;
    Ok(vec![y.add(x)?])
}

/// Its arguments, on the CPU.
fn norm_mlp_args(rows: usize, dim: usize) -> braze::Result<Vec<Tensor>> {
    Ok(vec![
        Tensor::randn([rows, dim], DType::F32, 0)?,
        Tensor::ones([dim], DType::F32, Device::Cpu)?,
        Tensor::randn_std([dim, dim], DType::F32, 0.02, 1)?,
        Tensor::zeros([dim], DType::F32, Device::Cpu)?,
    ])
}

/// Splits a snapshot into its parts: `("plan of graph N", text)` and `("kernel K: ...", CUDA C)`.
fn sections(snapshot: &str) -> Vec<(String, String)> {
    let mut parts: Vec<(String, String)> = Vec::new();
    for line in snapshot.lines() {
        let heading = line
            .strip_prefix("==== ")
            .and_then(|l| l.strip_suffix(" ===="))
            .map(|g| format!("plan of {g}"))
            .or_else(|| line.strip_prefix("---- ").and_then(|l| l.strip_suffix(" ----")).map(str::to_string));
        match (heading, parts.last_mut()) {
            (Some(heading), _) => parts.push((heading, String::new())),
            (None, Some((_, body))) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    parts
}

fn main() -> braze::Result<()> {
    let block = compile(norm_mlp).fullgraph(true).name("norm_mlp");
    let args = norm_mlp_args(16, 64)?;
    let out = block.call(&args)?;
    println!("norm_mlp: output {}{} on {}", out[0].dtype(), out[0].shape(), out[0].device());

    let snapshot = block.kernel_snapshot(&args)?;
    // The text a snapshot test pins: the same on every call for one braze version.
    assert_eq!(block.kernel_snapshot(&args)?, snapshot, "two snapshots of one function differ");
    let parts = sections(&snapshot);
    let kernels = parts.iter().filter(|(heading, _)| heading.starts_with("kernel ")).count();
    println!("kernel_snapshot: {} lines, {kernels} kernels; its parts:\n", snapshot.lines().count());
    for (heading, body) in &parts {
        println!("======== {heading} ========\n{}\n", body.trim());
    }
    println!("in a test: insta::assert_snapshot!(\"norm_mlp_kernels\", block.kernel_snapshot(&args)?);");
    println!("then:      cargo insta review");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_on_the_cpu() {
        super::main().expect("the example runs");
    }
}
