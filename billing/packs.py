"""The catalog of token packs sold for Telegram Stars.

The operator sets `PACKS` as `id:tokens:stars[:title]` items separated by commas, e.g.
`starter:100000:50:Starter,pro:2000000:700:Pro`. Each purchase snapshots its pack, so editing
the catalog never changes what past buyers paid for.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from billing.errors import UnknownPack

STARS_CURRENCY = "XTR"
_PACK_ID = re.compile(r"^[a-z0-9_-]{1,32}$")


@dataclass(frozen=True)
class Pack:
    id: str
    title: str
    tokens: int
    price: int  # in Telegram Stars
    currency: str = STARS_CURRENCY


DEFAULT_CATALOG: tuple[Pack, ...] = (
    Pack("starter", "Starter", 100_000, 50),
    Pack("standard", "Standard", 500_000, 200),
    Pack("pro", "Pro", 2_000_000, 700),
)


def parse_catalog(spec: str | None) -> tuple[Pack, ...]:
    """Parse `PACKS`; an empty value means the built-in catalog. Raises ValueError on bad items."""
    if not spec or not spec.strip():
        return DEFAULT_CATALOG
    return parse_items(spec, "PACKS")


def parse_items(spec: str, setting: str) -> tuple[Pack, ...]:
    """`id:tokens:stars[:title]` items separated by commas (`PACKS`, `PLANS`); errors name
    `setting`."""
    packs = tuple(_parse_item(item.strip(), setting) for item in spec.split(",") if item.strip())
    ids = [pack.id for pack in packs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{setting} has duplicate ids: {', '.join(ids)}")
    return packs


def _parse_item(item: str, setting: str) -> Pack:
    parts = item.split(":", 3)
    if len(parts) < 3:
        raise ValueError(f"{setting} item {item!r} is not id:tokens:stars[:title]")
    pack_id, tokens, price = parts[0].strip(), parts[1].strip(), parts[2].strip()
    title = parts[3].strip() if len(parts) == 4 else pack_id.capitalize()
    if not _PACK_ID.match(pack_id):
        raise ValueError(f"{setting} id {pack_id!r} must be 1-32 of a-z, 0-9, _ or -")
    if not (tokens.isdigit() and price.isdigit() and int(tokens) > 0 and int(price) > 0):
        raise ValueError(
            f"{setting} item {item!r}: tokens and stars must be positive whole numbers"
        )
    return Pack(pack_id, title, int(tokens), int(price))


def find_pack(catalog: Sequence[Pack], pack_id: str) -> Pack:
    for pack in catalog:
        if pack.id == pack_id:
            return pack
    raise UnknownPack(f"No pack {pack_id!r} in the catalog.")
