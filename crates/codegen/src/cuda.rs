//! CUDA C vocabulary: value and storage types, literals, conversions, and the small device
//! helpers a kernel may need. Generated sources include no headers (NVRTC's builtins provide
//! the math functions and intrinsics), so the few conversions they need are written here.

use crate::writer::CodeWriter;
use crate::Target;
use braze_ir::elementwise::CudaHelper;
use braze_ir::rounding::{f64_to_bf16, f64_to_f16};
use braze_ir::{DType, Literal};
use std::collections::BTreeSet;

/// The C type a value of `dtype` has in registers: f16/bf16 compute in float.
pub(crate) fn value_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => "float",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::Bool => "bool",
    }
}

/// The C type of one element in memory.
pub(crate) fn storage_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::F16 => "f16_t",
        DType::BF16 => "bf16_t",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::Bool => "unsigned char",
    }
}

/// A float literal for NVRTC, exact for every f32 (shortest round-trip digits).
pub(crate) fn f32_literal(v: f32) -> String {
    if v.is_nan() {
        "__int_as_float(0x7fc00000)".to_string()
    } else if v.is_infinite() {
        if v > 0.0 { "__int_as_float(0x7f800000)" } else { "__int_as_float(0xff800000)" }.to_string()
    } else {
        let digits = format!("{v:?}");
        if digits.contains(['.', 'e']) {
            format!("{digits}f")
        } else {
            format!("{digits}.0f")
        }
    }
}

fn i32_literal(v: i32) -> String {
    if v == i32::MIN {
        "(-2147483647 - 1)".to_string()
    } else {
        v.to_string()
    }
}

fn i64_literal(v: i64) -> String {
    if v == i64::MIN {
        "(-9223372036854775807LL - 1)".to_string()
    } else {
        format!("{v}LL")
    }
}

/// A constant of `dtype`, rounded to that dtype as the reference stores it; integers exactly.
pub(crate) fn const_literal(value: Literal, dtype: DType) -> String {
    match (dtype, value.to_dtype(dtype)) {
        (DType::F32, Literal::Float(v)) => f32_literal(v as f32),
        (DType::F16, Literal::Float(v)) => f32_literal(f64_to_f16(v).to_f32()),
        (DType::BF16, Literal::Float(v)) => f32_literal(f64_to_bf16(v).to_f32()),
        // `to_dtype` wrapped the value into i32's range.
        (DType::I32, Literal::Int(i)) => i32_literal(i as i32),
        (DType::I64, Literal::Int(i)) => i64_literal(i),
        (DType::Bool, Literal::Bool(b)) => b.to_string(),
        (dtype, value) => unreachable!("Literal::to_dtype gave {value:?} for {dtype}"),
    }
}

/// The identity of a reduction's combine step, in the accumulator type.
pub(crate) fn identity_literal(op: braze_ir::ReduceOp, acc: DType) -> String {
    use braze_ir::ReduceOp;
    match (op, acc) {
        (ReduceOp::Sum | ReduceOp::Mean, DType::I64) => "0LL".to_string(),
        (ReduceOp::Sum | ReduceOp::Mean, DType::I32) => "0".to_string(),
        (ReduceOp::Sum | ReduceOp::Mean, _) => "0.0f".to_string(),
        (ReduceOp::Max, DType::I32) => i32_literal(i32::MIN),
        (ReduceOp::Max, DType::I64) => i64_literal(i64::MIN),
        (ReduceOp::Max, _) => f32_literal(f32::NEG_INFINITY),
        (ReduceOp::Min, DType::I32) => i32_literal(i32::MAX),
        (ReduceOp::Min, DType::I64) => i64_literal(i64::MAX),
        (ReduceOp::Min, _) => f32_literal(f32::INFINITY),
    }
}

/// A device helper function (or type) that generated code calls. Ordered so that the prelude is
/// emitted in one fixed order, dependencies first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Helper {
    Bf16,
    F16,
    /// A helper an op's CUDA expression calls (from the op table).
    Op(&'static CudaHelper),
    IntToF32Odd,
    /// `BRAZE_MIN_BLOCKS(n)`, the blocks an SM should hold in a kernel's launch bounds (see
    /// [`occupancy_bounds`]).
    OccupancyHint,
    /// Loads `n` elements (`n * size` bytes, one aligned access) widened to registers.
    LoadVec(DType, u32),
    /// Widens `n` elements already loaded as one raw access (see [`raw_vec_type`]).
    UnpackVec(DType, u32),
    /// Narrows and stores `n` elements with one aligned access.
    StoreVec(DType, u32),
}

