"""Train an EAGLE-1 or EAGLE-3 draft head on a frozen target (docs/TRAINING.md).

Alignment (docs/TRAINING.md, "Alignment"): pair i of a sequence is (feature f_i, token t_{i+1}); the head turns it
into a predicted feature of position i+1 whose logits give the draft distribution of token t_{i+2}. The
target's distribution for that token is softmax(lm_head(hidden_{i+1})), recomputed from the stored final
hidden state. Pair i has rotary position i (only differences matter).

Training-time test (TTT), k unrolled steps: step 0 runs every pair on the true features. Step j > 0 runs
pair i on the head's own output of step j-1 at pair i (the pre-norm recurrent feature) and the TRUE token
t_{i+j+1}, at position i+j, predicting token t_{i+j+2}. Its attention sees the step-0 keys of pairs 0..i
(causal) and, for every earlier step, the key of pair i of that step, and itself: exactly what drafting
sees at inference, where the draft cache holds the prefix's keys (true features) and one key per earlier
draft step. It is implemented WITHOUT the KV cache: each layer keeps its keys/values of every step and step
j attends over the concatenated [(j+1) * P] keys with an explicit mask (causal block + j diagonal blocks).
Step losses are weighted ``step_weight ** j`` (0.8 in the reference). ``tests/test_train.py`` checks this
unroll against the head's own cached forward.

Objectives:
  * EAGLE-1: SmoothL1(f_pred, f_true) + ce_weight * soft CE(p_true, p_pred) over the full vocabulary, with
    uniform noise U(-feature_noise, feature_noise) (default 0.1) on the input features;
  * EAGLE-3: soft CE over the draft vocabulary only: the target distribution restricted to the draft ids
    and renormalized; positions whose target argmax lies outside the draft vocabulary are masked. The draft
    vocabulary is the ``draft_vocab_size`` most frequent loss-masked (assistant) tokens of the training split.
Only positions whose predicted token is an assistant token (loss mask) count. Each step's loss is
normalized by its number of counted positions in the whole optimizer step (all micro-batches, all ranks),
so a data-parallel step equals the single-process step on the same global batch.

Data parallel: launch with ``torchrun --nproc_per_node N -m eaglespec.cli train ...`` (gloo on CPU, nccl
on GPU). Each rank reads its share of every global batch (``features.epoch_batches``); gradients are
all-reduced by DistributedDataParallel (loss scaled by the world size, since DDP averages).

Checkpoints (rank 0, every ``checkpoint_every`` steps): ``out_dir/checkpoints/step-XXXXXXXX/`` holding the
head (``save_head`` layout) and ``state.pt`` (optimizer, scheduler, RNG states of every rank, data
position), written to a temporary directory and renamed; ``out_dir/checkpoints/latest`` names the newest.
``resume=True`` continues from it with the same data order, so an interrupted run ends where an
uninterrupted one would. The final head goes to ``out_dir/head``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import sys
import time
import typing
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from eaglespec.train.features import FeatureBatch, FeatureStore, OfflineFeatures, OnlineFeatures
from eaglespec.spec.heads import DraftHead, HeadConfig, load_head, save_head
from eaglespec.runtime.model import decoder_layer, grouped_sdpa

log = logging.getLogger(__name__)

__all__ = [
    "StepPlan",
    "TTTUnroll",
    "TrainConfig",
    "acceptance_eval",
    "eval_due",
    "select_draft_vocab",
    "split_indices",
    "train",
    "ttt_mask",
]

CHECKPOINT_DIR = "checkpoints"
LATEST_FILE = "latest"
STATE_FILE = "state.pt"


# ================================================================================================ config
def _opt(help_: str) -> dict[str, str]:
    return {"help": help_}


@dataclass
class TrainConfig:
    """Everything a training run needs; loadable from YAML (``from_yaml``), every field is also a CLI flag."""

    # ---- target and head
    model: str | None = field(default=None, metadata=_opt("target: HF dir or .gguf (None = default SmolLM2)"))
    model_dtype: str = field(default="float32", metadata=_opt("target dtype (float32, bfloat16)"))
    device: str = field(default="cpu", metadata=_opt("cpu or cuda (under torchrun: cuda:LOCAL_RANK)"))
    kind: str = field(default="eagle3", metadata=_opt("head kind: eagle3 or eagle1"))
    num_layers: int = field(default=1, metadata=_opt("decoder layers of the head"))
    fc_bias: bool | None = field(default=None, metadata=_opt(
        "EAGLE-1: fc has a bias (None = yes, as the EAGLE reference heads; vLLM's EAGLE-1 loader needs false)"))
    draft_vocab_size: int | None = field(default=8192, metadata=_opt(
        "EAGLE-3 draft vocabulary size (None = the full target vocabulary)"))
    feature_layer_ids: tuple[int, ...] | None = field(default=None, metadata=_opt(
        "EAGLE-3 feature layers, HF hidden_states indices (default: the captured ones, else (2, L//2, L-3))"))
    # ---- data
    init_head: str | None = field(default=None, metadata=_opt(
        "start from this head's weights and draft vocabulary (fine-tuning; shape and tapped layers must match)"))
    init_vocab: str = field(default="head", metadata=_opt(
        "with init_head: keep the head's draft vocabulary (head) or select a new one from this data (data: "
        "lm_head rows of kept tokens are copied, new tokens' rows mapped from the target's lm_head)"))
    features: str | None = field(default=None, metadata=_opt("capture directory (offline features)"))
    data: str | None = field(default=None, metadata=_opt(
        "prepared data directory: features computed on the fly by the target (online)"))
    max_len: int | None = field(default=None, metadata=_opt("truncate training records to this many tokens"))
    eval_records: int = field(default=32, metadata=_opt("records held out for evaluation (0 = none)"))
    eval_ids: str | None = field(default=None, metadata=_opt(
        "file of record ids to hold out (one per line, e.g. an earlier run's out_dir/eval_ids.txt) in place of "
        "a seeded choice: a continuation on grown data is then evaluated on records no stage trained on; "
        "needs --data and exactly eval_records ids"))
    # ---- objective
    ttt_steps: int = field(default=3, metadata=_opt("training-time-test unrolled steps k (1 = no TTT)"))
    step_weight: float = field(default=0.8, metadata=_opt("loss weight of step j is step_weight ** j"))
    feature_noise: float | None = field(default=None, metadata=_opt(
        "uniform noise amplitude on input features (None = 0.1 for eagle1, 0 for eagle3)"))
    labels: str = field(default="soft", metadata=_opt(
        "token objective: soft (cross-entropy to the target's distribution), hard (to its argmax) or mixed"))
    hard_weight: float = field(default=0.5, metadata=_opt("labels=mixed: weight of the hard term (soft: 1 - it)"))
    ce_weight: float = field(default=0.1, metadata=_opt("EAGLE-1: weight of the token cross-entropy"))
    feature_weight: float = field(default=1.0, metadata=_opt("EAGLE-1: weight of the SmoothL1 feature loss"))
    # ---- optimization
    lr: float = field(default=1e-4, metadata=_opt("peak learning rate (AdamW)"))
    betas: tuple[float, float] = field(default=(0.9, 0.95), metadata=_opt("AdamW betas"))
    weight_decay: float = field(default=0.0, metadata=_opt("AdamW weight decay"))
    warmup_steps: int = field(default=50, metadata=_opt("linear warm-up steps"))
    schedule: str = field(default="cosine", metadata=_opt("decay after warm-up: cosine, linear or constant"))
    min_lr_ratio: float = field(default=0.1, metadata=_opt("final lr / peak lr (cosine, linear)"))
    grad_clip: float = field(default=0.5, metadata=_opt("max gradient norm (0 = off)"))
    precision: str = field(default="fp32", metadata=_opt("fp32 or bf16 (autocast; fp32 master weights)"))
    batch_size: int = field(default=4, metadata=_opt("records per micro-batch per rank"))
    grad_accum: int = field(default=1, metadata=_opt("micro-batches per optimizer step"))
    max_steps: int = field(default=1000, metadata=_opt("optimizer steps (with time_budget: the most steps)"))
    time_budget: float | None = field(default=None, metadata=_opt(
        "seconds of training (evaluations and checkpoints included, summed over resumes): the step count is "
        "fitted to it from the measured step time, so the lr schedule ends when the budget does"))
    seed: int = field(default=0, metadata=_opt("seed of the head init, data order, split and noise"))
    # ---- output, evaluation
    out_dir: str = field(default="runs/head", metadata=_opt("checkpoints, metrics.jsonl and the final head/"))
    checkpoint_every: int = field(default=200, metadata=_opt("steps between checkpoints (0 = only at the end)"))
    keep_checkpoints: int = field(default=2, metadata=_opt("checkpoints kept on disk"))
    eval_every: int = field(default=200, metadata=_opt("steps between evaluations (0 = only at the end)"))
    eval_count: int | None = field(default=None, metadata=_opt(
        "evaluate this many times, evenly over the run (replaces eval_every; follows a fitted step count)"))
    eval_acceptance_prompts: int = field(default=8, metadata=_opt(
        "held-out prompts decoded through the engine for real acceptance (0 = off)"))
    eval_prompts: str | None = field(default=None, metadata=_opt(
        "[NAME=]PATH of an eval question file (MT-bench, Spec-Bench, HumanEval...): the acceptance eval decodes "
        "its first turns instead of held-out records' prompts"))
    eval_prompts_per_category: int | None = field(default=None, metadata=_opt(
        "with eval_prompts: the first N questions of each category (then the first eval_acceptance_prompts)"))
    eval_max_new_tokens: int = field(default=64, metadata=_opt("tokens generated per acceptance prompt"))
    eval_chain_depth: int | None = field(default=None, metadata=_opt("draft chain depth (None = ttt_steps)"))
    log_every: int = field(default=10, metadata=_opt("steps between metrics.jsonl lines"))
    threads: int | None = field(default=None, metadata=_opt("torch CPU threads (None = torch default)"))
    progress: bool = field(default=True, metadata=_opt("tqdm progress bar on stderr (rank 0)"))

    # Fields whose change makes a checkpoint's data order or head shape invalid.
    RESUME_FIXED: typing.ClassVar[tuple[str, ...]] = (
        "kind", "num_layers", "fc_bias", "draft_vocab_size", "feature_layer_ids", "init_head", "init_vocab",
        "features", "data", "max_len", "eval_records", "eval_ids", "batch_size", "grad_accum", "seed")

    def __post_init__(self) -> None:
        if self.feature_layer_ids is not None:
            object.__setattr__(self, "feature_layer_ids", tuple(int(i) for i in self.feature_layer_ids))
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown training config keys: {unknown}; known: {sorted(names)}")
        return cls(**d)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], **overrides: Any) -> TrainConfig:
        import yaml

        d = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(d, dict):
            raise ValueError(f"{path}: expected a mapping of training config keys")
        return cls.from_dict({**d, **overrides})

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def validate(self) -> None:
        if (self.features is None) == (self.data is None):
            raise ValueError("give exactly one of `features` (offline capture dir) or `data` (prepared data, online)")
        if self.kind not in ("eagle1", "eagle3"):
            raise ValueError(f"kind must be eagle1 or eagle3, got {self.kind!r}")
        if self.schedule not in ("cosine", "linear", "constant"):
            raise ValueError(f"schedule must be cosine, linear or constant, got {self.schedule!r}")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be fp32 or bf16, got {self.precision!r}")
        for name in ("num_layers", "ttt_steps", "batch_size", "grad_accum", "max_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("checkpoint_every", "eval_every", "eval_records", "warmup_steps", "eval_acceptance_prompts"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.time_budget is not None and not self.time_budget > 0:
            raise ValueError(f"time_budget must be > 0 seconds, got {self.time_budget}")
        if self.eval_ids is not None:
            if self.features is not None:
                raise ValueError("eval_ids needs `data` (online training): offline feature shards hold record "
                                 "indices, not ids")
            if not Path(self.eval_ids).is_file():
                raise ValueError(f"eval_ids: no such file {self.eval_ids}")
        if self.eval_prompts_per_category is not None and self.eval_prompts_per_category < 1:
            raise ValueError(f"eval_prompts_per_category must be >= 1, got {self.eval_prompts_per_category}")
        if self.eval_prompts_per_category is not None and not self.eval_prompts:
            raise ValueError("eval_prompts_per_category needs eval_prompts")
        if self.eval_prompts and not (self.eval_acceptance_prompts and self.eval_records):
            raise ValueError("eval_prompts needs eval_acceptance_prompts >= 1 and eval_records >= 1 (the acceptance "
                             "eval runs with the held-out evaluation)")
        if self.eval_prompts:  # before the target loads: a wrong path is refused at once
            from eaglespec.datasets import dataset_name

            path = dataset_name(self.eval_prompts)[1]
            if not path.is_file():
                raise ValueError(f"eval_prompts: no such file {path}")
        if self.eval_count is not None and self.eval_count < 1:
            raise ValueError(f"eval_count must be >= 1, got {self.eval_count}")
        if self.lr <= 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("lr must be > 0 and min_lr_ratio in [0, 1]")
        if self.labels not in ("soft", "hard", "mixed"):
            raise ValueError(f"labels must be soft, hard or mixed, got {self.labels!r}")
        if not 0.0 <= self.hard_weight <= 1.0:
            raise ValueError(f"hard_weight must be in [0, 1], got {self.hard_weight}")
        if len(self.betas) != 2:
            raise ValueError(f"betas takes two values, got {self.betas}")
        if self.init_vocab not in ("head", "data"):
            raise ValueError(f"init_vocab must be head or data, got {self.init_vocab!r}")
        if self.init_vocab == "data" and (self.init_head is None or self.kind != "eagle3"):
            raise ValueError("init_vocab data re-selects an EAGLE-3 head's draft vocabulary: it needs init_head and "
                             f"kind eagle3 (got init_head {self.init_head!r}, kind {self.kind!r})")

    @property
    def noise(self) -> float:
        return self.feature_noise if self.feature_noise is not None else (0.1 if self.kind == "eagle1" else 0.0)


# ========================================================================================= distributed
@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False  # we initialized the process group (and destroy it at the end)

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str) -> DistInfo:
    """Join the process group torchrun describes (WORLD_SIZE > 1): gloo on CPU, nccl on GPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and not dist.is_initialized():
        return DistInfo(device=torch.device(device))
    owns = False
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        owns = True
    rank = dist.get_rank()
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(dev)
    return DistInfo(rank, dist.get_world_size(), dev, owns)


