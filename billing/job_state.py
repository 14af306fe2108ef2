"""What background jobs remember across restarts and share between processes: where a job
stopped (the bot's position in Telegram's Star transactions) and the problems it already
reported to the operators, so a restart neither rescans from the start nor reports again."""

from __future__ import annotations

import hashlib

from sqlmodel import Session, col, select

from billing.models import JobState, ReportedProblem, utcnow


def position(*, session: Session, job: str) -> int:
    """Where `job` stopped; 0 before its first run."""
    state = session.get(JobState, job)
    return state.position if state is not None else 0


def save_position(*, session: Session, job: str, position: int) -> None:
    state = session.get(JobState, job)
    if state is None:
        state = JobState(name=job)
    state.position = position
    state.updated_at = utcnow()
    session.add(state)
    session.flush()


def problem_digest(job: str, message: str) -> str:
    return hashlib.sha256(f"{job}\n{message}".encode()).hexdigest()


def unreported(*, session: Session, job: str, messages: list[str]) -> list[str]:
    """The messages not reported yet, in order, once each."""
    digests = {problem_digest(job, message): message for message in messages}
    if not digests:
        return []
    known = set(
        session.exec(
            select(ReportedProblem.digest).where(col(ReportedProblem.digest).in_(digests))
        ).all()
    )
    return [message for digest, message in digests.items() if digest not in known]


def record_reported(*, session: Session, job: str, problems: list[tuple[str | None, str]]) -> None:
    """Remember `(charge id, message)` problems as reported (those already known are kept)."""
    for charge_id, message in problems:
        digest = problem_digest(job, message)
        known = session.exec(
            select(ReportedProblem.id).where(col(ReportedProblem.digest) == digest)
        ).first()
        if known is None:
            session.add(
                ReportedProblem(job=job, digest=digest, charge_id=charge_id, message=message)
            )
    session.flush()
