//! The translation unit NVRTC compiles for a generated kernel.
//!
//! Generated kernels are named after their plan position (`row_layer_norm_bf16_104`) and open
//! with comments naming their buffers and source ops, so the same op of every layer of a model
//! is a different source although it compiles to the same machine code. What is compiled is the
//! source with the kernel's own name replaced by [`UNIT_NAME`] and whole-line comments dropped:
//! such kernels share one compile, one cache entry and one loaded module. The source kept for
//! display, dumps and snapshots is the generated one.

use crate::nvrtc::KernelResources;

/// The name a kernel's own name is replaced with in the unit compiled.
pub const UNIT_NAME: &str = "braze_unit";

fn is_identifier_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `source` as compiled: every identifier `name` or `name_<suffix>` (an entry of several
/// launches) with `name` replaced by [`UNIT_NAME`], and lines that are only a `//` comment
/// dropped.
pub fn unit_source(name: &str, source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    for line in source.lines() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        if name.is_empty() {
            out.push_str(line);
        } else {
            let mut rest = line;
            while let Some(at) = rest.find(name) {
                let (before, after) = (&rest[..at], &rest[at + name.len()..]);
                let starts = !before.chars().next_back().is_some_and(is_identifier_char);
                let ends = !after.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
                out.push_str(before);
                out.push_str(if starts && ends { UNIT_NAME } else { name });
                rest = after;
            }
            out.push_str(rest);
        }
        out.push('\n');
    }
    out
}

/// The entry point `entry` of kernel `name` in its compiled unit ([`unit_source`]).
pub fn unit_entry(name: &str, entry: &str) -> String {
    renamed(entry, name, UNIT_NAME)
}

/// Resource figures of a unit's entries under the names of kernel `name`.
pub fn resources_as(name: &str, resources: &[KernelResources]) -> Vec<KernelResources> {
    resources.iter().map(|r| KernelResources { kernel: renamed(&r.kernel, UNIT_NAME, name), ..r.clone() }).collect()
}

/// `identifier` with a leading `from` (followed by nothing or by `_`) replaced by `to`.
fn renamed(identifier: &str, from: &str, to: &str) -> String {
    match identifier.strip_prefix(from) {
        Some(rest) if !from.is_empty() && !rest.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()) => {
            format!("{to}{rest}")
        }
        _ => identifier.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_and_comments_go_and_nothing_else_changes() {
        let source = "// braze kernel `row_sum_f32_1`: rows\n  // in0 = b7\n#include <x.h>\n\
                      extern \"C\" __global__ void row_sum_f32_1(float* a) { a[0] = 1; } // keep\n\
                      extern \"C\" __global__ void row_sum_f32_1_pass2() {}\n\
                      __device__ void row_sum_f32_12() {} __device__ void my_row_sum_f32_1() {}\n";
        let unit = unit_source("row_sum_f32_1", source);
        assert_eq!(
            unit,
            "#include <x.h>\n\
             extern \"C\" __global__ void braze_unit(float* a) { a[0] = 1; } // keep\n\
             extern \"C\" __global__ void braze_unit_pass2() {}\n\
             __device__ void row_sum_f32_12() {} __device__ void my_row_sum_f32_1() {}\n"
        );
        // The same kernel at another plan position, with other buffers.
        let first = "// braze kernel `k_1`: rows\n// in0 = b7\nextern \"C\" __global__ void k_1() {}\n";
        let other = "// braze kernel `k_9`: rows\n// in0 = b70\nextern \"C\" __global__ void k_9() {}\n";
        assert_eq!(unit_source("k_1", first), unit_source("k_9", other));
        assert_eq!(unit_entry("row_sum_f32_1", "row_sum_f32_1"), "braze_unit");
        assert_eq!(unit_entry("row_sum_f32_1", "row_sum_f32_1_pass2"), "braze_unit_pass2");
        assert_eq!(unit_entry("row_sum_f32_1", "other"), "other");
        let figures = [KernelResources { kernel: "braze_unit_pass2".into(), registers: 3, ..Default::default() }];
        assert_eq!(resources_as("k_4", &figures)[0].kernel, "k_4_pass2");
    }
}
