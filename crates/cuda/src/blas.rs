//! Row-major matrix multiplication through cuBLASLt, with fused bias and activation.
//!
//! `C[m,n] = act(A[m,k] @ B[k,n] + bias[n])`, optionally batched with strides, for f32, f16 and
//! bf16 operands with f32 accumulation. cuBLASLt is column-major; a row-major matrix is the
//! column-major view of its transpose, so this computes `C^T = B^T A^T` with the operands
//! swapped, which needs no data movement.
//!
//! **TF32.** cudarc's ready-made `Matmul<f32>` always uses `CUBLAS_COMPUTE_32F_FAST_TF32`
//! (inputs rounded to a 10-bit mantissa), so this module calls the lower-level cuBLASLt API and
//! lets the caller choose: [`MatmulSpec::allow_tf32`] `false` (the default) uses
//! `CUBLAS_COMPUTE_32F`, exact FP32 arithmetic; `true` uses the TF32 tensor-core path, several
//! times faster with a relative error of about 1e-3. f16 and bf16 always accumulate in f32.
//!
//! The GELU epilogue is cuBLASLt's tanh approximation,
//! `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys::{
    self as lt_sys, cublasComputeType_t, cublasLtEpilogue_t, cublasLtMatmulAlgo_t,
    cublasLtMatmulDescAttributes_t as DescAttr, cublasLtMatmulPreferenceAttributes_t as PrefAttr,
    cublasLtMatrixLayoutAttribute_t as LayoutAttr, cudaDataType_t,
};
use cudarc::driver::sys::CUdevice_attribute;

use crate::buffer::DeviceBuffer;
use crate::capture_gate::outside_capture;
use crate::device::{lock, CudaDevice};
use crate::error::{CudaError, Result};
use braze_ir::UnaryOp;

/// Element type of A, B, C and the bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatmulDtype {
    F32,
    F16,
    BF16,
}

impl MatmulDtype {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            MatmulDtype::F32 => 4,
            MatmulDtype::F16 | MatmulDtype::BF16 => 2,
        }
    }

    fn cuda_type(self) -> cudaDataType_t {
        match self {
            MatmulDtype::F32 => cudaDataType_t::CUDA_R_32F,
            MatmulDtype::F16 => cudaDataType_t::CUDA_R_16F,
            MatmulDtype::BF16 => cudaDataType_t::CUDA_R_16BF,
        }
    }
}

/// cuBLASLt's epilogue for an activation (after the bias, when there is one). The activations
/// it computes are those of `braze_plan::MatMul::EPILOGUE_ACTIVATIONS`; any other unary op is an
/// error.
fn epilogue(activation: Option<UnaryOp>, bias: bool) -> Result<cublasLtEpilogue_t> {
    use cublasLtEpilogue_t as E;
    Ok(match (activation, bias) {
        (None, false) => E::CUBLASLT_EPILOGUE_DEFAULT,
        (Some(UnaryOp::Relu), false) => E::CUBLASLT_EPILOGUE_RELU,
        (Some(UnaryOp::GeluTanh), false) => E::CUBLASLT_EPILOGUE_GELU,
        (None, true) => E::CUBLASLT_EPILOGUE_BIAS,
        (Some(UnaryOp::Relu), true) => E::CUBLASLT_EPILOGUE_RELU_BIAS,
        (Some(UnaryOp::GeluTanh), true) => E::CUBLASLT_EPILOGUE_GELU_BIAS,
        (Some(op), _) => {
            return Err(CudaError::InvalidArgument(format!("matmul: cuBLASLt has no {} epilogue", op.name())))
        }
    })
}

