"""The PLANS catalog: monthly plans written like packs, within what Telegram allows."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from billing.errors import UnknownPack
from billing.plans import SUBSCRIPTION_PERIOD, Plan, find_plan, parse_plans
from billing.settings import BillingSettings


def test_plans_are_written_like_packs_and_renew_every_30_days() -> None:
    plans = parse_plans("basic:1000000:300:Basic, max:5000000:1200")

    assert plans == (Plan("basic", "Basic", 1_000_000, 300), Plan("max", "Max", 5_000_000, 1200))
    assert SUBSCRIPTION_PERIOD == 2_592_000 and plans[0].period_seconds == SUBSCRIPTION_PERIOD
    assert find_plan(plans, "max").price == 1200
    with pytest.raises(UnknownPack):
        find_plan(plans, "gold")


@pytest.mark.parametrize("spec", [None, "", "  "])
def test_no_plans_unless_the_operator_sets_them(spec: str | None) -> None:
    assert parse_plans(spec) == ()


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("basic:1000000:10001", "over Telegram's 10,000"),
        ("basic:lots:300", "positive whole numbers"),
        ("basic:1:1,basic:2:2", "duplicate ids: basic, basic"),
        ("Basic Plan:1:1", "must be 1-32 of a-z"),
    ],
)
def test_a_bad_plans_setting_is_refused_when_the_settings_load(spec: str, error: str) -> None:
    with pytest.raises(ValidationError, match=f"PLANS.*{error}"):
        BillingSettings(_env_file=None, plans=spec)  # type: ignore[call-arg]