def _all_reduce(t: Tensor, info: DistInfo) -> Tensor:
    if info.world_size > 1:
        dist.all_reduce(t)
    return t


# ============================================================================================ the unroll
def ttt_mask(n: int, step: int, device: torch.device | str | None = None) -> Tensor:
    """bool [P, (step+1) * P] for TTT step ``step`` over P pairs: query i sees step-0 keys 0..i (causal) and
    the key of pair i of each later step up to its own (one diagonal block per step)."""
    i = torch.arange(n, device=device)
    causal = i[None, :] <= i[:, None]
    eye = i[None, :] == i[:, None]
    return torch.cat([causal] + [eye] * step, dim=1)


class TTTUnroll(nn.Module):
    """Runs a ``DraftHead`` over whole sequences for k TTT steps (module docstring), without a KV cache."""

    def __init__(self, head: DraftHead, steps: int) -> None:
        super().__init__()
        self.head = head
        self.steps = steps


    def forward(self, features: Tensor, tokens: Tensor, select: Tensor | None = None
                ) -> tuple[list[Tensor], list[Tensor]]:
        """features [B, T, F] (target features of positions 0..T-1), tokens int64 [B, T].

        Returns per step j: the output features [B, P, H] (P = T - 1; pair i predicts the feature of position
        i+j+1) and float32 logits for token i+j+2: [B, P, V_out], or [N_j, V_out] at the positions
        ``select[j]`` (bool [k, B, P]; the lm_head and the loss then run on counted positions only). Tokens
        past the end are padded with 0 (their positions are never counted).
        """
        head = self.head
        batch, width = tokens.shape
        n = width - 1
        padded = F.pad(tokens, (0, self.steps - 1))  # [B, T + k - 1]
        dtype = torch.get_autocast_dtype(features.device.type) if torch.is_autocast_enabled(features.device.type) \
            else head.dtype
        h = head.fuse(features[:, :n])  # [B, P, H]
        layers = head.decoder_layers()
        keys: list[list[Tensor]] = [[] for _ in layers]
        values: list[list[Tensor]] = [[] for _ in layers]
        outs, logits = [], []
        for j in range(self.steps):
            tok = padded[:, j + 1 : j + 1 + n]  # [B, P] the true token t_{i+j+1}
            positions = (torch.arange(n, device=tokens.device) + j).expand(batch, n)
            rope = head.rotary(positions, dtype, n - 1 + j)
            emb = F.embedding(tok, head.embed_weight)  # [B, P, H]
            x = head.fc(torch.cat((emb, h.to(emb.dtype)), dim=-1)) if head.config.kind == "eagle1" else h
            mask = None if j == 0 else ttt_mask(n, j, tokens.device)

            def attend(q: Tensor, k: Tensor, v: Tensor, i: int, mask: Tensor | None = mask) -> Tensor:
                """Over every step's keys so far (no KV cache): keys [B, Hkv, (j+1)P, D]."""
                keys[i].append(k.transpose(1, 2))  # [B, Hkv, P, D]
                values[i].append(v.transpose(1, 2))
                o = grouped_sdpa(q.transpose(1, 2), torch.cat(keys[i], dim=2), torch.cat(values[i], dim=2),
                                 mask, is_causal=mask is None)  # [B, H, P, D]
                return o.transpose(1, 2).reshape(batch, n, -1)

            for li, layer in enumerate(layers):
                x = decoder_layer(layer, li, x, rope, attend, emb=emb)  # the head's own layer, same code
            outs.append(x)
            logits.append(head.logits(x if select is None else x[select[j]]))
            h = x
        return outs, logits


