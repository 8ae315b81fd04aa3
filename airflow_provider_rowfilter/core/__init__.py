"""Pure-Python core, importing neither Airflow nor Spark: spec/, filters/, publication/, apply/ and compare/ on the basics."""
