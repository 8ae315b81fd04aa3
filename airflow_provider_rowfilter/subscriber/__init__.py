"""The subscriber side, over psycopg: the replication state (schema rowfilter), the copy's and the apply's writes."""