/// The helpers one translation unit needs.
pub(crate) struct Helpers {
    needed: BTreeSet<Helper>,
    /// The target converts f32 to bf16 in hardware (`cvt.rn.bf16.f32` and `cvt.rn.bf16x2.f32`,
    /// sm_80 and later): one instruction where the portable rounding takes seven.
    native_bf16: bool,
}

impl Helpers {
    pub(crate) fn for_target(target: &Target) -> Helpers {
        Helpers { needed: BTreeSet::new(), native_bf16: target.compute_capability >= (8, 0) }
    }

    pub(crate) fn need(&mut self, helper: Helper) {
        match helper {
            Helper::LoadVec(dtype, _) | Helper::UnpackVec(dtype, _) | Helper::StoreVec(dtype, _) => {
                self.need_storage(dtype)
            }
            Helper::Op(op) => {
                for &required in op.requires {
                    self.need(Helper::Op(required));
                }
            }
            _ => {}
        }
        self.needed.insert(helper);
    }

    /// Whatever naming or converting an element of `dtype` in memory requires.
    pub(crate) fn need_storage(&mut self, dtype: DType) {
        match dtype {
            DType::BF16 => {
                self.needed.insert(Helper::Bf16);
            }
            DType::F16 => {
                self.needed.insert(Helper::F16);
            }
            _ => {}
        }
    }

    /// The helpers `code` needs, dependencies first. f16/bf16 conversions are left out where
    /// neither the code nor another helper converts (a copy only names the type).
    pub(crate) fn render(&self, w: &mut CodeWriter, code: &str) {
        let mut rest = CodeWriter::new();
        let mut rendered = BTreeSet::new();
        for helper in self.needed.iter().filter(|h| !matches!(h, Helper::Bf16 | Helper::F16)) {
            self.render_after_requirements(*helper, &mut rendered, &mut rest);
        }
        let rest = rest.finish();
        let uses = |names: &[&str]| names.iter().any(|n| code.contains(n) || rest.contains(n));
        if self.needed.contains(&Helper::Bf16) {
            let converts = uses(&["bf16_to_f32(", "f32_to_bf16_bits(", "round_to_bf16(", "bf16x2_bits("]);
            render_half(w, "bf16", converts, self.native_bf16);
        }
        if self.needed.contains(&Helper::F16) {
            let converts = uses(&["f16_to_f32(", "f32_to_f16_bits(", "round_to_f16("]);
            render_half(w, "f16", converts, false);
        }
        for line in rest.lines() {
            w.line(line);
        }
    }
}

impl Helpers {
    /// `helper`, after the op helpers it calls, each once.
    fn render_after_requirements(&self, helper: Helper, rendered: &mut BTreeSet<Helper>, w: &mut CodeWriter) {
        if !rendered.insert(helper) {
            return;
        }
        if let Helper::Op(op) = helper {
            for &required in op.requires {
                self.render_after_requirements(Helper::Op(required), rendered, w);
            }
        }
        render_helper(helper, self.native_bf16, w);
        w.line("");
    }
}

fn render_helper(helper: Helper, native_bf16: bool, w: &mut CodeWriter) {
    let lines: &[&str] = match helper {
        Helper::Bf16 | Helper::F16 => unreachable!("rendered by Helpers::render"),
        Helper::Op(helper) => helper.source,
        Helper::IntToF32Odd => &[
            "// An integer as float rounded toward zero, the lowest bit set when inexact (round to odd):",
            "// rounding that to bf16 or f16 rounds once from the integer, as the reference does.",
            "__device__ __forceinline__ float int_to_f32_odd(long long x) {",
            "  const float t = __ll2float_rz(x);",
            "  return (long long)t == x ? t : __uint_as_float(__float_as_uint(t) | 1u);",
            "}",
        ],
        Helper::OccupancyHint => &[
            "// Blocks an SM should hold: ptxas caps the registers to fit them. A kernel that would spill",
            "// under the cap, or that needs far more registers than it, is compiled again with",
            "// BRAZE_NO_OCCUPANCY_HINT, which leaves the registers to ptxas, or where that spills too",
            "// with BRAZE_ONE_BLOCK_AN_SM, which asks for one block.",
            "#if defined(BRAZE_NO_OCCUPANCY_HINT)",
            "#define BRAZE_MIN_BLOCKS(n)",
            "#elif defined(BRAZE_ONE_BLOCK_AN_SM)",
            "#define BRAZE_MIN_BLOCKS(n) , 1",
            "#else",
            "#define BRAZE_MIN_BLOCKS(n) , n",
            "#endif",
        ],
        Helper::LoadVec(dtype, n) => {
            render_load_vec(dtype, n, w);
            return;
        }
        Helper::UnpackVec(dtype, n) => {
            render_unpack_vec(dtype, n, w);
            return;
        }
        Helper::StoreVec(dtype, n) => {
            render_store_vec(dtype, n, native_bf16, w);
            return;
        }
    };
    for line in lines {
        w.line(*line);
    }
}

