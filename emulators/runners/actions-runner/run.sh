#!/usr/bin/env python3
"""A stand-in for the GitHub Actions runner's ``run.sh`` started with a just-in-time config:
takes at most one job from the fake GitHub (emulators/github.py), runs its script, exits.

    run.sh --jitconfig ENCODED_JIT_CONFIG
    ACTIONS_RUNNER_INPUT_JITCONFIG=ENCODED_JIT_CONFIG run.sh

As actions/runner does:

- Any flag may come from the environment as ``ACTIONS_RUNNER_INPUT_<NAME>`` (the name
  case-insensitive; the flag on the command line wins), and those variables are removed
  before a job runs (src/Runner.Listener/CommandSettings.cs, ``envPrefix``, ``GetArg``).
- Run as root without ``RUNNER_ALLOW_RUNASROOT`` it refuses: "Must not run interactively
  with sudo" (src/Misc/layoutroot/run-helper.sh.template).
- The config is base64 of a JSON object of the runner's files, each base64
  (src/Runner.Listener/Runner.cs); ``.runner``'s ``serverUrl`` names the server. One that
  does not decode is an error on stderr.
- It starts a session (here ``POST /_admin/runner/take``): a runner that no longer exists →
  "The runner no longer exists on the server. Please reconfigure the runner."; a config
  already in use → "A session for this runner already exists."
  (src/Runner.Listener/MessageListener.cs).
- Then "Listening for Jobs", and it asks for a job again every second (``POST
  /_admin/runner/poll``; the listener long-polls) until it gets one or is killed. If its
  runner is deleted meanwhile: "The runner no longer exists on the server. Cleaning up local
  configuration." and it ends (Runner.cs: the listener returns ``ReturnCode.Success``).
- With a job: "Running job: NAME", the job's script in one ``sh -e``, its output on this
  program's stdout, then the job is completed ``success`` or ``failure`` and "Job NAME
  completed with result: Succeeded|Failed". An ephemeral runner then ends: the listener
  returns ``ReturnCode.Success`` after its one job, whatever the job's result (Runner.cs,
  ``runOnceJobCompleted``; only hosted runners with
  ``ACTIONS_RUNNER_RETURN_JOB_RESULT_FOR_HOSTED`` return the job's result).
- Exit status: ``run.sh`` exits 0 in every case above. The listener's own return code is 0
  (success, a deleted runner) or 1 (``TerminatedError``: a config that does not decode, a
  runner that no longer exists, no config) or 5 (``SessionConflict``), but
  run-helper.sh maps 0, 1 and 5 to exit 0 ("Runner listener exit with terminated error,
  stop the service, no retry needed.") and run.sh exits 0 for all but 2 (restart) and,
  when ``ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE=1``, 7. So a non-zero exit of
  the real run.sh means it was killed (or an outdated runner with that variable set); how a
  job ended is GitHub's to tell (the ``completed`` webhook's ``conclusion``).

Differences: no runner files written, no OAuth, no real runner protocol (the fake's admin
API instead), no actions, containers, services, log upload or self-update; a job is one
shell script; the script runs in a fresh temporary workspace (``GITHUB_WORKSPACE``); a
server that does not answer is tried 10 times, a second apart, then the same exit as a
failed session (the real listener keeps retrying).
"""

import argparse
import base64
import binascii
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ENV_PREFIX = "ACTIONS_RUNNER_INPUT_"
POLL_INTERVAL = 1.0
CONNECT_TRIES = 10
VERSION = "2.330.0-stand-in"


class RunnerGone(Exception):
    """The runner no longer exists on the server."""


class SessionConflict(Exception):
    """The runner's config is already in use."""


def say(line):
    print(line, flush=True)


def error(line):
    print(line, file=sys.stderr, flush=True)


def now():
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def environment_inputs():
    """The ACTIONS_RUNNER_INPUT_<NAME> variables by lower-case NAME, removed from the
    environment (the job does not see them)."""
    inputs = {}
    for key in list(os.environ):
        if key.upper().startswith(ENV_PREFIX):
            value = os.environ.pop(key).strip()
            if value:
                inputs[key[len(ENV_PREFIX) :].lower()] = value
    return inputs


def exit_run_sh(listener_code):
    """run-helper.sh's and run.sh's words and exit for the listener's return code."""
    if listener_code == 0:
        say("Runner listener exit with 0 return code, stop the service, no retry needed.")
    elif listener_code == 5:
        say("Runner listener exit with Session Conflict error, stop the service, no retry needed.")
    else:
        say("Runner listener exit with terminated error, stop the service, no retry needed.")
    say("Exiting runner...")
    sys.exit(0)