/// Shape and options of one (possibly batched) row-major matmul.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MatmulSpec {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// Columns of A, rows of B.
    pub k: usize,
    /// Number of independent matmuls (1 = not batched).
    pub batch: usize,
    /// Elements between consecutive A matrices of a batch (0 shares one A across the batch).
    pub stride_a: usize,
    /// Elements between consecutive B matrices (0 shares one B, e.g. a weight).
    pub stride_b: usize,
    /// Elements between consecutive C matrices (at least `m * n` when batched).
    pub stride_c: usize,
    /// A is stored transposed, as a row-major `[k, m]`.
    pub transpose_a: bool,
    /// B is stored transposed, as a row-major `[n, k]` (a PyTorch `Linear` weight).
    pub transpose_b: bool,
    /// Element type of all operands.
    pub dtype: MatmulDtype,
    /// For f32: allow TF32 tensor cores (faster, ~1e-3 relative error). Ignored for f16/bf16.
    pub allow_tf32: bool,
    /// Fused activation: relu or gelu_tanh (see [`epilogue`]).
    pub activation: Option<UnaryOp>,
    /// Add into C (`C = A@B + C ...`) instead of overwriting it.
    pub accumulate: bool,
    /// Which of cuBLASLt's heuristic candidates for the problem runs it, by rank: 0 is the
    /// heuristic's own pick, the one to use untimed; max-autotune times the first few. A rank
    /// past the candidates offered for the operands' alignments falls back to 0.
    pub algorithm: usize,
}

impl MatmulSpec {
    /// A single, non-transposed `[m,k] @ [k,n]` with exact f32 arithmetic and no epilogue.
    pub fn new(m: usize, n: usize, k: usize, dtype: MatmulDtype) -> Self {
        MatmulSpec {
            m,
            n,
            k,
            batch: 1,
            stride_a: m * k,
            stride_b: k * n,
            stride_c: m * n,
            transpose_a: false,
            transpose_b: false,
            dtype,
            allow_tf32: false,
            activation: None,
            accumulate: false,
            algorithm: 0,
        }
    }

    /// `batch` matmuls over densely packed matrices.
    pub fn batched(mut self, batch: usize) -> Self {
        self.batch = batch;
        self.stride_a = self.m * self.k;
        self.stride_b = self.k * self.n;
        self.stride_c = self.m * self.n;
        self
    }
}

/// A matrix operand: a buffer and the byte offset where the (first) matrix starts.
#[derive(Debug, Clone, Copy)]
pub struct MatrixRef<'a> {
    pub buffer: &'a DeviceBuffer,
    pub offset_bytes: usize,
}

impl<'a> MatrixRef<'a> {
    /// The matrix starting `offset_bytes` into `buffer`.
    pub fn at(buffer: &'a DeviceBuffer, offset_bytes: usize) -> Self {
        MatrixRef { buffer, offset_bytes }
    }
}

impl<'a> From<&'a DeviceBuffer> for MatrixRef<'a> {
    fn from(buffer: &'a DeviceBuffer) -> Self {
        MatrixRef::at(buffer, 0)
    }
}

/// A cuBLASLt handle with its workspace, bound to one device's stream.
#[derive(Debug)]
pub struct BlasLt {
    device: Arc<CudaDevice>,
    /// Serialises all use of the handle and of the chosen-algorithm cache.
    state: Mutex<BlasState>,
    workspace: DeviceBuffer,
}

#[derive(Debug)]
struct BlasState {
    handle: LtHandle,
    /// The algorithm of each problem (with its rank), so repeated shapes skip the heuristic query.
    algorithms: HashMap<AlgoKey, cublasLtMatmulAlgo_t>,
}

#[derive(Debug)]
struct LtHandle(lt_sys::cublasLtHandle_t);

// SAFETY: a cuBLASLt handle is not tied to the thread that created it; `BlasLt` only uses it
// while holding the `state` mutex, so it is never used from two threads at once.
unsafe impl Send for LtHandle {}

