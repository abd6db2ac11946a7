"""privrec numeric core: ratings, (DP) matrix factorisation, accounting, evaluation.

This package imports only numpy, scipy, dp_accounting, threadpoolctl and the standard library;
it never imports the web framework, the database layer or the task queue.
"""
