//! Snapshots of the CUDA source of the fixture plans of every family, compiled from IR graphs by
//! the passes (in the top-level `snapshots/kernels/`, which braze-cuda's NVRTC test compiles), plus the properties the
//! runtime relies on: determinism, index width, launches, scratch and tables. Every kernel is
//! generated for the H200 ([`Target::h200`]), the target the snapshots assume.

mod plans;

use braze_codegen::{
    candidate_configs, default_config, generate, plan_sources, CodegenError, GeneratedKernel, KernelCode, KernelConfig,
    Param, ScratchSpec, TableSpec, Target,
};
use braze_ir::DType;
use braze_plan::{KernelKind, Plan};

fn settings() -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../../snapshots/kernels"));
    settings.set_prepend_module_to_snapshot(false);
    settings
}

fn cuda(plan: &Plan, config: &KernelConfig) -> GeneratedKernel {
    match generate(plan, 0, config, &Target::h200()).unwrap() {
        KernelCode::Cuda(kernel) => kernel,
        KernelCode::CuBlasLt(_) => panic!("expected CUDA source"),
    }
}

fn snapshot_with(name: &str, plan: &Plan, config: &KernelConfig) -> GeneratedKernel {
    let kernel = cuda(plan, config);
    settings().bind(|| insta::assert_snapshot!(name, kernel.source));
    kernel
}

fn snapshot(name: &str, plan: &Plan) -> GeneratedKernel {
    snapshot_with(name, plan, &default_config(plan, 0, &Target::h200()))
}

#[test]
fn snapshots_of_every_family() {
    for (name, plan) in plans::all_plans() {
        snapshot(name, &plan);
    }
}

#[test]
fn snapshot_of_an_uncached_row_kernel() {
    let plan = plans::ln_relu_res(DType::F32, 16_384, 4096);
    let config = KernelConfig::Row { threads_per_row: 1024, rows_per_block: 1, cached: false };
    snapshot_with("row_ln_relu_res_f32_uncached", &plan, &config);
}

#[test]
fn snapshot_of_a_sub_warp_row_kernel() {
    let plan = plans::softmax(4096, 64);
    let config = default_config(&plan, 0, &Target::h200());
    // 16 vectors a row: 4 threads would hold 64 bytes each, but 4,096 rows of 4 threads leave
    // most of the GPU idle, so rows widen to 16 threads.
    assert_eq!(config, KernelConfig::Row { threads_per_row: 16, rows_per_block: 8, cached: true });
    snapshot_with("row_softmax_sub_warp", &plan, &config);
}

#[test]
fn snapshot_of_a_row_kernel_with_partials_in_row_slots() {
    // 1,024 bf16 columns with two partials: 64 threads a row hold the partials' 32
    // accumulators each, and a block works on four of its group's rows at once, each row's
    // two warps at a named barrier of their own.
    let plan = plans::row_with_column_partials(DType::BF16, 8192, 1024);
    let KernelKind::Row(row) = &plan.kernels[0].kind else { panic!("kernel 0 is not a row kernel:\n{plan}") };
    assert_eq!(row.partials.len(), 2, "{plan}");
    let config = default_config(&plan, 0, &Target::h200());
    assert_eq!(config, KernelConfig::Row { threads_per_row: 64, rows_per_block: 4, cached: true });
    let kernel = snapshot_with("row_partials_in_row_slots_bf16", &plan, &config);
    assert!(kernel.source.contains("bar.sync"), "{}", kernel.source);
    assert_eq!(kernel.launches[0].block, [256, 1, 1]);
    // The candidates also time wider blocks and one row at a time.
    let candidates = candidate_configs(&plan, 0, &Target::h200());
    for rows_per_block in [8, 1] {
        let slotted = KernelConfig::Row { threads_per_row: 64, rows_per_block, cached: true };
        assert!(candidates.contains(&slotted), "{slotted} not in {candidates:?}");
    }
}

#[test]
fn generation_is_deterministic() {
    for (name, plan) in plans::all_plans() {
        for config in candidate_configs(&plan, 0, &Target::h200()) {
            let first = generate(&plan, 0, &config, &Target::h200()).unwrap();
            let second = generate(&plan.clone(), 0, &config, &Target::h200()).unwrap();
            assert_eq!(first, second, "{name} with {config}");
        }
    }
}