/// A matmul's operands, resolved to device addresses.
#[derive(Debug, Clone, Copy)]
struct Operands {
    a_ptr: u64,
    b_ptr: u64,
    c_ptr: u64,
    bias_ptr: Option<u64>,
    /// Alignments (bytes, up to 256) of A, B, C and the bias (256 without one).
    alignments: [u32; 4],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct AlgoKey {
    spec: MatmulSpec,
    has_bias: bool,
    /// Alignments (bytes, up to 256) of A, B, C and the bias; the heuristic depends on them.
    alignments: [u32; 4],
}

impl BlasLt {
    /// Creates the handle and a workspace of the size NVIDIA recommends (32 MiB on Hopper,
    /// 4 MiB before), allocated once here.
    pub fn new(device: &Arc<CudaDevice>) -> Result<Self> {
        // SAFETY: only tries to dlopen the candidate library names; touches no cuBLASLt state.
        if !unsafe { lt_sys::is_culib_present() } {
            return Err(CudaError::CublasLtUnavailable);
        }
        let major = device.context().attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let workspace_bytes = if major >= 9 { 32 << 20 } else { 4 << 20 };
        let workspace = device.alloc(workspace_bytes)?;
        let handle = outside_capture(|| {
            device.context().bind_to_thread()?;
            Ok::<_, CudaError>(LtHandle(lt::create_handle()?))
        })?;
        Ok(BlasLt {
            device: device.clone(),
            state: Mutex::new(BlasState { handle, algorithms: HashMap::new() }),
            workspace,
        })
    }

    /// The device this handle enqueues on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// Enqueues `C = act(A @ B + bias)` (row-major) on the device's stream. `bias` has `n`
    /// elements of the operand type and is shared by all rows and batch entries. Sizes, offsets
    /// and alignment are checked against the buffers; mismatches return
    /// [`CudaError::ShapeMismatch`] before anything is enqueued.
    pub fn matmul<'a>(
        &self,
        spec: &MatmulSpec,
        a: impl Into<MatrixRef<'a>>,
        b: impl Into<MatrixRef<'a>>,
        c: impl Into<MatrixRef<'a>>,
        bias: Option<MatrixRef<'a>>,
    ) -> Result<()> {
        let (a, b, c) = (a.into(), b.into(), c.into());
        // Through the capture gate as a whole, before the handle's lock: a capturing thread passes
        // the gate and may then wait for the lock, so no thread may hold the lock at the gate.
        self.device.gate.shared(|| self.enqueue_matmul(spec, a, b, c, bias))
    }

    /// [`BlasLt::matmul`] past the capture gate.
    fn enqueue_matmul(
        &self,
        spec: &MatmulSpec,
        a: MatrixRef<'_>,
        b: MatrixRef<'_>,
        c: MatrixRef<'_>,
        bias: Option<MatrixRef<'_>>,
    ) -> Result<()> {
        let operands = self.resolve(spec, a, b, c, bias)?;
        let Operands { a_ptr, b_ptr, c_ptr, .. } = operands;
        let workspace_ptr = self.workspace.device_address();
        let problem = Problem::describe(spec, operands.bias_ptr)?;
        let mut state = lock(&self.state);
        self.device.context().bind_to_thread()?;
        let key = AlgoKey { spec: *spec, has_bias: operands.bias_ptr.is_some(), alignments: operands.alignments };
        let algorithm = match state.algorithms.get(&key) {
            Some(algorithm) => *algorithm,
            None => {
                let candidates = self.candidates(&state, &problem, operands.alignments, spec.algorithm + 1)?;
                let algorithm = match candidates.get(spec.algorithm).or(candidates.first()) {
                    Some(algorithm) => *algorithm,
                    None => return Err(CudaError::Blas(format!("no cuBLASLt algorithm for {spec:?}"))),
                };
                state.algorithms.insert(key, algorithm);
                algorithm
            }
        };

        let alpha = 1.0f32;
        let beta = if spec.accumulate { 1.0f32 } else { 0.0f32 };
        // Column-major: the left operand is B, the right operand is A (see the module docs).
        // SAFETY: all pointers address ranges inside live device buffers of this device, sized
        // and aligned for the layouts (checked above); the workspace is this handle's own
        // buffer of the size the algorithm was chosen for; alpha and beta are f32 as the scale
        // type says and live across the call (cuBLASLt reads them before returning, in host
        // pointer mode). The work is enqueued on the device's stream, ordered with every other
        // use of these buffers.
        unsafe {
            lt::matmul(
                state.handle.0,
                problem.desc.0,
                (&alpha as *const f32).cast::<c_void>(),
                (&beta as *const f32).cast::<c_void>(),
                b_ptr as *const c_void,
                problem.lhs.0,
                a_ptr as *const c_void,
                problem.rhs.0,
                c_ptr as *const c_void,
                problem.out.0,
                c_ptr as *mut c_void,
                problem.out.0,
                &algorithm,
                workspace_ptr as *mut c_void,
                self.workspace.len_bytes(),
                self.device.stream().cu_stream() as lt_sys::cudaStream_t,
            )
        }
        .map_err(|err| CudaError::Blas(format!("cublasLtMatmul for {spec:?}: {:?}", err.0)))?;
        drop(state);

        for operand in [Some(a), Some(b), Some(c), bias].into_iter().flatten() {
            self.device.note_captured_buffer(operand.buffer);
        }
        self.device.note_captured_buffer(&self.workspace);
        Ok(())
    }

