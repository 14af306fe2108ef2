"""Prompt-lookup speculative decoding: drafts taken from the text itself, verified in one call.

A decode step reads every weight once for one token per sequence; on a CPU that read, not the
arithmetic, bounds a single stream. Verifying k drafted tokens in one call reads the weights
once for up to k + 1 tokens. The drafts come from prompt lookup (no second model): the last n
tokens of a sequence (n from `MAX_NGRAM` down to `MIN_NGRAM`) are looked up in its prompt and
output so far, and the tokens that followed their latest earlier occurrence are proposed. Text
that quotes or edits its prompt (summaries, code edits, RAG answers) repeats such spans.

Exact: the scheduler samples every verified position as it would sample a decode step's, with
the row's own state (constraint, penalties, the one uniform per token of a seeded sampler), and
keeps a draft only while it equals that sample. So the text is token for token the one decoding
without drafts gives, greedy or seeded; for a point-mass draft this is the acceptance rule of
speculative sampling (a draft is kept with probability p(draft)).

On only where it pays: each sequence keeps an estimate of the share of its drafts accepted,
and the step's cost by the tokens it computes is fitted online from the steps timed, one fit
per number of rows, so a step is widened to the width that maximises expected tokens per
second, or not at all: a sequence that does not repeat its context stops drafting after a few
rejections (and tries again now and then), and a full batch, where an extra position costs
nearly a token's compute, seldom drafts. The fits are per row count because a step's cost is
not one line across them: a lone row reading the weights computes its drafts almost for free,
16 rows pay for each (AMX Xeon, 0.5B int4: one row 12.6 ms plain, 14.7 with 4 drafts; 16 rows
21.2 and 67.3; bench/results/2026-11-27-verify-steps-amx-xeon-609ff59.md). One fit over all
of them took its slope from the rows that ran last: after a busy spell of 16 rows drafting
one each (21.2 and 39.7 ms), it priced a lone stream's draft at 30% of its step, not 4%.
`ENGINE_SPECULATIVE_TOKENS=0` turns it off. Figures: bench/results/ (`bench/speculative.py`).
"""

from __future__ import annotations

from collections.abc import Sequence as Rows
from dataclasses import dataclass, field

MIN_NGRAM = 1
MAX_NGRAM = 3
# A sequence's acceptance estimate starts here and moves this far towards each step's share.
PRIOR_ACCEPTANCE = 0.6
ACCEPTANCE_WEIGHT = 0.5
# A sequence that stopped drafting tries once more after this many steps without a draft, and
# after twice as many each time such a try fails (up to the last).
RETRY_STEPS = 16
MAX_RETRY_STEPS = 512
# Steps' cost model `seconds = fixed + per_token * tokens`: the prior share of one token's cost
# in a one-row step (a step is bound by reading the weights, not by its few tokens' arithmetic),
# and how fast the fit forgets old steps.
PRIOR_TOKEN_SHARE = 0.05
COST_DECAY = 0.98
PRIOR_WEIGHT = 4.0  # the prior counts as this many one-row and widened steps


@dataclass(eq=False)
class PromptLookup:
    """The n-gram index of one sequence's tokens (prompt, then output), grown as it is read."""

    prompt: Rows[int]
    output: list[int]
    # (n-gram) -> the position after its latest occurrence; only n-grams ending before the
    # last token are indexed, so the last n tokens never find themselves.
    _ends: dict[tuple[int, ...], int] = field(default_factory=dict)
    _indexed: int = 0  # positions whose ending n-grams are in `_ends`

    def __len__(self) -> int:
        return len(self.prompt) + len(self.output)

    def _tokens(self, start: int, stop: int) -> list[int]:
        prompt = len(self.prompt)
        if stop <= prompt:
            return list(self.prompt[start:stop])
        if start >= prompt:
            return self.output[start - prompt : stop - prompt]
        return [*self.prompt[start:], *self.output[: stop - prompt]]

    def propose(self, limit: int) -> list[int]:
        """`limit` tokens that followed the latest earlier occurrence of the longest n-gram the
        sequence ends with (continuing the loop that makes where it runs into the end); []
        when none occurred."""
        length = len(self)
        if limit <= 0 or length < MIN_NGRAM + 1:
            return []
        self._index(length - 1)
        for n in range(min(MAX_NGRAM, length - 1), MIN_NGRAM - 1, -1):
            end = self._ends.get(tuple(self._tokens(length - n, length)))
            if end is not None:
                # Where the match is recent its continuation runs into the tail, and the text
                # is a loop of period `length - end`: the draft goes on round it (LZ77's copy).
                draft = self._tokens(end, min(end + limit, length))
                while len(draft) < limit:
                    draft.append(draft[len(draft) - (length - end)])
                return draft
        return []

    def _index(self, upto: int) -> None:
        """Index the n-grams that end at positions `_indexed` to `upto`, both included (an
        n-gram "ends" at the position after its last token)."""
        if self._indexed >= upto:
            return
        start = max(0, self._indexed - MAX_NGRAM)
        window = self._tokens(start, upto)
        for end in range(max(self._indexed, 1), upto + 1):
            for n in range(MIN_NGRAM, min(MAX_NGRAM, end) + 1):
                self._ends[tuple(window[end - n - start : end - start])] = end
        self._indexed = upto + 1


