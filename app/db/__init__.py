"""Persistence: engine/session factory (:mod:`app.db.session`), ORM tables (:mod:`app.db.models`)."""
