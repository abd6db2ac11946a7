"""The batch body's column-wise fast path accepts exactly what the per-row model accepts, with the
same values, and leaves every other body to the model (whose errors are the API's 422 report)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from pydantic import Field, ValidationError

from app.db.dialect import pg_array
from app.schemas.common import StrictModel
from app.schemas.ingest import RatingBatchIn, RatingColumns, RatingRow, plain_rows


class _PerRow(StrictModel):
    """The body model without the fast path: every row validated by :class:`RatingRow`."""

    ratings: list[RatingRow] = Field(min_length=1)


def _outcome(model: type[StrictModel], body: Any) -> tuple[str, Any]:
    try:
        rows = model.model_validate(body).ratings  # type: ignore[attr-defined]
    except ValidationError as exc:
        return "error", exc.errors(include_url=False)
    return "rows", [r.model_dump() for r in rows]


_GOOD = {"user_id": "u-1", "item_id": "i.2", "rating": 3.5}
_ODD_VALUES: list[Any] = [
    "", "x" * 128, "x" * 129, "a b", "a\n", "\na", "é", "ünïcødé", "a:b@c_d.e-f", 7, 0, -3, True, None, 2.5, [], {},
    4, 4.0, -0.0, float("nan"), float("inf"), -float("inf"), 2**53, 2**53 + 1, 10**400, "4", False,
]


@pytest.mark.parametrize("key", ["user_id", "item_id", "rating"])
@pytest.mark.parametrize("value", _ODD_VALUES, ids=repr)
def test_one_odd_field_gives_the_per_row_models_outcome(key: str, value: Any) -> None:
    body = {"ratings": [dict(_GOOD), {**_GOOD, key: value}, dict(_GOOD, user_id="u-2")]}
    assert _outcome(RatingBatchIn, body) == _outcome(_PerRow, body)


@pytest.mark.parametrize("rows", [
    [], {}, "rows", None, [None], [[]], [{}],
    [{"user_id": "u", "item_id": "i"}],
    [{"user_id": "u", "item_id": "i", "rating": 1.0, "extra": 1}],
    [{"user_id": "u", "item_id": "i", "ratin": 1.0}],
    [{"user_id": "u", "item_id": "i", "rating": 1.0}, "not a row"],
], ids=repr)
def test_malformed_row_lists_give_the_per_row_models_outcome(rows: Any) -> None:
    body = {"ratings": rows}
    assert _outcome(RatingBatchIn, body) == _outcome(_PerRow, body)


def test_random_batches_through_json_agree_with_the_per_row_model() -> None:
    rng = random.Random(13)
    for _ in range(300):
        rows: list[dict[str, Any]] = [
            {"user_id": f"u{rng.randrange(50)}", "item_id": f"i{rng.randrange(50)}", "rating": rng.choice([1, 2.5, 5.0])}
            for _ in range(rng.randrange(1, 30))]
        if rng.random() < 0.5:  # one odd field somewhere
            rows[rng.randrange(len(rows))][rng.choice(["user_id", "item_id", "rating"])] = rng.choice(_ODD_VALUES)
        body = json.loads(json.dumps({"ratings": rows}))  # what the route sees (NaN/Infinity included)
        assert _outcome(RatingBatchIn, body) == _outcome(_PerRow, body)


def test_plain_rows_are_held_as_columns_and_read_back_as_rows() -> None:
    body = RatingBatchIn.model_validate({"ratings": [_GOOD, {**_GOOD, "user_id": "u-2", "rating": 4}]})
    rows = body.ratings
    assert isinstance(rows, RatingColumns)
    assert rows.user_ids == ["u-1", "u-2"] and rows.item_ids == ["i.2", "i.2"] and rows.ratings == [3.5, 4.0]
    assert all(type(v) is float for v in rows.ratings)  # JSON integers become floats, as the model makes them
    assert list(rows) == [RatingRow(**_GOOD), RatingRow(user_id="u-2", item_id="i.2", rating=4.0)]
    assert rows[1] == RatingRow(user_id="u-2", item_id="i.2", rating=4.0)
    assert list(rows[1:]) == [rows[1]] and len(rows) == 2


def test_anything_unusual_is_left_to_the_model() -> None:
    assert plain_rows([_GOOD]) is not None
    assert plain_rows([{**_GOOD, "user_id": 5}]) is None  # valid, but the model converts it
    assert plain_rows([{**_GOOD, "rating": True}]) is None
    assert plain_rows([{**_GOOD, "rating": 2**53 + 1}]) is None


def test_pg_array_escapes_only_when_needed() -> None:
    assert pg_array(["a", "b,c", ""]) == '{"a","b,c",""}'
    assert pg_array(['q"uote', "back\\slash", "x"]) == '{"q\\"uote","back\\\\slash","x"}'
    assert pg_array(['"']) == '{"\\""}'
    assert pg_array(['","']) == '{"\\",\\""}'  # a separator look-alike inside a value
    assert pg_array([1, 2]) == "{1,2}" and pg_array([]) == "{}"