@dataclass
class StepCosts:
    """Seconds a decode or verification step takes, `fixed + per_token * tokens`, fitted by
    exponentially weighted least squares over the steps timed, from a prior that makes a token
    a small share of a one-row step until widened steps say otherwise."""

    _n: float = 0.0
    _sx: float = 0.0
    _sy: float = 0.0
    _sxx: float = 0.0
    _sxy: float = 0.0
    _steps: int = 0

    def record(self, tokens: int, seconds: float) -> None:
        if self._steps == 0:  # the prior, scaled to the first step seen
            fixed = seconds / (1 + PRIOR_TOKEN_SHARE * tokens)
            for x in (tokens, 2 * tokens + 4):
                self._add(x, fixed * (1 + PRIOR_TOKEN_SHARE * x), PRIOR_WEIGHT)
        self._steps += 1
        for name in ("_n", "_sx", "_sy", "_sxx", "_sxy"):
            setattr(self, name, getattr(self, name) * COST_DECAY)
        self._add(tokens, seconds, 1.0)

    def _add(self, x: float, y: float, weight: float) -> None:
        self._n += weight
        self._sx += weight * x
        self._sy += weight * y
        self._sxx += weight * x * x
        self._sxy += weight * x * y

    def seconds(self, tokens: int) -> float | None:
        """The fitted time of a step computing `tokens` tokens; None before any step."""
        if self._steps == 0:
            return None
        spread = self._n * self._sxx - self._sx * self._sx
        slope = max(0.0, (self._n * self._sxy - self._sx * self._sy) / spread) if spread else 0.0
        fixed = (self._sy - slope * self._sx) / self._n
        return max(fixed, 1e-9) + slope * tokens


@dataclass(eq=False)
class Drafting:
    """What one sequence's drafts have done: its acceptance estimate and lookup index."""

    lookup: PromptLookup
    acceptance: float = PRIOR_ACCEPTANCE
    idle_steps: int = 0  # steps since it last drafted
    retry_after: int = RETRY_STEPS
    proposed: int = 0
    accepted: int = 0

    def expected_tokens(self, drafts: int) -> float:
        """Tokens a step verifying `drafts` drafts yields on average, drafts accepted
        independently with probability `acceptance`: 1 + a + a^2 + ... + a^drafts."""
        a = min(self.acceptance, 0.999)
        return (1 - a ** (drafts + 1)) / (1 - a)

    def update(self, proposed: int, accepted: int) -> None:
        if not proposed:
            self.idle_steps += 1
            if self.idle_steps >= self.retry_after:  # try again: the text may repeat by now
                self.acceptance = max(self.acceptance, PRIOR_ACCEPTANCE)
                self.retry_after = min(2 * self.retry_after, MAX_RETRY_STEPS)
                self.idle_steps = 0
            return
        share = accepted / proposed
        self.acceptance += ACCEPTANCE_WEIGHT * (share - self.acceptance)
        if share >= PRIOR_ACCEPTANCE:
            self.retry_after = RETRY_STEPS
        self.idle_steps = 0
        self.proposed += proposed
        self.accepted += accepted


class Speculator:
    """Chooses each step's drafts for the rows of a batch, and learns from the outcome."""

    def __init__(self, max_drafts: int) -> None:
        self.max_drafts = max_drafts
        self.costs: dict[int, StepCosts] = {}  # by the rows of the step
        self.proposed = 0  # drafts verified, over every sequence
        self.accepted = 0

    def drafts(self, rows: Rows[tuple[Drafting, int]]) -> list[list[int]]:
        """Each row's drafts for this step (all [] for a plain decode step). `rows`: each
        decoding sequence's `Drafting` and how many tokens it may still take beyond the next."""
        proposals = [d.lookup.propose(min(self.max_drafts, room)) for d, room in rows]
        width = self._best_width([d for d, _ in rows], proposals)
        return [p[:width] for p in proposals]

    def _relative_cost(self, rows: int, drafts: int) -> float:
        """A step of `rows` rows each verifying `drafts` drafts, over a plain decode step."""
        costs = self.costs.get(rows)
        if costs is None or (plain := costs.seconds(rows)) is None:
            return 1.0 + PRIOR_TOKEN_SHARE * drafts
        widened = costs.seconds(rows * (drafts + 1))
        assert widened is not None
        return widened / plain

    def _best_width(self, rows: list[Drafting], proposals: list[list[int]]) -> int:
        """The drafts per row (a step's width less one) that maximise expected tokens per
        second of the step, 0 when no widening beats a plain decode step."""
        longest = max((len(p) for p in proposals), default=0)
        best, best_rate = 0, float(len(rows))  # a plain step: one token a row, cost 1
        for drafts in range(1, longest + 1):
            tokens = sum(
                d.expected_tokens(min(drafts, len(p))) for d, p in zip(rows, proposals, strict=True)
            )
            rate = tokens / self._relative_cost(len(rows), drafts)
            if rate > best_rate:
                best, best_rate = drafts, rate
        return best

    def record(
        self, rows: Rows[Drafting], drafts: Rows[Rows[int]], kept: Rows[int], seconds: float
    ) -> None:
        """One step's outcome: each row's drafts and how many of them it kept, and the step's
        time (which the cost fit takes by the tokens it computed)."""
        width = max((len(d) for d in drafts), default=0) + 1
        self.costs.setdefault(len(rows), StepCosts()).record(len(rows) * width, seconds)
        for drafting, draft, count in zip(rows, drafts, kept, strict=True):
            drafting.update(len(draft), count)
            self.proposed += len(draft)
            self.accepted += count
