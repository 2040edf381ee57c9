"""Ascend provenance: what an Ascend engineer asks first about a run. Which chip, how much HBM,
which driver and firmware, which CANN, and which HCCL / ASCEND settings were in force.

The parsers are pure (text in, dict out) and are tested on npu-smi output kept under
tests/fixtures/npu-smi/. `describe` is the thin collector that an actor on an `npu` target calls
(through actors/provenance.py). It runs npu-smi when the node has it and reads the driver, firmware
and CANN version files. It never fails a run: what it cannot learn becomes an `npu_error` entry.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path("/usr/local/Ascend")
# Only variables with these name prefixes are recorded, and never one whose name looks like a credential.
ENV_PREFIXES = ("ASCEND_", "HCCL_", "VLLM_ASCEND_", "PYTORCH_NPU_", "TASK_QUEUE_ENABLE")
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)
_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")  # "used / total", as npu-smi prints usage


def parse_info(text: str) -> dict[str, Any]:
    """`npu-smi info` -> {"version": "24.1.rc2", "chips": [{"npu": 0, "chip": 0, "name": "910B3",
    "health": "OK", "bus_id": "0000:C1:00.0", "hbm_used_mb": 3390, "hbm_mb": 65536}, ...]}.

    Each card is a pair of table rows: card id, name and health, then chip id, bus id and usage
    figures. The usage columns are matched to the header by name, so a layout without HBM (or with
    DDR before it) still parses. The process table below the card table is ignored.
    """
    version = re.search(r"npu-smi\s+\S+\s+Version:\s*(\S+)", text)
    usage_columns: list[str] = []
    chips: list[dict[str, Any]] = []
    card: dict[str, Any] | None = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) != 3:
            continue
        if "Process id" in cells[1]:
            break
        if cells[1] == "Bus-Id":
            usage_columns = [c for c in cells[2].split() if "Usage" in c]
            continue
        first = cells[0].split()
        if not first or not first[0].isdigit():
            continue
        if len(first) > 1:  # card row: "0     910B3 | OK | power temp hugepages"
            card = {"npu": int(first[0]), "name": " ".join(first[1:]), "health": cells[1]}
        elif card is not None:  # chip row: "0 | bus id | aicore memory hbm"
            usage = dict(zip(usage_columns, _PAIR.findall(cells[2]), strict=False))
            hbm = usage.get("HBM-Usage(MB)")
            chips.append(
                card
                | {"chip": int(first[0]), "bus_id": cells[1]}
                | ({"hbm_used_mb": int(hbm[0]), "hbm_mb": int(hbm[1])} if hbm else {})
            )
    return {"version": version.group(1) if version else None, "chips": chips}


def parse_chip_map(text: str) -> dict[int, dict[str, Any]]:
    """`npu-smi info -m` -> {logic id: {"npu": card id, "chip": chip id, "name": "Ascend 910B3"}}.

    ASCEND_RT_VISIBLE_DEVICES counts logic ids; npu-smi's other commands take card ids. The MCU
    rows have no logic id ("-") and are left out.
    """
    out = {}
    for line in text.splitlines():
        tokens = line.split()
        if len(tokens) >= 4 and tokens[0].isdigit() and tokens[1].isdigit() and tokens[2].isdigit():
            out[int(tokens[2])] = {"npu": int(tokens[0]), "chip": int(tokens[1]), "name": " ".join(tokens[3:])}
    return out


def parse_fields(text: str) -> dict[str, str]:
    """`npu-smi info -t board -i N` (and the other `-t` queries): "Key   : Value" lines -> {Key: Value}."""
    fields = (re.match(r"^\s*([^:]+?)\s+:\s*(.*?)\s*$", line) for line in text.splitlines())
    return {m.group(1): m.group(2) for m in fields if m}


def parse_version_file(text: str) -> dict[str, str]:
    """The driver's, firmware's and CANN's version files: "key=value" lines -> {key: value}."""
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.lstrip().startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def ascend_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The HCCL / ASCEND settings in force, as {"env.NAME": value}: whitelisted name prefixes only."""
    return {
        f"env.{name}": value
        for name, value in sorted(environ.items())
        if name.startswith(ENV_PREFIXES) and not _SECRET.search(name)
    }


def summarize(
    info: dict[str, Any],
    chip_map: dict[int, dict[str, Any]],
    board: dict[str, str],
    *,
    driver: dict[str, str],
    firmware: dict[str, str],
    visible: str | None,
) -> dict[str, str]:
    """The provenance entries for the cards this actor sees (`visible`: ASCEND_RT_VISIBLE_DEVICES,
    logic ids; None: every card of the node)."""
    seen = set(_visible_chips(chip_map, visible, info))
    chips = [c for c in info["chips"] if (c["npu"], c["chip"]) in seen]
    names = {(c["npu"], c["chip"]): c["name"] for c in chip_map.values()}

    def distinct(values: list[Any]) -> str:
        return ", ".join(dict.fromkeys(str(v) for v in values if v is not None))

    out = {
        "npu_smi": info.get("version"),
        "npu_cards": str(len({c["npu"] for c in info["chips"]})) if info["chips"] else None,
        "npu_visible": distinct([c["npu"] for c in chips]),
        "npu_chip": distinct([names.get((c["npu"], c["chip"]), c["name"]) for c in chips]),
        "npu_hbm_mb": distinct([c.get("hbm_mb") for c in chips]),
        "npu_health": distinct([c["health"] for c in chips]),
        "npu_driver": board.get("Software Version") or driver.get("Version"),
        "npu_firmware": board.get("Firmware Version") or firmware.get("Version"),
        "npu_compatibility": board.get("Compatibility"),
    }
    return {k: v for k, v in out.items() if v}


def _visible_chips(
    chip_map: dict[int, dict[str, Any]], visible: str | None, info: dict[str, Any]
) -> list[tuple[int, int]]:
    """(card, chip) of the logic ids in `visible` (all chips when None). Without a chip map (no
    `npu-smi info -m`) logic ids are taken as card ids, as on one-chip cards such as the 910B."""
    every = [(c["npu"], c["chip"]) for c in info["chips"]]
    if not visible:
        return every
    logic = [int(x) for x in visible.split(",") if x.strip().isdigit()]
    if chip_map:
        return [(chip_map[i]["npu"], chip_map[i]["chip"]) for i in logic if i in chip_map]
    return [(npu, chip) for npu, chip in every if npu in logic]


def cann_version(environ: Mapping[str, str], *, root: Path = ROOT) -> str | None:
    """The CANN toolkit's version, from its ascend_toolkit_install.info (set_env.sh sets ASCEND_TOOLKIT_HOME)."""
    homes = [
        environ.get("ASCEND_TOOLKIT_HOME"),
        environ.get("ASCEND_HOME_PATH"),
        str(root / "ascend-toolkit" / "latest"),
    ]
    for home in dict.fromkeys(h for h in homes if h):
        for name in (f"{platform.machine()}-linux/ascend_toolkit_install.info", "ascend_toolkit_install.info"):
            if (version := parse_version_file(_read(Path(home) / name) or "").get("version")) is not None:
                return version
    return None