# ============================================================================================ targets
@dataclass
class StepTargets:
    """What step j of the unroll is scored against (P pairs, k steps)."""

    valid_loss: Tensor  # bool [k, B, P]: counted in the loss
    valid_acc: Tensor  # bool [k, B, P]: counted in the accuracy (assistant token; out-of-vocab counts as a miss)
    top1: Tensor  # int64 [k, B, P]: the target's argmax token for step j's prediction


def step_targets(batch: FeatureBatch, steps: int, t2d: Tensor | None) -> StepTargets:
    """Masks of step j: pair i predicts token i+j+2 from the target state at position i+j+1."""
    _, width = batch.input_ids.shape
    n = width - 1
    pos = torch.arange(n, device=batch.input_ids.device)
    valid_loss, valid_acc, top1 = [], [], []
    for j in range(steps):
        predicted = pos + j + 2  # [P] index of the predicted token
        within = predicted[None, :] < batch.lengths[:, None]  # [B, P]
        clamped = predicted.clamp(max=width - 1).expand(batch.input_ids.shape[0], n)
        acc = within & batch.loss_mask.gather(1, clamped)
        t1 = batch.top1.gather(1, (pos + j + 1).clamp(max=width - 1).expand_as(clamped))  # [B, P]
        valid_acc.append(acc)
        valid_loss.append(acc & t2d[t1] if t2d is not None else acc)
        top1.append(t1)
    return StepTargets(torch.stack(valid_loss), torch.stack(valid_acc), torch.stack(top1))


