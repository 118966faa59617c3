//! The functional form, as JAX has it: the gradient of a function with respect to its
//! arguments, without marking anything or touching `.grad`.

use crate::{trace, Error, Result, Tensor};

/// `f`'s value at `args` and its gradient with respect to each argument (`jax.value_and_grad`).
/// `f` returns a one-element float tensor. Arguments the value does not depend on get zeros.
/// Eagerly it runs `f` on fresh leaves holding the arguments' data; inside a compiled function
/// the backward ops join the same graph.
#[track_caller]
pub fn value_and_grad<F>(f: F, args: &[Tensor]) -> Result<(Tensor, Vec<Tensor>)>
where
    F: FnOnce(&[Tensor]) -> Result<Tensor>,
{
    value_and_grad_as("value_and_grad", f, args, crate::tensor::caller())
}

/// The gradient of `f` at `args` with respect to each argument (`jax.grad`): [`value_and_grad`]
/// without the value.
#[track_caller]
pub fn grad<F>(f: F, args: &[Tensor]) -> Result<Vec<Tensor>>
where
    F: FnOnce(&[Tensor]) -> Result<Tensor>,
{
    value_and_grad_as("grad", f, args, crate::tensor::caller()).map(|(_, grads)| grads)
}

/// [`value_and_grad`], its errors naming `op` and the caller's `loc`.
fn value_and_grad_as<F>(op: &str, f: F, args: &[Tensor], loc: crate::SourceLoc) -> Result<(Tensor, Vec<Tensor>)>
where
    F: FnOnce(&[Tensor]) -> Result<Tensor>,
{
    if let Some(arg) = args.iter().find(|a| !a.dtype().is_float()) {
        return Err(Error::invalid(
            op,
            &loc,
            format!("only float arguments have gradients, got {}{}", arg.dtype(), arg.shape()),
        ));
    }
    if trace::is_active() {
        let value = f(args)?;
        let grads = trace::gradients(&value, args, &loc).unwrap_or_else(|| Ok(vec![None; args.len()]))?;
        return Ok((value, fill_zeros(grads, args)?));
    }
    let leaves = args.iter().map(|a| a.detach()).collect::<Result<Vec<_>>>()?;
    for leaf in &leaves {
        leaf.set_requires_grad(true)?;
    }
    let value = f(&leaves)?;
    if value.needs_grad() {
        super::tape::backward(&value, None, loc)?;
    }
    let grads = leaves.iter().map(Tensor::grad).collect();
    Ok((value.detach()?, fill_zeros(grads, args)?))
}

fn fill_zeros(grads: Vec<Option<Tensor>>, args: &[Tensor]) -> Result<Vec<Tensor>> {
    grads
        .into_iter()
        .zip(args)
        .map(|(g, a)| match g {
            Some(g) => Ok(g),
            None => Tensor::zeros(a.shape(), a.dtype(), a.device()),
        })
        .collect()
}
