"""The catalog of monthly plans: Telegram Stars subscriptions that credit tokens every period.

The operator sets `PLANS` like `PACKS` (`id:tokens:stars[:title]`, comma-separated), e.g.
`basic:1000000:300:Basic`; unset, the shop sells no plans. Telegram renews a Stars subscription
every 30 days (the only period it offers) for at most 10,000 Stars, so both are checked here
rather than refused by Telegram when a buyer taps the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from billing.errors import UnknownPack
from billing.packs import Pack, parse_items

SUBSCRIPTION_PERIOD = 30 * 24 * 60 * 60  # 2,592,000 s: Telegram's one subscription period
MAX_PLAN_STARS = 10_000  # Telegram's limit for a subscription's price


@dataclass(frozen=True)
class Plan(Pack):
    """A pack bought again every period: each charge credits `tokens`, as a pack would."""

    period_seconds: int = SUBSCRIPTION_PERIOD


def parse_plans(spec: str | None) -> tuple[Plan, ...]:
    """Parse `PLANS`; empty means no plans. Raises ValueError on bad items."""
    if not spec or not spec.strip():
        return ()
    plans = tuple(
        Plan(item.id, item.title, item.tokens, item.price) for item in parse_items(spec, "PLANS")
    )
    for plan in plans:
        if plan.price > MAX_PLAN_STARS:
            raise ValueError(
                f"PLANS item {plan.id!r}: {plan.price} Stars is over Telegram's "
                f"{MAX_PLAN_STARS:,} for a subscription"
            )
    return plans


def find_plan(plans: Sequence[Plan], plan_id: str) -> Plan:
    for plan in plans:
        if plan.id == plan_id:
            return plan
    raise UnknownPack(f"No plan {plan_id!r} in the catalog.")