@torch.no_grad()
def target_probs(hidden: Tensor, lm_weight: Tensor, steps: int) -> Tensor:
    """float32 [B, P + k - 1, V_out]: softmax(lm_head(hidden)) at positions 1..T-1, zero-padded by k - 1
    positions; ``lm_weight`` holds the draft-vocabulary rows only for EAGLE-3 (restricted + renormalized)."""
    logits = F.linear(hidden[:, 1:].float(), lm_weight)
    return F.pad(logits.softmax(-1), (0, 0, 0, steps - 1))


def token_loss(logits: Tensor, probs: Tensor, labels: str = "soft", hard_weight: float = 0.5) -> Tensor:
    """[N] per-position loss of draft logits [N, V] against the target distribution probs [N, V].

    soft: cross-entropy H(p, q) = -sum_v p_v log q_v (the KL to the target up to the target's entropy, so the
    head learns the whole distribution, which is what sampled verification accepts against); hard:
    cross-entropy to argmax p (what greedy verification accepts); mixed: (1 - w) soft + w hard."""
    if labels == "soft":
        return F.cross_entropy(logits, probs, reduction="none")
    hard = F.cross_entropy(logits, probs.argmax(-1), reduction="none")
    if labels == "hard":
        return hard
    return (1.0 - hard_weight) * F.cross_entropy(logits, probs, reduction="none") + hard_weight * hard


def ttt_loss(outs: list[Tensor], logits: list[Tensor], batch: FeatureBatch, tg: StepTargets, probs: Tensor,
             head: DraftHead, cfg: TrainConfig, norm: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """Loss of one micro-batch and detached stats [k, 4] (loss sum, counted, correct, accuracy positions).

    ``logits[j]`` [N_j, V_out] are the step's logits at the positions ``tg.valid_acc[j]``. Step j's loss is
    normalized by ``norm[j]`` (its counted positions in the whole optimizer step) and multiplied by ``scale``.
    """
    n = outs[0].shape[1]
    total = outs[0].new_zeros((), dtype=torch.float32)
    stats = []
    hidden = F.pad(batch.hidden[:, 1:], (0, 0, 0, cfg.ttt_steps - 1)) if cfg.kind == "eagle1" else None
    for j, (out, lg) in enumerate(zip(outs, logits)):
        sel = tg.valid_acc[j]  # [B, P]
        p = probs[:, j : j + n][sel]  # [N, V_out] target distribution of the predicted token
        counted = tg.valid_loss[j][sel]  # [N]
        per_pos = token_loss(lg.float(), p, cfg.labels, cfg.hard_weight)  # [N]
        if cfg.kind == "eagle1":
            f_true = hidden[:, j : j + n][sel].float()  # [N, H]
            l1 = F.smooth_l1_loss(out[sel].float(), f_true, reduction="none").mean(-1)  # [N]
            per_pos = cfg.feature_weight * l1 + cfg.ce_weight * per_pos
        loss_sum = (per_pos * counted).sum()
        total = total + (cfg.step_weight ** j) * loss_sum / norm[j].clamp(min=1) * scale
        with torch.no_grad():
            pred = head.to_target_ids(lg.max(-1).indices)
            correct = (pred == tg.top1[j][sel]).sum()
            stats.append(torch.stack([loss_sum.detach().float(), counted.sum().float(), correct.float(),
                                      sel.sum().float()]))
    return total, torch.stack(stats)


# =========================================================================================== helpers
def split_indices(n: int, eval_records: int, seed: int) -> tuple[list[int], list[int]]:
    """(train, eval) record indices: a seeded choice of ``eval_records`` held-out records."""
    if eval_records >= n:
        raise ValueError(f"eval_records ({eval_records}) must be smaller than the {n} records")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(perm[eval_records:]), sorted(perm[:eval_records])


def read_ids(path: str | os.PathLike[str]) -> list[str]:
    """Record ids, one per line (blank lines skipped); a repeated id is refused."""
    ids = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    seen: set[str] = set()
    dup = [i for i in ids if i in seen or seen.add(i)]
    if dup:
        raise ValueError(f"{path}: repeated record ids {dup[:3]}")
    return ids


def split_by_ids(record_ids: list[str], held_out: list[str], eval_records: int) -> tuple[list[int], list[int]]:
    """(train, eval) record indices with exactly the records named in ``held_out`` held out."""
    if len(held_out) != eval_records:
        raise ValueError(f"eval_ids names {len(held_out)} records but eval_records is {eval_records}: "
                         f"pass --eval-records {len(held_out)}")
    where = {rid: i for i, rid in enumerate(record_ids)}
    missing = [rid for rid in held_out if rid not in where]
    if missing:
        raise ValueError(f"eval_ids: {len(missing)} of {len(held_out)} ids are not in the data, e.g. {missing[:3]}")
    ev = sorted(where[rid] for rid in held_out)
    held = set(ev)
    return [i for i in range(len(record_ids)) if i not in held], ev


def select_draft_vocab(counts: Counter[int], size: int, vocab_size: int, always: Sequence[int] = ()) -> Tensor:
    """int64 [size] sorted target ids: ``always`` (e.g. EOS) first, then the most frequent, ties by id, then
    (if the data has too few distinct tokens) the lowest unused ids."""
    chosen: list[int] = []
    seen: set[int] = set()
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    for t in list(always) + [t for t, _ in ranked] + list(range(vocab_size)):
        if len(chosen) == size:
            break
        if t not in seen and 0 <= t < vocab_size:
            chosen.append(t)
            seen.add(t)
    return torch.tensor(sorted(chosen), dtype=torch.int64)


def _lr_factor(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    t = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    if cfg.schedule == "linear":
        return 1.0 - (1.0 - cfg.min_lr_ratio) * t
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))


@dataclass
class StepPlan:
    """The step count of a run with a time budget: fitted, after every step, to the budget left at the mean step
    time measured so far (evaluations and checkpoints included), within ``cap`` steps. Without a budget the
    count is ``cap``."""

    cap: int
    budget: float | None = None
    spent_before: float = 0.0  # seconds of earlier invocations of the run (resume)
    reserve: float = 0.0  # seconds kept for the final evaluation (the longest one measured)
    min_steps: int = 5  # steps measured before the first fit (the first ones include warm-up)

    def steps(self, step: int, steps_here: int, seconds_here: float) -> int:
        if self.budget is None:
            return self.cap
        left = self.budget - self.spent_before - seconds_here
        if left <= 0 or step >= self.cap:
            return step
        if steps_here < self.min_steps:
            return max(step + 1, self.cap)
        per_step = seconds_here / steps_here
        return max(step + 1, min(self.cap, step + int((left - self.reserve) / per_step)))


