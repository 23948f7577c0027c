"""Analytics with real PySpark over lakes on local disk."""