def call(method, url, body=None):
    """(status, parsed JSON or None); a server that does not answer is tried again."""
    data = None if body is None else json.dumps(body).encode()
    for attempt in range(CONNECT_TRIES):
        request = urllib.request.Request(
            url, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                status, text = reply.status, reply.read()
        except urllib.error.HTTPError as refused:
            status, text = refused.code, refused.read()
        except (OSError, ValueError) as failed:
            if attempt + 1 == CONNECT_TRIES:
                raise ConnectionError(f"{url}: {failed}") from None
            time.sleep(1)
            continue
        try:
            return status, json.loads(text) if text.strip() else None
        except ValueError:
            return status, None
    raise ConnectionError(url)


def decode(config):
    """The runner's files from an encoded JIT config (as Runner.Listener decodes it)."""
    files = json.loads(base64.b64decode(config, validate=True).decode())
    decoded = {name: json.loads(base64.b64decode(content)) for name, content in files.items()}
    if not isinstance(decoded.get(".runner"), dict) or not decoded[".runner"].get("serverUrl"):
        raise ValueError("Runner is not configured: the JIT config has no .runner settings")
    return decoded


def session(server, config, path):
    """Start the session (or poll it): {runner, job}."""
    status, answer = call("POST", f"{server}/_admin/{path}", {"jit_config": config})
    if status == 404:
        raise RunnerGone()
    if status == 409:
        raise SessionConflict()
    if status != 200 or not isinstance(answer, dict):
        raise ConnectionError(f"the server answered {status}")
    return answer


def run_job(server, runner, job):
    """Run the job's script; complete the job; its conclusion."""
    say(f"{now()}: Running job: {job['name']}")
    workspace = tempfile.mkdtemp(prefix="actions-runner-work-")
    environment = dict(os.environ)
    environment.update({
        "CI": "true", "GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": workspace,
        "GITHUB_REPOSITORY": job["repository"], "GITHUB_RUN_ID": str(job["run_id"]),
        "GITHUB_JOB": job["name"], "RUNNER_NAME": runner["name"],
    })  # fmt: skip
    code = subprocess.run(
        ["sh", "-e", "-c", job.get("script") or "true"], cwd=workspace, env=environment,
        check=False,
    ).returncode  # fmt: skip
    conclusion = "success" if code == 0 else "failure"
    status, _ = call("POST", f"{server}/_admin/jobs/{job['id']}/complete",
                     {"conclusion": conclusion})  # fmt: skip
    if status != 200:
        error(f"Failed to complete job {job['id']}: the server answered {status}")
    result = "Succeeded" if code == 0 else "Failed"
    say(f"{now()}: Job {job['name']} completed with result: {result}")
    return conclusion


def main(argv):
    if os.geteuid() == 0 and not os.environ.get("RUNNER_ALLOW_RUNASROOT"):
        say("Must not run interactively with sudo")
        say("Exiting runner...")
        return 0
    inputs = environment_inputs()
    parser = argparse.ArgumentParser(prog="run.sh", add_help=False)
    parser.add_argument("--jitconfig", default=inputs.get("jitconfig", ""))
    options, unknown = parser.parse_known_args(argv)
    if unknown:
        error(f"Unrecognized command-line input arguments for command run: "
              f"'{', '.join(a.lstrip('-') for a in unknown)}'. For usage refer to: "
              ".\\config.cmd --help or ./config.sh --help")  # fmt: skip
    if not options.jitconfig:
        error("An error occurred: Not configured. Run config.(sh/cmd) to configure the runner.")
        exit_run_sh(1)
    try:
        files = decode(options.jitconfig)
    except (ValueError, binascii.Error, UnicodeDecodeError, AttributeError) as bad:
        error(f"The JIT config could not be read: {bad}")
        exit_run_sh(1)
    settings = files[".runner"]
    server = str(settings["serverUrl"]).rstrip("/")
    listening = False
    try:
        taken = session(server, options.jitconfig, "runner/take")
        listening = True
        say("√ Connected to GitHub")
        say(f"Current runner version: '{VERSION}'")
        say(f"{now()}: Listening for Jobs")
        while taken["job"] is None:
            time.sleep(POLL_INTERVAL)
            taken = session(server, options.jitconfig, "runner/poll")
    except SessionConflict:
        error("A session for this runner already exists.")
        exit_run_sh(5)
    except RunnerGone:
        if listening:
            error("The runner no longer exists on the server. Cleaning up local configuration.")
            exit_run_sh(0)
        error("The runner no longer exists on the server. Please reconfigure the runner.")
        exit_run_sh(1)
    except ConnectionError as failed:
        error(f"Failed to create a session: {failed}")
        exit_run_sh(1)
    run_job(server, taken["runner"], taken["job"])
    exit_run_sh(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
