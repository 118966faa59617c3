//! Gathers inside pointwise bodies (an index_select's row read): the index checked against its
//! bound, clamped, and the plan's check raised for the executor to report.

use braze_plan::{Body, Expr, Kernel, KernelKind};

/// The device helper every kernel with a gather declares: an index outside `0..bound` raises
/// check word pair `check` (`[raised, first index]`: the first thread to raise it writes its
/// index) and reads the nearest row instead, so no read leaves the table.
pub(crate) const CHECKED_INDEX: &str = r#"// An index outside 0..bound raises the check (the first raiser keeps its index) and is clamped.
__device__ __forceinline__ long long braze_checked_index(long long i, long long bound, unsigned long long* check) {
    if (i < 0 || i >= bound) {
        if (atomicCAS(check, 0ull, 1ull) == 0ull) {
            check[1] = (unsigned long long)i;
        }
        return i < 0 ? 0 : bound - 1;
    }
    return i;
}
"#;

/// Whether a body reads through a gather.
pub(crate) fn body_gathers(body: &Body) -> bool {
    body.values.iter().any(|v| matches!(v.expr, Expr::Gather { .. }))
}

/// Whether a kernel has gathers, so takes the plan's check words as a parameter.
pub(crate) fn kernel_gathers(kernel: &Kernel) -> bool {
    match &kernel.kind {
        KernelKind::Pointwise(pw) => body_gathers(&pw.body),
        KernelKind::MultiPointwise(multi) => multi.members.iter().any(|m| body_gathers(&m.body)),
        _ => false,
    }
}