/// The macro that, defined, drops every [`Helper::OccupancyHint`] of a source: the launch bounds
/// keep only the block size.
pub const NO_OCCUPANCY_HINT: &str = "BRAZE_NO_OCCUPANCY_HINT";

/// The macro that, defined, makes every [`Helper::OccupancyHint`] of a source ask for one block an
/// SM: all the registers a block may have, where ptxas left to itself would still spill (it holds
/// some kernels to 32 registers around a division's slow-path call).
pub const ONE_BLOCK_AN_SM: &str = "BRAZE_ONE_BLOCK_AN_SM";

/// Whether `source` asks for blocks an SM through [`Helper::OccupancyHint`]: compiling it again
/// with [`NO_OCCUPANCY_HINT`] defined lifts the register cap that hint sets.
pub fn has_occupancy_hint(source: &str) -> bool {
    !occupancy_hints(source).is_empty()
}

/// A kernel's occupancy hint as its source states it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OccupancyHint {
    pub kernel: String,
    /// Threads a block.
    pub block: u32,
    /// Blocks an SM the hint asks for.
    pub blocks: u32,
}

impl OccupancyHint {
    /// The registers a thread has under the hint's cap: a 64K-register SM shared by the blocks
    /// asked for, in ptxas's units of 8 registers, at most 255.
    pub fn cap(&self) -> u32 {
        (65536 / (self.block.max(1) * self.blocks.max(1)) / 8 * 8).min(255)
    }

    /// Blocks of this kernel an SM holds at `registers` a thread, as far as registers decide.
    pub fn resident_blocks(&self, registers: u32) -> u32 {
        let per_thread = registers.max(1).div_ceil(8) * 8;
        (65536 / (per_thread * self.block.max(1))).min(2048 / self.block.max(1)).min(32)
    }
}

/// Every kernel of `source` with an occupancy hint.
pub fn occupancy_hints(source: &str) -> Vec<OccupancyHint> {
    let mut hints = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("__launch_bounds__(") {
        rest = &rest[at + "__launch_bounds__(".len()..];
        // `256 BRAZE_MIN_BLOCKS(4)) name(`: the block, the blocks, the kernel's name.
        let Some(close) = rest.find(')') else { break };
        let Some((block, blocks)) = rest[..close].split_once(" BRAZE_MIN_BLOCKS(") else { continue };
        let (Ok(block), Ok(blocks)) = (block.trim().parse::<u32>(), blocks.parse::<u32>()) else { continue };
        let after = rest[close + 1..].strip_prefix(')').unwrap_or("");
        let kernel = after.trim_start().split('(').next().unwrap_or("").trim().to_string();
        hints.push(OccupancyHint { kernel, block, blocks });
    }
    hints
}

/// `__launch_bounds__` arguments for blocks of `block` threads that an SM should hold at least
/// `threads` of: `"{block} BRAZE_MIN_BLOCKS(n)"` (needing [`Helper::OccupancyHint`], whose macro
/// supplies the comma), or just `"{block}, 1"` where one block already holds that many.
pub(crate) fn occupancy_bounds(helpers: &mut Helpers, block: u32, threads: u32) -> String {
    let blocks = (threads / block.max(1)).clamp(1, 32);
    if blocks == 1 {
        return format!("{block}, 1");
    }
    helpers.need(Helper::OccupancyHint);
    format!("{block} BRAZE_MIN_BLOCKS({blocks})")
}

