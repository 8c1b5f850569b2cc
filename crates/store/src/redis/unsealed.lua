-- Unsealed: the seal mark of one agent's receipt chain and the entries after it (at most
-- ARGV[1]), read in one step so that they agree. Not prepended with the prelude.
-- KEYS[1]: the agent's receipt chain
-- KEYS[2]: the chain's seal mark: "<seq> <digest>" of its last signed head (absent: none)
-- ARGV[1]: the most entries to return
-- Returns: { mark ('' for none), entry, ... } (entries raw, layout in prelude.lua)
local mark = redis.call('GET', KEYS[2]) or ''
local sealed = tonumber(string.match(mark, '^(%d+)') or '0')
local out = redis.call('LRANGE', KEYS[1], sealed, sealed + tonumber(ARGV[1]) - 1)
table.insert(out, 1, mark)
return out
