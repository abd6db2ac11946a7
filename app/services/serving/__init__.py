"""Serving use cases over the active published model: ``recommend`` (one user, privileged),
``popular``, ``similar``, ``published`` (metadata, embeddings); ``active`` holds the caches."""
