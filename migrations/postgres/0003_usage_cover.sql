-- A run's heatmap reads one level of every rank's usage pyramid. A
-- trace's levels are written interleaved, so the rows of one level lie
-- one or two to a heap page and reading them from the heap reads most of
-- the table. With the columns in the primary key's index the read is an
-- index-only scan of the few index pages that hold them.
ALTER TABLE usage_levels DROP CONSTRAINT usage_levels_pkey;
ALTER TABLE usage_levels ADD PRIMARY KEY (tid, k, b)
    INCLUDE (n, res_min, res_max, res_last, alloc_min, alloc_max, alloc_last, act_min, act_max, act_last);

-- An index-only scan skips the heap only on pages vacuum has marked
-- all-visible: vacuum after every 10,000 rows inserted, not after a
-- fifth of the table as by default.
ALTER TABLE usage_levels SET (autovacuum_vacuum_insert_threshold = 10000, autovacuum_vacuum_insert_scale_factor = 0);