    /// How many algorithms (at most `max`) cuBLASLt's heuristic offers for `spec` on these
    /// operands: the ranks [`MatmulSpec::algorithm`] can take for them.
    pub fn algorithm_count<'a>(
        &self,
        spec: &MatmulSpec,
        a: MatrixRef<'a>,
        b: MatrixRef<'a>,
        c: MatrixRef<'a>,
        bias: Option<MatrixRef<'a>>,
        max: usize,
    ) -> Result<usize> {
        self.device.gate.shared(|| {
            let operands = self.resolve(spec, a, b, c, bias)?;
            let problem = Problem::describe(spec, operands.bias_ptr)?;
            let state = lock(&self.state);
            self.device.context().bind_to_thread()?;
            Ok(self.candidates(&state, &problem, operands.alignments, max)?.len())
        })
    }

    /// The operands' device addresses, checked against the spec, and their alignments.
    fn resolve(
        &self,
        spec: &MatmulSpec,
        a: MatrixRef<'_>,
        b: MatrixRef<'_>,
        c: MatrixRef<'_>,
        bias: Option<MatrixRef<'_>>,
    ) -> Result<Operands> {
        validate_spec(spec)?;
        let elem = spec.dtype.size_bytes();
        let a_ptr = self.operand_address("A", a, spec.batch, spec.stride_a, spec.m * spec.k, elem)?;
        let b_ptr = self.operand_address("B", b, spec.batch, spec.stride_b, spec.k * spec.n, elem)?;
        let c_ptr = self.operand_address("C", c, spec.batch, spec.stride_c, spec.m * spec.n, elem)?;
        let bias_ptr = bias.map(|bias| self.operand_address("bias", bias, 1, 0, spec.n, elem)).transpose()?;
        let alignments =
            [alignment_of(a_ptr), alignment_of(b_ptr), alignment_of(c_ptr), bias_ptr.map_or(256, alignment_of)];
        Ok(Operands { a_ptr, b_ptr, c_ptr, bias_ptr, alignments })
    }

    /// The heuristic's first `count` valid algorithms for `problem`, best first (an empty list
    /// when it has none).
    fn candidates(
        &self,
        state: &BlasState,
        problem: &Problem,
        alignments: [u32; 4],
        count: usize,
    ) -> Result<Vec<cublasLtMatmulAlgo_t>> {
        let preference = Preference::new(self.workspace.len_bytes(), alignments)?;
        let requested = count.clamp(1, 64);
        let mut results: Vec<lt_sys::cublasLtMatmulHeuristicResult_t> = Vec::with_capacity(requested);
        let mut returned: std::ffi::c_int = 0;
        // SAFETY: the handle, descriptor, layouts and preference are live objects destroyed only
        // after this call; `results` has room for the `requested` entries cuBLASLt may write, and
        // only the `returned` ones it wrote are kept.
        unsafe {
            lt_sys::cublasLtMatmulAlgoGetHeuristic(
                state.handle.0,
                problem.desc.0,
                problem.lhs.0,
                problem.rhs.0,
                problem.out.0,
                problem.out.0,
                preference.0,
                requested as std::ffi::c_int,
                results.as_mut_ptr(),
                &mut returned,
            )
            .result()
            .map_err(|err| CudaError::Blas(format!("cuBLASLt heuristic query: {:?}", err.0)))?;
            results.set_len((returned.max(0) as usize).min(requested));
        }
        Ok(results
            .into_iter()
            .filter(|r| r.state == lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|r| r.algo)
            .take(count)
            .collect())
    }

    /// Checks that `batch` matrices of `elems` elements, `stride` elements apart, fit in the
    /// operand, and returns its device address.
    fn operand_address(
        &self,
        name: &str,
        operand: MatrixRef<'_>,
        batch: usize,
        stride: usize,
        elems: usize,
        elem_bytes: usize,
    ) -> Result<u64> {
        let mismatch = |detail: String| CudaError::ShapeMismatch { op: "matmul", detail };
        let needed_elems = (batch - 1)
            .checked_mul(stride)
            .and_then(|spread| spread.checked_add(elems))
            .ok_or_else(|| mismatch(format!("{name}: size overflows")))?;
        let needed_bytes =
            needed_elems.checked_mul(elem_bytes).ok_or_else(|| mismatch(format!("{name}: size overflows")))?;
        let available = operand.buffer.len_bytes().saturating_sub(operand.offset_bytes);
        if needed_bytes > available || operand.offset_bytes > operand.buffer.len_bytes() {
            return Err(mismatch(format!(
                "{name} needs {needed_bytes} bytes from offset {} but its buffer has {} bytes",
                operand.offset_bytes,
                operand.buffer.len_bytes()
            )));
        }
        let address = self.device.checked_range(operand.buffer, operand.offset_bytes, needed_bytes, name)?;
        if address % elem_bytes as u64 != 0 {
            return Err(CudaError::InvalidArgument(format!(
                "matmul {name}: address {address:#x} is not aligned to its {elem_bytes}-byte \
                 elements"
            )));
        }
        Ok(address)
    }
}

