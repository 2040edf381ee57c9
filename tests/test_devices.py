"""Card visibility when Ray is told not to set ASCEND_RT_VISIBLE_DEVICES (simulated env)."""

from __future__ import annotations

import pytest

from actors.devices import pin_visible_devices


def test_ray_isolation_is_left_alone() -> None:
    env = {"ASCEND_RT_VISIBLE_DEVICES": "5"}
    assert pin_visible_devices("npu", env=env, assigned=lambda: {"NPU": ["1"]}) == "5"
    assert env == {"ASCEND_RT_VISIBLE_DEVICES": "5"}


def test_noset_cluster_pins_the_assigned_npus() -> None:
    env = {"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1", "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    assert pin_visible_devices("npu", env=env, assigned=lambda: {"NPU": ["3", "4"]}) == "3,4"
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "3,4"


def test_noset_for_cuda_uses_gpu_ids() -> None:
    env = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "true"}
    assert pin_visible_devices("cuda", env=env, assigned=lambda: {"GPU": ["2"]}) == "2"


def test_noset_without_assigned_ids_is_an_error() -> None:
    env = {"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1"}
    with pytest.raises(RuntimeError, match="assigned this actor no NPU ids"):
        pin_visible_devices("npu", env=env, assigned=lambda: {"NPU": []})


def test_cpu_targets_have_no_cards() -> None:
    env: dict[str, str] = {}
    assert pin_visible_devices("cpu", env=env, assigned=lambda: {}) is None and env == {}
