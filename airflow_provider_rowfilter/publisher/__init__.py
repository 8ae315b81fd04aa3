"""The publisher side, over psycopg: its catalog and publications, our slot and capture publications, the capture,
the copy's source."""
