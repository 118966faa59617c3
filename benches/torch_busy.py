#!/usr/bin/env python3
"""The PyTorch side of `braze bench --only busy,busy_gpt2`: a training loop written two ways, on
`mlp_step` (`--model mlp`, the default) or nanoGPT's `gpt2_step` (`--model gpt2`).

The naive loop reads its metric with a host copy every step (`loss.item()`), checks for NaN in an
`if` (another sync), uploads each batch from pageable memory and runs the step eagerly. The tuned
loop is what braze's loop does, in PyTorch: the forward and loss through
`torch.compile(fullgraph=True, mode="reduce-overhead")` (CUDA graphs), running sums of the loss and
of NaN losses kept on the device and copied into pinned memory every `--read-every` steps without
waiting, and batches copied from pinned memory on a second stream while the previous step runs
(double-buffered, ordered by events). The model, sizes, batches and optimizer are those of
torch_train.py and braze's `busy` section (crates/cli/src/bench/busy_loops.rs). For gpt2 they
are torch_gpt2.py's (GPT-2 124M, B=16, T=1024, bf16 autocast, clipping 1.0, fused AdamW) and
braze's `busy_gpt2` section; the tuned loop compiles the model in torch.compile's default mode,
as torch_gpt2.py times it (at 34 ms a step, CUDA graphs save nothing worth their memory).

    python3 benches/torch_busy.py --json torch_busy.json
    python3 benches/torch_busy.py --rows 256 --hidden 256 --steps 100    # a quick run
    python3 benches/torch_busy.py --model gpt2 --steps 100 --json torch_busy_gpt2.json

Each loop runs untimed for warm-up steps, then `--steps` steps timed on the host clock (steps/s),
then again under torch.profiler for GPU busy %: the union of the GPU kernels' and copies' time
within the steps' window, over the window. Host syncs per step are counted with
torch.cuda.set_sync_debug_mode("warn"). Rows use braze's keys (workload, shape, dtype, variant).
"""
import argparse
import json
import time
import warnings

import torch

from torch_gpt2 import add_size_args
from torch_train import LAYERS, adamw, init_params, loss_fn

BATCHES = 4
WARMUP_STEPS = 2


def workload(a):
    return "busy_gpt2" if a.model == "gpt2" else "busy"


def shape_key(a):
    """braze's key: the batch's shape, or the model's."""
    if a.model == "gpt2":
        return f"L{a.layers} B{a.batch} T{a.seq} C{a.width}"
    return f"[{a.rows},{a.hidden}]"


def host_batches(a, dtype):
    """BATCHES pageable host batches (x, target) or (idx, targets), cycled by both loops."""
    generator = torch.Generator().manual_seed(a.seed + 7000)
    if a.model == "gpt2":
        return [(torch.randint(0, a.vocab, (a.batch, a.seq), generator=generator),
                 torch.randint(0, a.vocab, (a.batch, a.seq), generator=generator)) for _ in range(BATCHES)]
    return [
        (torch.randn(a.rows, a.hidden, generator=generator).to(dtype),
         torch.randn(a.rows, a.hidden, generator=generator).to(dtype))
        for _ in range(BATCHES)
    ]


