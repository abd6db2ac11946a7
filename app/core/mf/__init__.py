"""Matrix factorisation and completion: non-private ALS, DPALS, DP-CMF, DPFW, their fold-in, artifacts and ε-aware defaults."""
