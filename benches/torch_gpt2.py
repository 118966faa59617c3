#!/usr/bin/env python3
"""PyTorch baseline of the GPT-2 training workloads (benches/workloads.md, "Training"):
block_fwd, block_step and gpt2_step, with nanoGPT's model under nanoGPT's parameter names, so
its weights load into braze-nn as they are.

    python3 benches/torch_gpt2.py --json torch_gpt2.json                 # all, standard sizes
    python3 benches/torch_gpt2.py --only gpt2_step --write DIR           # also the check files
    python3 benches/torch_gpt2.py --device cpu --layers 2 --heads 2 --width 32 --vocab 64 \\
        --batch 2 --seq 16 --only gpt2_step --write DIR --no-time --curve-steps 10  # small, no GPU

`--write DIR` saves, as safetensors: `weights.safetensors` (the initial parameters, nanoGPT's
names, f32; metadata n_layer, n_head, n_embd, vocab_size, block_size, batch, steps (the logit
steps), curve_steps, autocast), for each of the first `--check-steps` steps `step-{k}.safetensors`
with the batch (`idx`, `targets`, i64), the logits of the first sequence (`logits0`, f32) and
the loss in f32 (`loss`), and `curve.safetensors` with the first `--curve-steps` steps (default
50) compactly: `idx` and `targets` `[N, B, T]` i64, `loss` `[N]` f32 and `grad_norm` `[N]` f32
(the global gradient norm before clipping); metadata steps, autocast. It is PyTorch's eager step
from the same parameters (AdamW lr 3e-4, betas 0.9/0.95, weight decay 0.1 on 2-D parameters,
gradient clipping 1.0), in f32, or with `--autocast bf16` the forward and loss under
`torch.autocast(dtype=torch.bfloat16)` (f32 parameters, as the timed gpt2_step); `braze gpt2-check
--torch-weights DIR` trains braze's compiled step on the same batches and compares the logits of
the first steps and the two loss curves.

Rows: median ms per step (CUDA events) after warm-up, tokens/s and, for gpt2_step, TFLOP/s by
nanoGPT's estimate (6 N + 12 L C T per token, N without the position table).
"""
import argparse, json, math, os, time

import torch
import torch.nn as nn
import torch.nn.functional as F

rows_out = []


class CausalSelfAttention(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.n_head = h
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(c), CausalSelfAttention(c, h), nn.LayerNorm(c), MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        c = a.width
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(a.vocab, c), wpe=nn.Embedding(a.seq, c),
            h=nn.ModuleList(Block(c, a.heads) for _ in range(a.layers)), ln_f=nn.LayerNorm(c)))
        self.lm_head = nn.Linear(c, a.vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * a.layers))

    def _init_weights(self, m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t, device=idx.device))
        for blk in self.transformer.h:
            x = blk(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def optimizer(model):
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    fused = next(model.parameters()).is_cuda
    return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), fused=fused)


def emit(workload, shape, variant, ms, tokens, extra=None):
    r = {"workload": workload, "shape": shape, "dtype": "bf16", "variant": variant, "us": ms * 1e3,
         "tokens_per_s": tokens / (ms * 1e-3)}
    r.update(extra or {})
    rows_out.append(r)
    print(f"{workload:11s} {shape:24s} {variant:28s} {ms:9.3f} ms {r['tokens_per_s']:12.0f} tok/s", flush=True)


def time_steps(step, steps, warmup=5):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        step()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]


def tokens(a, device):
    return torch.randint(0, a.vocab, (a.batch, a.seq), device=device)