impl Drop for BlasLt {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
        let handle = state.handle.0;
        outside_capture(|| {
            let _ = self.device.context().bind_to_thread();
            // SAFETY: the handle was created in `new` and is destroyed only here; no matmul can
            // be in progress on it since `drop` has exclusive access.
            let _ = unsafe { lt::destroy_handle(handle) };
        });
    }
}

/// cuBLASLt's version number, when the library is present.
pub(crate) fn library_version() -> Option<usize> {
    // SAFETY: only tries to dlopen the candidate library names; touches no cuBLASLt state.
    if !unsafe { lt_sys::is_culib_present() } {
        return None;
    }
    // SAFETY: a query of a constant with no arguments, from a library known to be loadable.
    Some(unsafe { lt_sys::cublasLtGetVersion() })
}

fn validate_spec(spec: &MatmulSpec) -> Result<()> {
    let mismatch = |detail: String| CudaError::ShapeMismatch { op: "matmul", detail };
    if spec.m == 0 || spec.n == 0 || spec.k == 0 || spec.batch == 0 {
        return Err(mismatch(format!(
            "m, n, k and batch must be positive, got m={} n={} k={} batch={}",
            spec.m, spec.n, spec.k, spec.batch
        )));
    }
    let limit = i32::MAX as usize;
    if spec.m > limit || spec.n > limit || spec.k > limit || spec.batch > limit {
        return Err(mismatch("a dimension exceeds 2^31-1".into()));
    }
    if spec.batch > 1 && spec.stride_c < spec.m * spec.n {
        return Err(mismatch(format!("batched outputs overlap: stride_c {} < m*n {}", spec.stride_c, spec.m * spec.n)));
    }
    Ok(())
}

