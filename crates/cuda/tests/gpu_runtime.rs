//! Device memory, transfers, launches and timing on a real GPU. Each test prints
//! `skipped: no CUDA device` and returns where there is none.

mod common;

use braze_cuda::{bytes_of, CompileOptions, CudaError, ImageKind, KernelArg};

const MIXED_ARGS: &str = r#"
extern "C" __global__ void mixed(float* out, const float* x, float a, double b, int n,
                                 unsigned int mul, long long add, unsigned long long shift) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + (float)b + (float)(mul * (unsigned int)i) + (float)add
                        + (float)shift;
}
"#;

const REVERSE_IN_SHARED: &str = r#"
extern "C" __global__ void reverse(float* out, const float* in, int n) {
    extern __shared__ float tile[];
    for (int j = threadIdx.x; j < n; j += blockDim.x) tile[j] = in[j];
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x) out[j] = tile[n - 1 - j];
}
"#;

const SAXPY: &str = r#"
extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"#;

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut bytes = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut bytes);
    bytes
}

#[test]
fn uploads_and_downloads_round_trip() {
    let Some(device) = common::gpu() else { return };
    // Sizes around and beyond the staging chunk (8 MiB), the upload ring (32 MiB) and the
    // download staging buffer (64 MiB).
    for (seed, len) in [0, 1, 4097, (8 << 20) + 3, (40 << 20) + 5, (70 << 20) + 7].into_iter().enumerate() {
        let data = random_bytes(len, seed as u64);
        let buffer = device.upload(&data).unwrap();
        assert_eq!(buffer.len_bytes(), len);
        assert!(device.download(&buffer).unwrap() == data, "size {len}");
    }
    // Several uploads back to back with no wait in between must all land.
    let pieces: Vec<Vec<u8>> = (0..6).map(|i| random_bytes(9 << 20, 100 + i)).collect();
    let buffers: Vec<_> = pieces.iter().map(|p| device.upload(p).unwrap()).collect();
    for (piece, buffer) in pieces.iter().zip(&buffers) {
        assert!(device.download(buffer).unwrap() == *piece);
    }
}

/// Many uploads into the same few buffers, each read by the device right after it lands (a copy
/// into a log at its own offset): every read must see the bytes just uploaded, never a staging
/// chunk's earlier contents. Small and larger pieces alternate, so the staging chunks are packed
/// and wrap around several times.
#[test]
fn small_uploads_are_never_read_stale() {
    let Some(device) = common::gpu() else { return };
    const TARGETS: usize = 8;
    const ROUNDS: usize = 2_500;
    let piece_len = |round: usize, t: usize| if (round + t).is_multiple_of(2) { 256 } else { 16 << 10 };
    let targets: Vec<_> = (0..TARGETS).map(|_| device.alloc(16 << 10).unwrap()).collect();
    let total: usize = (0..ROUNDS).flat_map(|r| (0..TARGETS).map(move |t| piece_len(r, t))).sum();
    let log = device.alloc(total).unwrap();
    let mut expected = Vec::with_capacity(total);
    for round in 0..ROUNDS {
        for (t, target) in targets.iter().enumerate() {
            let len = piece_len(round, t);
            let data = random_bytes(len, (round * TARGETS + t) as u64);
            device.upload_into(target, 0, &data).unwrap();
            device.copy(target, 0, &log, expected.len(), len).unwrap();
            expected.extend_from_slice(&data);
        }
    }
    let landed = device.download(&log).unwrap();
    let mut stale = 0;
    let mut at = 0;
    for round in 0..ROUNDS {
        for t in 0..TARGETS {
            let len = piece_len(round, t);
            stale += usize::from(landed[at..at + len] != expected[at..at + len]);
            at += len;
        }
    }
    assert_eq!(stale, 0, "{stale} of {} uploads were read stale", TARGETS * ROUNDS);
}

