//! `Display` for tensors: the text PyTorch's `print(tensor)` writes (`torch._tensor_str` with the
//! default print options: precision 4, line width 80, tensors past 1000 elements summarized to 3
//! items at each end of every dim).

use crate::trace;
use crate::{BreakKind, Device, Tensor};
use braze_ir::{DType, HostData, HostTensor};
use std::fmt;

const PRECISION: usize = 4;
const LINE_WIDTH: usize = 80;
const THRESHOLD: usize = 1000;
const EDGE_ITEMS: usize = 3;

/// Printing a tensor reads it on the host (a host synchronization for a GPU tensor). A traced
/// tensor has no value yet: it prints its type only, and printing it is no graph break.
impl fmt::Display for Tensor {
    #[track_caller]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_traced() {
            return write!(f, "tensor(<traced {}{}>)", self.dtype(), self.shape());
        }
        let loc = crate::tensor::caller();
        match trace::host_value(self, BreakKind::HostRead, "display", loc) {
            Ok(host) => f.write_str(&format_tensor(&host, self.device())),
            Err(e) => write!(f, "tensor(<unreadable: {e}>)"),
        }
    }
}

/// One element as PyTorch's formatter sees it.
#[derive(Clone, Copy)]
enum Element {
    Float(f64),
    Int(i64),
    Bool(bool),
}

fn element(data: &HostData, i: usize) -> Element {
    match data {
        HostData::F32(v) => Element::Float(v[i].into()),
        HostData::F16(v) => Element::Float(v[i].to_f64()),
        HostData::BF16(v) => Element::Float(v[i].to_f64()),
        HostData::I32(v) => Element::Int(v[i].into()),
        HostData::I64(v) => Element::Int(v[i]),
        HostData::Bool(v) => Element::Bool(v[i]),
    }
}

/// The whole text, `tensor(...)` with PyTorch's suffixes (device, size of an empty tensor,
/// dtype where it is not the default of its kind: f32, i64, bool).
pub(crate) fn format_tensor(host: &HostTensor, device: Device) -> String {
    const PREFIX: &str = "tensor(";
    let indent = PREFIX.len();
    let dims = host.shape().dims().to_vec();
    let mut suffixes = Vec::new();
    if let Device::Cuda(ordinal) = device {
        suffixes.push(format!("device='cuda:{ordinal}'"));
    }
    let body = if host.numel() == 0 {
        if dims.len() != 1 {
            let list: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
            suffixes.push(format!("size=({})", list.join(", ")));
        }
        "[]".to_string()
    } else {
        let summarize = host.numel() > THRESHOLD;
        let view = View { data: host.data(), dims: &dims, summarize };
        let formatter = Formatter::new(host.dtype(), &view.shown_elements());
        view.render(&formatter, 0, 0, indent)
    };
    if let Some(name) = torch_dtype(host.dtype()) {
        suffixes.push(format!("dtype=torch.{name}"));
    }
    let mut out = format!("{PREFIX}{body}");
    let mut last_line = out.len() - out.rfind('\n').map_or(0, |at| at + 1) + 1;
    for suffix in suffixes {
        if last_line + suffix.len() + 2 > LINE_WIDTH {
            out.push_str(&format!(",\n{}{suffix}", " ".repeat(indent)));
            last_line = indent + suffix.len();
        } else {
            out.push_str(&format!(", {suffix}"));
            last_line += suffix.len() + 2;
        }
    }
    out.push(')');
    out
}

/// PyTorch's name of a dtype that is not its kind's default.
fn torch_dtype(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F16 => Some("float16"),
        DType::BF16 => Some("bfloat16"),
        DType::I32 => Some("int32"),
        DType::F32 | DType::I64 | DType::Bool => None,
    }
}

/// Row-major data with its dims, and whether long dims show only their ends.
struct View<'a> {
    data: &'a HostData,
    dims: &'a [usize],
    summarize: bool,
}