class Gpt2Step:
    """nanoGPT's training step as torch_gpt2.py times it: the forward and loss under bf16
    autocast (the model compiled or not), backward, clipping at 1.0, fused AdamW."""

    def __init__(self, a, compiled):
        from torch_gpt2 import GPT, optimizer
        torch.manual_seed(a.seed)
        self.model = GPT(a).cuda()
        self.opt = optimizer(self.model)
        self.forward = torch.compile(self.model) if compiled else self.model

    def __call__(self, idx, targets):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = self.forward(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss


class MlpStep:
    """mlp_step as torch_train.py defines it; `compiled`: the forward and loss through
    torch.compile(fullgraph=True, mode="reduce-overhead")."""

    def __init__(self, a, dtype, compiled):
        self.params = init_params(a.rows, a.hidden, dtype, "cuda", a.seed)
        self.opt = adamw(self.params, "cuda")
        self.loss = torch.compile(loss_fn, fullgraph=True, mode="reduce-overhead") if compiled else loss_fn
        self.compiled = compiled

    def __call__(self, x, target):
        if self.compiled:
            torch.compiler.cudagraph_mark_step_begin()
        loss = self.loss(self.params, x, target)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss


def make_step(a, dtype, compiled):
    return Gpt2Step(a, compiled) if a.model == "gpt2" else MlpStep(a, dtype, compiled)


def naive_loop(a, dtype):
    step = make_step(a, dtype, compiled=False)
    batches = host_batches(a, dtype)

    def run(steps, first):
        total = 0.0
        for i in range(first, first + steps):
            x, target = batches[i % BATCHES]
            x, target = x.to("cuda"), target.to("cuda")  # pageable: staged, overlaps nothing
            loss = step(x, target)
            total += loss.item()  # the metric, a host copy every step
            if torch.isnan(loss):  # a NaN check in an `if`: another sync
                raise RuntimeError(f"the loss is NaN at step {i}")
        return total / steps

    return run


class Prefetcher:
    """Batch N+1 copied from pinned memory on a side stream while step N runs."""

    def __init__(self, batches, steps):
        self.pinned = [(x.pin_memory(), t.pin_memory()) for x, t in batches]
        self.steps = steps
        self.stream = torch.cuda.Stream()
        self.next = None
        self.i = 0

    def _start(self, i):
        x, target = self.pinned[i % BATCHES]
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            dx = x.to("cuda", non_blocking=True)
            dt = target.to("cuda", non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        return dx, dt, done

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.steps:
            raise StopIteration
        if self.next is None:
            self.next = self._start(self.i)
        x, target, done = self.next
        torch.cuda.current_stream().wait_event(done)
        x.record_stream(torch.cuda.current_stream())
        target.record_stream(torch.cuda.current_stream())
        self.i += 1
        self.next = self._start(self.i) if self.i < self.steps else None
        return x, target


class DeviceMetric:
    """A running sum on the device, copied into pinned memory every `every` adds, read once its
    event has completed."""

    def __init__(self, every):
        self.sum = torch.zeros((), device="cuda", dtype=torch.float32)
        self.count, self.every = 0, every
        self.pending, self.latest = [], None

    def add(self, value):
        self.sum += value.detach().float().sum()
        self.count += 1
        if self.count % self.every == 0:
            self.request()

    def request(self):
        host = torch.empty((), dtype=torch.float32, pin_memory=True)
        host.copy_(self.sum, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self.pending.append((host, done, self.count))

    def poll(self):
        arrived = None
        while self.pending and self.pending[0][1].query():
            host, _, count = self.pending.pop(0)
            arrived = (host.item(), count)  # pinned host memory: no device sync
        if arrived is not None:
            self.latest = arrived
        return arrived


def tuned_loop(a, dtype):
    step = make_step(a, dtype, compiled=True)
    batches = host_batches(a, dtype)

    def run(steps, first):
        loss_sum, nan_sum = DeviceMetric(a.read_every), DeviceMetric(a.read_every)
        for i, (x, target) in enumerate(Prefetcher(batches[first % BATCHES:] + batches[:first % BATCHES], steps)):
            loss = step(x, target)
            loss_sum.add(loss)
            nan_sum.add(torch.isnan(loss))
            reading = nan_sum.poll()
            if reading is not None and reading[0] > 0:
                raise RuntimeError(f"a loss was NaN by step {i}")
            loss_sum.poll()
        loss_sum.request()
        torch.cuda.synchronize()  # the end of the loop: the last reading
        total, count = loss_sum.poll()
        return total / count

    return run


def count_syncs(run, steps):
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run(steps, WARMUP_STEPS)
        return sum("synchroniz" in str(w.message) for w in caught)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def busy_percent(run, steps):
    """GPU busy % of the steps' window, from the profiler's GPU kernel and copy events. Only the
    CUDA activity is recorded, and the raw events are read where the profiler hands them out:
    building the CPU op tree of 100 eager GPT-2 steps took longer than the loop itself."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(steps, WARMUP_STEPS)
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    intervals = []
    raw = getattr(getattr(prof.profiler, "kineto_results", None), "events", None)
    if raw is not None:
        for e in raw():
            if e.device_type() == cuda and e.duration_ns() > 0:
                intervals.append((e.start_ns() / 1e3, (e.start_ns() + e.duration_ns()) / 1e3))
    else:
        for e in prof.events():
            if e.device_type == cuda and e.time_range.end > e.time_range.start:
                intervals.append((e.time_range.start, e.time_range.end))
    if not intervals:
        return None
    intervals.sort()
    busy, (lo, hi) = 0.0, intervals[0]
    window = (intervals[0][0], max(end for _, end in intervals))
    for start, end in intervals[1:]:
        if start > hi:
            busy += hi - lo
            lo, hi = start, end
        else:
            hi = max(hi, end)
    busy += hi - lo
    return 100.0 * busy / (window[1] - window[0])


def measure(name, make, a, dtype):
    run = make(a, dtype)
    run(WARMUP_STEPS, 0)
    torch.cuda.synchronize()
    start = time.perf_counter()
    mean_loss = run(a.steps, WARMUP_STEPS)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    syncs = count_syncs(run, a.steps)
    busy = busy_percent(run, a.steps)
    steps_per_s = a.steps / seconds
    row = {
        "workload": workload(a), "shape": shape_key(a), "dtype": "bf16", "variant": name,
        "us": 1e6 / steps_per_s, "gbps": None, "steps": a.steps, "steps_per_s": steps_per_s, "busy_percent": busy,
        "syncs_per_step": syncs / a.steps, "mean_loss": mean_loss,
        "note": f"{a.steps} steps: {steps_per_s:.1f} steps/s, GPU busy {'-' if busy is None else f'{busy:.1f}%'}, "
                f"{syncs / a.steps:.2f} syncs/step, mean loss {mean_loss:.5f}",
    }
    print(json.dumps(row), flush=True)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("mlp", "gpt2"), default="mlp")
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--read-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    add_size_args(p)  # --model gpt2: torch_gpt2.py's sizes
    p.add_argument("--json", help="write {env, rows} here")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_busy.py needs a CUDA GPU")
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "model": a.model,
           "layers": a.layers if a.model == "gpt2" else LAYERS,
           "timing": f"host clock over {a.steps} steps after {WARMUP_STEPS} warm-up steps; busy % from torch.profiler"}
    print(json.dumps(env), flush=True)
    rows = [measure("torch naive loop", naive_loop, a, torch.bfloat16),
            measure("torch tuned loop", tuned_loop, a, torch.bfloat16)]
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