def write_check(a, out):
    """nanoGPT's first steps from seeded weights, as safetensors for braze to check: the logits
    of the first `check_steps`, the batches, losses and gradient norms of the first `curve_steps`."""
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    model = GPT(a).to(a.device)
    meta = {k: str(v) for k, v in dict(n_layer=a.layers, n_head=a.heads, n_embd=a.width, vocab_size=a.vocab,
                                       block_size=a.seq, batch=a.batch, steps=a.check_steps,
                                       curve_steps=a.curve_steps, autocast=a.autocast).items()}
    weights = {n: p.detach().float().cpu().contiguous() for n, p in model.named_parameters()}
    save_file(weights, os.path.join(out, "weights.safetensors"), metadata=meta)
    opt = optimizer(model)
    device_type = torch.device(a.device).type
    idxs, tgts, losses, norms = [], [], [], []
    for k in range(max(a.check_steps, a.curve_steps)):
        idx, tgt = tokens(a, a.device), tokens(a, a.device)
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            logits, loss = model(idx, tgt)
        if k < a.check_steps:
            save_file({"idx": idx.cpu(), "targets": tgt.cpu(), "logits0": logits[0].detach().float().cpu().contiguous(),
                       "loss": loss.detach().float().cpu().reshape(1)}, os.path.join(out, f"step-{k}.safetensors"))
        del logits
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if k < a.curve_steps:
            idxs.append(idx.cpu())
            tgts.append(tgt.cpu())
            losses.append(loss.detach().float().cpu())
            norms.append(norm.detach().float().cpu())
        print(f"check step {k}: loss {loss.item():.6f}, grad norm {norm.item():.6f}")
    if a.curve_steps:
        save_file({"idx": torch.stack(idxs), "targets": torch.stack(tgts), "loss": torch.stack(losses),
                   "grad_norm": torch.stack(norms)}, os.path.join(out, "curve.safetensors"),
                  metadata={"steps": str(a.curve_steps), "autocast": a.autocast})


def gpt2_step(a):
    shape = f"L{a.layers} B{a.batch} T{a.seq} C{a.width}"
    tok = a.batch * a.seq
    for variant in ("eager", "compile"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = GPT(a).cuda()
        opt = optimizer(model)
        fwd = torch.compile(model) if variant == "compile" else model
        idx, tgt = tokens(a, "cuda"), tokens(a, "cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                _, loss = fwd(idx, tgt)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        cold = time.perf_counter() - t0
        ms = time_steps(step, a.steps)
        n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
        flops = (6 * n + 12 * a.layers * a.width * a.seq) * tok
        emit("gpt2_step", shape, f"{variant} + AdamW(fused)", ms, tok,
             {"cold_s": cold, "params": n, "tflops": flops / (ms * 1e-3) / 1e12})
        del model, opt


def block(a, backward):
    torch.manual_seed(0)
    name = "block_step" if backward else "block_fwd"
    shape = f"B{a.batch} T{a.seq} C{a.width} H{a.heads}"
    blk = Block(a.width, a.heads).cuda().to(torch.bfloat16)
    x = torch.randn(a.batch, a.seq, a.width, device="cuda", dtype=torch.bfloat16)
    for variant in ("eager", "compile"):
        torch._dynamo.reset()
        f = torch.compile(blk) if variant == "compile" else blk

        def step():
            y = f(x)
            if backward:
                y.float().mean().backward()

        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        emit(name, shape, variant, time_steps(step, a.steps), a.batch * a.seq, {"cold_s": time.perf_counter() - t0})


def add_size_args(p):
    """The model's and the batch's sizes (GPT-2 124M at B=16, T=1024 by default)."""
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--only", default="block_fwd,block_step,gpt2_step")
    add_size_args(p)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--write", help="write the check files for braze gpt2-check here")
    p.add_argument("--check-steps", type=int, default=3, help="steps whose logits --write saves")
    p.add_argument("--curve-steps", type=int, default=50, help="steps whose batches and losses --write saves")
    p.add_argument("--autocast", choices=("none", "bf16"), default="none",
                   help="--write's steps in f32 (none) or under bf16 autocast")
    p.add_argument("--no-time", action="store_true", help="only --write, no timing")
    a = p.parse_args()
    if a.write:
        write_check(a, a.write)
    if a.no_time:
        return
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    print(json.dumps(env))
    only = a.only.split(",")
    if "block_fwd" in only:
        block(a, backward=False)
    if "block_step" in only:
        block(a, backward=True)
    if "gpt2_step" in only:
        gpt2_step(a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"env": env, "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
