//! Max-autotune: times each CUDA kernel of an executable with every candidate launch
//! configuration on the bound inputs and installs the fastest; the winners are remembered in the
//! [`AutotuneStore`].

use braze_codegen::KernelCode;

use super::{CudaKernel, PlanExecutable, ReadyKernel};
use crate::autotune::{AutotuneRecord, AutotuneStore};
use crate::buffer::DeviceBuffer;
use crate::cache::KernelCache;
use crate::error::{CudaError, Result};
use crate::nvrtc::CompileOptions;

/// Bytes written before every timed launch to evict the inputs from L2 (the H200's is 50 MB),
/// as a step's kernels mostly read what earlier kernels wrote long before. Timed back to back,
/// gpt2_step's 25 MB column sums ran 13.4 us in 144 blocks with one 16-byte load in flight a
/// thread, which DRAM cannot feed that fast (18-21 us alone, L2 flushed), and max-autotune's
/// step was no faster than the defaults' (34.52 vs 34.43 ms).
const L2_FLUSH_BYTES: usize = 128 << 20;

/// Where tuning stands: `done` of `total` kernels tuned, `kernel` the next.
#[derive(Clone, Copy, Debug)]
pub struct TuningProgress<'a> {
    pub done: usize,
    pub total: usize,
    pub kernel: &'a str,
}

impl PlanExecutable {
    /// Times every CUDA kernel with each candidate configuration on the bound inputs, keeps
    /// the fastest, and remembers the winners on disk for this device. Candidates that fail to
    /// compile or launch are skipped with a warning.
    pub fn autotune(&mut self, inputs: &[DeviceBuffer], cache: &KernelCache) -> Result<Vec<AutotuneRecord>> {
        self.autotune_with_progress(inputs, cache, &mut |_| {})
    }

