//! Runs the CUDA C that braze generates on the CPU, so kernels whose arithmetic the CPU plan
//! executor only models (tensor-core fragments, shuffles, shared-memory staging) are checked
//! here without a GPU: each kernel's source is translated to C++ (`prelude.h` gives the CUDA
//! built-ins, threads and warps; the kernel's inline PTX becomes calls of its emulations),
//! compiled by the system C++ compiler and run one block at a time with a thread per CUDA
//! thread, on the plan's buffers. Slow (a thread per CUDA thread): for small shapes.

use braze_codegen::{generate, KernelCode, KernelConfig, Param, Target};
use braze_ir::HostTensor;
use braze_plan::{BufferRole, Plan};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
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
        "cp.async.commit_group;" | "cp.async.wait_group" | "cp.async.wait_all;" => {
            format!("{indent}/* cp.async completes at once here */")
        }
        "cvt.rn.bf16.f32" => call("emu_f32_to_bf16", &[&ops[1]]),
        "cvt.rn.f16.f32" => call("emu_f32_to_f16", &[&ops[1]]),
        "cvt.f32.f16" => call("emu_f16_to_f32", &[&ops[1]]),
        "cvt.f32.bf16" => call("emu_bf16_to_f32", &[&ops[1]]),
        "cvt.rn.bf16x2.f32" => call("emu_pack", &[&ops[1], &ops[2], "true"]),
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

fn compile_and_run(dir: &Path, program: &str, buffers: &mut [Vec<u8>]) -> Result<(), String> {
    let cpp = dir.join("kernel.cpp");
    let exe = dir.join("kernel");
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
    for (i, bytes) in buffers.iter().enumerate() {
        std::fs::write(dir.join(format!("p{i}.bin")), bytes).map_err(|e| e.to_string())?;
    }
    let ran = Command::new(&exe).arg(dir).output().map_err(|e| e.to_string())?;
    if !ran.status.success() {
        return Err(format!("the emulated kernel failed: {}", String::from_utf8_lossy(&ran.stderr)));
    }
    for (i, bytes) in buffers.iter_mut().enumerate() {
        *bytes = std::fs::read(dir.join(format!("p{i}.bin"))).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Runs `plan` with `configs` (one per kernel) for `target` on `inputs`, every kernel emulated;
/// intermediates and outputs start as 0xff bytes (NaN for floats), so an element no kernel
/// writes shows. `Err` for a library call (cuBLASLt), a pointer table, or inline PTX the
/// prelude has no emulation of.
pub fn run_plan(
    plan: &Plan,
    configs: &[KernelConfig],
    target: &Target,
    inputs: &[HostTensor],
) -> Result<Vec<HostTensor>, String> {
    let storage_of = |id: braze_plan::BufferId| match plan.buffer(id).role {
        BufferRole::Input(i) | BufferRole::InPlace(i) => i,
        _ => inputs.len() + id.0,
    };
    let mut storage: Vec<Vec<u8>> = inputs.iter().map(HostTensor::to_bytes).collect();
    storage.extend(plan.buffers.iter().map(|b| vec![0xffu8; b.bytes()]));
    let mut checks = vec![0u8; 16 * plan.checks.len()];
    for (k, kernel) in plan.kernels.iter().enumerate() {
        let code = generate(plan, k, &configs[k], target).map_err(|e| e.to_string())?;
        let KernelCode::Cuda(generated) = code else {
            return Err(format!("kernel {} is a library call, which is not emulated", kernel.name));
        };
        if !generated.tables.is_empty() {
            return Err(format!("kernel {} takes pointer tables, which are not emulated", kernel.name));
        }
        // One file per distinct parameter: plan buffers, then scratch, then the check words.
        let mut files: Vec<Vec<u8>> = Vec::new();
        let mut file_of = Vec::new();
        let scratch: Vec<Vec<u8>> = generated.scratch.iter().map(|s| vec![0u8; s.bytes]).collect();
        let mut program = String::from(PRELUDE);
        program.push_str(&translate(&generated.source)?);
        program.push_str("\nint main(int argc, char** argv) {\n  std::string dir = argv[1];\n");
        let mut slot_of = |key: (u8, usize), bytes: &[u8], files: &mut Vec<Vec<u8>>| {
            if let Some(&(_, at)) = file_of.iter().find(|(k, _)| *k == key) {
                return at;
            }
            files.push(bytes.to_vec());
            file_of.push((key, files.len() - 1));
            files.len() - 1
        };
        let mut calls = String::new();
        for launch in &generated.launches {
            let types = parameter_types(&generated.source, &launch.entry)?;
            let mut args = Vec::new();
            for (param, ty) in launch.params.iter().zip(&types) {
                let file = match *param {
                    Param::Input(i) => {
                        let s = storage_of(kernel.inputs[i]);
                        slot_of((0, s), &storage[s], &mut files)
                    }
                    Param::Output(o) => {
                        let s = storage_of(kernel.outputs[o]);
                        slot_of((0, s), &storage[s], &mut files)
                    }
                    Param::Scratch(s) => slot_of((1, s), &scratch[s], &mut files),
                    Param::Checks => slot_of((2, 0), &checks, &mut files),
                    Param::Table(_) => unreachable!("refused above"),
                };
                args.push(format!("({ty})emu_buffers[{file}].data()"));
            }
            writeln!(
                calls,
                "  emu_launch([&] {{ {}({}); }}, dim3_t{{{}, {}, {}}}, dim3_t{{{}, {}, {}}});",
                launch.entry,
                args.join(", "),
                launch.grid[0],
                launch.grid[1],
                launch.grid[2],
                launch.block[0],
                launch.block[1],
                launch.block[2]
            )
            .unwrap();
        }
        let count = files.len();
        writeln!(
            program,
            "  std::vector<std::vector<unsigned char>> emu_buffers({count});\n  \
             for (int i = 0; i < {count}; ++i) {{\n    \
               FILE* f = std::fopen((dir + \"/p\" + std::to_string(i) + \".bin\").c_str(), \"rb\");\n    \
               std::fseek(f, 0, SEEK_END); long n = std::ftell(f); std::fseek(f, 0, SEEK_SET);\n    \
               emu_buffers[i].resize(n);\n    \
               if (n && std::fread(emu_buffers[i].data(), 1, n, f) != (size_t)n) return 2;\n    \
               std::fclose(f);\n  }}\n{calls}  \
             for (int i = 0; i < {count}; ++i) {{\n    \
               FILE* f = std::fopen((dir + \"/p\" + std::to_string(i) + \".bin\").c_str(), \"wb\");\n    \
               std::fwrite(emu_buffers[i].data(), 1, emu_buffers[i].size(), f); std::fclose(f);\n  }}\n  \
             return 0;\n}}"
        )
        .unwrap();
        program = program.replacen("#include <vector>", "#include <vector>\n#include <string>", 1);
        let dir = work_dir(&kernel.name);
        compile_and_run(&dir, &program, &mut files)?;
        let _ = std::fs::remove_dir_all(&dir);
        for ((kind, index), file) in file_of {
            match kind {
                0 => storage[index] = files[file].clone(),
                2 => checks = files[file].clone(),
                _ => {}
            }
        }
    }
    plan.outputs
        .iter()
        .map(|o| {
            let b = plan.buffer(o.buffer);
            HostTensor::from_bytes(b.dtype, o.shape.clone(), &storage[storage_of(o.buffer)]).map_err(|e| e.to_string())
        })
        .collect()
}
