//! The sweep points of `braze bench --sweep rows|pointwise` (`benches/workloads.md`, "Sweeps"):
//! a pure list of cases, each with its input shapes, dtype and the fewest bytes a call moves, so
//! the sizing is tested without a GPU and `--list` prints it anywhere. `torch_baseline.py
//! --sweep` builds the same list (same shape keys) in Python.

use braze::DType;
use std::fmt;

/// Hidden sizes of the row sweep: common model widths and GPT-2's vocabulary (softmax rows).
pub const HIDDEN_SIZES: [usize; 8] = [768, 1024, 2048, 3072, 4096, 5120, 8192, 50257];
pub const DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];
/// Row-sweep calls are sized to the largest power-of-two row count moving at most this much, so
/// each moves between half of it and all of it (200-400 MB).
pub const ROWS_MAX_MB: f64 = 400.0;
/// The few long rows: 64 rows of 65536.
pub const LONG_ROWS: (usize, usize) = (64, 65536);
/// Elements of each pointwise output: 16M, 64M and 256M.
pub const POINTWISE_ELEMENTS: [usize; 3] = [1 << 24, 1 << 26, 1 << 28];
/// Columns of every pointwise case (rows = elements / columns).
pub const POINTWISE_COLUMNS: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepKind {
    Rows,
    Pointwise,
}

impl SweepKind {
    pub fn parse(s: &str) -> Option<SweepKind> {
        match s {
            "rows" => Some(SweepKind::Rows),
            "pointwise" => Some(SweepKind::Pointwise),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SweepKind::Rows => "rows",
            SweepKind::Pointwise => "pointwise",
        }
    }
}

/// The row workloads: a norm with an activation and a residual epilogue, and a masked softmax.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowOp {
    /// `gelu(layer_norm(x, w, b)) + res`.
    LayerNormGeluRes,
    /// `silu(rms_norm(x, w)) + res`.
    RmsNormSiluRes,
    /// `softmax(x + mask)` over the last dim, `mask: [hidden]` added to every row.
    SoftmaxMask,
}

/// How the second operand of a pointwise chain broadcasts against the `[rows, cols]` output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broadcast {
    /// `x: [rows, cols]` times `b: [cols]` (one row for every row).
    Row,
    /// `x: [rows, cols]` times `b: [rows, 1]` (one value per row).
    Column,
    /// `a: [rows, 1]` times `b: [1, cols]`: the output is the only full-size tensor.
    Outer,
    /// `x: [rows, cols]` times the scalar 0.5.
    Scalar,
}

pub const BROADCASTS: [Broadcast; 4] = [Broadcast::Row, Broadcast::Column, Broadcast::Outer, Broadcast::Scalar];

/// What a case computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepOp {
    Row(RowOp),
    /// `t = x ⊗ b` as the broadcast says, then `gelu(t) * sigmoid(t) + tanh(t) * exp(-0.5 t)`.
    Pointwise(Broadcast),
}

/// One sweep point: the row key (workload, shape, dtype) shared with `torch_baseline.py --sweep`,
/// the input shapes in the workload's argument order, and the least bytes a call moves.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepCase {
    pub workload: &'static str,
    pub op: SweepOp,
    pub rows: usize,
    pub cols: usize,
    pub dtype: DType,
    pub input_shapes: Vec<Vec<usize>>,
    pub bytes: usize,
}

impl SweepCase {
    /// The row key's shape: `ROWSxCOLS`, as `torch_baseline.py` writes it.
    pub fn shape(&self) -> String {
        format!("{}x{}", self.rows, self.cols)
    }

    pub fn output_elements(&self) -> usize {
        self.rows * self.cols
    }
}

impl fmt::Display for SweepCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shapes: Vec<String> = self.input_shapes.iter().map(|s| format!("{s:?}")).collect();
        write!(
            f,
            "{:20} {:12} {:5} {:>9.1} MB  inputs {}",
            self.workload,
            self.shape(),
            self.dtype.to_string(),
            self.bytes as f64 / 1e6,
            shapes.join(" ")
        )
    }
}

