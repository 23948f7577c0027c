"""spark_sink package."""
