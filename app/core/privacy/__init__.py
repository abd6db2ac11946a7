"""Privacy accounting and the DP primitives every algorithm uses: dp_accounting events, calibration, exact discrete noise."""
