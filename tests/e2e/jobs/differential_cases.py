"""The cases the apply is held to against native logical replication: the documentation's examples and more.

Shared by tests/e2e/jobs/test_apply_differential.py (each case in each filter mode and each reducer) and
tests/e2e/jobs/test_apply_connect.py (the same cases through a Spark Connect server). A case is the
publisher's DDL and rows, the subscriber's tables, the publications, the tables compared, and the
batches of statements made on the publisher.
"""

from __future__ import annotations

# The documentation's UPDATE-transformation example (logical-replication.sgml, "Row Filters"):
# t1 published WHERE (a > 5 AND c = 'NSW'); the primary key includes c so UPDATEs may filter on it.
DOC_TABLES = "CREATE TABLE t1(a int, b int, c text, PRIMARY KEY(a, c));"
DOC_PUBLISHER = DOC_TABLES + """
ALTER TABLE t1 REPLICA IDENTITY FULL;
INSERT INTO t1 VALUES (2, 102, 'NSW'), (3, 103, 'QLD'), (4, 104, 'VIC'), (5, 105, 'ACT'), (6, 106, 'NSW'),
                      (7, 107, 'NT'), (8, 108, 'QLD'), (9, 109, 'NSW');
CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 5 AND c = 'NSW');
"""
DOC_STEPS = [
    "UPDATE t1 SET b = 999 WHERE a = 6",                # old and new match: UPDATE
    "UPDATE t1 SET a = 555 WHERE a = 2",                # only new matches: INSERT
    "UPDATE t1 SET c = 'VIC' WHERE a = 9",              # only old matches: DELETE
    "UPDATE t1 SET b = 0 WHERE a = 3",                  # neither: dropped
    "INSERT INTO t1 VALUES (10, 1, 'NSW'), (11, 2, 'VIC')",
    "DELETE FROM t1 WHERE a = 7 OR a = 10",
]


COMBINATION_TABLES = """
CREATE TABLE t1(a int PRIMARY KEY, b text);
CREATE TABLE t2(c int PRIMARY KEY, d text);
CREATE TABLE t3(e int PRIMARY KEY, f text);
"""
COMBINATION_PUBLISHER = COMBINATION_TABLES + """
ALTER TABLE t2 REPLICA IDENTITY FULL;
INSERT INTO t1 SELECT g, 'one ' || g FROM generate_series(1, 20) g;
INSERT INTO t2 SELECT g, CASE WHEN g % 3 = 0 THEN NULL ELSE 'two ' || g END FROM generate_series(1, 20) g;
INSERT INTO t3 SELECT g, 'three ' || g FROM generate_series(1, 20) g;
CREATE PUBLICATION pub1 FOR TABLE t1 WITH (publish = 'insert');
CREATE PUBLICATION pub2 FOR TABLE t1 WHERE (a > 10) WITH (publish = 'update, delete');
CREATE PUBLICATION pub3a FOR TABLE t3 WITH (publish = 'truncate');
CREATE PUBLICATION pub3b FOR TABLE t3 WHERE (e > 5);
CREATE PUBLICATION pub4 FOR TABLE t2 WHERE (c % 2 = 0) WITH (publish = 'insert, update');
CREATE PUBLICATION pub5 FOR TABLE t2 WHERE (d IS NULL) WITH (publish = 'update, delete');
"""
COMBINATION_BATCHES = [
    [
        "INSERT INTO t1 VALUES (21, 'ins'), (3, 'dup key? no: 3 exists') ON CONFLICT DO NOTHING",
        "UPDATE t1 SET b = 'upd ' || a WHERE a IN (2, 12)",          # only a > 10 is sent (pub2)
        "UPDATE t1 SET a = 30 WHERE a = 5",                          # key change, old out, new in: INSERT
        "UPDATE t1 SET a = 31 WHERE a = 13",                         # key change, both in: UPDATE of the key
        "DELETE FROM t1 WHERE a IN (1, 14)",
        "BEGIN; INSERT INTO t2 VALUES (22, 'even'), (23, NULL); UPDATE t2 SET d = NULL WHERE c = 4; "
        "UPDATE t2 SET d = 'was null' WHERE c = 6; DELETE FROM t2 WHERE c IN (9, 10); COMMIT",
        "INSERT INTO t3 VALUES (21, 'x'), (2, 'y') ON CONFLICT (e) DO UPDATE SET f = 'conflict ' || t3.e",
    ],
    [
        "TRUNCATE t3",
        "INSERT INTO t3 VALUES (1, 'after'), (7, 'after')",
        "UPDATE t2 SET c = c + 100 WHERE c IN (2, 3)",
        "UPDATE t1 SET b = NULL WHERE a = 15",
        "DELETE FROM t2 WHERE d IS NULL",
    ],
]

