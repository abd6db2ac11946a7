"""The serving catalogue (inactive items, category -> items) is read from the items that carry a
fact only: a periodic reload in every API process does not read the whole catalogue."""

from __future__ import annotations

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from app.db.session import get_sessionmaker
from app.services import catalog
from app.services.serving import catalogue_cache
from tests.api.conftest import Env

R = "/v1/datasets/default"


class _CountingSession(Session):
    """A session that records how many rows each statement returned."""

    returned: list[int] = []

    def execute(self, *args, **kwargs):  # type: ignore[override]
        frozen = super().execute(*args, **kwargs).freeze()
        self.returned.append(len(frozen().all()))
        return frozen()


def test_catalogue_reload_reads_only_items_that_carry_a_fact(env: Env) -> None:
    with get_sessionmaker(env.settings.database_url)() as s:
        catalog.import_items(s, dataset="default", rows=[(f"plain-{k}", None, []) for k in range(300)]
                             + [("tagged", "T", ["drama", "new"]), ("also", None, ["drama"])])
        s.commit()
    for item_id, body in (("gone", {"active": False}), ("gone-tagged", {"active": False, "categories": ["new"]}),
                          ("put-plain", {"categories": []}), ("plain-7", {"active": False})):
        r = env.client.put(f"{R}/items/{item_id}", headers=env.admin, json=body)
        assert r.status_code in (200, 201), r.text
    with get_sessionmaker(env.settings.database_url)() as s:
        dataset_id = catalog.get_dataset(s, "default").id
    engine = create_engine(env.settings.database_url)
    try:
        with _CountingSession(bind=engine) as s:
            _CountingSession.returned = []
            got = catalogue_cache.load_catalog(s, dataset_id)
    finally:
        engine.dispose()
    assert got.inactive == {"gone", "gone-tagged", "plain-7"}
    assert got.by_category == {"drama": {"tagged", "also"}, "new": {"tagged", "gone-tagged"}}
    assert _CountingSession.returned == [5]  # of 305 items: the three inactive and the two tagged