fn row_workload(op: RowOp) -> &'static str {
    match op {
        RowOp::LayerNormGeluRes => "ln_gelu_res",
        RowOp::RmsNormSiluRes => "rms_silu_res",
        RowOp::SoftmaxMask => "softmax_mask",
    }
}

fn pointwise_workload(b: Broadcast) -> &'static str {
    match b {
        Broadcast::Row => "pw_row",
        Broadcast::Column => "pw_col",
        Broadcast::Outer => "pw_outer",
        Broadcast::Scalar => "pw_scalar",
    }
}

/// A row case: the inputs and bytes of `op` on `[rows, hidden]`.
fn row_case(op: RowOp, rows: usize, hidden: usize, dtype: DType) -> SweepCase {
    let s = dtype.size_bytes();
    let full = rows * hidden * s;
    let (input_shapes, bytes) = match op {
        // x and res read, the output written; w and b read once.
        RowOp::LayerNormGeluRes => {
            (vec![vec![rows, hidden], vec![hidden], vec![hidden], vec![rows, hidden]], 3 * full + 2 * hidden * s)
        }
        RowOp::RmsNormSiluRes => (vec![vec![rows, hidden], vec![hidden], vec![rows, hidden]], 3 * full + hidden * s),
        RowOp::SoftmaxMask => (vec![vec![rows, hidden], vec![hidden]], 2 * full + hidden * s),
    };
    SweepCase { workload: row_workload(op), op: SweepOp::Row(op), rows, cols: hidden, dtype, input_shapes, bytes }
}

/// Full-size tensors a row case moves per row element: read and written.
fn row_full_tensors(op: RowOp) -> usize {
    match op {
        RowOp::LayerNormGeluRes | RowOp::RmsNormSiluRes => 3,
        RowOp::SoftmaxMask => 2,
    }
}

/// The largest power of two `rows` (at least 1, at most `limit`) whose full-size tensors fit in
/// `max_bytes`.
fn rows_within(bytes_per_row: usize, max_bytes: f64, limit: usize) -> usize {
    let mut rows = 1usize;
    while rows * 2 <= limit && (rows * 2 * bytes_per_row) as f64 <= max_bytes {
        rows *= 2;
    }
    rows
}

fn pointwise_case(b: Broadcast, elements: usize, dtype: DType) -> SweepCase {
    let cols = POINTWISE_COLUMNS.min(elements).max(1);
    let rows = (elements / cols).max(1);
    let s = dtype.size_bytes();
    let full = rows * cols * s;
    let (input_shapes, bytes) = match b {
        Broadcast::Row => (vec![vec![rows, cols], vec![cols]], 2 * full + cols * s),
        Broadcast::Column => (vec![vec![rows, cols], vec![rows, 1]], 2 * full + rows * s),
        Broadcast::Outer => (vec![vec![rows, 1], vec![1, cols]], full + (rows + cols) * s),
        Broadcast::Scalar => (vec![vec![rows, cols]], 2 * full),
    };
    SweepCase { workload: pointwise_workload(b), op: SweepOp::Pointwise(b), rows, cols, dtype, input_shapes, bytes }
}