fn alignment_of(address: u64) -> u32 {
    if address == 0 {
        256
    } else {
        (1u32 << address.trailing_zeros().min(8)).min(256)
    }
}

/// The cuBLASLt descriptor and the three layouts for one spec.
struct Problem {
    desc: Desc,
    /// Layout of the left cuBLASLt operand: the caller's B.
    lhs: Layout,
    /// Layout of the right cuBLASLt operand: the caller's A.
    rhs: Layout,
    /// Layout of C (and D).
    out: Layout,
}

impl Problem {
    fn describe(spec: &MatmulSpec, bias: Option<u64>) -> Result<Self> {
        let data_type = spec.dtype.cuda_type();
        let compute_type = match (spec.dtype, spec.allow_tf32) {
            (MatmulDtype::F32, true) => cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            _ => cublasComputeType_t::CUBLAS_COMPUTE_32F,
        };
        let (m, n, k) = (spec.m as u64, spec.n as u64, spec.k as u64);
        // Row-major B [k,n] is column-major n x k (ld n); stored as [n,k] it is k x n (ld k)
        // and gets transposed. Likewise A [m,k] is k x m (ld k), or m x k (ld m) transposed.
        let lhs = if spec.transpose_b {
            Layout::new(data_type, k, n, k as i64)?
        } else {
            Layout::new(data_type, n, k, n as i64)?
        };
        let rhs = if spec.transpose_a {
            Layout::new(data_type, m, k, m as i64)?
        } else {
            Layout::new(data_type, k, m, k as i64)?
        };
        let out = Layout::new(data_type, n, m, n as i64)?;
        if spec.batch > 1 {
            lhs.set_batch(spec.batch, spec.stride_b)?;
            rhs.set_batch(spec.batch, spec.stride_a)?;
            out.set_batch(spec.batch, spec.stride_c)?;
        }

        let desc = Desc::new(compute_type)?;
        desc.set(DescAttr::CUBLASLT_MATMUL_DESC_TRANSA, &(spec.transpose_b as i32))?;
        desc.set(DescAttr::CUBLASLT_MATMUL_DESC_TRANSB, &(spec.transpose_a as i32))?;
        let epilogue = epilogue(spec.activation, bias.is_some())?;
        desc.set(DescAttr::CUBLASLT_MATMUL_DESC_EPILOGUE, &(epilogue as u32))?;
        if let Some(bias) = bias {
            // The bias has one entry per row of the column-major output, i.e. per column n of
            // the row-major C, and (batch stride 0, the default) is shared by the batch.
            desc.set(DescAttr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)?;
        }
        Ok(Problem { desc, lhs, rhs, out })
    }
}

struct Layout(lt_sys::cublasLtMatrixLayout_t);

impl Layout {
    fn new(data_type: cudaDataType_t, rows: u64, cols: u64, ld: i64) -> Result<Self> {
        Ok(Layout(lt::create_matrix_layout(data_type, rows, cols, ld)?))
    }

