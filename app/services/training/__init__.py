"""Training use cases: ``requests`` (reserve a run's privacy cost from public facts), ``dispatch``
(the outbox and the broker), ``runner`` (claim, train, publish), ``schedule`` (retraining and
worker start-up), ``projection`` (what the next run would cost) and the ``embedded_worker``; what
each algorithm reads comes from :mod:`app.db.loaders`. Import the submodules directly; this
package re-exports nothing, so importing one never drags in the others."""