def describe(
    environ: Mapping[str, str] = os.environ,
    *,
    npu_smi: Callable[[list[str]], str | None] | None = None,
    root: Path = ROOT,
) -> dict[str, str]:
    """Everything above for this actor: npu-smi's view of its cards, the driver, firmware and CANN
    versions, and the whitelisted environment. `npu_smi(args)` returns npu-smi's output, or None
    where the node has no npu-smi (a test passes the fixtures)."""
    run = npu_smi or _npu_smi
    visible = environ.get("ASCEND_RT_VISIBLE_DEVICES")
    out: dict[str, str] = {}
    info: dict[str, Any] = {"version": None, "chips": []}
    chip_map: dict[int, dict[str, Any]] = {}
    board: dict[str, str] = {}
    try:
        if (text := run(["info"])) is None:
            out["npu_error"] = "npu-smi not found"
        else:
            info, chip_map = parse_info(text), parse_chip_map(run(["info", "-m"]) or "")
            # Driver and firmware are per card: ask the first card this actor sees.
            cards = sorted(npu for npu, _ in _visible_chips(chip_map, visible, info)) or [0]
            board = parse_fields(run(["info", "-t", "board", "-i", str(cards[0])]) or "")
    except (OSError, subprocess.SubprocessError) as e:
        out["npu_error"] = f"npu-smi: {type(e).__name__}: {e}"[:500]
    driver = parse_version_file(_read(root / "driver" / "version.info") or "")
    firmware = parse_version_file(_read(root / "firmware" / "version.info") or "")
    out |= summarize(info, chip_map, board, driver=driver, firmware=firmware, visible=visible)
    if (cann := cann_version(environ, root=root)) is not None:
        out["cann"] = cann
    return out | ascend_env(environ)


def _npu_smi(args: list[str]) -> str | None:
    if (exe := shutil.which("npu-smi")) is None:
        return None
    done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None
