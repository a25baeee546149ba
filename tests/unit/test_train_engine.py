"""The multi-LoRA FSDP engine on the CPU: packed-attention parity, per-task slot
swaps, on-policy refusal and PEFT adapter files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from areal.engine.fsdp_engine import FSDPPPOActor
from transformers import AutoModelForCausalLM

from areal_marlaas.train.audit import logprob_gap
from areal_marlaas.train.engine import StaleBatchError
from areal_marlaas.train.multilora import _full
from tests.support.engines import make_engine, ragged_batch
from tests.support.snapshots import (
    assert_bitwise_equal,
    lora_snapshot,
    optimizer_snapshot,
)

# The FSDP engine is built in this process, as one rank.
pytestmark = pytest.mark.usefixtures("single_rank_env")

# Observed packed-vs-per-sequence difference is ~5e-7 in float32 (different kernel
# shapes sum in a different order); attending across a sequence boundary shifts
# logprobs by ~1e-1. 1e-5 separates the two with a wide margin either way.
PARITY_ATOL = 1e-5


def per_sequence_logprobs(path, batch):
    """Reference: plain HF forward of each sequence alone (no packing)."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    lens = batch["attention_mask"].sum(-1).tolist()
    ref = torch.zeros(batch["input_ids"].shape)
    with torch.no_grad():
        for i, n in enumerate(lens):
            ids = batch["input_ids"][i, :n].long()
            logp = torch.log_softmax(model(ids[None]).logits[0], -1)
            ref[i, : n - 1] = logp[:-1].gather(-1, ids[1:, None])[:, 0]
    return ref, lens


def max_diff(out, ref, lens):
    return max(
        (out[i, : n - 1] - ref[i, : n - 1]).abs().max().item()
        for i, n in enumerate(lens)
    )


# "eager" runs AReaL's masked path with the fix (one block-diagonal mask over
# the page-padded pack); "sdpa" on a CPU runs the engine's per-sequence attention.
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_packed_forward_matches_per_sequence_hf_forward(arch, attn, tiny):
    engine = make_engine(tiny[arch], attn_impl=attn)
    engine.add_task("a", lr=1e-3, total_steps=1, n_samples=3, seed=0)
    engine.switch_task("a")  # B=0: the adapter is the identity
    batch = ragged_batch([12, 7, 20])

    (packed,) = engine.compute_logp([batch])
    ref, lens = per_sequence_logprobs(tiny[arch], batch)

    assert max_diff(packed, ref, lens) < PARITY_ATOL


def test_stock_areal_mask_is_wrong_on_cpu_qwen3(tiny):
    """Why the fix exists: AReaL's packed mask attends across sequences on sdpa."""
    engine = make_engine(tiny["qwen3"], cls=FSDPPPOActor)
    batch = ragged_batch([12, 7, 20])

    (packed,) = engine.compute_logp([batch])
    ref, lens = per_sequence_logprobs(tiny["qwen3"], batch)

    assert max_diff(packed, ref, lens) > 1e-2


def test_task_b_update_leaves_task_a_adapter_and_optimizer_bitwise_unchanged(tiny):
    engine = make_engine(tiny["llama"])
    engine.add_task("a", lr=1e-2, total_steps=5, n_samples=2, seed=1)
    engine.add_task("b", lr=1e-2, total_steps=5, n_samples=2, seed=2)
    engine.train_task("a", [ragged_batch([9, 12], seed=1)])
    a_weights, a_optim = lora_snapshot(engine, "a"), optimizer_snapshot(engine, "a")
    b_before = lora_snapshot(engine, "b")

    engine.train_task("b", [ragged_batch([10, 8], seed=2)])
    engine.train_task("b", [ragged_batch([11, 6], seed=3, version=1)])
    engine.switch_task("a")

    assert_bitwise_equal(lora_snapshot(engine, "a"), a_weights)
    assert_bitwise_equal(optimizer_snapshot(engine, "a"), a_optim)
    assert len(a_optim) > 0 and "exp_avg" in a_optim[0]
    # B really trained: its weights moved and its version advanced.
    b_after = lora_snapshot(engine, "b")
    assert any(not torch.equal(b_before[k], b_after[k]) for k in b_before)
    assert (engine.slots["a"].version, engine.slots["b"].version) == (1, 2)


