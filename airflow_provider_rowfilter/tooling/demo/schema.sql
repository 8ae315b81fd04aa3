-- The publisher of the demo: PostgreSQL's own documentation examples (logical-replication.sgml)
-- plus a partitioned table.
CREATE TABLE t1 (a int, b int, c text, PRIMARY KEY (a, c));
CREATE TABLE t2 (d int, e int, f int, PRIMARY KEY (d));
CREATE TABLE t3 (g int, h int, i int, PRIMARY KEY (g));
CREATE TABLE t4 (id int PRIMARY KEY, a text, b text, c text, d text, e text);
CREATE TABLE orders (id bigint, region text, amount numeric(12,2), placed date, PRIMARY KEY (id, placed))
    PARTITION BY RANGE (placed);
CREATE TABLE orders_2024 PARTITION OF orders FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
CREATE TABLE orders_2025 PARTITION OF orders FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
-- Filters of publications that publish UPDATE/DELETE may only use replica identity columns;
-- these filters use others, so the tables replicate their full old row (as PostgreSQL requires).
ALTER TABLE t2 REPLICA IDENTITY FULL;
ALTER TABLE orders_2024 REPLICA IDENTITY FULL;
ALTER TABLE orders_2025 REPLICA IDENTITY FULL;

INSERT INTO t1 SELECT g, g * 10, (ARRAY['NSW','VIC','QLD'])[g % 3 + 1] FROM generate_series(1, 12) g;
INSERT INTO t2 SELECT g, g * 2, g * 3 FROM generate_series(1, 12) g;
INSERT INTO t3 SELECT g, g * 2, g * 3 FROM generate_series(1, 12) g;
INSERT INTO t4 SELECT g, 'a' || g, 'b' || g, 'c' || g, 'd' || g, 'e' || g FROM generate_series(1, 5) g;
INSERT INTO orders SELECT g, (ARRAY['EU','US','APAC'])[g % 3 + 1], g * 12.5, DATE '2024-06-01' + g * 20
    FROM generate_series(1, 20) g;
