//! Each CLI workload compiled against eager execution, on several random inputs and dtypes.

use braze::workloads::{self, Sizes};
use braze::DType;

/// Builds workload `name` at `sizes` with each seed and checks the compiled outputs against eager
/// ones within the dtype's tolerance; `graphs` is how many graphs one call runs.
fn check(name: &str, sizes: Sizes, seeds: &[u64], graphs: usize) {
    for &seed in seeds {
        let workload = workloads::build(name, &Sizes { seed, ..sizes.clone() }).unwrap();
        let compiled = workload.compile().fullgraph(graphs == 1);
        let explanation = compiled.explain(&workload.inputs).unwrap();
        assert_eq!(explanation.graphs.len(), graphs, "{name}");
        let got = compiled.call(&workload.inputs).unwrap();
        let want = workload.eager().unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            braze_cpu::assert_close(&g.to_host().unwrap(), &w.to_host().unwrap())
                .unwrap_or_else(|e| panic!("{name} seed {seed}: {e}"));
        }
    }
}

fn small() -> Sizes {
    Sizes { rows: 8, hidden: 32, n: 1000, k: 20, lo: 1, hi: 500, layers: 4, ..Sizes::default() }
}

#[test]
fn ln_relu_res() {
    check("ln_relu_res", small(), &[0, 1, 2], 1);
    check("ln_relu_res", Sizes { dtype: DType::BF16, ..small() }, &[3], 1);
}

#[test]
fn ew_chain() {
    check("ew_chain", small(), &[0, 1], 1);
    check("ew_chain", Sizes { dtype: DType::F16, ..small() }, &[2], 1);
}

#[test]
fn multisum() {
    check("multisum", small(), &[0, 1], 1);
}

#[test]
fn tiny_block() {
    check("tiny_block", Sizes { layers: 16, ..small() }, &[0, 1], 1);
}

#[test]
fn mlp_block() {
    check("mlp_block", Sizes { rows: 4, hidden: 16, ..small() }, &[0, 1], 1);
}

#[test]
fn sync_demo() {
    // Split at its item() and to_bool(): three graphs.
    check("sync_demo", small(), &[0, 1], 3);
}

#[test]
fn multisum_sizes_are_seeded_and_in_range() {
    let sizes = workloads::multisum_sizes(500, 100, 10_000, 7);
    assert_eq!(sizes, workloads::multisum_sizes(500, 100, 10_000, 7));
    assert_ne!(sizes, workloads::multisum_sizes(500, 100, 10_000, 8));
    assert!(sizes.iter().all(|&s| (100..=10_000).contains(&s)));
    // Log-uniform: about half below the geometric mean (1000).
    let below = sizes.iter().filter(|&&s| s < 1000).count();
    assert!((200..300).contains(&below), "{below}");
}
