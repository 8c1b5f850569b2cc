-- Receipts: a page of one agent's receipt chain, entries raw (layout in prelude.lua).
-- Not prepended with the prelude: it reads and decides nothing.
-- KEYS[1]: the agent's receipt chain
-- ARGV[1], ARGV[2]: the first and last index (0-based, inclusive)
-- Returns: { entry, ... }
return redis.call('LRANGE', KEYS[1], ARGV[1], ARGV[2])