def eval_due(step: int, max_steps: int, cfg: TrainConfig) -> bool:
    """Evaluate after this step: every ``eval_every`` steps, or at ``eval_count`` even points of the run."""
    if step >= max_steps:
        return False  # the final evaluation runs after the loop
    if cfg.eval_count is not None:
        return step * cfg.eval_count // max_steps > (step - 1) * cfg.eval_count // max_steps
    return bool(cfg.eval_every) and step % cfg.eval_every == 0


@dataclass
class _Data:
    train: Any  # OfflineFeatures | OnlineFeatures
    eval: Any | None
    train_idx: list[int]
    eval_idx: list[int]
    tokens: Any  # i -> (input_ids, loss_mask)
    hidden_indices: tuple[int, ...]
    record_ids: list[str] | None = None  # online data: ids of the records (out_dir/eval_ids.txt names the held-out)


def _build_data(cfg: TrainConfig, target: Any, info: DistInfo) -> _Data:
    want_aux = cfg.kind == "eagle3"
    if cfg.features:
        store = FeatureStore(cfg.features)
        store.check_target(target.model, target.name)
        ids = store.hidden_indices
        if want_aux:
            if not ids:
                raise ValueError(f"{cfg.features} holds no EAGLE-3 features (captured without feature layers)")
            if cfg.feature_layer_ids is not None and tuple(cfg.feature_layer_ids) != ids:
                raise ValueError(f"feature_layer_ids {cfg.feature_layer_ids} differ from the captured layers {ids}")
        train_idx, eval_idx = split_indices(len(store), cfg.eval_records, cfg.seed)
        train = OfflineFeatures(store, train_idx, cfg.batch_size, cfg.seed, info.world_size, info.rank,
                                want_aux, cfg.max_len)
        # held-out records are read once each (`once`), so fewer of them than a training batch is fine
        ev = OfflineFeatures(store, eval_idx, min(cfg.batch_size, len(eval_idx)), cfg.seed, 1, 0, want_aux,
                             cfg.max_len) if eval_idx else None
        return _Data(train, ev, train_idx, eval_idx, store.tokens, ids if want_aux else ())
    from eaglespec.train.data import read_prepared

    records, _ = read_prepared(cfg.data)
    ids: tuple[int, ...] = ()
    if want_aux:
        ids = cfg.feature_layer_ids or HeadConfig.for_target(target.model.args, "eagle3").feature_layer_ids
    record_ids = [r.id for r in records]
    if cfg.eval_ids is not None:
        train_idx, eval_idx = split_by_ids(record_ids, read_ids(cfg.eval_ids), cfg.eval_records)
    else:
        train_idx, eval_idx = split_indices(len(records), cfg.eval_records, cfg.seed)
    train = OnlineFeatures(target.model, records, train_idx, cfg.batch_size, ids, cfg.seed, info.world_size,
                           info.rank, cfg.max_len)
    # held-out records in batches of at most their number (as above)
    ev = OnlineFeatures(target.model, records, eval_idx, min(cfg.batch_size, len(eval_idx)), ids, cfg.seed, 1, 0,
                        cfg.max_len) if eval_idx else None
    return _Data(train, ev, train_idx, eval_idx, lambda i: (records[i].input_ids, records[i].loss_mask), ids,
                 record_ids)


def _features(batch: FeatureBatch, kind: str) -> Tensor:
    return batch.aux if kind == "eagle3" else batch.hidden


# ======================================================================================== evaluation
@torch.no_grad()
def evaluate(unroll: TTTUnroll, loader: Any, cfg: TrainConfig, lm_weight: Tensor, device: torch.device) -> dict:
    """Per-TTT-step top-1 accuracy (draft argmax == target argmax on assistant tokens) and loss on held-out data."""
    head = unroll.head
    t2d = head.t2d if cfg.kind == "eagle3" else None
    totals = torch.zeros(cfg.ttt_steps, 4, dtype=torch.float64)
    for batch in loader.once():
        batch = batch.to(device)
        tg = step_targets(batch, cfg.ttt_steps, t2d)
        with _autocast(cfg, device):
            outs, logits = unroll(_features(batch, cfg.kind), batch.input_ids, tg.valid_acc)
        probs = target_probs(batch.hidden, lm_weight, cfg.ttt_steps)
        _, stats = ttt_loss(outs, logits, batch, tg, probs, head, cfg, torch.ones(cfg.ttt_steps, device=device), 1.0)
        totals += stats.double().cpu()
    return {"eval_loss": [round(float(s[0] / max(s[1], 1)), 5) for s in totals],
            "eval_acc": [round(float(s[2] / max(s[3], 1)), 5) for s in totals],
            "eval_positions": int(totals[0, 3])}


@torch.inference_mode()
def acceptance_eval(target: Any, head: DraftHead, prompts: Sequence[Sequence[int]], depth: int,
                    max_new_tokens: int) -> dict | None:
    """Greedy chain decoding through ``generate.Engine`` with ``proposer.EagleProposer``: tau (mean accepted
    length, bonus included) and per-position acceptance. None when the proposer module does not exist yet."""
    try:
        from eaglespec.spec.proposer import EagleProposer
    except ImportError:
        return None
    from eaglespec.config import GenerationConfig
    from eaglespec.engine.generate import Engine, Request
    from eaglespec.engine.stats import SequenceStats
    from eaglespec.spec.strategies import Chain

    prompts = [list(p) for p in prompts if p]
    if not prompts:
        return None
    engine = Engine(target, proposer=EagleProposer(head, Chain(depth)),
                    max_batch_size=min(8 if head.device.type == "cpu" else 32, len(prompts)))
    done = engine.generate([Request(p, GenerationConfig(max_new_tokens)) for p in prompts])
    st = SequenceStats.pooled(c.stats for c in done)
    return {"tau": round(st.tau, 4), "acceptance_by_position": [round(a, 4) for a in st.acceptance_by_position(depth)],
            "decode_tokens": st.decode_tokens, "target_forwards": st.target_forwards}