/// A loop that uploads a few small values a step (a learning rate, a pointer table) must not
/// wait for the GPU: with milliseconds of work queued, a hundred small uploads share a staging
/// chunk and none waits for a copy queued behind that work.
#[test]
fn small_uploads_do_not_wait_behind_queued_work() {
    let Some(device) = common::gpu() else { return };
    let busy = device.alloc(256 << 20).unwrap();
    let target = device.alloc(8).unwrap();
    device.synchronize().unwrap();
    let (_, waits_before) = device.upload_stats();
    for _ in 0..40 {
        device.memset_d8(&busy, 1).unwrap();
    }
    for i in 0..100u64 {
        device.upload_into(&target, 0, &i.to_le_bytes()).unwrap();
    }
    let (_, waits_after) = device.upload_stats();
    assert_eq!(device.download(&target).unwrap(), 99u64.to_le_bytes());
    assert_eq!(waits_after - waits_before, 0, "small uploads waited for queued GPU work");
}

#[test]
fn partial_transfers_memset_and_copies() {
    let Some(device) = common::gpu() else { return };
    let buffer = device.alloc(1000).unwrap();
    device.memset_d8(&buffer, 0xFF).unwrap();
    let poisoned: Vec<f32> = device.download_values(&buffer).unwrap();
    assert!(poisoned.iter().all(|v| v.is_nan()));

    device.upload_into(&buffer, 100, &[1, 2, 3]).unwrap();
    device.memset_d8_range(&buffer, 200, 10, 7).unwrap();
    let mut window = [0u8; 6];
    device.download_into(&buffer, 99, &mut window).unwrap();
    assert_eq!(window, [0xFF, 1, 2, 3, 0xFF, 0xFF]);
    device.download_into(&buffer, 199, &mut window).unwrap();
    assert_eq!(window, [0xFF, 7, 7, 7, 7, 7]);

    let zeroed = device.alloc_zeroed(64).unwrap();
    assert!(device.download(&zeroed).unwrap().iter().all(|&b| b == 0));
    device.copy(&buffer, 100, &zeroed, 10, 3).unwrap();
    assert_eq!(&device.download(&zeroed).unwrap()[9..14], &[0, 1, 2, 3, 0]);

    assert!(matches!(device.upload_into(&buffer, 999, &[1, 2]), Err(CudaError::InvalidArgument(_))));
    assert!(matches!(device.copy(&buffer, 0, &zeroed, 60, 8), Err(CudaError::InvalidArgument(_))));
    let mut too_long = [0u8; 2];
    assert!(device.download_into(&buffer, 999, &mut too_long).is_err());
}

#[test]
fn launches_with_every_argument_kind() {
    let Some(device) = common::gpu() else { return };
    let kernel = common::load_kernel(&device, MIXED_ARGS, "mixed");
    let n = 10_000usize;
    let skip = 37usize;
    let x = common::random_floats(n + skip, 1);
    let x_buffer = device.upload_values(&x).unwrap();
    let out = device.alloc(n * 4).unwrap();
    device.memset_d8(&out, 0xFF).unwrap();

    let (a, b, mul, add, shift) = (1.5f32, -0.25f64, 3u32, -7i64, 11u64);
    let block = 256u32;
    let grid = (n as u32).div_ceil(block);
    device
        .launch(
            &kernel,
            (grid, 1, 1),
            (block, 1, 1),
            0,
            &[
                KernelArg::Buffer(&out),
                KernelArg::BufferAt(&x_buffer, skip * 4),
                KernelArg::F32(a),
                KernelArg::F64(b),
                KernelArg::I32(n as i32),
                KernelArg::U32(mul),
                KernelArg::I64(add),
                KernelArg::U64(shift),
            ],
        )
        .unwrap();
    let got: Vec<f32> = device.download_values(&out).unwrap();
    let expected: Vec<f32> =
        (0..n).map(|i| a * x[i + skip] + b as f32 + (mul * i as u32) as f32 + add as f32 + shift as f32).collect();
    common::assert_close(&got, &expected, 1e-3, 1e-6);
}

