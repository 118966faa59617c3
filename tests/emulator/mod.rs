//! Runs the CUDA C that braze generates on the CPU, so kernels whose arithmetic the CPU plan
//! executor only models (tensor-core fragments, shuffles, shared-memory staging) are checked
//! here without a GPU: each kernel's source is translated to C++ (`prelude.h` gives the CUDA
//! built-ins, threads and warps; the kernel's inline PTX becomes calls of its emulations),
//! compiled by the system C++ compiler and run one block at a time with a thread per CUDA
//! thread, on the plan's buffers. A plan's kernels are compiled as one program (each kernel in
//! a namespace of its own) that runs them on command, so library calls (cuBLASLt matmuls) run in
//! between on the CPU plan executor's model of them. Slow (a thread per CUDA thread): for small
//! shapes.

use braze_codegen::{generate, KernelCode, KernelConfig, Param, TableSpec, Target};
use braze_ir::{DType, HostData, HostTensor};
use braze_plan::{BufferRole, Plan};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

const PRELUDE: &str = include_str!("prelude.h");

/// The C++ compiler, when there is one (`CXX`, else `c++`).
fn compiler() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".to_string())
}

/// Whether a C++20 compiler is here.
pub fn available() -> bool {
    Command::new(compiler()).arg("--version").output().is_ok_and(|o| o.status.success())
}

/// Helper functions whose bodies are inline PTX the prelude emulates as a whole.
const EMULATED_HELPERS: [&str; 5] = ["mma_16816", "ldmatrix_x4", "ldmatrix_x4_trans", "cp_async_16", "pack_half2"];

/// The operand expressions of an inline `asm` statement's operand lists, in order.
fn asm_operands(statement: &str) -> Vec<String> {
    let after_template = match statement.find("\" :") {
        Some(i) => &statement[i + 1..],
        None => return Vec::new(),
    };
    let mut operands = Vec::new();
    let bytes = after_template.as_bytes();
    let mut i = 0;
    while let Some(q) = after_template[i..].find("\"(") {
        let start = i + q + 2;
        let mut depth = 1;
        let mut j = start;
        while j < bytes.len() && depth > 0 {
            match bytes[j] {
                b'(' => depth += 1,
                b')' => depth -= 1,
                _ => {}
            }
            j += 1;
        }
        operands.push(after_template[start..j - 1].to_string());
        i = j;
    }
    operands
}

/// One line of inline PTX as C++, or `Err` naming the instruction the prelude lacks.
fn translate_asm(line: &str) -> Result<String, String> {
    let indent = &line[..line.len() - line.trim_start().len()];
    let ops = asm_operands(line);
    let template = line.split('"').nth(1).unwrap_or("");
    let instruction = template.split_whitespace().next().unwrap_or("");
    let call = |f: &str, args: &[&str]| format!("{indent}{} = {f}({});", ops[0], args.join(", "));
    Ok(match instruction {
        "prmt.b32" if template.ends_with("0, 0x3210;") => format!("{indent}/* identity permute */"),
        // A compiler-only barrier (no instruction): nothing to run.
        "" if line.contains("::: \"memory\"") => format!("{indent}/* compiler barrier */"),
        "cp.async.commit_group;" | "cp.async.wait_group" | "cp.async.wait_all;" => {
            format!("{indent}/* cp.async completes at once here */")
        }
        // A named barrier of `count` threads.
        "bar.sync" => format!("{indent}emu_named_barrier({}, {});", ops[0], ops[1]),
        "cvt.rn.bf16.f32" => call("emu_f32_to_bf16", &[&ops[1]]),
        "cvt.rn.f16.f32" => call("emu_f32_to_f16", &[&ops[1]]),
        "cvt.f32.f16" => call("emu_f16_to_f32", &[&ops[1]]),
        "cvt.f32.bf16" => call("emu_bf16_to_f32", &[&ops[1]]),
        "cvt.rn.bf16x2.f32" => call("emu_pack", &[&ops[1], &ops[2], "true"]),
        "ex2.approx.ftz.f32" => call("emu_ex2_ftz", &[&ops[1]]),
        "cvt.rn.f16x2.f32" => call("emu_pack", &[&ops[1], &ops[2], "false"]),
        _ => return Err(format!("no emulation of the inline PTX `{}`", line.trim())),
    })
}