/// Every case of a sweep, in run order. `max_mb` (default: the sweep's own sizes) caps the bytes
/// of each call: rows shrink (by powers of two; long rows keep their 65536 columns, pointwise
/// cases their 4096), so a smaller GPU or a quick run still covers every hidden size and dtype.
pub fn sweep_cases(kind: SweepKind, max_mb: Option<f64>) -> Vec<SweepCase> {
    let cap = max_mb.map(|mb| mb * 1e6);
    let mut cases = Vec::new();
    match kind {
        SweepKind::Rows => {
            let max_bytes = cap.map_or(ROWS_MAX_MB * 1e6, |c| c.min(ROWS_MAX_MB * 1e6));
            for op in [RowOp::LayerNormGeluRes, RowOp::RmsNormSiluRes, RowOp::SoftmaxMask] {
                for dtype in DTYPES {
                    for hidden in HIDDEN_SIZES {
                        let per_row = row_full_tensors(op) * hidden * dtype.size_bytes();
                        cases.push(row_case(op, rows_within(per_row, max_bytes, usize::MAX), hidden, dtype));
                    }
                    let (rows, hidden) = LONG_ROWS;
                    let per_row = row_full_tensors(op) * hidden * dtype.size_bytes();
                    let rows = cap.map_or(rows, |c| rows_within(per_row, c, rows));
                    cases.push(row_case(op, rows, hidden, dtype));
                }
            }
        }
        SweepKind::Pointwise => {
            for b in BROADCASTS {
                for dtype in DTYPES {
                    for elements in POINTWISE_ELEMENTS {
                        let mut case = pointwise_case(b, elements, dtype);
                        while let Some(c) = cap {
                            if case.bytes as f64 <= c || case.rows == 1 {
                                break;
                            }
                            case = pointwise_case(b, case.output_elements() / 2, dtype);
                        }
                        cases.push(case);
                    }
                }
            }
            // A cap can shrink several sizes to the same one: time it once.
            cases.dedup();
        }
    }
    cases
}

