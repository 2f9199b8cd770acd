"""The agent's course: register, wait for the gang, run the job, heartbeat, report its exit —
and on a calendar block's VMs, register again for each job into the block.

The agent function's protocol (all POST, JSON, ``Authorization: Bearer``): ``/v1/register``
with the VM's identity token, then with the session it returns ``/v1/barrier``,
``/v1/heartbeat``, ``/v1/logs`` and ``/v1/exit``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from opendws.agent import transport
from opendws.agent.backoff import Backoff
from opendws.agent.install import Cancelled, Install, InstallFailed, ensure
from opendws.agent.job import GPU, TPU, Job
from opendws.agent.logs import Line, LogShipper
from opendws.agent.transport import Refused, Unreachable

REASK_S = 60.0  # a VM without a run (or refused) asks again this often
DEFAULT_GRACE_S = 10.0  # until a heartbeat says otherwise
HEARTBEAT_TIMEOUT_S = 5.0
SHUTDOWN_REPORT_S = 10.0  # how long a stopping agent keeps trying to report the exit
LOG_FLUSH_S = 10.0
GONE = 410  # the run is over
# What is needed for the command could not be installed: the command cannot run, which a shell
# says with 126 (found but not runnable).
INSTALL_FAILED = 126
STOPPED_WHILE_INSTALLING = 128 + int(signal.SIGTERM)  # as a shell says a job stopped by SIGTERM


def log(message: str) -> None:
    sys.stderr.write("opendws-agent: " + message + "\n")
    sys.stderr.flush()


@dataclass(frozen=True)
class Session:
    token: str
    request_id: str
    rank: int
    num_nodes: int
    heartbeat_s: float
    # The calendar block whose VM this is, when the block keeps its VMs for jobs into it:
    # after this run the agent registers again for the next one.
    block: str | None = None

    @classmethod
    def parse(cls, reply: Mapping[str, Any]) -> Session:
        block = reply.get("block")
        try:
            session = cls(
                token=str(reply["session"]),
                request_id=str(reply.get("request_id", "")),
                rank=int(reply["rank"]),
                num_nodes=int(reply["num_nodes"]),
                heartbeat_s=float(reply["heartbeat_s"]),
                block=block if isinstance(block, str) and block else None,
            )
        except (KeyError, TypeError, ValueError) as error:
            raise Unreachable(f"malformed registration reply: {error!r}") from None
        if session.heartbeat_s <= 0:
            raise Unreachable("malformed registration reply: heartbeat_s must be positive")
        return session


@dataclass(frozen=True)
class Start:
    command: tuple[str, ...]
    image: str | None
    env: Mapping[str, str]
    install: Install | None = None
    devices: str = GPU  # the VM's accelerators, as a container gets them (job.docker_argv)

    @classmethod
    def parse(cls, reply: Mapping[str, Any]) -> Start:
        command = reply.get("command")
        image = reply.get("image")
        env = reply.get("env") or {}
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(arg, str) for arg in command)
            or not (image is None or isinstance(image, str))
            or not isinstance(env, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        ):
            raise Unreachable("malformed barrier reply: command, image or env")
        install = None
        if reply.get("install") is not None:
            try:
                install = Install.parse(reply["install"])
            except ValueError as error:
                raise Unreachable(f"malformed barrier reply: {error}") from None
        job_env = dict(env)
        hostfile = reply.get("hostfile")
        if isinstance(hostfile, str) and hostfile:
            job_env["OPENDWS_HOSTFILE"] = write_hostfile(hostfile)
        devices = reply.get("devices", GPU)
        if devices not in (GPU, TPU):
            raise Unreachable(f"malformed barrier reply: devices {devices!r}")
        return cls(tuple(command), image or None, job_env, install, devices)


def write_hostfile(content: str) -> str:
    """Write the gang's hostfile (``ip slots=n`` per rank) where the job can read it; its
    path (``OPENDWS_HOSTFILE``)."""
    folder = tempfile.mkdtemp(prefix="opendws-")
    path = os.path.join(folder, "hostfile")
    with open(path, "w", encoding="utf-8") as file:
        file.write(content)
    return path


class Agent:
    def __init__(self, agent_url: str, stopping: threading.Event, wake: threading.Event) -> None:
        self.agent_url = agent_url
        self.base = agent_url.rstrip("/")
        self.stopping = stopping  # SIGTERM or SIGINT: stop the job, report, leave
        self.wake = wake  # set by anything the main loop must look at
        self.grace_s = DEFAULT_GRACE_S

    # -- calls ------------------------------------------------------------------------------

    def call(self, path: str, body: Mapping[str, Any], bearer: str, **kw: Any) -> dict[str, Any]:
        return transport.post(self.base + path, body, bearer, **kw)

    def pause(self, seconds: float) -> None:
        """Sleep, waking early when the agent is told to stop."""
        self.stopping.wait(max(0.0, seconds))

    # -- the course -------------------------------------------------------------------------

    def run(self) -> int:
        """This VM's runs: one — or, on a calendar block that keeps its VMs for jobs into it
        (the registration names the block), the block's own run and then each job into the
        block, registering again once each is over. The agent's own exit code."""
        while True:
            session = self.register()
            if session is None:
                return 0
            code = self.course(session)
            if session.block is None or self.stopping.is_set():
                return code
            log(f"the run of {session.request_id} is over; registering again for the next "
                f"job into block {session.block}")  # fmt: skip

    def course(self, session: Session) -> int:
        """One run: the gang's barrier, the job, its exit reported, lingering until the run
        is over."""
        log(f"registered: request {session.request_id}, rank {session.rank} of "
            f"{session.num_nodes}")  # fmt: skip
        start = self.barrier(session)
        if start is None:
            return 0
        shipper = LogShipper(lambda lines: self.send_logs(session, lines))
        if start.install is not None:
            failed = self.install(session, start.install, shipper.add)
            if failed is not None:
                shipper.start()
                shipper.close(LOG_FLUSH_S)
                return self.finish(session, *failed)
        where = f" in {start.image}" if start.image else ""
        log(f"the gang is up: running {list(start.command)!r}{where}")
        job = Job.start(
            start.command, start.image, start.env, shipper.add, self.wake.set, start.devices
        )
        shipper.start()
        try:
            stopped = self.supervise(session, job)
        finally:
            if not job.exited.is_set():
                job.kill()
        shipper.close(LOG_FLUSH_S)
        log(f"the job exited with {job.code}" + (" (stopped)" if stopped else ""))
        return self.finish(session, job.code, stopped)

    def finish(self, session: Session, code: int, stopped: bool) -> int:
        """Report the exit, then linger until the run is over; the agent's own exit code."""
        if not self.report_exit(session, code, stopped):
            return 1
        self.linger(session)
        return 0

    def register(self) -> Session | None:
        """Exchange the identity token for a session; None when told to stop first."""
        backoff = Backoff()
        said = ""
        while not self.stopping.is_set():
            try:
                token = transport.identity_token(self.agent_url)
                tpu = transport.tpu_claim()
                body = {} if tpu is None else {"tpu": tpu}
                reply = self.call("/v1/register", body, token)
                if reply.get("wait") is True:
                    # A calendar block's VM with no run on it now: the next job into the
                    # block comes later.
                    backoff.reset()
                    if reply.get("error") != said:
                        said = str(reply.get("error"))
                        log(f"{said}; waiting for the next job")
                    retry_after = reply.get("retry_after_s", REASK_S)
                    if not isinstance(retry_after, (int, float)):
                        retry_after = REASK_S
                    self.pause(min(max(float(retry_after), 0.05), REASK_S))
                    continue
                return Session.parse(reply)
            except Unreachable as error:
                log(f"registering: {error}; trying again")
                self.pause(backoff.next_delay())
            except Refused as refused:
                backoff.reset()
                if refused.status == 404:
                    log(f"no run for this VM's order (capacity only); asking again in "
                        f"{REASK_S:.0f} s")  # fmt: skip
                else:
                    log(f"registration refused ({refused}); asking again in {REASK_S:.0f} s")
                self.pause(REASK_S)
        return None

    def barrier(self, session: Session) -> Start | None:
        """Wait until every rank has registered; None when the run is over or the agent is
        told to stop first."""
        backoff = Backoff()
        next_beat = time.monotonic() + session.heartbeat_s
        while not self.stopping.is_set():
            try:
                reply = self.call("/v1/barrier", {}, session.token)
            except Unreachable as error:
                log(f"waiting for the gang: {error}; trying again")
                self.pause(backoff.next_delay())
                continue
            except Refused as refused:
                log(f"the run is over ({refused})" if refused.status == GONE
                    else f"barrier refused ({refused}); leaving")  # fmt: skip
                return None
            backoff.reset()
            if reply.get("ready") is True:
                try:
                    return Start.parse(reply)
                except Unreachable as error:
                    log(f"{error}; asking again")
                    self.pause(backoff.next_delay())
                    continue
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + session.heartbeat_s
                if self.heartbeat(session, "waiting") is not None:
                    return None
            retry_after = reply.get("retry_after_s", 1.0)
            if not isinstance(retry_after, (int, float)):
                retry_after = 1.0
            self.pause(min(max(float(retry_after), 0.05), 30.0))
        return None

    def install(
        self, session: Session, install: Install, on_line: Callable[[str, str], None]
    ) -> tuple[int, bool] | None:
        """Install what the command needs (:mod:`opendws.agent.install`) on a thread of its
        own, heartbeating meanwhile as the job does; None once installed, else the exit to
        report (code, stopped): :data:`INSTALL_FAILED` with a line saying what failed, or
        stopped when told to stop first."""
        cancelled = threading.Event()
        outcome: list[BaseException | None] = []

        def say(text: str) -> None:
            on_line("stderr", "[opendws agent] " + text)

        def work() -> None:
            try:
                ensure(install, say, cancelled)
                outcome.append(None)
            except BaseException as error:  # whatever it is, the main thread reports it
                outcome.append(error)
            finally:
                self.wake.set()

        worker = threading.Thread(target=work, name="opendws-install", daemon=True)
        worker.start()
        next_beat = time.monotonic()
        while not outcome:
            self.wake.clear()
            if outcome:
                break
            reason = "the agent is stopping" if self.stopping.is_set() else None
            if reason is None and time.monotonic() >= next_beat:
                next_beat = time.monotonic() + session.heartbeat_s
                reason = self.heartbeat(session, "running")
            if reason is not None:
                log(f"stopping the install: {reason}")
                cancelled.set()
                return STOPPED_WHILE_INSTALLING, True
            self.wake.wait(max(0.0, next_beat - time.monotonic()))
        worker.join()  # the job starts with no other thread running (Job.start)
        error = outcome[0]
        if error is None:
            return None
        if isinstance(error, Cancelled):
            return STOPPED_WHILE_INSTALLING, True
        if not isinstance(error, InstallFailed):
            error = InstallFailed(f"install: {error!r}")
        say(f"cannot install {install.url} in {install.dir}: {error}")
        log(f"install failed: {error}")
        return INSTALL_FAILED, False

    def heartbeat(self, session: Session, state: str) -> str | None:
        """One heartbeat; the reason to stop when the function says so, else None."""
        try:
            reply = self.call(
                "/v1/heartbeat", {"state": state}, session.token, timeout_s=HEARTBEAT_TIMEOUT_S
            )
        except Unreachable as error:
            log(f"heartbeat: {error}")
            return None
        except Refused as refused:
            if refused.status == GONE:
                return "the run is over"
            log(f"heartbeat refused ({refused})")
            return None
        grace = reply.get("grace_s")
        if isinstance(grace, (int, float)) and grace >= 0:
            self.grace_s = float(grace)
        return "told to stop" if reply.get("stop") is True else None

    def supervise(self, session: Session, job: Job) -> bool:
        """Heartbeat until the job exits; stop it when told to or when the agent is stopped.
        Returns whether the job was stopped."""
        next_beat = time.monotonic()
        while True:
            self.wake.clear()
            if job.exited.is_set():
                return False
            if self.stopping.is_set():
                log(f"stopping the job (grace {self.grace_s:g} s): the agent is stopping")
                return job.terminate(self.grace_s)
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + session.heartbeat_s
                reason = self.heartbeat(session, "running")
                if reason is not None:
                    log(f"stopping the job (grace {self.grace_s:g} s): {reason}")
                    return job.terminate(self.grace_s)
                continue
            self.wake.wait(max(0.0, next_beat - time.monotonic()))

    def report_exit(self, session: Session, code: int, stopped: bool) -> bool:
        """Report the exit until acknowledged: forever, or for a while once the agent is
        being stopped. Returns whether it was acknowledged."""
        backoff = Backoff()
        deadline: float | None = None
        while True:
            try:
                self.call("/v1/exit", {"code": code, "stopped": stopped}, session.token)
                return True
            except Refused as refused:
                if refused.status == GONE:
                    return True  # the run is over: nothing waits for this report
                log(f"exit report refused ({refused})")
                return False
            except Unreachable as error:
                log(f"reporting the exit: {error}; trying again")
            if self.stopping.is_set():
                deadline = deadline or time.monotonic() + SHUTDOWN_REPORT_S
                if time.monotonic() >= deadline:
                    log("the exit could not be reported before the agent stopped")
                    return False
                time.sleep(min(backoff.next_delay(), max(0.0, deadline - time.monotonic())))
            else:
                self.pause(backoff.next_delay())

    def linger(self, session: Session) -> None:
        """Heartbeat as ``exited`` (so the function knows this VM is there) until the run is
        over, the function says stop, or the agent is stopped."""
        while not self.stopping.is_set():
            if self.heartbeat(session, "exited") is not None:
                return
            self.pause(session.heartbeat_s)

    def send_logs(self, session: Session, lines: Sequence[Line]) -> None:
        self.call("/v1/logs", {"lines": list(lines)}, session.token)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m opendws.agent", description="Run a gang's job on this VM."
    )
    parser.add_argument(
        "--agent-url",
        help="the agent function's URL (default: the instance attribute "
        f"{transport.AGENT_URL_ATTRIBUTE} in the metadata server)",
    )
    args = parser.parse_args(argv)
    stopping = threading.Event()
    wake = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()
        wake.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent_url = args.agent_url
    backoff = Backoff()
    while agent_url is None:
        try:
            agent_url = transport.agent_url_attribute()
        except Refused as refused:
            log(f"no agent function URL: the instance attribute "
                f"{transport.AGENT_URL_ATTRIBUTE} is not set ({refused})")  # fmt: skip
            return 2
        except Unreachable as error:
            log(f"metadata server: {error}; trying again")
            stopping.wait(backoff.next_delay())
            if stopping.is_set():
                return 0
    return Agent(agent_url, stopping, wake).run()
