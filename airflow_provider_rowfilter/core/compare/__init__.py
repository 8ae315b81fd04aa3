"""How verify compares a subscriber table with its publisher's rows: buckets, hashes, what differs."""
