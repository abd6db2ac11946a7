"""Cancelling a training run (admin): a queued or running run is stopped and never published.

A cancelled run ends ``failed`` at stage ``cancelled``. Whether it is charged follows the one rule
of the runner (``app.services.training.runner``): a run that had not committed
``private_data_read`` has read nothing and its reservation is refunded; one that had is charged,
never refunded. The run row is locked first, then (for a refund) the budget rows, the order the
runner's own failure path takes. A worker holding the run notices at its next progress or
heartbeat point (its conditional writes match no ``running`` row) and stops without publishing;
the point of no refund is itself a conditional write, so a run cancelled before it never reads.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from app import ledger
from app.db.models import TrainingRun, utcnow
from app.db.stores.runs import runs_store
from app.errors import RunFinished, UnknownTrainingRun

__all__ = ["CANCELLED_STAGE", "cancel_run", "is_cancelled"]

CANCELLED_STAGE = "cancelled"
_REFUNDED = "cancelled by {actor} before reading any private data: its privacy reservation was refunded"
_CHARGED = ("cancelled by {actor} after reading private data: the run is charged, its privacy reservation "
            "is spent and never refunded")


def is_cancelled(run: TrainingRun) -> bool:
    """True for a run that an admin cancelled."""
    return run.status == "failed" and run.stage == CANCELLED_STAGE


def cancel_run(session: Session, *, run_id: int, actor: str) -> TrainingRun:
    """Cancel queued or running run ``run_id`` in the caller's transaction (the caller commits).

    Idempotent: a cancelled run is returned as it is. 404 ``unknown_training_run`` when absent,
    409 ``run_finished`` when it already succeeded or failed."""
    run = runs_store(session).lock_run(run_id)
    if run is None:
        raise UnknownTrainingRun(f"training run {run_id} not found", run_id=run_id)
    if is_cancelled(run):
        return run
    if run.status not in ("queued", "running"):
        raise RunFinished(f"training run {run_id} has already {run.status}: it cannot be cancelled",
                          run_id=run_id, status=run.status)
    run.status, run.stage, run.finished_at = "failed", CANCELLED_STAGE, utcnow()
    if run.private_data_read:
        run.error = _CHARGED.format(actor=actor)
    else:
        entry = ledger.refund(session, dataset=run.dataset, run_id=run.id, actor=actor,
                              reason=f"run cancelled by {actor} before reading any private data")
        run.refunded = entry is not None
        run.error = _REFUNDED.format(actor=actor)
    session.flush()
    return run
