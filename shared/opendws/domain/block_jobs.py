"""Jobs into a calendar block, as a pure rule: when a request naming a block (``block``) runs
on the block's VMs, and how it ends when the block does.

Google bills an approved block in full, and by default a block whose own job ended keeps its
VMs until its end (``run.release_on_end`` false): another job may run on them. Such a job holds
no capacity of its own — the block holds it — so it never enters admission and no provider
call is ever made for it. One run at a time runs on a block: the block's own first, then each
job in submission order. :func:`block_jobs` steps every job of one block at once:

- a job waits (PENDING) while the block is not ACTIVE with its VMs up, while a run is on them,
  or while a job submitted before it waits too; its reason says what it waits for, once;
- the first in line starts (PENDING → ACTIVE) with the block's hosts; its run ends through the
  agents (RELEASED, JOB_SUCCEEDED or JOB_FAILED) and leaves the block's VMs alone;
- the block ended (any final state): a waiting job is REJECTED, a running one ends with it
  (EXPIRED when the block ran out its window, else RELEASED), reason BLOCK_ENDED.

No I/O, no clock: the reconciler gathers the views and carries the steps out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from opendws.domain.states import RequestState

S = RequestState


class BlockJobReason(StrEnum):
    """Why a job into a block moved or was revised."""

    WAITING_FOR_BLOCK = "WAITING_FOR_BLOCK"  # the block is not free for it yet
    ON_BLOCK = "ON_BLOCK"  # it runs on the block's VMs
    BLOCK_ENDED = "BLOCK_ENDED"  # the block ended before or while it ran


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockView:
    """What the rule reads of a block: its state and, while ACTIVE, whether its own run is
    still on its VMs (False: it has none, or it ended and the VMs are kept)."""

    request_id: str
    state: RequestState
    own_run: bool = False
    units: int = 0
    pool: str | None = None
    message: str = ""  # its last message (how it ended, once final)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobView:
    """A job into the block: its state (PENDING or ACTIVE) and what its record says now."""

    request_id: str
    state: RequestState
    reason: str | None = None
    message: str = ""


@dataclass(frozen=True, slots=True)
class JobStep:
    """One job's write: its target state (None: a revision in its state) and why."""

    request_id: str
    target: RequestState | None
    reason: BlockJobReason
    message: str

    @property
    def starts(self) -> bool:
        return self.target is S.ACTIVE


def block_jobs(block: BlockView, jobs: Sequence[JobView]) -> list[JobStep]:
    """The writes the jobs of ``block`` need now, ``jobs`` in submission order (the first
    waiting one is next). A job with nothing new gets no step."""
    if block.state.is_final:
        return [_ended(block, job) for job in jobs]
    steps: list[JobStep] = []
    running = next((job.request_id for job in jobs if job.state is S.ACTIVE), None)
    if running is None and block.own_run:
        running = block.request_id
    waiting = 0  # jobs in line before this one
    for job in jobs:
        if job.state is not S.PENDING:
            continue
        if block.state is S.ACTIVE and running is None:
            running = job.request_id
            steps.append(
                JobStep(
                    job.request_id, S.ACTIVE, BlockJobReason.ON_BLOCK,
                    f"running on the {block.units} VMs of block {block.request_id!r}"
                    + (f" in {block.pool}" if block.pool else "")
                    + " (its capacity is the block's: nothing more is billed)",
                )
            )  # fmt: skip
            continue
        said = _why_waiting(block, running, waiting)
        waiting += 1
        if (job.reason, job.message) != (BlockJobReason.WAITING_FOR_BLOCK.value, said):
            steps.append(JobStep(job.request_id, None, BlockJobReason.WAITING_FOR_BLOCK, said))
    return steps


def _why_waiting(block: BlockView, running: str | None, ahead: int) -> str:
    name = repr(block.request_id)
    line = "" if not ahead else f"; {ahead} job{'s' if ahead > 1 else ''} of it before this one"
    if block.state is not S.ACTIVE:
        return (
            f"waiting for block {name} to run with its VMs up (it is {block.state}); "
            f"jobs run on them one at a time, in submission order{line}"
        )
    if running == block.request_id:
        return f"waiting for the block's own job to end on the VMs of block {name}{line}"
    return f"waiting for job {running!r} to end on the VMs of block {name} (one at a time){line}"


def _ended(block: BlockView, job: JobView) -> JobStep:
    """A job whose block ended (``block.state`` is final)."""
    how = f"block {block.request_id!r} ended ({block.state}" + (
        f": {block.message})" if block.message else ")"
    )
    if job.state is S.ACTIVE:
        target = S.EXPIRED if block.state is S.EXPIRED else S.RELEASED
        return JobStep(
            job.request_id, target, BlockJobReason.BLOCK_ENDED,
            f"{how} while the job ran on its VMs; the job ends with it",
        )  # fmt: skip
    return JobStep(
        job.request_id, S.REJECTED, BlockJobReason.BLOCK_ENDED,
        f"{how} before the job could run on its VMs",
    )  # fmt: skip
