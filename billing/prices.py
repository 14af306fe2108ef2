"""What a model's tokens cost: one table, read by the API that bills and the bot that shows it.

A price is in balance tokens per model token, separately for the prompt and the completion
(`price_prompt`, `price_completion` of the models file; `MODEL_PRICES=name=x` sets both to x).
A request's cost is `ceil(prompt * price_prompt + completion * price_completion)`, so a fraction
of a token is never given away and a price of 1 bills the token count exactly.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class PriceError(ValueError):
    """Raised when MODEL_PRICES or a models file's price field is not a positive number."""


@dataclass(frozen=True)
class Price:
    prompt: float = 1.0
    completion: float = 1.0

    def cost(self, prompt_tokens: int, completion_tokens: int) -> int:
        exact = prompt_tokens * self.prompt + completion_tokens * self.completion
        return math.ceil(exact - 1e-9)

    def describe(self) -> str:
        """`"1"` where both are equal, else `"1 / 3"` (prompt / completion), for the bot."""
        prompt, completion = _number(self.prompt), _number(self.completion)
        return prompt if prompt == completion else f"{prompt} / {completion}"


DEFAULT_PRICE = Price()


def parse_model_prices(spec: str) -> dict[str, Price]:
    """`MODEL_PRICES="big=2.5,small=0.5"`: one multiplier per model, for prompt and completion."""
    prices: dict[str, Price] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not sep or not name.strip() or not price > 0 or math.isinf(price):
            raise PriceError(f"MODEL_PRICES item {item!r} is not name=positive-number")
        prices[name.strip()] = Price(price, price)
    return prices


def entry_price(entry: Mapping[str, Any], name: str, fallback: Price = DEFAULT_PRICE) -> Price:
    """The price of one `[[model]]` table; a field left out keeps `fallback`'s."""
    return Price(
        prompt=_price_field(entry, name, "price_prompt", fallback.prompt),
        completion=_price_field(entry, name, "price_completion", fallback.completion),
    )


def _price_field(entry: Mapping[str, Any], name: str, field: str, default: float) -> float:
    value = entry.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PriceError(f"model {name!r}: {field} must be a number, not {value!r}")
    if not value > 0 or math.isinf(value):
        raise PriceError(f"model {name!r}: {field} must be a positive number, not {value!r}")
    return float(value)


def read_models_toml(path: Path) -> list[dict[str, Any]]:
    """The `[[model]]` tables of a models file (raises PriceError naming the file if unreadable)."""
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except OSError as exc:
        raise PriceError(f"MODELS_FILE {str(path)!r}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise PriceError(f"MODELS_FILE {str(path)!r} is not valid TOML: {exc}") from exc
    models = document.get("model", [])
    if not isinstance(models, list) or not all(isinstance(item, dict) for item in models):
        raise PriceError(f"MODELS_FILE {str(path)!r}: models are [[model]] tables")
    return models


def price_table(*, models_file: str | None, model_prices: str) -> dict[str, Price]:
    """Every priced model: MODEL_PRICES, then the models file's own fields over it."""
    prices = parse_model_prices(model_prices)
    if models_file:
        for index, entry in enumerate(read_models_toml(Path(models_file))):
            name = entry.get("name")
            if not isinstance(name, str) or not name:
                raise PriceError(f"model #{index + 1}: name must be a non-empty string")
            prices[name] = entry_price(entry, name, prices.get(name, DEFAULT_PRICE))
    return prices


def _number(value: float) -> str:
    return f"{value:g}"
