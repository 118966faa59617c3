//! CUDA graph capture and replay on a real GPU.

mod common;

use braze_cuda::{bytes_of, CudaError, KernelArg};

const SCALE_ADD: &str = r#"
extern "C" __global__ void scale_add(float* y, const float* x, float s, float t, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = s * x[i] + t;
}
"#;

#[test]
fn captured_graph_replays_with_new_inputs_and_keeps_buffers_alive() {
    let Some(device) = common::gpu() else { return };
    let kernel = common::load_kernel(&device, SCALE_ADD, "scale_add");
    let n = 100_000usize;
    let grid = ((n as u32).div_ceil(256), 1, 1);
    let x = device.upload_values(&common::random_floats(n, 10)).unwrap();
    let hidden = device.alloc(n * 4).unwrap();
    let out = device.alloc(n * 4).unwrap();
    let scratch = device.alloc(n * 4).unwrap();
    device.memset_d8(&out, 0xFF).unwrap();

    let graph = device
        .capture_graph(|| {
            device.memset_d8(&hidden, 0xFF)?;
            let first = [
                KernelArg::Buffer(&hidden),
                KernelArg::Buffer(&x),
                KernelArg::F32(2.0),
                KernelArg::F32(1.0),
                KernelArg::I32(n as i32),
            ];
            device.launch(&kernel, grid, (256, 1, 1), 0, &first)?;
            let second = [
                KernelArg::Buffer(&scratch),
                KernelArg::Buffer(&hidden),
                KernelArg::F32(3.0),
                KernelArg::F32(0.0),
                KernelArg::I32(n as i32),
            ];
            device.launch(&kernel, grid, (256, 1, 1), 0, &second)?;
            device.copy(&scratch, 0, &out, 0, n * 4)
        })
        .unwrap();
    assert_eq!(graph.kernel_launches(), 2);
    assert_eq!(graph.retained_buffers(), 4);

    // Capturing records the work without running it.
    let untouched: Vec<f32> = device.download_values(&out).unwrap();
    assert!(untouched.iter().all(|v| v.is_nan()));

    // The caller's handles to the intermediate buffers go away; the graph keeps them alive.
    drop((hidden, scratch));
    let allocations = device.allocation_count();
    graph.prepare().unwrap();
    for seed in 11..14 {
        let input = common::random_floats(n, seed);
        device.upload_into(&x, 0, bytes_of(&input)).unwrap();
        device.memset_d8(&out, 0xFF).unwrap();
        graph.replay().unwrap();
        let expected: Vec<f32> = input.iter().map(|v| 3.0 * (2.0 * v + 1.0)).collect();
        common::assert_close(&device.download_values::<f32>(&out).unwrap(), &expected, 1e-5, 1e-6);
    }
    assert_eq!(device.allocation_count(), allocations);
}

/// A graph captured reading an input does not hold it: the caller may free it, and a replay is
/// given an input at the captured address (or refused with the addresses named).
#[test]
fn a_graph_reading_inputs_replays_only_at_their_addresses_and_does_not_hold_them() {
    let Some(device) = common::gpu() else { return };
    let kernel = common::load_kernel(&device, SCALE_ADD, "scale_add");
    let n = 4096usize;
    let x = device.upload_values(&common::random_floats(n, 30)).unwrap();
    let other = device.upload_values(&common::random_floats(n, 31)).unwrap();
    let y = device.alloc(n * 4).unwrap();
    let args = [
        KernelArg::Buffer(&y),
        KernelArg::Buffer(&x),
        KernelArg::F32(2.0),
        KernelArg::F32(1.0),
        KernelArg::I32(n as i32),
    ];
    let graph = device
        .capture_graph_reading(std::slice::from_ref(&x), || device.launch(&kernel, (16, 1, 1), (256, 1, 1), 0, &args))
        .unwrap();
    assert!(x.is_only_handle(), "the graph holds the input it reads");
    assert_eq!(graph.retained_buffers(), 1, "the output");
    let refused = graph.replay().unwrap_err().to_string();
    assert!(refused.contains("replay it with them"), "{refused}");
    let refused = graph.replay_reading(std::slice::from_ref(&other)).unwrap_err().to_string();
    assert!(refused.contains("captured reading inputs at"), "{refused}");
    let input = common::random_floats(n, 32);
    device.upload_into(&x, 0, bytes_of(&input)).unwrap();
    graph.replay_reading(std::slice::from_ref(&x)).unwrap();
    let expected: Vec<f32> = input.iter().map(|v| 2.0 * v + 1.0).collect();
    common::assert_close(&device.download_values::<f32>(&y).unwrap(), &expected, 1e-6, 1e-6);
}