/// The 16-bit float type `name` (bf16 or f16): its storage typedef and, when `converts`, its
/// conversions to and from float; bf16 rounds in hardware where `native_bf16`.
fn render_half(w: &mut CodeWriter, name: &str, converts: bool, native_bf16: bool) {
    let bf16 = name == "bf16";
    w.line(format!("// {name} lives in memory as its 16-bit pattern and in registers as float."));
    w.line(format!("typedef unsigned short {name}_t;"));
    if !converts {
        w.line("");
        return;
    }
    let lines: &[&str] = match (bf16, native_bf16) {
        (true, true) => &[
            "__device__ __forceinline__ float bf16_to_f32(unsigned short bits) { return __uint_as_float((unsigned)bits << 16); }",
            "// Round to nearest even in hardware; a NaN becomes the canonical quiet NaN.",
            "__device__ __forceinline__ unsigned short f32_to_bf16_bits(float x) {",
            "  unsigned short bits;",
            "  asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(bits) : \"f\"(x));",
            "  return bits;",
            "}",
            "// `hi` and `lo` rounded to bf16 in one instruction, `hi` in the upper half.",
            "__device__ __forceinline__ unsigned bf16x2_bits(float hi, float lo) {",
            "  unsigned bits;",
            "  asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(bits) : \"f\"(hi), \"f\"(lo));",
            "  return bits;",
            "}",
            "__device__ __forceinline__ float round_to_bf16(float x) { return bf16_to_f32(f32_to_bf16_bits(x)); }",
        ],
        (true, false) => &[
            "__device__ __forceinline__ float bf16_to_f32(unsigned short bits) { return __uint_as_float((unsigned)bits << 16); }",
            "// Round to nearest even; a NaN stays a quiet NaN instead of carrying into infinity.",
            "__device__ __forceinline__ unsigned short f32_to_bf16_bits(float x) {",
            "  const unsigned bits = __float_as_uint(x);",
            "  if ((bits & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((bits >> 16) | 0x40u);",
            "  return (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);",
            "}",
            "__device__ __forceinline__ float round_to_bf16(float x) { return bf16_to_f32(f32_to_bf16_bits(x)); }",
        ],
        (false, _) => &[
            "__device__ __forceinline__ float f16_to_f32(unsigned short bits) {",
            "  float x;",
            "  asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(x) : \"h\"(bits));",
            "  return x;",
            "}",
            "__device__ __forceinline__ unsigned short f32_to_f16_bits(float x) {",
            "  unsigned short bits;",
            "  asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(bits) : \"f\"(x));",
            "  return bits;",
            "}",
            "__device__ __forceinline__ float round_to_f16(float x) { return f16_to_f32(f32_to_f16_bits(x)); }",
        ],
    };
    for line in lines {
        w.line(*line);
    }
    w.line("");
}

/// The raw type of an aligned access of `bytes` bytes and the names of its 32-bit words.
fn raw_access(bytes: u32) -> (&'static str, Vec<&'static str>) {
    match bytes {
        16 => ("uint4", vec!["w.x", "w.y", "w.z", "w.w"]),
        8 => ("uint2", vec!["w.x", "w.y"]),
        4 => ("unsigned", vec!["w"]),
        2 => ("unsigned short", vec!["w"]),
        _ => unreachable!("vector accesses are 2, 4, 8 or 16 bytes"),
    }
}

pub(crate) fn load_vec_name(dtype: DType, n: u32) -> String {
    format!("load_{}x{n}", dtype.name())
}

pub(crate) fn store_vec_name(dtype: DType, n: u32) -> String {
    format!("store_{}x{n}", dtype.name())
}

/// The C type of one aligned access of `n` elements of `dtype` (`n * size` bytes).
pub(crate) fn raw_vec_type(dtype: DType, n: u32) -> &'static str {
    raw_access(n * dtype.size_bytes() as u32).0
}

pub(crate) fn unpack_vec_name(dtype: DType, n: u32) -> String {
    format!("unpack_{}x{n}", dtype.name())
}