#[test]
fn every_candidate_config_generates() {
    for (name, plan) in plans::all_plans() {
        let candidates = candidate_configs(&plan, 0, &Target::h200());
        assert!((1..=8).contains(&candidates.len()), "{name}: {} candidates", candidates.len());
        assert_eq!(candidates[0], default_config(&plan, 0, &Target::h200()));
        for config in candidates {
            let kernel = cuda(&plan, &config);
            for launch in &kernel.launches {
                assert!(launch.grid.iter().all(|&g| g > 0), "{name} with {config}: empty grid");
                assert!(launch.block[0] >= 32 && launch.block[0] <= 1024, "{name} with {config}");
                let bounds = |min_blocks: &str| {
                    format!("void __launch_bounds__({}{min_blocks}) {}(", launch.block[0], launch.entry)
                };
                // Blocks an SM asked for through the occupancy hint fill it with at most 2048
                // threads, and the hint's macro is defined in the source.
                let hinted = (2..=32u32)
                    .filter(|n| n * launch.block[0] <= 2048)
                    .any(|n| kernel.source.contains(&bounds(&format!(" BRAZE_MIN_BLOCKS({n})"))));
                assert!(
                    ["", ", 1", ", 2"].iter().any(|min| kernel.source.contains(&bounds(min))) || hinted,
                    "{name} with {config}"
                );
                assert_eq!(hinted, braze_codegen::has_occupancy_hint(&kernel.source), "{name} with {config}");
                if hinted {
                    assert!(kernel.source.contains("#define BRAZE_MIN_BLOCKS(n) , n"), "{name} with {config}");
                    let hints = braze_codegen::occupancy_hints(&kernel.source);
                    let hint = hints.iter().find(|h| h.kernel == launch.entry);
                    assert!(
                        hint.is_some_and(|h| h.block == launch.block[0] && (24..=128).contains(&h.cap())),
                        "{name} with {config}: {hints:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn index_math_is_64_bit_exactly_when_needed() {
    for (name, plan) in plans::all_plans() {
        let kernel = cuda(&plan, &default_config(&plan, 0, &Target::h200()));
        let largest = plan.buffers.iter().map(|b| b.numel).max().unwrap();
        let wide = kernel.source.contains("typedef unsigned long long idx_t;");
        let narrow = kernel.source.contains("typedef unsigned idx_t;");
        if name.starts_with("multi_reduce") {
            assert!(!wide && !narrow, "{name}: multi-reduce indexes within segments");
            continue;
        }
        assert_eq!(wide, largest >= 1 << 31, "{name}");
        assert_eq!(narrow, largest < 1 << 31, "{name}");
    }
    let huge = cuda(&plans::pointwise_huge(), &default_config(&plans::pointwise_huge(), 0, &Target::h200()));
    assert!(huge.source.contains("constexpr idx_t NUMEL = 3221225472ull;"));
}

#[test]
fn pointwise_kernels_use_16_byte_accesses() {
    let f32_chain = cuda(
        &plans::ew_chain(DType::F32, 1 << 26),
        &default_config(&plans::ew_chain(DType::F32, 1 << 26), 0, &Target::h200()),
    );
    assert_eq!(f32_chain.source.matches("load_f32x4(in").count(), 4);
    assert!(f32_chain.source.contains("store_f32x4(out0 + i0, st0);"));
    assert!(!f32_chain.source.contains("the last"), "2^26 needs no scalar tail");
    let plan = plans::ew_chain(DType::BF16, 1_000_003);
    let bf16 = cuda(&plan, &default_config(&plan, 0, &Target::h200()));
    assert!(bf16.source.contains("load_bf16x8(in0 + i0, ld0);"));
    assert!(bf16.source.contains("// the last 3 elements"));
    let broadcast =
        cuda(&plans::pointwise_broadcast_f32(), &default_config(&plans::pointwise_broadcast_f32(), 0, &Target::h200()));
    // w [256] is contiguous per vector, r [64, 1] once per vector, s once per thread.
    assert!(broadcast.source.contains("load_f32x4(in1 + (i0 % 256u), ld1);"));
    assert!(broadcast.source.contains("const float ld3 = in2[i0 / 256u];"));
    assert!(broadcast.source.contains("const float v6 = in3[0u];"));
}

#[test]
fn launches_cover_the_work() {
    let plan = plans::ew_chain(DType::F32, 1 << 26);
    let kernel = cuda(&plan, &KernelConfig::Pointwise { block: 256, vec: 4, grid_limit: 1056 });
    assert_eq!(kernel.launches.len(), 1);
    let launch = &kernel.launches[0];
    assert_eq!((launch.grid, launch.block), ([1056, 1, 1], [256, 1, 1]));
    assert_eq!(
        launch.params,
        vec![Param::Input(0), Param::Input(1), Param::Input(2), Param::Input(3), Param::Output(0)]
    );

    let empty = cuda(&plans::pointwise_empty(), &default_config(&plans::pointwise_empty(), 0, &Target::h200()));
    assert!(empty.launches.is_empty());
    assert!(empty.source.contains("__global__"));

    let ln = plans::ln_relu_res(DType::F32, 16_384, 4096);
    let kernel = cuda(&ln, &default_config(&ln, 0, &Target::h200()));
    assert_eq!((kernel.launches[0].grid, kernel.launches[0].block), ([16_384, 1, 1], [256, 1, 1]));
}

/// Elements a thread takes per step: 16 bytes of the narrowest dtype, then 16-bit data up to 32
/// bytes a stream while all the streams a thread loads hold at most 64 bytes (broadcast scalars
/// such as a learning rate not counted), and fewer where wide streams beside a narrow one would
/// hold more, down to 16-byte accesses of the widest.
#[test]
fn default_vectors_follow_the_bytes_each_thread_streams() {
    let vec = |plan: &Plan, k: usize| match default_config(plan, k, &Target::h200()) {
        KernelConfig::Pointwise { vec, .. } | KernelConfig::MultiPointwise { vec, .. } => vec,
        other => panic!("{other}"),
    };
    let streams = |dtype: DType, n: usize| vec(&plans::pointwise_streams(dtype, 1 << 20, n), 0);
    // One or two bf16 streams: 16 elements (32 bytes a stream, the most a thread takes).
    assert_eq!((streams(DType::BF16, 1), streams(DType::BF16, 2)), (16, 16));
    // f32: 16-byte vectors, however many streams.
    assert_eq!((streams(DType::F32, 1), streams(DType::F32, 2), streams(DType::F32, 6)), (4, 4, 4));
    // Four bf16 streams already fill 64 bytes at 8.
    assert_eq!(vec(&plans::ew_chain(DType::BF16, 1 << 20), 0), 8);
    // AdamW: three f32 streams and a bf16 one, 14 bytes an element: 4 (8 would hold 112 bytes).
    let adam = plans::adam_updates(&[1 << 16, 1 << 17]);
    assert_eq!(adam.kernels.len(), 1, "{adam}");
    assert!(matches!(adam.kernels[0].kind, KernelKind::MultiPointwise(_)), "{adam}");
    assert_eq!(vec(&adam, 0), 4);
}

/// Large multi-reduces (four waves of 512-thread blocks of 32,768 elements) take those; others
/// 256 threads over 16,384.
#[test]
fn default_multi_reduce_blocks_grow_with_the_elements() {
    let config = |items: &[usize]| default_config(&plans::multi_sum(items, DType::F32), 0, &Target::h200());
    assert_eq!(config(&[1 << 20, 3000, 7]), KernelConfig::MultiReduce { block: 256, chunk: 16_384 });
    assert_eq!(config(&[40_000_000, 40_000_000, 100]), KernelConfig::MultiReduce { block: 512, chunk: 32_768 });
}

#[test]
fn default_row_configs_follow_the_row_length() {
    let row = |plan: &Plan| match default_config(plan, 0, &Target::h200()) {
        KernelConfig::Row { threads_per_row, rows_per_block, cached } => (threads_per_row, rows_per_block, cached),
        other => panic!("{other}"),
    };
    // 64 bytes a thread: 16 f32 or 32 bf16 elements.
    assert_eq!(row(&plans::ln_relu_res(DType::F32, 16_384, 4096)), (256, 1, true));
    assert_eq!(row(&plans::ln_relu_res(DType::BF16, 16_384, 4096)), (128, 1, true));
    assert_eq!(row(&plans::ln_relu_res(DType::F32, 65_536, 1024)), (64, 1, true));
    assert_eq!(row(&plans::ln_relu_res(DType::F32, 16_384, 256)), (16, 16, true));
    // 5,120 f32 columns are 1,280 vectors: 256 threads of 5 steps leave no lane idle.
    assert_eq!(row(&plans::ln_relu_res(DType::F32, 4096, 5120)), (256, 1, true));
    assert_eq!(row(&plans::chained_layers(16, 64, 256)), (32, 1, true));
    assert!(!row(&plans::ln_relu_res(DType::F32, 64, 1 << 16)).2, "64K-column rows are re-read, not held");
    // Strided columns, adjacent rows: a thread per row.
    assert_eq!(row(&plans::mean_middle_axis(32, 1000, 64)).0, 1);
    // One reduction round: 32 bytes a thread (16 bf16 elements), twice the threads of a layer norm.
    assert_eq!(row(&plans::rms_norm_scaled(4096, 2048)), (128, 1, true));
    assert_eq!(row(&plans::rms_norm_scaled(8192, 4096)), (256, 1, true));
    // A 1024-thread block has 64 registers a thread: 50 held elements would spill, so the row is re-read.
    assert_eq!(row(&plans::rms_norm_scaled(1024, 50_257)), (1024, 1, false));
    assert_eq!(row(&plans::rms_norm_scaled(64, 32_768)), (1024, 1, true), "32 held elements fit");
}

#[test]
fn short_rows_are_also_tuned_at_a_vector_or_two_a_thread() {
    let threads = |plan: &Plan| -> Vec<(u32, u32)> {
        candidate_configs(plan, 0, &Target::h200())
            .into_iter()
            .map(|c| match c {
                KernelConfig::Row { threads_per_row, rows_per_block, .. } => (threads_per_row, rows_per_block),
                other => panic!("{other}"),
            })
            .collect()
    };
    // 1024 bf16 columns are 128 vectors of 8: the default's warp a row, and rows of 128 and of
    // 64 threads in blocks of 256.
    let bf16 = threads(&plans::ln_relu_res(DType::BF16, 32_768, 1024));
    assert_eq!(bf16[0].0, 32);
    assert!(bf16.contains(&(128, 2)) && bf16.contains(&(64, 4)), "{bf16:?}");
    // 768 columns are 96 vectors: 128 threads (a vector each, some idle) and 64.
    let short = threads(&plans::ln_relu_res(DType::BF16, 65_536, 768));
    assert!(short.contains(&(128, 2)) && short.contains(&(64, 4)), "{short:?}");
}

#[test]
fn cached_rows_read_each_input_once() {
    let plan = plans::chained_layers(16, 64, 256);
    let kernel = cuda(&plan, &default_config(&plan, 0, &Target::h200()));
    // x is loaded once; each layer's weight and bias once.
    assert_eq!(kernel.source.matches("load_f32x4(in0 +").count(), 1);
    for slot in 1..=32 {
        assert_eq!(kernel.source.matches(&format!("load_f32x4(in{slot} +")).count(), 1, "in{slot}");
    }
    assert!(!kernel.source.contains("__syncthreads"), "a warp per row needs no block barrier");
}

#[test]
fn a_residual_read_after_the_norm_is_loaded_in_the_first_pass_when_registers_allow() {
    // layer_norm(x) ... + res: `res` (in3) is only read by the last pass.
    let prefetched = |dtype: DType, cols: usize| {
        let plan = plans::ln_relu_res(dtype, 4096, cols);
        let source = cuda(&plan, &default_config(&plan, 0, &Target::h200())).source;
        let first_pass = &source[source.find("// pass 1 of").unwrap()..source.find("// pass 2 of").unwrap()];
        let early = first_pass.contains("*reinterpret_cast<const uint4*>(in3 + (v0_row + col0))");
        assert_eq!(early, source.contains("unpack_"), "{dtype:?} x {cols}: loaded early exactly when widened later");
        assert_eq!(early, !source.contains("(in3 + (v0_row + col0), "), "{dtype:?} x {cols}: loaded once");
        early
    };
    // 768 bf16 columns a warp: 24 cached elements a thread and 12 registers of raw residual.
    assert!(prefetched(DType::BF16, 768));
    assert!(prefetched(DType::F32, 1024));
    // 1024 bf16 columns a warp: two cached arrays of 32 leave no room.
    assert!(!prefetched(DType::BF16, 1024));
}

#[test]
fn multi_reduce_has_one_launch_tables_and_self_cleaning_scratch() {
    let items = [100_000, 0, 37, 5000, 16_385];
    let plan = plans::multi_sum(&items, DType::F32);
    let kernel = cuda(&plan, &default_config(&plan, 0, &Target::h200()));
    assert_eq!(kernel.launches.len(), 1);
    assert_eq!(kernel.tables[0], TableSpec::InputPointers);
    let TableSpec::Static(segments) = &kernel.tables[1] else { panic!("segments") };
    // 100,000 -> 7 segments of 16,384; 5,000 and 16,385 (2 segments) take blocks of their own;
    // 0 and 37 share a pack.
    assert_eq!(segments.len(), (7 + 1 + 2 + 2) * 32);
    let TableSpec::Static(tasks) = &kernel.tables[2] else { panic!("tasks") };
    assert_eq!(tasks.len() / 16, kernel.launches[0].grid[0] as usize);
    assert_eq!(kernel.launches[0].grid[0], 7 + 1 + 2 + 1);
    assert_eq!(
        kernel.scratch,
        vec![ScratchSpec { bytes: 12 * 8, zero_init: false }, ScratchSpec { bytes: 5 * 4, zero_init: true }]
    );
    assert!(kernel.source.contains("arrivals[seg.item] = 0u;"));
    assert!(kernel.source.contains("out0[seg.item] = result;"), "a stack is written as items finish");
    assert!(!kernel.source.contains("run_epilogue"), "a stack needs no epilogue");
    assert!(!kernel.source.contains("atomicAdd(&out"), "no float atomics");

    let small = plans::multi_mean_square(&[10, 300, 0]);
    let kernel = cuda(&small, &default_config(&small, 0, &Target::h200()));
    assert!(kernel.scratch.is_empty(), "single-segment items need no combine");
    assert_eq!(kernel.launches[0].grid[0], 1);
}

#[test]
fn multi_pointwise_is_one_launch_over_a_work_list_of_tiles() {
    // Members of 561 (f32), 1000 (bf16), 0 and 512 (f32) elements.
    let plan = plans::sgd_updates();
    let config = KernelConfig::MultiPointwise { block: 128, vec: 4, steps: 1 };
    let kernel = cuda(&plan, &config);
    // Tiles of 128 vectors of 4: 561 = 140 vectors and a tail (2 tiles, the tail in the last),
    // 1000 = 250 vectors (2), 0 (none), 512 = 128 vectors (1).
    let tiles: [(u32, u32); 5] = [(0, 0), (0, 1), (1, 0), (1, 1), (3, 0)];
    let bytes: Vec<u8> = tiles.iter().flat_map(|&(m, i)| m.to_le_bytes().into_iter().chain(i.to_le_bytes())).collect();
    assert_eq!(kernel.tables, vec![TableSpec::Static(bytes)]);
    assert_eq!(kernel.launches.len(), 1);
    let launch = &kernel.launches[0];
    assert_eq!((launch.grid, launch.block), ([5, 1, 1], [128, 1, 1]));
    assert_eq!(launch.params.len(), plan.kernels[0].inputs.len() + plan.kernels[0].outputs.len() + 1);
    assert_eq!(launch.params.last(), Some(&Param::Table(0)));
    assert!(kernel.source.contains("if (task.index == 1u && threadIdx.x < 1u)"), "the tail in the last tile");
    assert!(kernel.source.contains("load_bf16x4(in3 + i0, ld0);"), "aligned members load vectors");
    assert!(!kernel.source.contains("case 2u"), "an empty member has no case");

    // By default tiles are as large as leave two blocks per SM: these members are small.
    let default = default_config(&plan, 0, &Target::h200());
    assert_eq!(default, KernelConfig::MultiPointwise { block: 256, vec: 8, steps: 1 });
}

#[test]
fn multi_reduce_epilogue_runs_once_after_the_last_item() {
    // Three programs (bf16 and f32 squares; the f32 ones share one), chunked items, and the norm
    // and clip scale computed by the epilogue.
    let plan = plans::multi_grad_norm(&[70_000, 33, 0], &[4096, 1, 20_000]);
    let kernel = cuda(&plan, &default_config(&plan, 0, &Target::h200()));
    assert_eq!(plan.kernels.len(), 1, "{plan}");
    assert_eq!(kernel.launches.len(), 1);
    assert!(kernel.source.contains("switch (task.reduction)"));
    assert_eq!(kernel.source.matches("case ").count(), 2);
    // Results are parked, finished items counted, and the thread that finishes the last one
    // runs the epilogue, written once at the end of the kernel, and leaves the counter zeroed.
    assert!(kernel.source.contains("*reinterpret_cast<float*>(&results[seg.item]) = result;"));
    assert_eq!(kernel.source.matches("if (atomicAdd(finished, 1u) == 5u) run_epilogue = true;").count(), 2 * 3);
    let epilogue = &kernel.source[kernel.source.find("if (run_epilogue)").unwrap()..];
    assert_eq!(epilogue.matches("&results[").count(), 6, "{epilogue}");
    assert!(epilogue.contains("sqrtf("), "{epilogue}");
    assert!(epilogue.contains("out0[0] = ") && epilogue.contains("out1[0] = "), "{epilogue}");
    assert!(epilogue.contains("*finished = 0u;"));
    assert!(!kernel.source.contains("__noinline__"), "no call, no stack frame");
    let n = kernel.scratch.len();
    assert_eq!(kernel.scratch[n - 2], ScratchSpec { bytes: 6 * 8, zero_init: false });
    assert_eq!(kernel.scratch[n - 1], ScratchSpec { bytes: 4, zero_init: true });
    let launch = &kernel.launches[0];
    assert_eq!(launch.params[..2], [Param::Output(0), Param::Output(1)]);
    assert_eq!(launch.params[launch.params.len() - 2..], [Param::Scratch(n - 2), Param::Scratch(n - 1)]);

    // Bool results of f32 and f16 programs folded with or.
    let plan = plans::multi_any_non_finite(&[1000, 40_000, 7], &[300, 0]);
    let kernel = cuda(&plan, &default_config(&plan, 0, &Target::h200()));
    assert!(kernel.source.contains("*reinterpret_cast<bool*>(&results[seg.item]) = result;"));
    assert!(kernel.source.contains("if (atomicAdd(finished, 1u) == 4u) run_epilogue = true;"));
}

#[test]
fn multi_reduce_items_of_two_leaves_read_both_side_by_side() {
    let plan = plans::multi_two_leaves(&[50_000, 3, 0], &[1000, 20_000]);
    let KernelKind::MultiReduce(mr) = &plan.kernels[0].kind else { panic!("a multi-reduce\n{plan}") };
    assert_eq!((mr.items.len(), plan.kernels[0].inputs.len()), (5, 10), "{plan}");
    let kernel = cuda(&plan, &default_config(&plan, 0, &Target::h200()));
    // Item i's leaves are input slots 2i and 2i + 1.
    let firsts: Vec<u8> = [0u32, 2, 4, 6, 8].iter().flat_map(|f| f.to_le_bytes()).collect();
    assert_eq!(kernel.tables[3], TableSpec::Static(firsts));
    assert!(kernel.source.contains("const unsigned* __restrict__ item_inputs"));
    assert!(kernel.source.contains("static_cast<const float*>(item_ptrs[item_inputs[seg.item] + 1u]) + seg.start;"));
    assert!(kernel.source.contains("load_f32x4(items1 + (j * 4u), x1);"), "both leaves load vectors");
    assert!(kernel.source.contains("load_bf16x8(items0 + (j * 8u), x0);"));
    assert_eq!(kernel.launches[0].params.last(), Some(&Param::Scratch(kernel.scratch.len() - 1)));
    assert!(kernel.launches[0].params.contains(&Param::Table(3)));
    // Items of one leaf keep the plain pointer table.
    let plan = plans::multi_sum(&[10, 20], DType::F32);
    let kernel = cuda(&plan, &default_config(&plan, 0, &Target::h200()));
    assert_eq!(kernel.tables.len(), 3);
    assert!(!kernel.source.contains("item_inputs"));
}

#[test]
fn concat_copies_16_bytes_at_a_time_where_runs_allow() {
    let plan = plans::concat(&[10, 6, 16], DType::F32);
    let kernel = cuda(&plan, &default_config(&plan, 0, &Target::h200()));
    assert!(kernel.source.contains("*reinterpret_cast<uint4*>(&out0[i])"));
    let many = plans::concat(&[3; 20], DType::BF16);
    let kernel = cuda(&many, &default_config(&many, 0, &Target::h200()));
    assert_eq!(kernel.launches[0].grid[1], 20);
    assert_eq!(kernel.tables[0], TableSpec::InputPointers);
    assert_eq!(kernel.launches[0].params, vec![Param::Output(0), Param::Table(0), Param::Table(1)]);
}

#[test]
fn matmul_goes_to_cublaslt() {
    let plan = plans::matmul();
    assert_eq!(default_config(&plan, 0, &Target::h200()), KernelConfig::Library { algorithm: 0 });
    assert!(
        matches!(generate(&plan, 0, &KernelConfig::Library { algorithm: 0 }, &Target::h200()).unwrap(), KernelCode::CuBlasLt(m) if m.k == 128)
    );
    // Max-autotune's candidates are the heuristic's first eight algorithms, its own pick first;
    // each is the same library call.
    let candidates = candidate_configs(&plan, 0, &Target::h200());
    assert_eq!(candidates, (0..8).map(|algorithm| KernelConfig::Library { algorithm }).collect::<Vec<_>>());
    for config in &candidates {
        assert!(matches!(generate(&plan, 0, config, &Target::h200()).unwrap(), KernelCode::CuBlasLt(_)));
    }
    assert_eq!(candidates[0].to_string(), "library call");
    assert_eq!(candidates[3].to_string(), "library call algorithm=3");
}

#[test]
fn errors_name_the_kernel_and_the_problem() {
    let plan = plans::pointwise_broadcast_f32();
    let err = generate(&plan, 0, &KernelConfig::Concat { block: 256 }, &Target::h200()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "kernel `pointwise_mul_add_relu_f32_0` is a pointwise kernel but was given a concat config"
    );
    let err = generate(&plan, 0, &KernelConfig::Pointwise { block: 100, vec: 4, grid_limit: 8 }, &Target::h200())
        .unwrap_err();
    assert!(matches!(err, CodegenError::InvalidConfig { .. }));
    assert!(matches!(
        generate(&plan, 3, &KernelConfig::Library { algorithm: 0 }, &Target::h200()),
        Err(CodegenError::NoSuchKernel { index: 3, count: 1 })
    ));
    let too_wide = KernelConfig::Row { threads_per_row: 32, rows_per_block: 1, cached: true };
    let err = generate(&plans::ln_relu_res(DType::F32, 8, 4096), 0, &too_wide, &Target::h200()).unwrap_err();
    assert!(err.to_string().contains("would spill"), "{err}");
    assert!(matches!(
        plan_sources(&plan, &[], &Target::h200()),
        Err(CodegenError::ConfigCount { configs: 0, kernels: 1 })
    ));
}

#[test]
fn sources_list_ops_with_locations() {
    let plan = plans::ln_relu_res(DType::BF16, 128, 4096);
    let kernel = cuda(&plan, &default_config(&plan, 0, &Target::h200()));
    assert!(kernel.source.starts_with("// braze kernel `row_layer_norm_relu_add_bf16_0`"));
    // The ops a composite decomposes into keep its location; later ops have their own.
    assert!(kernel.source.contains("//   layer_norm/sum examples/model.rs:10:17"));
    assert!(kernel.source.contains("//   relu           examples/model.rs:11:17"));
    // 128 threads a block, eight of them an SM (ROW_RESIDENT_THREADS): 64 registers a thread.
    assert!(kernel.source.contains(
        "extern \"C\" __global__ void __launch_bounds__(128 BRAZE_MIN_BLOCKS(8)) row_layer_norm_relu_add_bf16_0("
    ));
    let hints = braze_codegen::occupancy_hints(&kernel.source);
    assert_eq!(
        hints.iter().map(|h| (h.kernel.as_str(), h.block, h.blocks, h.cap())).collect::<Vec<_>>(),
        [("row_layer_norm_relu_add_bf16_0", 128, 8, 64)]
    );
    assert!(!kernel.source.contains("#include"));
}

#[test]
fn grids_follow_the_target() {
    // A GPU with half the SMs: pointwise grid limits and persistent concat grids halve.
    let half = Target { name: "half".into(), sm_count: 66, ..Target::h200() };
    let plan = plans::ew_chain(DType::F32, 1 << 26);
    let limits = |target: &Target| -> Vec<u32> {
        candidate_configs(&plan, 0, target)
            .iter()
            .map(|c| match c {
                KernelConfig::Pointwise { grid_limit, .. } => *grid_limit,
                other => panic!("{other}"),
            })
            .collect()
    };
    assert!(limits(&Target::h200()).contains(&(132 * 1024)));
    assert_eq!(limits(&half), limits(&Target::h200()).iter().map(|l| l / 2).collect::<Vec<_>>());
    let big = plans::concat(&[16_384, 16_384], DType::F32);
    let grid = |target: &Target| match generate(&big, 0, &KernelConfig::Concat { block: 256 }, target).unwrap() {
        KernelCode::Cuda(kernel) => kernel.launches[0].grid[0],
        KernelCode::CuBlasLt(_) => panic!("expected CUDA source"),
    };
    assert_eq!(grid(&Target::h200()), 132 * 8);
    assert_eq!(grid(&half), 66 * 8);
}

#[test]
fn column_kernels_tile_columns_split_rows_and_clean_their_scratch() {
    // 4096 x 1024 f32: 4 columns per thread, 16 threads across 64 columns (16 tiles: a warp
    // across 128 would leave 8, each folding twice the chunks), rows split into enough chunks to
    // fill the GPU; partials per chunk and column, counters per tile.
    let plan = plans::bias_grad(4096, 1024);
    let config = default_config(&plan, 0, &Target::h200());
    let KernelConfig::Column { col_threads, row_threads, vec, rows_per_block } = config else { panic!("{config}") };
    assert_eq!((col_threads, row_threads, vec), (16, 16, 4));
    let kernel = cuda(&plan, &config);
    let launch = &kernel.launches[0];
    let chunks = 4096usize.div_ceil(rows_per_block as usize) as u32;
    assert!(chunks > 1, "{config}");
    assert_eq!((launch.grid, launch.block), ([16, chunks, 1], [256, 1, 1]));
    assert_eq!(launch.params, vec![Param::Input(0), Param::Output(0), Param::Scratch(0), Param::Scratch(1)]);
    assert_eq!(
        kernel.scratch,
        vec![
            ScratchSpec { bytes: chunks as usize * 1024 * 4, zero_init: false },
            ScratchSpec { bytes: 16 * 4, zero_init: true }
        ]
    );
    // Whole tiles load a batch of rows' vectors before folding any (all in flight at once).
    assert!(kernel.source.contains("load_f32x4(in0 + (r * 1024u + c0), ld0[b]);"), "{}", kernel.source);
    assert!(kernel.source.contains("float ld0[8][4];"), "{}", kernel.source);
    assert!(kernel.source.contains("for (unsigned half = 8u; half > 0u; half >>= 1)"), "{}", kernel.source);
    assert!(kernel.source.contains("arrivals[blockIdx.x] = 0u;"));
    assert!(!kernel.source.contains("atomicAdd(&out"), "no float atomics");

    // Few rows: one chunk, no scratch, each block (two tiles of 16 columns) stores directly.
    let small = plans::bias_grad(64, 32);
    let kernel = cuda(&small, &default_config(&small, 0, &Target::h200()));
    assert_eq!(kernel.launches[0].grid, [2, 1, 1]);
    assert!(kernel.scratch.is_empty() && !kernel.source.contains("atomicAdd"));

    // Two reductions of bf16 rows: 8 columns per 16-byte load, f32 partials for each.
    let grads = plans::norm_weight_bias_grads_bf16(8, 512, 768);
    let config = default_config(&grads, 0, &Target::h200());
    assert!(matches!(config, KernelConfig::Column { vec: 8, .. }), "{config}");
    let kernel = cuda(&grads, &config);
    assert_eq!(kernel.scratch.len(), 3);
    assert!(kernel.source.contains("load_bf16x8("), "{}", kernel.source);

    // Seven columns: one per thread, read by index math.
    let odd = plans::column_max(65_536, 7);
    let config = default_config(&odd, 0, &Target::h200());
    assert!(matches!(config, KernelConfig::Column { col_threads: 8, vec: 1, .. }), "{config}");
    assert!(cuda(&odd, &config).launches[0].grid[1] >= 132, "rows spread over the SMs");
}

#[test]
fn column_configs_are_checked() {
    let plan = plans::bias_grad(64, 32);
    let bad = |config: KernelConfig| generate(&plan, 0, &config, &Target::h200()).unwrap_err();
    let err = bad(KernelConfig::Column { col_threads: 8, row_threads: 2, vec: 4, rows_per_block: 8 });
    assert!(err.to_string().contains("a block of 16 threads"), "{err}");
    let err = bad(KernelConfig::Column { col_threads: 32, row_threads: 1, vec: 3, rows_per_block: 8 });
    assert!(err.to_string().contains("vec 3"), "{err}");
    let err = bad(KernelConfig::Column { col_threads: 32, row_threads: 8, vec: 4, rows_per_block: 0 });
    assert!(err.to_string().contains("rows_per_block"), "{err}");
    let err = bad(KernelConfig::Row { threads_per_row: 32, rows_per_block: 1, cached: false });
    assert!(matches!(err, CodegenError::ConfigMismatch { family: "column", .. }), "{err}");
}

#[test]
fn bf16_rounds_in_hardware_from_sm_80_and_portably_before() {
    let plan = plans::ew_chain(DType::BF16, 1 << 20);
    let hopper = cuda(&plan, &default_config(&plan, 0, &Target::h200()));
    assert!(hopper.source.contains("cvt.rn.bf16x2.f32"), "{}", hopper.source);
    assert!(hopper.source.contains("w.x = bf16x2_bits(v[1], v[0]);"));
    let turing = Target { name: "turing".into(), compute_capability: (7, 5), ..Target::h200() };
    let old = match generate(&plan, 0, &default_config(&plan, 0, &turing), &turing).unwrap() {
        KernelCode::Cuda(kernel) => kernel,
        other => panic!("expected CUDA C, got {other:?}"),
    };
    assert!(!old.source.contains("cvt.rn.bf16"), "sm_75 has no bf16 conversion instruction");
    assert!(old.source.contains("(bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16"));
}

/// Attention kernels index with 64 bits once an operand reaches 2^31 elements, launch one block
/// per row tile of each (batch, head) pair, ask for their shared memory dynamically, and have no
/// launch for an empty sequence.
#[test]
fn attention_launches_and_index_width() {
    use braze_ir::AttentionInput;
    let big = plans::attention_forward(DType::BF16, [64, 64, 8192, 64], true);
    let kernel = cuda(&big, &default_config(&big, 0, &Target::h200()));
    assert!(kernel.source.contains("64-bit index math"), "{}", kernel.source);
    let small = plans::attention_forward(DType::BF16, [16, 12, 1024, 64], true);
    let config = KernelConfig::Attention { warps: 4, rows_per_warp: 8, tensor_cores: false, stages: 1 };
    let kernel = cuda(&small, &config);
    assert!(kernel.source.contains("32-bit index math"));
    let launch = &kernel.launches[0];
    assert_eq!(launch.grid, [16 * 12 * (1024 / 32), 1, 1]);
    assert_eq!(launch.block, [128, 1, 1]);
    // 32 query rows, a key and a value tile of 32 padded rows, as f32.
    assert_eq!(launch.shared_bytes, (32 * 64 + 2 * 32 * 65) * 4);
    assert!(kernel.source.contains("__launch_bounds__(128)"));
    for wrt in [vec![AttentionInput::Query], vec![AttentionInput::Key, AttentionInput::Value]] {
        let empty = plans::attention_backward(DType::F16, [2, 3, 0, 64], false, &wrt);
        assert!(cuda(&empty, &default_config(&empty, 0, &Target::h200())).launches.is_empty());
    }
    // Configs of another family are refused.
    let wrong = KernelConfig::AttentionBackward { warps: 4, rows_per_warp: 8, tensor_cores: false, stages: 1 };
    assert!(matches!(generate(&small, 0, &wrong, &Target::h200()), Err(CodegenError::ConfigMismatch { .. })));
}

/// The tensor-core forward: the default for bf16/f16 on sm_80+, the FMA configs after it.
#[test]
fn snapshot_of_the_tensor_core_attention_forward() {
    let plan = plans::attention_forward(DType::BF16, [16, 12, 1024, 64], true);
    let config = KernelConfig::Attention { warps: 4, rows_per_warp: 16, tensor_cores: true, stages: 1 };
    // Two row blocks a warp and two stages first at head dim 64; one row block a warp after.
    let default = KernelConfig::Attention { warps: 4, rows_per_warp: 32, tensor_cores: true, stages: 2 };
    let candidates = candidate_configs(&plan, 0, &Target::h200());
    assert_eq!(candidates[0], default, "{candidates:?}");
    assert!(candidates.contains(&config), "{candidates:?}");
    assert!(candidates.iter().any(|c| matches!(c, KernelConfig::Attention { tensor_cores: false, .. })));
    let kernel = snapshot_with("attention_causal_bf16_d64_tensor_cores", &plan, &config);
    for instruction in ["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "ldmatrix", "cp.async.cg"] {
        assert!(kernel.source.contains(instruction), "{instruction}");
    }
    // 64 query rows, 64 keys and 64 values, rows of 64 + 8 bf16.
    assert_eq!(kernel.launches[0].shared_bytes, (64 + 128) * 72 * 2);
    assert_eq!(kernel.launches[0].grid, [16 * 12 * 16, 1, 1]);
    // 128 query rows and two slots of 64 keys and 64 values.
    let kernel = cuda(&plan, &default);
    assert_eq!(kernel.launches[0].shared_bytes, (128 + 2 * 128) * 72 * 2);
    assert_eq!(kernel.launches[0].grid, [16 * 12 * 8, 1, 1]);
    // Two row blocks a warp do not fit a head dim of 128 in registers: refused, not a candidate.
    let wide = plans::attention_forward(DType::BF16, [1, 1, 64, 128], false);
    assert!(generate(&wide, 0, &default, &Target::h200()).is_err());
    assert!(candidate_configs(&wide, 0, &Target::h200())
        .iter()
        .all(|c| !matches!(c, KernelConfig::Attention { rows_per_warp: 32, tensor_cores: true, .. })));
    // Not for f32, nor before sm_80, nor head dims that are no multiple of 16.
    let f32_plan = plans::attention_forward(DType::F32, [1, 1, 64, 64], true);
    let ampere_less = Target { compute_capability: (7, 5), ..Target::h200() };
    let odd_head = plans::attention_forward(DType::BF16, [1, 1, 64, 72 + 1], false);
    for (plan, target) in [(&f32_plan, Target::h200()), (&plan, ampere_less), (&odd_head, Target::h200())] {
        let candidates = candidate_configs(plan, 0, &target);
        assert!(candidates.iter().all(|c| !matches!(c, KernelConfig::Attention { tensor_cores: true, .. })));
        assert!(generate(plan, 0, &config, &target).is_err());
    }
}

/// The tensor-core backward: the default for bf16/f16 on sm_80+ (the snapshots of the fixture
/// plans are these kernels), the FMA configs after it, and refused where it cannot run.
#[test]
fn the_tensor_core_attention_backward_is_the_default_where_it_applies() {
    use braze_ir::AttentionInput::{Key, Query, Value};
    let dq = plans::attention_backward(DType::BF16, [16, 12, 1024, 64], true, &[Query]);
    let config = KernelConfig::AttentionBackward { warps: 4, rows_per_warp: 16, tensor_cores: true, stages: 1 };
    let candidates = candidate_configs(&dq, 0, &Target::h200());
    // At head dims up to 64 dq leads with two row blocks a warp in two stages, one block in one
    // stage next; two blocks walk tiles of 32: 128 rows and their output gradients, two slots of
    // a key and a value tile.
    let two_blocks = KernelConfig::AttentionBackward { warps: 4, rows_per_warp: 32, tensor_cores: true, stages: 2 };
    assert_eq!(candidates[..2], [two_blocks, config], "{candidates:?}");
    let kernel = cuda(&dq, &two_blocks);
    assert_eq!(kernel.launches[0].shared_bytes, 2 * 128 * 72 * 2 + 2 * (2 * 32 * 72 * 2));
    assert_eq!(kernel.launches[0].grid, [16 * 12 * 8, 1, 1]);
    assert!(candidates.iter().any(|c| matches!(c, KernelConfig::AttentionBackward { tensor_cores: false, .. })));
    let kernel = cuda(&dq, &config);
    for instruction in ["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "ldmatrix_x4_trans(", "cp.async.cg"] {
        assert!(kernel.source.contains(instruction), "{instruction}");
    }
    // 64 query rows and their output gradients, a key and a value tile of 64, rows of 64 + 8.
    assert_eq!(kernel.launches[0].shared_bytes, 2 * (64 + 64) * 72 * 2);
    assert_eq!(kernel.launches[0].grid, [16 * 12 * 16, 1, 1]);
    // dk/dv also stage the tile's lse and delta; head dim 128 walks tiles of 32.
    let dkdv = plans::attention_backward(DType::F16, [1, 2, 17, 128], false, &[Key, Value]);
    let kernel = cuda(&dkdv, &config);
    assert_eq!(kernel.launches[0].shared_bytes, 2 * (64 + 32) * 136 * 2 + 2 * 32 * 4);
    assert!(kernel.source.contains("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"));
    // Where two row blocks do not fit (head dim 128), dq leads with one block in one stage.
    let wide_dq = plans::attention_backward(DType::F16, [1, 2, 17, 128], false, &[Query]);
    assert_eq!(candidate_configs(&wide_dq, 0, &Target::h200())[0], config);
    // dk/dv default to two stages (their tiles of the walked side are the larger share).
    let two_stages = KernelConfig::AttentionBackward { warps: 4, rows_per_warp: 16, tensor_cores: true, stages: 2 };
    assert_eq!(candidate_configs(&dkdv, 0, &Target::h200())[0], two_stages);
    // Only the requested gradient is computed: dv alone needs no dP.
    let dv = plans::attention_backward(DType::BF16, [1, 1, 17, 64], true, &[Value]);
    let kernel = cuda(&dv, &config);
    assert!(!kernel.source.contains("dpt"), "{}", kernel.source);
    assert!(!kernel.source.contains("out1"));
    // Not for f32, nor before sm_80, nor head dims that are no multiple of 16; 16 rows a warp.
    let f32_plan = plans::attention_backward(DType::F32, [1, 1, 64, 64], true, &[Query]);
    let ampere_less = Target { compute_capability: (7, 5), ..Target::h200() };
    let odd_head = plans::attention_backward(DType::BF16, [1, 1, 64, 72 + 1], false, &[Query]);
    for (plan, target) in [(&f32_plan, Target::h200()), (&dq, ampere_less), (&odd_head, Target::h200())] {
        let candidates = candidate_configs(plan, 0, &target);
        assert!(candidates.iter().all(|c| !matches!(c, KernelConfig::AttentionBackward { tensor_cores: true, .. })));
        assert!(generate(plan, 0, &config, &target).is_err());
    }
    let eight_rows = KernelConfig::AttentionBackward { warps: 4, rows_per_warp: 8, tensor_cores: true, stages: 1 };
    assert!(generate(&dq, 0, &eight_rows, &Target::h200()).is_err());
    // Two tiles in shared memory (the next one's copies in flight) is a candidate: twice the
    // walked side's shared memory; three stages, or two on the CUDA-core kernels, are refused.
    let two = KernelConfig::AttentionBackward { warps: 4, rows_per_warp: 16, tensor_cores: true, stages: 2 };
    assert!(candidates.contains(&two), "{candidates:?}");
    assert_eq!(cuda(&dq, &two).launches[0].shared_bytes, (2 * 64 + 2 * 2 * 64) * 72 * 2);
    assert_eq!(cuda(&dkdv, &two).launches[0].shared_bytes, 2 * 64 * 136 * 2 + 2 * (2 * 32 * 136 * 2 + 2 * 32 * 4));
    assert!(cuda(&dq, &two).source.contains("slot ^= 1"));
    let three = KernelConfig::AttentionBackward { warps: 4, rows_per_warp: 16, tensor_cores: true, stages: 3 };
    let fma_two = KernelConfig::AttentionBackward { warps: 4, rows_per_warp: 8, tensor_cores: false, stages: 2 };
    for config in [three, fma_two] {
        let err = generate(&dq, 0, &config, &Target::h200()).unwrap_err().to_string();
        assert!(err.contains("stage"), "{config}: {err}");
    }
}

#[test]
fn index_add_rows_are_owned_by_warps_and_written_once() {
    let plan = plans::index_add(DType::F32, DType::I64, 1, 16_384, 768, 50_304);
    let config = default_config(&plan, 0, &Target::h200());
    assert_eq!(config, KernelConfig::IndexAdd { warps: 16, rows_per_warp: 2, chunk: 4096, columns: 1024 });
    let kernel = cuda(&plan, &config);
    // A block per 32 rows, every row of 768 columns in one slice of 16-byte accesses.
    assert_eq!(
        (kernel.launches[0].grid, kernel.launches[0].block),
        ([50_304usize.div_ceil(32) as u32, 1, 1], [512, 1, 1])
    );
    assert!(kernel.source.contains("load_f32x4(src + v * 128u, ld);"));
    assert_eq!(kernel.source.matches("store_f32x4(into").count(), 2, "each of a warp's two rows stored once");
    assert!(!kernel.source.contains("atomicAdd("), "deterministic: no atomics");
    assert!(kernel.scratch.is_empty() && kernel.tables.is_empty());

    // No indices: one launch that writes zeros, no scan.
    let none = cuda(&plans::index_add(DType::F32, DType::I64, 2, 0, 16, 5), &config);
    assert_eq!(none.launches.len(), 1);
    assert!(!none.source.contains("__ballot_sync") && none.source.contains("store_f32x4(into"));
    // No rows or no columns: nothing to launch.
    for (size, inner) in [(0, 16), (5, 0)] {
        let empty = cuda(&plans::index_add(DType::F32, DType::I64, 1, 4, inner, size), &config);
        assert!(empty.launches.is_empty(), "size {size} inner {inner}");
    }
    // Inner extents that are no multiple of a vector: narrower accesses, lanes past the end idle.
    let odd = cuda(&plans::index_add(DType::BF16, DType::I32, 3, 1000, 100, 77), &config);
    assert!(odd.source.contains("load_bf16x4(") && odd.source.contains("if (column + v * 128u < INNER)"));
    let odd = cuda(&plans::index_add(DType::F32, DType::I32, 2, 37, 7, 5), &config);
    assert!(!odd.source.contains("load_f32x") && odd.source.contains("src[v * 32u]"));

    let bad = |warps, rows_per_warp, chunk, columns| {
        let config = KernelConfig::IndexAdd { warps, rows_per_warp, chunk, columns };
        generate(&plan, 0, &config, &Target::h200()).unwrap_err().to_string()
    };
    assert!(bad(0, 1, 1024, 256).contains("warps"));
    assert!(bad(8, 32, 1024, 256).contains("rows a block"));
    assert!(bad(8, 1, 1000, 256).contains("chunk"));
    assert!(bad(8, 1, 1024, 100).contains("columns"));
    assert!(bad(32, 2, 4096, 1024).contains("do not fit"));
}

/// The code of a pointwise kernel made to read its element count at run time, without the lines
/// that are only comments: what NVRTC compiles (the kernel cache's unit).
fn code_lines(kernel: &GeneratedKernel) -> Vec<&str> {
    kernel.source.lines().filter(|l| !l.trim_start().starts_with("//")).collect()
}

/// An eager op's pointwise kernel may read its element count at run time: its code is then the
/// same at every size (one NVRTC compile serves them all), the count in a table the runtime
/// uploads, the elements past the last whole vector in a tail computed at run time. A broadcast
/// along an axis, or a domain without elements, keeps the literal count.
#[test]
fn a_pointwise_kernel_reading_its_element_count_at_run_time_is_the_same_code_at_every_size() {
    let at = |n: usize| {
        let plan = plans::ew_chain(DType::BF16, n);
        let config = braze_codegen::any_extent_config(&plan, 0, &Target::h200()).expect("contiguous loads");
        assert!(matches!(config, KernelConfig::PointwiseAnyExtent { vec: 8, .. }), "{config}");
        cuda(&plan, &config)
    };
    // (A domain of one element has code of its own: every load is then of one element.)
    let sizes = [2usize, 15, 17, 1000, 1 << 20];
    let kernels: Vec<GeneratedKernel> = sizes.iter().map(|&n| at(n)).collect();
    for (kernel, &n) in kernels.iter().zip(&sizes) {
        assert_eq!(code_lines(kernel), code_lines(&kernels[0]), "n = {n}");
        assert_eq!(kernel.tables, vec![TableSpec::Static((n as u64).to_le_bytes().to_vec())]);
        assert_eq!(kernel.launches[0].params.last(), Some(&Param::Table(0)));
        let threads = n.div_ceil(8).max(1);
        assert_eq!(kernel.launches[0].grid[0] as usize, threads.div_ceil(256), "n = {n}");
    }
    let source = &kernels[3].source;
    assert!(source.contains("const idx_t NUMEL = (idx_t)extent[0];"), "{source}");
    assert!(source.contains("const idx_t tail_start = NUMEL / 8u * 8u;"), "{source}");
    settings().bind(|| insta::assert_snapshot!("pointwise_ew_chain_bf16_any_extent", source));

    let broadcast = plans::pointwise_broadcast_f32();
    assert_eq!(braze_codegen::any_extent_config(&broadcast, 0, &Target::h200()), None);
    assert_eq!(braze_codegen::any_extent_config(&plans::pointwise_empty(), 0, &Target::h200()), None);
    let refused = generate(&broadcast, 0, &KernelConfig::PointwiseAnyExtent { block: 256, vec: 4 }, &Target::h200());
    assert!(matches!(refused, Err(CodegenError::InvalidConfig { .. })), "{refused:?}");
}

/// An eager full reduction is a multi-reduce item however short (a row kernel of its own size
/// otherwise): its work list is a table, so its code is the same at every size that fits one
/// segment, and at every size cut into several (which adds the partials' combine): two units
/// serve every size.
#[test]
fn an_eager_full_reduction_is_the_same_code_at_every_size() {
    let at = |n: usize| {
        let plan = plans::eager_sum(n);
        assert!(matches!(plan.kernels[0].kind, KernelKind::MultiReduce(_)), "n = {n}:\n{plan}");
        cuda(&plan, &default_config(&plan, 0, &Target::h200()))
    };
    for sizes in [&[1usize, 5, 1000, 16_384][..], &[16_385, 100_000, 3_000_000]] {
        let kernels: Vec<GeneratedKernel> = sizes.iter().map(|&n| at(n)).collect();
        for (kernel, n) in kernels.iter().zip(sizes) {
            assert_eq!(code_lines(kernel), code_lines(&kernels[0]), "n = {n}");
        }
    }
    // Without the option a short sum is a row kernel of its own size.
    let mut g = plans::GraphBuilder::default();
    let x = g.input(DType::F32, &[1000]);
    let s = g.op(braze_ir::Op::Reduce { op: braze_ir::ReduceOp::Sum, axes: vec![0], keepdim: false }, &[x]);
    assert!(matches!(g.compile(&[s]).kernels[0].kind, KernelKind::Row(_)));
}

/// GELU of a bf16 value takes its narrow form (less arithmetic than f32's accuracy needs), except
/// beside an f32 derivative of the same value, where the exact form computes one Gaussian for both.
#[test]
fn gelu_of_16_bit_values_is_narrow_unless_an_exact_gaussian_shares_the_kernel() {
    let n = 4096;
    let alone = {
        let mut g = plans::GraphBuilder::default();
        let x = g.input(DType::BF16, &[n]);
        let y = g.unary(braze_ir::UnaryOp::GeluErf, x);
        g.compile(&[y])
    };
    let source = cuda(&alone, &default_config(&alone, 0, &Target::h200())).source;
    assert!(source.contains("gelu_erf_narrow_f32(") && !source.contains("normal_cdf_f32("), "{source}");
    let beside = {
        let mut g = plans::GraphBuilder::default();
        let x = g.input(DType::BF16, &[n]);
        let y = g.unary(braze_ir::UnaryOp::GeluErf, x);
        let wide = g.cast(x, DType::F32);
        let d = g.unary(braze_ir::UnaryOp::GeluErfGrad, wide);
        g.compile(&[y, d])
    };
    assert_eq!(beside.kernels.len(), 1, "{beside}");
    let source = cuda(&beside, &default_config(&beside, 0, &Target::h200())).source;
    assert!(source.contains("gelu_erf_f32(") && !source.contains("narrow"), "{source}");
}

/// A column kernel whose vector width divides the columns has no partial tile, so it emits no
/// per-element fallback loop (dead code that held registers); a width that does not divide
/// them keeps the fallback for the last tile.
#[test]
fn column_kernels_emit_a_partial_tile_loop_only_when_a_tile_can_be_partial() {
    let whole = plans::bias_grad(4096, 1024);
    let config = default_config(&whole, 0, &Target::h200());
    let KernelConfig::Column { vec, .. } = config else { panic!("{config}") };
    assert!(vec > 1 && 1024 % vec == 0, "{config}");
    let source = cuda(&whole, &config).source;
    assert!(!source.contains("columns past the end") && !source.contains("<= COLS)"), "{source}");
    let partial = plans::bias_grad(4096, 1022);
    let config = KernelConfig::Column { col_threads: 32, row_threads: 8, vec: 4, rows_per_block: 512 };
    let source = cuda(&partial, &config).source;
    assert!(source.contains("columns past the end"), "{source}");
}
