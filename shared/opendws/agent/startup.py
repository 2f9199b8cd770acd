"""The ``startup-script`` metadata value that carries the agent to a VM and starts it.

The agent's modules travel zipped (a zip with a ``__main__.py``, which ``python3`` runs as it
is: docs.python.org/3/library/zipapp.html) and base64-encoded in the script itself, so a VM
needs nothing but the image's ``python3`` and no network path to fetch the agent. The script
is a few tens of KiB: Compute Engine takes a metadata value of at most 256 KiB and all of an
instance's keys and values together under 512 KB (compute/docs/reference/rest/v1/Metadata,
``items[].value`` and ``items[]``; compute/docs/metadata/setting-custom-metadata,
"Limitations"), which the tests hold it to with a wide margin.

The agent runs as the transient systemd service ``opendws-agent``, its output on the serial
console and in the journal (where there is no systemd: under ``nohup``, its output in
``/opt/opendws/agent.log``). Stopping the service sends
SIGTERM to the agent alone (``KillMode=mixed``), which stops the job within its grace period.
"""

from __future__ import annotations

import base64
import io
import shlex
import textwrap
import zipfile
from pathlib import Path

from opendws.agent import MINIMUM_PYTHON

AGENT_DIR = "/opt/opendws"
UNIT = "opendws-agent"
METADATA_VALUE_LIMIT = 256 * 1024  # bytes, compute/docs/reference/rest/v1/Metadata
STOP_TIMEOUT_S = 45  # the job's grace period and the exit report fit in it

_PACKAGE = Path(__file__).resolve().parent
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed, so that the same sources give the same bundle
_MAIN = "from opendws.agent.run import main\n\nraise SystemExit(main())\n"
_ROOT_INIT = '"""opendws, as much of it as a VM carries: the agent."""\n'


def bundle() -> bytes:
    """The agent as a zip ``python3`` runs: its modules, under a bare ``opendws`` package."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        files = [("__main__.py", _MAIN), ("opendws/__init__.py", _ROOT_INIT)]
        for path in sorted(_PACKAGE.glob("*.py")):
            files.append(("opendws/agent/" + path.name, path.read_text(encoding="utf-8")))
        for name, text in files:
            info = zipfile.ZipInfo(name, _EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, text.encode("utf-8"))
    return out.getvalue()


def startup_script(agent_url: str, directory: str = AGENT_DIR) -> str:
    """A bash script that writes the agent to ``directory``/agent.pyz and starts it with the
    image's ``python3``, for the agent function at ``agent_url``."""
    if not agent_url.startswith(("https://", "http://")) or any(c.isspace() for c in agent_url):
        raise ValueError(f"agent_url must be an http(s) URL without spaces, not {agent_url!r}")
    payload = "\n".join(textwrap.wrap(base64.b64encode(bundle()).decode("ascii"), 76))
    target = shlex.quote(directory.rstrip("/") + "/agent.pyz")
    command = f'"$python" {target} --agent-url {shlex.quote(agent_url)}'
    log = shlex.quote(directory.rstrip("/") + "/agent.log")
    minimum = ".".join(map(str, MINIMUM_PYTHON))
    too_old = repr(MINIMUM_PYTHON)
    return f"""#!/bin/bash
# opendws: writes the agent (a zip of Python modules, standard library only) and starts it.
set -euo pipefail
python=$(command -v python3 || true)
if [ -z "$python" ] || ! "$python" -c "import sys; sys.exit(sys.version_info < {too_old})"; then
    echo "opendws: the agent needs python3 {minimum} or later on the image" >&2
    exit 1
fi
mkdir -p {shlex.quote(directory)}
base64 -d > {target}.new <<'OPENDWS_AGENT'
{payload}
OPENDWS_AGENT
mv -f {target}.new {target}
if command -v systemd-run >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    if systemctl is-active --quiet {UNIT}.service; then
        echo "opendws: the agent is already running"
        exit 0
    fi
    systemctl reset-failed {UNIT}.service >/dev/null 2>&1 || true
    systemd-run --unit={UNIT} --collect \\
        --property=KillMode=mixed --property=TimeoutStopSec={STOP_TIMEOUT_S} \\
        --property=StandardOutput=journal+console --property=StandardError=journal+console \\
        {command}
else
    nohup {command} >>{log} 2>&1 &
fi
echo "opendws: the agent is started"
"""