#[test]
fn graph_replay_is_cheaper_than_individual_launches() {
    let Some(device) = common::gpu() else { return };
    let kernel = common::load_kernel(&device, SCALE_ADD, "scale_add");
    let n = 1024usize;
    let x = device.upload_values(&common::random_floats(n, 20)).unwrap();
    let y = device.alloc(n * 4).unwrap();
    let launches = 200;
    let enqueue = || -> braze_cuda::Result<()> {
        for _ in 0..launches {
            device.launch(
                &kernel,
                (4, 1, 1),
                (256, 1, 1),
                0,
                &[
                    KernelArg::Buffer(&y),
                    KernelArg::Buffer(&x),
                    KernelArg::F32(1.0),
                    KernelArg::F32(1.0),
                    KernelArg::I32(n as i32),
                ],
            )?;
        }
        Ok(())
    };
    let graph = device.capture_graph(enqueue).unwrap();
    assert_eq!(graph.kernel_launches(), launches);
    graph.replay().unwrap();
    device.synchronize().unwrap();
    let started = std::time::Instant::now();
    graph.replay().unwrap();
    device.synchronize().unwrap();
    let replay = started.elapsed();
    let started = std::time::Instant::now();
    enqueue().unwrap();
    device.synchronize().unwrap();
    let individual = started.elapsed();
    println!("{launches} launches: graph replay {replay:?}, individual {individual:?}");
}

#[test]
fn capture_rejects_host_work_and_leaves_the_device_usable() {
    let Some(device) = common::gpu() else { return };
    let buffer = device.alloc(16).unwrap();
    for attempt in 0..4 {
        let err = device
            .capture_graph(|| match attempt {
                0 => device.alloc(16).map(drop),
                1 => device.upload_into(&buffer, 0, &[1]),
                2 => device.download(&buffer).map(drop),
                _ => device.synchronize(),
            })
            .unwrap_err();
        assert!(matches!(err, CudaError::Capture(_)), "{err}");
    }
    let nested = device.capture_graph(|| device.capture_graph(|| Ok(())).map(drop)).unwrap_err();
    assert!(matches!(nested, CudaError::Capture(_)), "{nested}");

    let user_error = device.capture_graph(|| Err(CudaError::InvalidArgument("stop".into()))).unwrap_err();
    assert!(matches!(user_error, CudaError::InvalidArgument(_)));

    device.upload_into(&buffer, 0, &[9; 16]).unwrap();
    assert_eq!(device.download(&buffer).unwrap(), vec![9; 16]);
}

/// Executables that run the same compiled module share one loaded copy of each function while
/// any of them holds it; once none does, the module is unloaded and a later use loads it again.
#[test]
fn a_compiled_module_loads_once_for_every_executable_that_holds_it() {
    let Some(device) = common::gpu() else { return };
    let opts = braze_cuda::CompileOptions { arch: device.arch(), ..braze_cuda::CompileOptions::default() };
    // Two entries in one module: the second is taken from the module the first loaded.
    let source = format!("{SCALE_ADD}{}", SCALE_ADD.replace("scale_add", "scale_add_again"));
    let compiled =
        std::sync::Arc::new(braze_cuda::compile(&source, "scale_add.cu", &opts).unwrap_or_else(|e| panic!("{e}")));
    let before = device.module_load_count();
    let first = device.shared_function(&compiled, "scale_add").unwrap();
    let second = device.shared_function(&compiled, "scale_add").unwrap();
    let other_entry = device.shared_function(&compiled, "scale_add_again").unwrap();
    assert_eq!(device.module_load_count(), before + 1);
    assert_eq!(first.name(), second.name());
    assert_eq!(other_entry.name(), "scale_add_again");
    drop((first, second, other_entry));
    let again = device.shared_function(&compiled, "scale_add").unwrap();
    assert_eq!(device.module_load_count(), before + 2, "a module no executable holds is unloaded");
    assert!(device.shared_function(&compiled, "not_there").is_err());
    drop(again);
}
