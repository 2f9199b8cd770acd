"""The ``startup-script`` metadata value that carries the agent to a VM
(``opendws.agent.startup``): within Compute Engine's metadata limits, and it writes the agent
and starts it with the image's ``python3``."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

from opendws.agent.startup import METADATA_VALUE_LIMIT, bundle, startup_script

URL = "https://opendws-agent-abc123-uc.a.run.app"


def payload(script: str) -> bytes:
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("<<'OPENDWS_AGENT'"))
    end = lines.index("OPENDWS_AGENT", start + 1)
    return base64.b64decode("".join(lines[start + 1 : end]))


def test_the_script_stays_well_under_the_metadata_value_limit() -> None:
    """A metadata value is at most 262144 bytes (256 KiB), and all of an instance's keys and
    values together must be under 512 KB (cloud.google.com/compute/docs/reference/rest/v1/
    Metadata, ``items[].value`` and ``items[]``; compute/docs/metadata/setting-custom-metadata,
    "Limitations"). The script takes at most a quarter of one value, leaving the template's
    other items room."""
    assert METADATA_VALUE_LIMIT == 262_144
    size = len(startup_script(URL).encode("utf-8"))
    assert size <= METADATA_VALUE_LIMIT // 4, size


def test_the_script_carries_the_bundle_byte_for_byte_and_the_same_sources_give_the_same_script(
) -> None:  # fmt: skip
    script = startup_script(URL)
    assert payload(script) == bundle()
    assert startup_script(URL) == script
    names = zipfile.ZipFile(BytesIO(bundle())).namelist()
    assert "__main__.py" in names
    assert "opendws/__init__.py" in names
    agent = Path(__file__).resolve().parents[2] / "shared" / "opendws" / "agent"
    assert {f"opendws/agent/{p.name}" for p in agent.glob("*.py")} <= set(names)
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0


def test_the_bundle_runs_on_its_own_without_opendws_installed(tmp_path: Path) -> None:
    """Isolated mode (-I: no site-packages, no current directory, no PYTHONPATH), so only the
    zip and the standard library are there to import from."""
    target = tmp_path / "agent.pyz"
    target.write_bytes(bundle())
    check = subprocess.run(
        [sys.executable, "-I", str(target), "--help"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert "--agent-url" in check.stdout


@pytest.mark.parametrize("systemd", [True, False], ids=["systemd", "no systemd"])
def test_the_script_writes_the_agent_and_starts_it_with_python3(
    tmp_path: Path, systemd: bool
) -> None:
    """Run for real with stand-ins for python3, systemd-run, systemctl and nohup that record
    how they were called. Whether this machine booted systemd (sd_booted(3): the directory
    /run/systemd/system) is forced either way."""
    directory = tmp_path / "opt"
    record = tmp_path / "calls.jsonl"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    recorder = f"""#!{sys.executable}
import json, os, sys
with open({str(record)!r}, "a") as out:
    out.write(json.dumps(sys.argv) + "\\n")
if os.path.basename(sys.argv[0]) == "python3" and sys.argv[1] == "-c":
    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])
if os.path.basename(sys.argv[0]) == "systemctl":
    sys.exit(3)  # is-active: not running
"""
    for name in ("python3", "systemd-run", "systemctl", "nohup"):
        (bin_dir / name).write_text(recorder)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    booted = "[ -d /run/systemd/system ]"
    script = startup_script(URL, directory=str(directory))
    assert script.count(booted) == 1
    script = script.replace(booted, "true" if systemd else "false")
    run = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert (directory / "agent.pyz").read_bytes() == bundle()
    launch = [str(bin_dir / "python3"), str(directory / "agent.pyz"), "--agent-url", URL]

    def launchers() -> list[list[str]]:
        calls = [json.loads(line) for line in record.read_text().splitlines()]
        return [call for call in calls if Path(call[0]).name in ("systemd-run", "nohup")]

    deadline = time.monotonic() + 5  # nohup starts in the background
    while not launchers() and time.monotonic() < deadline:
        time.sleep(0.02)
    [launcher] = launchers()
    assert launcher[-len(launch) :] == launch
    assert Path(launcher[0]).name == ("systemd-run" if systemd else "nohup")
    if systemd:
        assert {"--unit=opendws-agent", "--property=KillMode=mixed",
                "--property=StandardOutput=journal+console"} <= set(launcher)  # fmt: skip


@pytest.mark.parametrize("url", ["", "ftp://x", "https://x y", "agent.run.app"])
def test_an_agent_url_that_is_not_an_http_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="agent_url must be an http"):
        startup_script(url)