#[test]
fn launches_with_more_than_48k_dynamic_shared_memory() {
    let Some(device) = common::gpu() else { return };
    let kernel = common::load_kernel(&device, REVERSE_IN_SHARED, "reverse");
    let n = 24_576usize; // 96 KiB of floats
    let shared = (n * 4) as u32;
    assert!(shared > 48 * 1024 && shared <= device.max_shared_per_block_optin());
    let input = common::random_floats(n, 2);
    let in_buffer = device.upload_values(&input).unwrap();
    let out = device.alloc(n * 4).unwrap();
    device.memset_d8(&out, 0xFF).unwrap();
    device
        .launch(
            &kernel,
            (1, 1, 1),
            (1024, 1, 1),
            shared,
            &[KernelArg::Buffer(&out), KernelArg::Buffer(&in_buffer), KernelArg::I32(n as i32)],
        )
        .unwrap();
    let got: Vec<f32> = device.download_values(&out).unwrap();
    let expected: Vec<f32> = input.iter().rev().copied().collect();
    assert_eq!(got, expected);

    let too_much = device.max_shared_per_block_optin() + 1;
    let err = device.launch(&kernel, (1, 1, 1), (32, 1, 1), too_much, &[]).unwrap_err();
    assert!(matches!(err, CudaError::Launch { .. }), "{err}");
}

#[test]
fn loads_ptx_through_the_jit() {
    let Some(device) = common::gpu() else { return };
    let opts = CompileOptions { arch: device.arch(), output: ImageKind::Ptx, ..CompileOptions::default() };
    let compiled = braze_cuda::compile(SAXPY, "saxpy.cu", &opts).unwrap();
    let kernel = device.load_module(&compiled).unwrap().get_function("saxpy").unwrap();
    let n = 3000usize;
    let x = common::random_floats(n, 3);
    let y = common::random_floats(n, 4);
    let (x_buffer, y_buffer) = (device.upload_values(&x).unwrap(), device.upload_values(&y).unwrap());
    device
        .launch(
            &kernel,
            ((n as u32).div_ceil(128), 1, 1),
            (128, 1, 1),
            0,
            &[
                KernelArg::Buffer(&y_buffer),
                KernelArg::Buffer(&x_buffer),
                KernelArg::F32(-2.0),
                KernelArg::I32(n as i32),
            ],
        )
        .unwrap();
    let expected: Vec<f32> = x.iter().zip(&y).map(|(x, y)| -2.0 * x + y).collect();
    common::assert_close(&device.download_values::<f32>(&y_buffer).unwrap(), &expected, 1e-6, 1e-6);
}

#[test]
fn rejects_bad_launches_without_touching_the_gpu() {
    let Some(device) = common::gpu() else { return };
    let kernel = common::load_kernel(&device, SAXPY, "saxpy");
    let buffer = device.alloc(64).unwrap();
    let args = [KernelArg::Buffer(&buffer), KernelArg::Buffer(&buffer), KernelArg::F32(1.0), KernelArg::I32(16)];
    for (grid, block) in
        [((1, 1, 1), (2048, 1, 1)), ((0, 1, 1), (32, 1, 1)), ((1, 1, 1), (32, 32, 2)), ((1, 70_000, 1), (32, 1, 1))]
    {
        let err = device.launch(&kernel, grid, block, 0, &args).unwrap_err();
        assert!(matches!(err, CudaError::Launch { .. }), "{err}");
    }
    let past_end =
        [KernelArg::BufferAt(&buffer, 65), KernelArg::Buffer(&buffer), KernelArg::F32(1.0), KernelArg::I32(0)];
    let err = device.launch(&kernel, (1, 1, 1), (32, 1, 1), 0, &past_end).unwrap_err();
    assert!(matches!(err, CudaError::Launch { .. }), "{err}");

    let module = device
        .load_module(
            &braze_cuda::compile(
                SAXPY,
                "saxpy.cu",
                &CompileOptions { arch: device.arch(), ..CompileOptions::default() },
            )
            .unwrap(),
        )
        .unwrap();
    assert!(module.get_function("no_such_kernel").is_err());
    assert!(module.get_function("nul\0name").is_err());
    // The device still works after all of that.
    device.launch(&kernel, (1, 1, 1), (16, 1, 1), 0, &args).unwrap();
    device.synchronize().unwrap();
}

