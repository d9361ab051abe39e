"""The example's policy and task: a small decoder-only transformer that learns,
from rewards alone, to write a short sequence of digits in reverse.

Both sides build the same module from the same seed, so an inference worker
starts holding the trainer's version 0 (rlorch requires it: the first
broadcast follows step 0). The trainer keeps it in fp32; an inference worker
casts it to bf16, the wire dtype, and the broadcast writes into those very
parameters.
"""

import json
import math
import random

import torch
import torch.nn.functional as F
from torch import nn

# ---- the task -------------------------------------------------------------------

DIGITS = 10
BOS = 10
SEP = 11
VOCAB = 12
N_DIGITS = 3
PROMPT_LEN = N_DIGITS + 2          # BOS d1 d2 d3 SEP
MAX_TOKENS = N_DIGITS              # the completion: the digits reversed
MAX_LEN = PROMPT_LEN + MAX_TOKENS

# A completion of tokens drawn uniformly from the vocabulary scores this on
# average: each position is right with probability 1/VOCAB.
CHANCE = 1.0 / VOCAB


def make_prompts(n, seed):
    """n JSONL lines for the orchestrator's prompt source: the prompt's token
    ids and, in its metadata, the reference answer the reward checks."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        digits = [rng.randrange(DIGITS) for _ in range(N_DIGITS)]
        answer = list(reversed(digits))
        lines.append(json.dumps({"prompt_token_ids": [BOS, *digits, SEP],
                                 "metadata": json.dumps({"answer": answer})}))
    return lines


def answer_of(metadata):
    """The reference answer carried in a prompt's metadata (bytes or str)."""
    if isinstance(metadata, (bytes, bytearray)):
        metadata = metadata.decode()
    answer = json.loads(metadata)["answer"]
    if (not isinstance(answer, list) or len(answer) != N_DIGITS
            or not all(isinstance(d, int) and 0 <= d < DIGITS for d in answer)):
        raise ValueError(f"prompt metadata: 'answer' must be {N_DIGITS} digits, got {answer!r}")
    return answer


def reward(completion, answer):
    """The checker: the share of positions that hold the right digit (partial
    credit, so that learning has a gradient before whole answers come out)."""
    right = sum(1 for i, d in enumerate(answer) if i < len(completion) and completion[i] == d)
    return right / len(answer)


# ---- the policy -----------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Policy(nn.Module):
    def __init__(self, width=64, layers=2, heads=4, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, width)
        self.pos = nn.Embedding(MAX_LEN, width)
        self.layers = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)
        # A small output layer: the initial policy is close to uniform, so the
        # run starts at chance.
        with torch.no_grad():
            self.head.weight.mul_(0.1)
            self.head.bias.zero_()
        self.register_buffer("mask", torch.ones(MAX_LEN, MAX_LEN, dtype=torch.bool).triu(1),
                             persistent=False)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.embed(ids) + self.pos(torch.arange(t, device=ids.device))
        for layer in self.layers:
            x = layer(x, self.mask)
        # Logits in fp32 whatever the weights' dtype, as engines compute
        # logprobs: the bf16 rounding stays in the weights and activations.
        return self.head(self.ln_f(x)).float()

    def token_logprobs(self, prompt_ids, completion_ids, temperature=1.0):
        """Per-token logprobs of the completions under the sampling
        distribution (logits / temperature), by teacher forcing: [B, T]."""
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        logits = self(ids[:, :-1])[:, prompt_ids.shape[1] - 1:]
        logp = (logits / temperature).log_softmax(dim=-1)
        return logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def sample(self, prompt_ids, count, max_tokens, temperature, generator, top_k=0, top_p=1.0):
        """count completions of one prompt: token ids [count, max_tokens] and
        the logprob of each sampled token under the distribution sampled from.
        Temperature 0 is greedy (logprob 0: the choice was certain)."""
        dev = next(self.parameters()).device
        ids = torch.tensor([prompt_ids] * count, dtype=torch.long, device=dev)
        out, lps = [], []
        for _ in range(max_tokens):
            logits = self(ids)[:, -1]
            if temperature <= 0:
                tok = logits.argmax(dim=-1)
                lp = torch.zeros(count, device=dev)
            else:
                logp = (logits / temperature).log_softmax(dim=-1)
                logp = _truncate(logp, top_k, top_p)
                tok = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
                lp = logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
            out.append(tok)
            lps.append(lp)
            ids = torch.cat([ids, tok.unsqueeze(-1)], dim=1)
        return torch.stack(out, dim=1), torch.stack(lps, dim=1)


def _truncate(logp, top_k, top_p):
    """top-k and nucleus truncation, renormalised (logprobs then describe the
    distribution actually sampled from)."""
    if top_k and 0 < top_k < logp.shape[-1]:
        kth = logp.topk(top_k, dim=-1).values[:, -1:]
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if top_p and 0 < top_p < 1:
        srt, idx = logp.sort(dim=-1, descending=True)
        cum = srt.exp().cumsum(dim=-1)
        drop = cum - srt.exp() > top_p
        logp = logp.masked_fill(torch.zeros_like(drop).scatter(-1, idx, drop), float("-inf"))
    return logp.log_softmax(dim=-1)


# ---- GRPO ----------------------------------------------------------------------

def group_advantages(rewards, group_ids, eps=1e-6):
    """GRPO's advantage: each completion's reward minus its group's mean, over
    the group's standard deviation (a group all alike teaches nothing: 0)."""
    adv = torch.zeros_like(rewards)
    for g in group_ids.unique():
        sel = group_ids == g
        r = rewards[sel]
        std = r.std(unbiased=False)
        adv[sel] = (r - r.mean()) / (std + eps) if std > eps else 0.0
    return adv


def grpo_loss(new_logp, old_logp, adv, mask, clip=0.2):
    """The clipped surrogate, averaged over the completion tokens (mask), with
    the sampling logprobs of the inference workers as the behaviour policy (a
    batch may hold rollouts one version old: the ratio corrects for it)."""
    ratio = (new_logp - old_logp).exp()
    a = adv.unsqueeze(-1)
    surrogate = torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)
    mask = mask.float()
    return -(surrogate * mask).sum() / mask.sum().clamp(min=1.0)


def cuda_index(device):
    """The CUDA device number rlorch is told (-1: none) for a torch device."""
    if device.type != "cuda":
        return -1
    return device.index if device.index is not None else torch.cuda.current_device()