def question_prompts(tokenizer: Any, spec: str, limit: int, per_category: int | None) -> list[list[int]]:
    """Token ids of the first turns of an eval question file (through the chat template, generation prompt
    added), as ``eaglespec bench`` asks them: the first ``per_category`` of each category, then ``limit``."""
    from eaglespec.datasets import encode_conversation, load_questions

    questions = load_questions(spec, limit=limit, per_category=per_category)
    return [encode_conversation(tokenizer, q.turns[:1], []) for q in questions]


def _autocast(cfg: TrainConfig, device: torch.device) -> Any:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16")


# ======================================================================================== checkpoints
def _checkpoint_root(cfg: TrainConfig) -> Path:
    return Path(cfg.out_dir) / CHECKPOINT_DIR


def latest_checkpoint(cfg: TrainConfig) -> Path | None:
    """The newest complete checkpoint (``latest`` pointer, else the highest ``step-*`` directory)."""
    root = _checkpoint_root(cfg)
    pointer = root / LATEST_FILE
    if pointer.is_file():
        path = root / pointer.read_text().strip()
        if (path / STATE_FILE).is_file():
            return path
    steps = sorted(p for p in root.glob("step-*") if (p / STATE_FILE).is_file() and ".tmp" not in p.name)
    return steps[-1] if steps else None


