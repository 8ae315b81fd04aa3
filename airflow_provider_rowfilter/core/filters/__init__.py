"""The row filter: parsed, typed and validated by PostgreSQL's rules, translated to Spark, resolved per subscription."""