#[test]
fn repeated_work_on_planned_buffers_does_not_allocate() {
    let Some(device) = common::gpu() else { return };
    let kernel = common::load_kernel(&device, SAXPY, "saxpy");
    let n = 4096usize;
    let x = device.upload_values(&common::random_floats(n, 5)).unwrap();
    let y = device.alloc_zeroed(n * 4).unwrap();
    let host_x = common::random_floats(n, 6);
    let mut landing = vec![0u8; n * 4];
    device.synchronize().unwrap();
    let before = device.allocation_count();
    assert_eq!(before, 2);
    for step in 0..50 {
        device.upload_into(&x, 0, bytes_of(&host_x)).unwrap();
        device.memset_d8(&y, 0).unwrap();
        device
            .launch(
                &kernel,
                ((n as u32).div_ceil(256), 1, 1),
                (256, 1, 1),
                0,
                &[KernelArg::Buffer(&y), KernelArg::Buffer(&x), KernelArg::F32(step as f32), KernelArg::I32(n as i32)],
            )
            .unwrap();
        device.download_into(&y, 0, &mut landing).unwrap();
    }
    assert_eq!(device.allocation_count(), before);
    let last: Vec<f32> = braze_cuda::values_from_bytes(&landing);
    let expected: Vec<f32> = host_x.iter().map(|v| 49.0 * v).collect();
    common::assert_close(&last, &expected, 1e-5, 1e-6);
}

#[test]
fn times_gpu_work_with_events() {
    let Some(device) = common::gpu() else { return };
    let buffer = device.alloc(256 << 20).unwrap();
    let ms = device
        .time_ms(|| {
            for value in 0..4 {
                device.memset_d8(&buffer, value)?;
            }
            Ok(())
        })
        .unwrap();
    assert!(ms > 0.0 && ms < 10_000.0, "{ms} ms");
    let timer = device.event_timer().unwrap();
    timer.start().unwrap();
    device.memset_d8(&buffer, 1).unwrap();
    timer.stop().unwrap();
    assert!(timer.elapsed_ms().unwrap() > 0.0);
    println!("{} ({}): 4 x 256 MiB memset in {ms:.3} ms", device.name(), device.arch());
}

#[test]
fn memory_in_use_and_its_peak_follow_the_live_buffers() {
    let Some(device) = common::gpu() else { return };
    // A fresh device: nothing allocated yet.
    assert_eq!((device.memory_in_use(), device.peak_memory()), (0, 0));
    let a = device.alloc(3 << 20).unwrap();
    let b = device.alloc(1 << 20).unwrap();
    assert_eq!(device.memory_in_use(), 4 << 20);
    drop(a);
    assert_eq!(device.memory_in_use(), 1 << 20);
    assert_eq!(device.peak_memory(), 4 << 20, "the peak stays after a free");
    device.reset_peak_memory();
    assert_eq!(device.peak_memory(), 1 << 20, "a reset starts from what is live");
    // A clone shares the allocation: it is counted once and freed with the last handle.
    let c = b.clone();
    drop(b);
    assert_eq!(device.memory_in_use(), 1 << 20);
    drop(c);
    assert_eq!(device.memory_in_use(), 0);
    // An empty buffer holds one byte (its pointer must be valid).
    let empty = device.alloc(0).unwrap();
    assert_eq!(device.memory_in_use(), 1);
    drop(empty);
    assert_eq!((device.memory_in_use(), device.peak_memory()), (0, 1 << 20));
}