impl View<'_> {
    /// The indices shown along a dim of `len` (all, or the first and last few), with `None`
    /// where the ellipsis goes.
    fn shown(&self, len: usize) -> Vec<Option<usize>> {
        if self.summarize && len > 2 * EDGE_ITEMS {
            (0..EDGE_ITEMS).map(Some).chain([None]).chain((len - EDGE_ITEMS..len).map(Some)).collect()
        } else {
            (0..len).map(Some).collect()
        }
    }

    fn stride(&self, dim: usize) -> usize {
        self.dims[dim + 1..].iter().product()
    }

    /// Every element that is printed (what the formatter measures), in order.
    fn shown_elements(&self) -> Vec<Element> {
        let mut out = Vec::new();
        self.collect(0, 0, &mut out);
        out
    }

    fn collect(&self, dim: usize, offset: usize, out: &mut Vec<Element>) {
        if dim == self.dims.len() {
            out.push(element(self.data, offset));
            return;
        }
        for i in self.shown(self.dims[dim]).into_iter().flatten() {
            self.collect(dim + 1, offset + i * self.stride(dim), out);
        }
    }

    /// The text of the sub-tensor at `offset` from dim `dim` on (`_tensor_str_with_formatter`).
    fn render(&self, formatter: &Formatter, dim: usize, offset: usize, indent: usize) -> String {
        let rank = self.dims.len();
        if rank == 0 {
            return formatter.format(element(self.data, 0));
        }
        let shown = self.shown(self.dims[dim]);
        if dim + 1 == rank {
            // `_vector_str`: as many elements a line as fit.
            let per_line = (LINE_WIDTH.saturating_sub(indent) / (formatter.width + 2)).max(1);
            let items: Vec<String> = shown
                .iter()
                .map(|i| match i {
                    Some(i) => formatter.format(element(self.data, offset + i)),
                    None => " ...".to_string(),
                })
                .collect();
            let lines: Vec<String> = items.chunks(per_line).map(|line| line.join(", ")).collect();
            return format!("[{}]", lines.join(&format!(",\n{}", " ".repeat(indent + 1))));
        }
        let stride = self.stride(dim);
        let slices: Vec<String> = shown
            .iter()
            .map(|i| match i {
                Some(i) => self.render(formatter, dim + 1, offset + i * stride, indent + 1),
                None => "...".to_string(),
            })
            .collect();
        let separator = format!(",{}{}", "\n".repeat(rank - dim - 1), " ".repeat(indent + 1));
        format!("[{}]", slices.join(&separator))
    }
}

/// PyTorch's `_Formatter`: one width and one notation for every element printed.
struct Formatter {
    width: usize,
    float: bool,
    /// Every finite non-zero float is whole: printed as `3.`.
    int_mode: bool,
    sci_mode: bool,
}

impl Formatter {
    fn new(dtype: DType, shown: &[Element]) -> Formatter {
        let mut f = Formatter { width: 1, float: dtype.is_float(), int_mode: true, sci_mode: false };
        if !f.float {
            f.width = shown.iter().map(|&e| f.format(e).len()).max().unwrap_or(1);
            return f;
        }
        let finite: Vec<f64> = shown
            .iter()
            .filter_map(|e| match e {
                Element::Float(x) if x.is_finite() && *x != 0.0 => Some(*x),
                _ => None,
            })
            .collect();
        if finite.is_empty() {
            return f;
        }
        let max = finite.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let min = finite.iter().fold(f64::INFINITY, |m, x| m.min(x.abs()));
        f.int_mode = finite.iter().all(|x| x.fract() == 0.0);
        f.sci_mode = max / min > 1000.0 || max > 1.0e8 || (!f.int_mode && min < 1.0e-4);
        let extra = usize::from(f.int_mode && !f.sci_mode); // the trailing '.'
        f.width = finite.iter().map(|&x| f.float_text(x).len() + extra).max().unwrap_or(1);
        f
    }

    fn float_text(&self, x: f64) -> String {
        if x.is_nan() {
            "nan".to_string()
        } else if x.is_infinite() {
            if x > 0.0 { "inf" } else { "-inf" }.to_string()
        } else if self.sci_mode {
            python_exponent(&format!("{x:.PRECISION$e}"))
        } else if self.int_mode {
            format!("{x:.0}")
        } else {
            format!("{x:.PRECISION$}")
        }
    }

    fn format(&self, e: Element) -> String {
        let text = match e {
            Element::Float(x) => {
                let mut text = self.float_text(x);
                if self.int_mode && !self.sci_mode && x.is_finite() {
                    text.push('.');
                }
                text
            }
            Element::Int(x) => x.to_string(),
            Element::Bool(b) => if b { "True" } else { "False" }.to_string(),
        };
        format!("{text:>width$}", width = self.width)
    }
}

