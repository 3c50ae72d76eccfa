"""Operating a running job from outside: ``statehold savepoint JOB NAME`` and
``statehold stop JOB`` write a request document the job's driver serves after its
current batch, or while it waits for input (`statehold.checkpoint.requests`)."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from pydantic import BaseModel

from statehold.checkpoint import requests
from statehold.cli.common import HaOption, JobArg, JsonOption, emit, fail, handle_errors
from statehold.cli.output import say
from statehold.format.requests import Action, Outcome, RequestAnswer, answer_key
from statehold.job.directory import JobDirectory, open_job
from statehold.job.locate import Target, split_location
from statehold.tools.locations import JobLocation

DEFAULT_TIMEOUT = 300.0

WaitOption = Annotated[
    bool,
    typer.Option("--wait", help="A running job only: wait for the driver's answer (else "
                 "return once the request is written)."),
]
TimeoutOption = Annotated[
    float,
    typer.Option("--timeout", min=0.1, help="A running job only, with --wait: give up "
                 "after this many seconds (the request is withdrawn)."),
]


class RequestReport(BaseModel):
    """What became of a request (``--json``)."""

    job: str
    request_id: str
    action: Action
    epoch: int
    #: None: not waited for (the driver answers after its batch, or while idle).
    outcome: Outcome | None = None
    message: str = ""
    savepoint: str | None = None
    checkpoint_id: int | None = None
    waited_seconds: float = 0.0


def request(
    location: str,
    action: Action,
    savepoint: str | None,
    *,
    wait: bool,
    timeout: float,
    ha: str | None,
    as_json: bool,
) -> None:
    """Ask the running attempt of the job at `location`; one line and exit 1 on no
    running driver, a timeout, a refusal or a failure."""
    with handle_errors(as_json), open_job(split_location(location)[0], ha) as job:
        ask(JobLocation(Target(job)), action, savepoint, wait=wait, timeout=timeout,
            as_json=as_json)


def ask(
    location: JobLocation,
    action: Action,
    savepoint: str | None,
    *,
    wait: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """`request`, of a job directory already open."""
    job = location.job
    with handle_errors(as_json):
        sent = location.request(action, savepoint)
        report = RequestReport(job=job.storage.uri, request_id=sent.id, action=action,
                               epoch=sent.epoch, savepoint=savepoint)
        if wait:
            started = time.monotonic()
            answer = requests.wait(job.storage, sent, timeout)
            if answer is None or not answer.outcome.final:
                answer = requests.withdraw(job.storage, sent)
            else:
                requests.collect(job.storage, sent.id)
            report = _answered(report, answer, time.monotonic() - started)
            if answer.outcome is not Outcome.DONE:
                _failed(job, report, answer, timeout, as_json)

    def render() -> None:
        what = f"savepoint {savepoint}" if action is Action.SAVEPOINT else (
            "stop" + (f" with savepoint {savepoint}" if savepoint else "")
        )
        if report.outcome is None:
            say(f"asked attempt {report.epoch} of {report.job} for a {what} (request "
                f"{report.request_id}; --wait waits for it)")
        else:
            say(f"{report.job}: {report.message} ({report.waited_seconds:.1f}s)")

    emit(report, as_json, render)


def _answered(report: RequestReport, answer: RequestAnswer, waited: float) -> RequestReport:
    return report.model_copy(update={
        "outcome": answer.outcome, "message": answer.message,
        "savepoint": answer.savepoint_key or report.savepoint,
        "checkpoint_id": answer.checkpoint_id, "waited_seconds": round(waited, 3),
    })


def _failed(
    job: JobDirectory, report: RequestReport, answer: RequestAnswer, timeout: float,
    as_json: bool,
) -> None:
    if answer.outcome is Outcome.WITHDRAWN:
        message = (f"timed out after {timeout:g}s: attempt {report.epoch} of {report.job} "
                   "did not answer (is its driver alive? statehold status); request "
                   "withdrawn")
    elif answer.outcome is Outcome.ACCEPTED:
        message = (f"timed out after {timeout:g}s: attempt {report.epoch} of {report.job} "
                   f"took the request and is still at it (its answer: "
                   f"{answer_key(report.request_id)})")
    else:
        message = f"{report.action} {answer.outcome}: {answer.message}"
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
    fail(message)


def savepoint_of_job(
    job: JobLocation, name: str, *, wait: bool, timeout: float, as_json: bool
) -> None:
    """``statehold savepoint JOB NAME``: see `statehold.cli.spark_checkpoints`, whose
    command has two forms, one per kind of location."""
    ask(job, Action.SAVEPOINT, name, wait=wait, timeout=timeout, as_json=as_json)


def stop_command(
    job_dir: JobArg,
    savepoint: Annotated[
        str | None,
        typer.Option("--savepoint", help="Take this savepoint first; if it fails, the job "
                     "keeps running."),
    ] = None,
    wait: WaitOption = False,
    timeout: TimeoutOption = DEFAULT_TIMEOUT,
    ha: HaOption = None,
    as_json: JsonOption = False,
) -> None:
    """Ask the running driver of a statehold job to end cleanly after its current batch,
    or while it waits for input (after taking --savepoint): the job ends keeping its
    newest checkpoint, and a query run through job.foreach_batch stops. A later start
    resumes it. Fails (one line, exit 1) when no driver is running, and with --wait on a
    timeout (the request is then withdrawn, never acted on later)."""
    request(job_dir, Action.STOP, savepoint, wait=wait, timeout=timeout, ha=ha,
            as_json=as_json)


def register(app: typer.Typer) -> None:
    app.command("stop")(stop_command)