COLUMN_LIST_PUBLISHER = r"""
CREATE TABLE t1(id int, a text, b text, c text, d text, e text, PRIMARY KEY(id));
INSERT INTO t1 VALUES (1, 'a-1', 'b-1', 'c-1', 'd-1', 'e-1'), (2, 'a-2', 'b-2', 'c-2', 'd-2', 'e-2'),
                      (3, 'a-3', 'b-3', 'c-3', 'd-3', 'e-3');
CREATE PUBLICATION p1 FOR TABLE t1 (id, b, a, d) WHERE (id < 100);
"""
COLUMN_LIST_SUBSCRIBER = "CREATE TABLE t1(id int, b text, a text, d text, extra text DEFAULT 'dflt', PRIMARY KEY(id));"
COLUMN_LIST_BATCHES = [[
    "INSERT INTO t1 VALUES (4, 'a-4', 'b-4', 'c-4', E'tab\\there', 'e-4'), (200, 'a', 'b', 'c', 'd', 'e')",
    "UPDATE t1 SET c = 'c only' WHERE id = 1",
    "UPDATE t1 SET a = NULL, e = 'x' WHERE id = 2",
    "UPDATE t1 SET id = 150 WHERE id = 3",                           # leaves the filter: DELETE
    "UPDATE t1 SET id = 5 WHERE id = 200",                           # enters it: INSERT
    "DELETE FROM t1 WHERE id = 4",
]]

PARTITION_TABLES = """
CREATE TABLE parent(a int PRIMARY KEY, b text) PARTITION BY RANGE(a);
CREATE TABLE child_low PARTITION OF parent FOR VALUES FROM (MINVALUE) TO (100);
CREATE TABLE child_high PARTITION OF parent FOR VALUES FROM (100) TO (MAXVALUE);
"""
PARTITION_ROWS = "INSERT INTO parent SELECT g * 10, 'row ' || g FROM generate_series(1, 15) g;"
VIA_ROOT_PUBLISHER = PARTITION_TABLES + PARTITION_ROWS + """
CREATE PUBLICATION proot FOR TABLE parent WHERE (a % 20 = 0 OR a > 120) WITH (publish_via_partition_root = true);
"""
VIA_LEAF_PUBLISHER = PARTITION_TABLES + PARTITION_ROWS + """
CREATE PUBLICATION pleaf FOR TABLE parent, child_high WHERE (a % 20 = 0) WITH (publish_via_partition_root = false);
"""
PARTITION_BATCHES = [[
    "INSERT INTO parent VALUES (20000, 'high'), (40, 'dup?') ON CONFLICT DO NOTHING",
    "INSERT INTO parent VALUES (64, 'low'), (65, 'low odd'), (164, 'high even'), (165, 'high odd')",
    "UPDATE parent SET b = 'changed' WHERE a IN (60, 64, 164)",
    "UPDATE parent SET a = 180 WHERE a = 80",                        # crosses partitions: DELETE + INSERT
    "UPDATE parent SET a = 121 WHERE a = 140",
    "DELETE FROM parent WHERE a IN (10, 20, 150)",
]]

TOAST_TABLES = "CREATE TABLE docs(id int PRIMARY KEY, kind text, body text, note text);"
TOAST_PUBLISHER = TOAST_TABLES + """
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
INSERT INTO docs SELECT g, CASE WHEN g % 2 = 0 THEN 'keep' ELSE 'drop' END,
       (SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 200) i), 'n' || g
FROM generate_series(1, 6) g;
CREATE PUBLICATION ptoast FOR TABLE docs WHERE (id > 1);
"""
TOAST_BATCHES = [[
    "UPDATE docs SET note = 'body unchanged, sent as u' WHERE id IN (2, 3)",
    "UPDATE docs SET kind = 'keep', note = 'twice' WHERE id = 4",
    "UPDATE docs SET id = 0 WHERE id = 5",                           # key change: old key sent, leaves the filter
    "UPDATE docs SET id = 50 WHERE id = 6",                          # key change within the filter
]]
TOAST_FULL_PUBLISHER = TOAST_PUBLISHER.replace("CREATE PUBLICATION", "ALTER TABLE docs REPLICA IDENTITY FULL;\n"
                                               "CREATE PUBLICATION").replace("WHERE (id > 1)", "WHERE (kind = 'keep')")
TOAST_FULL_BATCHES = [[
    "UPDATE docs SET note = 'still keep' WHERE id = 2",
    "UPDATE docs SET kind = 'keep' WHERE id = 3",                    # enters: INSERT with the body from the old row
    "UPDATE docs SET kind = 'drop' WHERE id = 4",                    # leaves: DELETE
]]

