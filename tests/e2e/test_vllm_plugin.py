"""The grouped CPU multi-LoRA ops of our vLLM plugin against vLLM's own torch ops.

Runs in the vLLM venv (where the plugin runs), through a subprocess."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from areal_marlaas.paths import vllm_python
from areal_marlaas.rollout.server import VLLM_PLUGIN_DIR

pytestmark = pytest.mark.vllm

_CHECK = r"""
import json, torch
import marlaas_vllm_plugin as ours
from vllm.lora.ops.torch_ops import lora_ops as ref
from vllm.lora.punica_wrapper import punica_cpu

torch.manual_seed(0)
res = {}
T, L, r = 37, 4, 8
idx = torch.randint(0, L, (T,))
idx_nolora = idx.clone()
idx_nolora[::5] = -1
for name, (i_dim, o_dim) in {"shrink": (64, r), "expand": (r, 96)}.items():
    x = torch.randn(T, i_dim, dtype=torch.bfloat16)
    w = torch.randn(L, 1, o_dim, i_dim, dtype=torch.bfloat16)
    for add in (False, True):
        base = torch.randn(T, o_dim, dtype=torch.bfloat16)
        a, b = base.clone(), base.clone()
        ref.bgmv_expand(x, w, a, idx, add_inputs=add)
        ours.bgmv_expand(x, w, b, idx, add_inputs=add)
        res[f"{name}-expand-add{add}"] = (a.float() - b.float()).abs().max().item()
        a, b = base.clone(), base.clone()
        ref.bgmv_expand_slice(x, w, a, idx, 0, o_dim, add_inputs=add)
        ours.bgmv_expand_slice(x, w, b, idx, 0, o_dim, add_inputs=add)
        res[f"{name}-slice-add{add}"] = (a.float() - b.float()).abs().max().item()
    a = torch.zeros(T, o_dim, dtype=torch.float32)
    b = torch.zeros(T, o_dim, dtype=torch.float32)
    ref.bgmv_shrink(x, w, a, idx, 0.5)
    ours.bgmv_shrink(x, w, b, idx, 0.5)
    res[f"{name}-shrink"] = (a - b).abs().max().item()
    res[f"{name}-scale"] = a.abs().max().item()
    # Index -1 is "no adapter": zero rows, the rest as with a real index.
    y = torch.zeros(T, o_dim, dtype=torch.float32)
    ours.bgmv_shrink(x, w, y, idx_nolora, 1.0)
    full = torch.zeros(T, o_dim, dtype=torch.float32)
    ours.bgmv_shrink(x, w, full, idx, 1.0)
    keep = idx_nolora >= 0
    res[f"{name}-nolora-zero"] = y[~keep].abs().max().item()
    res[f"{name}-nolora-rest"] = (y[keep] - full[keep]).abs().max().item()
ours.register()
res["patched"] = punica_cpu.bgmv_expand is ours.bgmv_expand and (
    ref.bgmv_shrink is ours.bgmv_shrink
)
print(json.dumps(res))
"""


def test_grouped_ops_match_vllm_torch_ops_and_zero_unadapted_rows():
    if not Path(vllm_python()).exists():
        pytest.fail(f"no vLLM venv at {vllm_python()}: run `make setup`")
    proc = subprocess.run(
        [vllm_python(), "-c", _CHECK],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(VLLM_PLUGIN_DIR), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])

    assert res.pop("patched") is True
    for kind in ("shrink", "expand"):
        assert res.pop(f"{kind}-nolora-zero") == 0.0
        scale = res.pop(f"{kind}-scale")
        assert scale > 1.0  # the comparisons here are of real, nonzero values
        # Other rows as with no -1 present (float32 GEMM blocking aside).
        assert res.pop(f"{kind}-nolora-rest") <= 1e-5 * scale
    # float32 accumulation vs vLLM's bf16 einsum: within bf16 rounding.
    assert all(v <= 0.05 for v in res.values()), res


def test_real_server_loads_the_plugin_in_its_workers(vllm_server):
    log = Path(vllm_server.log_file).read_text()

    assert "marlaas: grouped CPU multi-LoRA kernels installed" in log
    assert "marlaas: seeded sampling survives chunked prefill on CPU" in log
