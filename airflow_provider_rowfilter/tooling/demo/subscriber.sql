-- The demo's subscriber tables (the same in our subscriber and in the native one). orders arrives
-- through its partitioned root (publish_via_partition_root = true), so here it is a plain table.
CREATE TABLE t1 (a int, b int, c text, PRIMARY KEY (a, c));
CREATE TABLE t2 (d int, e int, f int, PRIMARY KEY (d));
CREATE TABLE t3 (g int, h int, i int, PRIMARY KEY (g));
CREATE TABLE t4 (id int PRIMARY KEY, a text, b text, c text, d text, e text);
CREATE TABLE orders (id bigint, region text, amount numeric(12,2), placed date, PRIMARY KEY (id, placed));