# PostgreSQL 18's generated columns (issue 35 item 3): g1's stored generated column published by
# publish_generated_columns = stored, g2's named in a column list (with a row filter), g3's not published (the
# subscriber's column keeps its default). The subscriber's columns are regular ones, as PostgreSQL requires.
GENERATED_PUBLISHER = """
CREATE TABLE g1(id int PRIMARY KEY, a int, g int GENERATED ALWAYS AS (a * 2) STORED);
CREATE TABLE g2(id int PRIMARY KEY, a int, b text, g int GENERATED ALWAYS AS (a + 100) STORED);
CREATE TABLE g3(id int PRIMARY KEY, a int, g int GENERATED ALWAYS AS (a * 3) STORED);
INSERT INTO g1 (id, a) SELECT i, i FROM generate_series(1, 6) i;
INSERT INTO g2 (id, a, b) SELECT i, i, 'b' || i FROM generate_series(1, 6) i;
INSERT INTO g3 (id, a) SELECT i, i FROM generate_series(1, 6) i;
CREATE PUBLICATION pgen1 FOR TABLE g1 WITH (publish_generated_columns = stored);
CREATE PUBLICATION pgen2 FOR TABLE g2 (id, a, g) WHERE (id > 2);
CREATE PUBLICATION pgen3 FOR TABLE g3;
"""
GENERATED_SUBSCRIBER = """
CREATE TABLE g1(id int PRIMARY KEY, a int, g int);
CREATE TABLE g2(id int PRIMARY KEY, a int, b text DEFAULT 'subscriber', g int);
CREATE TABLE g3(id int PRIMARY KEY, a int, g int DEFAULT -1);
"""
GENERATED_BATCHES = [[
    "INSERT INTO g1 (id, a) VALUES (7, 70)", "UPDATE g1 SET a = a + 10 WHERE id IN (2, 7)", "DELETE FROM g1 WHERE id = 3",
    "INSERT INTO g2 (id, a, b) VALUES (1000, 5, 'new'), (0, 1, 'filtered')", "UPDATE g2 SET a = 50 WHERE id = 4",
    "UPDATE g2 SET id = -5 WHERE id = 5",  # leaves the filter: DELETE
    "INSERT INTO g3 (id, a) VALUES (7, 7)", "UPDATE g3 SET a = 9 WHERE id = 2",
]]

