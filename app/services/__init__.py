"""Application services: small keyword-only functions over an open Session."""
