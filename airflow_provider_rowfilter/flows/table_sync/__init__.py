"""Table synchronization (tablesync.c): each chosen table copied at a snapshot, then handed to the apply."""
