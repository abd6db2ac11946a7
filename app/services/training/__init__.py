"""Training use cases: ``requests`` (reserve a run's privacy cost from public facts), ``dispatch``
(the outbox and the broker), ``runner`` (claim, train, publish), ``schedule`` (retraining and
worker start-up), ``inputs`` (what each algorithm reads), ``projection`` (what the next run
would cost) and the ``embedded_worker``. Import the submodules directly; this package re-exports
nothing, so importing one never drags in the others."""