fn render_load_vec(dtype: DType, n: u32, w: &mut CodeWriter) {
    let size = dtype.size_bytes() as u32;
    let (raw, _) = raw_access(n * size);
    w.line(format!("// {n} {} elements from one {}-byte aligned load.", dtype.name(), n * size));
    w.open(format!(
        "__device__ __forceinline__ void {}(const {}* p, {}* v)",
        load_vec_name(dtype, n),
        storage_type(dtype),
        value_type(dtype)
    ));
    w.line(format!("const {raw} w = *reinterpret_cast<const {raw}*>(p);"));
    widen_raw_elements(dtype, n, w);
    w.close();
}

fn render_unpack_vec(dtype: DType, n: u32, w: &mut CodeWriter) {
    let size = dtype.size_bytes() as u32;
    let (raw, _) = raw_access(n * size);
    w.line(format!("// {n} {} elements of one {}-byte access loaded earlier.", dtype.name(), n * size));
    w.open(format!(
        "__device__ __forceinline__ void {}(const {raw} w, {}* v)",
        unpack_vec_name(dtype, n),
        value_type(dtype)
    ));
    widen_raw_elements(dtype, n, w);
    w.close();
}

/// `v[0..n] = ` the `n` elements of `dtype` in the raw access `w`, widened.
fn widen_raw_elements(dtype: DType, n: u32, w: &mut CodeWriter) {
    let size = dtype.size_bytes() as u32;
    let (_, words) = raw_access(n * size);
    for j in 0..n {
        let byte = j * size;
        let word = words[(byte / 4) as usize];
        let shift = (byte % 4) * 8;
        let part = |mask: &str| {
            if shift == 0 {
                format!("({word} & {mask})")
            } else {
                format!("(({word} >> {shift}) & {mask})")
            }
        };
        let element = match dtype {
            DType::F32 => format!("__uint_as_float({word})"),
            DType::I32 => format!("(int){word}"),
            DType::I64 => {
                let hi = words[(byte / 4 + 1) as usize];
                format!("(long long)(((unsigned long long){hi} << 32) | {word})")
            }
            DType::BF16 => format!("bf16_to_f32((unsigned short){})", part("0xffffu")),
            DType::F16 => format!("f16_to_f32((unsigned short){})", part("0xffffu")),
            DType::Bool => format!("{} != 0u", part("0xffu")),
        };
        w.line(format!("v[{j}] = {element};"));
    }
}

fn render_store_vec(dtype: DType, n: u32, native_bf16: bool, w: &mut CodeWriter) {
    let size = dtype.size_bytes() as u32;
    let bytes = n * size;
    let (raw, words) = raw_access(bytes);
    w.line(format!("// {n} {} elements with one {bytes}-byte aligned store.", dtype.name()));
    w.open(format!(
        "__device__ __forceinline__ void {}({}* p, const {}* v)",
        store_vec_name(dtype, n),
        storage_type(dtype),
        value_type(dtype)
    ));
    // Each 32-bit word (or the one 16-bit word) is the OR of the elements it holds.
    let word_count = words.len() as u32;
    let mut word_values = Vec::new();
    for word in 0..word_count {
        let mut parts = Vec::new();
        for j in 0..n {
            let byte = j * size;
            let shift = (byte % 4) * 8;
            if dtype == DType::I64 {
                if byte / 4 == word {
                    parts.push(format!("(unsigned)(unsigned long long)v[{j}]"));
                } else if byte / 4 + 1 == word {
                    parts.push(format!("(unsigned)((unsigned long long)v[{j}] >> 32)"));
                }
                continue;
            }
            if byte / 4 != word {
                continue;
            }
            if dtype == DType::BF16 && native_bf16 && shift == 0 && j + 1 < n {
                // The word's two elements in one conversion.
                parts.push(format!("bf16x2_bits(v[{}], v[{j}])", j + 1));
                break;
            }
            let bits = match dtype {
                DType::F32 => format!("__float_as_uint(v[{j}])"),
                DType::I32 => format!("(unsigned)v[{j}]"),
                DType::BF16 => format!("(unsigned)f32_to_bf16_bits(v[{j}])"),
                DType::F16 => format!("(unsigned)f32_to_f16_bits(v[{j}])"),
                DType::Bool => format!("(v[{j}] ? 1u : 0u)"),
                DType::I64 => unreachable!(),
            };
            parts.push(if shift == 0 { bits } else { format!("({bits} << {shift})") });
        }
        word_values.push(parts.join(" | "));
    }
    if word_count == 1 {
        w.line(format!("*reinterpret_cast<{raw}*>(p) = ({raw})({});", word_values[0]));
    } else {
        w.line(format!("{raw} w;"));
        for (name, value) in words.iter().zip(&word_values) {
            w.line(format!("{name} = {value};"));
        }
        w.line(format!("*reinterpret_cast<{raw}*>(p) = w;"));
    }
    w.close();
}

