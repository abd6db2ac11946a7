"""The batch route's fast JSON encoding is byte-identical to the validated response model's."""

from __future__ import annotations

from app.schemas.ingest import RatingBatchOut, RatingBatchResult, RowResult, RowResultDict

_AWKWARD_IDS = ["plain", "ünïcødé-ß", "emoji-😀", 'quote"back\\slash', "tab\tnew\nline", "\u2028sep", "ctl\x01", ""]


def _result() -> RatingBatchResult:
    results: list[RowResultDict] = [
        {"index": k, "user_id": u, "item_id": _AWKWARD_IDS[-1 - k], "status": "created" if k % 2 else "updated",
         "error": None}
        for k, u in enumerate(_AWKWARD_IDS)]
    return RatingBatchResult(created=4, updated=4, results=results)


def test_fast_json_equals_the_models_json_byte_for_byte() -> None:
    out = _result()
    model = RatingBatchOut.model_validate({"created": out.created, "updated": out.updated, "results": out.results})
    assert out.to_json() == model.model_dump_json().encode()
    assert out.to_model() == model


def test_row_result_dict_has_the_models_fields_in_order() -> None:
    assert list(RowResultDict.__annotations__) == list(RowResult.model_fields)