/// The workloads of a sweep, in run order (the names `--only` takes with `--sweep`).
pub fn sweep_workloads(kind: SweepKind) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = sweep_cases(kind, Some(0.001)).iter().map(|c| c.workload).collect();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mb(case: &SweepCase) -> f64 {
        case.bytes as f64 / 1e6
    }

    #[test]
    fn rows_sweep_covers_every_hidden_size_and_dtype_at_100_to_400_mb() {
        let cases = sweep_cases(SweepKind::Rows, None);
        for workload in ["ln_gelu_res", "rms_silu_res", "softmax_mask"] {
            for dtype in DTYPES {
                let mut hiddens: Vec<usize> = cases
                    .iter()
                    .filter(|c| c.workload == workload && c.dtype == dtype && c.cols != LONG_ROWS.1)
                    .map(|c| c.cols)
                    .collect();
                hiddens.sort_unstable();
                assert_eq!(hiddens, HIDDEN_SIZES, "{workload} {dtype}");
            }
        }
        for case in cases.iter().filter(|c| c.cols != LONG_ROWS.1) {
            assert!((100.0..=400.0).contains(&mb(case)), "{case}");
            assert!(case.rows.is_power_of_two(), "{case}");
        }
        assert_eq!(cases.len(), 3 * 3 * (HIDDEN_SIZES.len() + 1));
    }

    #[test]
    fn rows_sweep_sizes_and_bytes_are_the_ones_written_down() {
        let cases = sweep_cases(SweepKind::Rows, None);
        let find = |w: &str, dtype: DType, hidden: usize| {
            cases.iter().find(|c| c.workload == w && c.dtype == dtype && c.cols == hidden).unwrap().clone()
        };
        // 3 f32 tensors of 32768 x 768 plus w and b.
        let ln = find("ln_gelu_res", DType::F32, 768);
        assert_eq!((ln.shape(), ln.bytes), ("32768x768".to_string(), 3 * 32768 * 768 * 4 + 2 * 768 * 4));
        assert_eq!(ln.input_shapes, vec![vec![32768, 768], vec![768], vec![768], vec![32768, 768]]);
        let rms = find("rms_silu_res", DType::BF16, 50257);
        assert_eq!(rms.shape(), "1024x50257");
        assert_eq!(rms.input_shapes, vec![vec![1024, 50257], vec![50257], vec![1024, 50257]]);
        let sm = find("softmax_mask", DType::F16, 4096);
        assert_eq!((sm.shape(), sm.bytes), ("16384x4096".to_string(), 2 * 16384 * 4096 * 2 + 4096 * 2));
        assert_eq!(sm.input_shapes, vec![vec![16384, 4096], vec![4096]]);
    }

    #[test]
    fn long_rows_are_64_rows_of_65536_for_every_workload_and_dtype() {
        let cases = sweep_cases(SweepKind::Rows, None);
        let long: Vec<&SweepCase> = cases.iter().filter(|c| c.cols == 65536).collect();
        assert_eq!(long.len(), 9);
        assert!(long.iter().all(|c| c.rows == 64 && c.shape() == "64x65536"));
        let ln_f32 = long.iter().find(|c| c.workload == "ln_gelu_res" && c.dtype == DType::F32).unwrap();
        assert_eq!(ln_f32.bytes, 3 * 64 * 65536 * 4 + 2 * 65536 * 4);
    }

    #[test]
    fn pointwise_sweep_has_every_broadcast_kind_at_16m_to_256m_elements() {
        let cases = sweep_cases(SweepKind::Pointwise, None);
        assert_eq!(cases.len(), 4 * 3 * 3);
        for b in BROADCASTS {
            for dtype in DTYPES {
                let elements: Vec<usize> = cases
                    .iter()
                    .filter(|c| c.op == SweepOp::Pointwise(b) && c.dtype == dtype)
                    .map(SweepCase::output_elements)
                    .collect();
                assert_eq!(elements, POINTWISE_ELEMENTS, "{b:?} {dtype}");
            }
        }
        let find = |w: &str| cases.iter().find(|c| c.workload == w && c.dtype == DType::F32).unwrap();
        let (row, col, outer, scalar) = (find("pw_row"), find("pw_col"), find("pw_outer"), find("pw_scalar"));
        assert_eq!(row.input_shapes, vec![vec![4096, 4096], vec![4096]]);
        assert_eq!(col.input_shapes, vec![vec![4096, 4096], vec![4096, 1]]);
        assert_eq!(outer.input_shapes, vec![vec![4096, 1], vec![1, 4096]]);
        assert_eq!(scalar.input_shapes, vec![vec![4096, 4096]]);
        // The outer product reads two vectors and writes the only full-size tensor.
        assert_eq!(outer.bytes, (1 << 24) * 4 + 2 * 4096 * 4);
        assert_eq!(scalar.bytes, 2 * (1 << 24) * 4);
    }

    #[test]
    fn max_mb_shrinks_every_case_but_keeps_hidden_sizes_and_long_rows() {
        let rows = sweep_cases(SweepKind::Rows, Some(20.0));
        assert_eq!(rows.len(), 3 * 3 * (HIDDEN_SIZES.len() + 1));
        assert!(rows.iter().all(|c| mb(c) <= 20.0 + 1.0), "{:?}", rows.iter().map(mb).collect::<Vec<_>>());
        let long = rows.iter().find(|c| c.workload == "ln_gelu_res" && c.dtype == DType::F32 && c.cols == 65536);
        // 3 f32 tensors of 65536: 786 KB a row, so 16 rows fit in 20 MB.
        assert_eq!(long.unwrap().rows, 16);
        let pointwise = sweep_cases(SweepKind::Pointwise, Some(20.0));
        // Every size shrinks to the same 2M-element one: each broadcast and dtype once.
        assert_eq!(pointwise.len(), 4 * 3);
        assert!(pointwise.iter().all(|c| mb(c) <= 20.0 && c.cols == POINTWISE_COLUMNS));
        // A cap above the default changes nothing.
        assert_eq!(sweep_cases(SweepKind::Rows, Some(1e6)), sweep_cases(SweepKind::Rows, None));
    }

    #[test]
    fn sweep_workloads_are_named_in_run_order() {
        assert_eq!(sweep_workloads(SweepKind::Rows), ["ln_gelu_res", "rms_silu_res", "softmax_mask"]);
        assert_eq!(sweep_workloads(SweepKind::Pointwise), ["pw_row", "pw_col", "pw_outer", "pw_scalar"]);
    }

    #[test]
    fn sweep_names_parse() {
        assert_eq!(SweepKind::parse("rows"), Some(SweepKind::Rows));
        assert_eq!(SweepKind::parse("pointwise"), Some(SweepKind::Pointwise));
        assert_eq!(SweepKind::parse("row"), None);
        for kind in [SweepKind::Rows, SweepKind::Pointwise] {
            assert_eq!(SweepKind::parse(kind.name()), Some(kind));
        }
    }
}