/// The register value of the element `lvalue` of a `dtype` buffer.
pub(crate) fn widen(dtype: DType, lvalue: &str) -> String {
    match dtype {
        DType::F32 | DType::I32 | DType::I64 => lvalue.to_string(),
        DType::BF16 => format!("bf16_to_f32({lvalue})"),
        DType::F16 => format!("f16_to_f32({lvalue})"),
        DType::Bool => format!("({lvalue} != 0)"),
    }
}

/// The memory form of a register value `value` of `dtype`.
pub(crate) fn narrow(dtype: DType, value: &str) -> String {
    match dtype {
        DType::F32 | DType::I32 | DType::I64 => value.to_string(),
        DType::BF16 => format!("f32_to_bf16_bits({value})"),
        DType::F16 => format!("f32_to_f16_bits({value})"),
        DType::Bool => format!("(unsigned char){value}"),
    }
}

/// Converts a register value `x` of `from` to `to` with the reference's cast semantics: float
/// -> int truncates and saturates with NaN -> 0 (the 32-bit PTX conversion does exactly that; the
/// 64-bit one maps NaN to INT64_MIN, so it is guarded), anything ->
/// bool is `!= 0`, bool -> number is 0/1, casts to f16/bf16 round to nearest even.
pub(crate) fn cast(helpers: &mut Helpers, from: DType, to: DType, x: &str) -> String {
    if from == to {
        return x.to_string();
    }
    let as_float = match from {
        DType::F32 | DType::F16 | DType::BF16 => x.to_string(),
        // An integer rounded to f32 first and then to f16/bf16 would round twice.
        DType::I32 | DType::I64 if to.is_narrow_float() => {
            helpers.need(Helper::IntToF32Odd);
            format!("int_to_f32_odd({x})")
        }
        DType::I32 | DType::I64 => format!("(float){x}"),
        DType::Bool => format!("({x} ? 1.0f : 0.0f)"),
    };
    match to {
        DType::Bool => match from {
            DType::I32 | DType::I64 => format!("({x} != 0)"),
            _ => format!("({x} != 0.0f)"),
        },
        DType::F32 => as_float,
        DType::BF16 => {
            if from == DType::Bool {
                return as_float;
            }
            helpers.need(Helper::Bf16);
            format!("round_to_bf16({as_float})")
        }
        DType::F16 => {
            if from == DType::Bool {
                return as_float;
            }
            helpers.need(Helper::F16);
            format!("round_to_f16({as_float})")
        }
        DType::I32 => match from {
            DType::F32 | DType::F16 | DType::BF16 => format!("__float2int_rz({x})"),
            _ => format!("(int){x}"),
        },
        DType::I64 => match from {
            // cvt.rzi.s64.f32 saturates but turns NaN into INT64_MIN, unlike the 32-bit case.
            DType::F32 | DType::F16 | DType::BF16 => format!("({x} != {x} ? 0ll : __float2ll_rz({x}))"),
            _ => format!("(long long){x}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_literals_round_trip_and_spell_specials() {
        assert_eq!(f32_literal(1.0), "1.0f");
        assert_eq!(f32_literal(1e-5), "1e-5f");
        assert_eq!(f32_literal(-0.0), "-0.0f");
        assert_eq!(f32_literal(f32::INFINITY), "__int_as_float(0x7f800000)");
        assert_eq!(const_literal(Literal::Float(0.1), DType::BF16), "0.100097656f");
        assert_eq!(const_literal(Literal::Int(-2147483648), DType::I32), "(-2147483647 - 1)");
        assert_eq!(const_literal(Literal::of_f64(3.9, DType::I64), DType::I64), "3LL");
        assert_eq!(const_literal(Literal::Int((1 << 62) + 1), DType::I64), "4611686018427387905LL");
        assert_eq!(const_literal(Literal::Int(i64::MIN), DType::I64), "(-9223372036854775807LL - 1)");
        assert_eq!(const_literal(Literal::Bool(true), DType::Bool), "true");
    }
}
