-- The demo's publications, in PostgreSQL syntax: the same statements would create them natively.
CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 5 AND c = 'NSW');
CREATE PUBLICATION p2 FOR TABLE t1, t2 WHERE (e = 99);
CREATE PUBLICATION p3 FOR TABLE t2 WHERE (d = 10), t3 WHERE (g = 10);
CREATE PUBLICATION p4 FOR TABLE t4 (id, a, b, d);
CREATE PUBLICATION p_orders FOR TABLE orders WHERE (region = 'EU' AND amount >= 50)
    WITH (publish_via_partition_root = true, publish = 'insert, update, delete');
