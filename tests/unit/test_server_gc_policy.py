"""The server process's collector policy (`app.main.freeze_full_collection_survivors`), run in a
fresh interpreter: freezing objects in the test process would keep them for the whole session."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import gc, weakref
    import app.main as main
    from app.main import freeze_full_collection_survivors

    class Node:
        def __init__(self):
            self.me = self  # a reference cycle: only the cyclic collector can free it

    def in_collector(obj):
        return any(o is obj for o in gc.get_objects())

    before = len(gc.callbacks)
    freeze_full_collection_survivors()
    freeze_full_collection_survivors()  # idempotent
    assert len(gc.callbacks) == before + 1, gc.callbacks

    survivor = [Node() for _ in range(100)]  # reachable: survives, then frozen
    garbage = weakref.ref(Node())  # unreachable cycle: collected, never frozen
    frozen_before = gc.get_freeze_count()
    gc.collect(1)  # a young collection freezes nothing
    assert gc.get_freeze_count() == frozen_before
    gc.collect()
    assert garbage() is None
    assert gc.get_freeze_count() > frozen_before
    assert not in_collector(survivor) and not in_collector(survivor[0])

    later = weakref.ref(Node())  # garbage made after the freeze is still collected
    gc.collect()
    assert later() is None
    kept = Node()
    dead_cycle = weakref.ref(kept)
    gc.collect()  # kept survives: frozen
    del kept  # a cycle among frozen objects: not collected by the passes in between ...
    gc.collect()
    assert dead_cycle() is not None
    main.REFREEZE_S = 0.0  # ... but by the next pass that starts unfrozen
    gc.collect()
    assert dead_cycle() is None
    assert gc.get_freeze_count() > 0  # and the survivors of that pass are frozen again
    print("ok")
""")


def test_full_collection_survivors_are_frozen_and_garbage_still_collected() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok")
