"""Per-domain stores: every query a use case of :mod:`app.services` makes, one module per domain
(runs and model versions, votes, public inputs, administration), the implementation chosen once
per session from the engine's dialect where the databases differ."""
