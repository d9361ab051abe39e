"""What the Python SDK test programs agree on: a small torch policy (the
trainer's, fp32, by the names a trainer sends), the inference side's own
variants of it (bf16; one with q/k/v and gate/up fused and its names under
"model."), LoRA adapters, and the made-up completions an inference program
reports, so that the trainer can check what it was sent."""
import math

import torch
from torch import nn

V, D, LAYERS, LORA_R = 64, 16, 2, 4
SEED = 1234


class Layer(nn.Module):
    def __init__(self, lora):
        super().__init__()
        self.attn = nn.Module()
        self.attn.q = nn.Linear(D, D, bias=False)
        self.attn.k = nn.Linear(D, D // 2, bias=False)
        self.attn.v = nn.Linear(D, D // 2, bias=False)
        self.attn.o = nn.Linear(2 * D, D, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate = nn.Linear(D, 2 * D, bias=False)
        self.mlp.up = nn.Linear(D, 2 * D, bias=False)
        self.mlp.down = nn.Linear(2 * D, D, bias=False)
        if lora:
            self.attn.q_lora_A = nn.Parameter(torch.randn(LORA_R, D) * 0.1)
            self.attn.q_lora_B = nn.Parameter(torch.randn(D, LORA_R) * 0.1)

    def qkv(self, x):
        q = self.attn.q(x)
        if hasattr(self.attn, "q_lora_A"):
            q = q + x @ self.attn.q_lora_A.t() @ self.attn.q_lora_B.t()
        return torch.cat([q, self.attn.k(x), self.attn.v(x)], dim=-1)

    def forward(self, x):
        x = x + torch.tanh(self.attn.o(self.qkv(x)))
        return x + self.mlp.down(nn.functional.silu(self.mlp.gate(x)) * self.mlp.up(x))


class Policy(nn.Module):
    """Names as the trainer sends them: embed.weight, layers.N.attn.q.weight, ..."""

    def __init__(self, lora=False):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.layers = nn.ModuleList([Layer(lora) for _ in range(LAYERS)])
        self.norm = nn.Parameter(torch.ones(D))
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, prompt_ids, prompt_mask):
        m = prompt_mask.to(self.embed.weight.dtype).unsqueeze(-1)
        x = (self.embed(prompt_ids % V) * m).sum(1) / m.sum(1).clamp(min=1)
        for layer in self.layers:
            x = layer(x)
        return torch.log_softmax(self.head(x * self.norm), dim=-1)


def trainer_model(lora=False):
    torch.manual_seed(SEED)
    m = Policy(lora)
    if lora:
        for n, p in m.named_parameters():
            p.requires_grad_("lora_" in n)
    return m


class FusedLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(D, 2 * D, bias=False)
        self.attn.o = nn.Linear(2 * D, D, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_up = nn.Linear(D, 4 * D, bias=False)
        self.mlp.down = nn.Linear(2 * D, D, bias=False)


class FusedEngine(nn.Module):
    """An engine's layout: q/k/v and gate/up fused, everything under "model."."""

    def __init__(self):
        super().__init__()
        self.model = nn.Module()
        self.model.embed = nn.Embedding(V, D)
        self.model.layers = nn.ModuleList([FusedLayer() for _ in range(LAYERS)])
        self.model.norm = nn.Parameter(torch.ones(D))
        self.model.head = nn.Linear(D, V, bias=False)


def fused_spec():
    """{engine name: [(trainer name, rows)]}: q has D rows, k and v D/2 each
    (grouped-query attention); gate and up split evenly."""
    spec = {}
    for i in range(LAYERS):
        t = f"layers.{i}"
        spec[f"model.{t}.attn.qkv.weight"] = [(f"{t}.attn.q.weight", D), (f"{t}.attn.k.weight", D // 2),
                                               (f"{t}.attn.v.weight", D // 2)]
        spec[f"model.{t}.mlp.gate_up.weight"] = [f"{t}.mlp.gate.weight", f"{t}.mlp.up.weight"]
    return spec


def engine_name_map(name):
    return name[len("model."):] if name.startswith("model.") else None


def inference_model(fused=False, lora=False):
    """The engine's own bf16 model holding the trainer's version 0 (as if
    loaded from the same checkpoint)."""
    src = trainer_model(lora).state_dict()
    if not fused:
        m = Policy(lora)
        m.load_state_dict(src)
        return m.to(torch.bfloat16)
    m = FusedEngine()
    sd = {}
    for name, parts in fused_spec().items():
        sd[name] = torch.cat([src[p if isinstance(p, str) else p[0]] for p in parts], dim=0)
    for name, _ in m.named_parameters():
        if name not in sd:
            sd[name] = src[engine_name_map(name)]
    m.load_state_dict(sd)
    return m.to(torch.bfloat16)


def expected_views(model, fused):
    """{trainer name: the engine's tensor holding it} (slices of fused ones)."""
    params = dict(model.named_parameters())
    if not fused:
        return {n: p.detach() for n, p in params.items()}
    out = {}
    spec = fused_spec()
    for name, p in params.items():
        if name in spec:
            parts = spec[name]
            rows = [r for _, r in parts] if not isinstance(parts[0], str) else \
                [p.shape[0] // len(parts)] * len(parts)
            names = [x if isinstance(x, str) else x[0] for x in parts]
            for n, piece in zip(names, p.detach().split(rows, dim=0)):
                out[n] = piece
        else:
            out[engine_name_map(name)] = p.detach()
    return out


# ---- completions: a function of (group, index in the group, prompt) -------------------

def completion_tokens(group, j, prompt):
    n = 3 + (group * 5 + j) % 6
    base = sum(prompt) if prompt else 0
    return [(group * 31 + j * 7 + t * 3 + base) % 1000 for t in range(n)]


def completion_logprobs(group, j, n):
    return [-0.01 * (t + 1) - 0.001 * j - 0.0001 * (group % 7) for t in range(n)]


def completion_reward(group, j):
    return math.sin(group * 0.7 + j) * 0.5 + 0.5