/// Rust's `1.2346e5` as Python's `1.2346e+05`.
fn python_exponent(rust: &str) -> String {
    match rust.split_once('e') {
        Some((mantissa, exponent)) => {
            let (sign, digits) = match exponent.strip_prefix('-') {
                Some(digits) => ('-', digits),
                None => ('+', exponent),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => rust.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(dtype: DType, dims: &[usize], values: &[f64], device: Device, expect: &str) {
        let host = HostTensor::from_f64(dtype, dims.to_vec(), values).unwrap();
        assert_eq!(format_tensor(&host, device), expect);
    }

    fn cpu(dtype: DType, dims: &[usize], values: &[f64], expect: &str) {
        check(dtype, dims, values, Device::Cpu, expect);
    }

    // Expected strings are what PyTorch 2.x prints for the same tensors.
    #[test]
    fn floats_print_as_pytorch() {
        cpu(DType::F32, &[3], &[1.0, 2.0, 3.0], "tensor([1., 2., 3.])");
        cpu(DType::F32, &[3], &[0.5, -1.25, 3.0], "tensor([ 0.5000, -1.2500,  3.0000])");
        cpu(DType::F32, &[2], &[1e-5, 1.0], "tensor([1.0000e-05, 1.0000e+00])");
        cpu(DType::F32, &[2], &[123456.0, 1.0], "tensor([1.2346e+05, 1.0000e+00])");
        cpu(DType::F32, &[3], &[f64::NAN, f64::INFINITY, 1.5], "tensor([   nan,    inf, 1.5000])");
        cpu(DType::F32, &[2], &[0.0, 0.0], "tensor([0., 0.])");
        cpu(DType::F32, &[], &[2.5], "tensor(2.5000)");
        cpu(DType::F16, &[2], &[1.0, 2.0], "tensor([1., 2.], dtype=torch.float16)");
        cpu(
            DType::BF16,
            &[2, 2],
            &[1.0, -2.0, 3.0, 4.0],
            "tensor([[ 1., -2.],\n        [ 3.,  4.]], dtype=torch.bfloat16)",
        );
    }

    #[test]
    fn ints_and_bools_print_as_pytorch() {
        cpu(DType::I64, &[3], &[1.0, -20.0, 3.0], "tensor([  1, -20,   3])");
        cpu(DType::I32, &[2], &[1.0, 2.0], "tensor([1, 2], dtype=torch.int32)");
        cpu(DType::Bool, &[2], &[1.0, 0.0], "tensor([ True, False])");
    }

    #[test]
    fn nested_and_empty_tensors_print_as_pytorch() {
        let values: Vec<f64> = (0..8).map(f64::from).collect();
        cpu(
            DType::I64,
            &[2, 2, 2],
            &values,
            "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]])",
        );
        cpu(DType::F32, &[0], &[], "tensor([])");
        cpu(DType::F32, &[0, 3], &[], "tensor([], size=(0, 3))");
        cpu(DType::I32, &[0], &[], "tensor([], dtype=torch.int32)");
        check(DType::F32, &[2], &[1.0, 2.0], Device::Cuda(0), "tensor([1., 2.], device='cuda:0')");
    }

    #[test]
    fn long_rows_wrap_and_large_tensors_summarize() {
        let values: Vec<f64> = (0..30).map(f64::from).collect();
        cpu(
            DType::I64,
            &[30],
            &values,
            "tensor([ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15, 16, 17,\n        18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29])",
        );
        let values: Vec<f64> = (0..2000).map(f64::from).collect();
        cpu(DType::I64, &[2000], &values, "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
        cpu(
            DType::I64,
            &[40, 50],
            &values,
            "tensor([[   0,    1,    2,  ...,   47,   48,   49],\n        [  50,   51,   52,  ...,   97,   98,   99],\n        [ 100,  101,  102,  ...,  147,  148,  149],\n        ...,\n        [1850, 1851, 1852,  ..., 1897, 1898, 1899],\n        [1900, 1901, 1902,  ..., 1947, 1948, 1949],\n        [1950, 1951, 1952,  ..., 1997, 1998, 1999]])",
        );
    }
}