def _read_state(path: Path) -> dict[str, Any]:
    """The training state of a checkpoint; a truncated or foreign file is refused naming it."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises RuntimeError, EOFError, UnpicklingError, ... for a damaged file
        raise ValueError(f"{path}: unreadable training checkpoint ({type(e).__name__}: {e}); remove its directory "
                         f"to resume from the previous checkpoint") from None
    missing = [k for k in ("config", "world_size", "step", "optimizer") if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{path}: not an eaglespec training checkpoint (missing {', '.join(missing)})")
    return state


def _save_checkpoint(cfg: TrainConfig, head: DraftHead, state: dict[str, Any], step: int) -> Path:
    root = _checkpoint_root(cfg)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".step-{step:08d}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    save_head(head, tmp / "head")
    torch.save(state, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    pointer_tmp = root / f".{LATEST_FILE}.tmp-{os.getpid()}"
    pointer_tmp.write_text(final.name)
    os.replace(pointer_tmp, root / LATEST_FILE)
    old = sorted(p for p in root.glob("step-*") if p.is_dir() and ".tmp" not in p.name)
    for p in old[: max(0, len(old) - cfg.keep_checkpoints)]:
        shutil.rmtree(p, ignore_errors=True)
    return final


def _save_final(head: DraftHead, out: Path) -> Path:
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save_head(head, tmp)
    if out.exists():
        shutil.rmtree(out)
    os.rename(tmp, out)
    return out


# ============================================================================================= train
def train(cfg: TrainConfig, target: Any = None, resume: bool = False) -> dict[str, Any]:
    """Train a head (module docstring); returns a summary (final metrics, speed, paths).

    ``target`` defaults to ``load_target(cfg.model, cfg.model_dtype, device)``. With ``resume`` the run
    continues from the newest checkpoint in ``cfg.out_dir`` (a fresh start when there is none); without it an
    ``out_dir`` that already holds checkpoints is refused.
    """
    cfg.validate()
    cfg = replace(cfg)  # the step count may be fitted to a time budget: the caller's config stays as given
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    info = init_distributed(cfg.device)
    try:
        return _train(cfg, target, resume, info)
    finally:
        torch.set_num_threads(threads)
        if info.owns_group:
            dist.destroy_process_group()


def _data_token_counts(data: _Data) -> Counter[int]:
    """Loss-masked (assistant) token frequencies of the training split."""
    counts: Counter[int] = Counter()
    for i in data.train_idx:
        ids, mask = data.tokens(i)
        counts.update(t for t, m in zip(ids, mask) if m)
    return counts


def _log_coverage(what: str, head: DraftHead, counts: Counter[int]) -> None:
    t2d = head.t2d.tolist()  # one read, not one device read per token id
    covered = sum(c for t, c in counts.items() if t2d[t])
    log.info("%s covers %.2f%% of the %d assistant tokens", what, 100 * covered / max(1, sum(counts.values())),
             sum(counts.values()))


def _init_from_head(head: DraftHead, cfg: TrainConfig, target: Any, data: _Data, device: torch.device) -> None:
    """Copy an existing head's weights into `head`; refuse a head of another kind, depth, width or tapped
    layers with the differing values named.

    EAGLE-3, init_vocab "head": the draft vocabulary is the source head's (its size must match). "data": a new
    draft vocabulary is selected from this data (the source's may miss many of a new data set's tokens); the
    lm_head rows of tokens in both vocabularies are copied and a new token's row is mapped from the target's
    lm_head row by the least-squares linear map W_target @ A ~= W_source fitted on the shared tokens."""
    src = load_head(cfg.init_head, target.model, dtype=torch.float32, device=device)
    mine, theirs = head.config, src.config
    keys = ["kind", "num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size", "feature_layer_ids"]
    if cfg.init_vocab == "head":
        keys.append("draft_vocab_size")
    diff = {k: (getattr(theirs, k), getattr(mine, k)) for k in keys if getattr(theirs, k, None) != getattr(mine, k, None)}
    if diff:
        raise ValueError(f"init_head {cfg.init_head} does not match this run: "
                         + ", ".join(f"{k} {a} (head) vs {b} (run)" for k, (a, b) in diff.items()))
    if cfg.kind != "eagle3" or cfg.init_vocab == "head":
        head.load_state_dict(src.state_dict())
        if cfg.kind == "eagle3":
            _log_coverage(f"init_head {cfg.init_head}: its draft vocabulary", head, _data_token_counts(data))
        return
    counts = _data_token_counts(data)
    _log_coverage(f"init_head {cfg.init_head}: its draft vocabulary", src, counts)
    vocab = select_draft_vocab(counts, mine.draft_vocab_size, mine.vocab_size, always=target.eos_token_ids)
    head.set_draft_vocab(vocab.to(device))
    state = {k: v for k, v in src.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    missing, unexpected = head.load_state_dict(state, strict=False)
    if unexpected or sorted(missing) != ["d2t", "lm_head.weight", "t2d"]:
        raise ValueError(f"init_head {cfg.init_head}: unexpected state (missing {missing}, extra {unexpected})")
    src_ids = src.to_target_ids(torch.arange(theirs.draft_vocab_size, device=device))  # [V_src] target ids
    new_ids = head.to_target_ids(torch.arange(mine.draft_vocab_size, device=device))   # [V_new]
    row_of = {int(t): i for i, t in enumerate(src_ids.tolist())}
    kept = torch.tensor([row_of.get(int(t), -1) for t in new_ids.tolist()], device=device)  # [V_new], -1 = new
    lm_target = target.model.lm_head_weight.detach().to(device=device, dtype=torch.float32)  # [V, H]
    w_src = src.lm_head.weight.detach()                                                        # [V_src, H]
    shared = kept >= 0
    a = torch.linalg.lstsq(lm_target[new_ids[shared]], w_src[kept[shared]]).solution          # [H, H]
    fit = lm_target[new_ids[shared]] @ a
    r2 = 1 - (fit - w_src[kept[shared]]).pow(2).sum() / (w_src[kept[shared]] - w_src[kept[shared]].mean(0)).pow(2).sum()
    with torch.no_grad():
        head.lm_head.weight.copy_(lm_target[new_ids] @ a)
        head.lm_head.weight[shared] = w_src[kept[shared]]
    log.info("init_head %s: new draft vocabulary of %d ids, %d rows copied, %d mapped from the target's lm_head "
             "(fit R^2 %.3f on the shared rows)", cfg.init_head, mine.draft_vocab_size, int(shared.sum()),
             int((~shared).sum()), float(r2))
    _log_coverage("the new draft vocabulary", head, counts)


def _train(cfg: TrainConfig, target: Any, resume: bool, info: DistInfo) -> dict[str, Any]:
    from tqdm import tqdm

    out = Path(cfg.out_dir)
    device = info.device
    if target is None:
        from eaglespec.runtime.loading import load_target

        target = load_target(cfg.model, cfg.model_dtype, device)
    ckpt = latest_checkpoint(cfg)
    if ckpt is not None and not resume:
        raise ValueError(f"{out} already holds checkpoints ({ckpt.name}); pass --resume to continue the run "
                         f"or choose another out_dir")
    state = _read_state(ckpt / STATE_FILE) if ckpt is not None else None  # refuse a bad one before the data work
    data = _build_data(cfg, target, info)

    torch.manual_seed(cfg.seed)
    head = DraftHead.for_target(
        target.model, cfg.kind, num_layers=cfg.num_layers,
        draft_vocab_size=cfg.draft_vocab_size if cfg.kind == "eagle3" else None,
        feature_layer_ids=data.hidden_indices if cfg.kind == "eagle3" else None,
        bias=cfg.fc_bias, max_position_embeddings=target.model.args.max_position_embeddings,
    ).to(device=device, dtype=torch.float32)

    if state is not None:
        defaults = TrainConfig.__dataclass_fields__
        changed = [k for k in TrainConfig.RESUME_FIXED  # a key missing from an older checkpoint had its default
                   if state["config"].get(k, defaults[k].default) != cfg.to_dict().get(k)]
        if changed or state["world_size"] != info.world_size:
            raise ValueError(f"cannot resume {ckpt}: it was trained with other "
                             f"{', '.join(changed) or 'world size'} (checkpoint: "
                             f"{ {k: state['config'].get(k) for k in changed} or state['world_size']})")
        head.load_state_dict(load_head(ckpt / "head", target.model, dtype=torch.float32, device=device).state_dict())
        log.info("resuming from %s (step %d)", ckpt, state["step"])
    elif cfg.init_head is not None:
        _init_from_head(head, cfg, target, data, device)
    elif cfg.kind == "eagle3":
        counts = _data_token_counts(data)
        vocab = select_draft_vocab(counts, head.config.draft_vocab_size, head.config.vocab_size,
                                   always=target.eos_token_ids)
        head.set_draft_vocab(vocab.to(device))
        _log_coverage(f"draft vocabulary: {len(vocab)} ids", head, counts)

    lm = target.model.lm_head_weight.detach().to(device=device, dtype=torch.float32)
    lm_weight = lm[head.to_target_ids(torch.arange(head.config.draft_vocab_size, device=device))] \
        if cfg.kind == "eagle3" else lm  # [V_out, H]
    t2d = head.t2d if cfg.kind == "eagle3" else None

    unroll = TTTUnroll(head, cfg.ttt_steps)
    model: nn.Module = unroll
    if info.world_size > 1:
        model = nn.parallel.DistributedDataParallel(
            unroll, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(cfg, s))
    noise_gen = torch.Generator(device=device).manual_seed(cfg.seed * 1000 + info.rank + 1)
    step, epoch, position, seen = 0, 0, 0, 0  # seen: input tokens of all optimizer steps, across resumes
    plan = StepPlan(cfg.max_steps, cfg.time_budget)
    if state is not None:
        plan.spent_before = float(state.get("train_seconds", 0.0))
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, epoch, position = state["step"], state["epoch"], state["position"]
        seen = int(state.get("tokens_seen", 0))
        noise_gen.set_state(state["noise_rng"][info.rank])
        torch.set_rng_state(state["torch_rng"][info.rank])

    metrics_file = out / "metrics.jsonl"
    if info.main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        if data.record_ids is not None:  # so a later stage on grown data can hold out the same records
            (out / "eval_ids.txt").write_text("".join(data.record_ids[i] + "\n" for i in data.eval_idx))

    def record(entry: dict[str, Any]) -> None:
        if info.main:
            with open(metrics_file, "a") as f:
                f.write(json.dumps(entry) + "\n")

    eval_prompts = None  # token ids of --eval-prompts' first turns, encoded once
    if cfg.eval_prompts and cfg.eval_acceptance_prompts and info.main:
        eval_prompts = question_prompts(target.tokenizer, cfg.eval_prompts, cfg.eval_acceptance_prompts,
                                        cfg.eval_prompts_per_category)

    def run_eval() -> dict[str, Any]:
        result: dict[str, Any] = {}
        if info.main and data.eval is not None:
            result = evaluate(unroll, data.eval, cfg, lm_weight, device)
            if cfg.eval_acceptance_prompts:
                if eval_prompts is not None:
                    prompts = eval_prompts
                else:
                    prompts = []
                    for i in data.eval_idx[: cfg.eval_acceptance_prompts]:
                        ids, mask = data.tokens(i)
                        prompts.append(ids[: mask.index(1)] if 1 in mask else [])
                acc = acceptance_eval(target, head, prompts, cfg.eval_chain_depth or cfg.ttt_steps,
                                      cfg.eval_max_new_tokens)
                if acc is None:
                    log.info("acceptance eval skipped: eaglespec.spec.proposer.EagleProposer is not available")
                else:
                    result.update(acc)
            record({"step": step, "tokens": seen, **result})
        if info.world_size > 1:
            dist.barrier()
        return result

    loop_start = time.perf_counter()

    def spent() -> float:
        return plan.spent_before + time.perf_counter() - loop_start

    if cfg.time_budget is not None:
        cfg.max_steps = plan.steps(step, 0, 0.0)
        log.info("time budget %.0f s (%.0f s spent before): at most %d steps, fitted to the measured step time",
                 cfg.time_budget, plan.spent_before, plan.cap)
    batches = data.train.iterate(epoch, position)
    bar = tqdm(total=cfg.max_steps, initial=step, desc=f"train {cfg.kind}", unit="step", file=sys.stderr,
               disable=not (cfg.progress and info.main), dynamic_ncols=True)
    k = cfg.ttt_steps
    run_tokens, run_time, run_steps, last_eval = 0, 0.0, 0, {}
    window = torch.zeros(k, 4, dtype=torch.float64)
    head.train()
    while step < cfg.max_steps:
        t0 = time.perf_counter()
        micro = []
        for _ in range(cfg.grad_accum):
            epoch, position, batch = next(batches)
            batch = batch.to(device)
            micro.append((batch, step_targets(batch, k, t2d)))
        position += 1  # the next batch to read after this step
        # counted positions per TTT step and input tokens of the whole optimizer step, over all ranks
        counted = torch.stack([tg.valid_loss.sum((1, 2)) for _, tg in micro]).sum(0).double()  # [k]
        tokens = torch.full((k,), float(sum(b.n_tokens for b, _ in micro)), dtype=torch.float64, device=device)
        totals = _all_reduce(torch.stack([counted, tokens]), info)
        norm, step_tokens = totals[0].float(), int(totals[1, 0])
        opt.zero_grad(set_to_none=True)
        stats = torch.zeros(k, 4, dtype=torch.float64, device=device)
        for m, (batch, tg) in enumerate(micro):
            sync = m == len(micro) - 1 or info.world_size == 1
            with model.no_sync() if not sync else contextlib.nullcontext():
                feats = _features(batch, cfg.kind).float()
                if cfg.noise > 0:
                    feats = feats + (torch.rand(feats.shape, generator=noise_gen, device=device) * 2 - 1) * cfg.noise
                probs = target_probs(batch.hidden, lm_weight, k)
                with _autocast(cfg, device):
                    outs, logits = model(feats, batch.input_ids, tg.valid_acc)
                loss, st = ttt_loss(outs, logits, batch, tg, probs, head, cfg, norm, float(info.world_size))
                loss.backward()
                stats += st.double()
        grad_norm = nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip) if cfg.grad_clip > 0 else None
        opt.step()
        sched.step()
        step += 1
        run_steps += 1
        stats = _all_reduce(stats, info).cpu()
        window += stats
        elapsed = time.perf_counter() - t0
        run_tokens += step_tokens
        seen += step_tokens
        run_time += elapsed
        if cfg.time_budget is not None:
            fitted = plan.steps(step, run_steps, time.perf_counter() - loop_start)
            if info.world_size > 1:  # every rank stops at the same step: rank 0's fit rules
                fitted_t = torch.tensor([fitted], device=device)
                dist.broadcast(fitted_t, 0)
                fitted = int(fitted_t)
            if fitted != cfg.max_steps:
                cfg.max_steps = fitted
                bar.total = fitted
                bar.refresh()
        acc = [float(s[2] / max(s[3], 1)) for s in stats]
        bar.set_postfix_str(f"loss {float(stats[0, 0] / max(stats[0, 1], 1)):.3f} acc "
                            + "/".join(f"{a:.2f}" for a in acc) + f" {run_tokens / max(run_time, 1e-9):.0f} tok/s")
        bar.update(1)
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            record({"step": step, "tokens": seen, "lr": sched.get_last_lr()[0], "epoch": epoch,
                    "max_steps": cfg.max_steps, "seconds": round(spent(), 1),
                    "loss": [round(float(s[0] / max(s[1], 1)), 5) for s in window],
                    "acc": [round(float(s[2] / max(s[3], 1)), 5) for s in window],
                    "grad_norm": None if grad_norm is None else round(float(grad_norm), 4),
                    "tokens_per_s": round(run_tokens / max(run_time, 1e-9), 1)})
            window.zero_()
        if eval_due(step, cfg.max_steps, cfg):
            t_eval = time.perf_counter()
            last_eval = run_eval()
            plan.reserve = max(plan.reserve, time.perf_counter() - t_eval)
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < cfg.max_steps:
            _checkpoint(cfg, head, opt, sched, step, epoch, position, seen, noise_gen, info, spent())
    bar.close()
    if info.main:  # the head first: a final evaluation cut short (a time limit, a kill) must not lose the run
        head_path = _save_final(head, out / "head")
    last_eval = run_eval() or last_eval
    samples = run_steps * cfg.batch_size * cfg.grad_accum * info.world_size
    summary = {"step": step, "world_size": info.world_size, "tokens": run_tokens, "tokens_seen": seen,
               "train_seconds": round(run_time, 2), "run_seconds": round(spent(), 2), "max_steps": cfg.max_steps,
               "tokens_per_s": round(run_tokens / max(run_time, 1e-9), 1),
               "samples_per_s": round(samples / max(run_time, 1e-9), 3), **last_eval}
    if info.main:
        summary["head"] = str(head_path)
        (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        log.info("saved the head to %s; %s", summary["head"], {k: v for k, v in summary.items() if k != "head"})
    if info.world_size > 1:
        dist.barrier()
    return summary


def _checkpoint(cfg: TrainConfig, head: DraftHead, opt: Any, sched: Any, step: int, epoch: int, position: int,
                seen: int, noise_gen: torch.Generator, info: DistInfo, seconds: float = 0.0) -> None:
    """Every rank contributes its RNG states; rank 0 writes (atomically)."""
    noise_state, torch_state = noise_gen.get_state(), torch.get_rng_state()
    if info.world_size > 1:
        gathered: list[Any] = [None] * info.world_size
        dist.all_gather_object(gathered, (noise_state, torch_state))
    else:
        gathered = [(noise_state, torch_state)]
    if info.main:
        state = {"step": step, "epoch": epoch, "position": position, "tokens_seen": seen, "train_seconds": seconds,
                 "world_size": info.world_size,
                 "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                 "noise_rng": [g[0] for g in gathered], "torch_rng": [g[1] for g in gathered],
                 "config": cfg.to_dict()}
        path = _save_checkpoint(cfg, head, state, step)
        log.debug("checkpoint %s", path)
    if info.world_size > 1:
        dist.barrier()
