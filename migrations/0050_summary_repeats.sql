-- A node's summary sets of one passed hour that only repeat each other (the same pairs with the
-- same provenance, lanes and PCI addresses, every probe ok, no failure of the node in the hour)
-- are merged into one set row for the hour (`Store::merge_repeats_of_hour`): the detailed tier
-- keeps a row a node-hour for a healthy node instead of one a window. Each hour is merged once,
-- once no rollup pass will roll it again; this marks it.
ALTER TABLE rollup_hours ADD COLUMN repeats_merged_at timestamptz;