    fn set_batch(&self, batch: usize, stride_elems: usize) -> Result<()> {
        let count = batch as i32;
        let stride = stride_elems as i64;
        // SAFETY: the layout is live; each value is the attribute's documented type (int32
        // batch count, int64 stride) and the size passed is that type's size.
        unsafe {
            lt::set_matrix_layout_attribute(
                self.0,
                LayoutAttr::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                (&count as *const i32).cast(),
                size_of::<i32>(),
            )?;
            lt::set_matrix_layout_attribute(
                self.0,
                LayoutAttr::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                (&stride as *const i64).cast(),
                size_of::<i64>(),
            )?;
        }
        Ok(())
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by `create_matrix_layout` and destroyed only here.
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}

struct Desc(lt_sys::cublasLtMatmulDesc_t);

impl Desc {
    fn new(compute_type: cublasComputeType_t) -> Result<Self> {
        Ok(Desc(lt::create_matmul_desc(compute_type, cudaDataType_t::CUDA_R_32F)?))
    }

    /// Sets an attribute whose documented C type has the size and layout of `T`.
    fn set<T: Copy>(&self, attribute: DescAttr, value: &T) -> Result<()> {
        // SAFETY: the descriptor is live and `value` points to `size_of::<T>()` readable bytes;
        // callers pass the attribute's documented type (int32 for transposes, uint32 for the
        // epilogue, a device pointer for the bias).
        unsafe {
            lt::set_matmul_desc_attribute(self.0, attribute, (value as *const T).cast(), size_of::<T>())?;
        }
        Ok(())
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `create_matmul_desc` and destroyed only here.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}

struct Preference(lt_sys::cublasLtMatmulPreference_t);

impl Preference {
    fn new(workspace_bytes: usize, alignments: [u32; 4]) -> Result<Self> {
        let preference = Preference(lt::create_matmul_pref()?);
        let workspace = workspace_bytes as u64;
        // SAFETY: the preference is live; the workspace limit is a uint64 and the alignments
        // are uint32, as the attributes document, with matching sizes.
        unsafe {
            lt::set_matmul_pref_attribute(
                preference.0,
                PrefAttr::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&workspace as *const u64).cast(),
                size_of::<u64>(),
            )?;
            // cuBLASLt's left operand is the caller's B and its right operand the caller's A.
            let [a, b, c, _bias] = alignments;
            for (attribute, value) in [
                (PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, b),
                (PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, a),
                (PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, c),
                (PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, c),
            ] {
                lt::set_matmul_pref_attribute(
                    preference.0,
                    attribute,
                    (&value as *const u32).cast(),
                    size_of::<u32>(),
                )?;
            }
        }
        Ok(preference)
    }
}

impl Drop for Preference {
    fn drop(&mut self) {
        // SAFETY: created by `create_matmul_pref` and destroyed only here.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_largest_power_of_two_up_to_256() {
        assert_eq!(alignment_of(0x1000), 256);
        assert_eq!(alignment_of(0x1002), 2);
        assert_eq!(alignment_of(0x1010), 16);
        assert_eq!(alignment_of(0x1001), 1);
    }

    #[test]
    fn spec_validation_rejects_empty_and_overlapping() {
        assert!(validate_spec(&MatmulSpec::new(2, 3, 4, MatmulDtype::F32)).is_ok());
        assert!(matches!(
            validate_spec(&MatmulSpec::new(0, 3, 4, MatmulDtype::F32)),
            Err(CudaError::ShapeMismatch { .. })
        ));
        let mut overlapping = MatmulSpec::new(2, 3, 4, MatmulDtype::F16).batched(2);
        overlapping.stride_c = 1;
        assert!(matches!(validate_spec(&overlapping), Err(CudaError::ShapeMismatch { .. })));
    }

    #[test]
    fn epilogues_cover_exactly_the_plan_activations() {
        for &op in UnaryOp::ALL {
            let allowed = braze_plan::MatMul::EPILOGUE_ACTIVATIONS.contains(&op);
            for bias in [false, true] {
                assert_eq!(epilogue(Some(op), bias).is_ok(), allowed, "{} bias={bias}", op.name());
            }
        }
        assert_eq!(epilogue(Some(UnaryOp::GeluTanh), true).unwrap(), cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS);
        assert_eq!(epilogue(None, false).unwrap(), cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT);
    }
}
