"""How the console command shows things: tables (a terminal, plain rows, TSV) and live progress bars (Rich only)."""
