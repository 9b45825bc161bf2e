-- The rolling sweep (#15 item 3) takes the nodes no assessment has covered for
-- --full-assess-every-secs, oldest first, instead of a fixed slice of the fleet by a hash of the
-- node id: a node assessed for its own evidence (every healthy node is, each time its summary set
-- arrives) is not assessed again by the sweep, so a pass costs what changed plus the nodes that
-- went quiet. NULL: never assessed (first in the sweep). Written after each assessment commits,
-- for the nodes it covered; a write lost with a collector that died between the two only makes
-- the sweep assess that node again. (No index: one row a node, read by a top-N sort, and an index
-- on it would stop the per-batch update of `nodes` from being a heap-only update.)
ALTER TABLE nodes ADD COLUMN assessed_at timestamptz;
