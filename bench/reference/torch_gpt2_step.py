#!/usr/bin/env python3
"""The PyTorch peer of device_session's GPT-2 step: the same model (GPT-2 124M: 12 layers, 768 wide, 12 heads,
vocabulary 50257 unpadded, tied head, learned positions, tanh GELU, LayerNorm eps 1e-5), the same batch shape, AdamW
with upstream Levanter's defaults (lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1), bf16 autocast and
scaled_dot_product_attention; timed eager and under torch.compile. Prints `@row` lines that scripts/device-session.sh
puts in its summary, and one JSON line per mode.

    python3 bench/reference/torch_gpt2_step.py --batch 8 --seq 1024            # on the GPU machine
    python3 bench/reference/torch_gpt2_step.py --small --batch 4 --seq 128     # a 2-layer model, on a CPU

MFU follows the llm.c convention the kit uses: 6 x parameters x tokens/s over 989 TFLOP/s (dense bf16, H100/H200).
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width, eps=1e-5)
        self.c_attn = nn.Linear(width, 3 * width)
        self.attn_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width, eps=1e-5)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, e = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(e, dim=2)
        shape = (b, t, self.heads, e // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, e))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self, vocab, seq, width, layers, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, eps=1e-5)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids, targets):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5, help="timed steps after the warm-up")
    ap.add_argument("--small", action="store_true", help="2 layers, 128 wide, vocabulary 2048 (as device_session --small)")
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    a = ap.parse_args()

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if a.threads:
        torch.set_num_threads(a.threads)
    width, layers, heads, vocab = (128, 2, 4, 2048) if a.small else (768, 12, 12, 50257)
    torch.manual_seed(0)
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        name = torch.cuda.get_device_name()
    else:
        name = f"CPU, {torch.get_num_threads()} threads"
    what = f"{'GPT-2 (2 layers, 128 wide)' if a.small else 'GPT-2 124M'}, {a.batch} x {a.seq}, {a.precision}"
    print(f"torch {torch.__version__} on {name}: {what}", flush=True)
    ids = torch.randint(1, vocab, (a.batch, a.seq + 1), device=dev)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    tokens = a.batch * a.seq
    for mode in a.modes.split(","):
        torch.manual_seed(0)
        model = Gpt2(vocab, a.seq, width, layers, heads).to(dev)
        params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                **({"fused": True} if dev == "cuda" else {}))
        run = torch.compile(model) if mode == "compile" else model

        def step():
            with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
                loss = run(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        def sync():
            if dev == "cuda":
                torch.cuda.synchronize()

        t0 = time.perf_counter()
        for _ in range(2):
            loss = step()
        sync()
        warm = time.perf_counter() - t0
        times = []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            loss = step()
            sync()
            times.append(time.perf_counter() - t0)
        s = statistics.median(times)
        tps = tokens / s
        mfu = 6 * params * tps / 989e12
        out = {"mode": mode, "device": name, "torch": torch.__version__, "params": params, "batch": a.batch,
               "seq": a.seq, "precision": a.precision, "s_per_step": s, "tokens_per_s": tps,
               "warmup_s": warm, "loss": loss.item()}
        print(json.dumps(out), flush=True)
        note = f"torch {torch.__version__}, {'fused AdamW, ' if dev == 'cuda' else ''}SDPA; 2 warm-up steps took {warm:.1f} s"
        print(f"@row\tpeer: PyTorch, {what}\t{mode}: time per step\t{s:.4f} s\t{tps:.0f} tokens/s\t{note}", flush=True)
        if dev == "cuda":
            print(f"@row\tpeer: PyTorch, {what}\t{mode}: MFU\t{mfu:.4f} of 989 TFLOP/s\t\t", flush=True)
        if not math.isfinite(loss.item()):
            print(f"torch_gpt2_step: {mode} loss is not finite", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
