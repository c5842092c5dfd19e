"""The dtype policy reads the device: CPU float32, NVIDIA < 8.0 float16, >= 8.0 bfloat16, TPU bfloat16."""

from __future__ import annotations

import dataclasses

import pytest

from model.policy import decide_policy


@dataclasses.dataclass
class FakeDevice:
    platform: str
    device_kind: str
    compute_capability: str | None = None


@pytest.mark.parametrize(
    "device,dtype,pre_ampere",
    [
        (FakeDevice("cpu", "cpu"), "float32", False),
        (FakeDevice("gpu", "NVIDIA T4G", "7.5"), "float16", True),
        (FakeDevice("gpu", "Tesla V100-SXM2-16GB", "7.0"), "float16", True),
        (FakeDevice("gpu", "NVIDIA A100-SXM4-40GB", "8.0"), "bfloat16", False),
        (FakeDevice("gpu", "NVIDIA L4", "8.9"), "bfloat16", False),
        (FakeDevice("cuda", "NVIDIA H200", "9.0"), "bfloat16", False),
        (FakeDevice("tpu", "TPU v5 lite"), "bfloat16", False),
    ],
)
def test_policy_follows_the_device(device, dtype, pre_ampere):
    p = decide_policy(device=device)
    assert (p.compute_dtype, p.weight_dtype, p.activation_dtype, p.kv_dtype) == (dtype,) * 4
    assert p.pre_ampere is pre_ampere and not p.emulated and p.warning() is None
    line = p.line()
    assert line.startswith("device policy: platform=") and f"compute_dtype={dtype}" in line
    assert f"pallas_interpret={device.platform == 'cpu'}" in line


def test_an_emulated_override_warns():
    turing = decide_policy("bfloat16", device=FakeDevice("gpu", "NVIDIA T4G", "7.5"))
    assert turing.emulated and turing.overridden and "float16" in turing.warning()
    cpu = decide_policy("bfloat16", device=FakeDevice("cpu", "cpu"))
    assert cpu.emulated and "no native datapath" in cpu.warning()
    assert decide_policy("float32", device=FakeDevice("gpu", "NVIDIA L4", "8.9")).warning() is None


def test_weight_dtype_can_differ_from_compute_dtype():
    p = decide_policy(weight_dtype="bfloat16", device=FakeDevice("cpu", "cpu"))
    assert (p.compute_dtype, p.weight_dtype) == ("float32", "bfloat16")
    with pytest.raises(ValueError, match="unknown dtype"):
        decide_policy("fp8", device=FakeDevice("cpu", "cpu"))
