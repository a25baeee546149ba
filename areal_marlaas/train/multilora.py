"""The multi-LoRA slot: many tasks' LoRA weights and optimizers on one model.

One PEFT ``default`` adapter is the slot. Every task owns its LoRA weights,
AdamW state, LR schedule, PPO actor, RNG streams and version (``TaskSlot``);
``switch_task`` copies the task's weights into the slot and makes its optimizer
and actor current, so there is no FSDP re-wrap and no ``requires_grad``
toggling, and AReaL's save/update paths stay as they are. Also here: the
snapshot a non-finite step is rolled back to, and the adapters and task state
on disk (LoRA parameters only, in the PEFT layout vLLM loads).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from areal.api.cli_args import NormConfig, OptimizerConfig
from areal.api.io_struct import FinetuneSpec
from areal.engine.fsdp_utils import get_cosine_schedule_with_warmup
from areal.trainer.ppo.actor import PPOActor
from areal.utils import logging
from safetensors.torch import load_file, save_file
from transformers import (
    get_constant_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from areal_marlaas.methods import Method
from areal_marlaas.train.host import EngineHost

if TYPE_CHECKING:
    from peft import PeftModel

logger = logging.getLogger("MARLaaSTrainEngine")

_ADAPTER = ".default"
# Saved beside a committed adapter: the task's AdamW state, LR schedule and RNG.
TASK_STATE = "optimizer.pt"


class NonFiniteUpdateError(RuntimeError):
    """A step whose loss, gradient norm or new weights were not finite; the task's
    weights and optimizer state were restored to what they were before it."""


@dataclass
class TaskSlot:
    """Everything one task owns on the training engine."""

    name: str
    weights: dict[str, torch.Tensor]
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any
    actor: PPOActor
    version: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    # The task's own RNG streams ("torch", "python", on GPU "cuda"): swapped in
    # for its steps, so its randomness (dropout) is independent of the other
    # tenants and of the process's history, and resumes exactly.
    rng: dict[str, Any] = field(default_factory=dict)
    # DPO: the reference model's LoRA weights (the adapter the task started
    # from; B = 0, the base model, for a fresh one).
    reference: dict[str, torch.Tensor] | None = None


def _seeded_rng(seed: int) -> dict[str, Any]:
    return {
        "torch": torch.Generator().manual_seed(seed).get_state(),
        "python": random.Random(seed).getstate(),
    }


@contextlib.contextmanager
def _task_rng(slot: TaskSlot) -> Iterator[None]:
    """Run with ``slot``'s RNG streams as the process's, then put them back."""
    cuda = torch.cuda.is_available()
    outer_python = random.getstate()
    # fork_rng restores the process's torch (and CUDA) state on exit.
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if cuda else []):
        torch.set_rng_state(slot.rng["torch"])
        random.setstate(slot.rng["python"])
        if cuda:
            if "cuda" in slot.rng:
                torch.cuda.set_rng_state(slot.rng["cuda"])
            else:
                torch.cuda.manual_seed(slot.meta["seed"])
        try:
            yield
        finally:
            slot.rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
            if cuda:
                slot.rng["cuda"] = torch.cuda.get_rng_state()
            random.setstate(outer_python)


def _sort_target_modules(config: Path) -> None:
    """PEFT writes target_modules from a set (order varies with the process's
    hash seed); sorted, the same adapter gives the same bytes in every run."""
    cfg = json.loads(config.read_text())
    if isinstance(cfg.get("target_modules"), list):
        cfg["target_modules"] = sorted(cfg["target_modules"])
        config.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# A DTensor under FSDP2; torch's stubs type parameters as plain Tensors.
def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p  # pyright: ignore[reportAttributeAccessIssue]


def _full(p: torch.Tensor) -> torch.Tensor:
    return p.full_tensor() if hasattr(p, "full_tensor") else p  # pyright: ignore[reportAttributeAccessIssue]


class MultiLoRASlots(EngineHost):
    """Mixin for AReaL's FSDP engine (before it in the MRO): the tasks' slots.

    The engine sets ``slots``, ``active`` and ``_lora`` (the model's trainable
    LoRA parameters, by name) when it starts."""

    slots: dict[str, TaskSlot]
    active: str | None
    _lora: dict[str, torch.nn.Parameter]

    def _create_optimizer(self, ft_spec: FinetuneSpec) -> None:
        # Optimizers are per task (add_task); none covers the whole model.
        # AReaL's attribute is never None; this engine's steps use the task's.
        self.optimizer = None  # pyright: ignore[reportAttributeAccessIssue]
        self.lr_scheduler = None

    # -- tasks ------------------------------------------------------------------
    def add_task(
        self,
        name: str,
        lr: float,
        total_steps: int,
        n_samples: int,
        seed: int,
        temperature: float = 1.0,
        init_adapter: str | Path | None = None,
        version: int = 0,
        ppo: dict[str, Any] | None = None,
        audit_trajectories: int = 2,
        audit_max_mean_gap: float = 0.0,
        train_method: str = "grpo",
        beta: float = 0.1,
        reference_adapter: str | Path | None = None,
        restore_state: bool = True,
    ) -> None:
        """Create a task's LoRA weights (B=0, A seeded like PEFT's init, or loaded
        from a PEFT adapter folder), optimizer, LR schedule and PPO actor.

        Resuming: ``init_adapter`` is the committed folder of ``version``; its
        ``optimizer.pt`` (``save_task_state``), if present, restores AdamW's
        moments, the LR schedule's position and the RNG state (unless
        ``restore_state`` is off: a new task continuing another's adapter).

        ``ppo``: this task's overrides of the actor's PPO settings (``TaskPPOConfig``).
        Audit: before each update, the trainer's logprobs of ``audit_trajectories``
        generated sequences (all of them when the old logprobs are recomputed
        anyway) are compared with the server's; a mean gap above
        ``audit_max_mean_gap`` (0 = no limit) refuses the step.

        ``train_method``: what its steps optimize (``methods.Method``): ``grpo``
        trains ``train_task``'s rollouts, ``sft`` its demonstrations, ``dpo`` its
        preference pairs with ``beta`` against the reference: the adapter in
        ``reference_adapter`` (the one the task started from), else the base
        model (a fresh adapter's B = 0)."""
        if name in self.slots:
            raise ValueError(f"task {name!r} already exists on the engine")
        reference = None
        if Method(train_method) is Method.DPO:
            reference = (
                self._read_adapter(Path(reference_adapter))
                if reference_adapter is not None
                else self._fresh_weights(seed)
            )
        if init_adapter is not None:
            weights = self._read_adapter(Path(init_adapter))
        else:
            weights = self._fresh_weights(seed)
        params = list(self._lora.values())
        opt_cfg = self.optimizer_config or OptimizerConfig()
        optimizer = torch.optim.AdamW(
            params,
            lr=lr,
            weight_decay=opt_cfg.weight_decay,
            betas=(opt_cfg.beta1, opt_cfg.beta2),
            eps=opt_cfg.eps,
        )
        scheduler = self._lr_schedule(optimizer, total_steps)
        rng = None
        if (
            restore_state
            and init_adapter is not None
            and (Path(init_adapter) / TASK_STATE).is_file()
        ):
            rng = self._load_task_state(
                Path(init_adapter) / TASK_STATE, optimizer, scheduler
            )
        # GRPO: rewards normalized within each prompt's group; the rest of the
        # actor's PPO settings as configured, with this task's overrides.
        actor_cfg = dataclasses.replace(
            self.config,
            reward_norm=NormConfig(
                mean_level="group", std_level="group", group_size=n_samples
            ),
            temperature=temperature,
            **(ppo or {}),
        )
        self.slots[name] = TaskSlot(
            name=name,
            weights=weights,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            actor=PPOActor(actor_cfg, self),
            version=version,
            meta={
                "lr": lr,
                "total_steps": total_steps,
                "seed": seed,
                "temperature": temperature,
                "audit_trajectories": audit_trajectories,
                "audit_max_mean_gap": audit_max_mean_gap,
                "method": Method(train_method),
                "beta": beta,
            },
            rng=rng or _seeded_rng(seed),
            reference=reference,
        )

    def remove_task(self, name: str) -> None:
        """The task left: drop its weights, optimizer and actor. The LoRA slot
        keeps its weights until the next task is switched in (never saved out)."""
        if self.active == name:
            self.active = None
        self.slots.pop(name, None)

    def _fresh_weights(self, seed: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        out = {}
        for n, p in self._lora.items():
            full = _full(p.detach())
            if "lora_A" in n:
                # PEFT's kaiming_uniform_(a=sqrt(5)) bound: 1 / sqrt(fan_in).
                bound = 1.0 / math.sqrt(full.shape[1])
                t = (torch.rand(full.shape, generator=gen) * 2 - 1) * bound
            else:
                t = torch.zeros(full.shape)
            out[n] = self._shard_like(p, t.to(full.dtype))
        return out

    def _shard_like(self, p: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of ``full`` for parameter ``p`` (as a plain tensor)."""
        if hasattr(p, "placements"):
            from torch.distributed.tensor import distribute_tensor

            return (
                distribute_tensor(
                    full.to(_local(p).device),
                    p.device_mesh,  # pyright: ignore[reportAttributeAccessIssue]  # a DTensor
                    p.placements,  # pyright: ignore[reportAttributeAccessIssue]
                )
                .to_local()
                .clone()
            )
        return full.to(p.device).clone()

    def _lr_schedule(self, optimizer: torch.optim.Optimizer, total_steps: int):
        cfg = self.optimizer_config or OptimizerConfig()
        warmup = int(cfg.warmup_steps_proportion * total_steps)
        if cfg.lr_scheduler_type == "cosine":
            return get_cosine_schedule_with_warmup(
                optimizer, warmup, total_steps, min_lr_ratio=cfg.min_lr_ratio
            )
        if cfg.lr_scheduler_type == "linear":
            return get_linear_schedule_with_warmup(optimizer, warmup, total_steps)
        return get_constant_schedule_with_warmup(optimizer, warmup)

    def switch_task(self, name: str) -> None:
        """Make ``name`` the task in the LoRA slot (its weights, optimizer, actor)."""
        if name not in self.slots:
            raise KeyError(f"unknown task {name!r}; add_task first")
        if self.active == name:
            return
        with torch.no_grad():
            if self.active is not None:
                out = self.slots[self.active]
                for n, p in self._lora.items():
                    out.weights[n].copy_(_local(p))
            incoming = self.slots[name]
            for n, p in self._lora.items():
                _local(p).copy_(incoming.weights[n])
        self.active = name
        self.optimizer = incoming.optimizer
        self.lr_scheduler = incoming.lr_scheduler
        self.actor = incoming.actor
        self._version = incoming.version
        # The engine scales logits by its config's temperature when it computes
        # logprobs; it must be the task's sampling temperature.
        self.config.temperature = incoming.meta["temperature"]

    # -- non-finite guard -------------------------------------------------------
    def _snapshot(self, slot: TaskSlot) -> dict[str, Any]:
        return {
            "weights": {n: _local(p).detach().clone() for n, p in self._lora.items()},
            "optimizer": copy.deepcopy(slot.optimizer.state_dict()),
            "rng": slot.rng,
        }

    def _restore(self, slot: TaskSlot, snap: dict[str, Any]) -> None:
        with torch.no_grad():
            for n, p in self._lora.items():
                _local(p).copy_(snap["weights"][n])
        slot.optimizer.load_state_dict(snap["optimizer"])
        slot.optimizer.zero_grad(set_to_none=True)
        slot.rng = snap["rng"]

    def _non_finite(self, name: str, stats: dict[str, float]) -> str:
        """What was not finite in the step just taken ("" if all was)."""
        bad = []
        for key in ("actor_loss/avg", "grad_norm"):
            value = stats.get(f"marlaas/{name}/ppo_actor/update/{key}")
            if value is not None and not math.isfinite(value):
                bad.append(f"{key.split('/')[0]}={value}")
        # AReaL skips the optimizer step on a non-finite grad norm, but say so:
        # a silently skipped step would still be committed as a new version.
        if any(not torch.isfinite(_local(p)).all() for p in self._lora.values()):
            bad.append("LoRA weights")
        return ", ".join(bad)

    # -- adapters on disk -------------------------------------------------------
    def _current_weights(self, name: str) -> dict[str, torch.Tensor]:
        if name == self.active:
            return {n: _full(p.detach()) for n, p in self._lora.items()}
        return self.slots[name].weights

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """The task's LoRA tensors under PEFT's saved names (adapter name dropped)."""
        return {
            n.replace(_ADAPTER, ""): t.detach().to("cpu", copy=True).contiguous()
            for n, t in self._current_weights(name).items()
        }

    def save_adapter(self, name: str, path: str | Path) -> str:
        """Write the task's adapter (LoRA parameters only) as a PEFT folder."""
        path = Path(path)
        tmp = path.with_name(path.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        state = self.adapter_state(name)
        save_file(state, tmp / "adapter_model.safetensors")
        peft_cfg = cast("PeftModel", self.model).peft_config["default"]  # use_lora
        peft_cfg.base_model_name_or_path = self.config.path
        peft_cfg.save_pretrained(str(tmp))
        _sort_target_modules(tmp / "adapter_config.json")
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
        return str(path)

    def save_task_state(self, name: str, path: str | Path) -> str:
        """Write ``<path>/optimizer.pt``: the task's AdamW state, LR schedule, PPO
        version and RNG states, so a resumed run continues the same optimization.
        Goes into a committed adapter folder before ``state.json`` names it."""
        slot = self.slots[name]
        state = {
            "task": name,
            "version": slot.version,
            "optimizer": slot.optimizer.state_dict(),
            "lr_scheduler": slot.lr_scheduler.state_dict(),
            "rng": slot.rng,
        }
        path = Path(path) / TASK_STATE
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save(state, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return str(path)

    def _load_task_state(
        self, path: Path, optimizer, scheduler
    ) -> dict[str, Any] | None:
        """Restore the optimizer and LR schedule; return the task's RNG streams."""
        state = torch.load(path, map_location="cpu", weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["lr_scheduler"])
        rng = state.get("rng") or {}
        logger.info(f"restored optimizer/LR/RNG state from {path}")
        return rng if {"torch", "python"} <= rng.keys() else None

    def _read_adapter(self, path: Path) -> dict[str, torch.Tensor]:
        state = load_file(path / "adapter_model.safetensors")
        cfg = json.loads((path / "adapter_config.json").read_text())
        if cfg.get("r") != self.config.lora_rank:
            raise ValueError(
                f"{path}: rank {cfg.get('r')} != actor.lora_rank "
                f"{self.config.lora_rank}"
            )
        out = {}
        for n, p in self._lora.items():
            key = n.replace(_ADAPTER, "")
            if key not in state:
                raise ValueError(f"{path} lacks {key}")
            out[n] = self._shard_like(p, state[key].to(_full(p.detach()).dtype))
        return out
