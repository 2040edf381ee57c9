"""Ascend provenance (actors/ascend.py) from npu-smi output and version files kept as fixtures."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from actors import ascend

FIXTURES = Path(__file__).parent / "fixtures" / "npu-smi"
INFO_910B = "info-atlas800t-a2-910b3-8cards.txt"
INFO_910 = "info-atlas800-9000-910a-8cards.txt"
CHIP_MAP = "info-m-atlas800t-a2-910b3-8cards.txt"
BOARD = "board-i0-atlas800t-a2-910b3.txt"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_info_of_an_atlas_800t_a2() -> None:
    info = ascend.parse_info(fixture(INFO_910B))
    assert info["version"] == "24.1.rc2"
    assert len(info["chips"]) == 8  # the process table below the cards adds none
    assert info["chips"][0] == {
        "npu": 0,
        "name": "910B3",
        "health": "OK",
        "chip": 0,
        "bus_id": "0000:C1:00.0",
        "hbm_used_mb": 63705,
        "hbm_mb": 65536,
    }
    assert [c["npu"] for c in info["chips"]] == list(range(8))
    assert {c["hbm_mb"] for c in info["chips"]} == {65536}


def test_info_with_ddr_beside_hbm_takes_the_hbm_column() -> None:
    info = ascend.parse_info(fixture(INFO_910))
    assert info["version"] == "23.0.rc2"
    assert [(c["name"], c["hbm_used_mb"], c["hbm_mb"]) for c in info["chips"]] == [("910A", 0, 32768)] * 8
    assert info["chips"][3]["bus_id"] == "0000:01:00.0"


def test_chip_map_skips_the_mcu_rows() -> None:
    chip_map = ascend.parse_chip_map(fixture(CHIP_MAP))
    assert sorted(chip_map) == list(range(8))
    assert chip_map[5] == {"npu": 5, "chip": 0, "name": "Ascend 910B3"}


def test_board_fields() -> None:
    board = ascend.parse_fields(fixture(BOARD))
    assert board["Software Version"] == "24.1.rc2"
    assert board["Firmware Version"] == "7.3.0.1.231"
    assert board["Compatibility"] == "OK"
    assert board["PCIe Bus Info"] == "0000:C1:00.0"  # colons in the value survive


def test_version_files() -> None:
    assert ascend.parse_version_file(fixture("driver-version.info"))["Version"] == "24.1.rc2"
    assert ascend.parse_version_file(fixture("firmware-version.info"))["Version"] == "7.3.0.1.231"
    assert ascend.parse_version_file(fixture("ascend_toolkit_install.info"))["version"] == "8.0.RC2"


def test_only_whitelisted_variables_are_recorded() -> None:
    environ = {
        "HCCL_CONNECT_TIMEOUT": "1200",
        "HCCL_OP_EXPANSION_MODE": "AIV",
        "ASCEND_RT_VISIBLE_DEVICES": "0,1",
        "VLLM_ASCEND_ENABLE_TOPK_OPTIMIZE": "1",
        "ASCEND_API_KEY": "sk-secret",  # a whitelisted prefix, but a credential's name
        "HF_TOKEN": "hf_secret",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "PATH": "/usr/bin",
    }
    assert ascend.ascend_env(environ) == {
        "env.ASCEND_RT_VISIBLE_DEVICES": "0,1",
        "env.HCCL_CONNECT_TIMEOUT": "1200",
        "env.HCCL_OP_EXPANSION_MODE": "AIV",
        "env.VLLM_ASCEND_ENABLE_TOPK_OPTIMIZE": "1",
    }


def npu_smi(args: list[str]) -> str:
    """npu-smi on the fixture node."""
    outputs = {("info",): INFO_910B, ("info", "-m"): CHIP_MAP, ("info", "-t", "board", "-i", "2"): BOARD}
    return fixture(outputs[tuple(args)])


def ascend_root(tmp_path: Path) -> Path:
    """/usr/local/Ascend of the fixture node: driver, firmware and CANN version files."""
    for sub, name in [("driver", "version.info"), ("firmware", "version.info")]:
        (tmp_path / sub).mkdir()
        (tmp_path / sub / name).write_text(fixture(f"{sub}-version.info"))
    toolkit = tmp_path / "ascend-toolkit" / "latest" / f"{platform.machine()}-linux"
    toolkit.mkdir(parents=True)
    (toolkit / "ascend_toolkit_install.info").write_text(fixture("ascend_toolkit_install.info"))
    return tmp_path


def test_describe_reports_the_cards_this_actor_sees(tmp_path: Path) -> None:
    environ = {"ASCEND_RT_VISIBLE_DEVICES": "2,3", "HCCL_BUFFSIZE": "200", "HOME": "/root"}
    info = ascend.describe(environ, npu_smi=npu_smi, root=ascend_root(tmp_path))
    assert info == {
        "npu_smi": "24.1.rc2",
        "npu_cards": "8",
        "npu_visible": "2, 3",
        "npu_chip": "Ascend 910B3",
        "npu_hbm_mb": "65536",
        "npu_health": "OK",
        "npu_driver": "24.1.rc2",
        "npu_firmware": "7.3.0.1.231",
        "npu_compatibility": "OK",
        "cann": "8.0.RC2",
        "env.ASCEND_RT_VISIBLE_DEVICES": "2,3",
        "env.HCCL_BUFFSIZE": "200",
    }
    assert all(isinstance(v, str) for v in info.values())  # run.json provenance is str -> str


def test_without_npu_smi_the_version_files_still_speak(tmp_path: Path) -> None:
    info = ascend.describe({}, npu_smi=lambda args: None, root=ascend_root(tmp_path))
    assert info == {
        "npu_error": "npu-smi not found",
        "npu_driver": "24.1.rc2",
        "npu_firmware": "7.3.0.1.231",
        "cann": "8.0.RC2",
    }


def test_a_failing_npu_smi_is_recorded_not_raised(tmp_path: Path) -> None:
    def broken(args: list[str]) -> str:
        raise OSError("dcmi init failed")

    info = ascend.describe({}, npu_smi=broken, root=tmp_path)
    assert info == {"npu_error": "npu-smi: OSError: dcmi init failed"}


@pytest.mark.parametrize(
    ("visible", "cards"),
    [(None, "0, 1, 2, 3, 4, 5, 6, 7"), ("7", "7"), ("1,0", "0, 1")],
)
def test_visible_logic_ids_select_cards(visible: str | None, cards: str) -> None:
    info = ascend.parse_info(fixture(INFO_910B))
    chip_map = ascend.parse_chip_map(fixture(CHIP_MAP))
    summary = ascend.summarize(info, chip_map, {}, driver={}, firmware={}, visible=visible)
    assert summary["npu_visible"] == cards
    # Without `npu-smi info -m`, logic ids stand for card ids (one chip per card).
    assert ascend.summarize(info, {}, {}, driver={}, firmware={}, visible=visible)["npu_visible"] == cards