def test_batch_from_another_version_is_refused(tiny):
    engine = make_engine(tiny["llama"])
    engine.add_task("a", lr=1e-3, total_steps=5, n_samples=2, seed=1)
    engine.train_task("a", [ragged_batch([9, 12], version=0)])
    before = lora_snapshot(engine, "a")

    with pytest.raises(StaleBatchError, match="task 'a' is at version 1"):
        engine.train_task("a", [ragged_batch([9, 12], version=0)])

    assert_bitwise_equal(lora_snapshot(engine, "a"), before)
    assert engine.slots["a"].version == 1


def test_saved_adapter_is_lora_only_peft_and_round_trips(tiny, tmp_path):
    from peft import PeftModel

    engine = make_engine(tiny["llama"])
    engine.add_task("a", lr=1e-2, total_steps=5, n_samples=2, seed=1)
    engine.train_task("a", [ragged_batch([9, 12])])

    path = Path(engine.save_adapter("a", tmp_path / "v1"))
    peft = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny["llama"]), str(path)
    )
    engine.add_task("c", lr=1e-3, total_steps=5, n_samples=2, seed=9, init_adapter=path)

    assert sorted(p.name for p in path.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    saved = engine.adapter_state("a")
    assert all("lora_" in k for k in saved)
    loaded = {
        n.replace(".default", ""): p.detach()
        for n, p in peft.named_parameters()
        if "lora_" in n
    }
    assert_bitwise_equal(loaded, saved)
    assert_bitwise_equal(engine.adapter_state("c"), saved)


def test_on_policy_actor_refuses_a_batch_from_another_version(tiny):
    """AReaL's PPOTrainer (the example) with an asynchronous prepare_batch could
    hand the actor pre-update trajectories; this actor refuses them."""
    from areal_marlaas.train.engine import OnPolicyFSDPPPOActor

    engine = make_engine(tiny["llama"], cls=OnPolicyFSDPPPOActor)
    try:
        engine.set_version(1)
        stale = engine.compute_advantages([ragged_batch([9, 12], seed=1, version=0)])
        with pytest.raises(StaleBatchError, match="generated by version"):
            engine.ppo_update(stale)
        fresh = engine.compute_advantages([ragged_batch([9, 12], seed=1, version=1)])
        engine.ppo_update(fresh)
    finally:
        engine.destroy()


def test_a_batch_the_server_served_under_another_name_is_refused(tiny):
    from areal_marlaas.train.engine import AuditError

    engine = make_engine(tiny["llama"])
    try:
        engine.add_task("a", lr=1e-3, total_steps=3, n_samples=2, seed=0)
        batch = ragged_batch([9, 12], seed=1)
        batch["served_adapters"] = ["a-v0", "b-v0"]
        with pytest.raises(AuditError, match=r"reported serving \['b-v0'\]"):
            engine.train_task("a", [batch])
        batch["served_adapters"] = ["a-v0", "a-v0"]
        out = engine.train_task("a", [batch])
        assert out["version"] == 1 and out["audit"]["served_adapters"] == ["a-v0"]
    finally:
        engine.destroy()


def _step_with_grads(engine, task, batch):
    """One train_task; returns (result, every LoRA gradient at the step)."""
    grads = {}
    opt = engine.slots[task].optimizer
    step = opt.step

    def record(*args, _step=step, **kwargs):
        for n, p in engine._lora.items():
            grads[n] = _full(p.grad).detach().clone()
        return _step(*args, **kwargs)

    opt.step = record
    try:
        return engine.train_task(task, batch), grads
    finally:
        opt.step = step


def test_packed_attention_gives_the_same_update_as_the_masked_path(tiny):
    """The CPU attention path (per-sequence sdpa, no page padding) changes how
    the step is computed, not the update: the same loss, grad norm and gradient
    of every LoRA tensor as AReaL's masked path (one block-diagonal mask over
    the page-padded pack), within float32 summation order.
    (Adam's first step is sign(g) x lr, so the new weights would flip on
    gradients that are ~0 in both: the gradients are what is compared.)"""
    out = {}
    for attn in ("eager", "sdpa"):
        engine = make_engine(tiny["llama"], attn_impl=attn)
        try:
            engine.add_task("a", lr=1e-2, total_steps=3, n_samples=2, seed=0)
            batch = ragged_batch([9, 31, 5, 14], seed=3)
            result, grads = _step_with_grads(engine, "a", [batch])
            stats = result["stats"]
            out[attn] = (
                stats["marlaas/a/ppo_actor/update/actor_loss/avg"],
                stats["marlaas/a/ppo_actor/update/grad_norm"],
                grads,
                engine.model.config._attn_implementation,
            )
        finally:
            engine.destroy()
    (l1, g1, d1, impl1), (l2, g2, d2, impl2) = out["eager"], out["sdpa"]
    assert (impl1, impl2) == ("eager", "marlaas_packed")
    assert l1 == pytest.approx(l2, rel=1e-4, abs=1e-6)
    assert g1 == pytest.approx(g2, rel=1e-4)
    assert g1 > 0 and d1.keys() == d2.keys()  # a real update
    scale = max(float(d.abs().max()) for d in d1.values())
    for name in d1:
        assert torch.allclose(d1[name], d2[name], rtol=1e-3, atol=1e-5 * scale), name


def test_audit_from_the_update_forward_and_lm_head_rows_leave_the_update(tiny):
    """The update's forward feeds the audit and the LM head runs on the loss's
    rows only: the same loss, grad norm and LoRA gradients as an update with a
    full LM head and no audit, and the same audit (over every generated token)
    as a separate forward of the batch before it, within float32 summation
    order, with no forward besides the update's and fewer LM-head rows."""
    out = {}
    for kind in ("separate", "fused"):
        engine = make_engine(tiny["llama"])
        rows, logps = [], []
        head = engine.model.get_output_embeddings()
        # Rows the head computed: the ones not left all zero.
        head.register_forward_hook(
            lambda m, i, o, rows=rows: rows.append(int(o[0].abs().sum(-1).gt(0).sum()))
        )
        try:
            engine.add_task("a", lr=1e-2, total_steps=3, n_samples=2, seed=0)
            batch = [
                ragged_batch([9, 31, 5, 14], seed=3),
                ragged_batch([20, 7, 12, 16], seed=4),
            ]
            if kind == "separate":
                # The reference: the audit as its own forward of the version's
                # weights, then an unaudited update with the full LM head (as
                # under sequence or tensor parallelism).
                engine.switch_task("a")
                data = [
                    {k: v for k, v in t.items() if torch.is_tensor(v)} for t in batch
                ]
                audit = logprob_gap(batch, engine.compute_logp(data))
                engine.slots["a"].meta["audit_trajectories"] = 0
                engine._row_select = lambda: False
            else:
                # audit_trajectories covers both groups: the audit reads every token.
                engine.slots["a"].meta["audit_trajectories"] = 2
            compute_logp = engine.compute_logp

            def spy(*args, _f=compute_logp, _logps=logps, **kwargs):
                _logps.append(1)
                return _f(*args, **kwargs)

            engine.compute_logp = spy
            result, grads = _step_with_grads(engine, "a", batch)
            if kind == "fused":
                audit = result["audit"]
            else:
                assert result["audit"]["audited_tokens"] == 0
            out[kind] = (result["stats"], audit, grads, rows, logps)
        finally:
            engine.destroy()
    (s1, a1, d1, r1, f1), (s2, a2, d2, r2, f2) = out["separate"], out["fused"]
    key = "marlaas/a/ppo_actor/update/"
    assert s1[key + "actor_loss/avg"] == pytest.approx(
        s2[key + "actor_loss/avg"], rel=1e-4, abs=1e-6
    )
    assert s1[key + "grad_norm"] == pytest.approx(s2[key + "grad_norm"], rel=1e-4)
    assert s1[key + "new_logp/avg"] == pytest.approx(s2[key + "new_logp/avg"], rel=1e-5)
    assert s1[key + "grad_norm"] > 0 and d1.keys() == d2.keys()
    scale = max(float(d.abs().max()) for d in d1.values())
    for name in d1:
        assert torch.allclose(d1[name], d2[name], rtol=1e-3, atol=1e-5 * scale), name
    # The same audit: every generated token (length - 3 prompt tokens each).
    tokens = sum(n - 3 for n in [9, 31, 5, 14, 20, 7, 12, 16])
    assert a1["audited_tokens"] == a2["audited_tokens"] == tokens
    assert a1["logprob_gap_mean"] == pytest.approx(a2["logprob_gap_mean"], rel=1e-5)
    assert a1["logprob_gap_max"] == pytest.approx(a2["logprob_gap_max"], rel=1e-5)
    # Separate: the audit's forward, then the update, both over all 114 rows;
    # fused: the update alone (no other forward), its LM head over the
    # generated tokens' rows.
    assert (len(f1), len(f2)) == (0, 0)
    assert r1 == [114, 114] and r2 == [tokens]


def test_audit_with_several_minibatches_is_a_separate_forward_of_its_groups(tiny):
    """With more than one optimizer step per batch the update's forwards run
    with moving weights: the audit is its own forward, first, of the first
    ``audit_trajectories`` groups under the version's weights."""
    engine = make_engine(tiny["llama"], ppo_n_minibatches=2)
    try:
        engine.add_task("a", lr=1e-2, total_steps=3, n_samples=2, seed=0)
        engine.slots["a"].meta["audit_trajectories"] = 1
        batch = [
            ragged_batch([9, 31, 5, 14], seed=3),
            ragged_batch([20, 7, 12, 16], seed=4),
        ]
        engine.switch_task("a")
        data = [{k: v for k, v in t.items() if torch.is_tensor(v)} for t in batch]
        expected = logprob_gap(batch[:1], engine.compute_logp(data[:1]))
        calls = []
        compute_logp = engine.compute_logp

        def spy(*args, _f=compute_logp, **kwargs):
            calls.append(len(args[0]))
            return _f(*args, **kwargs)

        engine.compute_logp = spy
        audit = engine.train_task("a", batch)["audit"]
        assert calls == [1]
        tokens = sum(n - 3 for n in [9, 31, 5, 14])  # the first group only
        assert audit["audited_tokens"] == expected["audited_tokens"] == tokens
        assert audit["logprob_gap_mean"] == pytest.approx(
            expected["logprob_gap_mean"], rel=1e-6
        )
    finally:
        engine.destroy()


def test_audit_in_the_update_refuses_before_the_optimizer_step(tiny):
    """A batch whose server logprobs are far from the trainer's is refused
    between backward and optimizer step: weights, AdamW state, RNG and version
    stay bitwise as they were, and the next batch trains normally."""
    from areal_marlaas.train.engine import AuditError

    engine = make_engine(tiny["llama"])
    try:
        engine.add_task(
            "a", lr=1e-2, total_steps=3, n_samples=2, seed=0, audit_max_mean_gap=0.05
        )
        slot = engine.slots["a"]
        weights, optim = lora_snapshot(engine, "a"), optimizer_snapshot(engine, "a")
        rng = slot.rng
        # ragged_batch's server logprobs are uniform noise in (-1, 0]: far off.
        with pytest.raises(AuditError, match=r"exceeds 0.05 \(audit.max_mean_gap\)"):
            engine.train_task("a", [ragged_batch([9, 31, 5, 14], seed=3)])
        assert slot.version == 0 and slot.rng is rng
        assert_bitwise_equal(lora_snapshot(engine, "a"), weights)
        assert_bitwise_equal(optimizer_snapshot(engine, "a"), optim)
        assert all(p.grad is None or not p.grad.any() for p in engine._lora.values())
        slot.meta["audit_max_mean_gap"] = 0.0  # record only
        result = engine.train_task("a", [ragged_batch([9, 31, 5, 14], seed=3)])
        assert result["version"] == 1 and result["audit"]["logprob_gap_mean"] > 0.05
        assert any(
            not torch.equal(weights[k], v)
            for k, v in lora_snapshot(engine, "a").items()
        )
    finally:
        engine.destroy()