# numeric's NaN and infinities (issue 49): NaN sorts above every number and equals itself (numeric.c cmp_numerics),
# so a NaN amount passes amount >= 0 and native replicates it; keyed's key holds NaN; measures' filter meets
# 'Infinity' and 'NaN' in BETWEEN, IS NOT DISTINCT FROM and @> (pg_get_expr prints '{NaN}'::numeric[]). As plain
# data: ±Infinity and NaN in an unconstrained numeric, -0 (numeric has none: it is 0), the types' precision limits,
# float8's own NaN, infinities and -0.
NUMERIC_TABLES = """
CREATE TABLE ledger(id int PRIMARY KEY, amount numeric(12,3), fee numeric, big numeric(38,0), small numeric(5,2),
                    rate float8);
CREATE TABLE keyed(k numeric(10,2) PRIMARY KEY, v text);
CREATE TABLE measures(id int PRIMARY KEY, x numeric(8,2), y numeric(8,2), tags numeric(6,2)[]);
"""
NUMERIC_ROWS = """
ALTER TABLE ledger REPLICA IDENTITY FULL;
ALTER TABLE measures REPLICA IDENTITY FULL;
INSERT INTO ledger VALUES
  (1, 10.5, 'Infinity', 99999999999999999999999999999999999999, '-0', 1.5),
  (2, 'NaN', '-Infinity', -99999999999999999999999999999999999999, 999.99, 'NaN'),
  (3, -1, 'NaN', 0, -999.99, '-Infinity'),
  (4, 999999999.999, 1e-100, 1, '-0.00', '-0'),
  (5, -999999999.999, 123456789012345678901234567890.123456789, NULL, 0.01, 'Infinity'),
  (6, NULL, NULL, NULL, NULL, NULL),
  (7, '-0', -1e100, 5, 1, 0);
INSERT INTO keyed VALUES ('NaN', 'nan key'), (1.5, 'one and a half'), ('-0', 'zero'), (99999999.99, 'limit'),
                         (-3, 'negative');
INSERT INTO measures VALUES (1, 'NaN', 2, '{NaN,1.50}'), (2, 3, 4, '{}'), (3, -5, 2, NULL),
                            (4, 999999.99, 999999.99, '{9999.99,-9999.99}'), (5, '-0', 'NaN', '{-0}');
"""
NUMERIC_DDL = """
CREATE PUBLICATION pnum FOR TABLE ledger WHERE (amount >= 0);
CREATE PUBLICATION pkey FOR TABLE keyed WHERE (k > 1);
CREATE PUBLICATION pmeasure FOR TABLE measures
  WHERE (x + y BETWEEN 0 AND 'Infinity' OR x * y IS NOT DISTINCT FROM 'NaN' OR tags @> '{NaN}');
"""
NUMERIC_PUBLISHER = NUMERIC_TABLES + NUMERIC_ROWS + NUMERIC_DDL
NUMERIC_PUBLICATIONS = ("pnum", "pkey", "pmeasure")
NUMERIC_BATCHES = [
    [
        "INSERT INTO ledger VALUES (10, 'NaN', 'NaN', 0, 0, 'NaN'), "
        "(11, 0.001, '-Infinity', 99999999999999999999999999999999999999, -0.01, '-0'), (12, -0.001, 'Infinity', 1, 1, 1)",
        "UPDATE ledger SET amount = 'NaN' WHERE id = 3",          # -1 (out) to NaN (in): INSERT
        "UPDATE ledger SET amount = -5 WHERE id = 2",             # NaN (in) to -5 (out): DELETE
        "UPDATE ledger SET fee = '-Infinity', rate = '-Infinity' WHERE id = 1",
        "DELETE FROM ledger WHERE id = 10",                       # a NaN row leaves
        "UPDATE keyed SET k = 0.5 WHERE k = 'NaN'",               # the NaN key leaves the filter: DELETE
        "INSERT INTO keyed VALUES ('NaN', 'nan again')",
        "UPDATE keyed SET v = 'updated' WHERE k = 'NaN'",         # found by its NaN key
        "UPDATE measures SET y = 'NaN' WHERE id = 3",             # x * y is NaN: enters
        "UPDATE measures SET tags = '{1.00}' WHERE id = 1",
        "INSERT INTO measures VALUES (6, -1, -1, '{NaN}'), (7, -1, -1, '{1}'), (8, 999999.99, -999999.99, '{}')",
    ],
    [
        "UPDATE keyed SET k = 7 WHERE k = 'NaN'",                 # a key change within the filter
        "UPDATE keyed SET k = 'NaN' WHERE k = -3",                # enters: INSERT of a NaN key
        "UPDATE ledger SET big = -big, small = -small WHERE id IN (1, 4)",
        "UPDATE ledger SET amount = amount WHERE amount = 'NaN'",
        "BEGIN; DELETE FROM keyed WHERE k = 'NaN'; INSERT INTO keyed VALUES ('NaN', 'third'); COMMIT",
        "UPDATE measures SET x = 'NaN' WHERE id = 2",
    ],
]
NUMERIC_CASE = (NUMERIC_PUBLISHER, NUMERIC_TABLES, NUMERIC_PUBLICATIONS, ("ledger", "keyed", "measures"),
                NUMERIC_BATCHES)

CASES = {
    "combination-publish-lists": (COMBINATION_PUBLISHER, COMBINATION_TABLES,
                                  ("pub1", "pub2", "pub3a", "pub3b", "pub4", "pub5"), ("t1", "t2", "t3"),
                                  COMBINATION_BATCHES),
    "column-list": (COLUMN_LIST_PUBLISHER, COLUMN_LIST_SUBSCRIBER, ("p1",), ("t1",), COLUMN_LIST_BATCHES),
    "partition-via-root": (VIA_ROOT_PUBLISHER, "CREATE TABLE parent(a int PRIMARY KEY, b text);", ("proot",),
                           ("parent",), PARTITION_BATCHES),
    "partition-via-leaf": (VIA_LEAF_PUBLISHER, PARTITION_TABLES, ("pleaf",), ("child_low", "child_high"),
                           PARTITION_BATCHES),
    "toast-unchanged-default-identity": (TOAST_PUBLISHER, TOAST_TABLES, ("ptoast",), ("docs",), TOAST_BATCHES),
    "toast-unchanged-full-identity": (TOAST_FULL_PUBLISHER, TOAST_TABLES, ("ptoast",), ("docs",), TOAST_FULL_BATCHES),
    "generated-columns": (GENERATED_PUBLISHER, GENERATED_SUBSCRIBER, ("pgen1", "pgen2", "pgen3"), ("g1", "g2", "g3"),
                          GENERATED_BATCHES),
    "numeric-nan-and-infinities": NUMERIC_CASE,
}