/// A kernel's CUDA C as C++ for the prelude.
pub fn translate(source: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut lines = source.lines().peekable();
    let mut half_is_bf16 = None;
    while let Some(line) = lines.next() {
        let helper = line
            .starts_with("__device__")
            .then(|| EMULATED_HELPERS.iter().find(|h| line.contains(&format!(" {h}("))))
            .flatten();
        if let Some(helper) = helper {
            // Skip the definition, noting which 16-bit float its PTX names.
            let mut body = line.to_string();
            for next in lines.by_ref() {
                body.push_str(next);
                if next == "}" {
                    break;
                }
            }
            if *helper == "mma_16816" || *helper == "pack_half2" {
                half_is_bf16 = Some(body.contains("bf16"));
            }
            continue;
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with("asm(") || trimmed.starts_with("asm volatile(") {
            out.push_str(&translate_asm(line)?);
        } else if let Some(rest) = trimmed.strip_prefix("extern __shared__ ") {
            // `extern __shared__ T name[];`: the block's dynamic shared memory.
            let decl = rest.trim_end_matches(';').trim_end_matches("[]");
            let (ty, name) = decl.rsplit_once(' ').ok_or_else(|| format!("unparsed shared declaration `{line}`"))?;
            let ty = ty.split_whitespace().filter(|w| !w.starts_with("__align__")).collect::<Vec<_>>().join(" ");
            let indent = &line[..line.len() - trimmed.len()];
            write!(out, "{indent}{ty}* {name} = reinterpret_cast<{ty}*>(emu_dynamic_shared);").unwrap();
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    if let Some(bf16) = half_is_bf16 {
        let emulated = format!(
            "static inline unsigned pack_half2(float lo, float hi) {{ return emu_pack(hi, lo, {bf16}); }}\n\
             static inline void mma_16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {{ emu_mma(c, a, b0, b1, {bf16}); }}\n"
        );
        out.insert_str(0, &emulated);
    }
    Ok(out)
}

/// The parameter types of entry point `entry` in `source`, as written.
fn parameter_types(source: &str, entry: &str) -> Result<Vec<String>, String> {
    let start = source.find(&format!(" {entry}(")).ok_or_else(|| format!("no entry point {entry}"))? + entry.len() + 2;
    let end = start + source[start..].find(')').ok_or("an unclosed parameter list")?;
    Ok(source[start..end]
        .split(',')
        .map(|p| {
            let p = p.trim();
            p[..p.rfind(' ').unwrap_or(0)].to_string()
        })
        .collect())
}

/// A scratch directory for one run of the emulator.
fn work_dir(label: &str) -> PathBuf {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("braze-emulator-{}-{run}-{label}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}

/// Where the program keeps each byte array: plan inputs, then plan buffers, then the check
/// words, then each kernel's scratch.
struct Storage {
    inputs: usize,
    buffers: usize,
    /// First scratch index of each kernel.
    scratch: Vec<usize>,
}

impl Storage {
    fn of_buffer(&self, plan: &Plan, id: braze_plan::BufferId) -> usize {
        match plan.buffer(id).role {
            BufferRole::Input(i) | BufferRole::InPlace(i) => i,
            _ => self.inputs + id.0,
        }
    }
    fn checks(&self) -> usize {
        self.inputs + self.buffers
    }
}

/// The emulator program of a plan, serving commands on stdin: `load S PATH`, `save S PATH`
/// (storage `S` from or to a file), `run K` (kernel `K`'s launches), each answered `ok`.
fn program(plan: &Plan, codes: &[KernelCode], storage: &Storage, sizes: &[(usize, u8)]) -> Result<String, String> {
    let mut program = String::from(PRELUDE);
    program.push_str("#include <fstream>\n#include <iostream>\n#include <sstream>\n#include <string>\n");
    program.push_str("static std::vector<std::vector<unsigned char>> emu_storage;\n");
    let mut runs = String::new();
    for (k, code) in codes.iter().enumerate() {
        let KernelCode::Cuda(generated) = code else { continue };
        let kernel = &plan.kernels[k];
        // The kernel and a function that runs its launches, in a namespace where its types are.
        writeln!(program, "namespace kernel_{k} {{\n{}", translate(&generated.source)?).unwrap();
        let mut body = String::new();
        for (t, table) in generated.tables.iter().enumerate() {
            match table {
                TableSpec::InputPointers => {
                    let pointers: Vec<String> = kernel
                        .inputs
                        .iter()
                        .map(|&id| {
                            format!(
                                "(unsigned long long)(uintptr_t)emu_storage[{}].data()",
                                storage.of_buffer(plan, id)
                            )
                        })
                        .collect();
                    writeln!(body, "  std::vector<unsigned long long> table_{t} = {{{}}};", pointers.join(", "))
                        .unwrap();
                }
                TableSpec::Static(bytes) => {
                    let bytes: Vec<String> = bytes.iter().map(u8::to_string).collect();
                    writeln!(body, "  std::vector<unsigned char> table_{t} = {{{}}};", bytes.join(", ")).unwrap();
                }
            }
        }
        for launch in &generated.launches {
            if launch.shared_bytes as usize > 256 * 1024 {
                return Err(format!("{}: {} bytes of dynamic shared memory", kernel.name, launch.shared_bytes));
            }
            let types = parameter_types(&generated.source, &launch.entry)?;
            let args: Vec<String> = launch
                .params
                .iter()
                .zip(&types)
                .map(|(param, ty)| {
                    let data = match *param {
                        Param::Input(i) => format!("emu_storage[{}].data()", storage.of_buffer(plan, kernel.inputs[i])),
                        Param::Output(o) => {
                            format!("emu_storage[{}].data()", storage.of_buffer(plan, kernel.outputs[o]))
                        }
                        Param::Scratch(s) => format!("emu_storage[{}].data()", storage.scratch[k] + s),
                        Param::Checks => format!("emu_storage[{}].data()", storage.checks()),
                        Param::Table(t) => format!("table_{t}.data()"),
                    };
                    format!("({ty}){data}")
                })
                .collect();
            let [gx, gy, gz] = launch.grid;
            let [bx, by, bz] = launch.block;
            writeln!(
                body,
                "  emu_launch([&] {{ {}({}); }}, dim3_t{{{gx}, {gy}, {gz}}}, dim3_t{{{bx}, {by}, {bz}}});",
                launch.entry,
                args.join(", ")
            )
            .unwrap();
        }
        writeln!(program, "void emu_run() {{\n{body}}}\n}}  // namespace kernel_{k}").unwrap();
        writeln!(runs, "      case {k}: kernel_{k}::emu_run(); break;").unwrap();
    }
    let allocations: String = sizes
        .iter()
        .enumerate()
        .map(|(i, (bytes, fill))| format!("  emu_storage[{i}].assign({bytes}, {fill});\n"))
        .collect();
    write!(
        program,
        r#"
int main() {{
  emu_storage.resize({count});
{allocations}  std::string line;
  while (std::getline(std::cin, line)) {{
    std::istringstream in(line);
    std::string op, path;
    long index = -1;
    in >> op >> index;
    if (op == "load") {{
      in >> path;
      std::ifstream f(path, std::ios::binary);
      std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      if (bytes.size() != emu_storage[index].size()) {{ std::cout << "error: size" << std::endl; continue; }}
      emu_storage[index] = bytes;
    }} else if (op == "save") {{
      in >> path;
      std::ofstream f(path, std::ios::binary);
      f.write((const char*)emu_storage[index].data(), emu_storage[index].size());
    }} else if (op == "run") {{
      switch (index) {{
{runs}      default: std::cout << "error: no kernel " << index << std::endl; continue;
      }}
    }} else {{
      return 0;
    }}
    std::cout << "ok" << std::endl;
  }}
  return 0;
}}
"#,
        count = sizes.len()
    )
    .unwrap();
    Ok(program)
}

/// A running emulator program.
struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    dir: PathBuf,
}

impl Session {
    fn start(dir: PathBuf, program: &str) -> Result<Session, String> {
        let cpp = dir.join("plan.cpp");
        let exe = dir.join("plan");
        std::fs::write(&cpp, program).map_err(|e| e.to_string())?;
        let built = Command::new(compiler())
            .args(["-std=c++20", "-O1", "-pthread", "-w", "-o"])
            .arg(&exe)
            .arg(&cpp)
            .output()
            .map_err(|e| format!("running the C++ compiler: {e}"))?;
        if !built.status.success() {
            return Err(format!(
                "the C++ compiler failed on {}:\n{}",
                cpp.display(),
                String::from_utf8_lossy(&built.stderr)
            ));
        }
        let mut child = Command::new(&exe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Session { child, stdin, stdout, dir })
    }

    fn command(&mut self, line: &str) -> Result<(), String> {
        writeln!(self.stdin, "{line}").map_err(|e| e.to_string())?;
        self.stdin.flush().map_err(|e| e.to_string())?;
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).map_err(|e| e.to_string())?;
        if answer.trim() == "ok" {
            return Ok(());
        }
        let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            std::io::Read::read_to_string(&mut e, &mut stderr).ok();
        }
        Err(format!("the emulator answered `{}` to `{line}` ({status}) {stderr}", answer.trim()))
    }

    fn load(&mut self, index: usize, bytes: &[u8]) -> Result<(), String> {
        let path = self.dir.join(format!("in-{index}.bin"));
        std::fs::write(&path, bytes).map_err(|e| e.to_string())?;
        self.command(&format!("load {index} {}", path.display()))
    }

    fn save(&mut self, index: usize) -> Result<Vec<u8>, String> {
        let path = self.dir.join(format!("out-{index}.bin"));
        self.command(&format!("save {index} {}", path.display()))?;
        std::fs::read(&path).map_err(|e| e.to_string())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn host_data(dtype: DType, numel: usize, bytes: &[u8]) -> Result<HostData, String> {
    Ok(HostTensor::from_bytes(dtype, [numel], bytes).map_err(|e| e.to_string())?.into_data())
}

/// Runs `plan` with `configs` (one per kernel) for `target` on `inputs`: its CUDA kernels in
/// the emulator, its library calls on the CPU plan executor (`braze_cpu::eval_kernel`);
/// intermediates and outputs start as 0xff bytes (NaN for floats), so an element no kernel
/// writes shows. `Err` for inline PTX the prelude has no emulation of, or a failed run.
pub fn run_plan(
    plan: &Plan,
    configs: &[KernelConfig],
    target: &Target,
    inputs: &[HostTensor],
) -> Result<Vec<HostTensor>, String> {
    let codes: Vec<KernelCode> = (0..plan.kernels.len())
        .map(|k| generate(plan, k, &configs[k], target).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let mut sizes: Vec<(usize, u8)> = inputs.iter().map(|t| (t.to_bytes().len(), 0)).collect();
    sizes.extend(plan.buffers.iter().map(|b| (b.bytes(), 0xff)));
    sizes.push((16 * plan.checks.len(), 0));
    let mut scratch = Vec::new();
    for code in &codes {
        scratch.push(sizes.len());
        if let KernelCode::Cuda(generated) = code {
            sizes.extend(generated.scratch.iter().map(|s| (s.bytes, 0)));
        }
    }
    let storage = Storage { inputs: inputs.len(), buffers: plan.buffers.len(), scratch };
    let name = plan.kernels.first().map_or("empty", |k| k.name.as_str());
    let mut session = Session::start(work_dir(name), &program(plan, &codes, &storage, &sizes)?)?;
    for (i, input) in inputs.iter().enumerate() {
        session.load(i, &input.to_bytes())?;
    }
    for (k, code) in codes.iter().enumerate() {
        let kernel = &plan.kernels[k];
        match code {
            KernelCode::Cuda(_) => session.command(&format!("run {k}"))?,
            KernelCode::CuBlasLt(_) => {
                let mut reads = Vec::new();
                for &id in &kernel.inputs {
                    let b = plan.buffer(id);
                    reads.push(host_data(b.dtype, b.numel, &session.save(storage.of_buffer(plan, id))?)?);
                }
                let reads: Vec<&HostData> = reads.iter().collect();
                for (&id, data) in kernel.outputs.iter().zip(braze_cpu::eval_kernel(plan, k, &reads)) {
                    let numel = plan.buffer(id).numel;
                    let bytes = HostTensor::new([numel], data).map_err(|e| e.to_string())?.to_bytes();
                    session.load(storage.of_buffer(plan, id), &bytes)?;
                }
            }
        }
    }
    plan.outputs
        .iter()
        .map(|o| {
            let b = plan.buffer(o.buffer);
            let bytes = session.save(storage.of_buffer(plan, o.buffer))?;
            HostTensor::from_bytes(b.dtype, o.shape.clone(), &bytes).map_err(|e| e.to_string())
        })
        .collect()
}
