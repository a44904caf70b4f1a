"""The device policy's GPU path on real hardware: placement, bf16 and offload.

Runs only where torch sees a CUDA device; elsewhere the module is skipped, saying so. That skip
is a hardware check, not a missing feature: the same policy code is covered on CPU with a
simulated card (test_device_policy.py), and this module checks what only a GPU can.
"""

from __future__ import annotations

import pytest
import torch

from tests.workers.conftest import Recorder, SmokeStack
from workers.device.detect import detect_policy, policy_from_env
from workers.device.policy import Placement

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device on this host: the GPU placement/bf16/offload checks need one",
)


def test_auto_detection_places_every_role_on_the_gpu():
    policy = detect_policy()
    assert policy.device == "cuda:0" and policy.profile in ("gpu-max", "lowvram")
    assert policy.vram_gb > 0 and policy.describe()["device_name"]
    for role in ("denoiser", "text-encoder", "vae"):
        assert policy.placement(role).device == "cuda:0", role
        assert not policy.placement(role).offload, role  # offload only when asked


def test_a_bf16_card_computes_in_bf16_and_keeps_the_vae_in_a_safe_dtype():
    policy = detect_policy()
    denoiser = policy.placement("denoiser")
    expected = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    assert denoiser.torch_dtype is expected
    layer = torch.nn.Linear(64, 32).to(denoiser.device, denoiser.torch_dtype)
    out = layer(torch.randn(4, 64, device=denoiser.device, dtype=denoiser.torch_dtype))
    assert out.device.type == "cuda" and out.dtype is expected and torch.isfinite(out).all()
    assert policy.placement("vae").torch_dtype in (torch.bfloat16, torch.float32)


def test_offload_keeps_a_module_on_the_cpu_between_uses_and_on_the_gpu_while_used():
    from workers.models.zimage.engine import on_device

    placement = policy_from_env({"INLINE_CPU_OFFLOAD": "1"}).placement("vae")
    assert placement == Placement("cuda:0", placement.dtype, offload=True)
    module = torch.nn.Linear(16, 16)
    with on_device(module, placement) as used:
        assert next(used.parameters()).device.type == "cuda"
        used(torch.randn(2, 16, device="cuda:0"))
    assert next(module.parameters()).device.type == "cpu"


def test_the_loaded_stack_sits_where_the_policy_says(smoke_stack: SmokeStack):
    from workers.models.zimage import loading

    policy = policy_from_env({"INLINE_CPU_OFFLOAD": "1"})
    model = loading.load_diffusion_model(smoke_stack.models_dir, smoke_stack.names["model"],
                                         policy)
    weight = next(model.transformer.parameters())
    assert weight.device.type == "cuda"  # the denoiser never waits offloaded
    assert weight.dtype is policy.placement("denoiser").torch_dtype
    vae = loading.load_vae(smoke_stack.models_dir, smoke_stack.names["vae"], policy)
    assert next(vae.module.parameters()).device.type == "cpu"  # offloaded: waits on the CPU


def test_the_turbo_node_renders_on_the_gpu(smoke_stack: SmokeStack):
    from workers.runners import diffusion  # noqa: F401  (registers the runners)
    from workers.runners.base import RUNNERS, NodeContext

    policy = detect_policy()
    recorder = Recorder()
    ctx = NodeContext(run_id="gpu", node_id="gen", node_type="zimage/turbo",
                      graph_sha256="0" * 64, models_dir=smoke_stack.models_dir, owner_id=1,
                      policy=policy, check_cancelled=recorder.check_cancelled,
                      report_progress=recorder.report)
    params = {"prompt": "a lighthouse", "negative_prompt": "", "width": 64, "height": 48,
              "steps": 3, "guidance": 0.0, "seed": 1, "strength": 0.6, **smoke_stack.names}
    image = RUNNERS["zimage/turbo"](ctx, params, {})["image"]
    assert image.size == (64, 48)
    assert recorder.progress == [(1, 3), (2, 3), (3, 3)]