    /// [`PlanExecutable::autotune`], telling `progress` before each kernel it tunes.
    pub fn autotune_with_progress(
        &mut self,
        inputs: &[DeviceBuffer],
        cache: &KernelCache,
        progress: &mut dyn FnMut(TuningProgress<'_>),
    ) -> Result<Vec<AutotuneRecord>> {
        self.prepare()?;
        // The run below and the timed launches repeat kernels that write inputs in place (an
        // optimizer's update): those inputs are saved first and restored after, so tuning
        // leaves them as they were and the call that tunes updates them once.
        let saved = self
            .plan
            .in_place_inputs()
            .into_iter()
            .map(|i| {
                let copy = self.device.alloc(inputs[i].len_bytes())?;
                self.device.copy(&inputs[i], 0, &copy, 0, inputs[i].len_bytes())?;
                Ok((i, copy))
            })
            .collect::<Result<Vec<_>>>()?;
        // One full run so every buffer a kernel reads holds data of the right kind.
        let outputs = self.run(inputs)?;
        let flush = match self.device.alloc(L2_FLUSH_BYTES) {
            Ok(buffer) => Some(buffer),
            Err(err) => {
                tracing::warn!(target: "braze::autotune", error = %err, "no memory for the L2 flush buffer: candidates timed with warm caches");
                None
            }
        };
        let set_index = self
            .output_sets
            .iter()
            .position(|s| s.buffers.iter().flatten().zip(outputs.iter()).any(|(a, b)| a.same_allocation(b)))
            .unwrap_or(0);
        let mut records = Vec::new();
        let target = self.device.target().clone();
        let compile_options = CompileOptions { arch: target.arch(), ..CompileOptions::default() };
        let tunable: Vec<usize> = (0..self.kernels.len())
            .filter(|&k| match &self.kernels[k] {
                ReadyKernel::Blas { matmul, .. } => matmul.k > 0,
                ReadyKernel::Cuda(_) => braze_codegen::candidate_configs(&self.plan, k, &target).len() > 1,
                ReadyKernel::Empty => false,
            })
            .collect();
        for (done, &k) in tunable.iter().enumerate() {
            progress(TuningProgress { done, total: tunable.len(), kernel: &self.plan.kernels[k].name });
            if matches!(self.kernels[k], ReadyKernel::Blas { .. }) {
                if let Some(record) = self.tune_matmul(k, inputs, set_index, flush.as_ref())? {
                    records.push(record);
                }
                continue;
            }
            if !matches!(self.kernels[k], ReadyKernel::Cuda(_)) {
                continue;
            }
            let candidates = braze_codegen::candidate_configs(&self.plan, k, &target);
            if candidates.len() < 2 {
                continue;
            }
            let mut timings = Vec::new();
            let mut best: Option<(f32, usize, CudaKernel)> = None;
            for (ci, config) in candidates.iter().enumerate() {
                let attempt = (|| -> Result<(f32, CudaKernel)> {
                    let code = match braze_codegen::generate(&self.plan, k, config, &target)? {
                        KernelCode::Cuda(g) => g,
                        KernelCode::CuBlasLt(_) => return Err(CudaError::InvalidArgument("not a CUDA kernel".into())),
                    };
                    let unit = crate::unit::unit_source(&code.name, &code.source);
                    let module = cache.get_or_compile(&unit, crate::unit::UNIT_NAME, &compile_options)?;
                    let slots = self.plan.kernels[k].inputs.len();
                    let candidate = Self::load_kernel(&self.device, code, *config, &module, slots)?;
                    let previous = std::mem::replace(&mut self.kernels[k], ReadyKernel::Cuda(candidate));
                    let timed = self.time_kernel(k, inputs, set_index, flush.as_ref());
                    let ReadyKernel::Cuda(candidate) = std::mem::replace(&mut self.kernels[k], previous) else {
                        unreachable!("the candidate was just installed")
                    };
                    Ok((timed?, candidate))
                })();
                match attempt {
                    Ok((ms, candidate)) => {
                        timings.push((format!("{config:?}"), ms));
                        if best.as_ref().is_none_or(|(b, _, _)| ms < *b) {
                            best = Some((ms, ci, candidate));
                        }
                    }
                    Err(err) => tracing::warn!(target: "braze::autotune", kernel = %self.plan.kernels[k].name,
                        config = ?config, error = %err, "autotune candidate failed; skipped"),
                }
            }
            if let Some((ms, ci, winner)) = best {
                tracing::debug!(target: "braze::autotune", kernel = %self.plan.kernels[k].name, best = ?winner.config, ms, "autotuned");
                records.push(AutotuneRecord {
                    kernel: self.plan.kernels[k].name.clone(),
                    winner: format!("{:?}", winner.config),
                    winner_index: ci,
                    timings_ms: timings,
                });
                self.kernels[k] = ReadyKernel::Cuda(winner);
                if let Some(store) = AutotuneStore::open_default() {
                    store.remember(&target, &self.plan, k, ci);
                }
            }
        }
        // The timed launches may have raised checks that no run's copy reads: the next run
        // starts from zero words, as every run does.
        if let Some((words, _)) = &self.checks {
            self.device.memset_d8(words, 0)?;
        }
        for (i, copy) in &saved {
            self.device.copy(copy, 0, &inputs[*i], 0, copy.len_bytes())?;
        }
        // Graphs captured before tuning launch the old kernels.
        for set in &mut self.output_sets {
            set.graphs.clear();
            set.recent_direct.clear();
        }
        drop(outputs);
        Ok(records)
    }

    /// Times matmul `k` with each of the first cuBLASLt algorithms the heuristic offers for its
    /// bound operands and keeps the fastest (the heuristic's pick unless another beats it).
    /// Algorithms that fail to run are skipped with a warning.
    fn tune_matmul(
        &mut self,
        k: usize,
        inputs: &[DeviceBuffer],
        set_index: usize,
        flush: Option<&DeviceBuffer>,
    ) -> Result<Option<AutotuneRecord>> {
        let target = self.device.target().clone();
        let candidates = braze_codegen::candidate_configs(&self.plan, k, &target);
        // A matmul with k = 0 is a fill, no library call.
        if matches!(&self.kernels[k], ReadyKernel::Blas { matmul, .. } if matmul.k == 0) {
            return Ok(None);
        }
        let offered = (|| {
            let blas = self.blas.as_ref().expect("BLAS handle is created before tuning");
            let (spec, [a, b, c], bias) = self.matmul_call(k, inputs, &self.output_sets[set_index])?;
            blas.algorithm_count(&spec, a, b, c, bias, candidates.len())
        })();
        let offered = match offered {
            Ok(offered) => offered,
            Err(err) => {
                tracing::warn!(target: "braze::autotune", kernel = %self.plan.kernels[k].name, error = %err,
                    "no cuBLASLt algorithms to time; the heuristic's pick stays");
                return Ok(None);
            }
        };
        if offered < 2 {
            return Ok(None);
        }
        let mut timings = Vec::new();
        let mut best: Option<(f32, usize)> = None;
        for (rank, config) in candidates.iter().enumerate().take(offered) {
            self.set_matmul_algorithm(k, rank);
            match self.time_kernel(k, inputs, set_index, flush) {
                Ok(ms) => {
                    timings.push((format!("{config:?}"), ms));
                    if best.is_none_or(|(b, _)| ms < b) {
                        best = Some((ms, rank));
                    }
                }
                Err(err) => tracing::warn!(target: "braze::autotune", kernel = %self.plan.kernels[k].name,
                    config = ?config, error = %err, "autotune candidate failed; skipped"),
            }
        }
        let Some((ms, rank)) = best else {
            self.set_matmul_algorithm(k, 0);
            return Ok(None);
        };
        self.set_matmul_algorithm(k, rank);
        tracing::debug!(target: "braze::autotune", kernel = %self.plan.kernels[k].name, best = ?candidates[rank], ms, "autotuned");
        if let Some(store) = AutotuneStore::open_default() {
            store.remember(&target, &self.plan, k, rank);
        }
        Ok(Some(AutotuneRecord {
            kernel: self.plan.kernels[k].name.clone(),
            winner: format!("{:?}", candidates[rank]),
            winner_index: rank,
            timings_ms: timings,
        }))
    }

    fn set_matmul_algorithm(&mut self, k: usize, rank: usize) {
        if let ReadyKernel::Blas { algorithm, .. } = &mut self.kernels[k] {
            *algorithm = rank;
        }
    }

    /// Median time of one kernel over a few runs, in milliseconds, each after `flush` (when
    /// given) is written over, outside the timed span.
    fn time_kernel(
        &self,
        k: usize,
        inputs: &[DeviceBuffer],
        set_index: usize,
        flush: Option<&DeviceBuffer>,
    ) -> Result<f32> {
        let set = &self.output_sets[set_index];
        // Tables may hold pointers for another configuration's layout: the candidate's own
        // input-pointer tables are filled here.
        if let ReadyKernel::Cuda(cuda) = &self.kernels[k] {
            for table in cuda.tables.iter().filter(|t| t.pointers) {
                let pointers: Vec<u8> = self.plan.kernels[k]
                    .inputs
                    .iter()
                    .flat_map(|&id| {
                        let (b, off) = self.locate(id, inputs, set);
                        (b.device_address() + off as u64).to_le_bytes()
                    })
                    .collect();
                if table.buffer.len_bytes() < pointers.len() {
                    return Err(CudaError::InvalidArgument("autotune table too small".into()));
                }
                self.device.upload_into(&table.buffer, 0, &pointers)?;
            }
        }
        for _ in 0..3 {
            self.enqueue_kernel(k, inputs, set)?;
        }
        let mut samples = Vec::new();
        for _ in 0..10 {
            if let Some(flush) = flush {
                self.device.memset_d8(flush, 0)?;
            }
            samples.push(self.device.time_ms(|| self.enqueue_kernel(k, inputs, set))?);
        }
        samples.sort_by(f32::total_cmp);
        Ok(samples[samples.len() / 2])
    }
}
